//! The CSI services: thin handlers that parse the request, take the per-volume guard,
//! pick the backend from the parsed volume id and call it; `From<Error> for Status`
//! maps the error.

pub mod controller;
mod gauges;
pub mod identity;
pub mod node;
pub mod server;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result, SnapshotError, VolumeError};
use crate::gds::gate::GdsGate;
use crate::os::Host;
use crate::pool::Pool;
use crate::runtime::overlap::VolumeLocks;
use crate::snapshot::Snapshots;
use crate::volume::block::{BlockBackend, NodeIdentity};
use crate::volume::mounts::Mounter;
use crate::volume::nfs::{NfsBackend, NfsStore, NfsVolumeId};
use crate::volume::VolumeBackend;

/// The calls whose answer for an unknown volume id is not plain `NotFound`.
pub enum Call<'a> {
    Stage,
    Publish,
    Unstage(&'a Path),
    Delete,
    Other,
}

/// Which mount a take-down call removes.
#[derive(Clone, Copy)]
pub enum TakeDownOf {
    Staging,
    Target,
}

pub struct Driver {
    pub name: String,
    pub version: String,
    pub node_id: String,
    pub allowed_roots: Vec<PathBuf>,
    pub pool: Arc<Pool>,
    pub locks: VolumeLocks,
    /// The GPUDirect Storage gate of NodePublishVolume; None: no GDS checks at all.
    pub gds_gate: Option<Arc<GdsGate>>,
    pub block: BlockBackend,
    /// The NFS backend; None: NFS volumes are refused with FailedPrecondition.
    pub nfs: Option<NfsBackend>,
    /// Snapshots taken on this node; None: the snapshot calls answer FailedPrecondition.
    pub snapshots: Option<Snapshots>,
    pub host: Arc<dyn Host>,
}

impl Driver {
    pub fn new(
        name: String,
        node_id: String,
        allowed_roots: Vec<PathBuf>,
        pool: Pool,
        host: Arc<dyn Host>,
    ) -> Self {
        let pool = Arc::new(pool);
        let node = NodeIdentity {
            node_id: node_id.clone(),
            topology_key: format!("{name}/node"),
        };
        let mounter = Mounter::new(Arc::clone(&host), allowed_roots.clone());
        Driver {
            block: BlockBackend::new(mounter, Arc::clone(&pool), node),
            name,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            node_id,
            allowed_roots,
            pool,
            locks: VolumeLocks::default(),
            gds_gate: None,
            nfs: None,
            snapshots: None,
            host,
        }
    }

    pub fn with_gds_gate(mut self, gate: GdsGate) -> Self {
        let gate = Some(Arc::new(gate));
        self.block.set_gate(gate.clone());
        if let Some(nfs) = &mut self.nfs {
            nfs.set_gate(gate.clone());
        }
        self.gds_gate = gate;
        self
    }

    /// The host port with the allowed roots, for teardown of NFS volumes in an instance
    /// without the NFS backend.
    pub fn mounter(&self) -> Mounter {
        Mounter::new(Arc::clone(&self.host), self.allowed_roots.clone())
    }

    pub fn with_nfs(mut self, store: NfsStore) -> Self {
        let mounter = self.mounter();
        let mut nfs = NfsBackend::new(store, mounter, self.name.clone());
        nfs.set_gate(self.gds_gate.clone());
        self.nfs = Some(nfs);
        self.block.allow_nfs_sources();
        self
    }

    pub fn with_snapshots(mut self, snapshots: Snapshots) -> Self {
        self.block.set_freeze_limit(snapshots.freeze_limit);
        self.snapshots = Some(snapshots);
        self
    }

    /// What the snapshot calls reach, or FailedPrecondition when this instance takes none.
    pub fn snapshot_context(&self) -> Result<crate::snapshot::Context<'_>> {
        let snapshots = self.snapshots.as_ref().ok_or(SnapshotError::NotKept)?;
        Ok(crate::snapshot::Context {
            snapshots,
            block: &self.block,
            nfs: self.nfs.as_ref(),
            node_id: &self.node_id,
            host: &self.block.mounter.host,
        })
    }

    /// The NFS backend, or FailedPrecondition when this instance has none.
    pub fn nfs(&self) -> Result<&NfsBackend> {
        self.nfs
            .as_ref()
            .ok_or_else(|| VolumeError::NfsDisabled.into())
    }

    /// What a call answers for a volume id this driver never issued, in one place.
    pub fn unknown_volume<T: Default>(&self, call: Call<'_>, raw: &str) -> Result<T> {
        match call {
            // Never issued by this driver, so it does not exist: deleting it succeeds.
            Call::Delete => Ok(T::default()),
            // Nothing at the staging path is success; anything there is not ours.
            Call::Unstage(staging) => self
                .block
                .unstage_unknown(raw, staging)
                .map(|()| T::default()),
            // Checked as a block volume's would be (its capability when parsed) first.
            Call::Stage | Call::Publish => {
                self.check_ready()?;
                Err(Error::VolumeNotFound(raw.to_owned()))
            }
            Call::Other => Err(Error::VolumeNotFound(raw.to_owned())),
        }
    }

    /// NFS unstage and unpublish need only the mount table: they work, as teardown must,
    /// in an instance without the NFS backend.
    pub async fn nfs_take_down(&self, id: &NfsVolumeId, of: TakeDownOf, path: &Path) -> Result<()> {
        match (&self.nfs, of) {
            (Some(nfs), TakeDownOf::Staging) => nfs.unstage(id, path).await,
            (Some(nfs), TakeDownOf::Target) => nfs.unpublish(id, path).await,
            (None, TakeDownOf::Staging) => {
                crate::volume::nfs::node::unstage(&self.mounter(), id, path).await
            }
            (None, TakeDownOf::Target) => {
                crate::volume::nfs::node::unpublish(&self.mounter(), id, path).await
            }
        }
    }

    /// Scans the pool and probes free devices; Probe answers ready only after this.
    pub async fn initialise(&self) -> Result<()> {
        self.block.initialise().await?;
        if let Some(s) = &self.snapshots {
            // A killed driver's private mounts would hold their volumes in use for ever.
            s.take_down_leftovers(self.host.as_ref()).await?;
        }
        Ok(())
    }

    pub fn is_ready(&self) -> bool {
        self.block.is_ready()
    }

    pub fn check_ready(&self) -> Result<()> {
        self.block.check_ready()
    }

    /// Topology key under which volumes and nodes are matched.
    pub fn node_topology_key(&self) -> String {
        self.block.node.topology_key.clone()
    }

    pub fn node_segment(&self) -> HashMap<String, String> {
        self.block.node.segment()
    }
}
