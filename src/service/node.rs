use std::path::Path;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::block;
use crate::csi::node_server::Node;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type};
use crate::csi::*;
use crate::error::{Error, Result};
use crate::nfs;
use crate::os::mountinfo;
use crate::request::{self, Capability, VolumeRef};

pub struct NodeService {
    pub driver: Arc<Driver>,
}

fn required_capability(cap: Option<&VolumeCapability>) -> Result<Capability> {
    let cap = cap.ok_or_else(|| Error::invalid("volume_capability", "required"))?;
    request::capability(cap, "volume_capability")?.ok_or_else(|| {
        Error::invalid(
            "volume_capability",
            "multi-node access modes are not supported by node-local block volumes",
        )
    })
}

impl NodeService {
    /// NodeGetVolumeStats' path is a staging or target path like the others: checked
    /// against the allowed roots before anything about it is answered. A volume is never
    /// at a path that fails the checks, so that is `NotFound` (what csi-sanity's "volume
    /// does not exist on the specified path" expects), the same answer whether or not
    /// such a host path exists; only a missing path is `InvalidArgument`.
    fn volume_path(&self, volume: &str, raw: &str) -> Result<std::path::PathBuf> {
        if raw.is_empty() {
            return Err(Error::invalid("volume_path", "required"));
        }
        request::host_path("volume_path", raw, &self.driver.allowed_roots).map_err(|e| match e {
            Error::InvalidArgument { field, reason } => Error::NotFound(format!(
                "volume {volume} is not published or staged at {raw:?} ({field}: {reason})"
            )),
            other => other,
        })
    }

    /// Whether the path exists, opened beneath its root (a symlink or a mount crossed on
    /// the way is "not there": the volume is never reached that way).
    fn exists_beneath(&self, path: &Path) -> Result<bool> {
        match crate::os::safepath::open(
            "volume_path",
            &self.driver.allowed_roots,
            path,
            crate::os::safepath::Create::Nothing,
            None,
        ) {
            Ok(found) => Ok(found.is_some()),
            Err(Error::InvalidArgument { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A published volume whose staging mount is gone (unmounted behind the driver's
    /// back): the target still holds the filesystem, but unstage and the next publish
    /// find nothing at the staging path. `None` when no other staging path was given,
    /// and for raw block volumes (the device node bound at the target; staging mounts
    /// nothing for them).
    fn staging_lost(
        &self,
        req: &NodeGetVolumeStatsRequest,
        path: &Path,
        entry: &mountinfo::MountEntry,
        mounts: &[mountinfo::MountEntry],
        dev: &crate::pool::PoolDevice,
    ) -> Result<Option<VolumeCondition>> {
        let raw_block = entry.fs_type == "devtmpfs" || !path.is_dir();
        if req.staging_target_path.is_empty() || raw_block {
            return Ok(None);
        }
        let staging = request::host_path(
            "staging_target_path",
            &req.staging_target_path,
            &self.driver.allowed_roots,
        )?;
        let staged = mountinfo::at(mounts, &staging)
            .is_some_and(|m| crate::os::blockdev::carries(m, dev.major, dev.minor));
        Ok((staging != path && !staged).then(|| VolumeCondition {
            abnormal: true,
            message: format!(
                "the staging path {} no longer has the volume mounted (unmounted outside \
                 the driver?); the target still holds it until unpublished: unpublish, \
                 unstage and stage it again",
                req.staging_target_path
            ),
        }))
    }

    fn block_volume(&self, volume: &VolumeRef) -> Result<block::Located> {
        match volume {
            VolumeRef::Block(id) => block::locate(&self.driver, id),
            VolumeRef::Unknown(raw) => Err(Error::VolumeNotFound(raw.clone())),
            VolumeRef::Nfs(id) => Err(Error::VolumeNotFound(id.to_string())),
        }
    }

    async fn stage(&self, req: NodeStageVolumeRequest) -> Result<()> {
        let volume = request::volume_ref(&req.volume_id)?;
        let staging = request::host_path(
            "staging_target_path",
            &req.staging_target_path,
            &self.driver.allowed_roots,
        )?;
        if let VolumeRef::Nfs(id) = &volume {
            let cap = req
                .volume_capability
                .as_ref()
                .ok_or_else(|| Error::invalid("volume_capability", "required"))?;
            let _guard = self.driver.locks.try_lock(&volume.raw())?;
            return nfs::stage(&self.driver, id, &staging, cap).await;
        }
        let cap = required_capability(req.volume_capability.as_ref())?;
        self.driver.check_ready()?;
        let _guard = self.driver.locks.try_lock(&volume.raw())?;
        let located = self.block_volume(&volume)?;
        block::stage(&self.driver, &located, &staging, &cap).await
    }

    async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<()> {
        let volume = request::volume_ref(&req.volume_id)?;
        let staging = request::host_path(
            "staging_target_path",
            &req.staging_target_path,
            &self.driver.allowed_roots,
        )?;
        let _guard = self.driver.locks.try_lock(&volume.raw())?;
        if let VolumeRef::Nfs(id) = &volume {
            return nfs::unstage(&self.driver, id, &staging).await;
        }
        let mounts = self.driver.host.mount_table()?;
        if mountinfo::at(&mounts, &staging).is_none() {
            return Ok(());
        }
        // Only ever unmount this volume's own filesystem.
        let located = self.block_volume(&volume)?;
        block::unstage(&self.driver, &located, &staging).await
    }

    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<()> {
        let volume = request::volume_ref(&req.volume_id)?;
        let staging = request::host_path(
            "staging_target_path",
            &req.staging_target_path,
            &self.driver.allowed_roots,
        )?;
        let target =
            request::host_path("target_path", &req.target_path, &self.driver.allowed_roots)?;
        if let VolumeRef::Nfs(id) = &volume {
            let cap = req
                .volume_capability
                .as_ref()
                .ok_or_else(|| Error::invalid("volume_capability", "required"))?;
            let _guard = self.driver.locks.try_lock(&volume.raw())?;
            return nfs::publish(
                &self.driver,
                id,
                &staging,
                &target,
                req.readonly,
                cap,
                &req.volume_context,
            )
            .await;
        }
        let cap = required_capability(req.volume_capability.as_ref())?;
        self.driver.check_ready()?;
        let _guard = self.driver.locks.try_lock(&volume.raw())?;
        let located = self.block_volume(&volume)?;
        let gate = self.driver.gds_gate.as_deref();
        block::gate_publish(gate, self.driver.host.as_ref(), &located, &staging, &cap).await?;
        let readonly = req.readonly || cap.read_only_mode;
        block::publish(&self.driver, &located, &staging, &target, readonly, &cap).await
    }

    async fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<()> {
        let volume = request::volume_ref(&req.volume_id)?;
        let target =
            request::host_path("target_path", &req.target_path, &self.driver.allowed_roots)?;
        let _guard = self.driver.locks.try_lock(&volume.raw())?;
        let raw = volume.raw();
        match &volume {
            VolumeRef::Nfs(id) => nfs::unpublish(&self.driver, id, &target).await,
            VolumeRef::Unknown(_) => Err(Error::VolumeNotFound(raw)),
            VolumeRef::Block(id) => match block::locate(&self.driver, id) {
                Ok(located) => {
                    let dev = &located.device;
                    block::unpublish(&self.driver, &raw, &target, |m, st| {
                        block::is_this_device(m, st, dev)
                    })
                    .await
                }
                // A volume of this node whose record is gone (deleted): nothing at the
                // target can be recognised as its, so nothing is unmounted or removed.
                Err(Error::VolumeNotFound(_)) if id.node_id == self.driver.node_id => {
                    block::unpublish(&self.driver, &raw, &target, |_, _| false).await
                }
                Err(e) => Err(e),
            },
        }
    }

    fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        let volume = request::volume_ref(&req.volume_id)?;
        if req.volume_path.is_empty() {
            return Err(Error::invalid("volume_path", "required"));
        }
        // The path first: a bad one is refused before the host is looked at.
        let path = &self.volume_path(&req.volume_id, &req.volume_path)?;
        let located = self.block_volume(&volume)?;
        if !self.exists_beneath(path)? {
            return Err(Error::NotFound(format!(
                "volume {} is not published or staged at {}",
                located.id, req.volume_path
            )));
        }
        let mounts = self.driver.host.mount_table()?;
        let dev = &located.device;
        let entry = mountinfo::at(&mounts, path)
            .filter(|m| crate::os::blockdev::carries(m, dev.major, dev.minor));
        let Some(entry) = entry else {
            return Ok(NodeGetVolumeStatsResponse {
                usage: vec![],
                volume_condition: Some(VolumeCondition {
                    abnormal: true,
                    message: format!(
                        "{} exists but the volume is no longer mounted there",
                        req.volume_path
                    ),
                }),
            });
        };
        let condition = if entry.fs_read_only() {
            VolumeCondition {
                abnormal: true,
                message: "the filesystem is read-only (remounted after errors?); check dmesg"
                    .into(),
            }
        } else if let Some(lost) = self.staging_lost(&req, path, entry, &mounts, dev)? {
            lost
        } else {
            VolumeCondition {
                abnormal: false,
                message: "mounted".into(),
            }
        };
        let usage = if entry.fs_type == "devtmpfs" || !path.is_dir() {
            vec![VolumeUsage {
                total: dev.size_bytes as i64,
                unit: volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }]
        } else {
            let st = nix::sys::statvfs::statvfs(path)
                .map_err(|e| Error::io("statvfs", path, e.into()))?;
            let frsize = st.fragment_size() as i64;
            let total = st.blocks() as i64 * frsize;
            let available = st.blocks_available() as i64 * frsize;
            let used = (st.blocks() - st.blocks_free()) as i64 * frsize;
            let inodes = st.files() as i64;
            let inodes_free = st.files_available() as i64;
            vec![
                VolumeUsage {
                    available,
                    total,
                    used,
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: inodes_free,
                    total: inodes,
                    used: inodes - st.files_free() as i64,
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ]
        };
        let condition = crate::gds_gate::volume_condition(
            self.driver.gds_gate.as_deref(),
            &located.id.to_string(),
            condition,
        );
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
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
        let req = request.into_inner();
        if let Ok(VolumeRef::Nfs(id)) = request::volume_ref(&req.volume_id) {
            let path = self.volume_path(&req.volume_id, &req.volume_path)?;
            if !self.exists_beneath(&path)? {
                return Err(Error::NotFound(format!(
                    "volume {id} is not published or staged at {}",
                    req.volume_path
                ))
                .into());
            }
            let stats = nfs::stats(&self.driver, &id, &path).await?;
            return Ok(Response::new(stats));
        }
        Ok(Response::new(self.stats(req)?))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "volumes are whole devices and cannot be expanded",
        ))
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
                segments: crate::gds_gate::node_topology(
                    self.driver.gds_gate.as_deref(),
                    &self.driver.name,
                    self.driver.node_segment(),
                ),
            }),
        }))
    }
}
