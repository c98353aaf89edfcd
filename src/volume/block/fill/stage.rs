//! NodeStage of a clone: what copy the volume still needs, and that copy made as a job
//! a retry joins (a filesystem clone's file by file from its mounted source).

use std::sync::Arc;

use super::files::fill;
use super::leftovers::take_down_idle_leftovers;
use super::raw::raw_fill;
use super::volume::block_source;
use super::volume::refuse_in_use;
use super::{
    copy_dir, copy_request, done, is_raw_clone, last_pass_owed, progress_path, STAGE_WAIT,
};
use crate::error::{CloneError, Error, Result};
use crate::os::{FsType, MountEntry};
use crate::request::{Access, Capability};
use crate::volume::block::fill::mount::SourceMount;
use crate::volume::block::fill::source::{self, Source};
use crate::volume::block::{BlockBackend, Located};
use crate::volume::copy::{Progress, Saved};

/// A clone's copy still to be made, found by [`pending`].
pub struct Pending {
    key: String,
    source: Source,
    progress: Arc<Progress>,
    raw: bool,
}

impl Pending {
    /// A filesystem clone is filled through its own filesystem, made first.
    pub fn needs_filesystem(&self) -> bool {
        !self.raw
    }
}

/// The fill step's question (`block::fill`): the copy volume `vol` still needs, checked
/// against the capability it is staged or published with; None for every volume that is
/// no clone, a clone filled already, or one whose copy a given-up call left running and
/// that finished while this call waited for it.
pub async fn pending(b: &BlockBackend, vol: &Located, cap: &Capability) -> Result<Option<Pending>> {
    let raw = vol.id.to_string();
    let Some(source) = source::of_record(&vol.record)? else {
        return Ok(None);
    };
    let raw_clone = is_raw_clone(&vol.record);
    if raw_clone && cap.access == Access::Mount {
        // Its device holds the source's bytes: a mount would find no filesystem of its
        // own and format over them.
        return Err(Error::invalid(
            "volume_capability",
            format!(
                "volume {raw} is a raw block clone (its device holds its source's bytes, no \
                 filesystem of its own): stage and publish it with block access"
            ),
        ));
    }
    let key = format!("clone:{raw}");
    let progress = b
        .clones
        .progress(&key, &raw, progress_path(b, &raw), source.label());
    take_down_idle_leftovers(b, &key, &raw, &progress).await?;
    if done(b, &raw)? {
        return Ok(None);
    }
    let on_nfs = match &source {
        Source::Nfs { .. } => true,
        Source::Snapshot { id, .. } => id.nfs_dir("").is_some(),
        _ => false,
    };
    if let (true, false) = (on_nfs, b.nfs_sources) {
        let label = source.label();
        return Err(CloneError::NfsSourceDisabled {
            volume: raw,
            label: label.to_owned(),
        }
        .into());
    }
    if !raw_clone && cap.access == Access::Block {
        return Err(Error::invalid(
            "volume_capability",
            format!(
                "volume {raw} is a filesystem clone, filled file by file through its \
                 filesystem: stage it with mount access"
            ),
        ));
    }
    // A copy a given-up call left running: wait for it, do not start another.
    match tokio::time::timeout(STAGE_WAIT, b.clones.jobs.join(&key)).await {
        Ok(Some(outcome)) => return outcome.map(|()| None),
        Ok(None) => {}
        Err(_) => return Err(Error::NotReady(progress.message())),
    }
    Ok(Some(Pending {
        key,
        source,
        progress,
        raw: raw_clone,
    }))
}

/// Makes the pending copy into `vol` (a filesystem clone formatted already), verified,
/// as a job a retry joins.
pub async fn run(b: &BlockBackend, vol: &mut Located, fs: FsType, pending: Pending) -> Result<()> {
    let Pending {
        key,
        source,
        progress,
        raw: raw_clone,
    } = pending;
    if let Source::Empty { label } = &source {
        // A snapshot of a volume that held nothing: the volume as allocated.
        return progress.set(Saved {
            source: label.clone(),
            done: true,
            ..Saved::default()
        });
    }
    if raw_clone {
        let job = raw_fill(b, vol, &source, &progress)?;
        return b.clones.run(&key, &progress, STAGE_WAIT, job).await;
    }
    let raw = vol.id.to_string();
    let dir = copy_dir(b, &raw);
    let mounts = b.mounter.mount_table()?;
    refuse_in_use(b, vol, Some(&dir), &mounts, "clone")
        .inspect_err(crate::metrics::clone::failed)?;
    let Some(from) = source_mount(b, &source, &dir, &mounts)? else {
        // A block source never staged: an empty filesystem, which mkfs just made.
        return progress.set(Saved {
            source: source.label().to_owned(),
            done: true,
            ..Saved::default()
        });
    };
    b.verify_located(vol)?;
    let mut req = copy_request(&source, &vol.record);
    // A live copy from the source in use was left without its frozen last pass: the clone
    // may hold files the source no longer has, so the copy resumes only over the same walk
    // and otherwise starts over on an emptied target.
    let owed = last_pass_owed(progress.path());
    req.target_reused = owed.exists();
    let job = fill(
        Arc::clone(&b.mounter.host),
        dir,
        from,
        (vol.device.path.clone(), fs),
        req,
        Arc::clone(&progress),
        raw.clone(),
    );
    let job = async move {
        job.await?;
        match std::fs::remove_file(&owed) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io("removing", &owed, e))
            }
            _ => Ok(()),
        }
    };
    b.clones.run(&key, &progress, STAGE_WAIT, job).await
}

/// How the copy mounts `source`; None when there is nothing to copy.
fn source_mount(
    b: &BlockBackend,
    source: &Source,
    dir: &std::path::Path,
    mounts: &[MountEntry],
) -> Result<Option<SourceMount>> {
    match source {
        Source::Block { id, .. } => block_source(b, id, dir, mounts),
        // Unlike a block volume, an NFS directory is shared: pods on other nodes may
        // have it mounted, and this node's stage of it is a separate NFS mount, not a
        // second mount of one local superblock. It is never refused for being in use;
        // a tree that changes during the copy is what any reader of a shared dataset
        // sees, and the copy verifies sizes (and checksums when asked) at its end.
        Source::Nfs { id, label } => Ok(Some(SourceMount::Nfs {
            id: id.clone(),
            label: label.clone(),
        })),
        Source::Snapshot { id, label } => Ok(Some(match id.nfs_dir("") {
            Some(dir) => SourceMount::NfsSnapshot {
                dir,
                id: id.clone(),
                label: label.clone(),
            },
            None => SourceMount::Tree { id: id.clone() },
        })),
        Source::Empty { .. } => Ok(None),
        // CreateVolume and NodeStage refuse it: a raw block snapshot restores only raw.
        Source::Image { label, .. } => Err(CloneError::ImageNeedsBlock {
            label: label.clone(),
        }
        .into()),
    }
}
