//! The source tree, read once into a list in a fixed order (names sorted at every level),
//! so a restarted copy finds the same entries at the same indices. Nothing is ever
//! followed: every directory is opened from its parent's descriptor with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and every entry is `fstatat`ed with
//! `AT_SYMLINK_NOFOLLOW`; a symlink is an entry of its own (copied as a link), wherever
//! it points, inside the source or out of it.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// FIFOs, sockets, device nodes: recreated with `mknodat` (sockets are skipped).
    Special,
}

#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to the tree's root; empty for the root itself.
    pub rel: PathBuf,
    pub kind: Kind,
    pub st: FileStat,
}

impl Entry {
    pub fn size(&self) -> u64 {
        self.st.st_size.max(0) as u64
    }

    /// Bytes its filesystem allocated to it.
    pub fn allocated(&self) -> u64 {
        (self.st.st_blocks.max(0) as u64).saturating_mul(512)
    }

    /// Fewer bytes allocated than its size: a file with holes (or one its filesystem
    /// compresses), as `cp --sparse=auto` tells them.
    pub fn has_holes(&self) -> bool {
        self.allocated() < self.size()
    }
}

pub fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFLNK => Kind::Symlink,
        _ => Kind::Special,
    }
}

/// Opens `rel` beneath `root` without following any symlink on the way or at the end.
pub fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    mode: Mode,
) -> nix::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    openat2(root, rel, how)
}

pub fn open_dir(root: BorrowedFd<'_>, rel: &Path) -> nix::Result<OwnedFd> {
    open_beneath(
        root,
        rel,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
}

fn names(dir: OwnedFd, at: &Path) -> Result<Vec<OsString>> {
    let d = nix::dir::Dir::from_fd(dir).map_err(|e| Error::io("read directory", at, e.into()))?;
    let mut names = Vec::new();
    for ent in d {
        let ent = ent.map_err(|e| Error::io("read directory", at, e.into()))?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from(std::ffi::OsStr::from_bytes(name)));
        }
    }
    names.sort();
    Ok(names)
}

/// Every entry below `root` (the root first), parents before children (depth first).
pub fn walk(root: BorrowedFd<'_>, shown: &Path) -> Result<Vec<Entry>> {
    walk_counting(root, shown, &AtomicUsize::new(0))
}

/// [`walk`] of a tree in use: an entry removed between its directory's listing and its
/// stat is left out (the frozen pass that follows a live copy sees the tree at rest).
pub fn walk_live(root: BorrowedFd<'_>, shown: &Path) -> Result<Vec<Entry>> {
    walk_with(root, shown, &AtomicUsize::new(0), true)
}

/// [`walk`], counting the entries seen in `seen` as it goes (for a progress message).
pub fn walk_counting(root: BorrowedFd<'_>, shown: &Path, seen: &AtomicUsize) -> Result<Vec<Entry>> {
    walk_with(root, shown, seen, false)
}

fn walk_with(
    root: BorrowedFd<'_>,
    shown: &Path,
    seen: &AtomicUsize,
    live: bool,
) -> Result<Vec<Entry>> {
    let st = nix::sys::stat::fstat(root).map_err(|e| Error::io("stat", shown, e.into()))?;
    let mut out = vec![Entry {
        rel: PathBuf::new(),
        kind: Kind::Dir,
        st,
    }];
    let walker = Walker {
        root,
        shown,
        seen,
        live,
    };
    walker.dir(PathBuf::new(), &mut out)?;
    Ok(out)
}

struct Walker<'a> {
    root: BorrowedFd<'a>,
    shown: &'a Path,
    seen: &'a AtomicUsize,
    /// Entries that vanish while walked are skipped, not errors.
    live: bool,
}

impl Walker<'_> {
    fn dir(&self, rel: PathBuf, out: &mut Vec<Entry>) -> Result<()> {
        let (root, shown) = (self.root, self.shown);
        let at = shown.join(&rel);
        let dir = match open_dir(root, &rel) {
            Ok(dir) => dir,
            Err(Errno::ENOENT | Errno::ENOTDIR) if self.live && !rel.as_os_str().is_empty() => {
                return Ok(())
            }
            Err(e) => return Err(Error::io("open directory", &at, e.into())),
        };
        let dup = dir
            .try_clone()
            .map_err(|e| Error::io("open directory", &at, e))?;
        for name in names(dup, &at)? {
            let st = match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) if self.live => continue,
                Err(e) => return Err(Error::io("stat", at.join(&name), e.into())),
            };
            let kind = kind_of(&st);
            let child = rel.join(&name);
            out.push(Entry {
                rel: child.clone(),
                kind,
                st,
            });
            self.seen.fetch_add(1, Ordering::Relaxed);
            if kind == Kind::Dir {
                self.dir(child, out)?;
            }
        }
        Ok(())
    }
}
