//! A snapshot's manifest: what it holds and where it came from, written last into the
//! snapshot's directory (a temporary name, synced, renamed, the directory synced), so a
//! snapshot is ready exactly when its manifest exists and a half-written one never is.

use std::os::fd::{AsFd, BorrowedFd};
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
    /// A file with holes: where it holds data, `[start, end)`, as its source said when
    /// nothing could change it (an unmounted volume). A restore reads only these, since a
    /// store that cannot tell its holes (NFS before v4.2) reads them as zeros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Vec<[u64; 2]>>,
}

/// The most data extents a manifest records for one file; a file with more is read whole.
pub const MAX_EXTENTS: usize = 1024;

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
    /// `source`: the source's root when nothing can have changed it since the copy: its
    /// files with holes get their data extents.
    pub fn list(
        &mut self,
        entries: &[Entry],
        tree: &super::SnapshotDir,
        (checksums, base): (bool, Option<&Base>),
        source: Option<BorrowedFd<'_>>,
        streams: crate::volume::copy::Streams<'_>,
    ) -> Result<()> {
        let root = tree.dup()?;
        let shown = Path::new(tree.location());
        let files: Vec<(usize, &Entry)> = (entries.iter().enumerate().skip(1))
            .filter(|(_, e)| e.kind == Kind::File)
            .collect();
        let stored: Vec<OnceLock<Stored>> = entries.iter().map(|_| OnceLock::new()).collect();
        streams.each(&files, |&(i, e)| {
            let mut copy = Stored::of(root.as_fd(), shown, e, checksums, base)?;
            if let Some(src) = source.filter(|_| e.has_holes()) {
                copy.data = data_extents(src, e)
                    .map_err(|x| Error::io("seek", shown.join(&e.rel), x.into()))?;
            }
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
                data: None,
            };
            if let Some(copy) = copy.into_inner() {
                if counted.insert((e.st.st_dev, e.st.st_ino)) {
                    self.data_bytes += e.size().min(e.allocated());
                    if !copy.from_base {
                        *self.written_bytes.get_or_insert(0) += e.size().min(e.allocated());
                    }
                }
                (entry.sha256, entry.source) = (copy.sha256, Some(SourceStat::of(&e.st)));
                (entry.stored_ino, entry.stored_handle) = (Some(copy.ino), copy.handle);
                entry.data = copy.data;
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

    /// The data extents its files with holes recorded, for a restore to read only those
    /// (`copy::data::Extents`). The manifest is read from the store, where anyone with
    /// write access may have changed it: a file's extents count only when they lie within
    /// its recorded size, ascending and apart, and when the walk of the store finds the
    /// file at that size (`Extents` keys the paths; the copy checks the size).
    pub fn extents(&self) -> crate::volume::copy::data::Extents {
        self.entries
            .iter()
            .filter(|e| e.kind == "file")
            .filter_map(|e| {
                let data = e.data.as_ref()?;
                let ordered = data.len() <= MAX_EXTENTS
                    && data.iter().all(|&[a, b]| a < b && b <= e.size)
                    && data.windows(2).all(|w| w[0][1] <= w[1][0]);
                let known = data.iter().map(|&[a, b]| (a, b)).collect();
                ordered.then(|| (std::path::PathBuf::from(&e.path), (e.size, known)))
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
    /// Its source's data extents (`ManifestEntry::data`).
    data: Option<Vec<[u64; 2]>>,
}

/// The data extents of `e`'s source below `src` (as the copy found them,
/// `copy::data::next_data`); None past `MAX_EXTENTS`.
fn data_extents(src: BorrowedFd<'_>, e: &Entry) -> nix::Result<Option<Vec<[u64; 2]>>> {
    let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_NOFOLLOW;
    let fd =
        crate::volume::copy::walk::open_beneath(src, &e.rel, flags, nix::sys::stat::Mode::empty())?;
    let (size, mut at, mut out) = (e.size(), 0u64, Vec::new());
    while let Some((data, hole)) = crate::volume::copy::data::next_data(fd.as_fd(), at, size)? {
        if out.len() == MAX_EXTENTS {
            return Ok(None);
        }
        out.push([data, hole]);
        at = hole;
    }
    Ok(Some(out))
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
            data: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64, data: Option<Vec<[u64; 2]>>) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind: "file".into(),
            size,
            sha256: None,
            source: None,
            stored_ino: None,
            stored_handle: None,
            data,
        }
    }

    #[test]
    fn only_extents_within_the_size_ascending_and_apart_are_taken() {
        let mut m: Manifest = serde_json::from_str(
            r#"{"format":1,"snapshot_id":"snap:dir:~var~lib~snaps:snap-1","name":"s","source_volume_id":"v",
                "source_node":"n","created_secs":0,"created_nanos":0,"content":"files",
                "size_bytes":0,"data_bytes":0}"#,
        )
        .unwrap();
        let many: Vec<[u64; 2]> = (0..=MAX_EXTENTS as u64)
            .map(|i| [2 * i, 2 * i + 1])
            .collect();
        m.entries = vec![
            file("good", 100, Some(vec![[0, 10], [10, 20], [50, 100]])),
            file("dense", 100, None),
            file("past-the-end", 100, Some(vec![[0, 10], [90, 101]])),
            file("overlapping", 100, Some(vec![[0, 10], [5, 20]])),
            file("descending", 100, Some(vec![[50, 60], [0, 10]])),
            file("empty-extent", 100, Some(vec![[10, 10]])),
            file("too-many", 1 << 20, Some(many)),
            ManifestEntry {
                kind: "dir".into(),
                ..file("a-dir", 0, Some(vec![[0, 1]]))
            },
        ];
        let x = m.extents();
        assert_eq!(x.len(), 1, "{:?}", x.keys());
        assert_eq!(
            x[std::path::Path::new("good")],
            (100, vec![(0, 10), (10, 20), (50, 100)])
        );
        // Written and read back: a manifest without extents reads as none.
        let text = serde_json::to_string(&m).unwrap();
        let back: Manifest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.entries, m.entries);
        assert!(!text.contains(r#""data":null"#));
    }
}
