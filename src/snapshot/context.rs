//! What the snapshot calls reach, and the store a snapshot id names, reached from this
//! node: every read of a store runs on a blocking thread, an NFS store's under the NFS
//! backend's deadline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{Manifest, Snapshots};

/// How long a call waits on long work on a directory store before answering Unavailable
/// with its progress (the work goes on; a retry joins it).
const LOCAL_STORE_WAIT: Duration = Duration::from_secs(20);
use crate::error::{Error, Result, SnapshotError, VolumeError};
use crate::os::Host;
use crate::request::snapshot::{SnapshotId, Store};
use crate::volume::block::BlockBackend;
use crate::volume::nfs::NfsBackend;
use crate::volume::snapshot_store::{self as store, SnapshotDir};

/// The snapshot's directory below the root its store is reached at (`store_root`).
fn dir_below_root(id: &SnapshotId) -> String {
    match &id.store {
        Store::Dir(_) => id.dir.clone(),
        // `nfs_dir` answers Some for every NFS store.
        Store::Nfs(_) => id.nfs_dir("").map(|d| d.dir).unwrap_or_default(),
    }
}

/// What the snapshot calls reach: this node's snapshots and its backends.
pub struct Context<'a> {
    pub snapshots: &'a Snapshots,
    pub block: &'a BlockBackend,
    pub nfs: Option<&'a NfsBackend>,
    pub node_id: &'a str,
    /// The host port the copies mount through (the block backend's, timed).
    pub host: &'a Arc<dyn Host>,
}

/// A store that cannot be reached: Unavailable, naming it (the snapshotter retries).
fn store_unreachable(id: &SnapshotId, e: &Error) -> Error {
    SnapshotError::StoreUnreachable {
        store: id.store_location(),
        cause: e.to_string(),
    }
    .into()
}

impl Context<'_> {
    pub(super) fn nfs(&self) -> Result<&NfsBackend> {
        self.nfs.ok_or_else(|| VolumeError::NfsDisabled.into())
    }

    /// The store's root as this node reaches it and the snapshot's directory below it: an
    /// NFS store's export is mounted (once) under the controller's working directory.
    async fn store_root(&self, id: &SnapshotId) -> Result<(PathBuf, String)> {
        match &id.store {
            Store::Dir(root) => Ok((root.clone(), dir_below_root(id))),
            Store::Nfs(store) => {
                let root = self
                    .nfs()?
                    .export_root(store)
                    .await
                    .map_err(|e| store_unreachable(id, &e))?;
                Ok((root, dir_below_root(id)))
            }
        }
    }

    /// The store's root and `name` in the snapshot's directory below it.
    pub(super) async fn store_path(
        &self,
        id: &SnapshotId,
        name: &str,
    ) -> Result<(PathBuf, String)> {
        let (root, rel) = self.store_root(id).await?;
        Ok((root, format!("{rel}/{name}")))
    }

    /// How long a call waits on long store work (a removal): the NFS backend's deadline for
    /// an NFS store, a call's usual bound for a directory store.
    pub(super) fn store_wait(&self, id: &SnapshotId) -> Result<Duration> {
        match &id.store {
            Store::Nfs(_) => Ok(self.nfs()?.store.op_timeout),
            Store::Dir(_) => Ok(LOCAL_STORE_WAIT),
        }
    }

    /// An error of long store work as `on_store` answers it, but a removal still going
    /// (Unavailable with its progress) answered as it is.
    pub(super) fn unreachable_unless_waiting(&self, id: &SnapshotId, e: Error) -> Error {
        match (&id.store, e) {
            (_, e @ (Error::NotReady(_) | Error::Store(_) | Error::Snapshot(_))) => e,
            (Store::Nfs(_), e) => store_unreachable(id, &e),
            (Store::Dir(_), e) => e,
        }
    }

    /// Runs `f` with the store's root and the snapshot's directory below it: on a blocking
    /// thread, under the NFS backend's deadline for an NFS store. What the store holds is
    /// answered as it is (`StoreError`); anything else from an NFS store is Unavailable.
    pub async fn on_store<T: Send + 'static>(
        &self,
        id: &SnapshotId,
        what: &str,
        f: impl FnOnce(&Path, &str) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (root, rel) = self.store_root(id).await?;
        let run = move || f(&root, &rel);
        match &id.store {
            Store::Dir(_) => tokio::task::spawn_blocking(run).await.map_err(|e| {
                Error::from(SnapshotError::Stopped {
                    what: format!("{what} on {}", id.location()),
                    cause: e.to_string(),
                })
            })?,
            Store::Nfs(_) => self
                .nfs()?
                .with_deadline(format!("{what} on {}", id.location()), run)
                .await
                .map_err(|e| match e {
                    // What the store holds, answered as it is.
                    e @ (Error::Store(_) | Error::Snapshot(_)) => e,
                    e => store_unreachable(id, &e),
                }),
        }
    }

    /// Whose the directory `id` names is (None: there is none), read from the store.
    pub async fn owner(&self, id: &SnapshotId) -> Result<Option<store::Owner>> {
        let (text, shown) = (id.to_string(), id.location());
        self.on_store(
            id,
            "reading the snapshot",
            move |root, rel| match SnapshotDir::open(root, rel, &shown)? {
                Some(dir) => dir.owner(&text, None).map(Some),
                None => Ok(None),
            },
        )
        .await
    }

    /// The manifest of `id` when the store holds that very snapshot, ready (None: no
    /// snapshot of that id is ready there).
    pub async fn manifest(&self, id: &SnapshotId) -> Result<Option<Manifest>> {
        Ok(match self.owner(id).await? {
            Some(store::Owner::Ours(m)) => m.map(|m| *m),
            _ => None,
        })
    }
}
