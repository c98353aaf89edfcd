use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::csi::identity_server::Identity;
use crate::csi::plugin_capability::volume_expansion::Type as ExpansionType;
use crate::csi::plugin_capability::{service::Type as ServiceType, Service, Type, VolumeExpansion};
use crate::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

pub struct IdentityService {
    pub driver: Arc<Driver>,
    /// Whether this process serves the controller service.
    pub controller: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.driver.name.clone(),
            vendor_version: self.driver.version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut services = vec![ServiceType::VolumeAccessibilityConstraints];
        if self.controller {
            services.push(ServiceType::ControllerService);
        }
        let mut capabilities: Vec<_> = services
            .into_iter()
            .map(|t| PluginCapability {
                r#type: Some(Type::Service(Service { r#type: t as i32 })),
            })
            .collect();
        if self.controller {
            // Partition volumes grow while published (the filesystem online on the node).
            capabilities.push(PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: ExpansionType::Online as i32,
                })),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.driver.is_ready()),
        }))
    }
}
