//! Block → block clones on one node: CreateVolume checks the source and records it in
//! the clone's volume record (`pool::RecordedSource`, with whether the clone is a raw
//! block one, written with the allocation, so no crash leaves a clone without its source
//! or its kind); the first NodeStage fills the volume before anything can publish it.
//!
//! Two kinds, as the clone's access type asks (Kubernetes' external-provisioner clones a
//! claim only from one of the same volumeMode, and CreateVolume refuses what it can tell
//! is the other kind): a filesystem clone is formatted and filled file by file through
//! its filesystem before it is mounted at the staging path; a raw block clone is the
//! source device's bytes copied onto its own (`copy::raw`), no filesystem made.
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
mod copy_mounts;
mod files;
mod mounted;
mod raw;
mod stage;

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{CloneError, Result};
use crate::request;
use crate::volume::block::clone_source::Source;
use crate::volume::block::BlockBackend;
use crate::volume::copy::{CopyRequest, Progress, Saved, Verify};

pub(crate) use check::in_use;
pub use check::{
    check_clone, check_source, clone_access, refuse_unfilled_clones, unfilled_clones_of,
};
pub use copy_mounts::unmount_leftovers;
pub use mounted::fill_from_mounted_source;
pub use stage::{pending, run, Pending};

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
        .map(|s| request::snapshot::content_source(&s.of))
}
