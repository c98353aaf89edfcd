//! A filesystem clone filled at its CreateVolume from its source's own mount, with the
//! source's filesystem frozen for the copy (a pod uses the source now).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::check::refuse_in_use;
use super::files::open_dir;
use super::{
    copy_dir, copy_request, count_outcome, done, is_raw_clone, on_blocking_pool, progress_path,
    record_not_filled, short, STAGE_WAIT,
};
use crate::error::{CloneError, Error, Result};
use crate::metrics::clone::Cause;
use crate::os::{FsType, Host, MountEntry};
use crate::request::{self, VolumeRef};
use crate::volume::block::clone_source::{self, Source};
use crate::volume::block::{BlockBackend, Located};
use crate::volume::copy::{CopyRequest, Progress};
use crate::volume::id::BlockVolumeId;
use crate::volume::mounts::private::{clean_copy_dir, pin, unmount_retrying};

/// CreateVolume of a filesystem clone whose source is mounted on this node now (a pod
/// uses it): the clone is filled here, from the source's own mount (a second mount of a
/// mounted ext4 or xfs would share its live superblock) with the source's filesystem
/// frozen for the copy, so the clone is the source as it was at CreateVolume. A job
/// under the copy's key, which a retry joins. A source not mounted: Ok, its clone is
/// filled at its first NodeStage, or the source's, whichever comes first.
pub async fn fill_from_mounted_source(b: &BlockBackend, id: &BlockVolumeId) -> Result<()> {
    let raw = id.to_string();
    let Some(MountedSource {
        source,
        origin,
        mut located,
        mounts,
        at,
        dev,
    }) = mounted_source(b, &raw)?
    else {
        return Ok(());
    };
    if id.layout == crate::volume::id::IdLayout::Stripe {
        // A stripe clone's md array runs only while it is staged: it is filled at its
        // first NodeStage, from a source nothing uses then.
        return Err(CloneError::StripeSourceInUse { origin, at }.into());
    }
    let mut vol = b.locate(id)?;
    let key = format!("clone:{raw}");
    let progress = b
        .clones
        .progress(&key, &raw, progress_path(b, &raw), source.label());
    match tokio::time::timeout(STAGE_WAIT, b.clones.jobs.join(&key)).await {
        Ok(Some(outcome)) => return outcome,
        Ok(None) => {}
        Err(_) => return Err(Error::NotReady(progress.message())),
    }
    let fs = vol.record.fs_type;
    crate::volume::block::format::format_if_blank(b, &mut vol, fs).await?;
    let dir = copy_dir(b, &raw);
    refuse_in_use(b, &vol, Some(&dir), &mounts, "clone")
        .inspect_err(crate::metrics::clone::failed)?;
    b.verify_located(&mut located)?;
    b.verify_located(&mut vol)?;
    tracing::info!(volume_id = %raw, source = %origin, at = %at.display(),
        "filling the clone now from its source's mount, frozen for the copy");
    let job = fill_frozen(
        Arc::clone(&b.mounter.host),
        (b.pool.state_dir().to_owned(), dir),
        (at, dev),
        (vol.device.path.clone(), fs),
        copy_request(&source, &vol.record),
        Arc::clone(&progress),
        raw.clone(),
    );
    b.clones.run(&key, &progress, STAGE_WAIT, job).await
}

/// A filesystem clone's block source, mounted on this node now.
struct MountedSource {
    source: Source,
    /// The source volume's id, as recorded.
    origin: String,
    located: Located,
    mounts: Vec<MountEntry>,
    /// The root of the source's filesystem mounted here.
    at: PathBuf,
    /// The source device's (major, minor).
    dev: (u32, u32),
}

/// The mounted source of volume `raw`; None when it is no filesystem clone of a block
/// volume, is filled already, or its source is mounted nowhere here.
fn mounted_source(b: &BlockBackend, raw: &str) -> Result<Option<MountedSource>> {
    // From the record first: most volumes are no clone, and a stripe's device exists only
    // while it is staged, so locating it here would fail its CreateVolume.
    let Some(record) = b.pool.state.snapshot().get(raw).cloned() else {
        return Ok(None);
    };
    let Some(source) = clone_source::of_record(&record)? else {
        return Ok(None);
    };
    let Source::Block(src_raw) = &source else {
        return Ok(None);
    };
    if is_raw_clone(&record) || done(b, raw)? {
        return Ok(None);
    }
    let VolumeRef::Block(src_id) = request::volume_ref(src_raw)? else {
        return Ok(None);
    };
    // A source whose device is not here now (a stripe not staged) is mounted nowhere.
    let Ok(located) = b.locate(&src_id) else {
        return Ok(None);
    };
    let mounts = b.mounter.mount_table()?;
    let dev = (located.device.major, located.device.minor);
    let Some(at) = b.mounter.filesystem_root(&mounts, dev.0, dev.1) else {
        return Ok(None);
    };
    Ok(Some(MountedSource {
        origin: src_raw.clone(),
        source,
        located,
        mounts,
        at,
        dev,
    }))
}

/// The job of `fill_from_mounted_source`: the clone mounted in `dir`, the source's mount
/// root `at` opened and checked as device `dev`'s, frozen, copied from, thawed (the
/// guard thaws on every path, a panic included), the clone unmounted.
async fn fill_frozen(
    host: Arc<dyn Host>,
    (state_dir, dir): (PathBuf, PathBuf),
    (at, dev): (PathBuf, (u32, u32)),
    (dst_dev, dst_fs): (PathBuf, FsType),
    mut req: CopyRequest,
    progress: Arc<Progress>,
    volume: String,
) -> Result<()> {
    clean_copy_dir(host.as_ref(), &dir).await?;
    let dst_at = pin(&dir, "target")?;
    host.mount(&dst_dev, &dst_at, dst_fs, &[])
        .await
        .inspect_err(|_| crate::metrics::clone::failed_because(Cause::Mount))?;
    let copied = async {
        let (src, dst) = (open_dir(&at)?, open_dir(dst_at.path())?);
        let st = nix::sys::stat::fstat(&src).map_err(|e| Error::io("stat", &at, e.into()))?;
        if (libc::major(st.st_dev), libc::minor(st.st_dev)) != dev {
            return Err(CloneError::SourceMountGone { at: at.clone() }.into());
        }
        (req.source, req.target) = (at.clone(), dst_at.path().to_owned());
        let p = Arc::clone(&progress);
        let name = short(&volume);
        on_blocking_pool(move || copy_frozen(&state_dir, &name, dev, (src, dst), &req, &p)).await
    }
    .await;
    let outcome = copied.and(unmount_retrying(host.as_ref(), &dst_at).await);
    if outcome.is_err() {
        // Not filled until the clone's mount is down (see `fill`).
        let _ = record_not_filled(&progress);
    }
    count_outcome(&volume, &progress, &outcome);
    outcome
}

/// Copies the tree from the source's mount root `src` into `dst` with the source's
/// filesystem frozen, thawed when the copy returns.
fn copy_frozen(
    state_dir: &Path,
    name: &str,
    dev: (u32, u32),
    (src, dst): (OwnedFd, OwnedFd),
    req: &CopyRequest,
    progress: &Progress,
) -> Result<()> {
    let root = src
        .try_clone()
        .map_err(|e| Error::io("open", &req.source, e))?;
    let frozen =
        crate::volume::block::freeze::Frozen::freeze(state_dir, name, root, dev, &req.source)?;
    let copied =
        crate::volume::copy::copy_tree_at(src.as_fd(), dst.as_fd(), req, progress).map(drop);
    drop(frozen);
    copied
}
