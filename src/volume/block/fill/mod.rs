//! Where a block volume gets its data: the one fill step of a block NodeStage (and of a
//! raw block NodePublish, which a CO may call on a volume staged before a clone of it
//! existed). A volume whose record names a content source it does not hold yet is filled
//! and verified here, before anything mounts or binds it; a filesystem fill formats the
//! volume first, through the one format step of staging. CreateVolume checks the source
//! and records it with the allocation (`pool::RecordedSource`, with whether the fill is a
//! raw block one), so no crash leaves a volume without its source or its kind.
//!
//! One file per source kind, beside what they share: `volume.rs` (another block volume of
//! this node) and `volume_in_use.rs` (one staged here, copied from its own mount),
//! `nfs.rs` (a directory on an NFS export: an NFS volume of this driver), `dataset.rs`
//! (the class's dataset), `snapshot.rs` (a snapshot's tree, image or nothing); `raw.rs`
//! copies bytes (a raw block volume's device, a raw snapshot's image); `source.rs` names
//! the kinds, `mount.rs` mounts one read-only in the volume's private directory; `check.rs`
//! holds the CreateVolume checks every kind passes, `stage.rs` the NodeStage step,
//! `files.rs` the copy of a file tree, `leftovers.rs` the mounts a killed copy left.
//!
//! Two kinds of fill, as the volume's access type asks (Kubernetes' external-provisioner
//! clones a claim only from one of the same volumeMode, and CreateVolume refuses what it
//! can tell is the other kind): a filesystem volume is formatted and filled file by file
//! through its filesystem before it is mounted at the staging path; a raw block volume
//! gets the source's bytes (`copy::raw`), no filesystem made.
//!
//! What is safe to copy from: a source volume that nothing has staged, mounted or
//! published, copied at the clone's first NodeStage; or a filesystem source staged here,
//! copied at the clone's CreateVolume from its own mount, live and then frozen for the
//! pass over what changed meanwhile (`fill_from_mounted_source`; a copy of what a pod
//! writes meanwhile, never brought to one point in time, would be a copy that never
//! existed). A raw block source in use is refused (no filesystem to freeze); a
//! second mount of a mounted ext4 shares its live superblock. While a file copy runs, the
//! source is mounted read-only in a private directory of the state dir; a raw copy holds
//! both devices open exclusively; either way a NodeStage or DeleteVolume of the source
//! waits for or is refused until the copy ends.

mod check;
mod dataset;
mod files;
mod leftovers;
pub mod mount;
mod nfs;
mod raw;
mod snapshot;
pub mod source;
mod stage;
mod volume;
mod volume_in_use;

use std::path::PathBuf;
use std::time::Duration;

use crate::csi::id::BlockVolumeId;
use crate::error::{CloneError, Result};
use crate::request;
use crate::request::{Access, Capability};
use crate::volume::block::fill::source::Source;
use crate::volume::block::stage::format_if_blank;
use crate::volume::block::BlockBackend;
use crate::volume::block::Located;
use crate::volume::copy::{CopyRequest, Progress, Saved, Verify};

pub use check::{check_clone, clone_access, refuse_unfilled_clones};
pub use dataset::record_class_datasets;
pub use leftovers::unmount_leftovers;
pub use stage::{pending, run, Pending};
pub(crate) use volume::in_use;
pub use volume_in_use::fill_from_mounted_source;

/// Fills `vol` when it has a content source it does not hold yet; Ok at once otherwise.
pub async fn fill(b: &BlockBackend, vol: &mut Located, cap: &Capability) -> Result<()> {
    let Some(pending) = pending(b, vol, cap).await? else {
        return Ok(());
    };
    let fs = cap.fs_type.unwrap_or(vol.record.fs_type);
    if pending.needs_filesystem() {
        format_if_blank(b, vol, fs).await?;
    }
    run(b, vol, fs, pending).await
}

/// NodeStage of a clone's source: its clones not filled yet take their copy first, so
/// each holds the source as it was at the clone's CreateVolume (which refuses a source in
/// use; nothing could write the source since). A source in use already is a repeated
/// NodeStage: its clones are left to their own NodeStage.
pub async fn fill_clones_of(b: &BlockBackend, source: &BlockVolumeId) -> Result<()> {
    let raw = source.to_string();
    let clones = unfilled_clones_of(b, &raw)?;
    if clones.is_empty() || in_use(b, source).is_some() {
        return Ok(());
    }
    for clone in clones {
        let mut vol = b.locate(&clone)?;
        let access = if is_raw_clone(&vol.record) {
            Access::Block
        } else {
            Access::Mount
        };
        let cap = Capability {
            access,
            fs_type: Some(vol.record.fs_type),
            mount_flags: Vec::new(),
            read_only_mode: false,
            single_writer: false,
        };
        tracing::info!(volume_id = %raw, clone = %clone, "filling a clone of this volume before it is staged");
        fill(b, &mut vol, &cap).await?;
    }
    Ok(())
}

/// Whether the record is a raw block clone's: its source's bytes, no filesystem of its
/// own.
pub fn is_raw_clone(rec: &crate::pool::VolumeRecord) -> bool {
    rec.source.as_ref().is_some_and(|s| s.raw_block)
}
/// How long a NodeStage waits for the copy before answering Unavailable with the
/// progress (the kubelet gives up on a call after 2 minutes and retries).
pub const STAGE_WAIT: Duration = Duration::from_secs(100);

use crate::runtime::state_dir::short_hash as short;

fn progress_path(b: &BlockBackend, id: &str) -> PathBuf {
    b.pool
        .state_dir()
        .join("clones")
        .join(format!("{}.json", short(id)))
}

fn copy_dir(b: &BlockBackend, id: &str) -> PathBuf {
    b.pool.state_dir().join("clone-mnt").join(short(id))
}

/// Block clones of `source` recorded but not filled yet.
pub fn unfilled_clones_of(b: &BlockBackend, source: &str) -> Result<Vec<BlockVolumeId>> {
    let state = b.pool.state.snapshot();
    let mut out = Vec::new();
    for (id, rec) in state.entries() {
        let names = rec.source.as_ref().is_some_and(|s| s.id() == source);
        if names && !rec.deleting && !done(b, &id.to_string())? {
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// Whether the clone is filled: its copy recorded done, and no last pass over a source in
/// use still owed (`mounted`: the live pass records done before the frozen one runs).
pub(crate) fn done(b: &BlockBackend, id: &str) -> Result<bool> {
    let path = progress_path(b, id);
    Ok(Saved::load(&path)?.is_some_and(|s| s.done) && !last_pass_owed(&path).exists())
}

/// Present from before a live copy of a source in use until its frozen last pass is done.
fn last_pass_owed(progress: &std::path::Path) -> PathBuf {
    progress.with_extension("last-pass")
}

/// The file copy of a clone from `source`: paths set by the job once it has mounted both.
fn copy_request(source: &Source, rec: &crate::pool::VolumeRecord) -> CopyRequest {
    CopyRequest {
        source: PathBuf::new(),
        target: PathBuf::new(),
        label: source.label().to_owned(),
        streams: crate::volume::copy::STREAMS,
        chunk: crate::volume::copy::CHUNK,
        verify: verify_of(rec),
        live: false,
        target_reused: false,
        base: None,
        extents: None,
    }
}

/// `verify` of the class: `sizes` (the default) or `checksum`.
pub fn verify_of(rec: &crate::pool::VolumeRecord) -> Verify {
    match rec
        .parameters
        .get(request::PARAM_VERIFY)
        .map(String::as_str)
    {
        Some("checksum") => Verify::Checksum,
        _ => Verify::Sizes,
    }
}

/// Runs a copy on the blocking pool; one that panicked or was cancelled answers
/// `CopyStopped`.
async fn on_blocking_pool(copy: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    tokio::task::spawn_blocking(copy)
        .await
        .map_err(|e| CloneError::CopyStopped(e.to_string()).into())
        .and_then(|r| r)
}

/// A file copy that failed after it recorded done (it does so before its mounts are
/// taken down): recorded not filled again, so the retry takes a mount left behind down
/// (and checks the copy again) rather than staging a clone mounted here.
fn record_not_filled(progress: &Progress) -> Result<()> {
    let mut saved = progress.saved();
    if saved.done {
        saved.done = false;
        return progress.set(saved);
    }
    Ok(())
}

/// The copy job's outcome in the clone metrics.
fn count_outcome(volume: &str, progress: &Progress, outcome: &Result<()>) {
    match outcome {
        Ok(()) => crate::metrics::clone::finished(volume, progress.elapsed()),
        Err(e) => crate::metrics::clone::failed(e),
    }
}

/// Removes a deleted clone's progress record.
pub fn forget(b: &BlockBackend, id: &str) {
    let progress = progress_path(b, id);
    let owed = last_pass_owed(&progress);
    for path in [owed, progress.with_extension("delta"), progress] {
        let _ = std::fs::remove_file(path);
    }
    b.clones.forget(&format!("clone:{id}"));
    crate::metrics::clone::forget(id);
}

/// The content source a clone's (or restored volume's) Volume answers with (CSI:
/// returned when it was asked).
pub fn content_source(rec: &crate::pool::VolumeRecord) -> Option<crate::csi::VolumeContentSource> {
    rec.source
        .as_ref()
        .and_then(|s| request::snapshot::content_source(&s.of))
}
