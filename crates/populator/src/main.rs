//! gds-csi-populator: a claim whose `dataSourceRef` names a Dataset (gds-csi.io) gets a
//! volume of this driver filled with it before it binds, on the node the scheduler chose,
//! through the Volume Populator flow (Kubernetes 1.33+: the external-provisioner leaves
//! such a claim to a populator). Progress goes to the Dataset's status and the claim's
//! events.

mod controller;
mod dataset;
mod fill;
mod metrics;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tracing::info;

use controller::{Config, Controller, COMPONENT};
use fill::PodConfig;

#[derive(Parser, Debug)]
#[command(name = "gds-csi-populator", version, about)]
struct Args {
    /// CSI driver name: only claims of this driver's classes are filled.
    #[arg(
        long,
        env = "GDS_CSI_DRIVER_NAME",
        default_value = "gds.csi.gds-csi.io"
    )]
    driver_name: String,
    /// The namespace of the fills' own claims and pods (the populator's).
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// The driver's image: the fill pods run its `gds-csi populate`.
    #[arg(long, env = "GDS_CSI_POPULATOR_IMAGE")]
    image: String,
    #[arg(long, default_value = "IfNotPresent")]
    image_pull_policy: String,
    /// The node directory Datasets' `nodePath` may name (beneath it only); empty: none.
    #[arg(long, env = "GDS_CSI_NODE_DATASET_ROOT", default_value = "")]
    node_dataset_root: String,
    /// The driver's state directory on the nodes (the copies' records go below it).
    #[arg(long, env = "GDS_CSI_STATE_DIR", default_value = "/var/lib/gds-csi")]
    state_dir: PathBuf,
    /// Time between passes over the claims.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Time before a failed fill is tried again.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    retry_after: Duration,
    /// Deadline of each API call.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    api_timeout: Duration,
    /// Serve /metrics and /healthz on HOST:PORT; empty: off.
    #[arg(long, default_value = "")]
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
    let root = (!args.node_dataset_root.is_empty()).then(|| PathBuf::from(&args.node_dataset_root));
    if root.as_ref().is_some_and(|r| !r.is_absolute()) {
        return Err(format!(
            "--node-dataset-root {:?}: an absolute path is needed",
            args.node_dataset_root
        )
        .into());
    }
    let metrics = metrics::Metrics::default();
    if !args.metrics_address.is_empty() {
        gds_csi_metrics_http::start(&args.metrics_address, metrics.registry()).await?;
    }
    let client = kube::Client::try_default().await?;
    let calls = gds_csi_kube::Calls::new(client, args.api_timeout, COMPONENT);
    info!(driver = %args.driver_name, namespace = %args.namespace, root = ?root, "started");
    let cfg = Config {
        driver: args.driver_name,
        fill: PodConfig {
            namespace: args.namespace,
            image: args.image,
            pull_policy: args.image_pull_policy,
            node_root: root,
            state_dir: args.state_dir,
        },
        retry_after: args.retry_after,
    };
    let mut controller = Controller::new(calls, cfg, metrics);
    gds_csi_kube::run_passes(&mut controller, args.interval).await?;
    Ok(())
}
