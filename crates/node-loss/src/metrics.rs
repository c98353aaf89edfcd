//! The controller's Prometheus metrics, served (`/metrics`, `/healthz`) by the server the
//! driver's processes share (crates/metrics-http).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeAction {
    pub node: String,
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone)]
pub struct Metrics {
    /// Our local volumes on nodes deleted longer than the grace period, still there.
    pub claims: Family<NodeAction, Gauge>,
    /// Nodes our volumes are pinned to whose Node object is absent, by `in_grace`/`lost`.
    pub missing_nodes: Family<StateLabel, Gauge>,
    /// Claims re-created unbound (their old PV deleted), by node.
    pub recreated: Family<NodeLabel, Counter>,
    /// Passes, by `ok`/`error`.
    pub passes: Family<OutcomeLabel, Counter>,
    /// How long a pass takes: it grows with the Nodes and PVs listed.
    pub pass_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            claims: Family::default(),
            missing_nodes: Family::default(),
            recreated: Family::default(),
            passes: Family::default(),
            // 1 ms to about 16 s.
            pass_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
        }
    }
}

impl Metrics {
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("gds_csi_node_loss");
        r.register(
            "claims",
            "Local volumes of this driver pinned to a node deleted longer than the grace period, by node and configured action",
            self.claims.clone(),
        );
        r.register(
            "missing_nodes",
            "Nodes that local volumes are pinned to whose Node object is absent (state in_grace or lost)",
            self.missing_nodes.clone(),
        );
        r.register(
            "recreated_claims",
            "Claims re-created unbound after their node was lost (their PV deleted)",
            self.recreated.clone(),
        );
        r.register(
            "pass_seconds",
            "Time a reconcile pass over Nodes and PersistentVolumes takes",
            self.pass_seconds.clone(),
        );
        r.register(
            "passes",
            "Reconcile passes over Nodes and PersistentVolumes, by outcome",
            self.passes.clone(),
        );
        r
    }
}
