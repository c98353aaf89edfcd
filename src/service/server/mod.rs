//! The unix-socket gRPC server: stale socket removal, socket permissions, bounds on
//! what clients can make the driver hold, one request-logging layer, and a graceful
//! drain on shutdown.

mod connections;
mod layers;

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tracing::info;

use crate::config::Mode;
use crate::csi::controller_server::ControllerServer;
use crate::csi::identity_server::IdentityServer;
use crate::csi::node_server::NodeServer;
use crate::service::controller::ControllerService;
use crate::service::identity::IdentityService;
use crate::service::node::NodeService;
use crate::service::Driver;
use connections::incoming;
pub use connections::{ConnInfo, ConnState};
pub use layers::{
    Around, AroundCall, CallOnConnection, ConnectionCallsLayer, InFlightLayer, RequestLogLayer,
};

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
