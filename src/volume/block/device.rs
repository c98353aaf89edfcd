//! The whole-device layout: a volume is one whole device of the pool.

use std::sync::Arc;

use async_trait::async_trait;

use super::layout::{Capacity, Layout};
use crate::csi::id::BlockVolumeId;
use crate::error::Result;
use crate::os::{Host, MountEntry};
use crate::pool::{AllocationRequest, Pool, PoolDevice, VolumeRecord};

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
