//! CreateVolume of the partition layout: pick a device, claim the volume in the state
//! file, carve its partition, record where it is, all under the chosen device's lock.
//!
//! Picking runs in a short pool-wide section (`placing`): the devices whose lock is free
//! are locked and their labels read; the best fit keeps its lock, the others are let go
//! at once. A device busy with another create or a delete (an erase can take minutes) is
//! passed over, so a create never waits for another drive while one that fits is free;
//! only when nothing free fits does it wait for the busy ones and pick again. The label
//! read under the lock is the one the carve changes (it reads it again, still under the
//! lock), so two creates never carve the same extent.

use std::path::PathBuf;

use tracing::{info, warn};

use super::guard::{settled, DeviceGuard};
use super::{read_label, Partitioned};
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::disk::gpt::{self, label, volume, OnDisk, SizeRange};
use crate::error::{Error, LayoutError, Result};
use crate::os::{Host, MountEntry};
use crate::pool::{AllocationRequest, PartitionRecord, PoolDevice, VolumeRecord};
use crate::runtime::faults::{self, KillPoint};

/// Free devices locked with what they carry, and the ids of the busy ones.
type Locked = (Vec<(PoolDevice, OnDisk, DeviceGuard)>, Vec<String>);

impl Partitioned {
    pub(super) async fn allocate_volume(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)> {
        if let Some((id, rec)) = self.existing(req)? {
            let _device = self.device_lock(&rec.device_id).await;
            if rec.partition.is_none() {
                return self.carve(&id).await;
            }
            // A retry after a crash mid-write: both label copies whole before the answer
            // (`carve` repairs them itself).
            if let Some(dev) = self.pool.device(&rec.device_id) {
                self.repair_label(&dev.path).await?;
            }
            return Ok((id, rec));
        }
        let range = SizeRange {
            required: req.required_bytes,
            limit: req.limit_bytes,
        };
        let size = range.size(gpt::ALIGN)?;
        let (dev, mut guard) = self.place(host, size).await?;
        let id = self.claim(req, &dev, size)?;
        // A create of the same name that claimed first (on another device) wins: carve
        // its claim under its device's lock.
        let rec = self.record(&id.to_string())?;
        if rec.device_id != dev.id {
            drop(guard);
            guard = self.device_lock(&rec.device_id).await;
        }
        faults::reached(KillPoint::PartAfterClaim);
        let done = self.carve(&id).await;
        drop(guard);
        done
    }

    /// A pool device to carve `size` bytes from, returned locked (see the module doc).
    async fn place(&self, host: &dyn Host, size: u64) -> Result<(PoolDevice, DeviceGuard)> {
        loop {
            let mut refused = Vec::new();
            let busy = {
                let _placing = self.placing().await;
                let (free, busy) = self.lock_free_devices();
                if let Some(found) = self.pick(host, free, size, &mut refused).await? {
                    return Ok(found);
                }
                busy
            };
            if busy.is_empty() {
                let mut why = format!(
                    "no pool device on node {} has a free extent of {size} bytes, and no \
                     blank device is big enough; delete a volume or add devices",
                    self.pool.node_id()
                );
                if !refused.is_empty() {
                    why.push_str(&format!("; not carvable: {}", refused.join("; ")));
                }
                return Err(LayoutError::NoRoom { why }.into());
            }
            // Nothing free fits: wait until the busy devices are done, then pick again.
            for id in busy {
                drop(self.device_lock(&id).await);
            }
        }
    }

    /// Every carvable device whose lock is free, locked, with its label read under the
    /// lock; the others are named busy (never waited for here).
    pub(crate) fn lock_free_devices(&self) -> Locked {
        let (mut free, mut busy) = (Vec::new(), Vec::new());
        for dev in self.carvable() {
            match self.locks.try_lock(&dev.id) {
                Some(g) => free.extend(read_label(dev).map(|(d, on)| (d, on, g))),
                None => busy.push(dev.id),
            }
        }
        (free, busy)
    }

    /// The best fit among our labels, else the smallest blank free device (probed, then
    /// labelled). None when no locked device can hold `size`; a device that cannot be
    /// carved is passed over, its reason logged, counted and added to `refused`.
    async fn pick(
        &self,
        host: &dyn Host,
        mut locked: Vec<(PoolDevice, OnDisk, DeviceGuard)>,
        size: u64,
        refused: &mut Vec<String>,
    ) -> Result<Option<(PoolDevice, DeviceGuard)>> {
        for (d, on, _) in &locked {
            if let OnDisk::Foreign(why) = on {
                refuse(refused, d, "foreign", why);
            }
        }
        let labels = self.our_labels(&locked, refused)?;
        if let Some((path, _)) = volume::choose(&labels, size) {
            let at = locked.iter().position(|(d, _, _)| d.path == path);
            return Ok(at.map(|i| locked.swap_remove(i)).map(|(d, _, g)| (d, g)));
        }
        locked.retain(|(d, on, _)| *on == OnDisk::Blank && super::blank_capacity(d).1 >= size);
        locked.sort_by_key(|(d, _, _)| (d.size_bytes, d.id.clone()));
        let mounts = host.mount_table()?;
        for (dev, _, guard) in locked {
            if self.label_blank(host, &dev, &mounts, refused).await? {
                return Ok(Some((dev, guard)));
            }
        }
        Ok(None)
    }

    /// The labels of the locked devices that carry ours, with the partitions held on
    /// each; one whose GPT entries are all used is added to `refused`.
    fn our_labels(
        &self,
        locked: &[(PoolDevice, OnDisk, DeviceGuard)],
        refused: &mut Vec<String>,
    ) -> Result<Vec<(PathBuf, gpt::Label, gpt::Held)>> {
        let mut labels = Vec::new();
        for (d, on, _) in locked {
            if let OnDisk::Ours { label, .. } = on {
                let held = volume::held_on(&d.path, label, &self.held(&d.id))?;
                if label.free_slot(&held).is_none() {
                    let why = format!(
                        "all {} of its GPT partition entries are used",
                        label.slots.len()
                    );
                    refused.push(format!("{}: {why}", d.path.display()));
                }
                labels.push((d.path.clone(), label.clone(), held));
            }
        }
        Ok(labels)
    }

    /// Writes a new label on blank device `dev`, locked by the caller; false when it
    /// cannot be carved (in use, carrying signatures, taken by the whole-device layout,
    /// or the write refused), its reason logged, counted and added to `refused`.
    async fn label_blank(
        &self,
        host: &dyn Host,
        dev: &PoolDevice,
        mounts: &[MountEntry],
        refused: &mut Vec<String>,
    ) -> Result<bool> {
        if let Some(u) = self.pool.uses(dev, mounts).first() {
            refuse(refused, dev, "in_use", &format!("in use: {u}"));
            return Ok(false);
        }
        let sigs = host.probe_signatures(&dev.path).await?;
        let Some(proof) = label::Blank::from_signature_probe(&dev.path, &sigs) else {
            let why = format!("carries {}", crate::pool::describe_signatures(&sigs));
            refuse(refused, dev, "signatures", &why);
            return Ok(false);
        };
        // Taken from the whole-device layout before the write (never both).
        let why = "a gds-csi partition table (layout: partition)".to_owned();
        let before = match self.pool.reserve_for_carving(&dev.id, why) {
            Ok(before) => before,
            Err(e) => {
                refuse(refused, dev, "whole_device", &e.to_string());
                return Ok(false);
            }
        };
        let path = dev.path.clone();
        let write = move || label::create(&path, proof.clone());
        match settled(&dev.path, "writing a new label", self.label_deadline, write).await {
            Ok(_) => {}
            // Still pending in the kernel: it may yet land (the mark stays).
            Err(Error::Layout(e)) if e.is_pending() => return Err(e.into()),
            Err(e) => {
                self.pool.set_foreign(&dev.id, before);
                refuse(refused, dev, "label_refused", &e.to_string());
                return Ok(false);
            }
        }
        info!(device = %dev.path.display(), "new gds-csi partition table");
        Ok(true)
    }

    /// A device carrying our label is no free whole device, also once its last
    /// partition is gone (the start-up probe says the same from its signature).
    pub(crate) fn keep_from_whole_device_use(&self, dev: &PoolDevice) {
        let why = "a gds-csi partition table (layout: partition)".to_owned();
        self.pool.set_foreign(&dev.id, Some(why));
    }

    /// Records the volume on `dev` before carving, so a retry carves the same partition.
    fn claim(&self, req: &AllocationRequest, dev: &PoolDevice, size: u64) -> Result<BlockVolumeId> {
        self.pool.state.update(|state| {
            if let Some((id, _)) = state.by_name(&req.name) {
                return Ok(id.clone());
            }
            let uuid = uuid::Uuid::new_v4();
            let id = BlockVolumeId {
                device_id: dev.id.clone(),
                allocation: uuid.simple().to_string()[..8].to_owned(),
                node_id: self.pool.node_id().to_owned(),
                layout: IdLayout::Partition,
            };
            let record = VolumeRecord {
                name: req.name.clone(),
                device_id: dev.id.clone(),
                device_key: dev.key.clone(),
                capacity_bytes: size,
                fs_type: req.fs_type,
                parameters: req.parameters.clone(),
                fs_uuid: uuid.hyphenated().to_string(),
                formatted: false,
                deleting: false,
                device_identity: None,
                partition: None,
                stripe: None,
                source: req.source.clone(),
            };
            state.insert(&id, record);
            Ok(id)
        })
    }

    /// Carves (or finds) the claimed volume's partition, zeroes it, and records where it
    /// is. The caller holds the device's lock.
    ///
    /// Zeroed at create as well as at delete: a label's free space is not proof that its
    /// blocks were erased (a device found blank by its signatures may hold an older
    /// tenant's data further in, and a delete cut short by a crash, or an entry another
    /// tool removed, may have left some), and a raw-block tenant reads every block. The
    /// zero-out is the device's offload where it has one (a moment on NVMe), a job that a
    /// retry joins, and the record names the partition only once it is done.
    async fn carve(&self, id: &BlockVolumeId) -> Result<(BlockVolumeId, VolumeRecord)> {
        let raw = &id.to_string();
        let rec = self.record(raw)?;
        let dev = self.parent(&rec)?;
        self.repair_label(&dev.path).await?;
        let (path, name, size) = (dev.path.clone(), id.allocation.clone(), rec.capacity_bytes);
        let held = self.held(&dev.id);
        let write = move || volume::carve(&path, &name, size, &held);
        let carved = settled(&dev.path, "carving a partition", self.label_deadline, write).await?;
        faults::reached(KillPoint::PartAfterLabel);
        self.zero_new(raw, &dev.path, carved.partuuid).await?;
        let part = PartitionRecord {
            partuuid: carved.partuuid.to_string(),
            number: carved.number,
            span: Some((carved.span.start, carved.span.len)),
            erased: false,
            moving: None,
        };
        let rec = self.pool.state.update(|s| {
            let r = s
                .get_mut(raw)
                .ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))?;
            r.partition = Some(part);
            Ok(r.clone())
        })?;
        faults::reached(KillPoint::AfterAllocate);
        info!(volume_id = raw, node = %carved.node.display(), "partition carved");
        Ok((id.clone(), rec))
    }
}

impl Partitioned {
    /// Zeroes partition `partuuid` of `parent`, just carved for volume `raw`, whatever it
    /// holds: its blocks are this volume's from now on, and no earlier tenant's byte may
    /// reach it. Its node is opened under the disk's lock, udevd's re-read after the label
    /// write waited out (the node can vanish for a moment then), and is zeroed once open.
    pub(crate) async fn zero_new(
        &self,
        raw: &str,
        parent: &std::path::Path,
        partuuid: uuid::Uuid,
    ) -> Result<()> {
        let key = format!("zero-new:{raw}");
        let (this, volume_id, parent) = (self.clone(), raw.to_owned(), parent.to_owned());
        let job = async move {
            let path = parent.clone();
            let open = move || volume::open_located(&path, &partuuid);
            let (file, node) = settled(
                &parent,
                "opening a new partition",
                this.label_deadline,
                open,
            )
            .await?;
            info!(volume_id, node = %node.display(), "zeroing the new partition");
            let zeroed = tokio::task::spawn_blocking(move || {
                gpt::kernel::zero_file(&file, &node, super::ZERO_CHUNK_DEADLINE)
            });
            zeroed
                .await
                .map_err(|e| LayoutError::ZeroTaskFailed { why: e.to_string() })?
                .map_err(Error::from)
        };
        self.pool.jobs.run(&key, "partition-zero", job).await
    }
}

/// A device passed over when picking where to carve: logged, counted, kept for the
/// ResourceExhausted message.
fn refuse(refused: &mut Vec<String>, dev: &PoolDevice, reason: &'static str, why: &str) {
    warn!(device = %dev.path.display(), reason, why, "pool device not carvable; passed over");
    crate::metrics::carve_refused(reason);
    refused.push(format!("{}: {why}", dev.path.display()));
}
