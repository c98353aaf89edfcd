//! The service's side of the scrape-time gauges: the pool's numbers and readiness, each
//! layout's capacity, the gate's node readiness and compat-mode volumes.

use crate::csi::id::IdLayout;
use crate::metrics::{LayoutCapacity, PoolGauges, PoolSnapshot};

use super::Driver;

impl PoolGauges for Driver {
    fn driver_name(&self) -> String {
        self.name.clone()
    }

    fn pool_snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            ready: self.is_ready(),
            ..self.pool.gauges()
        }
    }

    fn layout_capacity(&self) -> Vec<LayoutCapacity> {
        [
            (IdLayout::Device, "device"),
            (IdLayout::Partition, "partition"),
            (IdLayout::Stripe, "stripe"),
        ]
        .into_iter()
        .map(|(kind, layout)| {
            let c = self.block.layout_of(kind).capacity();
            LayoutCapacity {
                layout,
                available: c.available as i64,
                largest: c.maximum.unwrap_or(0) as i64,
            }
        })
        .collect()
    }

    fn gds_readiness(&self) -> Vec<(&'static str, bool)> {
        let Some(gate) = &self.gds_gate else {
            return Vec::new();
        };
        gate.node_readiness()
            .into_iter()
            .map(|(key, ready)| (key.strip_prefix("gds-").unwrap_or(key), ready))
            .collect()
    }

    fn compat_volumes(&self) -> Option<i64> {
        let gate = self.gds_gate.as_ref()?;
        Some(gate.compat_volumes() as i64)
    }
}
