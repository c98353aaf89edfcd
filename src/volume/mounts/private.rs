//! A copy's private mounts: the directory in the state dir where a copy (a clone's fill, a
//! snapshot's take) mounts its source and target, made clean before a copy, its mounts
//! taken down after one, and those a killed driver left behind found and taken down. An
//! NFS source is taken off without a stat of its mount point, which would wait for a
//! server that is gone.

use std::path::Path;
use std::time::Duration;

use crate::error::{CloneError, Error, Result};
use crate::os::safepath::{self, Create};
use crate::os::{Anchored, ForceUnmount, Host, MountEntry};

/// The copy's private directory, made if missing and with nothing mounted in it: a driver
/// killed mid-copy may have left its mounts there.
pub async fn clean_copy_dir(host: &dyn Host, dir: &Path) -> Result<()> {
    host.create_dir_all(dir)?;
    take_down(host, dir, "source").await?;
    take_down(host, dir, "target").await
}

/// Unmounts what is mounted at `<dir>/<name>` (left by a driver killed mid-copy).
pub async fn take_down(host: &dyn Host, dir: &Path, name: &str) -> Result<()> {
    if take_down_nfs(host, &dir.join(name)).await? {
        return Ok(());
    }
    let mounts = host.mount_table()?;
    if crate::os::mount::at(&mounts, &dir.join(name)).is_some() {
        // Pinned after the mount: its own descriptor of the mount root would keep it busy.
        let at = pin(dir, name)?.without_final();
        unmount_retrying(host, &at).await?;
    }
    Ok(())
}

/// How long an unmount of the copy's private mounts retries while it is busy.
const BUSY_RETRY: Duration = Duration::from_secs(5);

/// Unmounts a private copy mount, retrying a while on EBUSY. Nothing of the driver's
/// holds it once the copy has returned, but a holder may be transient: a process of
/// this mount namespace whose working directory or open file lies under it for a
/// moment (a host-exec process that entered the namespace, a tree scanner), or a child
/// the driver forked meanwhile for another volume that holds the copy's descriptors
/// until it execs.
pub async fn unmount_retrying(host: &dyn Host, at: &Anchored) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match unmount(host, at).await {
            Err(e) if is_busy(&e) && started.elapsed() < BUSY_RETRY => {
                tracing::info!(at = %at.path().display(), "copy mount busy; unmounting again shortly");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

fn is_busy(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } => source.raw_os_error() == Some(libc::EBUSY),
        Error::Shared(inner) => is_busy(inner),
        _ => false,
    }
}

pub fn pin(dir: &Path, name: &str) -> Result<Anchored> {
    let path = dir.join(name);
    let root = dir.parent().unwrap_or(dir).to_owned();
    safepath::open("clone directory", &[root], &path, Create::Dir, None)?
        .ok_or_else(|| CloneError::WorkDirNotMade { path }.into())
}

pub fn mounted_at(host: &dyn Host, at: &Path) -> Option<MountEntry> {
    let mounts = host.mount_table().ok()?;
    crate::os::mount::at(&mounts, at).cloned()
}

/// Unmounts the source; an NFS mount whose server is gone is taken off lazily (its
/// reads have failed already; nothing of it is written).
pub async fn unmount(host: &dyn Host, at: &Anchored) -> Result<()> {
    let nfs = mounted_at(host, at.path()).is_some_and(|m| m.fs_type.starts_with("nfs"));
    match host.unmount(at).await {
        Err(e) if nfs => {
            tracing::warn!(at = %at.path().display(), error = %e, "NFS source unmount failed; lazily");
            host.unmount_forced(at.path(), ForceUnmount::Lazy).await
        }
        other => other,
    }
}

/// A leftover NFS mount at `path` (a driver killed mid-copy): taken off without a stat of
/// the mount point, which would wait for a dead server.
pub async fn take_down_nfs(host: &dyn Host, path: &Path) -> Result<bool> {
    match mounted_at(host, path) {
        Some(m) if m.fs_type.starts_with("nfs") => {
            if host
                .unmount_forced(path, ForceUnmount::Force)
                .await
                .is_err()
            {
                host.unmount_forced(path, ForceUnmount::Lazy).await?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}
