//! The compat-mode marks: why a `preferred` volume was published without true GDS, which
//! NodeGetVolumeStats reports as an abnormal volume condition. They are kept in
//! `<state-dir>/gds-compat.json`, replaced atomically, so a restarted driver still reports
//! them (docs/design.md: nothing needed lives only in memory); memory follows the disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `<state-dir>/gds-compat.json`.
pub const FILE_NAME: &str = "gds-compat.json";
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct File {
    version: u32,
    /// Volume id -> why it is in compat mode.
    volumes: BTreeMap<String, String>,
}

pub struct CompatMarks {
    /// None: kept in memory only (tests and benches that construct a gate without a state
    /// dir).
    path: Option<PathBuf>,
    marks: Mutex<BTreeMap<String, String>>,
}

impl CompatMarks {
    pub fn in_memory() -> Self {
        CompatMarks {
            path: None,
            marks: Mutex::default(),
        }
    }

    /// Loads the marks kept in `dir` (none when the file does not exist yet).
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating state dir", dir, e))?;
        Ok(CompatMarks {
            marks: Mutex::new(read(dir)?),
            path: Some(dir.join(FILE_NAME)),
        })
    }

    pub fn get(&self, volume_id: &str) -> Option<String> {
        self.lock().get(volume_id).cloned()
    }

    /// How many volumes carry a mark now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Marks `volume_id` as published in compat mode, for `why`.
    pub fn set(&self, volume_id: &str, why: &str) -> Result<()> {
        self.change(|m| {
            m.insert(volume_id.to_owned(), why.to_owned());
        })
    }

    /// Clears the mark of `volume_id`, if it has one.
    pub fn clear(&self, volume_id: &str) -> Result<()> {
        self.change(|m| {
            m.remove(volume_id);
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` to a copy, writes it when it differs, then makes it current.
    fn change(&self, change: impl FnOnce(&mut BTreeMap<String, String>)) -> Result<()> {
        let mut current = self.lock();
        let mut next = current.clone();
        change(&mut next);
        if next == *current {
            return Ok(());
        }
        if let Some(path) = &self.path {
            let file = File {
                version: VERSION,
                volumes: next,
            };
            let bytes = serde_json::to_vec_pretty(&file).map_err(|e| Error::State {
                path: path.clone(),
                reason: format!("cannot encode the compat marks: {e}"),
            })?;
            crate::runtime::state_dir::write_atomic(path, &bytes)
                .map_err(|e| Error::io("writing", path, e))?;
            next = file.volumes;
        }
        *current = next;
        Ok(())
    }
}

/// The marks kept in `dir`, read only (`gds-csi doctor --pod`): volume id -> why it was
/// published in compat mode; none when the file does not exist.
pub fn read(dir: &Path) -> Result<BTreeMap<String, String>> {
    let path = dir.join(FILE_NAME);
    match crate::runtime::state_dir::read_regular(&path)? {
        None => Ok(BTreeMap::new()),
        Some(bytes) => parse(&path, &bytes),
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<BTreeMap<String, String>> {
    let unreadable = |reason: String| Error::State {
        path: path.to_owned(),
        // Marks are set again by each publish: losing them only hides compat mode from
        // NodeGetVolumeStats until the volume's next publish.
        reason: format!(
            "{reason}; move it away to start without compat marks (each volume's next publish \
             sets its mark again)"
        ),
    };
    let file: File =
        serde_json::from_slice(bytes).map_err(|e| unreadable(format!("unreadable ({e})")))?;
    if file.version != VERSION {
        return Err(unreadable(format!(
            "version {} is not {VERSION}",
            file.version
        )));
    }
    Ok(file.volumes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_reopen_and_clearing_is_persisted() {
        let dir = tempfile::tempdir().unwrap();
        let m = CompatMarks::open(dir.path()).unwrap();
        m.set("vol-a", "compat: nvme not registered").unwrap();
        m.set("vol-b", "compat: no udev").unwrap();
        drop(m);
        let m = CompatMarks::open(dir.path()).unwrap();
        assert_eq!(
            m.get("vol-a").as_deref(),
            Some("compat: nvme not registered")
        );
        m.clear("vol-a").unwrap();
        m.clear("vol-missing").unwrap();
        drop(m);
        let m = CompatMarks::open(dir.path()).unwrap();
        assert_eq!(m.get("vol-a"), None);
        assert_eq!(m.get("vol-b").as_deref(), Some("compat: no udev"));
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        for text in ["{not json", r#"{"version":9,"volumes":{}}"#] {
            std::fs::write(&path, text).unwrap();
            let Err(err) = CompatMarks::open(dir.path()) else {
                panic!("{text} must not load")
            };
            let msg = err.to_string();
            assert!(msg.contains(FILE_NAME), "{msg}");
            assert!(msg.contains("move it away"), "{msg}");
        }
    }

    #[test]
    fn a_failed_write_leaves_memory_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let m = CompatMarks::open(dir.path()).unwrap();
        m.set("vol-a", "why").unwrap();
        // The temporary file's name taken by a directory: the atomic write fails.
        let tmp = dir.path().join(format!("{FILE_NAME}.tmp"));
        std::fs::create_dir(&tmp).unwrap();
        assert!(m.set("vol-b", "why").is_err());
        assert!(m.clear("vol-a").is_err());
        assert_eq!(m.get("vol-b"), None);
        assert_eq!(m.get("vol-a").as_deref(), Some("why"));
    }
}
