//! A CSI client over the unix socket, for the demo, the tests and the benches.

use std::path::Path;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::csi::controller_client::ControllerClient;
use crate::csi::identity_client::IdentityClient;
use crate::csi::node_client::NodeClient;

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
