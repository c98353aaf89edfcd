//! A block volume's content as another part of the driver reads it (a snapshot's copy):
//! how it can be read now, and what it was filled from.

use super::{fill, BlockBackend};
use crate::csi::id::SnapshotId;
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::error::{Result, SnapshotError};
use crate::pool::{Content, SourceOf, VolumeRecord};
use crate::volume::ContentView;

fn not_found(raw: &str) -> SnapshotError {
    SnapshotError::SourceNotFound {
        volume: raw.to_owned(),
    }
}

/// The capacity of volume `id`, when it is one of this node's.
pub fn capacity_of(b: &BlockBackend, id: &BlockVolumeId) -> Option<u64> {
    let state = b.pool.state.snapshot();
    state.get(&id.to_string()).map(|r| r.capacity_bytes)
}

/// How volume `id` is read: at its staged mount, mounted privately, or as bytes; a volume
/// in use where its content cannot be read consistently is refused.
pub fn view(b: &BlockBackend, id: &BlockVolumeId) -> Result<ContentView> {
    let raw = id.to_string();
    let rec = readable_record(b, &raw)?;
    let mut vol = b.locate(id).map_err(|e| {
        if id.layout == IdLayout::Stripe {
            SnapshotError::StripeNotStaged {
                volume: raw.clone(),
                cause: e.to_string(),
            }
            .into()
        } else {
            e
        }
    })?;
    b.verify_located(&mut vol)?;
    let dev = (vol.device.major, vol.device.minor);
    let mounts = b.mounter.mount_table()?;
    let staged = b.mounter.filesystem_root(&mounts, dev.0, dev.1);
    let in_use = || fill::in_use(b, id);
    Ok(match (rec.formatted, staged) {
        (true, Some(at)) => ContentView::Mounted {
            at,
            dev,
            fs: rec.fs_type,
        },
        (true, None) => match in_use() {
            Some(uses) => return Err(SnapshotError::InUseUnmounted { volume: raw, uses }.into()),
            None => ContentView::Unmounted {
                dev: vol.device.path.clone(),
                fs: rec.fs_type,
            },
        },
        (false, _) => match in_use() {
            Some(uses) => return Err(SnapshotError::RawInUse { volume: raw, uses }.into()),
            None => ContentView::Device {
                path: vol.device.path.clone(),
                dev,
                bytes: rec.capacity_bytes,
            },
        },
    })
}

/// The volume's record, when its content is there to be read: not being deleted, and
/// filled when it is a clone or restore.
fn readable_record(b: &BlockBackend, raw: &str) -> Result<VolumeRecord> {
    let rec = b
        .pool
        .state
        .snapshot()
        .get(raw)
        .cloned()
        .ok_or_else(|| not_found(raw))?;
    if rec.deleting {
        return Err(SnapshotError::SourceDeleting {
            volume: raw.to_owned(),
        }
        .into());
    }
    if fill::source::of_record(&rec)?.is_some() && !fill::done(b, raw)? {
        return Err(SnapshotError::SourceNotFilled {
            volume: raw.to_owned(),
        }
        .into());
    }
    Ok(rec)
}

/// What snapshot `snapshot` holds, when this node's volume named `name` was restored
/// from it and is filled.
pub fn restored_from(b: &BlockBackend, name: &str, snapshot: &SnapshotId) -> Option<Content> {
    let state = b.pool.state.snapshot();
    let (volume_id, rec) = state.by_name(name)?;
    let content = match rec.source.as_ref().map(|s| &s.of) {
        Some(SourceOf::Snapshot { id, content }) if id == snapshot => *content,
        _ => return None,
    };
    fill::done(b, &volume_id.to_string())
        .ok()?
        .then_some(content)
}
