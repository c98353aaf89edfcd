//! Serving each resource on its own socket in the kubelet's device plugin directory and
//! registering it, and doing both again whenever the kubelet restarts.
//!
//! The kubelet's Register dials the plugin's socket and asks for its options before it
//! answers (devicemanager plugin/v1beta1/server.go:159-181, handler.go:69-85, client.go:66-77
//! in Kubernetes 1.34.3), so a socket is served before it is registered. A kubelet that
//! starts removes every socket in that directory (devicemanager/manager.go:187-221,
//! `CleanupPluginDirectory`); the Kubernetes documentation ("Device plugins",
//! "Device plugin implementation") asks plugins to notice that and register again. Every
//! `interval` this loop looks at its sockets and at the kubelet's: a socket gone or
//! replaced is served anew and registered, a kubelet socket that is not the one it
//! registered with (a restarted kubelet) gets a new registration.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::task::JoinHandle;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use super::api::device_plugin_server::DevicePluginServer;
use super::api::registration_client::RegistrationClient;
use super::api::{DevicePluginOptions, RegisterRequest, KUBELET_SOCKET, VERSION};
use super::plugin::DevicePluginService;
use super::{Health, Resource, Shared};

/// A file's identity: a socket made anew at the same path is another one.
pub(super) type FileId = (u64, u64);

pub(super) fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// One resource's server and what it last registered with.
struct Served {
    task: JoinHandle<()>,
    socket: PathBuf,
    socket_id: Option<FileId>,
    /// The kubelet socket the registration went to; `None` until one succeeds.
    registered_with: Option<FileId>,
}

impl Served {
    fn alive(&self) -> bool {
        !self.task.is_finished() && file_id(&self.socket) == self.socket_id
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs for the life of the process.
pub async fn run(shared: Arc<Shared>) {
    let mut served: Vec<Option<Served>> = Resource::ALL.iter().map(|_| None).collect();
    // The last problem logged per resource, so a kubelet that stays away is logged once.
    let mut last_error: Vec<Option<String>> = Resource::ALL.iter().map(|_| None).collect();
    let mut tick = tokio::time::interval(shared.config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let checker = Arc::clone(&shared);
        let changed = tokio::task::spawn_blocking(move || checker.check())
            .await
            .unwrap_or_default();
        for resource in changed {
            let name = resource.name(&shared.config.driver_name);
            match shared.current_health(resource) {
                Health::Ready => info!(resource = %name, "GDS workload resource healthy"),
                Health::Missing(why) => {
                    warn!(resource = %name, reason = %why, "GDS workload resource unhealthy")
                }
            }
        }
        for (i, resource) in Resource::ALL.into_iter().enumerate() {
            let outcome = step(&shared, resource, &mut served[i]).await;
            let name = resource.name(&shared.config.driver_name);
            match outcome {
                Ok(Some(kubelet)) => {
                    info!(resource = %name, kubelet = %kubelet.display(), "registered with the kubelet");
                    last_error[i] = None;
                }
                Ok(None) => {}
                Err(e) if last_error[i].as_ref() != Some(&e) => {
                    warn!(resource = %name, error = %e, "device plugin not registered; trying again every {:?}", shared.config.interval);
                    last_error[i] = Some(e);
                }
                Err(e) => debug!(resource = %name, error = %e, "still not registered"),
            }
        }
    }
}

/// Serves `resource` if its socket is gone, and registers it if the kubelet does not have
/// it yet; the kubelet socket it registered with, when it did.
async fn step(
    shared: &Arc<Shared>,
    resource: Resource,
    served: &mut Option<Served>,
) -> Result<Option<PathBuf>, String> {
    let c = &shared.config;
    // The kubelet makes it at start (server.go:89); never made here for a kubelet not yet
    // running, or elsewhere than where it will look.
    if !c.plugin_dir.is_dir() {
        return Err(format!(
            "no kubelet device plugin directory at {}",
            c.plugin_dir.display()
        ));
    }
    if !served.as_ref().is_some_and(Served::alive) {
        if let Some(old) = served.take() {
            info!(socket = %old.socket.display(), "device plugin socket gone (kubelet restarted?); serving it again");
        }
        *served = Some(serve(shared, resource)?);
    }
    let Some(s) = served.as_mut() else {
        return Ok(None);
    };
    let kubelet = c.plugin_dir.join(KUBELET_SOCKET);
    let Some(kubelet_id) = file_id(&kubelet) else {
        return Err(format!("no kubelet socket at {}", kubelet.display()));
    };
    if s.registered_with == Some(kubelet_id) {
        return Ok(None);
    }
    register(shared, resource, &kubelet).await?;
    s.registered_with = Some(kubelet_id);
    Ok(Some(kubelet))
}

/// Binds the resource's socket (a stale one removed, a live one refused) and serves the
/// DevicePlugin service on it.
fn serve(shared: &Arc<Shared>, resource: Resource) -> Result<Served, String> {
    let socket = shared
        .config
        .plugin_dir
        .join(resource.socket_name(&shared.config.driver_name));
    // Owner only: the kubelet (root) is the one client.
    let listener = crate::os::socket::bind(&socket, 0o600)
        .map_err(|e| format!("serving {}: {e}", socket.display()))?;
    let socket_id = file_id(&socket);
    {
        let mut sockets = shared.sockets.lock().unwrap_or_else(|e| e.into_inner());
        sockets.retain(|(path, _)| *path != socket);
        sockets.extend(socket_id.map(|id| (socket.clone(), id)));
    }
    let service = DevicePluginService {
        resource,
        shared: Arc::clone(shared),
    };
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let shown = socket.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming(incoming)
            .await
        {
            warn!(socket = %shown.display(), error = %e, "device plugin server stopped");
        }
    });
    Ok(Served {
        task,
        socket,
        socket_id,
        registered_with: None,
    })
}

/// Registration.Register on the kubelet's socket, connect and call each under the deadline.
async fn register(shared: &Shared, resource: Resource, kubelet: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = &shared.config;
    let uri = [b"unix://", kubelet.as_os_str().as_bytes()].concat();
    let channel = Endpoint::from_shared(uri)
        .map_err(|e| format!("{}: {e}", kubelet.display()))?
        .connect_timeout(c.kubelet_timeout)
        .timeout(c.kubelet_timeout);
    let call = async {
        let channel = channel
            .connect()
            .await
            .map_err(|e| format!("connecting to the kubelet at {}: {e}", kubelet.display()))?;
        RegistrationClient::new(channel)
            .register(RegisterRequest {
                version: VERSION.into(),
                // A name in the kubelet's directory, not a path (server.go:175).
                endpoint: resource.socket_name(&c.driver_name),
                resource_name: resource.name(&c.driver_name),
                options: Some(DevicePluginOptions {
                    pre_start_required: false,
                    get_preferred_allocation_available: false,
                }),
            })
            .await
            .map_err(|s| format!("the kubelet refused the registration: {}", s.message()))?;
        Ok(())
    };
    tokio::time::timeout(c.kubelet_timeout, call)
        .await
        .map_err(|_| {
            format!(
                "the kubelet at {} did not answer Register within {:?}",
                kubelet.display(),
                c.kubelet_timeout
            )
        })?
}
