//! A filesystem clone filled at its CreateVolume from its source's own mount, copied live
//! and then with the source's filesystem frozen for the pass over what changed meanwhile
//! (a pod uses the source now).

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::files::open_dir;
use super::volume::refuse_in_use;
use super::{
    copy_dir, copy_request, count_outcome, done, is_raw_clone, last_pass_owed, on_blocking_pool,
    progress_path, record_not_filled, short, STAGE_WAIT,
};
use crate::csi::id::BlockVolumeId;
use crate::error::{CloneError, Error, Result};
use crate::metrics::clone::Cause;
use crate::os::{FsType, Host, MountEntry};
use crate::volume::block::fill::source::{self, Source};
use crate::volume::block::freeze;
use crate::volume::block::{BlockBackend, Located};
use crate::volume::copy::{copy_tree_at, CopyRequest, Progress};
use crate::volume::mounts::private::{clean_copy_dir, pin, unmount_retrying};

/// CreateVolume of a filesystem clone whose source is mounted on this node now (a pod
/// uses it): the clone is filled here, from the source's own mount (a second mount of a
/// mounted ext4 or xfs would share its live superblock), copied live and then again
/// what changed with the source's filesystem frozen, so the clone is the source as it
/// was at its last pass, and the source's writers wait only for that pass. A job
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
    if id.layout == crate::csi::id::IdLayout::Stripe {
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
    crate::volume::block::stage::format_if_blank(b, &mut vol, fs).await?;
    let dir = copy_dir(b, &raw);
    refuse_in_use(b, &vol, Some(&dir), &mounts, "clone")
        .inspect_err(crate::metrics::clone::failed)?;
    b.verify_located(&mut located)?;
    b.verify_located(&mut vol)?;
    tracing::info!(volume_id = %raw, source = %origin, at = %at.display(),
        "filling the clone now from its source's mount: live, then frozen for the last pass");
    let fill = LiveThenFrozen {
        host: Arc::clone(&b.mounter.host),
        state_dir: b.pool.state_dir().to_owned(),
        dir,
        at,
        dev,
        target: (vol.device.path.clone(), fs),
        req: copy_request(&source, &vol.record),
        progress: Arc::clone(&progress),
        volume: raw.clone(),
        freeze_limit: b.freeze_limit,
    };
    b.clones.run(&key, &progress, STAGE_WAIT, fill.run()).await
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
    let Some(source) = source::of_record(&record)? else {
        return Ok(None);
    };
    let Source::Block { id: src_id, .. } = &source else {
        return Ok(None);
    };
    if is_raw_clone(&record) || done(b, raw)? {
        return Ok(None);
    }
    // A source whose device is not here now (a stripe not staged) is mounted nowhere.
    let Ok(located) = b.locate(src_id) else {
        return Ok(None);
    };
    let mounts = b.mounter.mount_table()?;
    let dev = (located.device.major, located.device.minor);
    let Some(at) = b.mounter.filesystem_root(&mounts, dev.0, dev.1) else {
        return Ok(None);
    };
    Ok(Some(MountedSource {
        origin: source.label().to_owned(),
        source,
        located,
        mounts,
        at,
        dev,
    }))
}

/// The job of `fill_from_mounted_source`: the clone mounted in `dir`, the source's mount
/// root `at` opened and checked as device `dev`'s, copied live, then frozen for the pass
/// over what changed meanwhile (thawed on every path, a panic included, and at the freeze
/// limit), the clone unmounted.
struct LiveThenFrozen {
    host: Arc<dyn Host>,
    state_dir: PathBuf,
    dir: PathBuf,
    at: PathBuf,
    dev: (u32, u32),
    /// The clone's device and filesystem.
    target: (PathBuf, FsType),
    req: CopyRequest,
    progress: Arc<Progress>,
    volume: String,
    freeze_limit: Duration,
}

impl LiveThenFrozen {
    async fn run(mut self) -> Result<()> {
        let host = Arc::clone(&self.host);
        clean_copy_dir(host.as_ref(), &self.dir).await?;
        let dst_at = pin(&self.dir, "target")?;
        let (dst_dev, dst_fs) = &self.target;
        host.mount(dst_dev, &dst_at, *dst_fs, &[])
            .await
            .inspect_err(|_| crate::metrics::clone::failed_because(Cause::Mount))?;
        let (volume, progress) = (self.volume.clone(), Arc::clone(&self.progress));
        let copied = async {
            let (src, dst) = (open_dir(&self.at)?, open_dir(dst_at.path())?);
            let st =
                nix::sys::stat::fstat(&src).map_err(|e| Error::io("stat", &self.at, e.into()))?;
            if (libc::major(st.st_dev), libc::minor(st.st_dev)) != self.dev {
                return Err(CloneError::SourceMountGone {
                    at: self.at.clone(),
                }
                .into());
            }
            (self.req.source, self.req.target) = (self.at.clone(), dst_at.path().to_owned());
            on_blocking_pool(move || self.copy(src, dst)).await
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

    /// Copies the tree from the source's mount root `src` into `dst` live, then again what
    /// changed with the source frozen. The live pass records done in the clone's progress
    /// (a retry resumes it only over the same walk, else starts over on an emptied
    /// target), so the clone counts as filled only once the owed last pass is done too.
    fn copy(&self, src: OwnedFd, dst: OwnedFd) -> Result<()> {
        let owed = last_pass_owed(self.progress.path());
        if let Some(dir) = owed.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        }
        crate::runtime::state_dir::write_atomic(&owed, b"")
            .map_err(|e| Error::io("writing", &owed, e))?;
        let live_req = CopyRequest {
            live: true,
            target_reused: true,
            base: None,
            extents: None,
            ..self.req.clone()
        };
        let before = copy_tree_at(src.as_fd(), dst.as_fd(), &live_req, &self.progress)?;
        let delta = self.side_progress("delta");
        let name = short(&self.volume);
        let pass = freeze::Pass {
            state_dir: &self.state_dir,
            name: &name,
            root: &src,
            at: &self.req.source,
            dev: self.dev,
            dst: dst.as_fd(),
            verify: self.req.verify,
            limit: self.freeze_limit,
        };
        let outcome = pass.run(&before, &delta);
        let _ = std::fs::remove_file(delta.path());
        let (_, changes, seconds) =
            outcome?.map_err(|freeze::Overran| CloneError::FreezeOverran {
                volume: self.volume.clone(),
                at: self.req.source.clone(),
                limit_secs: self.freeze_limit.as_secs_f64(),
            })?;
        tracing::info!(volume_id = %self.volume, at = %self.req.source.display(),
            freeze_seconds = seconds, changed = changes.copied, removed = changes.removed,
            "clone of a source in use: froze it for the last pass");
        crate::metrics::clone::frozen(&self.volume, seconds);
        std::fs::remove_file(&owed).map_err(|e| Error::io("removing", &owed, e))
    }

    fn side_progress(&self, pass: &str) -> Progress {
        Progress::new(
            self.progress.path().with_extension(pass),
            self.req.label.clone(),
        )
    }
}
