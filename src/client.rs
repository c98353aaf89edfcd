//! A CSI client over the unix socket, for the demo, the tests and the benches.

use std::path::Path;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::csi::controller_client::ControllerClient;
use crate::csi::identity_client::IdentityClient;
use crate::csi::node_client::NodeClient;
use crate::csi::ProbeRequest;

pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_owned();
    // The URI is required by tonic but unused: every connection goes to the socket.
    Endpoint::from_static("http://[::1]:1")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
}

/// The three CSI clients on one channel.
#[derive(Clone)]
pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Clients {
    pub async fn connect(socket: &Path) -> Result<Self, tonic::transport::Error> {
        let channel = connect(socket).await?;
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
