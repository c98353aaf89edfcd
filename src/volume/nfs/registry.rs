//! The NFS volumes this controller created: one file each under
//! `<state-dir>/nfs-volumes/` (`state_dir::RecordFiles`), so a change costs the same at 10
//! volumes as at 10,000. It serves ListVolumes and the "same name, different request"
//! check of CreateVolume only: the volume id alone is enough to mount, find and delete
//! a volume, so losing it (a scratch state dir) loses no volume.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pool::SourceOf;
use crate::runtime::state_dir::RecordFiles;

/// Where the records were kept in one file; moved to their own files at start-up and
/// then removed (what it held can always be found again from the ids).
const WHOLE_FILE: &str = "nfs-volumes.json";
const RECORDS_DIR: &str = "nfs-volumes";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsRecord {
    pub name: String,
    /// What CreateVolume asked for (`required_bytes`); not enforced on the server.
    pub capacity_bytes: u64,
    pub parameters: BTreeMap<String, String>,
    /// The volume this one is a clone of, or the snapshot it is restored from. Older
    /// records kept the id alone, as `clone_source`.
    #[serde(
        default,
        alias = "clone_source",
        deserialize_with = "SourceOf::deserialize_either",
        skip_serializing_if = "Option::is_none"
    )]
    pub source: Option<SourceOf>,
    /// A clone whose copy has not completed and been verified yet: never answered as a
    /// volume, left out of ListVolumes; DeleteVolume removes its directory whatever
    /// `onDelete` says (a half copy holds no one's data).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub filling: bool,
}

/// The single-file format the records are moved out of.
#[derive(Debug, Default, Deserialize)]
struct WholeFile {
    volumes: BTreeMap<String, NfsRecord>,
}

#[derive(Default)]
struct Volumes {
    by_id: BTreeMap<String, NfsRecord>,
    /// Volume name to id: CreateVolume's lookup by name without a scan.
    by_name: HashMap<String, String>,
}

pub struct Registry {
    files: RecordFiles,
    /// Held to read or swap in memory, never across a write to disk.
    volumes: Mutex<Volumes>,
    /// Changes one at a time, each on disk before memory.
    writer: Mutex<()>,
}

impl Registry {
    pub fn open(dir: &Path) -> Result<Self> {
        let (files, mut by_id) = RecordFiles::open::<NfsRecord>(&dir.join(RECORDS_DIR))?;
        let whole = dir.join(WHOLE_FILE);
        if let Some(bytes) = crate::runtime::state_dir::read_regular(&whole)? {
            let old: WholeFile = serde_json::from_slice(&bytes).map_err(|e| Error::State {
                path: whole.clone(),
                reason: format!("unreadable ({e})"),
            })?;
            files.write_all(&old.volumes)?;
            std::fs::remove_file(&whole).map_err(|e| Error::io("removing", &whole, e))?;
            by_id.extend(old.volumes);
        }
        let by_name = by_id
            .iter()
            .map(|(id, r)| (r.name.clone(), id.clone()))
            .collect();
        Ok(Registry {
            files,
            volumes: Mutex::new(Volumes { by_id, by_name }),
            writer: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Volumes> {
        self.volumes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Up to `limit` records whose ids sort after `after`, in id order, among those
    /// `keep` keeps: a page of the registry without copying the rest.
    pub fn page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&NfsRecord) -> bool,
    ) -> Vec<(String, NfsRecord)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, |a| Excluded(a.to_owned()));
        self.lock()
            .by_id
            .range::<String, _>((from, Unbounded))
            .filter(|(_, rec)| keep(rec))
            .take(limit)
            .map(|(id, rec)| (id.clone(), rec.clone()))
            .collect()
    }

    /// The ids of the records `keep` keeps.
    pub fn ids_where(&self, keep: impl Fn(&NfsRecord) -> bool) -> Vec<String> {
        self.lock()
            .by_id
            .iter()
            .filter(|(_, r)| keep(r))
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn get(&self, id: &str) -> Option<NfsRecord> {
        self.lock().by_id.get(id).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<(String, NfsRecord)> {
        let volumes = self.lock();
        let id = volumes.by_name.get(name)?;
        Some((id.clone(), volumes.by_id.get(id)?.clone()))
    }

    /// Records `rec` as `id`'s, on disk first.
    pub fn put(&self, id: &str, rec: &NfsRecord) -> Result<()> {
        let _one_writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.put_written(id, rec)
    }

    /// Changes `id`'s record, if there is one (`false` if not), on disk first; a record
    /// removed meanwhile is not brought back (changes take turns).
    pub fn modify(&self, id: &str, change: impl FnOnce(&mut NfsRecord)) -> Result<bool> {
        let _one_writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut rec) = self.get(id) else {
            return Ok(false);
        };
        change(&mut rec);
        self.put_written(id, &rec)?;
        Ok(true)
    }

    pub fn remove(&self, id: &str) -> Result<()> {
        let _one_writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let Some(old) = self.get(id) else {
            return Ok(());
        };
        self.files.write::<NfsRecord>(&[(id, None)])?;
        let mut volumes = self.lock();
        volumes.by_id.remove(id);
        if volumes.by_name.get(&old.name).is_some_and(|n| n == id) {
            volumes.by_name.remove(&old.name);
        }
        Ok(())
    }

    /// The write of [`put`](Self::put); the caller holds `writer`.
    fn put_written(&self, id: &str, rec: &NfsRecord) -> Result<()> {
        if self.get(id).as_ref() == Some(rec) {
            return Ok(());
        }
        self.files.write(&[(id, Some(rec))])?;
        let mut volumes = self.lock();
        if let Some(old) = volumes.by_id.insert(id.to_owned(), rec.clone()) {
            if old.name != rec.name {
                volumes.by_name.remove(&old.name);
            }
        }
        volumes.by_name.insert(rec.name.clone(), id.to_owned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::open(dir.path()).unwrap();
        let rec = NfsRecord {
            name: "v".into(),
            capacity_bytes: 5,
            parameters: BTreeMap::new(),
            source: None,
            filling: false,
        };
        r.put("nfs:x", &rec).unwrap();
        let again = Registry::open(dir.path()).unwrap();
        assert_eq!(again.by_name("v"), Some(("nfs:x".into(), rec)));
    }

    #[test]
    fn a_whole_file_registry_moves_to_record_files() {
        let dir = tempfile::tempdir().unwrap();
        let old = serde_json::json!({"volumes": {"nfs:a": {"name": "a", "capacity_bytes": 1,
            "parameters": {}}}});
        std::fs::write(dir.path().join(WHOLE_FILE), old.to_string()).unwrap();
        let r = Registry::open(dir.path()).unwrap();
        assert_eq!(r.by_name("a").unwrap().0, "nfs:a");
        assert!(!dir.path().join(WHOLE_FILE).exists());
        r.remove("nfs:a").unwrap();
        assert_eq!(r.by_name("a"), None);
        assert!(Registry::open(dir.path()).unwrap().get("nfs:a").is_none());
    }
}
