//! A block clone's private copy directory (`volume::mounts::private`): the mounts a
//! killed driver left there taken down, at DeleteVolume and before a copy resumes.

use std::sync::Arc;
use std::time::Duration;

use super::{copy_dir, STAGE_WAIT};
use crate::error::{CloneError, Result};
use crate::volume::block::BlockBackend;
use crate::volume::copy::Progress;
use crate::volume::mounts::private::take_down;

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
