//! The block backend: node-local volumes on the node's devices. Each operation decides
//! from the mount table and the device's signatures, so every call is safe to repeat and
//! survives a plugin restart.
//!
//! Where a volume's block device comes from and goes back to, and what staging it needs
//! first, is its layout: the `Layout` seam, defined here. Three implement it: the whole
//! device (`WholeDevice`, here), a GPT partition (`partition/`) and an md RAID0 stripe over
//! partitions (`stripe/`); the stage/publish/stats code above it is the same for all.

mod content;
pub mod controller;
pub mod expand;
pub mod fill;
pub mod freeze;
pub mod partition;
pub mod publish;
pub mod stage;
pub mod stats;
pub mod stripe;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tracing::{info, warn};

pub use stage::{decide_format, FormatDecision};

use crate::csi;
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::error::{Error, Result, VolumeError};
use crate::gds::gate::GdsGate;
use crate::os::{Host, MountEntry, StripeGeometry};
use crate::pool::{AllocationRequest, Content, Pool, PoolDevice, VolumeRecord};
use crate::request::Capability;
use crate::volume::mounts::Mounter;
use crate::volume::{ContentView, Expand, Expanded, Publish, Stage, Staged, VolumeBackend};

/// Which node this is, as the block backend's volumes and topology name it.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub node_id: String,
    /// The topology key under which volumes and nodes are matched (`<driver>/node`).
    pub topology_key: String,
}

impl NodeIdentity {
    pub fn segment(&self) -> HashMap<String, String> {
        HashMap::from([(self.topology_key.clone(), self.node_id.clone())])
    }
}

pub struct BlockBackend {
    pub(crate) mounter: Mounter,
    pub(crate) pool: Arc<Pool>,
    pub(crate) layout: Arc<dyn Layout>,
    pub(crate) partitioned: Arc<partition::Partitioned>,
    pub(crate) striped: Arc<stripe::Striped>,
    pub(crate) gate: Option<Arc<GdsGate>>,
    pub(crate) node: NodeIdentity,
    /// Clone copies running or finished.
    pub(crate) clones: Arc<crate::volume::copy::Cloner>,
    /// This instance runs the NFS backend too, so a clone may mount an NFS source.
    pub(crate) nfs_sources: bool,
    /// The longest a clone's source in use stays frozen for the copy's last pass.
    pub(crate) freeze_limit: std::time::Duration,
    ready: AtomicBool,
}

/// The volume's record and where its device is now.
#[derive(Clone)]
pub struct Located {
    pub id: BlockVolumeId,
    pub record: VolumeRecord,
    pub device: PoolDevice,
}

impl BlockBackend {
    pub fn new(mounter: Mounter, pool: Arc<Pool>, node: NodeIdentity) -> Self {
        let layout = Arc::new(WholeDevice {
            pool: Arc::clone(&pool),
        });
        let partitioned = Arc::new(partition::Partitioned::new(Arc::clone(&pool)));
        let striped = Arc::new(stripe::Striped::new(
            Arc::clone(&pool),
            Arc::clone(&partitioned),
        ));
        BlockBackend {
            mounter,
            pool,
            layout,
            partitioned,
            striped,
            gate: None,
            node,
            clones: Arc::default(),
            nfs_sources: false,
            freeze_limit: freeze::LIMIT,
            ready: AtomicBool::new(false),
        }
    }

    pub fn set_gate(&mut self, gate: Option<Arc<GdsGate>>) {
        self.gate = gate;
    }

    /// Clones of NFS directories may be filled here (the instance runs the NFS backend).
    pub fn allow_nfs_sources(&mut self) {
        self.nfs_sources = true;
    }

    /// The longest a clone's source in use stays frozen (`--snapshot-freeze-limit`).
    pub fn set_freeze_limit(&mut self, limit: std::time::Duration) {
        self.freeze_limit = limit;
    }

    /// Scans the pool and probes free devices; the backend is ready only after this.
    pub async fn initialise(&self) -> Result<()> {
        let mounts = self.mounter.mount_table()?;
        fill::record_class_datasets(self)?;
        freeze::thaw_recorded(self.pool.state_dir(), &mounts);
        self.pool.rescan(&mounts);
        self.pool.classify_free(self.mounter.host.as_ref()).await;
        self.partitioned.resync();
        self.partitioned.settle_moves().await;
        let devices = self.pool.devices().len();
        info!(
            devices,
            free = self.pool.free_devices().len(),
            excluded = self.pool.excluded().len(),
            "pool ready"
        );
        if devices == 0 {
            warn!("{}", self.empty_pool());
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Why no block volume can be made here: the pool holds no device, and what it left out.
    pub(crate) fn empty_pool(&self) -> crate::error::AllocationError {
        crate::error::AllocationError::EmptyPool {
            node: self.node.node_id.clone(),
            excluded: (self.pool.excluded().iter())
                .map(|e| format!("{}: {}", e.device, e.reason))
                .collect(),
        }
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

    /// The layout that owns volumes of this kind.
    pub(crate) fn layout_of(&self, kind: IdLayout) -> &dyn Layout {
        match kind {
            IdLayout::Device => self.layout.as_ref(),
            IdLayout::Partition => self.partitioned.as_ref(),
            IdLayout::Stripe => self.striped.as_ref(),
        }
    }

    fn record(&self, raw: &str) -> Result<VolumeRecord> {
        self.pool
            .state
            .snapshot()
            .get(raw)
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))
    }

    pub fn locate(&self, id: &BlockVolumeId) -> Result<Located> {
        let raw = id.to_string();
        if id.node_id != self.node.node_id {
            return Err(VolumeError::NotOnThisNode {
                volume: raw,
                node: id.node_id.clone(),
                this: self.node.node_id.clone(),
            }
            .into());
        }
        let record = self.record(&raw)?;
        let mounts = self.mounter.mount_table()?;
        let device = self
            .layout_of(id.layout)
            .locate(&record, &mounts)?
            .ok_or_else(|| VolumeError::DeviceAbsent {
                volume: raw.clone(),
                key: record.device_key.clone(),
            })?;
        Ok(Located {
            id: id.clone(),
            record,
            device,
        })
    }

    /// The volume's device for taking its mounts down: as the kernel shows it, found from
    /// the record alone where the layout can (another tool's change to a label never
    /// keeps the kubelet from unstaging), else [`BlockBackend::locate`]'s.
    pub fn mounted_device(&self, id: &BlockVolumeId) -> Result<PoolDevice> {
        if id.node_id == self.node.node_id {
            let record = self.record(&id.to_string())?;
            let mounts = self.mounter.mount_table()?;
            if let Some(device) = self.layout_of(id.layout).shown(&record, &mounts) {
                return Ok(device);
            }
        }
        self.locate(id).map(|l| l.device)
    }

    /// `vol.device` is still the device allocated to the volume: call right before every
    /// destructive step and mount. A partition the kernel re-created at another number is
    /// located again and checked again: udevd re-reads a disk's table once a label writer
    /// closes it, possibly after our lock is let go (`gpt::wholedisk`,
    /// `synthesize_change`), and an NVMe's partitions come back with new minors. Locating
    /// takes the disk's lock, so it waits for a re-read in progress.
    pub fn verify_located(&self, vol: &mut Located) -> Result<()> {
        let raw = vol.id.to_string();
        let moved = match self.pool.verify_identity(&raw, &vol.device, &vol.record) {
            Err(Error::Volume(VolumeError::DeviceMoved { from, now, .. })) => (from, now),
            other => return other,
        };
        let again = self.locate(&vol.id)?;
        self.pool
            .verify_identity(&raw, &again.device, &again.record)?;
        info!(
            volume_id = %raw,
            device = %again.device.path.display(),
            from = %moved.0,
            seen = %moved.1,
            now = %format!("{}:{}", again.device.major, again.device.minor),
            "partition re-created by the kernel; located again by its PARTUUID"
        );
        *vol = again;
        Ok(())
    }

    /// NodeUnstageVolume of an id this driver never issued: nothing at the staging path
    /// is success, anything there is not a volume of ours.
    pub fn unstage_unknown(&self, raw: &str, staging: &Path) -> Result<()> {
        let mounts = self.mounter.mount_table()?;
        if crate::os::mount::at(&mounts, staging).is_none() {
            return Ok(());
        }
        Err(Error::VolumeNotFound(raw.to_owned()))
    }
}

#[async_trait]
impl VolumeBackend for BlockBackend {
    type Id = BlockVolumeId;
    type Capability = Capability;

    async fn delete(&self, id: &BlockVolumeId) -> Result<()> {
        controller::delete(self, id).await
    }

    async fn expand(&self, id: &BlockVolumeId, req: &Expand) -> Result<Expanded> {
        expand::expand(self, id, req).await
    }

    async fn node_expand(&self, id: &BlockVolumeId, path: &Path, req: &Expand) -> Result<u64> {
        expand::node_expand(self, id, path, req).await
    }

    fn list(&self, after: Option<&str>, limit: usize) -> Vec<(String, csi::Volume)> {
        controller::list(self, after, limit)
    }

    async fn validate(
        &self,
        id: &BlockVolumeId,
        caps: &[csi::VolumeCapability],
    ) -> Result<Option<String>> {
        controller::validate(self, id, caps)
    }

    async fn stage(&self, id: &BlockVolumeId, req: &Stage<Capability>) -> Result<Staged> {
        stage::stage(self, id, req).await
    }

    async fn unstage(&self, id: &BlockVolumeId, staging: &Path) -> Result<()> {
        stage::unstage(self, id, staging).await
    }

    async fn publish(&self, id: &BlockVolumeId, req: &Publish<Capability>) -> Result<()> {
        publish::publish(self, id, req).await
    }

    async fn unpublish(&self, id: &BlockVolumeId, target: &Path) -> Result<()> {
        publish::unpublish(self, id, target).await
    }

    async fn stats(
        &self,
        id: &BlockVolumeId,
        path: &Path,
        staging: Option<&Path>,
    ) -> Result<csi::NodeGetVolumeStatsResponse> {
        stats::stats(self, id, path, staging)
    }

    fn capacity_of(&self, id: &BlockVolumeId) -> Option<u64> {
        content::capacity_of(self, id)
    }

    async fn content_view(&self, id: &BlockVolumeId) -> Result<ContentView> {
        content::view(self, id)
    }

    fn filling_from(&self, source: &str) -> Result<Vec<String>> {
        let clones = fill::unfilled_clones_of(self, source)?;
        Ok(clones.iter().map(ToString::to_string).collect())
    }

    fn restored_from(&self, name: &str, snapshot: &crate::csi::id::SnapshotId) -> Option<Content> {
        content::restored_from(self, name, snapshot)
    }
}

/// GetCapacity's answer for this layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// What all new volumes together could get now.
    pub available: u64,
    /// The largest single volume that fits now; None when nothing is free.
    pub maximum: Option<u64>,
}

#[async_trait]
pub trait Layout: Send + Sync {
    /// A block device for a new volume (idempotent by name), recorded before it is
    /// returned.
    async fn allocate(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)>;
    /// Gives the volume's device back (erased), resumable after a crash at any step.
    async fn release(
        &self,
        host: &Arc<dyn Host>,
        id: &BlockVolumeId,
        mounts: &[MountEntry],
    ) -> Result<()>;
    /// Where the volume's block device is now; None when it is not present; an error
    /// naming the cause when it is present but cannot be used as it is.
    fn locate(&self, record: &VolumeRecord, mounts: &[MountEntry]) -> Result<Option<PoolDevice>>;
    /// Where the kernel shows the volume's device now, found from the record alone, for
    /// taking its mounts down (NodeUnstage, NodeUnpublish must work whatever happened to
    /// what `locate` reads). None: ask `locate`.
    fn shown(&self, _record: &VolumeRecord, _mounts: &[MountEntry]) -> Option<PoolDevice> {
        None
    }
    fn capacity(&self) -> Capacity;
    /// NodeStage's step before the volume is located: what must exist for its device to
    /// be there at all (a stripe's md array assembled). Idempotent.
    async fn prepare_stage(&self, _host: &dyn Host, _id: &BlockVolumeId) -> Result<()> {
        Ok(())
    }
    /// The geometry mkfs aligns the volume's filesystem to (a stripe's chunk and width).
    fn mkfs_geometry(&self, _record: &VolumeRecord) -> Result<Option<StripeGeometry>> {
        Ok(None)
    }
    /// NodeUnstage's step once nothing is mounted: what `prepare_stage` made taken down
    /// again (a stripe's array stopped). Idempotent.
    async fn after_unstage(&self, _host: &dyn Host, _id: &BlockVolumeId) -> Result<()> {
        Ok(())
    }
}

pub struct WholeDevice {
    pub pool: Arc<Pool>,
}

#[async_trait]
impl Layout for WholeDevice {
    async fn allocate(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)> {
        self.pool.allocate(host, req).await
    }

    async fn release(
        &self,
        host: &Arc<dyn Host>,
        id: &BlockVolumeId,
        mounts: &[MountEntry],
    ) -> Result<()> {
        self.pool.release(host, &id.to_string(), mounts).await
    }

    fn locate(&self, record: &VolumeRecord, mounts: &[MountEntry]) -> Result<Option<PoolDevice>> {
        // Hot-plugged, renamed, re-attached or re-pointed since the last scan: look again.
        Ok(self.pool.fresh_device(&record.device_id, mounts))
    }

    fn capacity(&self) -> Capacity {
        let free = self.pool.free_devices();
        Capacity {
            available: free.iter().map(|d| d.size_bytes).sum(),
            maximum: free.iter().map(|d| d.size_bytes).max(),
        }
    }
}
