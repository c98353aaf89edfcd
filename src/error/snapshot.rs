//! Errors of CSI snapshots: of the calls (`SnapshotError`) and of what a store holds
//! (`StoreError`), each answered with the code its cause calls for.

use tonic::Code;

/// A snapshot store's contents that the driver refuses to act on: anything in a store may
/// have been put there by someone else (src/snapshot/store.rs). Messages name the path and
/// what is wrong with it, never what a file read from the store holds.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{path} on the snapshot store is a symlink or not a {kind}; nothing was read, written \
         or followed through it: remove it"
    )]
    NotPlain { path: String, kind: &'static str },
    #[error(
        "{path} is no directory of snapshot {id} ({why}); nothing was read from it or changed"
    )]
    Foreign {
        path: String,
        id: String,
        why: &'static str,
    },
    #[error(
        "snapshot {id} at {path} cannot be restored: {why}; it is listed as not ready (the \
         node that took it takes it again at its next CreateSnapshot)"
    )]
    Damaged {
        path: String,
        id: String,
        why: &'static str,
    },
    #[error(
        "snapshot {id}: {path} on the store no longer has the SHA-256 the snapshot recorded \
         ({recorded}; now {found}): its bytes were changed after it was taken; nothing was \
         restored and the volume stays empty: restore the store's copy, or use another snapshot"
    )]
    Corrupt {
        id: String,
        path: String,
        recorded: String,
        found: String,
    },
    #[error(
        "snapshot {id}: {path} holds another snapshot's data ({why}); use another snapshot name"
    )]
    NameTaken {
        path: String,
        id: String,
        why: &'static str,
    },
    #[error(
        "name: {path} already exists on the store and is no snapshot of this driver; nothing \
         was written: use another name, or move that directory away"
    )]
    NotOurs { path: String },
    #[error("the snapshot store {store} is full ({cause}) while copying {path}: it needs about {needed} bytes more for this snapshot; free space there or use another store")]
    Full {
        store: String,
        path: String,
        cause: &'static str,
        needed: u64,
    },
}

impl StoreError {
    pub(super) fn code(&self) -> Code {
        match self {
            StoreError::NameTaken { .. } | StoreError::NotOurs { .. } => Code::AlreadyExists,
            StoreError::Full { .. } => Code::ResourceExhausted,
            _ => Code::FailedPrecondition,
        }
    }
}

/// Why a snapshot call cannot do what it was asked (src/snapshot/).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "the snapshot store {store} cannot be reached: {cause}; nothing was listed or changed: \
         retry when it answers"
    )]
    StoreUnreachable { store: String, cause: String },
    #[error(
        "snapshot {name}: nothing was copied for {stalled_secs} s (is the store {store} \
         answering?), {copied_mib:.1} of {total_mib:.1} MiB copied; the copy goes on when it \
         answers"
    )]
    Stalled {
        name: String,
        stalled_secs: u64,
        store: String,
        copied_mib: f64,
        total_mib: f64,
    },
    #[error("name: snapshot {name} exists and is of volume {source_volume}, not {asked}; use another name")]
    NameOfAnotherVolume {
        name: String,
        source_volume: String,
        asked: String,
    },
    #[error(
        "name: snapshot {name} exists on another store ({id}); use another name or the class \
         it was taken with"
    )]
    NameOnAnotherStore { name: String, id: String },
    #[error("snapshot {id} does not exist")]
    NotFound { id: String },
    #[error(
        "this driver instance keeps no snapshots: run it with a state dir (`gds-csi serve` \
         does)"
    )]
    NotKept,
    #[error("snapshot {id} has no tree/ at {path}")]
    NoTree { id: String, path: String },
    #[error("snapshot {id} has no image at {path}")]
    NoImage { id: String, path: String },
    #[error("snapshot {id} does not exist at {path}")]
    NotInStore { id: String, path: String },
    #[error("volume_content_source.snapshot.snapshot_id: snapshot {id} does not exist")]
    RestoreSourceNotFound { id: String },
    #[error("snapshot {id} is not ready: {why}; retry when it is ready")]
    NotReady { id: String, why: String },
    #[error("snapshot {id} at {path} has no manifest: it is not ready; retry when it is")]
    NoManifest { id: String, path: String },
    #[error("snapshot {name} is being taken now; retry when CreateSnapshot has answered")]
    BeingTaken { name: String },
    #[error(
        "snapshot {id} is being restored into {into}: delete it after those volumes are filled \
         (their first NodeStage) or deleted; a mark whose volume went with its node can be \
         removed by hand"
    )]
    BeingRestored { id: String, into: String },
    #[error("source_volume_id: volume {volume} does not exist on this node")]
    SourceNotFound { volume: String },
    #[error("source_volume_id: the directory {path} is gone")]
    SourceDirGone { path: String },
    #[error("source_volume_id: volume {volume} is being deleted")]
    SourceDeleting { volume: String },
    #[error(
        "source_volume_id: volume {volume} is a clone or restore not filled yet (its first \
         NodeStage fills it); take its snapshot after that"
    )]
    SourceNotFilled { volume: String },
    #[error(
        "source_volume_id: stripe volume {volume} has no device while it is not staged (its md \
         array runs only then): take its snapshot while a pod uses it ({cause})"
    )]
    StripeNotStaged { volume: String, cause: String },
    #[error(
        "source_volume_id: volume {volume} is in use ({uses}) but not mounted where its files \
         can be read; retry when it is staged or unused"
    )]
    InUseUnmounted { volume: String, uses: String },
    #[error(
        "source_volume_id: volume {volume} is used as a raw block device ({uses}): it has no \
         filesystem to freeze, so a copy of it taken now would be no state it ever had; take \
         the snapshot while no pod uses it"
    )]
    RawInUse { volume: String, uses: String },
    #[error("{path} is no longer the source volume's {what}; retry")]
    SourceMoved { path: String, what: &'static str },
    #[error(
        "snapshot {name}: what changed in {at} during the copy could not be copied within the \
         freeze limit of {limit_secs:.1} s, so the filesystem was thawed and nothing was kept as \
         a snapshot; retry when its writers are quieter, or raise --snapshot-freeze-limit"
    )]
    FreezeOverran {
        name: String,
        at: String,
        limit_secs: f64,
    },
    #[error("{what} stopped: {cause}; retry")]
    Stopped { what: String, cause: String },
}

impl SnapshotError {
    pub(super) fn code(&self) -> Code {
        use SnapshotError::*;
        match self {
            // The store or the copy will answer later: the snapshotter retries.
            StoreUnreachable { .. } | Stalled { .. } | NotReady { .. } | NoManifest { .. } => {
                Code::Unavailable
            }
            NameOfAnotherVolume { .. } | NameOnAnotherStore { .. } => Code::AlreadyExists,
            NotKept => Code::FailedPrecondition,
            NotFound { .. }
            | NoTree { .. }
            | NoImage { .. }
            | NotInStore { .. }
            | RestoreSourceNotFound { .. }
            | SourceNotFound { .. }
            | SourceDirGone { .. } => Code::NotFound,
            SourceMoved { .. } | FreezeOverran { .. } | Stopped { .. } => Code::Aborted,
            BeingTaken { .. }
            | BeingRestored { .. }
            | SourceDeleting { .. }
            | SourceNotFilled { .. }
            | StripeNotStaged { .. }
            | InUseUnmounted { .. }
            | RawInUse { .. } => Code::FailedPrecondition,
        }
    }
}
