//! The `/metrics` endpoint: a small HTTP/1 server over the registry.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use super::{encode, registry, PoolGauges, CONTENT_TYPE};

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
    pool: Option<Arc<dyn PoolGauges>>,
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
    tokio::spawn(serve(listener, Arc::new(registry(pool, host_proc))));
    Ok(Some(bound))
}
