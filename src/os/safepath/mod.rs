//! Staging and target paths, resolved and mounted without a window for a symlink swap.
//!
//! `request::host_path` checks a path as text; between that check and a mount, anyone who
//! can write below the kubelet directory could swap a component for a symlink and move
//! the mount anywhere on the host. So the path is opened instead, one component at a
//! time from a descriptor of the allowed root, with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` (fs/namei.c, Documentation: openat2(2)), directories the call
//! needs are created with `mkdirat` in the descriptor of their parent, and the mount goes
//! onto the opened descriptor: `mount(2)` on `/proc/self/fd/N` (the kernel follows that
//! magic link to the very dentry the descriptor holds), or `move_mount(2)` straight onto
//! the descriptor for bind mounts. No path is resolved twice.
//!
//! Parents are also resolved with `RESOLVE_NO_XDEV`: a directory below the root that is
//! itself a mount point (a bind mount of `/` placed there, say) is not crossed, so the
//! driver never creates or mounts anything on another filesystem than the root's. The
//! final component may be a mount point (an existing staging or publish mount).
//!
//! - `resolve`: opening (and creating) a caller's path beneath an allowed root.
//! - `mark`: the extended attribute that says publish created a target.
//! - `unmount`: taking down the topmost mount at a pinned path.

mod mark;
mod resolve;
mod unmount;

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::error::{Error, Result};
use mark::get_mark;
use resolve::open_in;

pub use mark::PUBLISHED_BY;
pub use resolve::open;

pub use unmount::unmount;

/// What to do when the final component does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Nothing: `Ok(None)`.
    Nothing,
    /// A directory (parents too), marked with `mark` when given.
    Dir,
    /// An empty regular file (parents too, as directories), marked with `mark` when given.
    File,
}

/// A path the driver acts on. Pinned: the descriptor of its parent and an `O_PATH`
/// descriptor of itself, both opened beneath an allowed root. Unpinned: a path the driver
/// chose itself (a pool device node, a directory of its state dir).
#[derive(Debug)]
pub struct Anchored {
    path: PathBuf,
    pin: Option<Pin>,
}

#[derive(Debug)]
struct Pin {
    parent: OwnedFd,
    name: CString,
    /// Dropped (`without_final`) before an unmount: an open descriptor of a mount's
    /// root keeps it busy.
    fd: Option<OwnedFd>,
}

impl Anchored {
    pub fn unpinned(path: impl Into<PathBuf>) -> Self {
        Anchored {
            path: path.into(),
            pin: None,
        }
    }

    /// The same pin on duplicated descriptors (for a blocking thread).
    pub fn try_clone(&self) -> Result<Anchored> {
        let pin = match &self.pin {
            None => None,
            Some(p) => {
                let dup = |fd: &OwnedFd| {
                    fd.try_clone()
                        .map_err(|e| Error::io("duplicating a descriptor of", &self.path, e))
                };
                Some(Pin {
                    parent: dup(&p.parent)?,
                    name: p.name.clone(),
                    fd: p.fd.as_ref().map(dup).transpose()?,
                })
            }
        };
        Ok(Anchored {
            path: self.path.clone(),
            pin,
        })
    }

    /// The path as asked for: for the mount table and for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `O_PATH` descriptor, when pinned.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.pin
            .as_ref()
            .and_then(|p| p.fd.as_ref())
            .map(|fd| fd.as_fd())
    }

    pub fn is_pinned(&self) -> bool {
        self.pin.is_some()
    }

    /// Keeps only the parent's descriptor: what the name holds is looked up afresh by
    /// each use (an unmount must not hold the mount it takes down).
    pub fn without_final(mut self) -> Self {
        if let Some(p) = &mut self.pin {
            p.fd = None;
        }
        self
    }

    /// What to hand a path-taking syscall, valid while `self` lives: `/proc/self/fd/N`
    /// of the descriptor; without it `/proc/self/fd/P/name` (the name looked up in the
    /// pinned parent, into whatever is mounted there); unpinned, the path itself.
    pub fn syscall_path(&self) -> PathBuf {
        match &self.pin {
            Some(Pin { fd: Some(fd), .. }) => fd_path(fd.as_fd()),
            Some(p) => fd_path(p.parent.as_fd()).join(OsStr::from_bytes(p.name.as_bytes())),
            None => self.path.clone(),
        }
    }

    /// Opens the name again in the pinned parent, crossing into whatever is mounted
    /// there now: after a mount, the root of the topmost mount. `Ok(None)`: unpinned,
    /// or the name is gone.
    pub fn reopen(&self) -> Result<Option<OwnedFd>> {
        let Some(pin) = &self.pin else {
            return Ok(None);
        };
        match open_in(pin.parent.as_fd(), &pin.name, OFlag::O_PATH, true) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(Error::io("opening", &self.path, e.into())),
        }
    }

    /// `fstat` of what the name holds now (the topmost mount's root, if mounted).
    pub fn stat_now(&self) -> Result<Option<FileStat>> {
        match self.reopen()? {
            Some(fd) => fstat(&fd)
                .map(Some)
                .map_err(|e| Error::io("stat", &self.path, e.into())),
            None => Ok(None),
        }
    }

    /// The volume whose publish created this path (the `PUBLISHED_BY` mark), read from
    /// what the name holds now.
    pub fn published_by(&self) -> Result<Option<String>> {
        let Some(fd) = self.reopen()? else {
            return Ok(None);
        };
        Ok(get_mark(fd.as_fd()))
    }

    /// Removes the name from its pinned parent: an empty directory or a file. Only
    /// for what `published_by` says publish created.
    pub fn remove(&self, dir: bool) -> Result<()> {
        let Some(pin) = &self.pin else {
            return Ok(());
        };
        let flag = if dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        match unlinkat(&pin.parent, pin.name.as_c_str(), flag) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            // Something was written into it while it was not mounted: not ours to drop.
            Err(Errno::ENOTEMPTY) => {
                tracing::warn!(path = %self.path.display(), "target not empty after unmount; left in place");
                Ok(())
            }
            Err(e) => Err(Error::io("removing", &self.path, e.into())),
        }
    }
}

pub fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The file type of a `stat`.
pub fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Whether the directory the descriptor holds has no entries.
pub fn dir_is_empty(a: &Anchored) -> Result<bool> {
    let Some(pin) = &a.pin else {
        return Ok(true);
    };
    let fd = open_in(
        pin.parent.as_fd(),
        &pin.name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        true,
    )
    .map_err(|e| Error::io("opening", a.path(), e.into()))?;
    let mut dir =
        nix::dir::Dir::from_fd(fd).map_err(|e| Error::io("reading", a.path(), e.into()))?;
    let mut empty = true;
    for entry in dir.iter() {
        let entry = entry.map_err(|e| Error::io("reading", a.path(), e.into()))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            empty = false;
            break;
        }
    }
    Ok(empty)
}
