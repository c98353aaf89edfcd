//! A map of records kept as one file per record under a directory, so a change costs
//! one small file whatever the number of records: `<dir>/<hash of the id>.json` holding
//! the id and the record, replaced atomically (write, fsync, rename, fsync the
//! directory). A change of several records at once goes through `<dir>/batch.json`
//! first, which a restart finishes, so a crash leaves all of them changed or none.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const BATCH: &str = "batch.json";
const SUFFIX: &str = ".json";
const TMP_SUFFIX: &str = ".json.tmp";

/// One record as it lies in its file.
#[derive(Serialize, Deserialize)]
struct Stored<V> {
    id: String,
    record: V,
}

/// Changes to apply together: `None` removes the record.
#[derive(Serialize, Deserialize)]
struct Batch<V> {
    changes: Vec<Stored<Option<V>>>,
}

#[derive(Debug)]
pub struct RecordFiles {
    dir: PathBuf,
}

impl RecordFiles {
    /// Opens (creating) `dir`, finishes a batch a crash left, and reads every record.
    /// A file that is not a record of this map (unreadable, or named for another id) is
    /// an error naming it: records are never skipped.
    pub fn open<V: DeserializeOwned + Serialize>(
        dir: &Path,
    ) -> Result<(RecordFiles, BTreeMap<String, V>)> {
        fs::create_dir_all(dir).map_err(|e| Error::io("creating state dir", dir, e))?;
        let files = RecordFiles {
            dir: dir.to_owned(),
        };
        let batch = dir.join(BATCH);
        if let Some(bytes) = super::read_regular(&batch)? {
            let pending: Batch<V> = files.parse(&batch, &bytes)?;
            files.apply(&pending.changes)?;
            fs::remove_file(&batch).map_err(|e| Error::io("removing", &batch, e))?;
            files.sync_dir()?;
        }
        let mut records = BTreeMap::new();
        let entries = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let path = entry.path();
            if name.ends_with(TMP_SUFFIX) {
                // A write a crash cut short: its rename never happened.
                fs::remove_file(&path).map_err(|e| Error::io("removing", &path, e))?;
                continue;
            }
            let Some(stem) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            if name == BATCH {
                continue;
            }
            let Some(bytes) = super::read_regular(&path)? else {
                continue;
            };
            let stored: Stored<V> = files.parse(&path, &bytes)?;
            if file_stem(&stored.id) != stem {
                return Err(Error::State {
                    path,
                    reason: format!(
                        "holds the record of {:?}, whose file is {}{SUFFIX}; move it back",
                        stored.id,
                        file_stem(&stored.id)
                    ),
                });
            }
            records.insert(stored.id, stored.record);
        }
        Ok((files, records))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `id`'s record.
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{}{SUFFIX}", file_stem(id)))
    }

    /// Persists `changes` (`None` removes the record): one change replaces one file;
    /// several are written to the batch file first, so they land together.
    pub fn write<V: Serialize>(&self, changes: &[(&str, Option<&V>)]) -> Result<()> {
        match changes {
            [] => Ok(()),
            [(id, record)] => {
                self.apply_one(id, *record)?;
                self.sync_dir()
            }
            _ => {
                let batch = self.dir.join(BATCH);
                let stored: Vec<Stored<Option<&V>>> = changes
                    .iter()
                    .map(|(id, record)| Stored {
                        id: (*id).to_owned(),
                        record: *record,
                    })
                    .collect();
                let bytes = self.encode(&batch, &Batch { changes: stored })?;
                super::write_atomic(&batch, &bytes).map_err(|e| Error::io("writing", &batch, e))?;
                for (id, record) in changes {
                    self.apply_one(id, *record)?;
                }
                self.sync_dir()?;
                fs::remove_file(&batch).map_err(|e| Error::io("removing", &batch, e))?;
                self.sync_dir()
            }
        }
    }

    /// Persists every record of `records` together (a whole-file state moved here).
    pub fn write_all<V: Serialize>(&self, records: &BTreeMap<String, V>) -> Result<()> {
        let changes: Vec<(&str, Option<&V>)> = records
            .iter()
            .map(|(id, r)| (id.as_str(), Some(r)))
            .collect();
        self.write(&changes)
    }

    fn apply<V: Serialize>(&self, changes: &[Stored<Option<V>>]) -> Result<()> {
        for c in changes {
            self.apply_one(&c.id, c.record.as_ref())?;
        }
        Ok(())
    }

    /// Writes or removes one record's file; the directory is synced by the caller.
    fn apply_one<V: Serialize>(&self, id: &str, record: Option<&V>) -> Result<()> {
        let path = self.path_of(id);
        match record {
            Some(record) => {
                let stored = Stored {
                    id: id.to_owned(),
                    record,
                };
                let bytes = self.encode(&path, &stored)?;
                super::write_file_synced(&path, &bytes).map_err(|e| Error::io("writing", &path, e))
            }
            None => match fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io("removing", &path, e)),
            },
        }
    }

    fn sync_dir(&self) -> Result<()> {
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io("syncing", &self.dir, e))
    }

    fn encode<T: Serialize>(&self, path: &Path, value: &T) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(value).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: format!("cannot be serialised: {e}"),
        })
    }

    fn parse<T: DeserializeOwned>(&self, path: &Path, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: format!("unreadable ({e}); restore it from a backup, never delete it"),
        })
    }
}

/// A record's file name without the suffix: ids hold ':' and '/' and reach 128 bytes,
/// so the name is a hash (128 bits) and the id is inside the file.
fn file_stem(id: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(id.as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> (RecordFiles, BTreeMap<String, u32>) {
        RecordFiles::open(dir).unwrap()
    }

    #[test]
    fn one_change_writes_one_file_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (files, none) = open(dir.path());
        assert!(none.is_empty());
        for i in 0..50u32 {
            files.write(&[(&format!("nfs:a/b:{i}"), Some(&i))]).unwrap();
        }
        let before: BTreeMap<_, _> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().modified().unwrap())
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        files.write(&[("nfs:a/b:7", Some(&700u32))]).unwrap();
        let changed: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                before.get(&e.file_name()) != Some(&e.metadata().unwrap().modified().unwrap())
            })
            .map(|e| e.path())
            .collect();
        assert_eq!(changed, vec![files.path_of("nfs:a/b:7")]);
        files.write::<u32>(&[("nfs:a/b:3", None)]).unwrap();
        let (_, back) = open(dir.path());
        assert_eq!(back.len(), 49);
        assert_eq!(back["nfs:a/b:7"], 700);
        assert!(!back.contains_key("nfs:a/b:3"));
    }

    #[test]
    fn a_batch_left_by_a_crash_is_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = open(dir.path());
        files.write(&[("gone", Some(&1u32))]).unwrap();
        // What a crash after the batch's rename and before its changes leaves.
        let batch = Batch {
            changes: vec![
                Stored {
                    id: "a".to_owned(),
                    record: Some(1u32),
                },
                Stored {
                    id: "gone".to_owned(),
                    record: None,
                },
            ],
        };
        fs::write(dir.path().join(BATCH), serde_json::to_vec(&batch).unwrap()).unwrap();
        fs::write(dir.path().join(format!("x{TMP_SUFFIX}")), b"{torn").unwrap();
        let (_, back) = open(dir.path());
        assert_eq!(back, BTreeMap::from([("a".to_owned(), 1u32)]));
        assert!(!dir.path().join(BATCH).exists());
        assert!(!dir.path().join(format!("x{TMP_SUFFIX}")).exists());
    }

    #[test]
    fn several_changes_land_together() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = open(dir.path());
        files
            .write(&[("a", Some(&1u32)), ("b", Some(&2u32))])
            .unwrap();
        files
            .write::<u32>(&[("a", None), ("b", Some(&3u32))])
            .unwrap();
        assert!(!dir.path().join(BATCH).exists());
        let (_, back) = open(dir.path());
        assert_eq!(back, BTreeMap::from([("b".to_owned(), 3u32)]));
    }

    #[test]
    fn a_misplaced_or_corrupt_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = open(dir.path());
        files.write(&[("a", Some(&1u32))]).unwrap();
        let wrong = dir.path().join(format!("{}{SUFFIX}", file_stem("b")));
        fs::rename(files.path_of("a"), &wrong).unwrap();
        let err = RecordFiles::open::<u32>(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&wrong.display().to_string()) && err.contains("\"a\""),
            "{err}"
        );
        fs::write(&wrong, b"{not json").unwrap();
        let err = RecordFiles::open::<u32>(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unreadable"), "{err}");
    }
}
