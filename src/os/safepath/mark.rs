//! The mark publish leaves on a target it created, so that unpublish removes only that.

use std::ffi::CString;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;

use super::fd_path;

/// Extended attribute naming the volume whose publish created a target; only what
/// carries it is removed by unpublish. `trusted.*` needs CAP_SYS_ADMIN to write
/// (Documentation/filesystems: xattr(7)), so nobody without it can forge the mark.
pub const PUBLISHED_BY: &str = "trusted.gds-csi.published";

pub(super) fn get_mark(fd: BorrowedFd<'_>) -> Option<String> {
    let path = CString::new(fd_path(fd).as_os_str().as_bytes()).ok()?;
    let name = CString::new(PUBLISHED_BY).ok()?;
    let mut buf = [0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given. getxattr
    // follows the /proc/self/fd magic link to the descriptor's own inode.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    usize::try_from(n)
        .ok()
        .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
}

pub(super) fn set_mark(fd: BorrowedFd<'_>, value: &str) -> std::result::Result<(), Errno> {
    let path = CString::new(fd_path(fd).as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let name = CString::new(PUBLISHED_BY).map_err(|_| Errno::EINVAL)?;
    // SAFETY: valid NUL-terminated strings and a value buffer of the length given.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    Errno::result(rc).map(drop)
}
