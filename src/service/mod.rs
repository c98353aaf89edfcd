//! The CSI services: thin handlers that parse the request, take the per-volume
//! guard, call the domain operation and let `From<Error> for Status` map the error.

pub mod controller;
mod gauges;
pub mod identity;
pub mod node;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::info;

use crate::error::{Error, Result};
use crate::locks::VolumeLocks;
use crate::os::Host;
use crate::pool::Pool;

pub struct Driver {
    pub name: String,
    pub version: String,
    pub node_id: String,
    pub allowed_roots: Vec<PathBuf>,
    pub pool: Pool,
    pub host: Arc<dyn Host>,
    pub locks: VolumeLocks,
    /// The GPUDirect Storage gate of NodePublishVolume; None: no GDS checks at all.
    pub gds_gate: Option<Arc<crate::gds_gate::GdsGate>>,
    /// The NFS backend; None: NFS volumes are refused with FailedPrecondition.
    pub nfs: Option<Arc<crate::nfs::NfsBackend>>,
    ready: AtomicBool,
}

impl Driver {
    pub fn new(
        name: String,
        node_id: String,
        allowed_roots: Vec<PathBuf>,
        pool: Pool,
        host: Arc<dyn Host>,
    ) -> Self {
        Driver {
            name,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            node_id,
            allowed_roots,
            pool,
            host,
            locks: VolumeLocks::default(),
            gds_gate: None,
            nfs: None,
            ready: AtomicBool::new(false),
        }
    }

    pub fn with_gds_gate(mut self, gate: crate::gds_gate::GdsGate) -> Self {
        self.gds_gate = Some(Arc::new(gate));
        self
    }

    pub fn with_nfs(mut self, nfs: crate::nfs::NfsBackend) -> Self {
        self.nfs = Some(Arc::new(nfs));
        self
    }

    /// Scans the pool and probes free devices; Probe answers ready only after this.
    pub async fn initialise(&self) -> Result<()> {
        let mounts = self.host.mount_table()?;
        self.pool.rescan(&mounts);
        self.pool.classify_free(self.host.as_ref()).await;
        let devices = self.pool.devices();
        info!(
            devices = devices.len(),
            free = self.pool.free_devices().len(),
            excluded = self.pool.excluded().len(),
            "pool ready"
        );
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn check_ready(&self) -> Result<()> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(Error::NotReady(
                "the device pool is still being scanned; retry shortly".into(),
            ))
        }
    }

    /// Topology key under which volumes and nodes are matched.
    pub fn node_topology_key(&self) -> String {
        format!("{}/node", self.name)
    }

    pub fn node_segment(&self) -> HashMap<String, String> {
        HashMap::from([(self.node_topology_key(), self.node_id.clone())])
    }
}
