//! The `/metrics` endpoint at `--metrics-address`, served by the server the driver's
//! processes share (crates/metrics-http).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::{registry, PoolGauges};

/// Binds `address` (HOST:PORT) and serves metrics on it in the background; an empty
/// address turns metrics off. Returns the bound address (useful with port 0).
pub async fn start(
    address: &str,
    pool: Option<Arc<dyn PoolGauges>>,
    host_proc: PathBuf,
) -> Result<Option<SocketAddr>, String> {
    let address = address.trim();
    if address.is_empty() {
        return Ok(None);
    }
    let bound = gds_csi_metrics_http::start(address, registry(pool, host_proc))
        .await
        .map_err(|e| format!("--metrics-address {address:?}: {e}"))?;
    Ok(Some(bound))
}
