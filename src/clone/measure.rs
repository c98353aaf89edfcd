//! How big a volume must be to hold a copy of a source tree, measured before anything is
//! allocated (CreateVolume of a clone of an NFS directory).
//!
//! The rule: the data is what the copy writes (every regular file's size, hard-linked
//! files once), each file rounded up to a 4 KiB block, plus one 4 KiB block for every
//! other entry (directory, symlink, node); the filesystem's own metadata then gets a
//! sixteenth of the volume: the volume must be at least `blocks × 16 / 15`. ext4 as the
//! driver makes it (`-m 0`, no reserved blocks) spends 1/64 on inode tables and up to
//! 1/16 on its journal on volumes under 1 GiB (mke2fs's journal size table), less above;
//! xfs's log and inode chunks take less. A sparse file's holes are counted as data: the
//! copy keeps them, but the measure does not rely on the target filesystem's holes.

use std::os::fd::AsFd;
use std::path::Path;

use super::walk::{self, Kind};
use crate::error::{Error, Result};

/// The block size every entry is rounded to.
const BLOCK: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// What the copy writes: the sum of the files' sizes.
    pub data_bytes: u64,
    pub entries: usize,
    /// The smallest volume that holds the copy (the rule above).
    pub needed_bytes: u64,
}

/// Measures the tree at `rel` beneath `root` (blocking: on NFS every entry is a request).
/// Nothing is followed on the way to `rel` or inside it.
pub fn measure(root: &Path, rel: &Path) -> Result<Measured> {
    let shown = root.join(rel);
    let root_fd = super::open_root(root)?;
    let dir = walk::open_dir(root_fd.as_fd(), rel)
        .map_err(|e| Error::io("open directory", &shown, e.into()))?;
    let entries = walk::walk(dir.as_fd(), &shown)?;
    let links = super::meta::links(&entries);
    let mut data_bytes = 0u64;
    let mut blocks = 0u64;
    for &i in &links.primaries {
        let size = entries[i].size();
        data_bytes += size;
        blocks += size.div_ceil(BLOCK) * BLOCK;
    }
    let others = entries.iter().filter(|e| e.kind != Kind::File).count() as u64;
    blocks += others * BLOCK;
    Ok(Measured {
        data_bytes,
        entries: entries.len(),
        needed_bytes: needed(blocks),
    })
}

/// `blocks × 16 / 15`, rounded up to a block.
fn needed(blocks: u64) -> u64 {
    (blocks.saturating_mul(16).div_ceil(15)).div_ceil(BLOCK) * BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_to_blocks_links_count_once_and_metadata_gets_a_sixteenth() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("tree");
        std::fs::create_dir_all(t.join("sub")).unwrap();
        std::fs::write(t.join("sub/a"), vec![1u8; 5000]).unwrap();
        std::fs::write(t.join("empty"), b"").unwrap();
        std::fs::hard_link(t.join("sub/a"), t.join("a.link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.join("out")).unwrap();
        let m = measure(dir.path(), Path::new("tree")).unwrap();
        assert_eq!(m.data_bytes, 5000);
        assert_eq!(m.entries, 6);
        // 8 KiB of file blocks, root + sub + symlink one block each: 20 KiB, × 16/15.
        assert_eq!(m.needed_bytes, needed(20 << 10));
        assert_eq!(m.needed_bytes, 24 << 10);
        assert!(m.needed_bytes * 15 >= (20 << 10) * 16);
    }

    #[test]
    fn a_path_through_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("via")).unwrap();
        assert!(measure(dir.path(), Path::new("via")).is_err());
        assert!(measure(dir.path(), Path::new("../")).is_err());
    }
}
