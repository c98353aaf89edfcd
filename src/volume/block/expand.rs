//! ControllerExpandVolume and NodeExpandVolume of block volumes.
//!
//! - `partition` layout: the partition grows in place into the free space after it (the
//!   label, then the kernel through BLKPG resize, then the volume's record), and the
//!   node grows the mounted filesystem online. Refused (OutOfRange, the CSI code for an
//!   unsupported capacity) naming the neighbouring volume when that space is taken.
//! - `device` layout: the volume is the whole device already; up to its size succeeds,
//!   beyond is OutOfRange.
//!
//! Crash safety of a grow: the label is the truth of what a partition spans, the record
//! follows it. A crash after the label write leaves a longer partition and a record with
//! the old size: no data is at risk (the partition only gained free space) and nothing
//! leaks (delete finds the partition by PARTUUID, whatever its size); the retry (the
//! external-resizer retries until it succeeds) finds the partition grown and writes the
//! record. Until then NodeStageVolume refuses the volume (its size differs from the
//! record: `Pool::verify_identity`).

use std::path::Path;

use tracing::info;

use super::partition::guard;
use super::{BlockBackend, Located};
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::disk::gpt::{self, volume, SizeRange, ALIGN};
use crate::error::{Error, ExpandError, MountError, Result};
use crate::os::{blockdev, mount, FileKind, FsType};
use crate::volume::{Expand, Expanded};

pub async fn expand(b: &BlockBackend, id: &BlockVolumeId, req: &Expand) -> Result<Expanded> {
    b.check_ready()?;
    if id.node_id != b.node.node_id {
        // Every node's csi-resizer sidecar asks its own driver about every claim (the
        // external-resizer has no per-node mode: cmd/csi-resizer/main.go flags at
        // beef24d). A code it treats as neither final nor infeasible (pkg/util/util.go
        // IsFinalError, IsInfeasibleError; pkg/controller/expand_and_recover.go
        // callResizeOnPlugin) leaves the claim's status alone, so the owner's resizer
        // decides it.
        return Err(ExpandError::OtherNode {
            volume: id.to_string(),
            node: id.node_id.clone(),
            this: b.node.node_id.clone(),
        }
        .into());
    }
    let capacity = match id.layout {
        // Not located: a stripe's device is its array, running only while staged.
        IdLayout::Stripe => return stripe_fixed(b, id, req),
        IdLayout::Device => whole_device(&b.locate(id)?, req)?,
        IdLayout::Partition => grow_or_move(b, id, req).await?,
    };
    // A whole device's filesystem fills it from mkfs on; a raw block volume has none.
    let grew_fs = id.layout == IdLayout::Partition && !req.block;
    Ok(Expanded {
        capacity,
        node_expansion_required: grew_fs,
    })
}

fn whole_device(vol: &Located, req: &Expand) -> Result<u64> {
    let size = vol.device.size_bytes;
    if req.required > size {
        return Err(ExpandError::WholeDevice {
            volume: vol.id.to_string(),
            device: vol.device.path.clone(),
            size,
            required: req.required,
        }
        .into());
    }
    never_shrinks(vol, size, req)?;
    Ok(size)
}

/// A stripe keeps its size (growing every member and the md array is not done yet):
/// what it has already is granted, more is OutOfRange.
fn stripe_fixed(b: &BlockBackend, id: &BlockVolumeId, req: &Expand) -> Result<Expanded> {
    let rec = b.record(&id.to_string())?;
    let size = rec.capacity_bytes;
    if req.required > size || (req.limit != 0 && size > req.limit) {
        return Err(ExpandError::StripeFixed {
            volume: id.to_string(),
            size,
            required: req.required,
            limit: req.limit,
        }
        .into());
    }
    Ok(Expanded {
        capacity: size,
        node_expansion_required: false,
    })
}

fn never_shrinks(vol: &Located, size: u64, req: &Expand) -> Result<()> {
    if req.limit != 0 && size > req.limit {
        return Err(ExpandError::WouldShrink {
            volume: vol.id.to_string(),
            size,
            limit: req.limit,
        }
        .into());
    }
    Ok(())
}

/// What an in-place grow came to.
enum Grown {
    To(u64),
    /// The space after the partition is taken: by what, and the size asked for.
    Blocked(String, u64),
}

/// Grows the partition in place, or moves it to a larger extent of its drive when the
/// space after it is taken and nothing uses it (`partition::relocate`); its size after.
/// A move under way or cut short is joined or settled first.
async fn grow_or_move(b: &BlockBackend, id: &BlockVolumeId, req: &Expand) -> Result<u64> {
    let raw = id.to_string();
    let parts = &b.partitioned;
    let rec = b.record(&raw)?;
    let recorded_move = rec.partition.as_ref().is_some_and(|p| p.moving.is_some());
    if parts.moving_now(&raw) || recorded_move {
        let size = SizeRange {
            required: req.required,
            limit: req.limit,
        }
        .size(ALIGN)?;
        let blocked = "a move under way";
        parts
            .relocate(id, size, blocked, &b.mounter.mount_table()?)
            .await?;
    }
    let (blocked, size) = match grow_partition(b, &b.locate(id)?, req).await? {
        Grown::To(size) => return Ok(size),
        Grown::Blocked(e, size) => (e, size),
    };
    let located = b.locate(id)?;
    let mounts = b.mounter.mount_table()?;
    if let Some(u) = b.pool.uses(&located.device, &mounts).first() {
        let parent = b.partitioned.pool.device(&located.record.device_id);
        let label = parent.and_then(|p| volume::ours(&p.path).ok());
        let (free, largest) = label.map_or((0, 0), |l| l.capacity());
        return Err(ExpandError::InUse {
            volume: raw,
            wanted: size,
            blocked: blocked.clone(),
            uses: u.to_string(),
            free,
            largest,
        }
        .into());
    }
    parts.relocate(id, size, &blocked, &mounts).await?;
    let moved = b.locate(id)?;
    record_size(b, &raw, moved.device.size_bytes)
}

/// Grows the partition to the range's size under the device's lock: its size after, or
/// why it cannot grow in place.
async fn grow_partition(b: &BlockBackend, vol: &Located, req: &Expand) -> Result<Grown> {
    let raw = vol.id.to_string();
    // The one place expansion takes the partition layout's lock.
    let _guard = b.partitioned.device_lock(&vol.record.device_id).await;
    let located = b.locate(&vol.id)?;
    let now = located.device.size_bytes;
    if req.required <= now {
        never_shrinks(&located, now, req)?;
        return record_size(b, &raw, now).map(Grown::To);
    }
    let range = SizeRange {
        required: req.required,
        limit: req.limit,
    };
    let size = range.size(ALIGN)?;
    let parent = b.partitioned.pool.device(&located.record.device_id);
    let parent = parent.ok_or_else(|| ExpandError::DeviceNotInPool {
        device_id: located.record.device_id.clone(),
        volume: raw.clone(),
    })?;
    let guid = partuuid(&located)?;
    let path = parent.path.clone();
    let held = b.partitioned.held(&parent.id);
    // The inner result keeps the neighbour that blocks the grow for `blocked` to name;
    // udevd's moments are waited out (`guard::settled`).
    let grown = guard::settled(
        &parent.path,
        "growing a partition",
        b.partitioned.label_deadline(),
        move || match volume::grow(&path, &guid, size, &held) {
            Err(e @ gpt::Error::Blocked { .. }) => Ok(Err(e)),
            other => other.map(Ok),
        },
    )
    .await?;
    let carved = match grown {
        Ok(carved) => carved,
        Err(e @ gpt::Error::Blocked { .. }) => {
            let why = blocked(b, &raw, &located.record.device_id, e);
            return Ok(Grown::Blocked(why, size));
        }
        Err(other) => return Err(other.into()),
    };
    info!(
        volume_id = raw,
        from = now,
        to = carved.span.len,
        "partition grown"
    );
    b.pool.state.update(|s| {
        let part = s.get_mut(&raw).and_then(|r| r.partition.as_mut());
        if let Some(p) = part {
            p.span = Some((carved.span.start, carved.span.len));
        }
        Ok(())
    })?;
    record_size(b, &raw, carved.span.len).map(Grown::To)
}

fn partuuid(vol: &Located) -> Result<uuid::Uuid> {
    let part = vol
        .record
        .partition
        .as_ref()
        .ok_or_else(|| ExpandError::NoPartitionRecorded {
            volume: vol.id.to_string(),
        })?;
    uuid::Uuid::parse_str(&part.partuuid).map_err(|e| {
        ExpandError::BadPartuuid {
            volume: vol.id.to_string(),
            why: e.to_string(),
        }
        .into()
    })
}

/// Why the partition cannot grow in place, naming the volume whose partition is in the
/// way (partitions are named by their volume's allocation id).
fn blocked(b: &BlockBackend, raw: &str, device_id: &str, e: gpt::Error) -> String {
    let msg = e.to_string();
    let state = b.pool.state.snapshot();
    let neighbour = state.entries().find_map(|(id, r)| {
        let named = msg.contains(&format!("{:?}", id.allocation));
        let other = id.to_string();
        (r.device_id == device_id && other != raw && named).then_some(other)
    });
    match neighbour {
        Some(n) => format!("{msg} (volume {n})"),
        None => msg,
    }
}

/// Makes the record say `size` (a grow the record missed is adopted); returns it.
fn record_size(b: &BlockBackend, raw: &str, size: u64) -> Result<u64> {
    b.pool.state.update(|s| {
        let r = s
            .get_mut(raw)
            .ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))?;
        if r.capacity_bytes < size {
            r.capacity_bytes = size;
        }
        Ok(())
    })?;
    Ok(size)
}

/// NodeExpandVolume: the filesystem mounted at `path` grows to fill the volume's device
/// (which `locate` has made the kernel show at its label's size).
pub async fn node_expand(
    b: &BlockBackend,
    id: &BlockVolumeId,
    path: &Path,
    req: &Expand,
) -> Result<u64> {
    let vol = b.locate(id)?;
    let dev = &vol.device;
    let mounts = b.mounter.mount_table()?;
    let entry = mount::at(&mounts, path).filter(|m| blockdev::carries(m, dev.major, dev.minor));
    let entry = entry.ok_or_else(|| MountError::NotMountedAt {
        volume: vol.id.to_string(),
        path: path.to_owned(),
    })?;
    if req.required > dev.size_bytes {
        return Err(ExpandError::DeviceSmaller {
            volume: vol.id.to_string(),
            size: dev.size_bytes,
            required: req.required,
        }
        .into());
    }
    let host = b.mounter.host.as_ref();
    let is_dir = matches!(host.stat(path), Ok(Some(FileKind::Dir)));
    if req.block || entry.fs_type == "devtmpfs" || !is_dir {
        return Ok(dev.size_bytes);
    }
    let fs = FsType::parse(&entry.fs_type).unwrap_or(vol.record.fs_type);
    host.grow_filesystem(&dev.path, path, fs).await?;
    info!(volume_id = %vol.id, path = %path.display(), bytes = dev.size_bytes, "filesystem grown");
    Ok(dev.size_bytes)
}
