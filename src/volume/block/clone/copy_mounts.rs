//! The copy's private directory in the state dir, where a file copy mounts its source
//! and target: made clean before a copy, its mounts taken down after one, and those a
//! killed driver left behind found and taken down.

use std::sync::Arc;
use std::time::Duration;

use super::{copy_dir, STAGE_WAIT};
use crate::error::{CloneError, Error, Result};
use crate::os::safepath::{self, Create};
use crate::os::{Anchored, Host};
use crate::volume::block::clone_source;
use crate::volume::block::BlockBackend;
use crate::volume::copy::Progress;

/// Before a clone is deleted: a copy still running refuses the delete; mounts a driver
/// killed mid-copy left in the clone's private directory are taken down (they would
/// hold the clone, and the source, in use for ever).
pub async fn unmount_leftovers(b: &BlockBackend, id: &str) -> Result<()> {
    let key = format!("clone:{id}");
    if tokio::time::timeout(Duration::ZERO, b.clones.jobs.join(&key))
        .await
        .is_err()
    {
        return Err(CloneError::CopyRunning {
            volume: id.to_owned(),
        }
        .into());
    }
    let dir = copy_dir(b, id);
    if !dir.exists() {
        return Ok(());
    }
    for name in ["source", "target"] {
        take_down(b.mounter.host.as_ref(), &dir, name).await?;
        let _ = std::fs::remove_dir(dir.join(name));
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// NodeStage of a clone: mounts left in its private copy directory (a driver killed
/// after the copy, or a take-down that failed) would make the stage find the clone in
/// use there for ever, done or not. Taken down as a job under the copy's key, so no
/// copy starts meanwhile; a copy running now is joined (its own end takes them down).
pub(super) async fn take_down_idle_leftovers(
    b: &BlockBackend,
    key: &str,
    id: &str,
    progress: &Progress,
) -> Result<()> {
    let dir = copy_dir(b, id);
    let mounts = b.mounter.mount_table()?;
    if !mounts.iter().any(|m| m.mount_point.starts_with(&dir)) {
        return Ok(());
    }
    let (host, dir2) = (Arc::clone(&b.mounter.host), dir.clone());
    let job = async move {
        for name in ["source", "target"] {
            take_down(host.as_ref(), &dir2, name).await?;
        }
        tracing::info!(dir = %dir2.display(), "took down mounts left in a clone's copy directory");
        Ok(())
    };
    b.clones.run(key, progress, STAGE_WAIT, job).await
}

/// The copy's private directory, made if missing and with nothing mounted in it: a driver
/// killed mid-copy may have left its mounts there.
pub(crate) async fn clean_copy_dir(host: &dyn Host, dir: &std::path::Path) -> Result<()> {
    host.create_dir_all(dir)?;
    take_down(host, dir, "source").await?;
    take_down(host, dir, "target").await
}

/// Unmounts what is mounted at `<dir>/<name>` (left by a driver killed mid-copy).
pub(crate) async fn take_down(host: &dyn Host, dir: &std::path::Path, name: &str) -> Result<()> {
    if clone_source::take_down_nfs(host, &dir.join(name)).await? {
        return Ok(());
    }
    let mounts = host.mount_table()?;
    if crate::os::mountinfo::at(&mounts, &dir.join(name)).is_some() {
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
pub(crate) async fn unmount_retrying(host: &dyn Host, at: &Anchored) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match clone_source::unmount(host, at).await {
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

pub(crate) fn pin(dir: &std::path::Path, name: &str) -> Result<Anchored> {
    let path = dir.join(name);
    let root = dir.parent().unwrap_or(dir).to_owned();
    safepath::open("clone directory", &[root], &path, Create::Dir, None)?
        .ok_or_else(|| CloneError::WorkDirNotMade { path }.into())
}
