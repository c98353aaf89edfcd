//! The populator's Prometheus metrics, served (`/metrics`, `/healthz`) by the server the
//! driver's processes share (crates/metrics-http).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabel {
    pub namespace: String,
    pub claim: String,
    pub dataset: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

#[derive(Default, Clone)]
pub struct Metrics {
    /// Claims naming a Dataset, by phase, as the last pass saw them.
    pub claims: Family<PhaseLabel, Gauge>,
    /// Bytes copied and to copy of each fill under way.
    pub copied: Family<ClaimLabel, Gauge>,
    pub total: Family<ClaimLabel, Gauge>,
    /// Fills that failed (each failed pod once).
    pub failures: Counter,
    /// Passes, by `ok`/`error`.
    pub passes: Family<OutcomeLabel, Counter>,
}

impl Metrics {
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("gds_csi_populator");
        r.register(
            "claims",
            "Claims naming a Dataset, by phase (Pending, Copying, Done, Failed)",
            self.claims.clone(),
        );
        r.register(
            "copied_bytes",
            "Bytes a fill under way has copied",
            self.copied.clone(),
        );
        r.register(
            "total_bytes",
            "Bytes a fill under way copies in all",
            self.total.clone(),
        );
        r.register(
            "fill_failures",
            "Fills that failed (retried after --retry-after)",
            self.failures.clone(),
        );
        r.register(
            "passes",
            "Passes over the claims, by outcome",
            self.passes.clone(),
        );
        r
    }
}
