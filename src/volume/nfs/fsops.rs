//! Directory operations inside a mounted export that never leave it: every path is
//! walked one component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)` from the
//! export's root, so neither `..` nor a symlink planted in the export can redirect a
//! mkdir, a rename or a recursive delete to somewhere else. These are blocking calls
//! (an NFS server can stall them); callers run them on the blocking pool under a
//! deadline.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Permissions of a new volume directory: every pod user may write (Kubernetes does
/// not chown NFS volumes to the pod's fsGroup).
pub const DIR_MODE: u32 = 0o777;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0} is a symlink or not a directory inside the export; refusing to follow it")]
    NotADirectory(String),
    /// Not a relative path of plain components (callers pass checked ones).
    #[error("{0:?} is not a relative path of plain components below the export")]
    BadPath(String),
    #[error("{what} {path}: {errno}")]
    Sys {
        what: &'static str,
        path: String,
        errno: Errno,
    },
}

fn sys<'a>(what: &'static str, path: &'a str) -> impl FnOnce(Errno) -> FsError + 'a {
    move |errno| FsError::Sys {
        what,
        path: path.to_owned(),
        errno,
    }
}

fn open_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn open_root(root: &Path) -> Result<Dir, FsError> {
    Dir::open(root, open_flags(), Mode::empty())
        .map_err(sys("opening export root", &root.display().to_string()))
}

/// Opens `name` below `parent` as a directory, refusing symlinks.
fn open_child(parent: &Dir, name: &str, shown: &str) -> Result<Option<Dir>, FsError> {
    match Dir::openat(parent, name, open_flags(), Mode::empty()) {
        Ok(d) => Ok(Some(d)),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP | Errno::ENOTDIR) => Err(FsError::NotADirectory(shown.to_owned())),
        Err(e) => Err(sys("opening", shown)(e)),
    }
}

/// Walks `components` from `root`, creating missing directories when `create`.
/// `Ok(None)`: a component does not exist (and `create` is false).
fn walk(root: &Path, components: &[&str], create: bool) -> Result<Option<Dir>, FsError> {
    let mut dir = open_root(root)?;
    let mut shown = String::new();
    for c in components {
        if !shown.is_empty() {
            shown.push('/');
        }
        shown.push_str(c);
        if create {
            match mkdirat(&dir, *c, Mode::from_bits_truncate(DIR_MODE)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(sys("creating", &shown)(e)),
            }
        }
        match open_child(&dir, c, &shown)? {
            Some(next) => dir = next,
            None => return Ok(None),
        }
    }
    Ok(Some(dir))
}

fn split(rel: &str) -> Vec<&str> {
    rel.split('/').filter(|c| !c.is_empty()).collect()
}

/// Creates `rel` (and its parents) below `root`; the last directory gets `DIR_MODE`
/// whatever the umask. Idempotent.
pub fn ensure_dir(root: &Path, rel: &str) -> Result<(), FsError> {
    let dir = walk(root, &split(rel), true)?.ok_or_else(|| FsError::BadPath(rel.to_owned()))?;
    fchmod(&dir, Mode::from_bits_truncate(DIR_MODE)).map_err(sys("chmod", rel))
}

/// Whether `rel` exists below `root` as a real directory.
pub fn dir_exists(root: &Path, rel: &str) -> Result<bool, FsError> {
    Ok(walk(root, &split(rel), false)?.is_some())
}

/// Opens `rel` below `root` as a directory, never following a symlink on the way.
/// `Ok(None)`: it does not exist.
pub fn open_dir(root: &Path, rel: &str) -> Result<Option<Dir>, FsError> {
    walk(root, &split(rel), false)
}

/// Whether the directory `rel` below `root` is missing or has no entries.
pub fn is_empty_or_missing(root: &Path, rel: &str) -> Result<bool, FsError> {
    let Some(mut dir) = open_dir(root, rel)? else {
        return Ok(true);
    };
    let mut entries = dir.iter().filter_map(|e| e.ok());
    Ok(!entries.any(|e| !matches!(e.file_name().to_bytes(), b"." | b"..")))
}

/// Opens the parent of `rel` and returns it with the last component's name.
fn parent_of<'a>(root: &Path, rel: &'a str) -> Result<Option<(Dir, &'a str)>, FsError> {
    let parts = split(rel);
    let (leaf, parents) = parts
        .split_last()
        .ok_or_else(|| FsError::BadPath(rel.to_owned()))?;
    Ok(walk(root, parents, false)?.map(|d| (d, *leaf)))
}

/// Removes `rel` and everything below it, never following a symlink (a symlink is
/// removed itself, not its target). Missing: nothing to do. Each entry removed is
/// counted in `removed` (what tells a long removal from a stalled server); a directory's
/// entries are removed on `REMOVERS` threads: on an NFS export each is a round trip.
pub fn remove_tree(root: &Path, rel: &str, removed: &AtomicU64) -> Result<(), FsError> {
    let Some((parent, leaf)) = parent_of(root, rel)? else {
        return Ok(());
    };
    let leaf = CString::new(leaf).map_err(|_| FsError::BadPath(rel.to_owned()))?;
    remove_at(parent.as_fd(), &leaf, rel, None, removed)
}

/// Threads removing one directory's entries.
const REMOVERS: usize = 8;

/// Removes `name` in `parent`; `dir_hint` is what its directory entry said (`d_type`),
/// so a file costs one unlink, not a stat and an unlink.
fn remove_at(
    fd: BorrowedFd<'_>,
    name: &CStr,
    shown: &str,
    dir_hint: Option<bool>,
    removed: &AtomicU64,
) -> Result<(), FsError> {
    let is_dir = match dir_hint {
        Some(known) => known,
        None => match fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(sys("stat", shown)(e)),
        },
    };
    if !is_dir {
        return match unlinkat(fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => count(removed),
            // A directory after all (renamed into place since the listing).
            Err(Errno::EISDIR) => remove_at(fd, name, shown, Some(true), removed),
            Err(e) => Err(sys("removing", shown)(e)),
        };
    }
    let mut dir = match Dir::openat(fd, name, open_flags(), Mode::empty()) {
        Ok(d) => d,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(sys("opening", shown)(e)),
    };
    let children: Vec<(CString, Option<bool>)> = dir
        .iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_bytes() != b"." && e.file_name().to_bytes() != b"..")
        .map(|e| {
            let hint = e.file_type().map(|t| t == nix::dir::Type::Directory);
            (e.file_name().to_owned(), hint)
        })
        .collect();
    remove_children(dir.as_fd(), &children, shown, removed)?;
    match unlinkat(fd, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => count(removed),
        Err(e) => Err(sys("removing", shown)(e)),
    }
}

/// The entries of `dir` removed on up to `REMOVERS` threads; the first error is the
/// answer (the others stop taking entries).
fn remove_children(
    dir: BorrowedFd<'_>,
    children: &[(CString, Option<bool>)],
    shown: &str,
    removed: &AtomicU64,
) -> Result<(), FsError> {
    crate::runtime::parallel::each_in_parallel(children, REMOVERS, |(child, hint)| {
        let child_shown = format!("{shown}/{}", child.to_string_lossy());
        remove_at(dir, child, &child_shown, *hint, removed)
    })
}

/// One more entry removed: Ok, counted.
fn count(removed: &AtomicU64) -> Result<(), FsError> {
    removed.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Renames `rel` to `archived-<leaf>-<suffix>` in the same parent. Missing: nothing to
/// do. Returns the new name when something was archived.
pub fn archive(root: &Path, rel: &str, suffix: &str) -> Result<Option<String>, FsError> {
    let Some((parent, leaf)) = parent_of(root, rel)? else {
        return Ok(None);
    };
    let fd = parent.as_fd();
    match fstatat(fd, leaf, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(sys("stat", rel)(e)),
        Ok(_) => {}
    }
    let new_name = format!("archived-{leaf}-{suffix}");
    nix::fcntl::renameat(fd, leaf, fd, new_name.as_str()).map_err(sys("archiving", rel))?;
    Ok(Some(new_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_idempotently_with_the_documented_mode() {
        let root = tempfile::tempdir().unwrap();
        ensure_dir(root.path(), "ns/vol").unwrap();
        ensure_dir(root.path(), "ns/vol").unwrap();
        let meta = std::fs::metadata(root.path().join("ns/vol")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, DIR_MODE);
        assert!(dir_exists(root.path(), "ns/vol").unwrap());
        assert!(!dir_exists(root.path(), "ns/other").unwrap());
    }

    #[test]
    fn planted_symlinks_are_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), b"x").unwrap();
        // A symlink where a parent directory should be.
        std::os::unix::fs::symlink(outside.path(), root.path().join("ns")).unwrap();
        assert!(matches!(
            ensure_dir(root.path(), "ns/vol"),
            Err(FsError::NotADirectory(_))
        ));
        assert!(matches!(
            remove_tree(root.path(), "ns/vol", &AtomicU64::new(0)),
            Err(FsError::NotADirectory(_))
        ));
        assert!(!outside.path().join("vol").exists());
        // A symlink as the volume directory itself: removing it removes the link only.
        std::os::unix::fs::symlink(outside.path(), root.path().join("vol")).unwrap();
        assert!(matches!(
            ensure_dir(root.path(), "vol"),
            Err(FsError::NotADirectory(_))
        ));
        remove_tree(root.path(), "vol", &AtomicU64::new(0)).unwrap();
        assert!(outside.path().join("precious").exists());
        assert!(std::fs::symlink_metadata(root.path().join("vol")).is_err());
        // A symlink inside the volume pointing out: removed, target untouched.
        ensure_dir(root.path(), "v2/sub").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("v2/sub/escape")).unwrap();
        std::fs::write(root.path().join("v2/sub/file"), b"data").unwrap();
        let removed = AtomicU64::new(0);
        remove_tree(root.path(), "v2", &removed).unwrap();
        assert!(!root.path().join("v2").exists());
        assert!(outside.path().join("precious").exists());
        assert_eq!(removed.into_inner(), 4, "v2, sub, the link and the file");
        remove_tree(root.path(), "v2", &AtomicU64::new(0)).unwrap();
    }

    #[test]
    fn archive_renames_once_and_is_idempotent() {
        let root = tempfile::tempdir().unwrap();
        ensure_dir(root.path(), "vol").unwrap();
        std::fs::write(root.path().join("vol/f"), b"keep").unwrap();
        let name = archive(root.path(), "vol", "1").unwrap().unwrap();
        assert_eq!(name, "archived-vol-1");
        assert_eq!(
            std::fs::read(root.path().join("archived-vol-1/f")).unwrap(),
            b"keep"
        );
        assert_eq!(archive(root.path(), "vol", "2").unwrap(), None);
    }
}
