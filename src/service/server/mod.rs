//! The unix-socket gRPC server: stale socket removal, socket permissions, bounds on
//! what clients can make the driver hold, one request-logging layer, and a graceful
//! drain on shutdown.

mod connections;
mod layers;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;

use crate::csi::controller_server::ControllerServer;
use crate::csi::identity_server::IdentityServer;
use crate::csi::node_server::NodeServer;
use crate::runtime::config::Mode;
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
