//! Snapshot ids. A snapshot is a directory on a store that any node can reach: an NFS
//! export or a directory every node sees. Its id carries the store and the directory, so a
//! node that never saw the snapshot restores from it, and a restarted driver finds it,
//! without any other state: `snap:nfs:r-<proto>-<port>-<vers>:<share>:<storePath>~<dir>:<server>`
//! (an NFS directory id, see `nfs`) or `snap:dir:<storeDir>:<dir>`, each `/` written `~`.

use std::fmt;
use std::path::{Path, PathBuf};

use super::nfs::{path_component_ok, NfsVolumeId, OnDelete};
use crate::error::{Error, Result};

const PREFIX: &str = "snap";

/// Where snapshots are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// A directory on the node (absolute); every node that restores must see the same.
    Dir(PathBuf),
    /// A directory on an NFS export (`dir` the store path below the share, maybe empty).
    Nfs(NfsVolumeId),
}

/// A snapshot: its store and its directory's name there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotId {
    pub store: Store,
    pub dir: String,
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.store {
            Store::Dir(path) => {
                let path = path.to_string_lossy().replace('/', "~");
                write!(f, "{PREFIX}:dir:{path}:{}", self.dir)
            }
            Store::Nfs(store) => {
                let id = self.dir_on(store, "");
                write!(f, "{PREFIX}:{id}")
            }
        }
    }
}

impl SnapshotId {
    /// None when `text` is no snapshot id of this driver, as it writes them (one spelling
    /// per snapshot: `a/b` for `a~b` is none).
    pub fn parse(text: &str) -> Option<SnapshotId> {
        Self::parse_any(text).filter(|id| id.to_string() == text)
    }

    fn parse_any(text: &str) -> Option<SnapshotId> {
        let rest = text.strip_prefix(PREFIX)?.strip_prefix(':')?;
        if let Some(dir_form) = rest.strip_prefix("dir:") {
            let (path, dir) = dir_form.rsplit_once(':')?;
            let path = PathBuf::from(path.replace('~', "/"));
            check_store_dir(&path).ok()?;
            dir_name_ok(dir).then_some(())?;
            return Some(SnapshotId {
                store: Store::Dir(path),
                dir: dir.to_owned(),
            });
        }
        let id = NfsVolumeId::parse(rest)?;
        if id.on_delete != OnDelete::Retain {
            return None;
        }
        let (base, dir) = match id.dir.rsplit_once('/') {
            Some((base, dir)) => (base.to_owned(), dir.to_owned()),
            None => (String::new(), id.dir.clone()),
        };
        dir_name_ok(&dir).then_some(())?;
        Some(SnapshotId {
            store: Store::Nfs(NfsVolumeId { dir: base, ..id }),
            dir,
        })
    }

    /// `sub` below the snapshot's directory (`""`: the directory itself), as an NFS
    /// directory id; None for a directory store.
    pub fn nfs_dir(&self, sub: &str) -> Option<NfsVolumeId> {
        match &self.store {
            Store::Nfs(store) => Some(self.dir_on(store, sub)),
            Store::Dir(_) => None,
        }
    }

    /// `sub` below the snapshot's directory on the NFS store `store`.
    fn dir_on(&self, store: &NfsVolumeId, sub: &str) -> NfsVolumeId {
        let dir = [store.dir.as_str(), self.dir.as_str(), sub]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        NfsVolumeId {
            dir,
            ..store.clone()
        }
    }

    /// The snapshot's directory on a directory store; None for an NFS store.
    pub fn local_dir(&self) -> Option<PathBuf> {
        match &self.store {
            Store::Dir(path) => Some(path.join(&self.dir)),
            Store::Nfs(_) => None,
        }
    }

    /// Where the snapshot is, for messages: `server:/share/path/dir` or a local path.
    pub fn location(&self) -> String {
        match &self.store {
            Store::Nfs(store) => self.dir_on(store, "").source(),
            Store::Dir(path) => path.join(&self.dir).display().to_string(),
        }
    }

    /// The store itself, for messages.
    pub fn store_location(&self) -> String {
        match &self.store {
            Store::Dir(path) => path.display().to_string(),
            Store::Nfs(id) if id.dir.is_empty() => id.export_source(),
            Store::Nfs(id) => id.source(),
        }
    }
}

/// Kept in records as the id's text; a record whose id does not read back is refused.
impl serde::Serialize for SnapshotId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for SnapshotId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        SnapshotId::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is no snapshot id of this driver"))
        })
    }
}

/// A snapshot id a call names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotRef {
    /// In this driver's form: it says where the snapshot is.
    Ours(SnapshotId),
    /// No id this driver issues: there is no such snapshot.
    Foreign(String),
}

impl SnapshotRef {
    /// What `text` names (the CO's `snapshot_id`); InvalidArgument naming `field` when empty.
    pub fn parse(field: &'static str, text: &str) -> Result<SnapshotRef> {
        if text.is_empty() {
            return Err(Error::invalid(field, "required"));
        }
        Ok(match SnapshotId::parse(text) {
            Some(id) => SnapshotRef::Ours(id),
            None => SnapshotRef::Foreign(text.to_owned()),
        })
    }

    /// ListSnapshots' `snapshot_id` filter: none when empty.
    pub fn filter(text: &str) -> Option<SnapshotRef> {
        Self::parse("snapshot_id", text).ok()
    }

    pub fn ours(&self) -> Option<&SnapshotId> {
        match self {
            SnapshotRef::Ours(id) => Some(id),
            SnapshotRef::Foreign(_) => None,
        }
    }
}

impl fmt::Display for SnapshotRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotRef::Ours(id) => id.fmt(f),
            SnapshotRef::Foreign(text) => f.write_str(text),
        }
    }
}

pub(crate) fn check_store_dir(path: &Path) -> std::result::Result<(), String> {
    let text = path.to_string_lossy();
    let ok = text.starts_with('/')
        && text.len() > 1
        && text.len() <= 96
        && text[1..].split('/').all(path_component_ok);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} must be an absolute directory of at most 96 bytes, components of \
             letters, digits, '-', '.', '_', '+' or '@' (no '..', no empty components)"
        ))
    }
}

pub(crate) fn dir_name_ok(dir: &str) -> bool {
    path_component_ok(dir) && !dir.starts_with('.')
}
