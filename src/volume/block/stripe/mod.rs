//! The stripe layout: a volume is md RAID0 over `stripeCount` equal GPT
//! partitions, each on a distinct pool device behind a distinct NVMe controller
//! (`controllers`). The members are carved with the partition layout's code
//! (`crate::disk::gpt`) in its labels, under its per-device locks and with its deadline
//! on each label write and BLKPG call (`guard::settled`); this module chooses the
//! devices, sizes the members and records them.
//!
//! - `create`: CreateVolume. Devices are picked among those whose lock is free (the
//!   partition layout's try-lock placement), so a drive busy with a long erase never
//!   stalls a stripe over other drives.
//! - `delete`: DeleteVolume, a job like the partition layout's, through its one erase
//!   path (`partition::erase_partition`).
//! - `array`: NodeStage/NodeUnstage start and stop the md array.
//! - `size`: member sizes; `locks`: the members' locks and the udev-settled retries.
//!
//! Size: each member holds [`DATA_OFFSET`] for the md 1.2 superblock (the array is
//! created with `--data-offset` of that, so the array's size is known before it
//! exists) and `ceil(size / N)` rounded up to the chunk and 1 MiB; the volume's
//! capacity is N times that.
//!
//! Crash safety as the partition layout's: the record (members' devices, no partitions)
//! is written before any member is carved; members are named `<allocation>.<i>`, so a
//! retried CreateVolume finds or carves the same partitions. DeleteVolume checks every
//! member before it changes any.

use std::sync::Arc;

use async_trait::async_trait;
use tracing::warn;

use super::partition::{self as part_layout, Partitioned};
use super::{Capacity, Layout};
use crate::csi::id::BlockVolumeId;
use crate::disk::gpt::{self, volume, OnDisk};
use crate::disk::md;
use crate::error::{Error, LayoutError, Result};
use crate::os::{Host, MountEntry, StripeGeometry};
use crate::pool::{AllocationRequest, Pool, PoolDevice, StripeMember, StripeRecord, VolumeRecord};
use crate::request::{stripe as params, StripeParams};

pub mod array;
pub mod controllers;
mod create;
mod delete;
mod locks;
pub mod pcie;
pub mod size;
pub use size::{member_size, DATA_OFFSET};

/// Clones share everything (the delete job runs on one: `delete`).
#[derive(Clone)]
pub struct Striped {
    pub pool: Arc<Pool>,
    /// The partition layout whose labels the members live in (and whose locks guard them).
    pub parts: Arc<Partitioned>,
}

/// The member partition's name in our label.
fn member_name(allocation: &str, index: usize) -> String {
    format!("{allocation}.{index}")
}

impl Striped {
    pub fn new(pool: Arc<Pool>, parts: Arc<Partitioned>) -> Self {
        Striped { pool, parts }
    }

    pub(crate) fn record(&self, raw: &str) -> Result<VolumeRecord> {
        let state = self.pool.state.snapshot();
        let rec = state.get(raw).cloned();
        rec.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))
    }

    fn member_device(&self, m: &StripeMember) -> Result<PoolDevice> {
        self.pool.device(&m.device_id).ok_or_else(|| {
            LayoutError::DeviceNotInPool {
                device_id: m.device_id.clone(),
                device_key: m.device_key.clone(),
                holding: "a stripe member",
            }
            .into()
        })
    }

    /// GetCapacity for a stripe class: the largest array N devices behind distinct
    /// controllers give now (read without the devices' locks: a report, not a choice).
    pub fn capacity_for(&self, geo: StripeParams) -> Capacity {
        let free = self.pool.free_devices();
        let sys = self.pool.host_sys();
        let rooms: Vec<(String, u64)> = self
            .parts
            .candidates()
            .into_iter()
            .filter_map(|(dev, on)| {
                let largest = match on {
                    OnDisk::Ours { label, .. } => label.capacity().1,
                    OnDisk::Blank if free.iter().any(|f| f.id == dev.id) => {
                        part_layout::blank_capacity(&dev).1
                    }
                    _ => return None,
                };
                Some((controllers::controller_of(sys, &dev), largest))
            })
            .collect();
        let available = rooms.iter().map(|r| r.1).sum();
        let per_controller = controllers::largest_per_controller(rooms);
        Capacity {
            available,
            maximum: size::maximum(&per_controller, geo),
        }
    }

    /// The members whose partition is still there, in order; a member whose device is
    /// absent fails the delete (retried once it is back), and one whose label another
    /// tool changed fails it naming the change; nothing changed either way.
    pub(crate) fn present_members(
        &self,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        mounts: &[MountEntry],
    ) -> Result<Vec<(PoolDevice, gpt::Carved)>> {
        let raw = &id.to_string();
        let stripe = stripe_of(raw, rec)?;
        let mut out = Vec::new();
        for (i, m) in stripe.members.iter().enumerate() {
            let parent = self
                .pool
                .fresh_device(&m.device_id, mounts)
                .ok_or_else(|| LayoutError::MemberDetached {
                    index: i,
                    volume: raw.to_owned(),
                    device_id: m.device_id.clone(),
                    device_key: m.device_key.clone(),
                })?;
            // A recorded member the label lacks is gone only once its delete zeroed it;
            // otherwise another tool changed the label (an entry, a PARTUUID, a foreign
            // partition or header): refused, naming the change.
            let name = member_name(&id.allocation, i);
            if let Some(want) = m.partition.as_ref().filter(|p| !p.erased) {
                let want = want.recorded(Some(&name)).ok_or_else(|| Error::State {
                    path: parent.path.clone(),
                    reason: format!("bad PARTUUID {:?}", want.partuuid),
                })?;
                let carved = self.parts.locate_recorded(&parent.path, want)?;
                out.push((parent, carved));
                continue;
            }
            let Ok(label) = volume::ours(&parent.path) else {
                warn!(
                    volume_id = raw,
                    member = i,
                    "no label of ours: nothing carved"
                );
                continue;
            };
            let guid = match &m.partition {
                Some(p) => uuid::Uuid::parse_str(&p.partuuid).ok(),
                None => label.by_name(&name).map(|(_, e)| e.guid),
            };
            let Some(guid) = guid else { continue };
            match self.parts.locate_bounded(&parent.path, guid) {
                Ok(c) => out.push((parent, c)),
                Err(Error::Label(gpt::Error::NotInLabel(_))) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

pub(crate) fn stripe_of<'a>(raw: &str, rec: &'a VolumeRecord) -> Result<&'a StripeRecord> {
    rec.stripe.as_ref().ok_or_else(|| Error::State {
        path: std::path::PathBuf::from(raw),
        reason: "a stripe volume's record has no members".into(),
    })
}

/// The member partition as a device (for the in-use check).
pub(crate) fn member_as_device(parent: &PoolDevice, carved: &gpt::Carved) -> Result<PoolDevice> {
    let (major, minor) =
        crate::os::blockdev::devnum_of(&carved.node).map_err(|e| LayoutError::NoDeviceNumber {
            what: "stripe member",
            why: e.to_string(),
        })?;
    Ok(PoolDevice {
        path: carved.node.clone(),
        size_bytes: carved.span.len,
        major,
        minor,
        identity: None,
        ..parent.clone()
    })
}

#[async_trait]
impl Layout for Striped {
    fn mkfs_geometry(&self, record: &VolumeRecord) -> Result<Option<StripeGeometry>> {
        array::mkfs_geometry(record)
    }

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

    /// The running array (NodeStage starts it first: `array::ensure_array`).
    fn locate(&self, record: &VolumeRecord, _mounts: &[MountEntry]) -> Result<Option<PoolDevice>> {
        Ok(self.running_array(record))
    }

    fn capacity(&self) -> Capacity {
        self.capacity_for(StripeParams {
            count: params::MIN_MEMBERS,
            chunk_bytes: params::DEFAULT_CHUNK,
        })
    }

    async fn prepare_stage(&self, host: &dyn Host, id: &BlockVolumeId) -> Result<()> {
        self.ensure_array(host, id).await.map(drop)
    }

    async fn after_unstage(&self, host: &dyn Host, id: &BlockVolumeId) -> Result<()> {
        self.stop_array(host, id).await
    }
}

impl Striped {
    fn running_array(&self, record: &VolumeRecord) -> Option<PoolDevice> {
        let uuid = record.stripe.as_ref()?.array_uuid.as_deref()?;
        let running = md::sysfs::find(self.pool.host_sys(), uuid)?;
        let (major, minor) = crate::os::blockdev::devnum_of(&running.node).ok()?;
        Some(PoolDevice {
            id: record.device_id.clone(),
            key: record.device_key.clone(),
            path: running.node,
            size_bytes: running.size_bytes,
            major,
            minor,
            identity: None,
            source: crate::pool::inventory::Source::Listed,
        })
    }
}
