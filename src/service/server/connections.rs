//! The server's connections: the accept loop, the bound on open connections, and each
//! connection's activity, calls and close signal.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc::Sender;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, UdsConnectInfo};
use tracing::{debug, info, warn};

use super::ACCEPT_BACKOFF;

/// The server's connections. Tonic's own accept loop ends the server on any accept
/// error but a connection-level one (tonic 0.12.3 src/transport/server/incoming.rs
/// `handle_accept_error`), so running out of file descriptors (EMFILE) stopped the
/// driver. Here an accept error is logged and retried after a pause. At most `max`
/// connections are open at once: a connection that finds every slot taken closes the one
/// silent longest among those with no call in flight (an idle client's slot goes to a
/// new one, so thousands of idle connections never lock the kubelet and the sidecars
/// out; gRPC clients dial again on their next call). While every connection carries a
/// call, it waits for a slot. Ends when the server stops listening.
pub(super) fn incoming(listener: UnixListener, max: usize) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(max));
    let open = OpenConnections::default();
    tokio::spawn(async move {
        let mut failures = AcceptFailures::default();
        loop {
            let Some(io) = accept(&listener, &tx, &mut failures).await else {
                return;
            };
            let Some(slot) = take_slot(&slots, &open, &tx).await else {
                return;
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

/// The next connection, accept errors retried after a pause; None once the server stops
/// listening.
async fn accept(
    listener: &UnixListener,
    tx: &Sender<io::Result<Conn>>,
    failures: &mut AcceptFailures,
) -> Option<UnixStream> {
    let io = loop {
        let accepted = tokio::select! {
            _ = tx.closed() => return None,
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
                failures.failed(&e);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    };
    failures.recovered();
    Some(io)
}

/// Accept errors in a row: logged as a warning when they start, at debug while they
/// last, and once more when a connection is accepted again.
#[derive(Default)]
struct AcceptFailures(u64);

impl AcceptFailures {
    fn failed(&mut self, e: &io::Error) {
        self.0 += 1;
        if self.0 == 1 {
            warn!(error = %e, "cannot accept connections; retrying every {ACCEPT_BACKOFF:?}");
        } else {
            debug!(error = %e, failures = self.0, "accept failed again");
        }
    }

    fn recovered(&mut self) {
        if self.0 > 0 {
            info!(failures = self.0, "accepting connections again");
            self.0 = 0;
        }
    }
}

/// A connection slot: a free one, else the one the idlest connection without a call
/// gives up; None once the server stops listening.
async fn take_slot(
    slots: &Arc<Semaphore>,
    open: &OpenConnections,
    tx: &Sender<io::Result<Conn>>,
) -> Option<OwnedSemaphorePermit> {
    loop {
        if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
            return Some(slot);
        }
        let closed = open.close_idlest();
        tokio::select! {
            _ = tx.closed() => return None,
            // The semaphore is never closed; were it, the loop would end like a shutdown.
            slot = Arc::clone(slots).acquire_owned() => return slot.ok(),
            // Every connection carried a call: look again shortly.
            _ = tokio::time::sleep(ACCEPT_BACKOFF), if !closed => {}
        }
    }
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
    pub(super) calls: AtomicUsize,
    closing: AtomicBool,
    close: Notify,
}

impl ConnState {
    pub(super) fn touch(&self) {
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
pub(super) struct Conn {
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
    pub(super) state: Arc<ConnState>,
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
