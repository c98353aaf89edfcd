//! The scrape-time collectors: the build, the device pool (through [`PoolGauges`]) and
//! nvidia-fs's own counters.

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Devices or bytes of the pool, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub total: i64,
    pub free: i64,
    pub allocated: i64,
}

impl StateCounts {
    /// Neither free nor allocated: free devices seen carrying a foreign signature.
    pub fn unavailable(&self) -> i64 {
        self.total - self.allocated - self.free
    }
}

/// The pool as one scrape sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub devices: StateCounts,
    pub bytes: StateCounts,
    /// Listed or discovered devices left out of the pool.
    pub excluded: i64,
    /// The pool has been scanned and Probe answers ready.
    pub ready: bool,
}

/// What one block layout could give new volumes now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayoutCapacity {
    /// `device`, `partition` or `stripe`.
    pub layout: &'static str,
    /// What all new volumes of the layout together could get.
    pub available: i64,
    /// The largest single volume that fits; 0 when nothing does.
    pub largest: i64,
}

/// What the scrape-time gauges read: implemented by the service over its pool and its
/// GDS gate, so metrics depend on nothing above them.
pub trait PoolGauges: Send + Sync {
    /// The `driver_name` label of `csi_plugin_operations_seconds`.
    fn driver_name(&self) -> String;
    /// The pool now.
    fn pool_snapshot(&self) -> PoolSnapshot;
    /// Each block layout's capacity now (GetCapacity's answer per layout).
    fn layout_capacity(&self) -> Vec<LayoutCapacity> {
        Vec::new()
    }
    /// The node's GDS readiness per backend (`nvme`, `nfs-rdma`) by the gate's node checks;
    /// empty without a gate.
    fn gds_readiness(&self) -> Vec<(&'static str, bool)> {
        Vec::new()
    }
    /// Volumes the gate published in compat mode (`preferred`, without true GDS); None
    /// without a gate.
    fn compat_volumes(&self) -> Option<i64> {
        None
    }
}

fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&'static str, i64)],
) -> Result<(), std::fmt::Error> {
    let mut family =
        encoder.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
    for (state, v) in values {
        let labels = [("state", *state)];
        ConstGauge::new(*v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: i64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

/// `gds_csi_build_info{version} 1`: which build a scrape came from.
#[derive(Debug)]
pub(super) struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "gds_csi_build_info",
            "The driver's build (always 1), by version",
            None,
            g.metric_type(),
        )?;
        let labels = [("version", env!("CARGO_PKG_VERSION"))];
        g.encode(family.encode_family(&labels)?)
    }
}

/// Pool gauges, read through [`PoolGauges`] at each scrape.
pub(super) struct PoolCollector {
    pub(super) source: Arc<dyn PoolGauges>,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolCollector")
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_pool(&mut encoder, self.source.pool_snapshot())?;
        encode_layouts(&mut encoder, &self.source.layout_capacity())?;
        encode_gds_readiness(&mut encoder, self.source.gds_readiness())?;
        if let Some(n) = self.source.compat_volumes() {
            gauge(
                &mut encoder,
                "gds_csi_compat_volumes",
                "Volumes published in compat mode (gdsPolicy preferred without true GDS): \
                 cuFile reads them through the CPU bounce buffer",
                n,
            )?;
        }
        Ok(())
    }
}

/// The pool's devices and bytes by state, its excluded devices and its readiness.
fn encode_pool(encoder: &mut DescriptorEncoder, s: PoolSnapshot) -> Result<(), std::fmt::Error> {
    let by_state = |c: StateCounts| {
        [
            ("total", c.total),
            ("free", c.free),
            ("allocated", c.allocated),
            ("unavailable", c.unavailable()),
        ]
    };
    gauge_family(
        encoder,
        "gds_csi_pool_devices",
        "Devices in this node's pool, by state (total, free, allocated, unavailable)",
        &by_state(s.devices),
    )?;
    gauge_family(
        encoder,
        "gds_csi_pool_bytes",
        "Capacity of this node's pool in bytes, by state (total, free, allocated, unavailable)",
        &by_state(s.bytes),
    )?;
    gauge(
        encoder,
        "gds_csi_pool_excluded_devices",
        "Listed or discovered devices left out of the pool (see the log for why)",
        s.excluded,
    )?;
    gauge(
        encoder,
        "gds_csi_ready",
        "1 once the pool has been scanned and Probe answers ready",
        i64::from(s.ready),
    )
}

/// Each block layout's capacity, by layout; no family when there are no layouts.
fn encode_layouts(
    encoder: &mut DescriptorEncoder,
    layouts: &[LayoutCapacity],
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        (
            "gds_csi_layout_available_bytes",
            "What all new volumes of a block layout together could get now, by layout",
            (|c: &LayoutCapacity| c.available) as fn(&LayoutCapacity) -> i64,
        ),
        (
            "gds_csi_layout_largest_volume_bytes",
            "The largest single new volume of a block layout that fits now, by layout",
            |c: &LayoutCapacity| c.largest,
        ),
    ] {
        if layouts.is_empty() {
            break;
        }
        let mut family =
            encoder.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
        for c in layouts {
            let labels = [("layout", c.layout)];
            ConstGauge::new(value(c)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// The gate's node readiness by backend; no family without a gate.
fn encode_gds_readiness(
    encoder: &mut DescriptorEncoder,
    readiness: Vec<(&'static str, bool)>,
) -> Result<(), std::fmt::Error> {
    if readiness.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "gds_csi_gds_node_ready",
        "1 when the gate's node checks pass for a backend (nvme, nfs-rdma): the same \
         answer as the node's gds-nvme / gds-nfs-rdma topology labels",
        None,
        ConstGauge::new(0i64).metric_type(),
    )?;
    for (backend, ready) in readiness {
        let labels = [("backend", backend)];
        ConstGauge::new(i64::from(ready)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// nvidia-fs's own counters, re-exported when `/proc/driver/nvidia-fs/stats` exists.
#[derive(Debug)]
pub(super) struct NvfsCollector {
    pub(super) stats: PathBuf,
}

impl Collector for NvfsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let parsed = std::fs::read_to_string(&self.stats)
            .ok()
            .and_then(|text| gds_check::parse::parse_stats(&text).ok());
        gauge(
            &mut encoder,
            "gds_csi_nvfs_stats_up",
            "1 when <host-proc>/driver/nvidia-fs/stats exists and parses",
            i64::from(parsed.is_some()),
        )?;
        let Some(st) = parsed else {
            return Ok(());
        };
        const MIB: u64 = 1 << 20;
        let io = [("read", &st.reads), ("write", &st.writes)];
        for (dir, c) in io {
            if let Some(n) = c.n {
                counter(
                    &mut encoder,
                    &format!("gds_csi_nvfs_{dir}s"),
                    &format!("nvidia-fs {dir}s issued (n)"),
                    n,
                )?;
            }
            if let Some(err) = c.err {
                counter(
                    &mut encoder,
                    &format!("gds_csi_nvfs_{dir}_errors"),
                    &format!("nvidia-fs {dir} errors (err)"),
                    err,
                )?;
            }
            if let Some(mib) = c.mib {
                counter(
                    &mut encoder,
                    &format!("gds_csi_nvfs_{dir}_bytes"),
                    &format!("Bytes transferred by nvidia-fs {dir}s (the driver counts whole MiB)"),
                    mib.saturating_mul(MIB),
                )?;
            }
        }
        if let Some(p) = st.active_processes {
            gauge(
                &mut encoder,
                "gds_csi_nvfs_active_processes",
                "Processes with nvidia-fs open (Active Process)",
                p as i64,
            )?;
        }
        Ok(())
    }
}
