//! What the driver does to the host, behind one small trait.
//!
//! The trait and the values it speaks in are here, with `TimedHost`, the wrapper that
//! observes every operation that runs a command or mounts in
//! `gds_csi_host_operation_duration_seconds{operation}` whatever its outcome (`main` wraps
//! the real host in it, so the port itself knows nothing of metrics); `real` holds the
//! implementation on the real host.
//!
//! `TimedHost` forwards every `Host` method, those with a default body included (a missing
//! forward would silently fall back to the default): a new `Host` method needs one
//! forwarding method there.

mod real;
use super::blockdev::Signature;
use super::mkfs::{FsType, StripeGeometry};
use super::mount::MountEntry;
use super::safepath::Anchored;
use crate::error::HostError;
use crate::error::Result;
use crate::metrics::host_timer;
use async_trait::async_trait;
pub use real::RealHost;
use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;

/// An exclusive hold on a block device for one destructive step (probe again, then mkfs
/// or erase); released when dropped. See [`Host::hold_device`].
#[must_use]
pub struct DeviceHold {
    _lock: Option<nix::fcntl::Flock<File>>,
}

impl DeviceHold {
    /// The hold of a host that has no real device to lock (a test double).
    pub fn nothing_to_lock() -> Self {
        DeviceHold { _lock: None }
    }
}

#[async_trait]
pub trait Host: Send + Sync + 'static {
    fn mount_table(&self) -> Result<Vec<MountEntry>>;
    /// Every signature on the device. An error means "unknown", never "empty".
    async fn probe_signatures(&self, device: &Path) -> Result<Vec<Signature>>;
    /// Takes the device for a destructive step: fails when another program holds it
    /// (util-linux's lock, a mount, md/dm, or an exclusive open such as a running mkfs),
    /// and keeps cooperating programs out until the hold is dropped.
    fn hold_device(&self, device: &Path) -> Result<DeviceHold>;
    /// mkfs with the filesystem's UUID, aligned to `stripe` when the device is an md array.
    async fn mkfs(
        &self,
        device: &Path,
        fs: FsType,
        uuid: &str,
        stripe: Option<StripeGeometry>,
    ) -> Result<()>;
    async fn wipe_signatures(&self, device: &Path) -> Result<()>;
    /// Grows the filesystem on `device`, mounted at `mount_point`, online to fill the
    /// device: `resize2fs <device>` (ext4), `xfs_growfs <mount_point>` (xfs). Done
    /// already when it fills the device.
    async fn grow_filesystem(&self, device: &Path, mount_point: &Path, fs: FsType) -> Result<()>;
    /// Makes every block of the device read back as zeros (the erase on delete).
    async fn zero_device(&self, device: &Path) -> Result<()>;
    /// Mounts `device` onto `target`, which is pinned (`safepath::open`) when it is a
    /// caller's path: the real host mounts onto the descriptor, doubles use `path()`.
    async fn mount(
        &self,
        device: &Path,
        target: &Anchored,
        fs: FsType,
        options: &[String],
    ) -> Result<()>;
    async fn bind_mount(
        &self,
        source: &Anchored,
        target: &Anchored,
        options: &[String],
    ) -> Result<()>;
    /// Unmounts the topmost mount at `target`; nothing mounted there is success.
    async fn unmount(&self, target: &Anchored) -> Result<()>;
    /// `umount -f` or `umount -l` of a mount whose plain unmount hung (an NFS server
    /// gone, see mounts/unmount.rs).
    async fn unmount_forced(&self, target: &Path, how: ForceUnmount) -> Result<()>;
    /// `mount -t nfs -o <options> <source> <target>` under the mount deadline. `source`
    /// is `server:/path`, already checked.
    async fn mount_nfs(&self, source: &str, target: &Path, options: &[String]) -> Result<()>;
    /// Creates a directory of the driver's own (below its state dir) with its parents.
    fn create_dir_all(&self, path: &Path) -> Result<()>;
    /// What `path` is, following symlinks; `None` when nothing is there.
    fn stat(&self, path: &Path) -> Result<Option<FileKind>>;
    /// The usage of the filesystem mounted at `path`. Blocking: on NFS it asks the
    /// server, so callers run it under a deadline.
    fn statvfs(&self, path: &Path) -> Result<FsUsage>;
    /// `mdadm <args>` under the command deadline, its output whatever its exit status
    /// (the md port, `crate::disk::md`, builds the arguments and reads the answer). Hosts
    /// without md refuse.
    async fn mdadm(&self, args: &[&OsStr]) -> Result<std::process::Output> {
        let _ = args;
        Err(HostError::NoMdadm.into())
    }
}

/// What a path is, as [`Host::stat`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Dir,
    File,
    BlockDevice,
    Other,
}

/// A filesystem's size and use (statvfs(3)), in bytes and inodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Free to unprivileged users.
    pub available_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub available_inodes: u64,
}

/// How a hung unmount is escalated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceUnmount {
    /// MNT_FORCE: the filesystem aborts pending requests first (NFS: its RPCs).
    Force,
    /// MNT_DETACH: detached from the tree now, released once no longer busy.
    Lazy,
}

/// `inner`, with its operations timed.
pub struct TimedHost<H> {
    inner: H,
}

impl<H: Host> TimedHost<H> {
    pub fn new(inner: H) -> Self {
        TimedHost { inner }
    }
}

/// The `operation` label of an mkfs.
fn mkfs_operation(fs: FsType) -> &'static str {
    match fs {
        FsType::Ext4 => "mkfs.ext4",
        FsType::Xfs => "mkfs.xfs",
    }
}

#[async_trait]
impl<H: Host> Host for TimedHost<H> {
    // Reads of /proc and a non-blocking lock: not timed.
    fn mount_table(&self) -> Result<Vec<MountEntry>> {
        self.inner.mount_table()
    }

    fn hold_device(&self, device: &Path) -> Result<DeviceHold> {
        self.inner.hold_device(device)
    }

    // Directory and inode lookups on request paths: not timed.
    fn create_dir_all(&self, path: &Path) -> Result<()> {
        self.inner.create_dir_all(path)
    }

    fn stat(&self, path: &Path) -> Result<Option<FileKind>> {
        self.inner.stat(path)
    }

    fn statvfs(&self, path: &Path) -> Result<FsUsage> {
        self.inner.statvfs(path)
    }

    async fn probe_signatures(&self, device: &Path) -> Result<Vec<Signature>> {
        let _timer = host_timer("probe_signatures");
        self.inner.probe_signatures(device).await
    }

    async fn mkfs(
        &self,
        device: &Path,
        fs: FsType,
        uuid: &str,
        stripe: Option<StripeGeometry>,
    ) -> Result<()> {
        let _timer = host_timer(mkfs_operation(fs));
        self.inner.mkfs(device, fs, uuid, stripe).await
    }

    async fn grow_filesystem(&self, device: &Path, mount_point: &Path, fs: FsType) -> Result<()> {
        let _timer = host_timer(match fs {
            FsType::Ext4 => "resize2fs",
            FsType::Xfs => "xfs_growfs",
        });
        self.inner.grow_filesystem(device, mount_point, fs).await
    }

    async fn wipe_signatures(&self, device: &Path) -> Result<()> {
        let _timer = host_timer("wipe_signatures");
        self.inner.wipe_signatures(device).await
    }

    async fn zero_device(&self, device: &Path) -> Result<()> {
        let _timer = host_timer("zero_device");
        self.inner.zero_device(device).await
    }

    async fn mount(
        &self,
        device: &Path,
        target: &Anchored,
        fs: FsType,
        options: &[String],
    ) -> Result<()> {
        let _timer = host_timer("mount");
        self.inner.mount(device, target, fs, options).await
    }

    async fn bind_mount(
        &self,
        source: &Anchored,
        target: &Anchored,
        options: &[String],
    ) -> Result<()> {
        let _timer = host_timer("bind_mount");
        self.inner.bind_mount(source, target, options).await
    }

    async fn unmount(&self, target: &Anchored) -> Result<()> {
        let _timer = host_timer("unmount");
        self.inner.unmount(target).await
    }

    async fn unmount_forced(&self, target: &Path, how: ForceUnmount) -> Result<()> {
        let _timer = host_timer("unmount_forced");
        self.inner.unmount_forced(target, how).await
    }

    async fn mount_nfs(&self, source: &str, target: &Path, options: &[String]) -> Result<()> {
        let _timer = host_timer("mount_nfs");
        self.inner.mount_nfs(source, target, options).await
    }

    async fn mdadm(&self, args: &[&OsStr]) -> Result<std::process::Output> {
        let _timer = host_timer("mdadm");
        self.inner.mdadm(args).await
    }
}
