use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{Call, Driver, TakeDownOf};
use crate::csi::node_server::Node;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type};
use crate::csi::*;
use crate::error::Result;
use crate::request::node::{ForVolume, NodeExpand, Stats, TakeDown};
use crate::request::{self, VolumeRef};
use crate::runtime::overlap::LockKey;
use crate::volume::VolumeBackend;

pub struct NodeService {
    pub driver: Arc<Driver>,
}

impl NodeService {
    async fn stage(&self, req: NodeStageVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let stage = request::node::node_stage(&req, &d.allowed_roots)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&stage.raw()))?;
        match &stage {
            ForVolume::Block(id, req) => {
                let staged = d.block.stage(id, req).await?;
                // Filled now: the snapshot it was restored from may be deleted.
                if staged.restored_from.is_some() {
                    if let Ok(ctx) = d.snapshot_context() {
                        crate::snapshot::restore::unmark(&ctx, &stage.raw()).await;
                    }
                }
                Ok(())
            }
            ForVolume::Nfs(id, req) => d.nfs()?.stage(id, req).await.map(drop),
            ForVolume::Unknown(raw) => d.unknown_volume(Call::Stage, raw),
        }
    }

    async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let TakeDown { volume, path } = request::node::node_unstage(&req, &d.allowed_roots)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&volume.raw()))?;
        match &volume {
            VolumeRef::Block(id) => d.block.unstage(id, &path).await,
            VolumeRef::Nfs(id) => d.nfs_take_down(id, TakeDownOf::Staging, &path).await,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Unstage(&path), raw),
        }
    }

    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let publish = request::node::node_publish(&req, &d.allowed_roots)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&publish.raw()))?;
        match &publish {
            ForVolume::Block(id, req) => d.block.publish(id, req).await,
            ForVolume::Nfs(id, req) => d.nfs()?.publish(id, req).await,
            ForVolume::Unknown(raw) => d.unknown_volume(Call::Publish, raw),
        }
    }

    async fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let TakeDown { volume, path } = request::node::node_unpublish(&req, &d.allowed_roots)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&volume.raw()))?;
        match &volume {
            VolumeRef::Block(id) => d.block.unpublish(id, &path).await,
            VolumeRef::Nfs(id) => d.nfs_take_down(id, TakeDownOf::Target, &path).await,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Other, raw),
        }
    }

    async fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        let d = &self.driver;
        let Stats {
            volume,
            path,
            staging,
        } = request::node::node_stats(&req, &d.allowed_roots)?;
        let staging = staging.as_deref();
        match &volume {
            VolumeRef::Block(id) => d.block.stats(id, &path, staging).await,
            VolumeRef::Nfs(id) => d.nfs()?.stats(id, &path, staging).await,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Other, raw),
        }
    }

    async fn expand(&self, req: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse> {
        let d = &self.driver;
        let NodeExpand {
            volume,
            path,
            expand,
        } = request::node::node_expand(&req, &d.allowed_roots)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&volume.raw()))?;
        let capacity = match &volume {
            VolumeRef::Block(id) => d.block.node_expand(id, &path, &expand).await?,
            VolumeRef::Nfs(id) => d.nfs()?.node_expand(id, &path, &expand).await?,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Other, raw)?,
        };
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: capacity as i64,
        })
    }

    /// NodeGetInfo's topology: the node key, plus `<driver>/gds-nvme` and
    /// `<driver>/gds-nfs-rdma` = "true" for the backends whose node checks pass at call
    /// time (absent when not). The kubelet reads them at plugin registration; the readiness
    /// watcher (`crate::gds::readiness`) makes it register again when they change.
    fn topology(&self) -> HashMap<String, String> {
        let d = &self.driver;
        crate::gds::gate::node_topology(d.gds_gate.as_deref(), &d.name, d.node_segment())
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
