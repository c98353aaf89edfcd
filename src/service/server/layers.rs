//! The layers every call passes: the bound on calls in flight, the count of calls on
//! each connection, and the request log.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};
use tracing::{debug, info, warn};

use super::connections::{ConnInfo, ConnState};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a layer does before and after each call. `Around` supplies the tower plumbing
/// once for every such layer.
pub trait AroundCall: Clone + Send + 'static {
    /// Lives from before the call until its response is back.
    type Guard: Send + 'static;
    /// Runs before the call's body is read; the call waits for the guard.
    fn before<B>(&self, req: &http::Request<B>) -> BoxFuture<Self::Guard>;
    /// Sees the response of a call that reached the service.
    fn after<RB>(&self, guard: Self::Guard, response: &http::Response<RB>);
}

/// The service a layer of `AroundCall` `hook` builds around `inner`.
#[derive(Clone)]
pub struct Around<H, S> {
    hook: H,
    inner: S,
}

impl<H, S, B, RB> Service<http::Request<B>> for Around<H, S>
where
    H: AroundCall,
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
        // The clone that was polled ready is the one that must be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let hook = self.hook.clone();
        let before = hook.before(&req);
        Box::pin(async move {
            let guard = before.await;
            let response = inner.call(req).await;
            if let Ok(resp) = &response {
                hook.after(guard, resp);
            }
            response
        })
    }
}

/// At most `limit` Controller and Node calls at once over all connections; a call
/// waits for its turn before its body is read. Identity calls pass freely.
#[derive(Clone)]
pub struct InFlightLayer {
    permits: Arc<Semaphore>,
}

impl InFlightLayer {
    pub fn new(limit: usize) -> Self {
        InFlightLayer {
            permits: Arc::new(Semaphore::new(limit)),
        }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = Around<Self, S>;
    fn layer(&self, inner: S) -> Self::Service {
        Around {
            hook: self.clone(),
            inner,
        }
    }
}

impl AroundCall for InFlightLayer {
    type Guard = Option<OwnedSemaphorePermit>;

    fn before<B>(&self, req: &http::Request<B>) -> BoxFuture<Self::Guard> {
        let counted = !req.uri().path().starts_with("/csi.v1.Identity/");
        let permits = Arc::clone(&self.permits);
        Box::pin(async move {
            if counted {
                // Never closed; were it, the call would go uncounted rather than fail.
                permits.acquire_owned().await.ok()
            } else {
                None
            }
        })
    }

    fn after<RB>(&self, _permit: Self::Guard, _response: &http::Response<RB>) {}
}

/// Counts each call on the connection it came on, so a connection carrying one is never
/// closed to make room for a new client.
#[derive(Clone, Copy)]
pub struct ConnectionCallsLayer;

impl<S> Layer<S> for ConnectionCallsLayer {
    type Service = Around<Self, S>;
    fn layer(&self, inner: S) -> Self::Service {
        Around { hook: *self, inner }
    }
}

/// One call on a connection, counted until it is dropped (answered or cancelled).
pub struct CallOnConnection(Arc<ConnState>);

impl Drop for CallOnConnection {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
        self.0.touch();
    }
}

impl AroundCall for ConnectionCallsLayer {
    type Guard = Option<CallOnConnection>;

    fn before<B>(&self, req: &http::Request<B>) -> BoxFuture<Self::Guard> {
        let call = req.extensions().get::<ConnInfo>().map(|info| {
            info.state.calls.fetch_add(1, Ordering::AcqRel);
            CallOnConnection(Arc::clone(&info.state))
        });
        Box::pin(std::future::ready(call))
    }

    fn after<RB>(&self, _call: Self::Guard, _response: &http::Response<RB>) {}
}

/// Logs each call's method, gRPC code and latency; never the request, which may
/// carry secrets. Probe, called every few seconds by the liveness probe, is logged at debug.
#[derive(Clone, Copy)]
pub struct RequestLogLayer;

impl<S> Layer<S> for RequestLogLayer {
    type Service = Around<Self, S>;
    fn layer(&self, inner: S) -> Self::Service {
        Around { hook: *self, inner }
    }
}

impl AroundCall for RequestLogLayer {
    /// The method's name and when the call came in.
    type Guard = (String, Instant);

    fn before<B>(&self, req: &http::Request<B>) -> BoxFuture<Self::Guard> {
        let path = req.uri().path();
        let method = path.rsplit('/').next().unwrap_or_default().to_owned();
        Box::pin(std::future::ready((method, Instant::now())))
    }

    fn after<RB>(&self, (method, start): Self::Guard, resp: &http::Response<RB>) {
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|s| s.to_owned())
        };
        let code = header("grpc-status").unwrap_or_else(|| "0".into());
        crate::metrics::record_call(&method, &crate::metrics::code_name(&code), start.elapsed());
        if code != "0" {
            let message = failure_message(resp.headers());
            warn!(%method, code = ?tonic::Code::from_bytes(code.as_bytes()), elapsed_ms, %message, "call failed");
        } else if method == "Probe" {
            debug!(%method, elapsed_ms, "call");
        } else {
            info!(%method, elapsed_ms, "call");
        }
    }
}

/// The text of a refusal, from the percent-encoded grpc-message header, decoded by tonic
/// itself (tonic 0.14.9 src/status.rs:491-499). The headers are tonic's encoding of our own
/// Status (status.rs:570-593), so its `expect` on grpc-status-details-bin cannot fire.
fn failure_message(headers: &http::HeaderMap) -> String {
    tonic::Status::from_header_map(headers)
        .map(|s| s.message().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::failure_message;

    #[test]
    fn refusals_are_logged_with_their_text_as_sent() {
        let text = "volume \"a b\": 100% used, caf\u{e9}\n";
        let mut headers = http::HeaderMap::new();
        tonic::Status::invalid_argument(text)
            .add_header(&mut headers)
            .unwrap();
        assert_ne!(headers["grpc-message"], text, "the wire form is encoded");
        assert_eq!(failure_message(&headers), text);
        assert_eq!(failure_message(&http::HeaderMap::new()), "");
    }
}
