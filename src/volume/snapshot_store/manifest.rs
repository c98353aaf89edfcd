//! A snapshot's manifest: what it holds and where it came from, written last into the
//! snapshot's directory (a temporary name, synced, renamed, the directory synced), so a
//! snapshot is ready exactly when its manifest exists and a half-written one never is.

use std::os::fd::AsFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::request::snapshot::Content;
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub snapshot_id: String,
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
    #[serde(default)]
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    /// The entries of a file tree (below its root), with each file's SHA-256 read from
    /// the copy in `tree` when `checksums`.
    pub fn list(
        &mut self,
        entries: &[Entry],
        tree: &super::SnapshotDir,
        checksums: bool,
    ) -> Result<()> {
        let root = tree.dup()?;
        let tree = Path::new(tree.location());
        self.data_bytes = 0;
        let mut counted = std::collections::HashSet::new();
        self.entries = Vec::with_capacity(entries.len().saturating_sub(1));
        for e in entries.iter().skip(1) {
            let kind = match e.kind {
                Kind::Dir => "dir",
                Kind::File => "file",
                Kind::Symlink => "symlink",
                Kind::Special => "special",
            };
            let sha256 = if checksums && e.kind == Kind::File {
                Some(
                    crate::volume::copy::verify::sha256_beneath(root.as_fd(), &e.rel)
                        .map_err(|x| Error::io("checksum", tree.join(&e.rel), x.into()))?,
                )
            } else {
                None
            };
            if e.kind == Kind::File && counted.insert((e.st.st_dev, e.st.st_ino)) {
                let allocated = (e.st.st_blocks.max(0) as u64).saturating_mul(512);
                self.data_bytes += e.size().min(allocated);
            }
            self.entries.push(ManifestEntry {
                path: e.rel.to_string_lossy().into_owned(),
                kind: kind.into(),
                size: e.size(),
                sha256,
            });
        }
        Ok(())
    }

    /// Each file's path and recorded SHA-256 (none unless taken with checksums).
    pub fn digests(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .filter(|e| e.kind == "file")
            .filter_map(|e| Some((e.path.clone(), e.sha256.clone()?)))
            .collect()
    }

    /// Written into `dir` atomically; from now on the snapshot is ready.
    pub fn write(&self, dir: &super::SnapshotDir) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::State {
            path: dir.shown(FILE).into(),
            reason: e.to_string(),
        })?;
        dir.write_atomic(FILE, &bytes)
    }
}
