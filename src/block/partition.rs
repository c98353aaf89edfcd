//! The partition layout (issue 13): a volume is a GPT partition carved from a pool
//! device (`crate::partition`). Only a label this driver wrote is changed, and a new
//! label goes only on a device the signature probe found blank. One lock serialises
//! every label change (a single lock for all pool devices: label writes are a few
//! sectors, and it keeps the claim-then-carve order simple).
//!
//! Crash safety: the volume's record is written (without its partition) before the
//! partition is carved, and the partition is named with the volume's allocation id, so
//! a retried CreateVolume finds or carves the same partition; DeleteVolume erases the
//! partition, then removes it from the kernel and the label, then drops the record.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::layout::{Capacity, Layout};
use crate::error::{Error, Result};
use crate::os::{blockdev, Host, MountEntry};
use crate::partition::{self as gpt, label, volume, Carved, OnDisk, SizeRange};
use crate::pool::inventory::Source;
use crate::pool::{AllocationRequest, PartitionRecord, Pool, PoolDevice, VolumeRecord};
use crate::volume_id::{BlockVolumeId, IdLayout};

/// Each 1 GiB chunk of the offloaded zero-out must finish within this.
const ZERO_CHUNK_DEADLINE: Duration = Duration::from_secs(120);

pub struct Partitioned {
    pub pool: Arc<Pool>,
    /// Serialises every label change (the stripe layout's members take it too).
    pub(crate) lock: Mutex<()>,
}

/// A partition error as the CSI code its cause calls for.
pub fn csi_error(e: gpt::Error) -> Error {
    let m = e.to_string();
    match e {
        gpt::Error::OutOfRange(_) => Error::OutOfRange(m),
        gpt::Error::NoSpace { .. } | gpt::Error::Blocked { .. } => Error::ResourceExhausted(m),
        gpt::Error::NotFound(_) => Error::NotFound(m),
        gpt::Error::NameTaken { .. } => Error::AlreadyExists(m),
        gpt::Error::Io { device, source, .. } => Error::Io {
            context: "partition layout",
            path: device,
            source,
        },
        _ => Error::FailedPrecondition(m),
    }
}

/// Whether a state key names a volume carved from labels (partition or stripe layout).
fn is_partition_id(id: &str) -> bool {
    BlockVolumeId::parse(id).is_some_and(|i| i.layout != IdLayout::Device)
}

impl Partitioned {
    pub fn new(pool: Arc<Pool>) -> Self {
        Partitioned {
            pool,
            lock: Mutex::new(()),
        }
    }

    /// Pool devices a whole-device volume does not hold, with what they carry.
    pub(crate) fn candidates(&self) -> Vec<(PoolDevice, OnDisk)> {
        let state = self.pool.state.snapshot();
        self.pool
            .devices()
            .into_iter()
            .filter(|d| {
                !state
                    .volumes
                    .iter()
                    .any(|(id, r)| r.device_id == d.id && !is_partition_id(id))
            })
            .filter_map(|d| match label::read(&d.path) {
                Ok(on) => Some((d, on)),
                Err(e) => {
                    warn!(device = %d.path.display(), error = %e, "label unreadable; not carved");
                    None
                }
            })
            .collect()
    }

    /// Start-up: the kernel shows every partition of our labels again.
    pub fn resync(&self) {
        for (dev, on) in self.candidates() {
            if let OnDisk::Ours { .. } = on {
                match gpt::kernel::resync(&dev.path) {
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
        let parsed = BlockVolumeId::parse(id).filter(|i| i.layout == IdLayout::Partition);
        let fits = req.fits(rec.capacity_bytes);
        match parsed {
            Some(p) if fits && rec.fs_type == req.fs_type && rec.parameters == req.parameters => {
                Ok(Some((p, rec.clone())))
            }
            _ => Err(Error::AlreadyExists(format!(
                "volume {:?} exists with another layout, capacity, fsType or parameters; \
                 use another name or the same request",
                req.name
            ))),
        }
    }

    /// A pool device to carve `size` bytes from: the best fit among our labels, else the
    /// smallest blank free device (probed, then labelled).
    async fn place(&self, host: &dyn Host, size: u64) -> Result<PoolDevice> {
        let cands = self.candidates();
        let labels: Vec<_> = cands
            .iter()
            .filter_map(|(d, on)| match on {
                OnDisk::Ours { label, .. } => Some((d.path.clone(), label.clone())),
                _ => None,
            })
            .collect();
        if let Some((path, _)) = volume::choose(&labels, size) {
            let found = cands.iter().find(|(d, _)| d.path == path);
            return found
                .map(|(d, _)| d.clone())
                .ok_or_else(|| Error::NotFound(format!("{} left the pool", path.display())));
        }
        let mut blank: Vec<_> = cands
            .into_iter()
            .filter(|(d, on)| *on == OnDisk::Blank && blank_capacity(d).1 >= size)
            .map(|(d, _)| d)
            .collect();
        blank.sort_by_key(|d| (d.size_bytes, d.id.clone()));
        let mounts = host.mount_table()?;
        for dev in blank {
            if !self.pool.uses(&dev, &mounts).is_empty() {
                continue;
            }
            let sigs = host.probe_signatures(&dev.path).await?;
            let Some(proof) = label::Blank::from_signature_probe(&dev.path, &sigs) else {
                continue;
            };
            label::create(&dev.path, proof).map_err(csi_error)?;
            self.keep_from_whole_device_use(&dev);
            info!(device = %dev.path.display(), "new gds-csi partition table");
            return Ok(dev);
        }
        Err(Error::ResourceExhausted(format!(
            "no pool device on node {} has a free extent of {size} bytes, and no blank \
             device is big enough; delete a volume or add devices",
            self.pool.node_id()
        )))
    }

    /// A device carrying our label is no free whole device, also once its last
    /// partition is gone (the start-up probe says the same from its signature).
    pub(crate) fn keep_from_whole_device_use(&self, dev: &PoolDevice) {
        let why = "a gds-csi partition table (layout: partition)".to_owned();
        self.pool.set_foreign(&dev.id, Some(why));
    }

    /// Records the volume on `dev` before carving, so a retry carves the same partition.
    fn claim(&self, req: &AllocationRequest, dev: &PoolDevice, size: u64) -> Result<String> {
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
            };
            state.volumes.insert(id.to_string(), record);
            Ok(id.to_string())
        })
    }

    /// Carves (or finds) the claimed volume's partition and records where it is.
    fn carve(&self, raw: &str) -> Result<(BlockVolumeId, VolumeRecord)> {
        let rec = self.record(raw)?;
        let id = BlockVolumeId::parse(raw).ok_or_else(|| Error::NotFound(raw.to_owned()))?;
        let dev = self.parent(&rec)?;
        let carved =
            volume::carve(&dev.path, &id.allocation, rec.capacity_bytes).map_err(csi_error)?;
        let part = PartitionRecord {
            partuuid: carved.partuuid.to_string(),
            number: carved.number,
        };
        let rec = self.pool.state.update(|s| {
            let r = s
                .volumes
                .get_mut(raw)
                .ok_or_else(|| Error::NotFound(raw.to_owned()))?;
            r.partition = Some(part);
            Ok(r.clone())
        })?;
        info!(volume_id = raw, node = %carved.node.display(), "partition carved");
        Ok((id, rec))
    }

    fn record(&self, raw: &str) -> Result<VolumeRecord> {
        let state = self.pool.state.snapshot();
        let rec = state.volumes.get(raw).cloned();
        rec.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))
    }

    fn parent(&self, rec: &VolumeRecord) -> Result<PoolDevice> {
        self.pool.device(&rec.device_id).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "pool device {} ({}) holding the volume's partition is not in the pool; \
                 reattach it and retry",
                rec.device_id, rec.device_key
            ))
        })
    }

    /// The volume's partition as the kernel shows it now (re-added if it was dropped).
    fn carved(&self, raw: &str, rec: &VolumeRecord, parent: &Path) -> Result<Option<Carved>> {
        let guid = match &rec.partition {
            Some(p) => uuid::Uuid::parse_str(&p.partuuid).map_err(|e| Error::State {
                path: parent.to_owned(),
                reason: format!("bad PARTUUID {:?}: {e}", p.partuuid),
            })?,
            None => {
                // Claimed, maybe carved, crash before the record said so: by name.
                let id = BlockVolumeId::parse(raw).ok_or_else(|| Error::NotFound(raw.into()))?;
                // No label of ours: nothing was carved for it (nothing to erase).
                let Ok(label) = volume::ours(parent) else {
                    return Ok(None);
                };
                match label.by_name(&id.allocation) {
                    Some((_, e)) => e.guid,
                    None => return Ok(None),
                }
            }
        };
        match volume::locate(parent, &guid) {
            Ok(c) => Ok(Some(c)),
            Err(gpt::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(csi_error(e)),
        }
    }
}

/// What a blank device would offer once labelled: (available, largest).
pub(crate) fn blank_capacity(dev: &PoolDevice) -> (u64, u64) {
    let geometry = std::fs::File::open(&dev.path)
        .map_err(|e| gpt::Error::io("opening", &dev.path, e))
        .and_then(|f| label::geometry(&f, &dev.path));
    let Ok((sector, size)) = geometry else {
        return (0, 0);
    };
    match gpt::Label::new(sector, size / sector, gpt::gpt::new_disk_guid()) {
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
        let _guard = self.lock.lock().await;
        if let Some((id, rec)) = self.existing(req)? {
            if rec.partition.is_some() {
                return Ok((id, rec));
            }
            return self.carve(&id.to_string());
        }
        let range = SizeRange {
            required: req.required_bytes,
            limit: req.limit_bytes,
        };
        let size = range.size(gpt::ALIGN).map_err(csi_error)?;
        let dev = self.place(host, size).await?;
        let raw = self.claim(req, &dev, size)?;
        self.carve(&raw)
    }

    async fn release(
        &self,
        host: &Arc<dyn Host>,
        volume_id: &str,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let _guard = self.lock.lock().await;
        let Ok(rec) = self.record(volume_id) else {
            return Ok(());
        };
        let parent = self.pool.fresh_device(&rec.device_id, mounts);
        if let Some(parent) = &parent {
            if let Some(carved) = self.carved(volume_id, &rec, &parent.path)? {
                self.erase(host, volume_id, &rec, parent, &carved, mounts)
                    .await?;
                volume::remove(&parent.path, &carved.partuuid).map_err(csi_error)?;
                self.keep_from_whole_device_use(parent);
            }
        }
        self.pool.state.update(|s| {
            s.volumes.remove(volume_id);
            Ok(())
        })?;
        info!(volume_id, "partition released");
        Ok(())
    }

    fn locate(&self, record: &VolumeRecord, mounts: &[MountEntry]) -> Option<PoolDevice> {
        let parent = self.pool.fresh_device(&record.device_id, mounts)?;
        let part = record.partition.as_ref()?;
        let guid = uuid::Uuid::parse_str(&part.partuuid).ok()?;
        match volume::locate(&parent.path, &guid) {
            Ok(carved) => as_device(&parent, record, &carved),
            Err(e) => {
                warn!(device = %parent.path.display(), error = %e, "partition not found");
                None
            }
        }
    }

    fn capacity(&self) -> Capacity {
        let (mut available, mut maximum) = (0u64, 0u64);
        for (dev, on) in self.candidates() {
            let (a, m) = match on {
                OnDisk::Ours { label, .. } => label.capacity(),
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

impl Partitioned {
    /// Wipes the volume's filesystem signature and zeroes the partition (offloaded where
    /// the device can, else written), so the next tenant reads zeros.
    async fn erase(
        &self,
        host: &Arc<dyn Host>,
        volume_id: &str,
        rec: &VolumeRecord,
        parent: &PoolDevice,
        carved: &Carved,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let dev = as_device(parent, rec, carved).ok_or_else(|| {
            Error::FailedPrecondition(format!("{} is gone", carved.node.display()))
        })?;
        if let Some(u) = self.pool.uses(&dev, mounts).first() {
            return Err(Error::FailedPrecondition(format!(
                "volume {volume_id} is still in use: {u}; unpublish and unstage it first"
            )));
        }
        self.pool.state.update(|s| {
            if let Some(r) = s.volumes.get_mut(volume_id) {
                r.deleting = true;
            }
            Ok(())
        })?;
        let sigs = host.probe_signatures(&dev.path).await?;
        if sigs
            .iter()
            .any(|s| s.uuid.as_deref() != Some(rec.fs_uuid.as_str()))
        {
            return Err(Error::FailedPrecondition(format!(
                "partition {} of volume {volume_id} carries {}, not the volume's filesystem; \
                 it is left as it is",
                dev.path.display(),
                crate::pool::describe_signatures(&sigs)
            )));
        }
        if !sigs.is_empty() {
            host.wipe_signatures(&dev.path).await?;
        }
        let node = dev.path.clone();
        let offloaded = tokio::task::spawn_blocking(move || {
            gpt::kernel::zero_offloaded(&node, ZERO_CHUNK_DEADLINE)
        })
        .await
        .map_err(|e| Error::FailedPrecondition(format!("zero-out task failed: {e}")))?
        .map_err(csi_error)?;
        if offloaded == gpt::Erased::Unsupported {
            host.zero_device(&dev.path).await?;
        }
        info!(volume_id, node = %dev.path.display(), "partition erased");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_errors_become_the_csi_codes_their_causes_call_for() {
        let code = |e: gpt::Error| tonic::Status::from(csi_error(e)).code();
        use tonic::Code;
        assert_eq!(code(gpt::Error::OutOfRange("x".into())), Code::OutOfRange);
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
