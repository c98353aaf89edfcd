//! An earlier copy of the same source that a new copy takes its unchanged files from: an
//! incremental snapshot links each file the delta rules find unchanged since the base
//! snapshot (`delta::same`: kind, inode, size, mode, owner, link count, mtime and ctime)
//! to the base's copy on the store instead of writing its data again.
//!
//! The base lives on a store others can write. Its file list comes from its manifest,
//! which the caller accepts only when it is the one this node wrote (`snapshot/take.rs`
//! `open_base`); its files are checked one by one: a file is linked only when its new
//! name is, after the link, a regular file with the inode and the file handle the manifest
//! recorded, the source's size and its mtime (a file swapped, replaced by a symlink or a
//! foreign hard link is another inode, or, where the filesystem handed the freed inode
//! number out again, another handle: the handle carries the inode's generation; one
//! rewritten in place has another mtime). The new name is
//! checked, not the old one, so no swap between check and link goes unseen. Whatever
//! cannot be linked is copied. A linked file is never opened for writing: every later
//! change to the new copy replaces the name (`delta`, `meta::create_one`).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode};
use nix::unistd::{linkat, unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};

use super::walk::{kind_of, open_beneath, open_dir, Entry, Kind};
use super::{meta, verify, Verify};
use crate::error::{Error, Result};

/// What the delta rules compare of an entry (`delta::same`), as a manifest keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStat {
    pub ino: u64,
    pub size: i64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl SourceStat {
    pub fn of(st: &FileStat) -> SourceStat {
        SourceStat {
            ino: st.st_ino,
            size: st.st_size,
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// One file of the base as its manifest recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseFile {
    /// The source file when the base was taken.
    pub source: SourceStat,
    /// The inode of its copy on the store.
    pub stored_ino: u64,
    /// That copy's file handle (`file_handle`).
    pub stored_handle: String,
    /// Its SHA-256, when the base was taken with checksums.
    pub sha256: Option<String>,
}

impl BaseFile {
    /// Whether the store's inode `ino` with file handle `handle` is this file's recorded
    /// copy: the number alone is not, as a freed one is handed out again.
    pub fn is_stored_as(&self, ino: u64, handle: Option<&str>) -> bool {
        ino == self.stored_ino && handle == Some(self.stored_handle.as_str())
    }
}

/// The base: its tree on the store, opened by the caller beneath the store's root, and
/// its files by path.
#[derive(Debug)]
pub struct Base {
    pub tree: OwnedFd,
    /// The base snapshot's id: part of what a resumed copy must match.
    pub label: String,
    pub files: HashMap<PathBuf, BaseFile>,
}

impl Base {
    /// The entries (indices into `entries`) to link: files unchanged since the base, each
    /// hard-linked group only when every name of it is (else the group is copied whole,
    /// so its names stay one inode).
    pub fn unchanged(&self, entries: &[Entry]) -> HashSet<usize> {
        let mut groups: HashMap<(u64, u64), (Vec<usize>, bool)> = HashMap::new();
        for (i, e) in entries.iter().enumerate().skip(1) {
            if e.kind != Kind::File {
                continue;
            }
            let ok = self
                .files
                .get(&e.rel)
                .is_some_and(|b| b.source == SourceStat::of(&e.st));
            let g = groups
                .entry((e.st.st_dev, e.st.st_ino))
                .or_insert((Vec::new(), true));
            g.0.push(i);
            g.1 &= ok;
        }
        groups
            .into_values()
            .filter(|(_, ok)| *ok)
            .flat_map(|(names, _)| names)
            .collect()
    }

    /// Links each of `linked` from the base into `dst` (its parent exists); a file that
    /// cannot be linked, or whose link is not the recorded copy, is copied from `src`.
    /// Returns how many were copied instead.
    pub fn link_into(
        &self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        shown: &Path,
        linked: &[Entry],
        how: Verify,
        streams: super::Streams<'_>,
    ) -> Result<usize> {
        let copied = std::sync::atomic::AtomicUsize::new(0);
        streams.each(linked, |e| {
            let io =
                |x: Errno| Error::io("link from the base snapshot", shown.join(&e.rel), x.into());
            if self.link_one(dst, e).map_err(io)? {
                return Ok(());
            }
            copied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            copy_one(src, dst, shown, e, how)
        })?;
        Ok(copied.into_inner())
    }

    /// True when `e`'s name in `dst` is now the base's recorded copy.
    fn link_one(&self, dst: BorrowedFd<'_>, e: &Entry) -> nix::Result<bool> {
        let Some(want) = self.files.get(&e.rel) else {
            return Ok(false);
        };
        let parent = e.rel.parent().unwrap_or(Path::new(""));
        let name = e.rel.file_name().ok_or(Errno::EINVAL)?;
        let to = open_dir(dst, parent)?;
        let from = match open_dir(self.tree.as_fd(), parent) {
            Ok(d) => d,
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => return Ok(false),
            Err(x) => return Err(x),
        };
        if is_recorded(&to, name, want, e)? {
            return Ok(true);
        }
        remove_file(&to, name)?;
        match linkat(&from, name, &to, name, AtFlags::empty()) {
            Ok(()) => {}
            // Gone, no file, too many links, or a store that takes none: copied instead.
            Err(
                Errno::ENOENT | Errno::EMLINK | Errno::EPERM | Errno::EXDEV | Errno::EOPNOTSUPP,
            ) => return Ok(false),
            Err(x) => return Err(x),
        }
        if is_recorded(&to, name, want, e)? {
            return Ok(true);
        }
        remove_file(&to, name)?;
        Ok(false)
    }
}

/// The name in `dir` is a regular file with the recorded copy's inode, the source's size
/// and its modification time (which the copy set; a write moves it).
fn is_recorded(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    want: &BaseFile,
    e: &Entry,
) -> nix::Result<bool> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st)
            if kind_of(&st) == Kind::File
                && st.st_size == e.st.st_size
                && (st.st_mtime, st.st_mtime_nsec) == want.source.mtime =>
        {
            let handle = file_handle(dir.as_fd(), Path::new(name))?;
            Ok(want.is_stored_as(st.st_ino, handle.as_deref()))
        }
        Ok(_) | Err(Errno::ENOENT) => Ok(false),
        Err(x) => Err(x),
    }
}

/// The largest file handle the kernel hands out (`MAX_HANDLE_SZ`, include/linux/exportfs.h).
const MAX_HANDLE_SZ: usize = 128;

/// The kernel's file handle of `rel` beneath `dir`, a symlink not followed, as text: the
/// filesystem's own lasting name of the inode, which (unlike the inode number) tells a
/// reused inode apart by its generation (ext4, xfs, tmpfs; an NFS mount's is the server's
/// handle). None where the filesystem gives none.
pub fn file_handle(dir: BorrowedFd<'_>, rel: &Path) -> nix::Result<Option<String>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; MAX_HANDLE_SZ],
    }
    let mut h = Handle {
        bytes: MAX_HANDLE_SZ as u32,
        kind: 0,
        data: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    let path = std::ffi::CString::new(rel.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: `h` is a `struct file_handle` header followed by the MAX_HANDLE_SZ bytes its
    // `handle_bytes` announces, and the kernel writes no more than that
    // (name_to_handle_at(2)); `path` and `mount_id` live across the call.
    let rc = unsafe {
        libc::name_to_handle_at(
            dir.as_raw_fd(),
            path.as_ptr(),
            std::ptr::from_mut(&mut h).cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    if rc != 0 {
        return match Errno::last() {
            // No handles here (or none allowed, or larger than any the kernel defines).
            Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EPERM | Errno::EOVERFLOW => Ok(None),
            e => Err(e),
        };
    }
    let bytes = &h.data[..(h.bytes as usize).min(MAX_HANDLE_SZ)];
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(format!("{:x}:{hex}", h.kind)))
}

/// A name (never a directory) taken out of the new copy; none is fine.
fn remove_file(dir: &OwnedFd, name: &std::ffi::OsStr) -> nix::Result<()> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(x) => Err(x),
    }
}

/// One file the base could not give, copied whole (a rare path: a store out of links
/// for an inode, a base file someone changed): made anew, its data, then its owner, mode
/// and times, and verified as the copy verifies every file.
fn copy_one(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    e: &Entry,
    how: Verify,
) -> Result<()> {
    let io = |what: &'static str| {
        let at = shown.join(&e.rel);
        move |x: Errno| Error::io(what, at, x.into())
    };
    meta::create_one(src, dst, e).map_err(io("create"))?;
    let from = open_beneath(
        src,
        &e.rel,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("open"))?;
    let to = open_beneath(
        dst,
        &e.rel,
        OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("open"))?;
    let (mut from, mut to) = (std::fs::File::from(from), std::fs::File::from(to));
    std::io::copy(&mut from, &mut to)
        .and_then(|_| to.flush())
        .map_err(|x| Error::io("copy", shown.join(&e.rel), x))?;
    meta::set_one(src, dst, e, meta::has_xattrs(src))
        .map_err(io("set owner, mode and times of"))?;
    verify::verify_one(src, dst, shown, e, how)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::copy::{copy_tree_at, walk, CopyRequest, Progress};
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;

    fn open(p: &Path) -> OwnedFd {
        walk::open_dir(
            nix::fcntl::open(p, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
                .unwrap()
                .as_fd(),
            Path::new(""),
        )
        .unwrap()
    }

    /// `src` copied into `dst` as a snapshot copies it, linking from `base` when given.
    fn copy(src: &Path, dst: &Path, records: &Path, base: Option<Arc<Base>>) -> Vec<Entry> {
        let req = CopyRequest {
            source: src.to_owned(),
            target: dst.to_owned(),
            label: "t".into(),
            streams: 2,
            chunk: crate::volume::copy::CHUNK,
            verify: Verify::Checksum,
            live: false,
            target_reused: true,
            base,
            extents: None,
        };
        let progress = Progress::new(records.join("p.json"), "t".into());
        copy_tree_at(open(src).as_fd(), open(dst).as_fd(), &req, &progress).unwrap()
    }

    /// The copy in `dst` of the walk `entries` as a later copy's base (as a manifest lists it).
    fn base_of(dst: &Path, entries: &[Entry]) -> Arc<Base> {
        let files = entries
            .iter()
            .filter(|e| e.kind == Kind::File)
            .map(|e| {
                let stored_ino = std::fs::symlink_metadata(dst.join(&e.rel)).unwrap().ino();
                let stored_handle = file_handle(open(dst).as_fd(), &e.rel).unwrap().unwrap();
                let source = SourceStat::of(&e.st);
                (
                    e.rel.clone(),
                    BaseFile {
                        source,
                        stored_ino,
                        stored_handle,
                        sha256: None,
                    },
                )
            })
            .collect();
        Arc::new(Base {
            tree: open(dst),
            label: "snap:1".into(),
            files,
        })
    }

    fn ino(p: &Path) -> u64 {
        std::fs::symlink_metadata(p).unwrap().ino()
    }

    fn dirs(n: usize) -> Vec<tempfile::TempDir> {
        (0..n).map(|_| tempfile::tempdir().unwrap()).collect()
    }

    #[test]
    fn unchanged_files_are_linked_from_the_base_and_changed_ones_copied_anew_leaving_the_base_as_it_was(
    ) {
        let d = dirs(4);
        let (src, first, second) = (d[0].path(), d[1].path(), d[2].path());
        std::fs::create_dir_all(src.join("a")).unwrap();
        std::fs::write(src.join("a/keep"), b"kept bytes").unwrap();
        std::fs::write(src.join("a/change"), b"old bytes").unwrap();
        std::fs::write(src.join("h1"), b"linked").unwrap();
        std::fs::hard_link(src.join("h1"), src.join("a/h2")).unwrap();
        let entries = copy(src, first, d[3].path(), None);
        let base = base_of(first, &entries);
        std::fs::write(src.join("a/change"), b"new bytes, longer").unwrap();
        std::fs::write(src.join("new"), b"fresh").unwrap();
        copy(src, second, &d[3].path().join("2"), Some(base));
        assert_eq!(ino(&second.join("a/keep")), ino(&first.join("a/keep")));
        assert_eq!(ino(&second.join("h1")), ino(&first.join("h1")));
        assert_eq!(ino(&second.join("a/h2")), ino(&second.join("h1")));
        assert_ne!(ino(&second.join("a/change")), ino(&first.join("a/change")));
        assert_eq!(
            std::fs::read(second.join("a/change")).unwrap(),
            b"new bytes, longer"
        );
        assert_eq!(std::fs::read(second.join("new")).unwrap(), b"fresh");
        assert_eq!(std::fs::read(first.join("a/change")).unwrap(), b"old bytes");
        assert!(!first.join("new").exists());
    }

    #[test]
    fn a_file_made_again_under_a_reused_inode_number_has_another_handle() {
        let d = dirs(1);
        let dir = open(d[0].path());
        let name = Path::new("f");
        std::fs::write(d[0].path().join(name), b"first").unwrap();
        let (ino0, handle0) = (ino(&d[0].path().join(name)), file_handle(dir.as_fd(), name));
        let handle0 = handle0.unwrap().unwrap();
        let mut reused = false;
        for _ in 0..64 {
            std::fs::remove_file(d[0].path().join(name)).unwrap();
            std::fs::write(d[0].path().join(name), b"other").unwrap();
            assert_ne!(file_handle(dir.as_fd(), name).unwrap().unwrap(), handle0);
            reused |= ino(&d[0].path().join(name)) == ino0;
        }
        // Where the filesystem handed the number out again, the handle still differed.
        eprintln!("inode number reused: {reused}");
        std::os::unix::fs::symlink("f", d[0].path().join("link")).unwrap();
        let link = file_handle(dir.as_fd(), Path::new("link"))
            .unwrap()
            .unwrap();
        assert_ne!(
            link,
            file_handle(dir.as_fd(), name).unwrap().unwrap(),
            "not followed"
        );
    }

    #[test]
    fn a_base_file_swapped_symlinked_or_rewritten_on_the_store_is_copied_not_linked() {
        let d = dirs(4);
        let (src, first, second) = (d[0].path(), d[1].path(), d[2].path());
        for name in ["swapped", "symlinked", "rewritten", "kept"] {
            std::fs::write(src.join(name), b"tenant data").unwrap();
        }
        let entries = copy(src, first, d[3].path(), None);
        let base = base_of(first, &entries);
        // A store writer: another inode of the same size and times, a symlink out of the
        // store, the same inode written in place.
        let mtime = std::fs::metadata(first.join("swapped"))
            .unwrap()
            .modified()
            .unwrap();
        std::fs::remove_file(first.join("swapped")).unwrap();
        std::fs::write(first.join("swapped"), b"other bytes").unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(first.join("swapped"))
            .unwrap();
        f.set_modified(mtime).unwrap();
        std::fs::remove_file(first.join("symlinked")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", first.join("symlinked")).unwrap();
        std::fs::write(first.join("rewritten"), b"other bytes").unwrap();
        copy(src, second, &d[3].path().join("2"), Some(base));
        for name in ["swapped", "symlinked", "rewritten", "kept"] {
            let meta = std::fs::symlink_metadata(second.join(name)).unwrap();
            assert!(meta.is_file(), "{name}");
            assert_eq!(
                std::fs::read(second.join(name)).unwrap(),
                b"tenant data",
                "{name}"
            );
        }
        assert_eq!(ino(&second.join("kept")), ino(&first.join("kept")));
        assert_ne!(ino(&second.join("swapped")), ino(&first.join("swapped")));
        assert_ne!(
            ino(&second.join("rewritten")),
            ino(&first.join("rewritten"))
        );
    }

    #[test]
    fn a_base_on_another_filesystem_gives_a_whole_copy_through_the_fallback() {
        let d = dirs(3);
        let first = tempfile::tempdir_in("/dev/shm").unwrap();
        let (src, second) = (d[0].path(), d[1].path());
        std::fs::create_dir(src.join("a")).unwrap();
        std::fs::write(src.join("a/f"), vec![7u8; 100_000]).unwrap();
        let entries = copy(src, first.path(), d[2].path(), None);
        let base = base_of(first.path(), &entries);
        copy(src, second, &d[2].path().join("2"), Some(base));
        assert_eq!(
            std::fs::read(second.join("a/f")).unwrap(),
            vec![7u8; 100_000]
        );
        let (a, b) = (
            std::fs::metadata(src.join("a/f")).unwrap(),
            std::fs::metadata(second.join("a/f")).unwrap(),
        );
        assert_eq!(
            (a.mode(), a.uid(), a.mtime()),
            (b.mode(), b.uid(), b.mtime())
        );
    }

    #[test]
    fn a_copy_over_a_name_linked_from_another_snapshot_replaces_it_and_never_writes_through() {
        let d = dirs(4);
        let (src, first, second) = (d[0].path(), d[1].path(), d[2].path());
        std::fs::write(src.join("f"), b"first").unwrap();
        copy(src, first, d[3].path(), None);
        std::fs::write(src.join("f"), b"later").unwrap();
        // A name left linked to the first copy (a run cut short, another plan).
        std::fs::hard_link(first.join("f"), second.join("f")).unwrap();
        let req = CopyRequest {
            source: src.to_owned(),
            target: second.to_owned(),
            label: "t".into(),
            streams: 2,
            chunk: crate::volume::copy::CHUNK,
            verify: Verify::Checksum,
            live: false,
            target_reused: false,
            base: None,
            extents: None,
        };
        let progress = Progress::new(d[3].path().join("q.json"), "t".into());
        copy_tree_at(open(src).as_fd(), open(second).as_fd(), &req, &progress).unwrap();
        assert_eq!(std::fs::read(second.join("f")).unwrap(), b"later");
        assert_eq!(std::fs::read(first.join("f")).unwrap(), b"first");
    }
}
