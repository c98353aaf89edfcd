//! The timing wrapper around the host port: every host operation that runs a command or
//! mounts is observed in `gds_csi_host_operation_duration_seconds{operation}`, whatever its
//! outcome. `main` wraps the real host in it, so the port itself knows nothing of metrics.
//!
//! Every `Host` method is forwarded, those with a default body included (a missing forward
//! would silently fall back to the default): a new `Host` method needs one forwarding method
//! here.

use std::ffi::OsStr;
use std::path::Path;

use async_trait::async_trait;

use crate::error::Result;
use crate::metrics::host_timer;
use crate::os::{
    Anchored, DeviceHold, FileKind, ForceUnmount, FsType, FsUsage, Host, MountEntry, Signature,
    StripeGeometry,
};

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
