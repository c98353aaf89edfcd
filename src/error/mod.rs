//! Domain errors, and the one place where they become gRPC status codes.

use std::path::PathBuf;
use std::time::Duration;

use tonic::{Code, Status};

use crate::os::error::HostError;

mod snapshot;
pub use snapshot::{SnapshotError, StoreError};

/// A failed external command (mkfs, mount, blkid, ...).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("could not start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{command}` did not finish within {after:?}; its process group was killed")]
    Timeout { command: String, after: Duration },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
}

/// A volume's state or place on this node stands in the way, by cause. All are
/// FailedPrecondition: the call can succeed once the named thing is fixed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The device's identity could not be read to compare it with the record.
    #[error(
        "the device of volume {volume} ({}) cannot be checked: {why}; recorded at allocation: \
         {recorded}; reattach it and retry",
        path.display()
    )]
    IdentityUnreadable {
        volume: String,
        path: PathBuf,
        why: String,
        recorded: String,
    },
    /// The device at the volume's path is another one than was allocated.
    #[error(
        "{} is not the device allocated to volume {volume}: recorded {recorded}, now {now}; it \
         will not be formatted, wiped or mounted: point {} back at the allocated device (or \
         reattach it) and retry",
        path.display(),
        path.display()
    )]
    NotItsDevice {
        volume: String,
        path: PathBuf,
        recorded: String,
        now: String,
    },
    #[error("volume {volume} is still in use: {uses}; unpublish and unstage it first")]
    StillInUse { volume: String, uses: String },
    /// The erase found what someone wrote while the volume was being deleted.
    #[error(
        "{} now carries {signatures}, written while volume {name} was being deleted; it is \
         left as it is",
        path.display()
    )]
    WrittenWhileDeleting {
        path: PathBuf,
        signatures: String,
        name: String,
    },
    /// A device a whole-device volume holds cannot be carved into partitions.
    #[error("whole-device volume {volume} holds it")]
    HeldWhole { volume: String },
    #[error("volume {volume} {why}; unpublish and unstage it there first")]
    DeviceInUse { volume: String, why: String },
    #[error("volume {volume} holds an {holds} filesystem; fs_type {asked} was requested")]
    FsMismatch {
        volume: String,
        holds: &'static str,
        asked: &'static str,
    },
    /// The data-safety table refused to format or mount the device (volume/block/stage.rs).
    #[error("{0}")]
    FormatRefused(String),
    #[error(
        "{} was mounted without the options GDS needs ({options}); check the kernel's ext4 \
         support",
        path.display()
    )]
    WithoutGdsOptions { path: PathBuf, options: String },
    #[error("the device of volume {volume} ({key}) is not present on this node; reattach it")]
    DeviceAbsent { volume: String, key: String },
    /// The device shows the recorded size and identity at another device number than
    /// where it was located: the kernel re-created its node (a partition table re-read).
    /// Located again by the caller (`BlockBackend::verify_located`), never acted on as is.
    #[error(
        "{} moved from {from} to {now} while volume {volume} was being worked on; \
         retry the call",
        path.display()
    )]
    DeviceMoved {
        volume: String,
        path: PathBuf,
        from: String,
        now: String,
    },
    #[error(
        "volume {volume} lives on node {node}; its node's controller deletes it (this is {this})"
    )]
    OtherNode {
        volume: String,
        node: String,
        this: String,
    },
    #[error("{} holds {fs_type} {device}, not the export {export}; unmount it", path.display())]
    ExportTaken {
        path: PathBuf,
        fs_type: String,
        device: String,
        export: String,
    },
    #[error("{} is staged but {why}; unstage it", path.display())]
    StagedWithoutRdma { path: PathBuf, why: String },
    #[error(
        "{why} for {source_path} at {}; unmounted. Check that the server exports over RDMA \
         (rpcrdma loaded, `rdma {port}` in /proc/fs/nfsd/portlist) and that this node has an \
         RDMA device on the server's network (rdma link show)",
        at.display()
    )]
    NoRdma {
        why: String,
        source_path: String,
        at: PathBuf,
        port: u16,
    },
    #[error("the NFS backend is not enabled in this driver instance")]
    NfsDisabled,
    #[error("{what}: {path} in the export is a symlink or not a directory; refusing to follow it")]
    UnsafeExportPath { what: String, path: String },
    #[error("{what}: {why}")]
    TaskFailed { what: String, why: String },
}

/// A clone that cannot be made or filled as asked, by cause (its source, its state, its
/// kind). `volume` is the clone, `origin` its source volume; `field` names the request
/// field where the request is at fault.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error("{field}: source volume {origin} does not exist")]
    SourceMissing { field: &'static str, origin: String },
    #[error("clone source {origin} is no block volume")]
    NotABlockSource { origin: String },
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
    /// The copy's blocking task ended without an answer (panicked or cancelled).
    #[error("the copy stopped: {0}; retry")]
    CopyStopped(String),
}

impl CloneError {
    fn code(&self) -> Code {
        match self {
            CloneError::SourceMissing { .. } | CloneError::NotABlockSource { .. } => Code::NotFound,
            CloneError::SourceOnOtherNode { .. } => Code::ResourceExhausted,
            CloneError::LimitBelowSource { .. } => Code::OutOfRange,
            CloneError::CopyStopped(_) => Code::Aborted,
            _ => Code::FailedPrecondition,
        }
    }
}

/// A clone's copy that cannot go on, by cause: the clone metric's `cause` label is chosen
/// from the variant (`metrics::clone::Cause`), never from the message.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
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
    fn code(&self) -> Code {
        match self {
            CopyError::SourceTimeout { .. } => Code::Unavailable,
            CopyError::Differs { .. } | CopyError::InUse { .. } => Code::FailedPrecondition,
        }
    }
}

/// CreateVolume's allocation that cannot be made, by cause.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error(
        "volume {name:?} exists with capacity {bytes} bytes, outside the requested range; use \
         another name or the same capacity_range"
    )]
    NameTakenOtherSize { name: String, bytes: u64 },
    #[error("volume {name:?} exists with other parameters or fsType; use another name")]
    NameTakenOtherParameters { name: String },
    /// No device of the pool could ever hold the range.
    #[error(
        "capacity_range: no device in node {node}'s pool has {range} (volumes are whole \
         devices; device sizes: [{sizes}])"
    )]
    NoDeviceFits {
        node: String,
        range: String,
        sizes: String,
    },
    /// Devices fit, but none is free and clean now.
    #[error(
        "no free clean device with {range} on node {node}; free one by deleting a volume or \
         add devices{}",
        if refused.is_empty() { String::new() } else { format!("; not allocatable: {}", refused.join("; ")) }
    )]
    NoneFree {
        node: String,
        range: String,
        refused: Vec<String>,
    },
    /// Nothing fits once the request was raised to the smallest filesystem mkfs makes.
    #[error(
        "{inner}; the request was raised to {min} bytes, the smallest {fs} the node's mkfs makes"
    )]
    RaisedToFsMinimum {
        inner: Box<Error>,
        min: u64,
        fs: &'static str,
    },
}

impl AllocationError {
    fn code(&self) -> Code {
        match self {
            AllocationError::RaisedToFsMinimum { .. } => Code::OutOfRange,
            AllocationError::NameTakenOtherSize { .. }
            | AllocationError::NameTakenOtherParameters { .. } => Code::AlreadyExists,
            AllocationError::NoDeviceFits { .. } => Code::OutOfRange,
            AllocationError::NoneFree { .. } => Code::ResourceExhausted,
        }
    }
}

/// What stands in the way of a mount, an unmount or a publish, by cause.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(
        "{field} {} is not empty; a volume is mounted only onto an empty directory, which \
         would otherwise hide what it holds",
        path.display()
    )]
    DirNotEmpty { field: &'static str, path: PathBuf },
    #[error(
        "target_path {} exists and is not an empty file; a raw block volume is published only \
         onto a new or empty file, which would otherwise be hidden",
        path.display()
    )]
    TargetNotEmptyFile { path: PathBuf },
    /// Something other than this volume is mounted where it is to be unmounted.
    #[error(
        "{} holds another mount ({fs_type} {device}), not volume {volume}; not unmounting it",
        path.display()
    )]
    Foreign {
        path: PathBuf,
        fs_type: String,
        /// The mount source (a device, a server path), or `?`.
        device: String,
        volume: String,
    },
    #[error("{} is still mounted after repeated unmounts", path.display())]
    StillMounted { path: PathBuf },
    #[error(
        "staging path {} already has another filesystem mounted ({fs_type} {device}); unmount \
         it first",
        path.display()
    )]
    StagingTaken {
        path: PathBuf,
        fs_type: String,
        /// The mount source (a device, a server path), or `?`.
        device: String,
    },
    #[error("{} is not mounted {from}after mount succeeded", path.display())]
    MissingAfterMount { path: PathBuf, from: String },
    #[error("volume {volume} is not staged at {}; call NodeStageVolume first", staging.display())]
    NotStaged { volume: String, staging: PathBuf },
    #[error("volume {volume} is SINGLE_NODE_SINGLE_WRITER and already published at {}", at.display())]
    SingleWriter { volume: String, at: PathBuf },
    /// Publish: the target holds something else.
    #[error("target path {} already has another mount ({fs_type})", path.display())]
    TargetTaken { path: PathBuf, fs_type: String },
    /// Publish: the target holds this volume with the other read-only flag.
    #[error(
        "{} is already published with readonly={current}; unpublish it before changing readonly",
        path.display()
    )]
    ReadonlyDiffers { path: PathBuf, current: bool },
}

impl MountError {
    fn code(&self) -> Code {
        match self {
            MountError::TargetTaken { .. } | MountError::ReadonlyDiffers { .. } => {
                Code::AlreadyExists
            }
            _ => Code::FailedPrecondition,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong: names the field and what to send instead.
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("volume {0} does not exist on this node")]
    VolumeNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("an operation on {0} is already in progress; retry later")]
    Busy(String),
    /// The call cannot go on as asked (a stale pagination token, say); start over.
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    NotReady(String),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {}: {reason}", path.display())]
    State { path: PathBuf, reason: String },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Copy(#[from] CopyError),
    #[error(transparent)]
    Clone(#[from] CloneError),
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// What the host port reports, by cause (src/os/error.rs).
    #[error(transparent)]
    Host(#[from] crate::os::error::HostError),
    /// The outcome of a long job that more than one call waited for (src/jobs.rs).
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        code(self)
    }

    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }
}

fn code(err: &Error) -> Code {
    match err {
        Error::InvalidArgument { .. } => Code::InvalidArgument,
        Error::VolumeNotFound(_) | Error::NotFound(_) => Code::NotFound,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::Busy(_) | Error::Aborted(_) => Code::Aborted,
        Error::ResourceExhausted(_) => Code::ResourceExhausted,
        Error::OutOfRange(_) => Code::OutOfRange,
        Error::NotReady(_) => Code::Unavailable,
        Error::Command(CommandError::Timeout { .. }) => Code::DeadlineExceeded,
        Error::Command(_) | Error::Io { .. } | Error::State { .. } => Code::Internal,
        Error::Host(e) => host_code(e),
        Error::Mount(e) => e.code(),
        Error::Volume(_) => Code::FailedPrecondition,
        Error::Copy(e) => e.code(),
        Error::Clone(e) => e.code(),
        Error::Allocation(e) => e.code(),
        Error::Store(e) => e.code(),
        Error::Snapshot(e) => e.code(),
        Error::Shared(inner) => code(inner),
    }
}

fn host_code(err: &HostError) -> Code {
    match err {
        // Nothing is known about the device, or it is someone else's now: not until fixed.
        HostError::ProbeFailed { .. } | HostError::DeviceInUse { .. } => Code::FailedPrecondition,
        // Held for a moment by another program: the CO retries.
        HostError::DeviceLocked { .. } | HostError::EraseInterrupted(_) => Code::Aborted,
        HostError::TaskFailed { .. } => Code::FailedPrecondition,
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        Status::new(code(&err), err.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn code_of(e: impl Into<Error>) -> Code {
        Status::from(e.into()).code()
    }

    #[test]
    fn a_bad_gds_policy_is_one_code_wherever_it_is_read() {
        // Stored parameters and a publish's volume_context go through Policy::from_str;
        // CreateVolume's parameters through request::parameters: both InvalidArgument.
        let stored = "bogus".parse::<crate::gds::gate::Policy>().unwrap_err();
        let created =
            crate::request::parameters(&[("gdsPolicy".to_owned(), "bogus".to_owned())].into())
                .unwrap_err();
        assert_eq!(code_of(stored), Code::InvalidArgument);
        assert_eq!(code_of(created), Code::InvalidArgument);
    }

    #[test]
    fn clone_and_allocation_errors_are_mapped_here_by_cause() {
        let field = "volume_content_source.volume.volume_id";
        let origin = || "blk:a".to_owned();
        assert_eq!(
            code_of(CloneError::SourceMissing {
                field,
                origin: origin()
            }),
            Code::NotFound
        );
        assert_eq!(
            code_of(CloneError::SourceOnOtherNode {
                field,
                node: "n1".into(),
                this: "n2".into()
            }),
            Code::ResourceExhausted
        );
        let limit = CloneError::LimitBelowSource {
            origin: origin(),
            bytes: 2,
            limit: 1,
        };
        assert!(limit.to_string().starts_with("capacity_range: "), "{limit}");
        assert_eq!(code_of(limit), Code::OutOfRange);
        assert_eq!(
            code_of(CloneError::CopyStopped("panicked".into())),
            Code::Aborted
        );
        assert_eq!(
            code_of(CloneError::UnfilledClones {
                origin: origin(),
                clones: "blk:b".into()
            }),
            Code::FailedPrecondition
        );
        assert_eq!(
            code_of(AllocationError::NameTakenOtherParameters { name: "v".into() }),
            Code::AlreadyExists
        );
        let none = AllocationError::NoDeviceFits {
            node: "n".into(),
            range: "at least 1 bytes".into(),
            sizes: "0".into(),
        };
        assert!(none.to_string().starts_with("capacity_range: "), "{none}");
        assert_eq!(code_of(none), Code::OutOfRange);
        let busy = AllocationError::NoneFree {
            node: "n".into(),
            range: "at least 1 bytes".into(),
            refused: vec!["/dev/x carries dos".into()],
        };
        assert!(
            busy.to_string()
                .ends_with("; not allocatable: /dev/x carries dos"),
            "{busy}"
        );
        assert_eq!(code_of(busy), Code::ResourceExhausted);
    }

    #[test]
    fn host_and_mount_errors_are_mapped_here_by_cause() {
        let device = Path::new("/dev/x").to_owned();
        assert_eq!(
            code_of(HostError::DeviceLocked {
                device: device.clone()
            }),
            Code::Aborted
        );
        assert_eq!(
            code_of(HostError::DeviceInUse {
                device,
                name: "x".into()
            }),
            Code::FailedPrecondition
        );
        let path = Path::new("/t").to_owned();
        assert_eq!(
            code_of(MountError::ReadonlyDiffers {
                path: path.clone(),
                current: true
            }),
            Code::AlreadyExists
        );
        assert_eq!(
            code_of(MountError::NotStaged {
                volume: "v".into(),
                staging: path
            }),
            Code::FailedPrecondition
        );
        assert_eq!(code_of(VolumeError::NfsDisabled), Code::FailedPrecondition);
    }
}
