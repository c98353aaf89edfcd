//! The partition layout: a volume is a GPT partition carved from a pool
//! device (`crate::disk::gpt`). Only a label this driver wrote is changed, and a new
//! label goes only on a device the signature probe found blank.
//!
//! Concurrency (`guard`): label changes on one device take turns under that device's
//! lock, held from choosing the extent to recording it (`create`) and from erasing to
//! dropping the record (`delete`); other devices never wait for it. Every label write
//! and BLKPG call runs with a deadline, and a device whose call outlived it is refused
//! until the call returns.
//!
//! Crash safety: the volume's record is written (without its partition) before the
//! partition is carved, and the partition is named with the volume's allocation id, so
//! a retried CreateVolume finds or carves the same partition; DeleteVolume erases the
//! partition, then removes it from the kernel and the label, then drops the record.
//! Kill points (`crate::runtime::faults`) sit between each of those steps.

mod create;
mod delete;
pub mod guard;
mod relocate;

pub(crate) use delete::erase_partition;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tracing::{info, warn};

use guard::{settled, settled_sync, DeviceGuard, DeviceLocks, LABEL_DEADLINE};

use super::{Capacity, Layout};
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::disk::gpt::{self, label, volume, Carved, Held, OnDisk};
use crate::error::{AllocationError, Error, LayoutError, Result};
use crate::os::{blockdev, Host, MountEntry};
use crate::pool::inventory::Source;
use crate::pool::{AllocationRequest, Pool, PoolDevice, VolumeRecord};

/// Each 1 GiB chunk of the offloaded zero-out must finish within this.
const ZERO_CHUNK_DEADLINE: Duration = Duration::from_secs(120);

/// Clones share everything (the delete job runs on one: `delete`).
#[derive(Clone)]
pub struct Partitioned {
    pub pool: Arc<Pool>,
    /// The short pool-wide section in which a create picks its device (`create`).
    placing: Arc<Mutex<()>>,
    locks: DeviceLocks,
    /// Each label write or BLKPG call must finish within this.
    label_deadline: Duration,
}

impl Partitioned {
    pub fn new(pool: Arc<Pool>) -> Self {
        Partitioned {
            pool,
            placing: Arc::new(Mutex::new(())),
            locks: DeviceLocks::default(),
            label_deadline: LABEL_DEADLINE,
        }
    }

    /// Another deadline for each label write and BLKPG call (the default is
    /// [`LABEL_DEADLINE`]).
    pub fn with_label_deadline(mut self, deadline: Duration) -> Self {
        self.label_deadline = deadline;
        self
    }

    /// How long one label write or BLKPG call may take.
    pub fn label_deadline(&self) -> Duration {
        self.label_deadline
    }

    /// Waits for pool device `device_id`'s turn: hold it while its label (or a partition
    /// of it) changes. Other devices never wait for it.
    pub async fn device_lock(&self, device_id: &str) -> DeviceGuard {
        self.locks.lock(device_id).await
    }

    /// The short pool-wide section in which a create (partition or stripe) picks its
    /// devices by try-locking them (`create`).
    pub(crate) async fn placing(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.placing.lock().await
    }

    /// Pool devices a whole-device volume does not hold.
    fn carvable(&self) -> Vec<PoolDevice> {
        let state = self.pool.state.snapshot();
        // One pass over the records, whatever the number of devices.
        let whole: HashSet<&str> = state
            .entries()
            .filter(|(id, _)| id.layout == IdLayout::Device)
            .map(|(_, r)| r.device_id.as_str())
            .collect();
        self.pool
            .devices()
            .into_iter()
            .filter(|d| !whole.contains(d.id.as_str()))
            .collect()
    }

    /// Carvable pool devices with what they carry (read without their locks: for
    /// GetCapacity and start-up, never to choose where to carve).
    pub(crate) fn candidates(&self) -> Vec<(PoolDevice, OnDisk)> {
        let carvable = self.carvable();
        carvable.into_iter().filter_map(read_label).collect()
    }

    /// Start-up: a label a crash left with two different or one damaged copy is written
    /// whole again, and the kernel shows every partition of our labels again. Runs before
    /// the backend is ready, so no create or delete holds a device.
    pub fn resync(&self) {
        for (dev, on) in self.candidates() {
            if let OnDisk::Ours { repair, .. } = on {
                let Some(_device) = self.locks.try_lock(&dev.id) else {
                    continue;
                };
                let path = dev.path.clone();
                let done = settled_sync(
                    &dev.path,
                    "re-syncing partitions",
                    self.label_deadline,
                    move || {
                        volume::repair(&path)?;
                        gpt::kernel::resync(&path)
                    },
                );
                if let Some(why) = repair.filter(|_| done.is_ok()) {
                    info!(device = %dev.path.display(), why, "label repaired: both copies rewritten");
                }
                match done {
                    Ok(r) => info!(device = %dev.path.display(), ?r, "partitions re-synced"),
                    Err(e) => warn!(device = %dev.path.display(), error = %e, "re-sync failed"),
                }
            }
        }
    }

    /// The volume of this name already recorded, when its parameters agree.
    fn existing(&self, req: &AllocationRequest) -> Result<Option<(BlockVolumeId, VolumeRecord)>> {
        let state = self.pool.state.snapshot();
        let Some((id, rec)) = state.by_name(&req.name) else {
            return Ok(None);
        };
        let parsed = Some(id).filter(|i| i.layout == IdLayout::Partition);
        let fits = req.fits(rec.capacity_bytes);
        match parsed {
            Some(p) if fits && req.made(rec) => Ok(Some((p.clone(), rec.clone()))),
            _ => Err(AllocationError::NameTakenOtherLayout {
                name: req.name.clone(),
            }
            .into()),
        }
    }

    fn record(&self, raw: &str) -> Result<VolumeRecord> {
        let state = self.pool.state.snapshot();
        let rec = state.get(raw).cloned();
        rec.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))
    }

    fn parent(&self, rec: &VolumeRecord) -> Result<PoolDevice> {
        self.pool.device(&rec.device_id).ok_or_else(|| {
            LayoutError::DeviceNotInPool {
                device_id: rec.device_id.clone(),
                device_key: rec.device_key.clone(),
                holding: "the volume's partition",
            }
            .into()
        })
    }

    /// Spans and numbers on pool device `device_id` that the state's records (volumes and
    /// stripe members) hold, whatever its label says now.
    pub(crate) fn held(&self, device_id: &str) -> Held {
        let state = self.pool.state.snapshot();
        let mut held = Held::default();
        for (_, p) in recorded_partitions(&state).filter(|(d, _)| *d == device_id) {
            hold(&mut held, p);
        }
        held
    }

    /// [`Self::held`] of every device at once: one pass over the records, the devices
    /// (a node's few) found by a scan of their ids borrowed from the state, so that
    /// GetCapacity's cost barely follows the volume count.
    fn held_by_device(state: &crate::pool::State) -> Vec<(&str, Held)> {
        let mut by_device: Vec<(&str, Held)> = Vec::new();
        for (device_id, p) in recorded_partitions(state) {
            let i = match by_device.iter().position(|(d, _)| *d == device_id) {
                Some(i) => i,
                None => {
                    by_device.push((device_id, Held::default()));
                    by_device.len() - 1
                }
            };
            hold(&mut by_device[i].1, p);
        }
        by_device
    }

    /// The volume's partition as the kernel shows it now (re-added if it was dropped);
    /// None when nothing was ever carved for it, or DeleteVolume already erased it and
    /// took it out of the label. A label that lacks it otherwise was changed by another
    /// tool: refused (FailedPrecondition naming the change), the record kept.
    fn carved(
        &self,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        parent: &Path,
    ) -> Result<Option<Carved>> {
        let Some(p) = &rec.partition else {
            // Claimed, maybe carved, crash before the record said so: by name.
            // No label of ours: nothing was carved for it (nothing to erase).
            let Ok(label) = volume::ours(parent) else {
                return Ok(None);
            };
            let Some((_, e)) = label.by_name(&id.allocation) else {
                return Ok(None);
            };
            return self.locate_bounded(parent, e.guid).map(Some);
        };
        let want = p
            .recorded(Some(&id.allocation))
            .ok_or_else(|| Error::State {
                path: parent.to_owned(),
                reason: format!("bad PARTUUID {:?}", p.partuuid),
            })?;
        if p.erased {
            return match self.locate_bounded(parent, want.partuuid) {
                Ok(c) => Ok(Some(c)),
                Err(Error::Label(gpt::Error::NotInLabel(_))) => Ok(None),
                Err(e) => Err(e),
            };
        }
        self.locate_recorded(parent, want).map(Some)
    }

    /// [`volume::locate`] (which may tell the kernel of the partition) under the disk's
    /// lock, udevd's moments waited out, with a deadline.
    pub(crate) fn locate_bounded(&self, parent: &Path, guid: uuid::Uuid) -> Result<Carved> {
        let path = parent.to_owned();
        settled_sync(
            parent,
            "locating a partition",
            self.label_deadline,
            move || volume::locate(&path, &guid),
        )
    }

    /// [`volume::locate_recorded`] like [`Partitioned::locate_bounded`]: a label that no
    /// longer holds the partition as recorded is FailedPrecondition naming the change.
    pub(crate) fn locate_recorded(&self, parent: &Path, want: gpt::Recorded) -> Result<Carved> {
        let path = parent.to_owned();
        settled_sync(
            parent,
            "locating a partition",
            self.label_deadline,
            move || volume::locate_recorded(&path, &want),
        )
    }

    /// Rewrites a label a crash or another tool left with its two copies different or one
    /// damaged. The caller holds the device's lock.
    pub(crate) async fn repair_label(&self, parent: &Path) -> Result<()> {
        let path = parent.to_owned();
        let why = settled(
            parent,
            "repairing a label",
            self.label_deadline,
            move || volume::repair(&path),
        )
        .await?;
        if let Some(why) = why {
            info!(device = %parent.display(), why, "label repaired: both copies rewritten");
        }
        Ok(())
    }
}

/// A device with what it carries. One that cannot be carved (a partition, a label that
/// cannot be read) is `Foreign` with the reason, so picking passes it over and says why.
fn read_label(d: PoolDevice) -> Option<(PoolDevice, OnDisk)> {
    // A partition gets no partition table of its own (label::create refuses it too).
    let sysfs = format!("/sys/dev/block/{}:{}/partition", d.major, d.minor);
    if Path::new(&sysfs).exists() {
        let why = "a partition, not a whole device; only a whole device is carved".to_owned();
        return Some((d, OnDisk::Foreign(why)));
    }
    match label::read(&d.path) {
        Ok(on) => Some((d, on)),
        Err(e) => {
            warn!(device = %d.path.display(), error = %e, "label unreadable; not carved");
            Some((d, OnDisk::Foreign(format!("its label cannot be read: {e}"))))
        }
    }
}

/// Every partition the state's records hold (a volume's own, a stripe member's), with
/// the pool device it lies on.
fn recorded_partitions(
    state: &crate::pool::State,
) -> impl Iterator<Item = (&str, &crate::pool::PartitionRecord)> {
    state.values().flat_map(|r| {
        let own = r.partition.as_ref().map(|p| (r.device_id.as_str(), p));
        let members = r.stripe.iter().flat_map(|s| &s.members);
        let members = members.filter_map(|m| Some((m.device_id.as_str(), m.partition.as_ref()?)));
        own.into_iter().chain(members)
    })
}

/// Adds partition `p`'s number and spans to `held`: its own span and, during a move, the
/// extent it is copied to (before and after its spare entry is written).
fn hold(held: &mut Held, p: &crate::pool::PartitionRecord) {
    held.numbers.push(p.number);
    held.spans.extend(p.held_span());
    held.spans.extend(p.moving.as_ref().map(|m| m.to_span()));
}

/// What a blank device would offer once labelled: (available, largest).
pub(crate) fn blank_capacity(dev: &PoolDevice) -> (u64, u64) {
    let geometry = std::fs::File::open(&dev.path)
        .map_err(|e| gpt::Error::io("opening", &dev.path, e))
        .and_then(|f| label::geometry(&f, &dev.path));
    let Ok((sector, size)) = geometry else {
        return (0, 0);
    };
    match gpt::Label::new(sector, size / sector, gpt::format::new_disk_guid()) {
        Ok(l) => l.capacity(),
        Err(_) => (0, 0),
    }
}

/// The partition node as a pool device, so stage/publish/stats treat it as the volume.
fn as_device(parent: &PoolDevice, rec: &VolumeRecord, carved: &Carved) -> Option<PoolDevice> {
    let (major, minor) = blockdev::devnum_of(&carved.node).ok()?;
    Some(PoolDevice {
        id: parent.id.clone(),
        key: rec.device_key.clone(),
        path: carved.node.clone(),
        size_bytes: carved.span.len,
        major,
        minor,
        identity: None,
        source: Source::Listed,
    })
}

#[async_trait]
impl Layout for Partitioned {
    async fn allocate(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)> {
        self.allocate_volume(host, req).await
    }

    async fn release(
        &self,
        host: &Arc<dyn Host>,
        id: &BlockVolumeId,
        mounts: &[MountEntry],
    ) -> Result<()> {
        self.release_volume(host, id, mounts).await
    }

    fn locate(&self, record: &VolumeRecord, mounts: &[MountEntry]) -> Result<Option<PoolDevice>> {
        let Some(parent) = self.pool.fresh_device(&record.device_id, mounts) else {
            return Ok(None);
        };
        let Some(part) = record.partition.as_ref() else {
            return Ok(None);
        };
        if part.moving.is_some() {
            return Err(LayoutError::Moving {
                volume: record.name.clone(),
            }
            .into());
        }
        let want = part.recorded(None).ok_or_else(|| Error::State {
            path: parent.path.clone(),
            reason: format!("bad PARTUUID {:?}", part.partuuid),
        })?;
        let carved = self.locate_recorded(&parent.path, want).inspect_err(|e| {
            warn!(device = %parent.path.display(), error = %e, "partition not located");
        })?;
        Ok(as_device(&parent, record, &carved))
    }

    /// The kernel's partition of the recorded number (and start) on the volume's pool
    /// device: no label read, so another tool's change to the label never keeps a mount
    /// of the volume from being taken down.
    fn shown(&self, record: &VolumeRecord, mounts: &[MountEntry]) -> Option<PoolDevice> {
        let parent = self.pool.fresh_device(&record.device_id, mounts)?;
        let part = record.partition.as_ref()?;
        let k = gpt::kernel::partition(&parent.path, part.number)
            .ok()
            .flatten()
            .filter(|k| part.span.is_none_or(|(s, _)| s == k.start))?;
        let node = gpt::kernel::node(&parent.path, k.number).ok()?;
        Some(PoolDevice {
            id: parent.id.clone(),
            key: record.device_key.clone(),
            path: node,
            size_bytes: k.len,
            major: k.dev.0,
            minor: k.dev.1,
            identity: None,
            source: Source::Listed,
        })
    }

    fn capacity(&self) -> Capacity {
        let (mut available, mut maximum) = (0u64, 0u64);
        let state = self.pool.state.snapshot();
        let (held, nothing) = (Self::held_by_device(&state), Held::default());
        for (dev, on) in self.candidates() {
            let (a, m) = match on {
                OnDisk::Ours { label, .. } => {
                    let on_dev = held.iter().find(|(d, _)| *d == dev.id);
                    let held = on_dev.map_or(&nothing, |(_, h)| h);
                    let free = label.free_extents_clear_of(held);
                    let total = free.iter().map(|e| e.len).sum();
                    (total, free.iter().map(|e| e.len).max().unwrap_or(0))
                }
                OnDisk::Blank if self.pool.free_devices().iter().any(|f| f.id == dev.id) => {
                    blank_capacity(&dev)
                }
                _ => (0, 0),
            };
            available += a;
            maximum = maximum.max(m);
        }
        Capacity {
            available,
            maximum: (maximum > 0).then_some(maximum),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_errors_become_the_csi_codes_their_causes_call_for() {
        let code = |e: gpt::Error| tonic::Status::from(Error::from(e)).code();
        use tonic::Code;
        assert_eq!(
            code(gpt::Error::NoSizeInRange("x".into())),
            Code::OutOfRange
        );
        let no_space = gpt::Error::NoSpace {
            wanted: 2,
            largest: 1,
        };
        assert_eq!(code(no_space), Code::ResourceExhausted);
        let taken = gpt::Error::NameTaken {
            name: "a".into(),
            number: 1,
            len: 1,
        };
        assert_eq!(code(taken), Code::AlreadyExists);
        let foreign = gpt::Error::foreign(Path::new("/dev/x"), "sfdisk wrote it");
        assert_eq!(code(foreign), Code::FailedPrecondition);
    }
}
