//! Domain errors, and the one place where they become gRPC status codes.

use std::path::PathBuf;
use std::time::Duration;

use tonic::{Code, Status};

mod allocation;
mod clone;
mod expand;
mod host;
mod label;
mod layout;
mod mount;
mod snapshot;
pub use allocation::AllocationError;
pub use clone::{CloneError, CopyError};
pub use expand::ExpandError;
pub use host::HostError;
pub use label::LabelError;
pub use layout::LayoutError;
pub use mount::MountError;
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

/// A volume's state or place on this node stands in the way, by cause. FailedPrecondition
/// (the call can succeed once the named thing is fixed), but NotFound for a volume this
/// node does not hold.
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
    /// A node call for a volume of another node.
    #[error("volume {volume} lives on node {node}, not on this node ({this})")]
    NotOnThisNode {
        volume: String,
        node: String,
        this: String,
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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong: names the field and what to send instead.
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("volume {0} does not exist on this node")]
    VolumeNotFound(String),
    #[error("an operation on {0} is already in progress; retry later")]
    Busy(String),
    /// Work this call waits for is still running (a copy, a walk, the pool's first
    /// scan): how far it got; the retry takes its result.
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
    #[error(transparent)]
    Expand(#[from] ExpandError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A partition label's error (src/disk/gpt/), as the label code words it.
    #[error(transparent)]
    Label(LabelError),
    /// What the host port reports, by cause (src/os/error.rs).
    #[error(transparent)]
    Host(#[from] HostError),
    /// A long job's task ended without leaving an outcome (src/runtime/overlap.rs).
    #[error("job {key} ended without an outcome; retry")]
    JobLost { key: String },
    /// The GDS gate refused a volume its class requires GDS for (src/gds/gate/policy.rs).
    #[error(
        "GDS is not available for volume {volume} (gdsPolicy=required; use preferred to \
         publish anyway in compat mode); {failed} check(s) failed:\n{lines}"
    )]
    GdsRequired {
        volume: String,
        failed: usize,
        lines: String,
    },
    /// A list call's starting_token that this driver did not issue (CSI: ABORTED).
    #[error("starting_token {token:?} was not issued by this driver; list again from the start")]
    ForeignToken { token: String },
    /// The outcome of a long job that more than one call waited for (src/runtime/overlap.rs).
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        code(self)
    }

    /// No volume of the asked capacity range can be carved or chosen, whatever the pool
    /// holds now: the range is at fault (OutOfRange), not the node's free space.
    pub fn is_range_unsatisfiable(&self) -> bool {
        matches!(
            self,
            Error::Allocation(AllocationError::NoDeviceFits { .. })
                | Error::Label(LabelError::NoSizeInRange(_))
                | Error::Layout(
                    LayoutError::TooLarge { .. } | LayoutError::StripeBeyondLimit { .. }
                )
        )
    }

    /// Nothing could be carved or chosen: the range, or the node's free space, or both.
    pub fn is_out_of_room(&self) -> bool {
        self.is_range_unsatisfiable()
            || matches!(
                self,
                Error::Allocation(AllocationError::NoneFree { .. })
                    | Error::Layout(LayoutError::NoRoom { .. })
            )
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
        Error::VolumeNotFound(_) => Code::NotFound,
        Error::Busy(_) => Code::Aborted,
        Error::NotReady(_) => Code::Unavailable,
        Error::Command(CommandError::Timeout { .. }) => Code::DeadlineExceeded,
        Error::Command(_) | Error::Io { .. } | Error::State { .. } => Code::Internal,
        Error::Host(e) => host_code(e),
        Error::Mount(e) => e.code(),
        Error::Volume(VolumeError::NotOnThisNode { .. }) => Code::NotFound,
        Error::Volume(_) => Code::FailedPrecondition,
        Error::Copy(e) => e.code(),
        Error::Clone(e) => e.code(),
        Error::Allocation(e) => e.code(),
        Error::Store(e) => e.code(),
        Error::Snapshot(e) => e.code(),
        Error::Expand(e) => e.code(),
        Error::Layout(e) => e.code(),
        Error::Label(e) => layout::label_code(e),
        Error::JobLost { .. } | Error::ForeignToken { .. } => Code::Aborted,
        Error::GdsRequired { .. } => Code::FailedPrecondition,
        Error::Shared(inner) => code(inner),
    }
}

fn host_code(err: &HostError) -> Code {
    match err {
        // Nothing is known about the device, or it is someone else's now: not until fixed.
        HostError::ProbeFailed { .. } | HostError::DeviceInUse { .. } => Code::FailedPrecondition,
        // Held for a moment by another program: the CO retries.
        HostError::DeviceLocked { .. } | HostError::EraseInterrupted(_) => Code::Aborted,
        HostError::MountInFlight { .. } => Code::Aborted,
        HostError::TaskFailed { .. }
        | HostError::GrowNeedsCapability { .. }
        | HostError::NoMdadm => Code::FailedPrecondition,
    }
}

/// A label error that is an I/O failure is answered as one (Internal); every other by
/// its cause.
impl From<LabelError> for Error {
    fn from(e: LabelError) -> Self {
        match e {
            LabelError::Io { device, source, .. } => Error::Io {
                context: "partition layout",
                path: device,
                source,
            },
            other => Error::Label(other),
        }
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
