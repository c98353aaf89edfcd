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
//! - `mark`: the extended attribute that says publish created a target.
//! - `unmount`: taking down the topmost mount at a pinned path.

mod mark;
mod unmount;

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::error::{Error, Result};
pub use mark::PUBLISHED_BY;
use mark::{get_mark, set_mark};
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

// Opening a caller's path beneath an allowed root, one component at a time, never
// following a symlink, creating what the call needs on the way.

fn resolve(cross_mounts: bool) -> ResolveFlag {
    let flags = ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if cross_mounts {
        flags
    } else {
        flags | ResolveFlag::RESOLVE_NO_XDEV
    }
}

fn open_in(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    flags: OFlag,
    cross_mounts: bool,
) -> std::result::Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(resolve(cross_mounts));
    openat2(dir, name, how)
}

fn cstring(name: &OsStr) -> CString {
    // host_path refused NUL already.
    CString::new(name.as_bytes()).unwrap_or_default()
}

/// `O_DIRECTORY | O_NOFOLLOW` on a symlink answers ENOTDIR: say symlink when it is one.
fn symlink_or(dir: BorrowedFd<'_>, name: &std::ffi::CStr, errno: Errno) -> Errno {
    if errno != Errno::ENOTDIR {
        return errno;
    }
    match nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if kind(&st) == SFlag::S_IFLNK => Errno::ELOOP,
        _ => errno,
    }
}

fn refused(field: &'static str, shown: &Path, errno: Errno) -> Error {
    let shown = shown.display();
    match errno {
        Errno::ELOOP => Error::invalid(field, format!("{shown} is a symlink; pass the real path")),
        Errno::ENOTDIR => Error::invalid(field, format!("{shown} is not a directory")),
        Errno::EXDEV => Error::invalid(
            field,
            format!(
                "{shown} is another mount below the allowed root; the driver creates and \
                 mounts only on the root's own filesystem (list that mount as its own \
                 --allowed-path-root if it is meant to hold volumes)"
            ),
        ),
        Errno::ENAMETOOLONG => Error::invalid(field, format!("{shown} is too long")),
        other => Error::io("opening", shown.to_string(), other.into()),
    }
}

/// Opens `path` (already checked by `request::host_path`) beneath the longest allowed
/// root that holds it. Missing parents are created when `create` is not `Nothing`; a
/// missing final component is created as asked and marked with `mark`. `Ok(None)`: it
/// does not exist and `create` is `Nothing`.
pub fn open(
    field: &'static str,
    roots: &[PathBuf],
    path: &Path,
    create: Create,
    mark: Option<&str>,
) -> Result<Option<Anchored>> {
    // A mount or unmount of this path that outlived its call may still land.
    crate::os::mount::refuse_in_flight(path)?;
    let (root, names) = beneath_root(field, roots, path)?;
    let Some((last, parents)) = names.split_last() else {
        return Err(Error::invalid(
            field,
            format!("{} is the allowed root itself", path.display()),
        ));
    };
    let Some(root_fd) = open_root(root, create)? else {
        return Ok(None);
    };
    let Some(dir) = walk_parents(field, root_fd, root, parents, create)? else {
        return Ok(None);
    };
    let Some(fd) = open_last(field, dir.as_fd(), last, path, create, mark)? else {
        return Ok(None);
    };
    // O_PATH | O_NOFOLLOW opens a trailing symlink itself (openat2(2), RESOLVE_NO_SYMLINKS).
    let file_type = cached_type(fd.as_fd()).map_err(|e| Error::io("stat", path, e.into()))?;
    if file_type == SFlag::S_IFLNK {
        return Err(refused(field, path, Errno::ELOOP));
    }
    Ok(Some(Anchored {
        path: path.to_owned(),
        pin: Some(Pin {
            parent: dir,
            name: last.clone(),
            fd: Some(fd),
        }),
    }))
}

/// The longest allowed root holding `path`, and the names of the components below it.
fn beneath_root<'r>(
    field: &'static str,
    roots: &'r [PathBuf],
    path: &Path,
) -> Result<(&'r PathBuf, Vec<CString>)> {
    let root = roots
        .iter()
        .filter(|r| path.starts_with(r))
        .max_by_key(|r| r.components().count())
        .ok_or_else(|| {
            Error::invalid(
                field,
                format!("{} is outside the allowed roots", path.display()),
            )
        })?;
    let mut names = Vec::new();
    for c in path.strip_prefix(root).unwrap_or(path).components() {
        match c {
            Component::Normal(n) => names.push(cstring(n)),
            Component::CurDir => {}
            _ => return Err(Error::invalid(field, "must not contain '..'")),
        }
    }
    Ok((root, names))
}

/// The root is the operator's own setting: it may be a symlink (a relocated kubelet
/// directory), followed once, here, and created like any parent when missing.
fn open_root(root: &Path, create: Create) -> Result<Option<OwnedFd>> {
    let open_root = || {
        nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let root_fd = match open_root() {
        Err(Errno::ENOENT) if create == Create::Nothing => return Ok(None),
        Err(Errno::ENOENT) => {
            std::fs::create_dir_all(root).map_err(|e| Error::io("creating", root, e))?;
            open_root()
        }
        other => other,
    }
    .map_err(|e| Error::io("opening allowed root", root, e.into()))?;
    Ok(Some(root_fd))
}

/// Walks down `parents` from the root one directory at a time, never following a symlink,
/// creating missing ones unless `create` is `Nothing` (then `Ok(None)`).
fn walk_parents(
    field: &'static str,
    mut dir: OwnedFd,
    root: &Path,
    parents: &[CString],
    create: Create,
) -> Result<Option<OwnedFd>> {
    let mut shown = root.to_path_buf();
    for name in parents {
        shown.push(OsStr::from_bytes(name.as_bytes()));
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        dir = match open_in(dir.as_fd(), name, flags, false) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if create != Create::Nothing => {
                match mkdirat(&dir, name.as_c_str(), Mode::from_bits_truncate(0o750)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(Error::io("creating", &shown, e.into())),
                }
                open_in(dir.as_fd(), name, flags, false)
                    .map_err(|e| refused(field, &shown, symlink_or(dir.as_fd(), name, e)))?
            }
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(refused(field, &shown, symlink_or(dir.as_fd(), name, e))),
        };
    }
    Ok(Some(dir))
}

/// Opens the final component in `dir` without following it; creates it as `create` asks
/// when missing (marked with `mark` when this call made it), else `Ok(None)`.
fn open_last(
    field: &'static str,
    dir: BorrowedFd<'_>,
    last: &CString,
    path: &Path,
    create: Create,
    mark: Option<&str>,
) -> Result<Option<OwnedFd>> {
    match open_in(dir, last, OFlag::O_PATH, true) {
        Ok(fd) => return Ok(Some(fd)),
        Err(Errno::ENOENT) if create == Create::Nothing => return Ok(None),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(refused(field, path, e)),
    }
    let made = match create {
        Create::Nothing => return Ok(None),
        Create::Dir => mkdirat(dir, last.as_c_str(), Mode::from_bits_truncate(0o750)),
        Create::File => nix::fcntl::openat(
            dir,
            last.as_c_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o640),
        )
        // Closed at once: only its creation counts.
        .map(drop),
    };
    let made = match made {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(Error::io("creating", path, e.into())),
    };
    let fd = open_in(dir, last, OFlag::O_PATH, true).map_err(|e| refused(field, path, e))?;
    if let (true, Some(mark)) = (made, mark) {
        if let Err(e) = set_mark(fd.as_fd(), mark) {
            // Then unpublish leaves it for the kubelet to remove.
            tracing::warn!(path = %path.display(), error = %e, "cannot mark the target as created by this driver");
        }
    }
    Ok(Some(fd))
}

/// The file type of what `fd` holds, from the attributes the kernel has cached. A plain
/// fstat of an NFS mount's root asks the server when they are stale, and hangs while the
/// server is gone; AT_STATX_DONT_SYNC skips that (fs/nfs/inode.c nfs_getattr, ~l. 850 in
/// 6.1: `if ((query_flags & AT_STATX_DONT_SYNC) && !force_sync) goto out_no_revalidate`).
/// The type of an inode never changes, so the cached one is exact.
fn cached_type(fd: BorrowedFd<'_>) -> nix::Result<SFlag> {
    // SAFETY: `libc::statx` is plain old data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx writes only into `stx`, which lives for the call; "" with AT_EMPTY_PATH
    // names `fd` itself.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut stx,
        )
    };
    Errno::result(rc)?;
    Ok(SFlag::from_bits_truncate(
        libc::mode_t::from(stx.stx_mode) & SFlag::S_IFMT.bits(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_refuses_symlinks_and_the_root_and_creates_beneath() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("link")).unwrap();
        let roots = vec![root.clone()];
        let made = open("f", &roots, &root.join("a/b"), Create::Dir, None)
            .unwrap()
            .unwrap();
        assert!(root.join("a/b").is_dir());
        assert_eq!(made.path(), root.join("a/b"));
        assert!(
            open("f", &roots, &root.join("missing"), Create::Nothing, None)
                .unwrap()
                .is_none()
        );
        for (path, says) in [
            (root.join("link/x"), "symlink"),
            (root.join("link"), "symlink"),
            (root.clone(), "allowed root"),
        ] {
            let err = open("f", &roots, &path, Create::Dir, None).unwrap_err();
            assert!(err.to_string().contains(says), "{path:?}: {err}");
        }
        assert!(
            !dir.path().join("x").exists(),
            "nothing created through the link"
        );
    }
}
