//! Allocation state: a small JSON file under `--state-dir`, replaced atomically
//! (write, fsync, rename, fsync the directory) so a crash leaves the old or the new
//! version, never a torn one.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::os::FsType;

const FILE_NAME: &str = "volumes.json";
const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: String,
    pub device_id: String,
    /// The stable identity the device id was derived from (`wwid:...` or `path:...`).
    pub device_key: String,
    pub capacity_bytes: u64,
    pub fs_type: FsType,
    pub parameters: BTreeMap<String, String>,
    /// Chosen at allocation and given to mkfs, so the driver can recognise its own
    /// filesystem after a crash between mkfs and the state update.
    pub fs_uuid: String,
    /// mkfs completed; from now on the device is never formatted again.
    pub formatted: bool,
    /// DeleteVolume started; the device is being wiped and released.
    #[serde(default)]
    pub deleting: bool,
    /// What sysfs said the device is at allocation (`wwid:`, `serial:`, `loop:<file>@..`);
    /// with `capacity_bytes` it is re-checked before mkfs, wipe and mount. `None` in
    /// records written before it existed (their size is still checked) and for devices
    /// sysfs says nothing about.
    #[serde(default)]
    pub device_identity: Option<String>,
    /// The partition of `device_id` that is the volume (the `partition` layout); `None`
    /// for a whole-device volume and in records written before layouts existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionRecord>,
    /// The md RAID0 array and its members (the `stripe` layout); `None` for
    /// every other layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe: Option<StripeRecord>,
}

/// A stripe volume: its members in array order and, once created, the array's UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeRecord {
    pub chunk_bytes: u64,
    /// Bytes of each member partition (all equal).
    pub member_bytes: u64,
    pub members: Vec<StripeMember>,
    /// The md array UUID (`mdadm --examine --export` MD_UUID) once `mdadm --create`
    /// ran; only an array and member superblocks with this UUID are ever touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_uuid: Option<String>,
}

/// One member partition of a stripe volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeMember {
    pub device_id: String,
    pub device_key: String,
    /// `None` between the claim and the carve (found again by its name then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionRecord>,
    /// The NVMe controller (or subsystem) the member's drive sits behind when it was
    /// chosen (`block::stripe::controllers`); absent in records older than the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    /// The drive's PCIe nearness to the nearest GPU when chosen (`nvidia-smi topo`'s
    /// PXB, PHB, NODE, SYS; `block::stripe::pcie`); absent where no GPU was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_pcie: Option<String>,
}

/// Where a partition volume lives on its parent pool device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// Found again by this after a restart, a rename or a kernel that dropped it.
    pub partuuid: String,
    /// Its number in the label when carved (the PARTUUID decides which entry is it).
    pub number: u32,
    /// Where it lies on the device, (start, length) in bytes: held against carving and
    /// growing while the record lives, whatever another tool does to the label. None in
    /// records older than it (the kernel's view holds it then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<(u64, u64)>,
    /// DeleteVolume zeroed its blocks: a label that lacks it afterwards is the delete's
    /// own removal, not another tool's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub erased: bool,
}

impl PartitionRecord {
    /// Where this record says the partition is, as the partition steps take it.
    pub fn recorded(&self, name: Option<&str>) -> Option<crate::gpt::Recorded> {
        Some(crate::gpt::Recorded {
            partuuid: uuid::Uuid::parse_str(&self.partuuid).ok()?,
            number: self.number,
            span: self.held_span(),
            name: name.map(str::to_owned),
        })
    }

    /// The span held on its device, when recorded.
    pub fn held_span(&self) -> Option<crate::gpt::Extent> {
        self.span
            .map(|(start, len)| crate::gpt::Extent { start, len })
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// Keyed by volume id.
    pub volumes: BTreeMap<String, VolumeRecord>,
}

impl State {
    pub fn by_name(&self, name: &str) -> Option<(&String, &VolumeRecord)> {
        self.volumes.iter().find(|(_, v)| v.name == name)
    }

    pub fn by_device(&self, device_id: &str) -> Option<(&String, &VolumeRecord)> {
        self.volumes.iter().find(|(_, v)| v.device_id == device_id)
    }
}

pub struct StateStore {
    path: PathBuf,
    /// Shared with the readers of a snapshot: a read costs a reference, not a copy of
    /// every record.
    state: Mutex<Arc<State>>,
}

impl StateStore {
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io("creating state dir", dir, e))?;
        let path = dir.join(FILE_NAME);
        let state = match crate::state_dir::read_regular(&path)? {
            Some(bytes) => {
                let state: State = serde_json::from_slice(&bytes).map_err(|e| Error::State {
                    path: path.clone(),
                    reason: format!("unreadable ({e}); restore it from a backup, never delete it"),
                })?;
                if state.version != VERSION {
                    return Err(Error::State {
                        path,
                        reason: format!("version {} is not {VERSION}", state.version),
                    });
                }
                state
            }
            None => State {
                version: VERSION,
                volumes: BTreeMap::new(),
            },
        };
        Ok(StateStore {
            path,
            state: Mutex::new(Arc::new(state)),
        })
    }

    /// The state now; later updates do not change it.
    pub fn snapshot(&self) -> Arc<State> {
        Arc::clone(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Applies `change` to a copy, persists it, and only then makes it current:
    /// memory never runs ahead of the disk.
    pub fn update<R>(&self, change: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
        let mut current = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = State::clone(&current);
        let out = change(&mut next)?;
        self.persist(&next)?;
        *current = Arc::new(next);
        Ok(out)
    }

    fn persist(&self, state: &State) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(state).map_err(|e| Error::State {
            path: self.path.clone(),
            reason: format!("cannot be serialised: {e}"),
        })?;
        crate::state_dir::write_atomic(&self.path, &bytes)
            .map_err(|e| Error::io("writing", &self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str) -> VolumeRecord {
        VolumeRecord {
            name: name.into(),
            device_id: "dev-1".into(),
            device_key: "path:/dev/loop1".into(),
            capacity_bytes: 1 << 20,
            fs_type: FsType::Ext4,
            parameters: BTreeMap::new(),
            fs_uuid: "u".into(),
            formatted: false,
            deleting: false,
            device_identity: None,
            partition: None,
            stripe: None,
        }
    }

    #[test]
    fn updates_survive_reopen_and_failed_updates_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        store
            .update(|s| {
                s.volumes.insert("v1".into(), record("a"));
                Ok(())
            })
            .unwrap();
        let failed: Result<()> = store.update(|s| {
            s.volumes.clear();
            Err(Error::NotFound("x".into()))
        });
        assert!(failed.is_err());
        assert_eq!(store.snapshot().volumes.len(), 1);
        let reopened = StateStore::open(dir.path()).unwrap();
        assert_eq!(reopened.snapshot().volumes["v1"], record("a"));
    }

    #[test]
    fn records_written_before_device_identity_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = serde_json::to_value(State {
            version: VERSION,
            volumes: BTreeMap::from([("v1".to_owned(), record("a"))]),
        })
        .unwrap();
        old["volumes"]["v1"]
            .as_object_mut()
            .unwrap()
            .remove("device_identity");
        fs::write(dir.path().join(FILE_NAME), old.to_string()).unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(store.snapshot().volumes["v1"].device_identity, None);
    }

    #[test]
    fn a_corrupt_state_file_is_an_error_not_an_empty_pool() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE_NAME), b"{not json").unwrap();
        assert!(StateStore::open(dir.path()).is_err());
    }
}
