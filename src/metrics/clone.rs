//! The clone copies' figures: bytes copied and to copy and the copy's
//! duration per volume, failures by cause.

use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub volume: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

#[derive(Default)]
pub struct CloneMetrics {
    pub copied: Family<VolumeLabels, Gauge>,
    pub total: Family<VolumeLabels, Gauge>,
    pub seconds: Family<VolumeLabels, Gauge<f64, AtomicU64>>,
    pub failures: Family<CauseLabels, Counter>,
}

static CLONES: LazyLock<CloneMetrics> = LazyLock::new(CloneMetrics::default);

fn volume(v: &str) -> VolumeLabels {
    VolumeLabels {
        volume: v.to_owned(),
    }
}

/// Where a clone's copy stands now.
pub fn progress(vol: &str, copied: u64, total: u64) {
    CLONES.copied.get_or_create(&volume(vol)).set(copied as i64);
    CLONES.total.get_or_create(&volume(vol)).set(total as i64);
}

/// The copy ended after `seconds` (this process's part of it).
pub fn finished(vol: &str, seconds: f64) {
    CLONES.seconds.get_or_create(&volume(vol)).set(seconds);
}

/// A copy failed: `source_in_use`, `mount`, `copy`, `verify`, `other`.
pub fn failed(cause: &'static str) {
    CLONES.failures.get_or_create(&CauseLabels { cause }).inc();
}

/// A deleted clone's series go.
pub fn forget(vol: &str) {
    CLONES.copied.remove(&volume(vol));
    CLONES.total.remove(&volume(vol));
    CLONES.seconds.remove(&volume(vol));
}

pub fn register(r: &mut Registry) {
    r.register(
        "gds_csi_clone_copied_bytes",
        "Bytes a clone's copy has written, per volume",
        CLONES.copied.clone(),
    );
    r.register(
        "gds_csi_clone_total_bytes",
        "Bytes a clone's copy has to write, per volume",
        CLONES.total.clone(),
    );
    r.register(
        "gds_csi_clone_duration_seconds",
        "How long a clone's copy took in this driver process, per volume",
        CLONES.seconds.clone(),
    );
    r.register(
        "gds_csi_clone_failures",
        "Clone copies that failed, by cause",
        CLONES.failures.clone(),
    );
}
