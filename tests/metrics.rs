//! The metrics endpoint: an in-process driver (empty pool, no root needed) served on a
//! unix socket, its metrics on 127.0.0.1:0; CSI calls go through the socket and the
//! exposition is fetched over HTTP and checked line by line.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::path::Path;
use std::sync::Arc;

use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::os::TimedHost;
use gds_csi::os::{FsType, Host, RealHost};
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::Driver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The metric families are process-wide and every driver start probes for readiness, so
/// the tests here that count calls run one at a time (the test harness runs them on threads).
static ONE_DRIVER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `name` or `name{k="v",...}` followed by one value; label values may hold escaped quotes.
fn is_sample(line: &str) -> bool {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let name_ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !name_ok {
        return false;
    }
    let mut rest = &line[name_end..];
    if let Some(labels) = rest.strip_prefix('{') {
        let mut chars = labels.char_indices();
        let mut end = None;
        let mut in_value = false;
        let mut escaped = false;
        for (i, c) in chars.by_ref() {
            match (in_value, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (true, false, '"') => in_value = false,
                (false, _, '"') => in_value = true,
                (false, _, '}') => {
                    end = Some(i);
                    break;
                }
                (false, _, c)
                    if !(c.is_ascii_alphanumeric() || c == '_' || c == '=' || c == ',') =>
                {
                    return false
                }
                _ => {}
            }
        }
        let Some(end) = end else { return false };
        rest = &labels[end + 1..];
    }
    let Some(value) = rest.strip_prefix(' ') else {
        return false;
    };
    matches!(value, "+Inf" | "-Inf" | "NaN") || value.parse::<f64>().is_ok()
}

/// Every line is a `# HELP`/`# TYPE`/`# UNIT` comment or a sample, and the text ends with `# EOF`.
fn check_exposition(text: &str) {
    assert!(
        text.ends_with("# EOF\n"),
        "exposition does not end with # EOF:\n{text}"
    );
    for line in text.lines() {
        let ok = line == "# EOF"
            || line.starts_with("# HELP ")
            || line.starts_with("# TYPE ")
            || line.starts_with("# UNIT ")
            || is_sample(line);
        assert!(ok, "not a valid exposition line: {line:?}\n{text}");
    }
    assert_eq!(text.matches("# EOF").count(), 1);
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_owned(), body.to_owned())
}

/// The value of the sample line that starts with `prefix `; a missing sample fails the test
/// (a metric that disappears must not read as 0).
fn sample(text: &str, prefix: &str) -> f64 {
    sample_opt(text, prefix).unwrap_or_else(|| panic!("no sample {prefix} in:\n{text}"))
}

fn sample_opt(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.parse().unwrap())
}

fn real_host() -> RealHost {
    RealHost {
        command_timeout: std::time::Duration::from_secs(10),
        mount_timeout: std::time::Duration::from_secs(10),
    }
}

async fn start_driver(dir: &Path) -> (Clients, std::net::SocketAddr) {
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: "/sys".into(),
        host_dev: "/dev".into(),
        listed: vec![],
        nvme_discover: false,
        state_dir: dir.join("state"),
    })
    .unwrap();
    // As main sets it up: the real host inside the timing wrapper.
    let host = Arc::new(TimedHost::new(real_host()));
    let driver = Arc::new(Driver::new(
        "gds.csi.gds-csi.io".into(),
        "node-a".into(),
        vec![dir.to_owned()],
        pool,
        host,
    ));
    let clients = common::serve_in_process(Arc::clone(&driver), dir).await;
    let addr = gds_csi::metrics::start("127.0.0.1:0", Some(driver), dir.join("proc"))
        .await
        .unwrap()
        .expect("metrics are on");
    (clients, addr)
}

#[tokio::test]
async fn exposition_is_valid_and_csi_calls_are_counted() {
    let _alone = ONE_DRIVER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut c, addr) = start_driver(dir.path()).await;

    let (head, before) = http_get(addr, "/metrics").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    check_exposition(&before);
    let probes = "gds_csi_grpc_requests_total{method=\"Probe\",grpc_code=\"OK\"}";
    let invalid =
        "gds_csi_grpc_requests_total{method=\"NodeStageVolume\",grpc_code=\"InvalidArgument\"}";

    for _ in 0..3 {
        assert_eq!(
            c.identity
                .probe(ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready,
            Some(true)
        );
    }
    let err = c
        .node
        .node_stage_volume(NodeStageVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let (_, after) = http_get(addr, "/metrics").await;
    check_exposition(&after);
    // A labelled counter appears with its first call: absent before is 0, absent after fails.
    assert_eq!(
        sample(&after, probes) - sample_opt(&before, probes).unwrap_or(0.0),
        3.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, invalid) - sample_opt(&before, invalid).unwrap_or(0.0),
        1.0,
        "{after}"
    );
    let count = "gds_csi_grpc_request_duration_seconds_count{method=\"Probe\"}";
    assert!(sample(&after, count) >= 3.0, "{after}");
    // The pool collector: an empty pool, scanned.
    assert_eq!(sample(&after, "gds_csi_pool_devices{state=\"total\"}"), 0.0);
    assert!(after.contains("# TYPE gds_csi_pool_bytes gauge"), "{after}");
    assert_eq!(sample(&after, "gds_csi_ready"), 1.0);
    assert_eq!(sample(&after, "gds_csi_nvfs_stats_up"), 0.0);
    // Each layout's capacity (nothing in an empty pool); a driver without a GDS gate has
    // no readiness or compat-mode series (the real binary always has a gate: the dashboard
    // test reads both from it).
    for layout in ["device", "partition", "stripe"] {
        let available = format!("gds_csi_layout_available_bytes{{layout=\"{layout}\"}}");
        assert_eq!(sample(&after, &available), 0.0, "{after}");
        let largest = format!("gds_csi_layout_largest_volume_bytes{{layout=\"{layout}\"}}");
        assert_eq!(sample(&after, &largest), 0.0, "{after}");
    }
    assert!(!after.contains("gds_csi_gds_node_ready"), "{after}");
    assert!(!after.contains("gds_csi_compat_volumes"), "{after}");

    let (head, _) = http_get(addr, "/").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

#[test]
fn the_line_checker_rejects_malformed_lines() {
    assert!(is_sample("a_total{method=\"Probe\",grpc_code=\"OK\"} 3"));
    assert!(is_sample("a_bucket{le=\"+Inf\"} 1"));
    assert!(is_sample("x{v=\"q\\\"}\"} 1.5e-3"));
    assert!(!is_sample("a_total{method=\"Probe\" 3"));
    assert!(!is_sample("a total"));
    assert!(!is_sample("9a 1"));
    assert!(!is_sample("a 1 2"));
}

/// The csi-lib-utils shape CSI dashboards read (`csi_plugin_operations_seconds` with
/// driver_name, method_name as the full gRPC method, grpc_status_code as Go spells it) and
/// a build_info gauge, beside the driver's own families.
#[tokio::test]
async fn csi_lib_utils_operations_and_build_info() {
    let _alone = ONE_DRIVER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut c, addr) = start_driver(dir.path()).await;
    let count = "csi_plugin_operations_seconds_count{driver_name=\"gds.csi.gds-csi.io\",\
                 method_name=\"/csi.v1.Node/NodeUnstageVolume\",grpc_status_code=\"InvalidArgument\"}";
    let probe = "csi_plugin_operations_seconds_count{driver_name=\"gds.csi.gds-csi.io\",\
                 method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"}";
    let (_, before) = http_get(addr, "/metrics").await;
    c.identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap();
    let err = c
        .node
        .node_unstage_volume(NodeUnstageVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let (_, after) = http_get(addr, "/metrics").await;
    check_exposition(&after);
    // Before its first call a label set has no sample yet; after it, it must have one.
    let was = |prefix: &str| sample_opt(&before, prefix).unwrap_or(0.0);
    assert_eq!(sample(&after, count) - was(count), 1.0, "{after}");
    assert!(sample(&after, probe) - was(probe) >= 1.0, "{after}");
    assert!(
        after.contains("# TYPE csi_plugin_operations_seconds histogram"),
        "{after}"
    );
    // csi-lib-utils' buckets: 0.1 .. 600 s.
    assert!(after.contains("le=\"600.0\""), "{after}");
    let build = format!(
        "gds_csi_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&after, &build), 1.0, "{after}");
}

/// Host operations are timed by the wrapper main puts around the real host, under the
/// `operation` labels docs/operations.md lists, failures included; the real host alone records none.
#[tokio::test]
async fn host_operations_are_timed_by_the_wrapper_around_the_host() {
    let _alone = ONE_DRIVER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // A regular file: blkid, wipefs and mkfs.ext4 work on it without root.
    let img = dir.path().join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let scrape = || gds_csi::metrics::encode(&gds_csi::metrics::registry(None, "/none".into()));
    let count = |text: &str, op: &str| {
        let prefix = format!("gds_csi_host_operation_duration_seconds_count{{operation=\"{op}\"}}");
        sample_opt(text, &prefix).unwrap_or(0.0)
    };
    let before = scrape();
    assert!(real_host().probe_signatures(&img).await.unwrap().is_empty());
    assert_eq!(
        count(&scrape(), "probe_signatures"),
        count(&before, "probe_signatures")
    );

    let timed = TimedHost::new(real_host());
    let uuid = "5e1f1a4c-0000-4000-8000-00000000000a";
    assert!(timed.probe_signatures(&img).await.unwrap().is_empty());
    timed.mkfs(&img, FsType::Ext4, uuid, None).await.unwrap();
    assert!(!timed.probe_signatures(&img).await.unwrap().is_empty());
    timed
        .wipe_signatures(&dir.path().join("missing"))
        .await
        .unwrap_err();
    let after = scrape();
    check_exposition(&after);
    for (op, n) in [
        ("probe_signatures", 2.0),
        ("mkfs.ext4", 1.0),
        ("wipe_signatures", 1.0),
    ] {
        assert_eq!(count(&after, op) - count(&before, op), n, "{op}:\n{after}");
    }
}
