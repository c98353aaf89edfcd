//! Allocation state: one small JSON file per volume under `<state-dir>/volumes/`, each
//! replaced atomically (`state_dir::RecordFiles`), so a change costs the same at 10 volumes
//! as at 1,000 and a crash leaves the old or the new version, never a torn one.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::source::RecordedSource;
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::error::{Error, Result};
use crate::os::FsType;
use crate::runtime::state_dir::RecordFiles;

/// The marker of the format (once the file of every record).
const MARKER_FILE: &str = "volumes.json";
/// One file per volume record.
const RECORDS_DIR: &str = "volumes";
const LEGACY_VERSION: u32 = 1;
/// Records that kept a volume's source among its parameters; read and migrated.
const PARAMETER_SOURCE_VERSION: u32 = 2;
/// Records that kept a class's dataset only among its parameters; read as they are, the
/// block backend records the dataset as the source at start-up.
const DATASET_PARAMETER_VERSION: u32 = 3;
/// An older driver refuses a marker of a newer version, so none reads a record whose
/// source it would not see (and fill a clone as a blank volume).
const VERSION: u32 = 4;

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
    /// The volume, snapshot or dataset this volume is filled from (`None`: it starts
    /// empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RecordedSource>,
}

impl VolumeRecord {
    /// A record of an older version brought to this one's form: true when it changed.
    fn migrate(&mut self) -> bool {
        if self.source.is_some() {
            return false;
        }
        self.source = super::source::take_legacy(&mut self.parameters);
        self.source.is_some()
    }
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
    /// A move to a larger extent under way (an expansion the space after the partition
    /// cannot take; `block::partition::relocate`). Nothing stages the volume meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<MoveRecord>,
}

/// A partition being moved to a larger extent of its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    /// The extent it moves to, (start, length) in bytes.
    pub to: (u64, u64),
    /// The extent it leaves.
    pub from: (u64, u64),
    /// The PARTUUID of the spare label entry: over `to` until the switch, over the
    /// extent left behind after it, until that is erased.
    pub spare: String,
}

impl MoveRecord {
    pub fn to_span(&self) -> crate::disk::gpt::Extent {
        crate::disk::gpt::Extent {
            start: self.to.0,
            len: self.to.1,
        }
    }
}

impl PartitionRecord {
    /// Where this record says the partition is, as the partition steps take it.
    pub fn recorded(&self, name: Option<&str>) -> Option<crate::disk::gpt::Recorded> {
        Some(crate::disk::gpt::Recorded {
            partuuid: uuid::Uuid::parse_str(&self.partuuid).ok()?,
            number: self.number,
            span: self.held_span(),
            name: name.map(str::to_owned),
        })
    }

    /// The span held on its device, when recorded.
    pub fn held_span(&self) -> Option<crate::disk::gpt::Extent> {
        self.span
            .map(|(start, len)| crate::disk::gpt::Extent { start, len })
    }
}

/// The volumes of this node, keyed by volume id (its text, the order ListVolumes pages in),
/// each id parsed once when its record is read or inserted. Records are shared between
/// versions of the state, so an update copies references, not records.
#[derive(Debug, Clone, Default)]
pub struct State {
    volumes: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    id: BlockVolumeId,
    record: Arc<VolumeRecord>,
}

impl State {
    pub fn get(&self, id: &str) -> Option<&VolumeRecord> {
        self.volumes.get(id).map(|e| &*e.record)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut VolumeRecord> {
        self.volumes
            .get_mut(id)
            .map(|e| Arc::make_mut(&mut e.record))
    }

    pub fn contains(&self, id: &str) -> bool {
        self.volumes.contains_key(id)
    }

    pub fn insert(&mut self, id: &BlockVolumeId, record: VolumeRecord) {
        let entry = Entry {
            id: id.clone(),
            record: Arc::new(record),
        };
        self.volumes.insert(id.to_string(), entry);
    }

    pub fn remove(&mut self, id: &str) {
        self.volumes.remove(id);
    }

    /// Every record in volume id order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &VolumeRecord)> {
        self.volumes.iter().map(|(id, e)| (id, &*e.record))
    }

    /// Every record with its parsed id, in volume id order.
    pub fn entries(&self) -> impl Iterator<Item = (&BlockVolumeId, &VolumeRecord)> {
        self.volumes.values().map(|e| (&e.id, &*e.record))
    }

    /// The records whose ids sort after `after` (all of them without it), in id order.
    pub fn after(&self, after: Option<&str>) -> impl Iterator<Item = (&String, &VolumeRecord)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, |a| Excluded(a.to_owned()));
        self.volumes
            .range((from, Unbounded))
            .map(|(id, e)| (id, &*e.record))
    }

    pub fn values(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volumes.values().map(|e| &*e.record)
    }

    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }

    pub fn by_name(&self, name: &str) -> Option<(&BlockVolumeId, &VolumeRecord)> {
        self.entries().find(|(_, v)| v.name == name)
    }

    pub fn by_device(&self, device_id: &str) -> Option<(&BlockVolumeId, &VolumeRecord)> {
        self.entries().find(|(_, v)| v.device_id == device_id)
    }

    /// What `next` changed of `self` (`None`: removed), in one pass over both: a record
    /// `next` did not touch is the same allocation in both.
    fn changes<'a>(&self, next: &'a State) -> Vec<(String, Option<&'a VolumeRecord>)> {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let mut out = Vec::new();
        let mut old = self.volumes.iter().peekable();
        let mut new = next.volumes.iter().peekable();
        loop {
            // Copied out of the peeks: references into the maps, not borrows of the iterators.
            match (old.peek().copied(), new.peek().copied()) {
                (None, None) => return out,
                (Some((id, _)), None) => {
                    old.next();
                    out.push((id.clone(), None));
                }
                (None, Some((id, after))) => {
                    new.next();
                    out.push((id.clone(), Some(&*after.record)));
                }
                (Some((o, before)), Some((n, after))) => match o.cmp(n) {
                    Less => {
                        old.next();
                        out.push((o.clone(), None));
                    }
                    Greater => {
                        new.next();
                        out.push((n.clone(), Some(&*after.record)));
                    }
                    Equal => {
                        old.next();
                        new.next();
                        let (before, after) = (&before.record, &after.record);
                        if !Arc::ptr_eq(before, after) && before != after {
                            out.push((n.clone(), Some(&**after)));
                        }
                    }
                },
            }
        }
    }
}

/// Where the records live and what becomes of the single file they were once kept in:
/// `volumes.json` stays as a marker an older driver refuses (its version is not 1), so
/// it never starts over an empty pool.
#[derive(Serialize, Deserialize)]
struct Marker {
    version: u32,
    #[serde(default)]
    volumes: BTreeMap<String, VolumeRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    records: Option<String>,
}

pub struct StateStore {
    files: RecordFiles,
    /// Shared with the readers of a snapshot: a read costs a reference, not a copy of
    /// every record, and is never behind a write to disk (held only to swap it).
    state: Mutex<Arc<State>>,
    /// Updates one at a time, each from the state the previous one left.
    writer: Mutex<()>,
}

impl StateStore {
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io("creating state dir", dir, e))?;
        let marker_path = dir.join(MARKER_FILE);
        let marker = match crate::runtime::state_dir::read_regular(&marker_path)? {
            Some(bytes) => {
                Some(
                    serde_json::from_slice::<Marker>(&bytes).map_err(|e| Error::State {
                        path: marker_path.clone(),
                        reason: format!(
                            "unreadable ({e}); restore it from a backup, never delete it"
                        ),
                    })?,
                )
            }
            None => None,
        };
        let (files, mut volumes) = RecordFiles::open::<VolumeRecord>(&dir.join(RECORDS_DIR))?;
        match marker {
            // The whole-file format: its records move to their own files, then the file
            // becomes the marker (a crash between the two repeats the move).
            Some(m) if m.version == LEGACY_VERSION => {
                let mut moved = m.volumes;
                moved.values_mut().for_each(|r| {
                    r.migrate();
                });
                files.write_all(&moved)?;
                volumes.extend(moved);
                write_marker(&marker_path)?;
            }
            // The marker first: from then on no older driver reads the records; a crash
            // before every record is rewritten migrates the rest at the next start.
            Some(m)
                if m.version == PARAMETER_SOURCE_VERSION
                    || m.version == DATASET_PARAMETER_VERSION =>
            {
                write_marker(&marker_path)?;
                migrate_all(&files, &mut volumes)?;
            }
            Some(m) if m.version == VERSION => migrate_all(&files, &mut volumes)?,
            Some(m) => {
                return Err(Error::State {
                    path: marker_path,
                    reason: format!(
                        "version {} is not {VERSION}: written by a newer gds-csi",
                        m.version
                    ),
                })
            }
            None => write_marker(&marker_path)?,
        }
        let state = State {
            volumes: entries(volumes, &dir.join(RECORDS_DIR))?,
        };
        refuse_shared_devices(&state, &dir.join(RECORDS_DIR))?;
        Ok(StateStore {
            files,
            state: Mutex::new(Arc::new(state)),
            writer: Mutex::new(()),
        })
    }

    /// The directory of the records (one file each).
    pub fn records_dir(&self) -> &Path {
        self.files.dir()
    }

    /// The state now; later updates do not change it.
    pub fn snapshot(&self) -> Arc<State> {
        Arc::clone(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Applies `change` to a copy, persists the records it changed, and only then makes
    /// it current: memory never runs ahead of the disk.
    pub fn update<R>(&self, change: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
        let _one_writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot();
        let mut next = State::clone(&current);
        let out = change(&mut next)?;
        let changes = current.changes(&next);
        let changes: Vec<(&str, Option<&VolumeRecord>)> =
            changes.iter().map(|(id, r)| (id.as_str(), *r)).collect();
        self.files.write(&changes)?;
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        Ok(out)
    }
}

/// The records read, each with its id parsed: a record under a name that is no block
/// volume id of this driver (copied in by hand, or a foreign file) is refused, naming it.
fn entries(volumes: BTreeMap<String, VolumeRecord>, dir: &Path) -> Result<BTreeMap<String, Entry>> {
    volumes
        .into_iter()
        .map(|(text, record)| {
            let id = BlockVolumeId::parse(&text).ok_or_else(|| Error::State {
                path: dir.to_owned(),
                reason: format!(
                    "a record is kept under {text:?}, which is no block volume id of this \
                     driver; move it out of the state dir"
                ),
            })?;
            let record = Arc::new(record);
            Ok((text, Entry { id, record }))
        })
        .collect()
}

/// What a record holds of a device: all of it, or one partition (by PARTUUID, or not
/// carved yet).
#[derive(PartialEq, Eq)]
enum Claim<'a> {
    Whole,
    Partition(Option<&'a str>),
}

fn partuuid(p: &Option<PartitionRecord>) -> Option<&str> {
    p.as_ref().map(|p| p.partuuid.as_str())
}

/// A state in which two records hold one device (whole, or the same partition) is refused
/// at start-up, naming both: serving it would hand one device's data to two volumes (two
/// drivers once ran on one state dir, or a record was copied by hand).
fn refuse_shared_devices(state: &State, dir: &Path) -> Result<()> {
    let mut seen: BTreeMap<&str, Vec<(&str, Claim<'_>)>> = BTreeMap::new();
    for (id, entry) in &state.volumes {
        let r = &*entry.record;
        let mut claims = Vec::new();
        match entry.id.layout {
            IdLayout::Stripe => {
                let members = r.stripe.iter().flat_map(|s| &s.members);
                claims.extend(members.map(|m| {
                    (
                        m.device_id.as_str(),
                        Claim::Partition(partuuid(&m.partition)),
                    )
                }));
            }
            IdLayout::Partition => claims.push((
                r.device_id.as_str(),
                Claim::Partition(partuuid(&r.partition)),
            )),
            IdLayout::Device => claims.push((r.device_id.as_str(), Claim::Whole)),
        }
        for (device, claim) in claims {
            let on_device = seen.entry(device).or_default();
            let clash = on_device.iter().find(|(_, other)| {
                *other == Claim::Whole
                    || claim == Claim::Whole
                    || (claim == *other && claim != Claim::Partition(None))
            });
            if let Some((other, _)) = clash {
                return Err(Error::State {
                    path: dir.to_owned(),
                    reason: format!(
                        "records {other} and {id} both hold device {device}{}: one device's \
                         data would serve two volumes. Stop every driver on this state dir, \
                         find which volume owns the device (its PV, the data on it), and move \
                         the other record out of the state dir",
                        match claim {
                            Claim::Partition(Some(uuid)) => format!(" (partition {uuid})"),
                            _ => String::new(),
                        }
                    ),
                });
            }
            on_device.push((id, claim));
        }
    }
    Ok(())
}

/// Rewrites the records still in an older form.
fn migrate_all(files: &RecordFiles, volumes: &mut BTreeMap<String, VolumeRecord>) -> Result<()> {
    let changed: BTreeMap<String, VolumeRecord> = volumes
        .iter_mut()
        .filter_map(|(id, r)| r.migrate().then(|| (id.clone(), r.clone())))
        .collect();
    files.write_all(&changed)
}

fn write_marker(path: &Path) -> Result<()> {
    let marker = Marker {
        version: VERSION,
        volumes: BTreeMap::new(),
        records: Some(format!("{RECORDS_DIR}/")),
    };
    let bytes = serde_json::to_vec_pretty(&marker).map_err(|e| Error::State {
        path: path.to_owned(),
        reason: format!("cannot be serialised: {e}"),
    })?;
    crate::runtime::state_dir::write_atomic(path, &bytes).map_err(|e| Error::io("writing", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole-device volume's id text on device `dev-<n>`.
    fn key(n: &str) -> String {
        format!("blk:dev-{n}:a1b2c3d4:node-a")
    }

    /// A partition volume's id text on `dev-1` (any number of them share it).
    fn part_key(n: &str) -> String {
        format!("blk:dev-1:{n}:node-a:part")
    }

    fn vid(n: &str) -> BlockVolumeId {
        BlockVolumeId::parse(&key(n)).unwrap()
    }

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
            source: None,
        }
    }

    #[test]
    fn updates_survive_reopen_and_failed_updates_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        store
            .update(|s| {
                s.insert(&vid("v1"), record("a"));
                Ok(())
            })
            .unwrap();
        let failed: Result<()> = store.update(|s| {
            s.remove(&key("v1"));
            Err(Error::VolumeNotFound("x".into()))
        });
        assert!(failed.is_err());
        assert_eq!(store.snapshot().len(), 1);
        let reopened = StateStore::open(dir.path()).unwrap();
        assert_eq!(reopened.snapshot().get(&key("v1")), Some(&record("a")));
    }

    #[test]
    fn an_update_writes_only_the_records_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        store
            .update(|s| {
                for i in 0..300 {
                    s.insert(&vid(&format!("v{i}")), record(&format!("n{i}")));
                }
                Ok(())
            })
            .unwrap();
        let snap = store.snapshot();
        let untouched = store.snapshot();
        let mut next = State::clone(&snap);
        next.get_mut(&key("v7")).unwrap().formatted = true;
        next.get_mut(&key("v8")).unwrap().formatted = false; // no change
        next.remove(&key("v9"));
        next.insert(&vid("v300"), record("n300"));
        let changes = untouched.changes(&next);
        let ids: Vec<_> = changes
            .iter()
            .map(|(id, r)| (id.as_str(), r.is_some()))
            .collect();
        let want = [(key("v300"), true), (key("v7"), true), (key("v9"), false)];
        let want: Vec<_> = want.iter().map(|(k, c)| (k.as_str(), *c)).collect();
        assert_eq!(ids, want);
    }

    #[test]
    fn a_whole_file_state_moves_to_record_files_and_stays_refused_by_older_drivers() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = serde_json::to_value(record("a")).unwrap();
        rec.as_object_mut().unwrap().remove("device_identity");
        let volumes = serde_json::Map::from_iter([
            (part_key("v1"), rec),
            (part_key("v2"), serde_json::to_value(record("b")).unwrap()),
        ]);
        let old = serde_json::json!({"version": 1, "volumes": volumes});
        fs::write(dir.path().join(MARKER_FILE), old.to_string()).unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(
            store
                .snapshot()
                .get(&part_key("v1"))
                .unwrap()
                .device_identity,
            None
        );
        assert_eq!(store.snapshot().len(), 2);
        assert_eq!(fs::read_dir(store.records_dir()).unwrap().count(), 2);
        // An older driver reads `volumes.json` and refuses any version but 1.
        let marker: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(MARKER_FILE)).unwrap()).unwrap();
        assert_eq!(marker["version"], VERSION);
        assert_eq!(marker["volumes"], serde_json::json!({}));
        let again = StateStore::open(dir.path()).unwrap();
        assert_eq!(again.snapshot().get(&part_key("v2")), Some(&record("b")));
    }

    #[test]
    fn a_corrupt_or_newer_state_is_an_error_not_an_empty_pool() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(MARKER_FILE), b"{not json").unwrap();
        assert!(StateStore::open(dir.path()).is_err());
        fs::write(dir.path().join(MARKER_FILE), br#"{"version": 5}"#).unwrap();
        let err = StateStore::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("newer"), "{err}");
    }

    #[test]
    fn a_record_under_no_block_volume_id_is_refused_at_start_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        StateStore::open(dir.path()).unwrap();
        let (files, _) = RecordFiles::open::<VolumeRecord>(&dir.path().join(RECORDS_DIR)).unwrap();
        let foreign = BTreeMap::from([("nfs:x:y:z".to_owned(), record("a"))]);
        files.write_all(&foreign).unwrap();
        let err = StateStore::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("\"nfs:x:y:z\"") && err.contains("no block volume id"),
            "{err}"
        );
    }

    #[test]
    fn two_records_holding_one_device_are_refused_at_start_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let whole = |n: &str| format!("blk:dev-1:{n}:node-a");
        store
            .update(|s| {
                s.insert(
                    &BlockVolumeId::parse(&whole("aaaaaaaa")).unwrap(),
                    record("a"),
                );
                Ok(())
            })
            .unwrap();
        drop(store);
        StateStore::open(dir.path()).unwrap();
        // A second driver's allocation of the same device, as its record file.
        let (files, _) = RecordFiles::open::<VolumeRecord>(&dir.path().join(RECORDS_DIR)).unwrap();
        let second = BTreeMap::from([(whole("bbbbbbbb"), record("b"))]);
        files.write_all(&second).unwrap();
        let err = StateStore::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains(&whole("aaaaaaaa"))
                && err.contains(&whole("bbbbbbbb"))
                && err.contains("dev-1"),
            "{err}"
        );
    }

    #[test]
    fn a_version_2_state_gets_its_sources_typed_and_older_drivers_refuse_it_after() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = serde_json::json!({"version": 2, "records": "volumes/"});
        fs::write(dir.path().join(MARKER_FILE), v2.to_string()).unwrap();
        let mut clone = record("clone");
        clone
            .parameters
            .insert("cloneSource".into(), "blk:dev-a:1a2b3c4d:n1".into());
        clone
            .parameters
            .insert("cloneAccess".into(), "block".into());
        clone
            .parameters
            .insert("gdsPolicy".into(), "preferred".into());
        let (files, _) = RecordFiles::open::<VolumeRecord>(&dir.path().join(RECORDS_DIR)).unwrap();
        let plain = record("plain");
        let written = BTreeMap::from([(part_key("v1"), clone), (part_key("v2"), plain.clone())]);
        files.write_all(&written).unwrap();

        let store = StateStore::open(dir.path()).unwrap();
        let expect = |r: &VolumeRecord| {
            let s = r.source.as_ref().unwrap();
            assert!(s.raw_block && s.is_clone_of("blk:dev-a:1a2b3c4d:n1"));
            assert_eq!(r.parameters.len(), 1, "{:?}", r.parameters);
        };
        expect(store.snapshot().get(&part_key("v1")).unwrap());
        assert_eq!(store.snapshot().get(&part_key("v2")), Some(&plain));
        // On disk too, and the marker now says a version older drivers refuse.
        let (_, on_disk) =
            RecordFiles::open::<VolumeRecord>(&dir.path().join(RECORDS_DIR)).unwrap();
        expect(&on_disk[&part_key("v1")]);
        let marker: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(MARKER_FILE)).unwrap()).unwrap();
        assert_eq!(marker["version"], VERSION);
        expect(
            StateStore::open(dir.path())
                .unwrap()
                .snapshot()
                .get(&part_key("v1"))
                .unwrap(),
        );
    }
}
