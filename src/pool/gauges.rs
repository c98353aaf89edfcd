//! The pool's numbers for the scrape-time gauges (`metrics::PoolGauges`).

use crate::metrics::{PoolSnapshot, StateCounts};

use super::Pool;

impl Pool {
    /// Devices and bytes by state now; `ready` is the service's to fill in.
    pub fn gauges(&self) -> PoolSnapshot {
        let devices = self.devices();
        let state = self.state.snapshot();
        let free = self.free_devices();
        let size = |d: &super::PoolDevice| d.size_bytes as i64;
        let allocated: Vec<_> = devices
            .iter()
            .filter(|d| state.by_device(&d.id).is_some())
            .collect();
        PoolSnapshot {
            devices: StateCounts {
                total: devices.len() as i64,
                free: free.len() as i64,
                allocated: allocated.len() as i64,
            },
            bytes: StateCounts {
                total: devices.iter().map(size).sum(),
                free: free.iter().map(size).sum(),
                allocated: allocated.iter().map(|d| size(d)).sum(),
            },
            excluded: self.excluded().len() as i64,
            ready: false,
        }
    }
}
