//! Prometheus/OpenMetrics metrics, served on `GET /metrics` at `--metrics-address`.
//!
//! Three sources:
//! - process-wide families recorded where things happen: every CSI call (by the
//!   request layer in `server`) and every host operation (by the timing wrapper around the
//!   host port, `os::TimedHost`, set up in `main`);
//! - the device pool, read at scrape time through [`PoolGauges`];
//! - `<host-proc>/driver/nvidia-fs/stats`, read and re-exported at scrape time when present.
//!
//! Nothing here depends on the service, the pool or the host port: they push into the
//! families or are read through [`PoolGauges`].

mod collectors;
mod http;

pub mod clone;
pub mod snapshot;
pub use collectors::{LayoutCapacity, PoolGauges, PoolSnapshot, StateCounts};
pub use gds_csi_metrics_http::serve;
pub use http::start;

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use collectors::{BuildInfo, NvfsCollector, PoolCollector};

pub use gds_csi_metrics_http::CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub method: String,
    pub grpc_code: String,
}

/// csi-lib-utils' plugin labels (metrics/metrics.go: `labelCSIOperationName = "method_name"`,
/// `labelGrpcStatusCode = "grpc_status_code"`); `driver_name` is added per registry.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCallLabels {
    pub method_name: String,
    pub grpc_status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The process-wide families; `global()` is the one the driver records into.
pub struct Metrics {
    pub calls: Family<CallLabels, Counter>,
    pub call_duration: HistogramFamily<MethodLabels>,
    pub host_duration: HistogramFamily<OperationLabels>,
    /// `csi_plugin_operations_seconds`, the shape CSI dashboards read.
    pub plugin_operations: HistogramFamily<PluginCallLabels>,
    /// Pool devices the partition layout passed over when picking where to carve.
    pub carve_refusals: Family<ReasonLabels, Counter>,
}

fn csi_lib_utils_buckets() -> Histogram {
    // csi-lib-utils metrics/metrics.go: operationsLatencyBuckets.
    Histogram::new([
        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
    ])
}

fn latency_buckets() -> Histogram {
    // 250 us .. ~65 s: Probe is sub-millisecond, mkfs of a large namespace takes tens of seconds.
    Histogram::new([
        0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            calls: Family::default(),
            call_duration: Family::new_with_constructor(latency_buckets),
            host_duration: Family::new_with_constructor(latency_buckets),
            plugin_operations: Family::new_with_constructor(csi_lib_utils_buckets),
            carve_refusals: Family::default(),
        }
    }
}

static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::default);

pub fn global() -> &'static Metrics {
    &GLOBAL
}

/// gRPC code names as the grpc-ecosystem interceptors spell them (`OK`, `NotFound`, ...).
pub fn code_name(grpc_status: &str) -> String {
    match grpc_status.parse::<i32>() {
        Ok(0) => "OK".to_owned(),
        Ok(n) => format!("{:?}", tonic::Code::from_i32(n)),
        Err(_) => "Unknown".to_owned(),
    }
}

/// The full gRPC method of a CSI call (`/csi.v1.Controller/CreateVolume`), as csi-lib-utils
/// labels it; CSI method names are unique across the three services.
pub fn full_method(method: &str) -> String {
    let service = match method {
        "GetPluginInfo" | "GetPluginCapabilities" | "Probe" => "Identity",
        m if m.starts_with("Node") => "Node",
        _ => "Controller",
    };
    format!("/csi.v1.{service}/{method}")
}

/// One finished CSI call; `grpc_code` is a name from [`code_name`].
pub fn record_call(method: &str, grpc_code: &str, elapsed: Duration) {
    let m = global();
    m.plugin_operations
        .get_or_create(&PluginCallLabels {
            method_name: full_method(method),
            // Go's codes.Code.String() spelling, which csi-lib-utils records.
            grpc_status_code: match grpc_code {
                "Cancelled" => "Canceled".to_owned(),
                c => c.to_owned(),
            },
        })
        .observe(elapsed.as_secs_f64());
    m.calls
        .get_or_create(&CallLabels {
            method: method.to_owned(),
            grpc_code: grpc_code.to_owned(),
        })
        .inc();
    m.call_duration
        .get_or_create(&MethodLabels {
            method: method.to_owned(),
        })
        .observe(elapsed.as_secs_f64());
}

/// A pool device the partition layout could not carve, by reason (`foreign`, `in_use`,
/// `signatures`, `whole_device`, `label_refused`).
pub fn carve_refused(reason: &'static str) {
    global()
        .carve_refusals
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// Observes a host operation's duration when dropped, whatever the outcome.
pub struct HostTimer {
    operation: &'static str,
    start: Instant,
}

pub fn host_timer(operation: &'static str) -> HostTimer {
    HostTimer {
        operation,
        start: Instant::now(),
    }
}

impl Drop for HostTimer {
    fn drop(&mut self) {
        global()
            .host_duration
            .get_or_create(&OperationLabels {
                operation: self.operation,
            })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// The registry of one metrics endpoint: the global families plus the scrape-time collectors.
pub fn registry(pool: Option<Arc<dyn PoolGauges>>, host_proc: PathBuf) -> Registry {
    let m = global();
    let mut r = Registry::default();
    r.register(
        "gds_csi_grpc_requests",
        "CSI calls served, by method and gRPC status code",
        m.calls.clone(),
    );
    r.register(
        "gds_csi_grpc_request_duration_seconds",
        "CSI call latency in the server, by method",
        m.call_duration.clone(),
    );
    r.register(
        "gds_csi_host_operation_duration_seconds",
        "Duration of host operations (mkfs.ext4, mkfs.xfs, mount, bind_mount, unmount, probe_signatures, wipe_signatures, zero_device)",
        m.host_duration.clone(),
    );
    r.register(
        "gds_csi_partition_device_refusals",
        "Pool devices the partition layout passed over when picking where to carve, by reason",
        m.carve_refusals.clone(),
    );
    clone::register(&mut r);
    snapshot::register(&mut r);
    r.register_collector(Box::new(BuildInfo));
    let driver_name = pool.as_ref().map_or_else(String::new, |p| p.driver_name());
    r.sub_registry_with_label((
        std::borrow::Cow::Borrowed("driver_name"),
        std::borrow::Cow::Owned(driver_name),
    ))
    .register(
        "csi_plugin_operations_seconds",
        "Container Storage Interface operation duration with gRPC error code status total",
        m.plugin_operations.clone(),
    );
    if let Some(source) = pool {
        r.register_collector(Box::new(PoolCollector { source }));
    }
    r.register_collector(Box::new(NvfsCollector {
        stats: host_proc.join("driver/nvidia-fs/stats"),
    }));
    r
}

pub use gds_csi_metrics_http::encode;

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "GDS Version: 1.10.0.4\nNVFS statistics(ver: 4.0)\nNVFS Driver(version: 2.20.5)\n\
Mellanox PeerDirect Supported: False\nIO stats: Disabled, peer IO stats: Disabled\nLogging level: info\n\n\
Active Shadow-Buffer (MiB): 0\nActive Process: 2\n\
Reads\t\t\t\t: n=120 ok=118 err=2 readMiB=4096 io_state_err=0\n\
Reads\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0\n\
Writes\t\t\t\t: n=7 ok=7 err=0 writeMiB=64 io_state_err=0 pg-cache=0 pg-cache-fail=0 pg-cache-eio=0\n";

    #[test]
    fn nvidia_fs_counters_are_reexported_when_the_stats_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let text = encode(&registry(None, dir.path().to_owned()));
        assert!(text.contains("gds_csi_nvfs_stats_up 0\n"), "{text}");
        assert!(!text.contains("gds_csi_nvfs_reads_total"));
        std::fs::create_dir_all(dir.path().join("driver/nvidia-fs")).unwrap();
        std::fs::write(dir.path().join("driver/nvidia-fs/stats"), STATS).unwrap();
        let text = encode(&registry(None, dir.path().to_owned()));
        for line in [
            "gds_csi_nvfs_stats_up 1",
            "gds_csi_nvfs_reads_total 120",
            "gds_csi_nvfs_read_errors_total 2",
            "gds_csi_nvfs_read_bytes_total 4294967296",
            "gds_csi_nvfs_writes_total 7",
            "gds_csi_nvfs_write_bytes_total 67108864",
            "gds_csi_nvfs_active_processes 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn calls_and_host_operations_are_recorded() {
        record_call("UnitTestMethod", &code_name("5"), Duration::from_millis(3));
        drop(host_timer("unit_test_op"));
        let text = encode(&registry(None, "/nonexistent".into()));
        assert!(
            text.contains(
                "gds_csi_grpc_requests_total{method=\"UnitTestMethod\",grpc_code=\"NotFound\"} 1"
            ),
            "{text}"
        );
        assert!(text
            .contains("gds_csi_grpc_request_duration_seconds_count{method=\"UnitTestMethod\"} 1"));
        assert!(text.contains(
            "gds_csi_host_operation_duration_seconds_count{operation=\"unit_test_op\"} 1"
        ));
        assert_eq!(code_name("0"), "OK");
        assert_eq!(code_name("3"), "InvalidArgument");
    }

    struct Fixed(PoolSnapshot);

    impl PoolGauges for Fixed {
        fn driver_name(&self) -> String {
            "d.example".into()
        }
        fn pool_snapshot(&self) -> PoolSnapshot {
            self.0
        }
    }

    #[test]
    fn pool_gauges_and_the_driver_name_come_from_the_source() {
        let snapshot = PoolSnapshot {
            devices: StateCounts {
                total: 4,
                free: 1,
                allocated: 2,
            },
            bytes: StateCounts {
                total: 4096,
                free: 1024,
                allocated: 2048,
            },
            excluded: 3,
            ready: true,
        };
        let source: Arc<dyn PoolGauges> = Arc::new(Fixed(snapshot));
        record_call("PoolGaugeTest", "OK", Duration::from_millis(1));
        let text = encode(&registry(Some(source), "/nonexistent".into()));
        for line in [
            "gds_csi_pool_devices{state=\"total\"} 4",
            "gds_csi_pool_devices{state=\"free\"} 1",
            "gds_csi_pool_devices{state=\"allocated\"} 2",
            "gds_csi_pool_devices{state=\"unavailable\"} 1",
            "gds_csi_pool_bytes{state=\"unavailable\"} 1024",
            "gds_csi_pool_excluded_devices 3",
            "gds_csi_ready 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            text.contains("csi_plugin_operations_seconds_count{driver_name=\"d.example\",method_name=\"/csi.v1.Controller/PoolGaugeTest\""),
            "{text}"
        );
    }
}
