//! Unmounts of pinned paths, in this process: umount2(2) through the sys-mount crate on
//! `/proc/self/fd/...` paths (umount(8) would resolve the path again).

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::{fd_path, Anchored};
use crate::error::{Error, Result};

/// UMOUNT_NOFOLLOW (8, include/linux/fs.h): a final component that is a symlink is not
/// followed. NOT sys-mount's `UnmountFlags::NOFOLLOW`: sys-mount 3.1 defines that as
/// O_NOFOLLOW (0x20000), which `ksys_umount` (fs/namespace.c) refuses with EINVAL as an
/// unknown flag; read above as "nothing mounted", every unmount would have been skipped.
fn umount_nofollow() -> sys_mount::UnmountFlags {
    sys_mount::UnmountFlags::from_bits_retain(libc::UMOUNT_NOFOLLOW)
}

/// Unmounts the topmost mount at the pinned `target`: its name looked up in the pinned
/// parent, not followed if it is a symlink. `Ok(false)`: nothing was mounted there.
pub fn unmount(target: &Anchored) -> Result<bool> {
    let Some(pin) = &target.pin else {
        return Ok(false);
    };
    let at = fd_path(pin.parent.as_fd()).join(OsStr::from_bytes(pin.name.as_bytes()));
    match sys_mount::unmount(&at, umount_nofollow()) {
        Ok(()) => Ok(true),
        // Not a mount root (fs/namespace.c path_umount -> can_umount): nothing mounted.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => Ok(false),
        Err(e) => Err(Error::io("unmounting", target.path(), e)),
    }
}
