//! The stripe layout (issue 14): a volume is md RAID0 over `stripeCount` equal GPT
//! partitions, each on a distinct pool device. The members are carved with the
//! partition layout's code (`crate::partition`) in its labels, under its per-device
//! locks (every member's, taken in the order of their device ids, so two multi-device
//! callers never wait for each other crosswise) and with its deadline on each label
//! write and BLKPG call (`guard::settled`); this module chooses the devices, sizes the
//! members and records them.
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
//!
//! NodeStage/NodeUnstage start and stop the array (`array.rs`). Not yet here:
//! preferring distinct NVMe controllers over namespaces of one controller.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use super::layout::{Capacity, Layout};
use super::partition::{self as part_layout, csi_error, Partitioned};
use crate::error::{Error, Result};
use crate::md;
use crate::os::{Host, MountEntry, Signature};
use crate::partition::{self as gpt, label, volume, OnDisk};
use crate::pool::{
    AllocationRequest, PartitionRecord, Pool, PoolDevice, StripeMember, StripeRecord, VolumeRecord,
};
use crate::request::{stripe as params, StripeParams};
use crate::volume_id::{BlockVolumeId, IdLayout};

pub mod array;
mod locks;
pub mod size;
pub use size::{member_size, DATA_OFFSET};

/// Each 1 GiB chunk of the offloaded zero-out must finish within this.
const ZERO_CHUNK_DEADLINE: Duration = Duration::from_secs(120);

pub struct Striped {
    pub pool: Arc<Pool>,
    /// The partition layout whose labels the members live in (and whose locks guard them).
    pub parts: Arc<Partitioned>,
}

/// A pool device and the largest member it can take now.
struct Room {
    dev: PoolDevice,
    largest: u64,
    labelled: bool,
}

/// The member partition's name in our label.
fn member_name(allocation: &str, index: usize) -> String {
    format!("{allocation}.{index}")
}

/// The volume's geometry from its stored parameters.
fn geometry(rec_params: &std::collections::BTreeMap<String, String>) -> Result<StripeParams> {
    params::stripe_params(rec_params, true)?
        .ok_or_else(|| Error::invalid("parameters.stripeCount", "required with layout: stripe"))
}

impl Striped {
    pub fn new(pool: Arc<Pool>, parts: Arc<Partitioned>) -> Self {
        Striped { pool, parts }
    }

    /// Every pool device a member could go on, with its largest free extent.
    fn rooms(&self) -> Vec<Room> {
        let free = self.pool.free_devices();
        self.parts
            .candidates()
            .into_iter()
            .filter_map(|(dev, on)| match on {
                OnDisk::Ours { label, .. } => Some(Room {
                    largest: label.capacity().1,
                    dev,
                    labelled: true,
                }),
                OnDisk::Blank if free.iter().any(|f| f.id == dev.id) => Some(Room {
                    largest: part_layout::blank_capacity(&dev).1,
                    dev,
                    labelled: false,
                }),
                _ => None,
            })
            .collect()
    }

    /// N distinct devices that each take a member of `member` bytes (labelled devices
    /// first, then the tightest fit), a blank one labelled only once all N are proven.
    async fn place(&self, host: &dyn Host, n: u32, member: u64) -> Result<Vec<PoolDevice>> {
        let mut fit: Vec<Room> = self
            .rooms()
            .into_iter()
            .filter(|r| r.largest >= member)
            .collect();
        fit.sort_by_key(|r| (!r.labelled, r.largest, r.dev.id.clone()));
        let mounts = host.mount_table()?;
        let mut chosen = Vec::new();
        for r in fit {
            if chosen.len() == n as usize {
                break;
            }
            if r.labelled {
                chosen.push((r.dev, None));
                continue;
            }
            if !self.pool.uses(&r.dev, &mounts).is_empty() {
                continue;
            }
            // A probe that fails is a refusal of that device.
            let Ok(sigs) = host.probe_signatures(&r.dev.path).await else {
                continue;
            };
            if let Some(proof) = label::Blank::from_signature_probe(&r.dev.path, &sigs) {
                chosen.push((r.dev, Some(proof)));
            }
        }
        if chosen.len() < n as usize {
            return Err(Error::ResourceExhausted(format!(
                "stripeCount {n} needs {n} distinct pool devices with a free extent of \
                 {member} bytes each; node {} has {} such device(s); ask for less \
                 capacity or a smaller stripeCount, delete volumes or add drives",
                self.pool.node_id(),
                chosen.len()
            )));
        }
        let mut devices = Vec::new();
        for (dev, proof) in chosen {
            if let Some(proof) = proof {
                let path = dev.path.clone();
                let write = move || label::create(&path, proof.clone());
                self.settled(&dev.path, "writing a new label", write)
                    .await?;
                self.parts.keep_from_whole_device_use(&dev);
                info!(device = %dev.path.display(), "new gds-csi partition table (stripe member)");
            }
            devices.push(dev);
        }
        Ok(devices)
    }

    /// The stripe volume of this name already recorded, when its request agrees.
    fn existing(&self, req: &AllocationRequest) -> Result<Option<String>> {
        let state = self.pool.state.snapshot();
        let Some((id, rec)) = state.by_name(&req.name) else {
            return Ok(None);
        };
        let stripe = BlockVolumeId::parse(id).is_some_and(|i| i.layout == IdLayout::Stripe);
        if stripe
            && req.fits(rec.capacity_bytes)
            && rec.fs_type == req.fs_type
            && rec.parameters == req.parameters
        {
            return Ok(Some(id.clone()));
        }
        Err(Error::AlreadyExists(format!(
            "volume {:?} exists with another layout, capacity, fsType or parameters; \
             use another name or the same request",
            req.name
        )))
    }

    /// Records the volume with its members' devices before anything is carved.
    fn claim(
        &self,
        req: &AllocationRequest,
        devices: &[PoolDevice],
        geo: StripeParams,
        member: u64,
    ) -> Result<String> {
        self.pool.state.update(|state| {
            if let Some((id, _)) = state.by_name(&req.name) {
                return Ok(id.clone());
            }
            let uuid = uuid::Uuid::new_v4();
            let first = &devices[0];
            let id = BlockVolumeId {
                device_id: first.id.clone(),
                allocation: uuid.simple().to_string()[..8].to_owned(),
                node_id: self.pool.node_id().to_owned(),
                layout: IdLayout::Stripe,
            };
            let members = devices
                .iter()
                .map(|d| StripeMember {
                    device_id: d.id.clone(),
                    device_key: d.key.clone(),
                    partition: None,
                })
                .collect();
            let record = VolumeRecord {
                name: req.name.clone(),
                device_id: first.id.clone(),
                device_key: first.key.clone(),
                capacity_bytes: (member - DATA_OFFSET) * u64::from(geo.count),
                fs_type: req.fs_type,
                parameters: req.parameters.clone(),
                fs_uuid: uuid.hyphenated().to_string(),
                formatted: false,
                deleting: false,
                device_identity: None,
                partition: None,
                stripe: Some(StripeRecord {
                    chunk_bytes: geo.chunk_bytes,
                    member_bytes: member,
                    members,
                    array_uuid: None,
                }),
            };
            state.volumes.insert(id.to_string(), record);
            Ok(id.to_string())
        })
    }

    /// Carves (or finds) every member not yet recorded as carved; the caller holds the
    /// members' device locks.
    async fn carve(&self, raw: &str) -> Result<(BlockVolumeId, VolumeRecord)> {
        let id = BlockVolumeId::parse(raw).ok_or_else(|| Error::NotFound(raw.to_owned()))?;
        let rec = self.record(raw)?;
        let stripe = stripe_of(raw, &rec)?;
        for (i, m) in stripe.members.iter().enumerate() {
            if m.partition.is_some() {
                continue;
            }
            let dev = self.member_device(m)?;
            let name = member_name(&id.allocation, i);
            let (path, len) = (dev.path.clone(), stripe.member_bytes);
            let step = move || volume::carve(&path, &name, len);
            let carved = self
                .settled(&dev.path, "carving a stripe member", step)
                .await?;
            let part = PartitionRecord {
                partuuid: carved.partuuid.to_string(),
                number: carved.number,
            };
            self.pool.state.update(|s| {
                let r = s.volumes.get_mut(raw).and_then(|r| r.stripe.as_mut());
                let r = r.ok_or_else(|| Error::NotFound(raw.to_owned()))?;
                r.members[i].partition = Some(part);
                Ok(())
            })?;
            info!(volume_id = raw, member = i, node = %carved.node.display(), "stripe member carved");
        }
        Ok((id, self.record(raw)?))
    }

    pub(crate) fn record(&self, raw: &str) -> Result<VolumeRecord> {
        let state = self.pool.state.snapshot();
        let rec = state.volumes.get(raw).cloned();
        rec.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))
    }

    fn member_device(&self, m: &StripeMember) -> Result<PoolDevice> {
        self.pool.device(&m.device_id).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "pool device {} ({}) holding a stripe member is not in the pool; \
                 reattach it and retry",
                m.device_id, m.device_key
            ))
        })
    }

    /// GetCapacity for a stripe class: the largest array N distinct devices give now.
    pub fn capacity_for(&self, geo: StripeParams) -> Capacity {
        let rooms: Vec<u64> = self.rooms().iter().map(|r| r.largest).collect();
        let available = rooms.iter().sum();
        Capacity {
            available,
            maximum: size::maximum(&rooms, geo),
        }
    }
}

pub(crate) fn stripe_of<'a>(raw: &str, rec: &'a VolumeRecord) -> Result<&'a StripeRecord> {
    rec.stripe.as_ref().ok_or_else(|| Error::State {
        path: std::path::PathBuf::from(raw),
        reason: "a stripe volume's record has no members".into(),
    })
}

/// A member's signatures allow erasing it: none, or only the md superblock of our array.
fn member_erasable(sigs: &[Signature], array_uuid: Option<&str>) -> bool {
    sigs.iter().all(|s| {
        s.kind == "linux_raid_member"
            && array_uuid
                .is_some_and(|ours| s.uuid.as_deref().is_some_and(|u| md::same_uuid(u, ours)))
    })
}

#[async_trait]
impl Layout for Striped {
    async fn allocate(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)> {
        if let Some(raw) = self.existing(req)? {
            let _members = self.lock_members(&raw).await?;
            return self.carve(&raw).await;
        }
        let geo = geometry(&req.parameters)?;
        let member = member_size(req.required_bytes, req.limit_bytes, geo)?;
        // Every pool device, in order, so the labels read to choose are the ones carved.
        let mut all = self
            .lock_sorted(self.pool.devices().into_iter().map(|d| d.id))
            .await;
        let devices = self.place(host, geo.count, member).await?;
        let raw = self.claim(req, &devices, geo, member)?;
        let members = self.member_ids(&raw)?;
        let _members = if members.iter().all(|m| all.iter().any(|(id, _)| id == m)) {
            all.retain(|(id, _)| members.contains(id));
            all
        } else {
            // A create of the same name claimed first on devices we do not hold.
            drop(all);
            self.lock_sorted(members).await
        };
        self.carve(&raw).await
    }

    async fn release(
        &self,
        host: &Arc<dyn Host>,
        volume_id: &str,
        mounts: &[MountEntry],
    ) -> Result<()> {
        if self.record(volume_id).is_err() {
            return Ok(());
        }
        let _members = self.lock_members(volume_id).await?;
        let Ok(rec) = self.record(volume_id) else {
            return Ok(());
        };
        let stripe = stripe_of(volume_id, &rec)?;
        self.stop_ours(host.as_ref(), volume_id, stripe, mounts)
            .await?;
        let members = self.present_members(volume_id, &rec, mounts)?;
        let erase = self
            .check_members(host.as_ref(), volume_id, stripe, &members, mounts)
            .await?;
        self.pool.state.update(|s| {
            if let Some(r) = s.volumes.get_mut(volume_id) {
                r.deleting = true;
            }
            Ok(())
        })?;
        for ((parent, carved), wipe) in members.iter().zip(erase) {
            if wipe {
                // Only our array's superblock is there (checked above).
                md::zero_superblock(host.as_ref(), &carved.node).await?;
            }
            zero(host, &carved.node).await?;
            let (path, guid) = (parent.path.clone(), carved.partuuid);
            let step = move || volume::remove(&path, &guid);
            self.settled(&parent.path, "removing a stripe member", step)
                .await?;
            self.parts.keep_from_whole_device_use(parent);
        }
        self.pool.state.update(|s| {
            s.volumes.remove(volume_id);
            Ok(())
        })?;
        info!(volume_id, "stripe released");
        Ok(())
    }

    /// The running array (NodeStage starts it first: `array::ensure_array`).
    fn locate(&self, record: &VolumeRecord, _mounts: &[MountEntry]) -> Option<PoolDevice> {
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

    fn capacity(&self) -> Capacity {
        self.capacity_for(StripeParams {
            count: params::MIN_MEMBERS,
            chunk_bytes: params::DEFAULT_CHUNK,
        })
    }
}

impl Striped {
    /// Stops the volume's array when the kernel runs it (found by our UUID only);
    /// refused while its device is mounted.
    pub(crate) async fn stop_ours(
        &self,
        host: &dyn Host,
        volume_id: &str,
        stripe: &StripeRecord,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let Some(uuid) = &stripe.array_uuid else {
            return Ok(());
        };
        let Some(array) = md::sysfs::find(self.pool.host_sys(), uuid) else {
            return Ok(());
        };
        let (major, minor) = crate::os::blockdev::devnum_of(&array.node)
            .map_err(|e| Error::FailedPrecondition(format!("md array {e}")))?;
        let used = crate::os::blockdev::uses(mounts, self.pool.host_sys(), major, minor);
        if let Some(u) = used.first() {
            return Err(Error::FailedPrecondition(format!(
                "the md array {} of volume {volume_id} is in use: {u}; unpublish and \
                 unstage the volume first",
                array.node.display()
            )));
        }
        md::stop(host, &array.node).await
    }

    /// Every member is checked before any is changed: one foreign member stops all.
    /// Returns, per member, whether it carries our array's superblock.
    async fn check_members(
        &self,
        host: &dyn Host,
        volume_id: &str,
        stripe: &StripeRecord,
        members: &[(PoolDevice, gpt::Carved)],
        mounts: &[MountEntry],
    ) -> Result<Vec<bool>> {
        let mut erase = Vec::new();
        for (parent, carved) in members {
            if let Some(u) = self
                .pool
                .uses(&member_as_device(parent, carved)?, mounts)
                .first()
            {
                return Err(Error::FailedPrecondition(format!(
                    "stripe member {} of volume {volume_id} is in use: {u}; unstage the \
                     volume (which stops its array) first",
                    carved.node.display()
                )));
            }
            let sigs = host.probe_signatures(&carved.node).await?;
            if !member_erasable(&sigs, stripe.array_uuid.as_deref()) {
                return Err(Error::FailedPrecondition(format!(
                    "stripe member {} (drive {}) of volume {volume_id} carries {}, not this \
                     volume's md superblock; nothing was erased",
                    carved.node.display(),
                    parent.path.display(),
                    crate::pool::describe_signatures(&sigs)
                )));
            }
            erase.push(!sigs.is_empty());
        }
        Ok(erase)
    }

    /// The members whose partition is still there, in order; a member whose device is
    /// absent fails the delete (retried once it is back), nothing changed.
    pub(crate) fn present_members(
        &self,
        raw: &str,
        rec: &VolumeRecord,
        mounts: &[MountEntry],
    ) -> Result<Vec<(PoolDevice, gpt::Carved)>> {
        let id = BlockVolumeId::parse(raw).ok_or_else(|| Error::NotFound(raw.to_owned()))?;
        let stripe = stripe_of(raw, rec)?;
        let mut out = Vec::new();
        for (i, m) in stripe.members.iter().enumerate() {
            let parent = self
                .pool
                .fresh_device(&m.device_id, mounts)
                .ok_or_else(|| {
                    Error::FailedPrecondition(format!(
                        "stripe member {i} of volume {raw} is on pool device {} ({}), which \
                     is not attached; reattach it and retry",
                        m.device_id, m.device_key
                    ))
                })?;
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
                None => label
                    .by_name(&member_name(&id.allocation, i))
                    .map(|(_, e)| e.guid),
            };
            let Some(guid) = guid else { continue };
            match self.parts.locate_bounded(&parent.path, guid) {
                Ok(c) => out.push((parent, c)),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// Zeroes a member (offloaded where the device can, else written), so the next tenant
/// reads zeros: the partition layout's erase, on a member.
async fn zero(host: &Arc<dyn Host>, node: &Path) -> Result<()> {
    let owned = node.to_owned();
    let offloaded = tokio::task::spawn_blocking(move || {
        gpt::kernel::zero_offloaded(&owned, ZERO_CHUNK_DEADLINE)
    })
    .await
    .map_err(|e| Error::FailedPrecondition(format!("zero-out task failed: {e}")))?
    .map_err(csi_error)?;
    if offloaded == gpt::Erased::Unsupported {
        host.zero_device(node).await?;
    }
    Ok(())
}

/// The member partition as a device (for the in-use check).
pub(crate) fn member_as_device(parent: &PoolDevice, carved: &gpt::Carved) -> Result<PoolDevice> {
    let (major, minor) = crate::os::blockdev::devnum_of(&carved.node)
        .map_err(|e| Error::FailedPrecondition(format!("stripe member {e}")))?;
    Ok(PoolDevice {
        path: carved.node.clone(),
        size_bytes: carved.span.len,
        major,
        minor,
        identity: None,
        ..parent.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(kind: &str, uuid: &str) -> Signature {
        Signature {
            kind: kind.into(),
            uuid: Some(uuid.into()),
            offset: None,
            seen_by: "blkid",
        }
    }

    #[test]
    fn only_our_arrays_superblock_lets_a_member_be_erased() {
        let ours = "0f1e2d3c:4b5a6978:8796a5b4:c3d2e1f0";
        let blkid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        assert!(member_erasable(&[], None));
        assert!(member_erasable(
            &[sig("linux_raid_member", blkid)],
            Some(ours)
        ));
        let other = "11111111-4b5a-6978-8796-a5b4c3d2e1f0";
        assert!(!member_erasable(
            &[sig("linux_raid_member", other)],
            Some(ours)
        ));
        assert!(!member_erasable(&[sig("linux_raid_member", blkid)], None));
        assert!(!member_erasable(&[sig("ext4", blkid)], Some(ours)));
        assert!(!md::same_uuid("", ""));
    }
}
