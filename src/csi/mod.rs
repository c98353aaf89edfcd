//! The CSI v1 API: the code generated from the vendored `proto/csi.proto` (CSI spec
//! v1.12.0), the block volume ids the driver writes into its `volume_id` fields (`id`, a
//! leaf every layer imports), and the client the demo, the scenarios, the bench, the
//! tests and `gds-csi probe` share: the three services on one channel, and the wait for
//! Probe `ready`.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

pub mod id;

mod generated {
    #![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    tonic::include_proto!("csi.v1");
}
pub use generated::*;

use controller_client::ControllerClient;
use identity_client::IdentityClient;
use node_client::NodeClient;

/// The three CSI clients on one channel.
#[derive(Clone)]
pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Clients {
    /// Connects through tonic's own `unix:` endpoint (tonic 0.14.9
    /// src/transport/channel/endpoint.rs:209-214 turns `unix://PATH` into a socket endpoint,
    /// :632-633 connects it with uds_connector.rs:41's `UnixStream::connect`). A path that is
    /// not UTF-8 is refused by tonic as an invalid URI.
    pub async fn connect(socket: &Path) -> Result<Self, tonic::transport::Error> {
        let uri = [b"unix://", socket.as_os_str().as_bytes()].concat();
        let channel = Endpoint::from_shared(uri)?.connect().await?;
        Ok(Clients {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        })
    }
}

/// Why [`Clients::connect_ready`] gave up: what it saw last before the deadline.
#[derive(Debug)]
pub struct NotReady {
    pub socket: std::path::PathBuf,
    pub waited: Duration,
    pub last: String,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "driver at {} not ready after {:.1} s: {}",
            self.socket.display(),
            self.waited.as_secs_f64(),
            self.last
        )
    }
}

impl std::error::Error for NotReady {}

impl Clients {
    /// Connects and waits until Probe answers `ready: true` (the pool is scanned), as the
    /// sidecars' probes do, polling until `deadline` has passed. A socket that exists is not
    /// a driver that is ready: calls before then get Unavailable.
    pub async fn connect_ready(socket: &Path, deadline: Duration) -> Result<Self, NotReady> {
        let start = Instant::now();
        let mut last;
        loop {
            last = match Clients::connect(socket).await {
                Err(e) => format!("cannot connect: {e}"),
                Ok(mut c) => match c.identity.probe(ProbeRequest {}).await {
                    Ok(r) if r.get_ref().ready == Some(true) => return Ok(c),
                    Ok(r) => format!("Probe answered ready: {:?}", r.get_ref().ready),
                    Err(s) => format!("Probe failed: {:?}: {}", s.code(), s.message()),
                },
            };
            if start.elapsed() >= deadline {
                return Err(NotReady {
                    socket: socket.to_owned(),
                    waited: start.elapsed(),
                    last,
                });
            }
            tokio::time::sleep(POLL.min(deadline.saturating_sub(start.elapsed()))).await;
        }
    }
}

/// How often [`Clients::connect_ready`] asks again.
const POLL: Duration = Duration::from_millis(50);
