//! The small HTTP/1 server the driver and the node-loss controller serve their Prometheus
//! metrics on: `GET /metrics` (OpenMetrics text) and `GET /healthz`; anything else is
//! answered with where the metrics are. One slow client never holds another: each
//! connection is a task of its own, and one that sends no header for 10 s is dropped.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// The OpenMetrics text format's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// Binds `address` (HOST:PORT) and serves `registry` on it in the background (`/metrics`,
/// `/healthz`); returns the bound address (the port chosen, with port 0).
pub async fn start(address: &str, registry: Registry) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics and /healthz");
    tokio::spawn(serve(listener, Arc::new(registry)));
    Ok(bound)
}

/// Serves `registry` on `listener` until the process exits.
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
    let read = matches!(req.method(), &Method::GET | &Method::HEAD);
    let (status, content_type, body) = match (read, req.uri().path()) {
        (true, "/metrics") => (StatusCode::OK, CONTENT_TYPE, encode(registry)),
        (true, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        (false, "/metrics" | "/healthz") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "GET /metrics or /healthz\n".to_owned(),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    fn request(method: Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
    }

    #[test]
    fn metrics_and_health_are_served_and_nothing_else() {
        let mut r = Registry::default();
        let c: Counter = Counter::default();
        c.inc();
        r.register("passes", "Passes", c);
        let ok = respond(&request(Method::GET, "/metrics"), &r);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[hyper::header::CONTENT_TYPE], CONTENT_TYPE);
        assert!(encode(&r).contains("passes_total 1"));
        assert_eq!(
            respond(&request(Method::GET, "/healthz"), &r).status(),
            StatusCode::OK
        );
        let post = respond(&request(Method::POST, "/metrics"), &r);
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            respond(&request(Method::GET, "/"), &r).status(),
            StatusCode::NOT_FOUND
        );
    }
}
