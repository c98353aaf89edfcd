//! The unix-socket gRPC server: stale socket removal, socket permissions, bounds on
//! what clients can make the driver hold, one request-logging layer, and a graceful
//! drain on shutdown.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, UdsConnectInfo};
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

// Bounds on what clients can make the driver hold. One connection with 160 unfinished
// 4 MB requests took the driver from 86 MB to 644 MiB (the chart's limit is 512 Mi)
// under tonic's defaults: 4 MiB messages, 200 streams per connection, 1 MiB flow-control
// windows, unlimited connections. Worst case now, above the baseline: every in-flight
// call buffering a whole message, twice over for buffer growth (64 x 1 MiB x 2), plus
// every connection's unread window (128 x 256 KiB): under 200 MiB.

/// Largest Controller or Node request. Real ones are a few KiB (a StorageClass's
/// parameters, a volume context); the largest a CO could send is a Secret, which
/// Kubernetes caps at 1 MiB and this driver never needs.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Identity requests (Probe, GetPluginInfo, GetPluginCapabilities) are empty messages.
const MAX_IDENTITY_MESSAGE_BYTES: usize = 4 << 10;
/// Controller and Node calls running at once, over all connections; more wait their
/// turn without reading their bodies. Identity calls are not counted, so Probe
/// answers while a flood of other calls waits.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;
/// Open connections. The sidecars and the kubelet use one or two each; when every slot is
/// taken, a new connection takes the slot of the one that has been silent longest with no
/// call in flight (`incoming`).
pub const MAX_CONNECTIONS: usize = 128;
/// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; clients queue calls beyond it.
const MAX_STREAMS_PER_CONNECTION: u32 = 32;
/// HTTP/2 flow-control windows: what a client can send that nobody reads yet.
const WINDOW_BYTES: u32 = 256 << 10;
/// Pause after an accept error that is not about one connection (EMFILE, ENFILE,
/// ENOBUFS, ENOMEM): the pending connection stays in the backlog, so retrying at once
/// would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Binds the socket, removing a stale one left by a crashed predecessor.
pub fn bind(socket: &Path, mode: u32) -> io::Result<UnixListener> {
    bind_after(socket, mode, Duration::ZERO)
}

/// Like [`bind`], waiting up to `wait` for a socket that still answers to go quiet.
/// Called with the state dir locked: a predecessor on the same state dir has then
/// released its lock, yet its listening socket can answer a little longer, because a
/// dying process's files are closed one by one after its memory is torn down
/// (kernel/exit.c `do_exit`: `exit_mm` before `exit_files`); the listen backlog
/// accepts a connect(2) without the process's help meanwhile.
pub fn bind_after(socket: &Path, mode: u32, wait: Duration) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to remove it",
                    socket.display()
                ),
            ));
        }
        let deadline = Instant::now() + wait;
        let mut logged = false;
        while std::os::unix::net::UnixStream::connect(socket).is_ok() {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another process is serving on {} (still after {})",
                        socket.display(),
                        humantime::format_duration(wait)
                    ),
                ));
            }
            if !logged {
                logged = true;
                info!(socket = %socket.display(), "socket still answers; waiting for the previous process to exit");
            }
            std::thread::sleep(Duration::from_millis(50));
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

/// Serves until `shutdown` completes. Accept errors never end it (see [`incoming`]).
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
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .initial_connection_window_size(WINDOW_BYTES)
        .initial_stream_window_size(WINDOW_BYTES)
        .layer(ConnectionCallsLayer)
        .layer(RequestLogLayer)
        .layer(InFlightLayer::new(MAX_CALLS_IN_FLIGHT))
        .add_service(
            IdentityServer::new(identity).max_decoding_message_size(MAX_IDENTITY_MESSAGE_BYTES),
        )
        .add_optional_service(controller.then(|| {
            ControllerServer::new(ControllerService {
                driver: Arc::clone(&driver),
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
        }));
    if node {
        router = router.add_service(
            NodeServer::new(NodeService {
                driver: Arc::clone(&driver),
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
        );
    }
    router
        .serve_with_incoming_shutdown(incoming(listener, MAX_CONNECTIONS), shutdown)
        .await
}

/// The server's connections. Tonic's own accept loop ends the server on any accept
/// error but a connection-level one (tonic 0.12.3 src/transport/server/incoming.rs
/// `handle_accept_error`), so running out of file descriptors (EMFILE) stopped the
/// driver. Here an accept error is logged and retried after a pause. At most `max`
/// connections are open at once: a connection that finds every slot taken closes the one
/// silent longest among those with no call in flight (an idle client's slot goes to a
/// new one, so thousands of idle connections never lock the kubelet and the sidecars
/// out; gRPC clients dial again on their next call). While every connection carries a
/// call, it waits for a slot. Ends when the server stops listening.
fn incoming(listener: UnixListener, max: usize) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(max));
    let open = OpenConnections::default();
    tokio::spawn(async move {
        let mut failures = 0u64;
        loop {
            let io = loop {
                let accepted = tokio::select! {
                    _ = tx.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                match accepted {
                    Ok((io, _)) => break io,
                    // The client gave up before we accepted: nothing to do.
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::ConnectionReset
                                | io::ErrorKind::Interrupted
                                | io::ErrorKind::WouldBlock
                        ) => {}
                    Err(e) => {
                        failures += 1;
                        if failures == 1 {
                            warn!(error = %e, "cannot accept connections; retrying every {ACCEPT_BACKOFF:?}");
                        } else {
                            debug!(error = %e, failures, "accept failed again");
                        }
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            };
            if failures > 0 {
                info!(failures, "accepting connections again");
                failures = 0;
            }
            let slot = loop {
                if let Ok(slot) = Arc::clone(&slots).try_acquire_owned() {
                    break slot;
                }
                let closed = open.close_idlest();
                tokio::select! {
                    _ = tx.closed() => return,
                    // The semaphore is never closed; were it, the loop would end like a shutdown.
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => break slot,
                        Err(_) => return,
                    },
                    // Every connection carried a call: look again shortly.
                    _ = tokio::time::sleep(ACCEPT_BACKOFF), if !closed => {}
                }
            };
            let conn = Conn::new(io, slot);
            open.add(&conn.state);
            if tx.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// When the process started, for connections' activity times in milliseconds.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn now_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

/// What the server knows of one open connection: when it last moved a byte, how many
/// calls it carries, and the signal that closes it.
#[derive(Default)]
pub struct ConnState {
    last_io_ms: AtomicU64,
    calls: AtomicUsize,
    closing: AtomicBool,
    close: Notify,
}

impl ConnState {
    fn touch(&self) {
        self.last_io_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// The open connections, to choose one to close when every slot is taken.
#[derive(Default, Clone)]
struct OpenConnections(Arc<std::sync::Mutex<Vec<Weak<ConnState>>>>);

impl OpenConnections {
    fn add(&self, state: &Arc<ConnState>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(state));
    }

    /// Closes the connection silent longest among those with no call in flight; false
    /// when every open connection carries a call (or is closing already).
    fn close_idlest(&self) -> bool {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        let idlest = all
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.calls.load(Ordering::Acquire) == 0 && !c.closing.load(Ordering::Acquire))
            .min_by_key(|c| c.last_io_ms.load(Ordering::Relaxed));
        let Some(conn) = idlest else {
            return false;
        };
        conn.closing.store(true, Ordering::Release);
        conn.close.notify_one();
        debug!(
            idle_ms = now_ms().saturating_sub(conn.last_io_ms.load(Ordering::Relaxed)),
            "every connection slot taken: closing the idlest connection for a new one"
        );
        true
    }
}

/// A connection, its slot among [`MAX_CONNECTIONS`] (freed when hyper drops it) and its
/// state. Once closed for a new client, it reads end-of-file, so hyper ends it.
struct Conn {
    io: UnixStream,
    state: Arc<ConnState>,
    closed: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    ended: bool,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    fn new(io: UnixStream, slot: OwnedSemaphorePermit) -> Conn {
        let state = Arc::new(ConnState::default());
        state.touch();
        let signal = Arc::clone(&state);
        Conn {
            io,
            state,
            closed: Box::pin(async move { signal.close.notified().await }),
            ended: false,
            _slot: slot,
        }
    }
}

/// What a call learns of the connection it came on (tonic puts the `Connected` info in
/// each request's extensions: tonic 0.14.9 src/transport/server/service/io.rs:89).
#[derive(Clone)]
pub struct ConnInfo {
    pub uds: UdsConnectInfo,
    state: Arc<ConnState>,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            uds: self.io.connect_info(),
            state: Arc::clone(&self.state),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.ended && this.closed.as_mut().poll(cx).is_ready() {
            this.ended = true;
        }
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.state.touch();
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.state.touch();
        }
        written
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.state.touch();
        }
        written
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

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
