use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::backend::{Publish, VolumeBackend};
use crate::block;
use crate::csi::node_server::Node;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type};
use crate::csi::*;
use crate::error::{Error, Result};
use crate::nfs;
use crate::request::{self, VolumeRef};

pub struct NodeService {
    pub driver: Arc<Driver>,
}

impl NodeService {
    fn host_path(&self, field: &'static str, raw: &str) -> Result<PathBuf> {
        request::host_path(field, raw, &self.driver.allowed_roots)
    }

    /// NodeGetVolumeStats' path is a staging or target path like the others: checked
    /// against the allowed roots before anything about it is answered. A volume is never
    /// at a path that fails the checks, so that is `NotFound` (what csi-sanity's "volume
    /// does not exist on the specified path" expects), the same answer whether or not
    /// such a host path exists; only a missing path is `InvalidArgument`.
    fn volume_path(&self, volume: &str, raw: &str) -> Result<PathBuf> {
        if raw.is_empty() {
            return Err(Error::invalid("volume_path", "required"));
        }
        self.host_path("volume_path", raw).map_err(|e| match e {
            Error::InvalidArgument { field, reason } => Error::NotFound(format!(
                "volume {volume} is not published or staged at {raw:?} ({field}: {reason})"
            )),
            other => other,
        })
    }

    async fn stage(&self, req: NodeStageVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let staging = self.host_path("staging_target_path", &req.staging_target_path)?;
        let cap = req.volume_capability.as_ref();
        let _guard = d.locks.try_lock(&volume.raw())?;
        match &volume {
            VolumeRef::Block(id) => d.block.stage(id, &staging, cap).await,
            VolumeRef::Nfs(id) => d.nfs()?.stage(id, &staging, cap).await,
            VolumeRef::Unknown(raw) => {
                // Checked as a block volume's would be before it is found missing.
                block::stage::required_capability(cap)?;
                d.check_ready()?;
                Err(Error::VolumeNotFound(raw.clone()))
            }
        }
    }

    async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let staging = self.host_path("staging_target_path", &req.staging_target_path)?;
        let _guard = d.locks.try_lock(&volume.raw())?;
        match &volume {
            VolumeRef::Block(id) => d.block.unstage(id, &staging).await,
            VolumeRef::Nfs(id) => match &d.nfs {
                Some(nfs) => nfs.unstage(id, &staging).await,
                None => nfs::node::unstage(&d.mounter(), id, &staging).await,
            },
            VolumeRef::Unknown(raw) => d.block.unstage_unknown(raw, &staging),
        }
    }

    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let staging = self.host_path("staging_target_path", &req.staging_target_path)?;
        let target = self.host_path("target_path", &req.target_path)?;
        let publish = Publish {
            staging: &staging,
            target: &target,
            readonly: req.readonly,
            capability: req.volume_capability.as_ref(),
            volume_context: &req.volume_context,
        };
        let _guard = d.locks.try_lock(&volume.raw())?;
        match &volume {
            VolumeRef::Block(id) => d.block.publish(id, &publish).await,
            VolumeRef::Nfs(id) => d.nfs()?.publish(id, &publish).await,
            VolumeRef::Unknown(raw) => {
                block::stage::required_capability(publish.capability)?;
                d.check_ready()?;
                Err(Error::VolumeNotFound(raw.clone()))
            }
        }
    }

    async fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let target = self.host_path("target_path", &req.target_path)?;
        let _guard = d.locks.try_lock(&volume.raw())?;
        match &volume {
            VolumeRef::Block(id) => d.block.unpublish(id, &target).await,
            VolumeRef::Nfs(id) => match &d.nfs {
                Some(nfs) => nfs.unpublish(id, &target).await,
                None => nfs::node::unpublish(&d.mounter(), id, &target).await,
            },
            VolumeRef::Unknown(raw) => Err(Error::VolumeNotFound(raw.clone())),
        }
    }

    async fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        // The path first: a bad one is refused before the host is looked at.
        let path = self.volume_path(&req.volume_id, &req.volume_path)?;
        let staging = match req.staging_target_path.as_str() {
            "" => None,
            raw => Some(request::host_path(
                "staging_target_path",
                raw,
                &d.allowed_roots,
            )?),
        };
        let staging = staging.as_deref();
        match &volume {
            VolumeRef::Block(id) => d.block.stats(id, &path, staging).await,
            VolumeRef::Nfs(id) => d.nfs()?.stats(id, &path, staging).await,
            VolumeRef::Unknown(raw) => Err(Error::VolumeNotFound(raw.clone())),
        }
    }

    async fn expand(&self, req: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let path = self.volume_path(&req.volume_id, &req.volume_path)?;
        let cap = req.volume_capability.as_ref();
        let expand = request::expand(req.capacity_range.as_ref(), false, cap)?;
        let _guard = d.locks.try_lock(&volume.raw())?;
        let capacity = match &volume {
            VolumeRef::Block(id) => d.block.node_expand(id, &path, &expand).await?,
            VolumeRef::Nfs(id) => d.nfs()?.node_expand(id, &path, &expand).await?,
            VolumeRef::Unknown(raw) => return Err(Error::VolumeNotFound(raw.clone())),
        };
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: capacity as i64,
        })
    }

    /// NodeGetInfo's topology: the node key, plus `<driver>/gds-nvme` and
    /// `<driver>/gds-nfs-rdma` = "true" for the backends whose node checks pass at call
    /// time (absent when not). The kubelet reads them at plugin registration; the readiness
    /// watcher (`crate::readiness`) makes it register again when they change.
    fn topology(&self) -> HashMap<String, String> {
        let d = &self.driver;
        crate::gds_gate::node_topology(d.gds_gate.as_deref(), &d.name, d.node_segment())
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        self.stage(request.into_inner()).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        self.unstage(request.into_inner()).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        self.publish(request.into_inner()).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        self.unpublish(request.into_inner()).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Ok(Response::new(self.stats(request.into_inner()).await?))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Ok(Response::new(self.expand(request.into_inner()).await?))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            RpcType::StageUnstageVolume,
            RpcType::GetVolumeStats,
            RpcType::VolumeCondition,
            RpcType::SingleNodeMultiWriter,
            RpcType::ExpandVolume,
        ]
        .into_iter()
        .map(|t| NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.driver.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology {
                segments: self.topology(),
            }),
        }))
    }
}
