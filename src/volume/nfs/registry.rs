//! The NFS volumes this controller created: `<state-dir>/nfs-volumes.json`, replaced
//! atomically like the block state file. It serves ListVolumes and the "same name,
//! different request" check of CreateVolume only: the volume id alone is enough to
//! mount, find and delete a volume, so losing this file (a scratch state dir) loses
//! no volume.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const FILE_NAME: &str = "nfs-volumes.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsRecord {
    pub name: String,
    /// What CreateVolume asked for (`required_bytes`); not enforced on the server.
    pub capacity_bytes: u64,
    pub parameters: BTreeMap<String, String>,
    /// The volume this one is a clone of (`volume_content_source.volume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_source: Option<String>,
    /// A clone whose copy has not completed and been verified yet: never answered as a
    /// volume, left out of ListVolumes; DeleteVolume removes its directory whatever
    /// `onDelete` says (a half copy holds no one's data).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub filling: bool,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct File {
    volumes: BTreeMap<String, NfsRecord>,
}

pub struct Registry {
    path: PathBuf,
    volumes: Mutex<BTreeMap<String, NfsRecord>>,
}

impl Registry {
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io("creating state dir", dir, e))?;
        let path = dir.join(FILE_NAME);
        let volumes = match crate::state_dir::read_regular(&path)? {
            Some(bytes) => {
                serde_json::from_slice::<File>(&bytes)
                    .map_err(|e| Error::State {
                        path: path.clone(),
                        reason: format!("unreadable ({e})"),
                    })?
                    .volumes
            }
            None => BTreeMap::new(),
        };
        Ok(Registry {
            path,
            volumes: Mutex::new(volumes),
        })
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
        let volumes = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        volumes
            .range::<String, _>((from, Unbounded))
            .filter(|(_, rec)| keep(rec))
            .take(limit)
            .map(|(id, rec)| (id.clone(), rec.clone()))
            .collect()
    }

    pub fn snapshot(&self) -> BTreeMap<String, NfsRecord> {
        self.volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn get(&self, id: &str) -> Option<NfsRecord> {
        self.volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<(String, NfsRecord)> {
        self.volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, r)| r.name == name)
            .map(|(id, r)| (id.clone(), r.clone()))
    }

    /// Applies `change` to a copy, persists it, then makes it current.
    pub fn update(&self, change: impl FnOnce(&mut BTreeMap<String, NfsRecord>)) -> Result<()> {
        let mut current = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = current.clone();
        change(&mut next);
        if next == *current {
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(&File {
            volumes: next.clone(),
        })
        .map_err(|e| Error::State {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        crate::state_dir::write_atomic(&self.path, &bytes)
            .map_err(|e| Error::io("writing", &self.path, e))?;
        *current = next;
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
            clone_source: None,
            filling: false,
        };
        r.update(|m| {
            m.insert("nfs:x".into(), rec.clone());
        })
        .unwrap();
        let again = Registry::open(dir.path()).unwrap();
        assert_eq!(again.by_name("v"), Some(("nfs:x".into(), rec)));
    }
}
