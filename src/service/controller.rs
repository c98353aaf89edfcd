use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::{rpc::Type as RpcType, Rpc, Type};
use crate::csi::*;
use crate::error::{Error, Result};
use crate::nfs;
use crate::os::FsType;
use crate::pool::{fs_min, AllocationRequest, VolumeRecord};
use crate::request::{self, PARAM_FS_TYPE};
use crate::volume_id::{self, BlockVolumeId};

pub struct ControllerService {
    pub driver: Arc<Driver>,
}

const TOKEN_PREFIX: &str = "after:";

fn confirmed(req: ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse {
    ValidateVolumeCapabilitiesResponse {
        confirmed: Some(validate_volume_capabilities_response::Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: Default::default(),
        }),
        message: String::new(),
    }
}

fn volume_context(rec: &VolumeRecord) -> HashMap<String, String> {
    let mut ctx: HashMap<String, String> = rec.parameters.clone().into_iter().collect();
    ctx.insert(PARAM_FS_TYPE.into(), rec.fs_type.as_str().into());
    ctx
}

impl ControllerService {
    fn volume(&self, id: &str, rec: &VolumeRecord) -> Volume {
        Volume {
            capacity_bytes: rec.capacity_bytes as i64,
            volume_id: id.to_owned(),
            volume_context: volume_context(rec),
            content_source: None,
            accessible_topology: vec![Topology {
                segments: self.driver.node_segment(),
            }],
        }
    }

    /// A segment can be served here unless it names another node.
    fn serves(&self, segment: &Topology) -> bool {
        segment
            .segments
            .get(&self.driver.node_topology_key())
            .is_none_or(|node| *node == self.driver.node_id)
    }

    async fn create(&self, req: CreateVolumeRequest) -> Result<Volume> {
        self.driver.check_ready()?;
        let name = request::name(&req.name)?;
        let params = request::parameters(&req.parameters)?;
        if req.volume_content_source.is_some() {
            return Err(Error::invalid(
                "volume_content_source",
                "snapshots and clones are not supported; create an empty volume",
            ));
        }
        let range = req.capacity_range.unwrap_or_default();
        if range.required_bytes < 0 || range.limit_bytes < 0 {
            return Err(Error::invalid(
                "capacity_range",
                "bytes must not be negative",
            ));
        }
        if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
            return Err(Error::invalid(
                "capacity_range",
                "required_bytes is larger than limit_bytes",
            ));
        }
        if nfs::is_nfs(&req.parameters) {
            // A directory on a shared server: no pool, no topology, capacity not enforced.
            return nfs::create(
                &self.driver,
                name,
                &req.volume_capabilities,
                params.stored,
                &req.parameters,
                range.required_bytes as u64,
                range.limit_bytes as u64,
            )
            .await;
        }
        let caps = request::capabilities(&req.volume_capabilities)?;
        let mut fs_types: Vec<FsType> = caps.iter().filter_map(|c| c.fs_type).collect();
        fs_types.extend(params.fs_type);
        fs_types.dedup();
        if fs_types.len() > 1 {
            return Err(Error::invalid(
                "volume_capabilities",
                "the capabilities and the fsType parameter ask for different filesystems",
            ));
        }
        if let Some(topo) = &req.accessibility_requirements {
            if !topo.requisite.is_empty() && !topo.requisite.iter().any(|t| self.serves(t)) {
                return Err(Error::ResourceExhausted(format!(
                    "accessibility_requirements: this controller allocates on node {} only",
                    self.driver.node_id
                )));
            }
        }
        // A device that the node's mkfs refuses would never stage: round up or refuse here.
        let fs_type = fs_types.first().copied().unwrap_or(FsType::Ext4);
        let min = fs_min::min_bytes(fs_type).await?;
        let required_bytes = fs_min::fit(
            fs_type,
            min,
            range.required_bytes as u64,
            range.limit_bytes as u64,
        )?;
        let _guard = self.driver.locks.try_lock(&format!("name:{name}"))?;
        let alloc = AllocationRequest {
            name,
            required_bytes,
            limit_bytes: range.limit_bytes as u64,
            fs_type,
            parameters: params.stored,
        };
        let (id, rec) = self
            .driver
            .pool
            .allocate(self.driver.host.as_ref(), &alloc)
            .await
            .map_err(|e| match e {
                Error::OutOfRange(m) if required_bytes > range.required_bytes as u64 => {
                    Error::OutOfRange(format!(
                        "{m}; the request was raised to {min} bytes, the smallest {} the \
                         node's mkfs makes",
                        fs_type.as_str()
                    ))
                }
                e => e,
            })?;
        Ok(self.volume(&id.to_string(), &rec))
    }

    async fn delete(&self, req: DeleteVolumeRequest) -> Result<()> {
        volume_id::check_well_formed("volume_id", &req.volume_id)?;
        if let Some(id) = nfs::NfsVolumeId::parse(&req.volume_id) {
            return nfs::delete(&self.driver, &id).await;
        }
        let Some(id) = BlockVolumeId::parse(&req.volume_id) else {
            // Never issued by this driver, so it does not exist: deleting it succeeds.
            return Ok(());
        };
        if id.node_id != self.driver.node_id {
            return Err(Error::FailedPrecondition(format!(
                "volume {} lives on node {}; its node's controller deletes it (this is {})",
                req.volume_id, id.node_id, self.driver.node_id
            )));
        }
        self.driver.check_ready()?;
        let _guard = self.driver.locks.try_lock(&req.volume_id)?;
        let mounts = self.driver.host.mount_table()?;
        self.driver
            .pool
            .release(&self.driver.host, &req.volume_id, &mounts)
            .await
    }

    fn record(&self, volume_id: &str) -> Result<VolumeRecord> {
        volume_id::check_well_formed("volume_id", volume_id)?;
        self.driver
            .pool
            .state
            .snapshot()
            .volumes
            .get(volume_id)
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound(volume_id.to_owned()))
    }

    async fn validate(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        volume_id::check_well_formed("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::invalid(
                "volume_capabilities",
                "at least one capability is required",
            ));
        }
        if let Some(id) = nfs::NfsVolumeId::parse(&req.volume_id) {
            if let Some(message) =
                nfs::validate(&self.driver, &id, &req.volume_capabilities).await?
            {
                return Ok(ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message,
                });
            }
            return Ok(confirmed(req));
        }
        let rec = self.record(&req.volume_id)?;
        for cap in &req.volume_capabilities {
            let parsed = request::capability(cap, "volume_capabilities")?;
            let Some(parsed) = parsed else {
                return Ok(ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message:
                        "multi-node access modes are not supported by node-local block volumes"
                            .into(),
                });
            };
            if let Some(fs) = parsed.fs_type {
                if rec.formatted && fs != rec.fs_type {
                    return Ok(ValidateVolumeCapabilitiesResponse {
                        confirmed: None,
                        message: format!("the volume holds {}", rec.fs_type.as_str()),
                    });
                }
            }
        }
        Ok(confirmed(req))
    }

    fn list(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse> {
        if req.max_entries < 0 {
            return Err(Error::invalid("max_entries", "must not be negative"));
        }
        let after = match req.starting_token.as_str() {
            "" => None,
            token => Some(token.strip_prefix(TOKEN_PREFIX).ok_or_else(|| {
                Error::Aborted(format!(
                    "starting_token {token:?} was not issued by this driver; list again from the start"
                ))
            })?),
        };
        let state = self.driver.pool.state.snapshot();
        let mut entries: Vec<_> = state
            .volumes
            .iter()
            .map(|(id, rec)| (id.clone(), self.volume(id, rec)))
            .chain(nfs::list(&self.driver))
            .filter(|(id, _)| after.is_none_or(|a| id.as_str() > a))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut next_token = String::new();
        if req.max_entries > 0 && entries.len() > req.max_entries as usize {
            entries.truncate(req.max_entries as usize);
            next_token = format!(
                "{TOKEN_PREFIX}{}",
                entries.last().map(|(id, _)| id.as_str()).unwrap_or("")
            );
        }
        Ok(ListVolumesResponse {
            entries: entries
                .into_iter()
                .map(|(_, volume)| list_volumes_response::Entry {
                    volume: Some(volume),
                    status: None,
                })
                .collect(),
            next_token,
        })
    }

    fn capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse> {
        request::parameters(&req.parameters)?;
        if nfs::is_nfs(&req.parameters) {
            // The server's free space is not tracked: capacity is not enforced for NFS, so
            // no request is too large. Not 0: the chart's per-node external-provisioners
            // take an immediate-binding (NFS) claim only when `request <= available`
            // (external-provisioner v6.4.0 pkg/controller/controller.go:1736, checkCapacity,
            // called from becomeOwner), and 0 would leave every NFS claim Pending.
            return Ok(GetCapacityResponse {
                available_capacity: i64::MAX,
                ..Default::default()
            });
        }
        let elsewhere = req
            .accessible_topology
            .as_ref()
            .is_some_and(|t| !self.serves(t));
        let unsupported = req
            .volume_capabilities
            .iter()
            .any(|c| !matches!(request::capability(c, "volume_capabilities"), Ok(Some(_))));
        if elsewhere || unsupported {
            return Ok(GetCapacityResponse::default());
        }
        let free = self.driver.pool.free_devices();
        Ok(GetCapacityResponse {
            available_capacity: free.iter().map(|d| d.size_bytes as i64).sum(),
            maximum_volume_size: free.iter().map(|d| d.size_bytes as i64).max(),
            minimum_volume_size: None,
        })
    }
}

// The Err type is fixed by the generated trait.
#[allow(clippy::result_large_err)]
fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not supported by gds-csi"
    )))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = self.create(request.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete(request.into_inner()).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        Ok(Response::new(self.validate(request.into_inner()).await?))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        Ok(Response::new(self.list(request.into_inner())?))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Ok(Response::new(self.capacity(request.into_inner())?))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            RpcType::CreateDeleteVolume,
            RpcType::ListVolumes,
            RpcType::GetCapacity,
            RpcType::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        unimplemented("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        unimplemented("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}
