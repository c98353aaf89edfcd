//! What differs between the layouts of a block volume on the node's devices: where a
//! volume's block device comes from and goes back to, and what staging it needs first.
//! Three implement it: the whole device (`WholeDevice`, here), a GPT partition
//! (`partition/`) and an md RAID0 stripe over partitions (`stripe/`); the
//! stage/publish/stats code above it is the same for all.

use std::sync::Arc;

use async_trait::async_trait;

use crate::csi::id::BlockVolumeId;
use crate::error::Result;
use crate::os::{Host, MountEntry, StripeGeometry};
use crate::pool::{AllocationRequest, Pool, PoolDevice, VolumeRecord};

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
