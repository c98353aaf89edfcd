//! gds-csi-node-loss: notices Node objects deleted for longer than a grace period and,
//! for this driver's local volumes pinned to them, reports (an Event and a metric) or
//! deletes the PV and re-creates the claim unbound, so a StatefulSet's pod can be
//! scheduled elsewhere. NFS volumes and other drivers' volumes are never touched.

mod claim;
mod clock;
mod controller;
mod metrics;
mod volumes;

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Parser;
use tracing::info;

use controller::{Action, Config, Controller};
use volumes::Selector;

#[derive(Parser, Debug)]
#[command(name = "gds-csi-node-loss", version, about)]
struct Args {
    /// CSI driver name: only PVs whose spec.csi.driver is this are considered.
    #[arg(
        long,
        env = "GDS_CSI_DRIVER_NAME",
        default_value = "gds.csi.gds-csi.io"
    )]
    driver_name: String,
    /// Node-affinity key that pins a local volume to its node (default `<driver-name>/node`).
    #[arg(long, env = "GDS_CSI_NODE_LOSS_TOPOLOGY_KEY")]
    topology_key: Option<String>,
    /// How long a Node object must stay absent, without a gap, before acting.
    #[arg(long, env = "GDS_CSI_NODE_LOSS_GRACE_PERIOD", default_value = "30m", value_parser = humantime::parse_duration)]
    grace_period: Duration,
    /// What to do with a lost node's claims.
    #[arg(
        long,
        env = "GDS_CSI_NODE_LOSS_ACTION",
        value_enum,
        default_value = "report"
    )]
    action: Action,
    /// Only PVs of this StorageClass (repeatable); none: every class of the driver.
    #[arg(
        long = "storage-class",
        env = "GDS_CSI_NODE_LOSS_STORAGE_CLASSES",
        value_delimiter = ','
    )]
    storage_classes: Vec<String>,
    /// Time between passes over Nodes and PersistentVolumes.
    #[arg(long, env = "GDS_CSI_NODE_LOSS_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Deadline of each API call.
    #[arg(long, env = "GDS_CSI_NODE_LOSS_API_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    api_timeout: Duration,
    /// Serve /metrics and /healthz on HOST:PORT; empty: off.
    #[arg(long, env = "GDS_CSI_NODE_LOSS_METRICS_ADDRESS", default_value = "")]
    metrics_address: String,
    /// text or json.
    #[arg(long, env = "GDS_CSI_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    gds_csi_kube::init_logging(&args.log_format);
    gds_csi_kube::exit_code(run(args).await)
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let topology_key = args
        .topology_key
        .clone()
        .unwrap_or_else(|| format!("{}/node", args.driver_name));
    let metrics = metrics::Metrics::default();
    if !args.metrics_address.is_empty() {
        gds_csi_metrics_http::start(&args.metrics_address, metrics.registry()).await?;
    }
    // In the cluster: the pod's ServiceAccount; outside: KUBECONFIG. The client's own
    // timeouts bound connects and reads; each call also has --api-timeout.
    let client = kube::Client::try_default().await?;
    let classes: BTreeSet<String> = args
        .storage_classes
        .iter()
        .filter(|c| !c.is_empty())
        .cloned()
        .collect();
    info!(driver = %args.driver_name, %topology_key, grace = ?args.grace_period, action = ?args.action,
        classes = ?classes, interval = ?args.interval,
        "started: the grace period of a node already absent counts from now (a restart never shortens it)");
    let cfg = Config {
        selector: Selector {
            driver: args.driver_name,
            topology_key,
            classes,
        },
        grace: args.grace_period,
        action: args.action,
        api_timeout: args.api_timeout,
    };
    let mut controller = Controller::new(client, cfg, metrics);
    gds_csi_kube::run_passes(&mut controller, args.interval).await?;
    Ok(())
}
