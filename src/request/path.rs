//! Staging, target and volume paths of requests, checked as text against the allowed
//! roots before anything on the host is touched.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Longest path the kernel takes (PATH_MAX, include/uapi/linux/limits.h, counts the NUL).
const PATH_MAX: usize = 4095;
/// Longest file name (NAME_MAX, include/uapi/linux/limits.h).
const NAME_MAX: usize = 255;

/// lstat's "is it a symlink", from the attributes the kernel has cached: a plain lstat of an
/// NFS mount whose server is gone asks the server and hangs (nfs_getattr, fs/nfs/inode.c;
/// kernel stack seen in the VM rig's s_unmount_dead). A type never changes, so the cached one
/// is exact. Errors count as "not a symlink", as the lstat's did.
fn is_symlink_cached(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `libc::statx` is plain old data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx writes only into `stx`, which lives for the call; `c` is NUL-terminated.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut stx,
        )
    };
    rc == 0 && (u32::from(stx.stx_mode) & libc::S_IFMT) == libc::S_IFLNK
}

/// A staging, target or volume path, checked as text: absolute, no `..`, no longer than the
/// kernel takes, strictly below an allowed root (the root itself would put the volume over
/// the whole kubelet directory), and no existing component a symlink. Returned normalised
/// (no `.`, no doubled or trailing `/`). This is the early, clear refusal; what is mounted
/// is resolved again without a window by `os::safepath`.
pub fn host_path(field: &'static str, raw: &str, roots: &[PathBuf]) -> Result<PathBuf> {
    check_text(field, raw)?;
    let path: PathBuf = Path::new(raw).components().collect();
    check_below_roots(field, raw, &path, roots)?;
    // Every existing ancestor below the root must be a real directory, not a link.
    let mut walked = PathBuf::new();
    for component in path.components() {
        walked.push(component);
        if is_symlink_cached(&walked) {
            return Err(Error::invalid(
                field,
                format!("{} is a symlink; pass the real path", walked.display()),
            ));
        }
    }
    Ok(path)
}

/// The path as text: present, printable, absolute, no `..`, within the kernel's limits.
fn check_text(field: &'static str, raw: &str) -> Result<()> {
    if raw.is_empty() {
        return Err(Error::invalid(field, "required"));
    }
    if raw.contains('\0') || raw.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    if raw.len() > PATH_MAX {
        return Err(Error::invalid(
            field,
            format!(
                "{} bytes long; a path is at most {PATH_MAX} bytes",
                raw.len()
            ),
        ));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(Error::invalid(
            field,
            format!("{raw:?} must be an absolute path"),
        ));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Error::invalid(
            field,
            format!("{raw:?} must not contain '..'"),
        ));
    }
    match path.iter().find(|c| c.len() > NAME_MAX) {
        Some(long) => Err(Error::invalid(
            field,
            format!(
                "a component of {raw:?} is {} bytes long; a name is at most {NAME_MAX} bytes",
                long.len()
            ),
        )),
        None => Ok(()),
    }
}

/// Strictly below one of the allowed roots (the root itself would put the volume over
/// the whole kubelet directory).
fn check_below_roots(field: &'static str, raw: &str, path: &Path, roots: &[PathBuf]) -> Result<()> {
    if let Some(root) = roots.iter().find(|root| path == root.as_path()) {
        return Err(Error::invalid(
            field,
            format!(
                "{raw:?} is the allowed root {} itself; pass a directory below it",
                root.display()
            ),
        ));
    }
    if !roots.iter().any(|root| path.starts_with(root)) {
        let roots: Vec<_> = roots.iter().map(|r| r.display().to_string()).collect();
        return Err(Error::invalid(
            field,
            format!(
                "{raw:?} is outside the allowed roots [{}] (--allowed-path-root)",
                roots.join(", ")
            ),
        ));
    }
    Ok(())
}
