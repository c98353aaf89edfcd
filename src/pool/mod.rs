//! The node's pool of whole block devices, and the allocation domain operations.

mod allocate;
pub mod discover;
pub mod fs_min;
mod gauges;
pub mod inventory;
pub mod source;
pub mod state;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use tracing::{info, warn};

pub use inventory::{Excluded, Observed, PoolDevice};
pub use source::{Content, RecordedSource, SourceOf};
pub use state::{
    MoveRecord, PartitionRecord, State, StateStore, StripeMember, StripeRecord, VolumeRecord,
};

use crate::error::{Result, VolumeError};
use crate::os::{blockdev, FsType, Host, MountEntry, Signature};
use crate::runtime::faults::{self, KillPoint};
use crate::runtime::overlap::Jobs;

pub struct PoolConfig {
    pub node_id: String,
    pub host_sys: PathBuf,
    pub host_dev: PathBuf,
    pub listed: Vec<PathBuf>,
    pub nvme_discover: bool,
    pub state_dir: PathBuf,
}

pub struct Pool {
    config: PoolConfig,
    devices: RwLock<BTreeMap<String, PoolDevice>>,
    excluded: RwLock<Vec<Excluded>>,
    /// Free devices seen carrying a signature that is not ours: never allocated.
    foreign: Mutex<HashMap<String, String>>,
    pub state: StateStore,
    /// Long work on the pool's devices (mkfs, erase) that outlives a cancelled call.
    pub jobs: Jobs,
}

/// What CreateVolume asks of the pool, already validated.
#[derive(Debug, Clone)]
pub struct AllocationRequest {
    pub name: String,
    pub required_bytes: u64,
    /// 0 means no limit.
    pub limit_bytes: u64,
    pub fs_type: FsType,
    pub parameters: BTreeMap<String, String>,
    /// The volume or snapshot the volume is filled from.
    pub source: Option<RecordedSource>,
}

impl AllocationRequest {
    pub(crate) fn fits(&self, size: u64) -> bool {
        size >= self.required_bytes && (self.limit_bytes == 0 || size <= self.limit_bytes)
    }

    /// Whether `rec` was made by this request: the same filesystem, parameters and source.
    pub(crate) fn made(&self, rec: &VolumeRecord) -> bool {
        rec.fs_type == self.fs_type
            && rec.parameters == self.parameters
            && rec.source == self.source
    }
}

impl Pool {
    pub fn open(config: PoolConfig) -> Result<Self> {
        let state = StateStore::open(&config.state_dir)?;
        Ok(Pool {
            config,
            devices: RwLock::default(),
            excluded: RwLock::default(),
            foreign: Mutex::default(),
            state,
            jobs: Jobs::default(),
        })
    }

    /// The driver's state dir (the clone copies keep their progress there).
    pub fn state_dir(&self) -> &std::path::Path {
        &self.config.state_dir
    }

    /// The host's sysfs (`/sys`, or a test's tree).
    pub fn host_sys(&self) -> &std::path::Path {
        &self.config.host_sys
    }

    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    /// Re-reads which devices exist. Cheap (sysfs and stat only); run at start and
    /// whenever a volume's device is not what or where it was.
    pub fn rescan(&self, mounts: &[MountEntry]) {
        let mut candidates = Vec::new();
        let mut excluded = Vec::new();
        for path in &self.config.listed {
            match inventory::listed_device(&self.config.host_sys, path) {
                Ok(dev) => candidates.push(dev),
                Err(reason) => excluded.push(Excluded {
                    device: path.display().to_string(),
                    reason,
                }),
            }
        }
        // Every device a volume lives on: a stripe's members too, or after a restart the
        // devices holding only later members (partitioned, held by md) are left out.
        let state = self.state.snapshot();
        let allocated: HashSet<String> = state
            .values()
            .flat_map(|v| {
                let members = v.stripe.iter().flat_map(|s| &s.members);
                std::iter::once(v.device_key.clone()).chain(members.map(|m| m.device_key.clone()))
            })
            .collect();
        if self.config.nvme_discover {
            // Namespaces the driver allocated are mounted by the driver: never exclude them.
            let (found, skipped) = inventory::nvme_namespaces(
                &self.config.host_sys,
                &self.config.host_dev,
                mounts,
                &allocated,
            );
            candidates.extend(found);
            excluded.extend(skipped);
        }
        let (devices, duplicates) = one_per_device(candidates, &allocated);
        excluded.extend(duplicates);
        for e in &excluded {
            warn!(device = %e.device, reason = %e.reason, "device not in the pool");
        }
        *self.devices.write().unwrap_or_else(|e| e.into_inner()) = devices;
        *self.excluded.write().unwrap_or_else(|e| e.into_inner()) = excluded;
    }

    /// The pool device `id` as it is now: rescanned first when its path or name no
    /// longer shows what the last scan saw (re-attached, renamed, detached, re-pointed).
    pub fn fresh_device(&self, id: &str, mounts: &[MountEntry]) -> Option<PoolDevice> {
        let current = self.device(id);
        let unchanged = current.as_ref().is_some_and(|d| {
            inventory::observe(&self.config.host_sys, d).ok() == Some(d.observed_at_scan())
        });
        if unchanged {
            return current;
        }
        self.rescan(mounts);
        self.device(id)
    }

    /// Where the device is in use on this host (mounts, binds of its node, holders).
    pub fn uses(&self, dev: &PoolDevice, mounts: &[MountEntry]) -> Vec<crate::os::DeviceUse> {
        blockdev::uses(mounts, &self.config.host_sys, dev.major, dev.minor)
    }

    /// The device is still the one allocated to the volume: same size and sysfs identity
    /// as recorded, at the number `dev` was found at. Call right before every destructive
    /// step (mkfs, wipe, discard) and before mounting; sysfs and stat only, cheap.
    pub fn verify_identity(
        &self,
        volume_id: &str,
        dev: &PoolDevice,
        record: &VolumeRecord,
    ) -> Result<()> {
        let recorded = format!(
            "{} bytes, {}",
            record.capacity_bytes,
            record
                .device_identity
                .as_deref()
                .unwrap_or("no sysfs identity recorded")
        );
        let now = match inventory::observe(&self.config.host_sys, dev) {
            Ok(now) => now,
            Err(why) => {
                return Err(VolumeError::IdentityUnreadable {
                    volume: volume_id.to_owned(),
                    path: dev.path.clone(),
                    why: why.to_string(),
                    recorded,
                }
                .into())
            }
        };
        let same_device = now.size_bytes == record.capacity_bytes
            && (record.device_identity.is_none() || record.device_identity == now.identity);
        let same_number = (now.major, now.minor) == (dev.major, dev.minor);
        if same_device && same_number {
            return Ok(());
        }
        // Only a partition is located again: its PARTUUID, read from the parent's label
        // under the disk's lock, proves which one it is. A whole device at a new number
        // with no identity recorded could be any device of that size.
        if same_device && record.partition.is_some() {
            return Err(VolumeError::DeviceMoved {
                volume: volume_id.to_owned(),
                path: dev.path.clone(),
                from: format!("{}:{}", dev.major, dev.minor),
                now: format!("{}:{}", now.major, now.minor),
            }
            .into());
        }
        warn!(volume_id, device = %dev.path.display(), %recorded, now = %now, "device is not the one allocated");
        Err(VolumeError::NotItsDevice {
            volume: volume_id.to_owned(),
            path: dev.path.clone(),
            recorded,
            now: now.to_string(),
        }
        .into())
    }

    pub fn devices(&self) -> Vec<PoolDevice> {
        self.devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn excluded(&self) -> Vec<Excluded> {
        self.excluded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn device(&self, id: &str) -> Option<PoolDevice> {
        self.devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    fn foreign_reason(&self, id: &str) -> Option<String> {
        self.foreign
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    pub(crate) fn set_foreign(&self, id: &str, reason: Option<String>) {
        let mut foreign = self.foreign.lock().unwrap_or_else(|e| e.into_inner());
        match reason {
            Some(r) => foreign.insert(id.to_owned(), r),
            None => foreign.remove(id),
        };
    }

    /// The partition layout takes device `id` to write a new label on: refused while a
    /// whole-device volume holds it, else marked as not free (`why`) under the state
    /// lock, where the whole-device layout claims (`allocate::claim`), so the two layouts
    /// never both take one device. Returns the mark it replaced (to restore on failure).
    pub(crate) fn reserve_for_carving(&self, id: &str, why: String) -> Result<Option<String>> {
        use crate::csi::id::{BlockVolumeId, IdLayout};
        self.state.update(|s| {
            let whole = |v: &BlockVolumeId| v.layout != IdLayout::Partition;
            if let Some((v, _)) = s.entries().find(|(v, r)| r.device_id == id && whole(v)) {
                return Err(VolumeError::HeldWhole {
                    volume: v.to_string(),
                }
                .into());
            }
            let mut foreign = self.foreign.lock().unwrap_or_else(|e| e.into_inner());
            Ok(foreign.insert(id.to_owned(), why))
        })
    }

    /// Free devices that can be handed out: not allocated, no foreign signature seen.
    pub fn free_devices(&self) -> Vec<PoolDevice> {
        let state = self.state.snapshot();
        // One pass over the records, whatever the number of devices.
        let used: HashSet<&str> = state.values().map(|r| r.device_id.as_str()).collect();
        let mut free: Vec<_> = self
            .devices()
            .into_iter()
            .filter(|d| !used.contains(d.id.as_str()) && self.foreign_reason(&d.id).is_none())
            .collect();
        free.sort_by_key(|d| (d.size_bytes, d.id.clone()));
        free
    }

    /// Probes every free device once so capacity reports leave out foreign ones.
    pub async fn classify_free(&self, host: &dyn Host) {
        let state = self.state.snapshot();
        for dev in self.devices() {
            if state.by_device(&dev.id).is_some() {
                continue;
            }
            let reason = match host.probe_signatures(&dev.path).await {
                Ok(sigs) if sigs.is_empty() => None,
                Ok(sigs) => Some(describe_signatures(&sigs)),
                Err(e) => Some(e.to_string()),
            };
            if let Some(r) = &reason {
                warn!(device = %dev.path.display(), reason = %r, "pool device is not clean; it will not be allocated");
            }
            self.set_foreign(&dev.id, reason);
        }
    }

    /// DeleteVolume's domain operation, resumable after a crash at any step.
    pub async fn release(
        &self,
        host: &Arc<dyn Host>,
        volume_id: &str,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let Some(record) = self.state.snapshot().get(volume_id).cloned() else {
            return Ok(());
        };
        // A device that is gone (detached, removed) holds nothing to wipe: the record goes.
        let device = self.fresh_device(&record.device_id, mounts);
        if let Some(dev) = &device {
            let uses = self.uses(dev, mounts);
            if !uses.is_empty() {
                let list: Vec<String> = uses.iter().map(ToString::to_string).collect();
                return Err(VolumeError::StillInUse {
                    volume: volume_id.to_owned(),
                    uses: list.join(", "),
                }
                .into());
            }
            self.verify_identity(volume_id, dev, &record)?;
        }
        self.state.update(|s| {
            if let Some(r) = s.get_mut(volume_id) {
                r.deleting = true;
            }
            Ok(())
        })?;
        faults::reached(KillPoint::DeleteBeforeWipe);
        if let Some(dev) = &device {
            self.erase(host, volume_id, &record, dev).await?;
        }
        self.state.update(|s| {
            s.remove(volume_id);
            Ok(())
        })?;
        info!(volume_id, "released");
        Ok(())
    }

    /// The erase step of release: zero the device when it is provably this volume's (its
    /// identity matches the record and it carries nothing or only the volume's own
    /// filesystem); a device carrying anything else is left exactly as it is and kept out
    /// of allocation. Runs as a job that outlives a cancelled DeleteVolume.
    async fn erase(
        &self,
        host: &Arc<dyn Host>,
        volume_id: &str,
        record: &VolumeRecord,
        dev: &PoolDevice,
    ) -> Result<()> {
        let key = format!("erase:{volume_id}");
        // An erase that a cancelled call started: join it instead of probing a device
        // it holds.
        if let Some(outcome) = self.jobs.join(&key).await {
            outcome?;
            self.set_foreign(&dev.id, None);
            return Ok(());
        }
        let sigs = host.probe_signatures(&dev.path).await?;
        self.verify_identity(volume_id, dev, record)?;
        if !erasable(&record.fs_uuid, &sigs) {
            warn!(volume_id, signatures = %describe_signatures(&sigs), "device carries signatures that are not the volume's; left untouched");
            self.set_foreign(&dev.id, Some(describe_signatures(&sigs)));
            return Ok(());
        }
        let job = erase_job(Arc::clone(host), dev.path.clone(), record.clone());
        self.jobs.run(&key, "erase", job).await?;
        self.set_foreign(&dev.id, None);
        Ok(())
    }
}

/// A deleted volume's device may be erased when it shows nothing (never staged, a raw
/// block volume, or an erase interrupted after the wipe) or only the volume's filesystem.
fn erasable(fs_uuid: &str, sigs: &[Signature]) -> bool {
    sigs.iter().all(|s| s.uuid.as_deref() == Some(fs_uuid))
}

/// Under the device hold: probe again, remove the signatures, zero every block.
async fn erase_job(host: Arc<dyn Host>, device: PathBuf, record: VolumeRecord) -> Result<()> {
    let _hold = crate::os::hold_when_free(host.as_ref(), &device, crate::os::HOLD_PATIENCE).await?;
    let sigs = host.probe_signatures(&device).await?;
    if !erasable(&record.fs_uuid, &sigs) {
        return Err(VolumeError::WrittenWhileDeleting {
            path: device,
            signatures: describe_signatures(&sigs),
            name: record.name,
        }
        .into());
    }
    if !sigs.is_empty() {
        // Signatures first: an erase cut short leaves no half-zeroed filesystem that
        // still looks like the volume's.
        host.wipe_signatures(&device).await?;
    }
    host.zero_device(&device).await?;
    faults::reached(KillPoint::DeleteAfterWipe);
    info!(device = %device.display(), "erased: every block reads back as zeros");
    Ok(())
}

/// One pool device per device number: a device listed twice (`/dev/loop3` and a symlink
/// to it, or listed and also discovered) is kept once. The one a volume was allocated
/// under keeps its key (so its volume ids keep working); otherwise a discovered NVMe
/// namespace (keyed by wwid, stable across renames), otherwise the first listed.
fn one_per_device(
    candidates: Vec<PoolDevice>,
    allocated: &HashSet<String>,
) -> (BTreeMap<String, PoolDevice>, Vec<Excluded>) {
    let mut by_devnum: BTreeMap<(u32, u32), Vec<PoolDevice>> = BTreeMap::new();
    for dev in candidates {
        by_devnum
            .entry((dev.major, dev.minor))
            .or_default()
            .push(dev);
    }
    let mut devices = BTreeMap::new();
    let mut excluded = Vec::new();
    for ((major, minor), mut same) in by_devnum {
        // Stable sort: order of listing breaks ties.
        same.sort_by_key(|d| {
            (
                !allocated.contains(&d.key),
                matches!(d.source, inventory::Source::Listed),
            )
        });
        let mut it = same.into_iter();
        let Some(keep) = it.next() else { continue };
        for dup in it {
            let reason = if allocated.contains(&dup.key) {
                tracing::error!(device = %dup.path.display(), kept = %keep.path.display(), "two volumes are recorded on one device; only the volumes of the kept path are served: inspect the state file");
                format!(
                    "device {major}:{minor} listed twice, and volumes are recorded under both \
                     {} and {}; only {} is used: inspect the state file",
                    dup.path.display(),
                    keep.path.display(),
                    keep.path.display()
                )
            } else {
                format!(
                    "device {major}:{minor} listed twice ({} and {}); only {} is used",
                    dup.path.display(),
                    keep.path.display(),
                    keep.path.display()
                )
            };
            excluded.push(Excluded {
                device: dup.path.display().to_string(),
                reason,
            });
        }
        devices.insert(keep.id.clone(), keep);
    }
    (devices, excluded)
}

pub fn describe_signatures(sigs: &[crate::os::Signature]) -> String {
    sigs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use inventory::Source;

    fn dev(key: &str, devnum: (u32, u32), source: Source) -> PoolDevice {
        PoolDevice {
            id: inventory::device_id("x", key),
            key: key.into(),
            path: PathBuf::from(key.rsplit(':').next().unwrap()),
            size_bytes: 1 << 20,
            major: devnum.0,
            minor: devnum.1,
            identity: None,
            source,
        }
    }

    fn sig(kind: &str, uuid: Option<&str>) -> Signature {
        Signature {
            kind: kind.into(),
            uuid: uuid.map(Into::into),
            offset: None,
            seen_by: "test",
        }
    }

    fn record(name: &str, device_id: &str) -> VolumeRecord {
        VolumeRecord {
            name: name.into(),
            device_id: device_id.into(),
            device_key: "path:/dev/x".into(),
            capacity_bytes: 1 << 20,
            fs_type: crate::os::FsType::Ext4,
            parameters: Default::default(),
            fs_uuid: "uuid".into(),
            formatted: false,
            deleting: false,
            device_identity: None,
            partition: None,
            stripe: None,
            source: None,
        }
    }

    #[test]
    fn carving_is_refused_on_a_device_a_whole_device_volume_holds() {
        let id = |text: &str| crate::csi::id::BlockVolumeId::parse(text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::open(PoolConfig {
            node_id: "n".into(),
            host_sys: dir.path().join("sys"),
            host_dev: dir.path().join("dev"),
            listed: vec![],
            nvme_discover: false,
            state_dir: dir.path().join("state"),
        })
        .unwrap();
        pool.state
            .update(|s| {
                s.insert(&id("blk:dev-w:a1:n"), record("whole", "dev-w"));
                s.insert(&id("blk:dev-p:a2:n:part"), record("carved", "dev-p"));
                Ok(())
            })
            .unwrap();
        let held = pool
            .reserve_for_carving("dev-w", "label".into())
            .unwrap_err();
        assert!(
            matches!(&held, crate::error::Error::Volume(VolumeError::HeldWhole { volume }) if volume == "blk:dev-w:a1:n"),
            "{held}"
        );
        // A device of partition volumes is carved again; the mark it replaced comes back,
        // for the caller to restore when the label write fails.
        assert_eq!(
            pool.reserve_for_carving("dev-p", "first".into()).unwrap(),
            None
        );
        assert_eq!(
            pool.reserve_for_carving("dev-p", "second".into()).unwrap(),
            Some("first".to_owned())
        );
    }

    #[test]
    fn a_device_listed_twice_is_kept_once_under_the_allocated_or_most_stable_key() {
        let listed = dev("path:/dev/loop3", (7, 3), Source::Listed);
        let alias = dev("path:/by-id/a", (7, 3), Source::Listed);
        let other = dev("path:/dev/loop4", (7, 4), Source::Listed);
        let nvme = dev(
            "wwid:eui.1",
            (259, 0),
            Source::Discovered {
                name: "nvme0n1".into(),
            },
        );
        let nvme_listed = dev("path:/dev/nvme0n1", (259, 0), Source::Listed);
        let all = vec![
            listed.clone(),
            alias.clone(),
            other.clone(),
            nvme_listed.clone(),
            nvme.clone(),
        ];

        let (kept, dropped) = one_per_device(all.clone(), &HashSet::new());
        let keys: Vec<_> = kept.values().map(|d| d.key.as_str()).collect();
        assert_eq!(kept.len(), 3, "{keys:?}");
        assert!(kept.contains_key(&listed.id), "first listed wins: {keys:?}");
        assert!(kept.contains_key(&nvme.id), "wwid beats a path: {keys:?}");
        assert!(kept.contains_key(&other.id));
        assert_eq!(dropped.len(), 2);
        assert!(dropped.iter().all(|e| e.reason.contains("listed twice")));

        // A volume allocated under the alias keeps the alias's key, whatever the order.
        let allocated = HashSet::from([alias.key.clone(), nvme_listed.key.clone()]);
        let (kept, _) = one_per_device(all, &allocated);
        assert!(kept.contains_key(&alias.id) && !kept.contains_key(&listed.id));
        assert!(kept.contains_key(&nvme_listed.id) && !kept.contains_key(&nvme.id));
    }

    #[test]
    fn only_a_blank_device_or_the_volumes_own_filesystem_is_erased() {
        assert!(erasable("u-1", &[]), "nothing (raw block, never staged)");
        assert!(erasable(
            "u-1",
            &[sig("ext4", Some("u-1")), sig("ext4", Some("u-1"))]
        ));
        for foreign in [
            vec![sig("ext4", Some("u-2"))],
            vec![sig("ext4", Some("u-1")), sig("dos", Some("abcd"))],
            vec![sig("gpt", None)],
            vec![sig("unknown", None)],
        ] {
            assert!(!erasable("u-1", &foreign), "{foreign:?}");
        }
    }
}
