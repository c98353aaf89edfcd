//! The unix-socket gRPC server: stale socket removal, socket permissions, one
//! request-logging layer, and a graceful drain on shutdown.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tower::{Layer, Service};
use tracing::{debug, info, warn};

use crate::config::Mode;
use crate::csi::controller_server::ControllerServer;
use crate::csi::identity_server::IdentityServer;
use crate::csi::node_server::NodeServer;
use crate::service::controller::ControllerService;
use crate::service::identity::IdentityService;
use crate::service::node::NodeService;
use crate::service::Driver;

/// Binds the socket, removing a stale one left by a crashed predecessor.
pub fn bind(socket: &Path, mode: u32) -> std::io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to remove it",
                    socket.display()
                ),
            ));
        }
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("another process is serving on {}", socket.display()),
            ));
        }
        info!(socket = %socket.display(), "removing stale socket");
        std::fs::remove_file(socket)?;
    }
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

pub async fn serve(
    listener: UnixListener,
    driver: Arc<Driver>,
    mode: Mode,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let controller = matches!(mode, Mode::Controller | Mode::All);
    let node = matches!(mode, Mode::Node | Mode::All);
    let identity = IdentityService {
        driver: Arc::clone(&driver),
        controller,
    };
    let mut router = tonic::transport::Server::builder()
        .layer(RequestLogLayer)
        .add_service(IdentityServer::new(identity))
        .add_optional_service(controller.then(|| {
            ControllerServer::new(ControllerService {
                driver: Arc::clone(&driver),
            })
        }));
    if node {
        router = router.add_service(NodeServer::new(NodeService {
            driver: Arc::clone(&driver),
        }));
    }
    router
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
}

/// Logs each call's method, gRPC code and latency; never the request, which may
/// carry secrets. Probe, called every few seconds by the liveness probe, is logged at debug.
#[derive(Clone, Copy)]
pub struct RequestLogLayer;

impl<S> Layer<S> for RequestLogLayer {
    type Service = RequestLog<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestLog { inner }
    }
}

#[derive(Clone)]
pub struct RequestLog<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for RequestLog<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let start = Instant::now();
        // The clone that was polled ready is the one that must be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(req).await;
            let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
            if let Ok(resp) = &response {
                let header = |name: &str| {
                    resp.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(|s| s.to_owned())
                };
                let code = header("grpc-status").unwrap_or_else(|| "0".into());
                crate::metrics::record_call(
                    &method,
                    &crate::metrics::code_name(&code),
                    start.elapsed(),
                );
                if code != "0" {
                    let message = header("grpc-message").unwrap_or_default();
                    let message = percent_decode(&message);
                    warn!(%method, code = ?tonic::Code::from_bytes(code.as_bytes()), elapsed_ms, %message, "call failed");
                } else if method == "Probe" {
                    debug!(%method, elapsed_ms, "call");
                } else {
                    info!(%method, elapsed_ms, "call");
                }
            }
            response
        })
    }
}

/// grpc-message is percent-encoded on the wire.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            // `get`, not slicing: a multi-byte character after '%' must not panic.
            if let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_decode_never_panics_on_multibyte_text() {
        assert_eq!(percent_decode("a%20b%2Cc"), "a b,c");
        assert_eq!(percent_decode("%a\u{e9}"), "%a\u{e9}");
        assert_eq!(percent_decode("%\u{e9}\u{e9}"), "%\u{e9}\u{e9}");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
