//! The host port's (`os`) own failures, named by cause. The port never picks a gRPC code:
//! `error/mod.rs` maps these once, with every other error.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// blkid or wipefs could not say what the device holds.
    #[error(
        "signature probe of {} failed ({why}); a device whose contents are unknown is never \
         formatted: check that the device is readable and that blkid and wipefs are installed",
        device.display()
    )]
    ProbeFailed { device: PathBuf, why: String },
    /// Mounted, claimed by md or device-mapper, or opened exclusively elsewhere.
    #[error(
        "{} is in use (mounted, claimed by md or device-mapper, or opened exclusively by \
         another program such as an mkfs still running from an earlier driver process); it is \
         not formatted or erased while in use: find the holder with `fuser -v {0}`, \
         `ls /sys/class/block/{name}/holders` and the mount table",
        device.display()
    )]
    DeviceInUse { device: PathBuf, name: String },
    /// util-linux's block-device lock is held (systemd-udevd probing after a write, say).
    #[error(
        "{} is locked by another program (util-linux's block-device lock, flock); retry when \
         it is done",
        device.display()
    )]
    DeviceLocked { device: PathBuf },
    /// A mount or unmount task on the blocking pool ended without an answer.
    #[error("{what}: {why}")]
    TaskFailed { what: String, why: String },
    /// The erase task ended without an answer (panicked or cancelled).
    #[error("the erase task ended abnormally: {0}")]
    EraseInterrupted(String),
    /// A mount syscall an earlier call made on this path has not returned.
    #[error(
        "a mount or unmount of {} made by an earlier call is still running in the kernel (it \
         outlived --mount-timeout, or its call was cancelled); retry once it has finished, and \
         check dmesg and the device if it never does",
        path.display()
    )]
    MountInFlight { path: PathBuf },
    /// resize2fs of a mounted ext4 failed in a process without CAP_SYS_RESOURCE (linux
    /// fs/ext4/resize.c ext4_resize_begin answers EPERM without it).
    #[error(
        "{why}; growing a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks \
         (linux fs/ext4/resize.c ext4_resize_begin answers EPERM without it): run the node \
         plugin privileged"
    )]
    GrowNeedsCapability { why: String },
    /// A host port with no md (stripe volumes need it).
    #[error("this host port runs no mdadm (stripe volumes need md RAID0)")]
    NoMdadm,
}
