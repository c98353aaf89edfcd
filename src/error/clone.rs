//! Errors of clones: of making or filling one (`CloneError`) and of its copy
//! (`CopyError`), each answered with the code its cause calls for.

use std::path::PathBuf;

use tonic::Code;

use super::VolumeError;

/// A clone that cannot be made or filled as asked, by cause (its source, its state, its
/// kind). `volume` is the clone, `origin` its source volume; `field` names the request
/// field where the request is at fault.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error("{field}: source volume {origin} does not exist")]
    SourceMissing { field: &'static str, origin: String },
    #[error(
        "{field}: the source lives on node {node}; its clone can be made only there, not on {this}"
    )]
    SourceOnOtherNode {
        field: &'static str,
        node: String,
        this: String,
    },
    #[error("{field}: source volume {origin} is being deleted")]
    SourceDeleting { field: &'static str, origin: String },
    #[error("{field}: source volume {origin} is a clone not filled yet; stage it once first")]
    SourceNotFilled { field: &'static str, origin: String },
    #[error(
        "capacity_range: the source volume {origin} is {bytes} bytes, more than the clone's \
         limit of {limit} bytes; ask for at least {bytes} bytes"
    )]
    LimitBelowSource {
        origin: String,
        bytes: u64,
        limit: u64,
    },
    /// A raw block source in use has no filesystem to freeze for a consistent copy.
    #[error(
        "{field}: source volume {origin} is in use ({at}) with raw block access; a clone is \
         the source as it is at CreateVolume, and a raw block volume in use has no filesystem \
         to freeze for a consistent copy: stop what uses it (its pods) and retry, or clone \
         from a filesystem volume"
    )]
    RawSourceInUse {
        field: &'static str,
        origin: String,
        at: String,
    },
    /// A stripe clone's array runs only while it is staged: it is filled at its first
    /// NodeStage, from a source nothing uses then.
    #[error(
        "volume_content_source.volume.volume_id: source volume {origin} is in use (mounted at \
         {}); a stripe clone is copied only from a source nothing has staged: stop what uses \
         it (its pods) and retry",
        at.display()
    )]
    StripeSourceInUse { origin: String, at: PathBuf },
    #[error(
        "volume {origin} is the source of clone(s) not filled yet: {clones}; a clone copies \
         its source at its first NodeStage: stage each once (start its pod), or delete it, \
         then retry"
    )]
    UnfilledClones { origin: String, clones: String },
    #[error("volume {volume}: its clone copy is still running; retry when it has ended")]
    CopyRunning { volume: String },
    #[error(
        "volume {volume} is a clone of {label}, which is on NFS, and {}: run this node's plugin \
         with the NFS backend to fill it; nothing was formatted or mounted",
        VolumeError::NfsDisabled
    )]
    NfsSourceDisabled { volume: String, label: String },
    #[error(
        "volume {volume} is a raw block clone of {label}, an NFS directory, which has no device \
         to copy; delete it"
    )]
    RawCloneOfNfs { volume: String, label: String },
    #[error(
        "snapshot {label} holds a raw block volume's bytes: a volume restored from it is used \
         with block access (Kubernetes: volumeMode: Block)"
    )]
    ImageNeedsBlock { label: String },
    #[error(
        "the source volume {origin} is {bytes} bytes now, more than its clone {volume} of \
         {volume_bytes} bytes (was it expanded since the clone was made?); the clone cannot \
         hold it: delete the clone and clone again"
    )]
    SourceGrew {
        origin: String,
        bytes: u64,
        volume: String,
        volume_bytes: u64,
    },
    #[error("{} is no longer the source volume's mount; retry", at.display())]
    SourceMountGone { at: PathBuf },
    #[error(
        "clone {volume}: what changed in its source at {} during the copy could not be copied \
         within the freeze limit of {limit_secs:.1} s, so the source was thawed and the clone \
         is not filled; retry when its writers are quieter, or raise --snapshot-freeze-limit",
        at.display()
    )]
    FreezeOverran {
        volume: String,
        at: PathBuf,
        limit_secs: f64,
    },
    #[error("clone source {origin} is no volume of this driver")]
    NotOurVolume { origin: String },
    #[error(
        "the clone's source {label} is on NFS and {}: run the driver with the NFS backend \
         (`gds-csi serve` enables it) to clone from NFS",
        VolumeError::NfsDisabled
    )]
    NfsSourceNoBackend { label: String },
    #[error("{field}: the source {label} does not exist")]
    SourceAbsent { field: &'static str, label: String },
    /// An entry removed while the measuring walk went by: measure again.
    #[error("the source {label} changed while it was measured ({why}); retry")]
    SourceChanged { label: String, why: String },
    #[error(
        "capacity_range: the source {label} holds {data_bytes} bytes in {entries} entries and \
         needs a volume of at least {needed} bytes (its files in 4 KiB blocks plus a \
         sixteenth for the filesystem), more than the clone's limit of {limit} bytes; ask for \
         at least {needed} bytes"
    )]
    LimitBelowFiles {
        label: String,
        data_bytes: u64,
        entries: usize,
        needed: u64,
        limit: u64,
    },
    /// A Dataset larger than the claim's volume (`gds-csi populate`): nothing written.
    #[error(
        "the dataset {label} holds {data_bytes} bytes in {entries} entries and needs a volume \
         of at least {needed} bytes; the claim's volume has {free} bytes free: ask for at \
         least {needed} bytes in the claim's spec.resources.requests.storage"
    )]
    DatasetTooLarge {
        label: String,
        data_bytes: u64,
        entries: usize,
        needed: u64,
        free: u64,
    },
    /// The clone's private directory could not be made beneath the state directory.
    #[error("{} could not be created", path.display())]
    WorkDirNotMade { path: PathBuf },
    /// The measuring walk's blocking task ended without an answer.
    #[error("the measuring task failed: {0}")]
    MeasureStopped(String),
    #[error("the measure of {what} was dropped before it was taken; retry")]
    MeasureDropped { what: String },
    /// An NFS source that is itself a clone still being copied.
    #[error(
        "{field}: source volume {origin} is a clone whose copy has not finished; retry when \
         its own CreateVolume has succeeded"
    )]
    SourceCopying { field: &'static str, origin: String },
    /// An NFS source's directory went away under the copy.
    #[error("{field}: the source directory {label} is gone")]
    SourceDirGone { field: &'static str, label: String },
    /// The NFS clone's own directory went away under the copy.
    #[error("{target} vanished; retry")]
    TargetVanished { target: String },
    #[error("volume {volume} was deleted while its copy ran; retry to copy it again")]
    DeletedWhileCopying { volume: String },
    /// A new NFS clone fills only a new or empty directory.
    #[error(
        "directory {dir} already exists with content that no volume of this driver records; \
         a clone fills only a new directory: remove or rename it, or use another name"
    )]
    TargetDirTaken { dir: String },
    /// The copy's blocking task ended without an answer (panicked or cancelled).
    #[error("the copy stopped: {0}; retry")]
    CopyStopped(String),
}

impl CloneError {
    pub(super) fn code(&self) -> Code {
        match self {
            CloneError::SourceMissing { .. }
            | CloneError::SourceDirGone { .. }
            | CloneError::NotOurVolume { .. }
            | CloneError::SourceAbsent { .. } => Code::NotFound,
            CloneError::TargetDirTaken { .. } => Code::AlreadyExists,
            CloneError::SourceOnOtherNode { .. } => Code::ResourceExhausted,
            CloneError::LimitBelowSource { .. }
            | CloneError::LimitBelowFiles { .. }
            | CloneError::DatasetTooLarge { .. } => Code::OutOfRange,
            CloneError::CopyStopped(_)
            | CloneError::TargetVanished { .. }
            | CloneError::DeletedWhileCopying { .. }
            | CloneError::SourceChanged { .. }
            | CloneError::MeasureStopped(_)
            | CloneError::MeasureDropped { .. }
            | CloneError::FreezeOverran { .. } => Code::Aborted,
            _ => Code::FailedPrecondition,
        }
    }
}

/// A clone's copy that cannot go on, by cause: the clone metric's `cause` label is chosen
/// from the variant (`metrics::clone::Cause`), never from the message.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A raw copy's device is no longer the volume's (re-attached or replaced).
    #[error(
        "{} is no longer the {what} volume's device {major}:{minor}; nothing was copied: retry",
        path.display()
    )]
    DeviceMoved {
        path: PathBuf,
        what: String,
        major: u32,
        minor: u32,
    },
    #[error(
        "the {what} device {} holds {size} bytes, fewer than the {bytes} to copy",
        path.display()
    )]
    DeviceTooSmall {
        what: &'static str,
        path: PathBuf,
        size: u64,
        bytes: u64,
    },
    /// Verification found the copy unlike its source.
    #[error("the copy of {copy} differs from its source{at}; the volume stays unpublished")]
    Differs {
        /// What was copied, as shown to the operator.
        copy: String,
        /// Where: `: <what differs>` or ` at byte N`.
        at: String,
    },
    /// A device or volume of the copy is in use, so the copy could not be consistent.
    #[error("{what} is in use ({uses}); {fix}")]
    InUse {
        what: String,
        uses: String,
        fix: &'static str,
    },
    /// The NFS source stopped answering (mounted soft); the next NodeStage resumes.
    #[error(
        "reading {label} failed: the NFS server did not answer (the source is mounted soft: a \
         read fails after about {soft_seconds} s without an answer; {error}); nothing was \
         published; the next NodeStage resumes the copy at {percent}% ({copied_gib:.2} of \
         {total_gib:.2} GiB) once the server answers"
    )]
    SourceTimeout {
        label: String,
        soft_seconds: u64,
        error: String,
        percent: u64,
        copied_gib: f64,
        total_gib: f64,
    },
}

impl CopyError {
    pub(super) fn code(&self) -> Code {
        match self {
            CopyError::SourceTimeout { .. } => Code::Unavailable,
            CopyError::Differs { .. }
            | CopyError::InUse { .. }
            | CopyError::DeviceMoved { .. }
            | CopyError::DeviceTooSmall { .. } => Code::FailedPrecondition,
        }
    }
}
