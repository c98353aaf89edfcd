//! Prometheus metrics and the small HTTP server that serves them (`/metrics`, `/healthz`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

#[derive(Default, Clone)]
pub struct Metrics {
    /// Our local volumes on nodes deleted longer than the grace period, still there.
    pub claims: Family<NodeAction, Gauge>,
    /// Nodes our volumes are pinned to whose Node object is absent, by `in_grace`/`lost`.
    pub missing_nodes: Family<StateLabel, Gauge>,
    /// Claims re-created unbound (their old PV deleted), by node.
    pub recreated: Family<NodeLabel, Counter>,
    /// Passes, by `ok`/`error`.
    pub passes: Family<OutcomeLabel, Counter>,
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
            "passes",
            "Reconcile passes over Nodes and PersistentVolumes, by outcome",
            self.passes.clone(),
        );
        r
    }
}

fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// Binds `address` and serves in the background; returns the bound address.
pub async fn start(address: &str, registry: Registry) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    info!(address = %bound, "serving /metrics and /healthz");
    tokio::spawn(serve(listener, Arc::new(registry)));
    Ok(bound)
}

async fn serve(listener: TcpListener, registry: Arc<Registry>) {
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
        (&Method::GET | &Method::HEAD, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".into()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "GET /metrics or /healthz\n".into(),
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
