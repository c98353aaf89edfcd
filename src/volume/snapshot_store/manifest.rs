//! A snapshot's manifest: what it holds and where it came from, written last into the
//! snapshot's directory (a temporary name, synced, renamed, the directory synced), so a
//! snapshot is ready exactly when its manifest exists and a half-written one never is.

use std::os::fd::AsFd;
use std::sync::OnceLock;

use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::csi::id::SnapshotId;
use crate::error::{Error, Result};
pub use crate::request::snapshot::Content;
use crate::volume::copy::base::{file_handle, Base, BaseFile, SourceStat};
use crate::volume::copy::walk::{Entry, Kind};

pub const FILE: &str = "manifest.json";
pub use crate::request::snapshot::{IMAGE, TREE};
/// The manifest format this driver writes.
pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub kind: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A file's source as the copy walked it: what a later snapshot compares with to link
    /// the file instead of copying it (`copy::base`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceStat>,
    /// A file's copy on the store: its inode (the one a later snapshot links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_ino: Option<u64>,
    /// Its file handle there (`copy::base::file_handle`): what tells that inode apart
    /// from a later one given the same number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_handle: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub snapshot_id: SnapshotId,
    pub name: String,
    pub source_volume_id: String,
    pub source_node: String,
    pub created_secs: i64,
    pub created_nanos: i32,
    pub content: Content,
    /// The source's filesystem (a block volume's), for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<String>,
    /// The source's capacity: the smallest volume the snapshot restores into.
    pub size_bytes: u64,
    /// Bytes the data takes (files: each inode once, at most its allocated blocks, so a
    /// hard link or a hole adds nothing; device: the image's non-zero bytes).
    pub data_bytes: u64,
    /// How long the source's filesystem was frozen for the last pass (a mounted volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_seconds: Option<f64>,
    /// The snapshot whose unchanged files this one links (an incremental snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_snapshot_id: Option<String>,
    /// Data bytes this snapshot wrote to the store (linked files wrote none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_bytes: Option<u64>,
    #[serde(default)]
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    /// The entries of a file tree (below its root), each file with its source's stat and
    /// its copy's inode, and its SHA-256 when `checksums`: read from the copy in `tree`, or
    /// carried over from `base` for a file linked from it (the same inode, so the same
    /// bytes; linked only when the delta rules found it unchanged). The copies are looked
    /// at on `streams`: on an NFS store each stat is a round trip.
    pub fn list(
        &mut self,
        entries: &[Entry],
        tree: &super::SnapshotDir,
        (checksums, base): (bool, Option<&Base>),
        streams: crate::volume::copy::Streams<'_>,
    ) -> Result<()> {
        let root = tree.dup()?;
        let shown = Path::new(tree.location());
        let files: Vec<(usize, &Entry)> = (entries.iter().enumerate().skip(1))
            .filter(|(_, e)| e.kind == Kind::File)
            .collect();
        let stored: Vec<OnceLock<Stored>> = entries.iter().map(|_| OnceLock::new()).collect();
        streams.each(&files, |&(i, e)| {
            let copy = Stored::of(root.as_fd(), shown, e, checksums, base)?;
            let _ = stored[i].set(copy);
            Ok(())
        })?;
        (self.data_bytes, self.written_bytes) = (0, Some(0));
        self.base_snapshot_id = base.map(|b| b.label.clone());
        let mut counted = std::collections::HashSet::new();
        self.entries = Vec::with_capacity(entries.len().saturating_sub(1));
        for (e, copy) in entries.iter().zip(stored).skip(1) {
            let mut entry = ManifestEntry {
                path: e.rel.to_string_lossy().into_owned(),
                kind: kind_name(e.kind).into(),
                size: e.size(),
                sha256: None,
                source: None,
                stored_ino: None,
                stored_handle: None,
            };
            if let Some(copy) = copy.into_inner() {
                if counted.insert((e.st.st_dev, e.st.st_ino)) {
                    let allocated = (e.st.st_blocks.max(0) as u64).saturating_mul(512);
                    self.data_bytes += e.size().min(allocated);
                    if !copy.from_base {
                        *self.written_bytes.get_or_insert(0) += e.size().min(allocated);
                    }
                }
                (entry.sha256, entry.source) = (copy.sha256, Some(SourceStat::of(&e.st)));
                (entry.stored_ino, entry.stored_handle) = (Some(copy.ino), copy.handle);
            }
            self.entries.push(entry);
        }
        Ok(())
    }

    /// Its files as a later snapshot's base: each recorded with its source's stat and its
    /// copy's inode and handle (a manifest written before those were recorded, or on a
    /// store whose filesystem gives no handles, gives none: they are copied).
    pub fn base_files(&self) -> std::collections::HashMap<std::path::PathBuf, BaseFile> {
        self.entries
            .iter()
            .filter(|e| e.kind == "file")
            .filter_map(|e| {
                let file = BaseFile {
                    source: e.source?,
                    stored_ino: e.stored_ino?,
                    stored_handle: e.stored_handle.clone()?,
                    sha256: e.sha256.clone(),
                };
                Some((std::path::PathBuf::from(&e.path), file))
            })
            .collect()
    }

    /// Each file's path and recorded SHA-256 (none unless taken with checksums).
    pub fn digests(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .filter(|e| e.kind == "file")
            .filter_map(|e| Some((e.path.clone(), e.sha256.clone()?)))
            .collect()
    }

    /// Written into `dir` atomically; from now on the snapshot is ready. Returns the
    /// SHA-256 of what was written: this node keeps it, to know the manifest again when it
    /// reads it back as a later snapshot's base.
    pub fn write(&self, dir: &super::SnapshotDir) -> Result<String> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::State {
            path: dir.shown(FILE).into(),
            reason: e.to_string(),
        })?;
        dir.write_atomic(FILE, &bytes)?;
        Ok(digest(&bytes))
    }
}

/// The SHA-256 of a manifest's bytes, as `write` answers it.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(bytes))
}

/// A file's copy on the store as the manifest records it.
struct Stored {
    ino: u64,
    handle: Option<String>,
    sha256: Option<String>,
    /// Linked from the base (its inode and handle are the base's copy's).
    from_base: bool,
}

impl Stored {
    fn of(
        root: std::os::fd::BorrowedFd<'_>,
        shown: &Path,
        e: &Entry,
        checksums: bool,
        base: Option<&Base>,
    ) -> Result<Stored> {
        let stored = fstatat(root, &e.rel, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|x| Error::io("stat", shown.join(&e.rel), x.into()))?;
        let handle = file_handle(root, &e.rel)
            .map_err(|x| Error::io("file handle of", shown.join(&e.rel), x.into()))?;
        let from_base = base
            .and_then(|b| b.files.get(&e.rel))
            .filter(|b| b.is_stored_as(stored.st_ino, handle.as_deref()));
        let sha256 = match from_base {
            Some(BaseFile {
                sha256: Some(d), ..
            }) if checksums => Some(d.clone()),
            _ if checksums => Some(
                crate::volume::copy::verify::sha256_beneath(root, &e.rel)
                    .map_err(|x| Error::io("checksum", shown.join(&e.rel), x.into()))?,
            ),
            _ => None,
        };
        Ok(Stored {
            ino: stored.st_ino,
            handle,
            sha256,
            from_base: from_base.is_some(),
        })
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Dir => "dir",
        Kind::File => "file",
        Kind::Symlink => "symlink",
        Kind::Special => "special",
    }
}
