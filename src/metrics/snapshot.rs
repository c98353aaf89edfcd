//! The snapshots' figures: how many were taken and failed, how long the last one took,
//! and how long a mounted volume's filesystem was last frozen for one.

use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Default)]
struct SnapshotMetrics {
    taken: Counter,
    failed: Counter,
    last_seconds: Gauge<f64, AtomicU64>,
    last_freeze_seconds: Gauge<f64, AtomicU64>,
}

static SNAPSHOTS: LazyLock<SnapshotMetrics> = LazyLock::new(SnapshotMetrics::default);

/// A snapshot's copy ended well after `seconds` (this process's part of it).
pub fn taken(seconds: f64) {
    SNAPSHOTS.taken.inc();
    SNAPSHOTS.last_seconds.set(seconds);
}

pub fn failed() {
    SNAPSHOTS.failed.inc();
}

/// A mounted volume was frozen `seconds` for a snapshot's last pass.
pub fn frozen(seconds: f64) {
    SNAPSHOTS.last_freeze_seconds.set(seconds);
}

pub fn register(r: &mut Registry) {
    r.register(
        "gds_csi_snapshots_taken",
        "Snapshots whose copy completed and whose manifest was written",
        SNAPSHOTS.taken.clone(),
    );
    r.register(
        "gds_csi_snapshot_failures",
        "Snapshot copies that failed (each is retried by the next CreateSnapshot)",
        SNAPSHOTS.failed.clone(),
    );
    r.register(
        "gds_csi_snapshot_last_duration_seconds",
        "How long the last snapshot's copy took in this driver process",
        SNAPSHOTS.last_seconds.clone(),
    );
    r.register(
        "gds_csi_snapshot_last_freeze_seconds",
        "How long a mounted volume's filesystem was frozen for the last snapshot of one",
        SNAPSHOTS.last_freeze_seconds.clone(),
    );
}
