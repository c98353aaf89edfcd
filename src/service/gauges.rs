//! The service's side of the scrape-time gauges: the pool's numbers and readiness.

use crate::metrics::{PoolGauges, PoolSnapshot};

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
}
