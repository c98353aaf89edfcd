//! What stands in the way of a mount, an unmount, a publish or a stats call, each
//! answered with the code its cause calls for.

use std::path::PathBuf;

use tonic::Code;

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
    /// NodeGetVolumeStats of a path that holds nothing of this volume.
    #[error("volume {volume} is not published or staged at {}", path.display())]
    NotMountedAt { volume: String, path: PathBuf },
    /// A volume_path the allowed roots refuse: no volume is ever there.
    #[error("volume {volume} is not published or staged at {path:?} ({field}: {reason})")]
    PathRefused {
        volume: String,
        path: String,
        field: &'static str,
        reason: String,
    },
    /// A statvfs of this path still blocked on an unanswering server.
    #[error("an earlier statvfs of {} has not returned yet", path.display())]
    StatvfsPending { path: PathBuf },
}

impl MountError {
    pub(super) fn code(&self) -> Code {
        match self {
            MountError::TargetTaken { .. } | MountError::ReadonlyDiffers { .. } => {
                Code::AlreadyExists
            }
            MountError::NotMountedAt { .. } | MountError::PathRefused { .. } => Code::NotFound,
            _ => Code::FailedPrecondition,
        }
    }
}
