//! Prometheus/OpenMetrics metrics, served on `GET /metrics` at `--metrics-address`.
//!
//! Three sources:
//! - process-wide families recorded where things happen: every CSI call (by the
//!   request layer in `server`) and every host operation (by `RealHost`);
//! - the device pool, computed at scrape time from the `Driver`;
//! - `<host-proc>/driver/nvidia-fs/stats`, read and re-exported at scrape time when present.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::service::Driver;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
pub fn registry(driver: Option<Arc<Driver>>, host_proc: PathBuf) -> Registry {
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
    r.register_collector(Box::new(BuildInfo));
    let driver_name = driver.as_ref().map_or_else(String::new, |d| d.name.clone());
    r.sub_registry_with_label((
        std::borrow::Cow::Borrowed("driver_name"),
        std::borrow::Cow::Owned(driver_name),
    ))
    .register(
        "csi_plugin_operations_seconds",
        "Container Storage Interface operation duration with gRPC error code status total",
        m.plugin_operations.clone(),
    );
    if let Some(driver) = driver {
        r.register_collector(Box::new(PoolCollector { driver }));
    }
    r.register_collector(Box::new(NvfsCollector {
        stats: host_proc.join("driver/nvidia-fs/stats"),
    }));
    r
}

pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
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
struct BuildInfo;

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

/// Pool gauges, computed from the driver's pool at each scrape.
struct PoolCollector {
    driver: Arc<Driver>,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolCollector")
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pool = &self.driver.pool;
        let devices = pool.devices();
        let state = pool.state.snapshot();
        let free = pool.free_devices();
        let (mut n_alloc, mut b_alloc) = (0i64, 0i64);
        for d in &devices {
            if state.by_device(&d.id).is_some() {
                n_alloc += 1;
                b_alloc += d.size_bytes as i64;
            }
        }
        let n_total = devices.len() as i64;
        let b_total: i64 = devices.iter().map(|d| d.size_bytes as i64).sum();
        let n_free = free.len() as i64;
        let b_free: i64 = free.iter().map(|d| d.size_bytes as i64).sum();
        // Free but not allocatable: a foreign signature was seen on them.
        let n_unavail = n_total - n_alloc - n_free;
        let b_unavail = b_total - b_alloc - b_free;
        gauge_family(
            &mut encoder,
            "gds_csi_pool_devices",
            "Devices in this node's pool, by state (total, free, allocated, unavailable)",
            &[
                ("total", n_total),
                ("free", n_free),
                ("allocated", n_alloc),
                ("unavailable", n_unavail),
            ],
        )?;
        gauge_family(
            &mut encoder,
            "gds_csi_pool_bytes",
            "Capacity of this node's pool in bytes, by state (total, free, allocated, unavailable)",
            &[
                ("total", b_total),
                ("free", b_free),
                ("allocated", b_alloc),
                ("unavailable", b_unavail),
            ],
        )?;
        gauge(
            &mut encoder,
            "gds_csi_pool_excluded_devices",
            "Listed or discovered devices left out of the pool (see the log for why)",
            pool.excluded().len() as i64,
        )?;
        gauge(
            &mut encoder,
            "gds_csi_ready",
            "1 once the pool has been scanned and Probe answers ready",
            i64::from(self.driver.is_ready()),
        )
    }
}

/// nvidia-fs's own counters, re-exported when `/proc/driver/nvidia-fs/stats` exists.
#[derive(Debug)]
struct NvfsCollector {
    stats: PathBuf,
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

/// Serves `registry` on `GET /metrics` until the process exits.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, Infallible>(respond(&req, &registry)) }
            });
            let result = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = result {
                debug!(%peer, error = %e, "metrics: connection ended with an error");
            }
        });
    }
}

fn respond<B>(req: &Request<B>, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, CONTENT_TYPE, encode(registry))
        }
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "metrics are at /metrics\n".to_owned(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// Binds `address` (HOST:PORT) and serves metrics on it in the background; an empty
/// address turns metrics off. Returns the bound address (useful with port 0).
pub async fn start(
    address: &str,
    driver: Option<Arc<Driver>>,
    host_proc: PathBuf,
) -> Result<Option<SocketAddr>, String> {
    let address = address.trim();
    if address.is_empty() {
        return Ok(None);
    }
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| format!("--metrics-address {address:?}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    info!(address = %bound, "serving metrics on /metrics");
    tokio::spawn(serve(listener, Arc::new(registry(driver, host_proc))));
    Ok(Some(bound))
}

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
}
