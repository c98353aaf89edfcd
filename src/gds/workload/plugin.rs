//! The DevicePlugin service of one resource, as the kubelet calls it
//! (pkg/kubelet/cm/devicemanager in Kubernetes 1.34.3): GetDevicePluginOptions once it is
//! registered, ListAndWatch for as long as it is, Allocate when a container holding the
//! resource is admitted. Neither GetPreferredAllocation nor PreStartContainer is asked for:
//! every id of a resource is the same share.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::allocate::{container_response, nvfs_devices, Pieces};
use super::api::device_plugin_server::DevicePlugin;
use super::api::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
};
use super::{Health, Resource, Shared};

pub struct DevicePluginService {
    pub resource: Resource,
    pub shared: Arc<Shared>,
}

impl DevicePluginService {
    fn devices(&self, health: &Health) -> Vec<Device> {
        let health = match health {
            Health::Ready => super::api::HEALTHY,
            Health::Missing(_) => super::api::UNHEALTHY,
        };
        (0..self.shared.config.shares)
            .map(|n| Device {
                id: self.resource.device_id(n),
                health: health.into(),
                topology: None,
            })
            .collect()
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    /// The ids with the resource's health now, and again whenever it changes. The kubelet
    /// reads this stream for as long as the plugin is registered (devicemanager
    /// plugin/v1beta1/client.go:80-96) and counts the healthy ids as allocatable.
    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let this = DevicePluginService {
            resource: self.resource,
            shared: Arc::clone(&self.shared),
        };
        let stream = tokio_stream::wrappers::WatchStream::new(self.shared.health(self.resource))
            .map(move |health| {
                Ok(ListAndWatchResponse {
                    devices: this.devices(&health),
                })
            });
        Ok(Response::new(Box::pin(stream)))
    }

    /// Any of the available ids will do; implemented for a kubelet that asks anyway.
    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let size = usize::try_from(r.allocation_size).unwrap_or(0);
                let mut ids = r.must_include_device_i_ds;
                for id in r.available_device_i_ds {
                    if ids.len() >= size {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    /// What each container gets. The kubelet calls this without a deadline
    /// (devicemanager/endpoint.go:102-111) while it admits the pod, so it only reads the
    /// host: the nvidia-fs nodes, the udev directory, the node's cufile.json. A piece that
    /// is missing fails the pod's admission with the reason, rather than a container that
    /// starts without it.
    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        if let Some(id) = requests
            .iter()
            .flat_map(|r| &r.devices_ids)
            .find(|id| !self.resource.owns_device_id(id))
        {
            return Err(Status::invalid_argument(format!(
                "device id {id:?} is not one of {}'s",
                self.resource.name(&self.shared.config.driver_name)
            )));
        }
        let name = self.resource.name(&self.shared.config.driver_name);
        let shared = Arc::clone(&self.shared);
        let resource = self.resource;
        let (cufile_json, devices) = tokio::task::spawn_blocking(move || {
            let cufile_json = shared.prepare(resource)?;
            let devices = nvfs_devices(&shared.config.host_dev).map_err(|e| {
                format!(
                    "listing nvidia-fs devices in {}: {e}",
                    shared.config.host_dev.display()
                )
            })?;
            Ok::<_, String>((cufile_json, devices))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| {
            warn!(resource = %name, error = %e, "Allocate refused");
            Status::failed_precondition(format!("{name}: {e}"))
        })?;
        let pieces = Pieces {
            nvfs_devices: &devices,
            udev_data_dir: &self.shared.config.udev_data_dir,
            cufile_json: &cufile_json,
        };
        info!(resource = %name, containers = requests.len(), nvidia_fs = devices.len(), "Allocate");
        Ok(Response::new(AllocateResponse {
            container_responses: requests
                .iter()
                .map(|_| container_response(&pieces))
                .collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
