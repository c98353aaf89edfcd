//! Mounts onto a pinned descriptor: `mount(2)` through `/proc/self/fd/N` for filesystems,
//! and the new mount API (`open_tree`, `mount_setattr`, `move_mount`) for bind mounts, so a
//! bind appears with its final attributes at once. The targets come from [`super::safepath`].
//!
//! In this process, since mount(8) would resolve the path again. mount(2) goes through the
//! sys-mount crate, handed `/proc/self/fd/...` paths (it passes them to the kernel as they
//! are). The bind stays on raw syscalls: sys-mount wraps only mount(2)/umount2(2), and a
//! bind through mount(2) would appear with the source's attributes first and take
//! `ro`/`nosuid`/... only from a second MS_REMOUNT|MS_BIND call, a window in which a
//! read-only publish is writable.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use sys_mount::MountFlags;

use super::safepath::Anchored;
use crate::error::{Error, Result};

/// Bits of `struct mount_attr` and the new mount API (include/uapi/linux/mount.h).
const MOUNT_ATTR_RDONLY: u64 = 0x01;
const MOUNT_ATTR_NOSUID: u64 = 0x02;
const MOUNT_ATTR_NODEV: u64 = 0x04;
const MOUNT_ATTR_NOEXEC: u64 = 0x08;
const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
const MOUNT_ATTR_NOATIME: u64 = 0x10;
const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
const MOUNT_ATTR_NODIRATIME: u64 = 0x80;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// MS_LAZYTIME (include/uapi/linux/mount.h), which sys-mount's flags do not name.
const MS_LAZYTIME: MountFlags = MountFlags::from_bits_retain(libc::MS_LAZYTIME);

/// Mount options split as mount(8) does into `mount(2)` flags and the filesystem's own
/// data string (util-linux libmount/src/optmap.c, `linux_flags_map`). Userspace-only
/// options (`defaults`, `nofail`, `x-*`, ...) are dropped.
pub fn split_options(options: &[&str]) -> (MountFlags, String) {
    let mut flags = MountFlags::empty();
    let mut data = Vec::new();
    for &o in options {
        let (set, clear) = match o {
            "ro" => (MountFlags::RDONLY, MountFlags::empty()),
            "rw" => (MountFlags::empty(), MountFlags::RDONLY),
            "nosuid" => (MountFlags::NOSUID, MountFlags::empty()),
            "suid" => (MountFlags::empty(), MountFlags::NOSUID),
            "nodev" => (MountFlags::NODEV, MountFlags::empty()),
            "dev" => (MountFlags::empty(), MountFlags::NODEV),
            "noexec" => (MountFlags::NOEXEC, MountFlags::empty()),
            "exec" => (MountFlags::empty(), MountFlags::NOEXEC),
            "sync" => (MountFlags::SYNCHRONOUS, MountFlags::empty()),
            "async" => (MountFlags::empty(), MountFlags::SYNCHRONOUS),
            "dirsync" => (MountFlags::DIRSYNC, MountFlags::empty()),
            "noatime" => (MountFlags::NOATIME, MountFlags::empty()),
            "atime" => (MountFlags::empty(), MountFlags::NOATIME),
            "nodiratime" => (MountFlags::NODIRATIME, MountFlags::empty()),
            "diratime" => (MountFlags::empty(), MountFlags::NODIRATIME),
            "relatime" => (MountFlags::RELATIME, MountFlags::empty()),
            "norelatime" => (MountFlags::empty(), MountFlags::RELATIME),
            "strictatime" => (MountFlags::STRICTATIME, MountFlags::empty()),
            "nostrictatime" => (MountFlags::empty(), MountFlags::STRICTATIME),
            "lazytime" => (MS_LAZYTIME, MountFlags::empty()),
            "nolazytime" => (MountFlags::empty(), MS_LAZYTIME),
            "silent" => (MountFlags::SILENT, MountFlags::empty()),
            "loud" => (MountFlags::empty(), MountFlags::SILENT),
            "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "nofail" | "_netdev" => {
                (MountFlags::empty(), MountFlags::empty())
            }
            other if other.starts_with("x-") || other.starts_with("X-") => {
                (MountFlags::empty(), MountFlags::empty())
            }
            other => {
                data.push(other);
                (MountFlags::empty(), MountFlags::empty())
            }
        };
        flags = (flags | set) - clear;
    }
    (flags, data.join(","))
}

/// The per-mount attributes a bind mount takes from `options` (a bind ignores the
/// filesystem's own options, as `mount --bind -o` does).
fn bind_attrs(options: &[&str]) -> MountAttr {
    let mut a = MountAttr {
        attr_set: 0,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    for &o in options {
        match o {
            "ro" => a.attr_set |= MOUNT_ATTR_RDONLY,
            "nosuid" => a.attr_set |= MOUNT_ATTR_NOSUID,
            "nodev" => a.attr_set |= MOUNT_ATTR_NODEV,
            "noexec" => a.attr_set |= MOUNT_ATTR_NOEXEC,
            "nodiratime" => a.attr_set |= MOUNT_ATTR_NODIRATIME,
            "noatime" | "strictatime" | "relatime" => {
                a.attr_clr |= MOUNT_ATTR_ATIME_MASK;
                a.attr_set = (a.attr_set & !MOUNT_ATTR_ATIME_MASK)
                    | match o {
                        "noatime" => MOUNT_ATTR_NOATIME,
                        "strictatime" => MOUNT_ATTR_STRICTATIME,
                        _ => 0,
                    };
            }
            _ => {}
        }
    }
    a
}

/// `mount(2)` of `device` onto the pinned `target`, through `/proc/self/fd/N`: the kernel
/// follows that magic link to the directory the descriptor holds, whatever the path's
/// components hold by now.
pub fn mount_fs(device: &Path, target: &Anchored, fs: &str, options: &[&str]) -> Result<()> {
    let (flags, data) = split_options(options);
    // An explicit type: without one sys-mount tries every filesystem the kernel knows.
    let mut mount = sys_mount::Mount::builder()
        .fstype(sys_mount::FilesystemType::Manual(fs))
        .flags(flags);
    if !data.is_empty() {
        mount = mount.data(&data);
    }
    // The returned handle unmounts nothing when dropped (only its UnmountDrop does).
    mount
        .mount(device, target.syscall_path())
        .map(drop)
        .map_err(|e| Error::io("mounting", target.path(), e))
}

/// A bind mount of `source` onto `target` that appears with its final attributes at
/// once: `open_tree(OPEN_TREE_CLONE)` of the source, `mount_setattr` on the detached
/// copy, `move_mount` onto the target's descriptor (fs/namespace.c; Linux 5.12+).
pub fn bind(source: &Anchored, target: &Anchored, options: &[&str]) -> Result<()> {
    let fail = |what: &'static str, e: Errno| Error::io(what, target.path(), e.into());
    let (src_dir, src_path, src_flags) = match source.fd() {
        Some(fd) => (
            fd.as_raw_fd(),
            CString::default(),
            libc::AT_EMPTY_PATH as libc::c_uint,
        ),
        None => (
            libc::AT_FDCWD,
            CString::new(source.path().as_os_str().as_bytes())
                .map_err(|_| fail("binding", Errno::EINVAL))?,
            0,
        ),
    };
    // SAFETY: a valid descriptor or AT_FDCWD and a NUL-terminated path.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src_dir,
            src_path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | src_flags,
        )
    };
    let tree = Errno::result(tree).map_err(|e| fail("cloning the mount for", e))?;
    // SAFETY: open_tree just returned this descriptor and nothing else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = bind_attrs(options);
    if attr.attr_set != 0 || attr.attr_clr != 0 {
        // SAFETY: a valid descriptor, an empty path with AT_EMPTY_PATH, and a
        // mount_attr of the size given.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        Errno::result(rc).map_err(|e| fail("setting mount attributes of", e))?;
    }
    let target_fd = target
        .fd()
        .ok_or_else(|| fail("binding onto", Errno::EINVAL))?;
    // SAFETY: two valid descriptors and empty paths with the *_EMPTY_PATH flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target_fd.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    Errno::result(rc).map_err(|e| fail("bind mounting onto", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_into_flags_and_data_as_mount8_does() {
        let (flags, data) = split_options(&[
            "data=ordered",
            "ro",
            "noatime",
            "nosuid",
            "defaults",
            "x-kubelet.io=1",
            "discard",
        ]);
        assert_eq!(
            flags,
            MountFlags::RDONLY | MountFlags::NOATIME | MountFlags::NOSUID
        );
        assert_eq!(data, "data=ordered,discard");
        // The later option wins, as in mount(8).
        let (flags, data) = split_options(&["ro", "rw", "noexec", "exec"]);
        assert_eq!(flags, MountFlags::empty());
        assert!(data.is_empty());
    }

    #[test]
    fn bind_attributes_carry_the_per_mount_flags_only() {
        let a = bind_attrs(&["ro", "nodev", "discard", "noatime"]);
        assert_eq!(
            a.attr_set,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME
        );
        assert_eq!(a.attr_clr, MOUNT_ATTR_ATIME_MASK);
        let none = bind_attrs(&["discard"]);
        assert_eq!((none.attr_set, none.attr_clr), (0, 0));
    }
}
