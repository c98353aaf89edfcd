use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{Call, Driver};
use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::{rpc::Type as RpcType, Rpc, Type};
use crate::csi::*;
use crate::error::{Error, Result, SnapshotError};
use crate::request::{self, ContentSource, VolumeRef};
use crate::runtime::overlap::LockKey;
use crate::volume::VolumeBackend;

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

impl ControllerService {
    async fn create(&self, req: CreateVolumeRequest) -> Result<Volume> {
        let d = &self.driver;
        d.check_ready()?;
        let mut create = request::create_volume(&req)?;
        let _guard = d.locks.try_lock(LockKey::VolumeName(&create.name))?;
        // A clone's source neither staged nor unstaged while its clone is checked and
        // recorded (each would pass its checks before the other records).
        let _source = match create.source.as_ref().and_then(ContentSource::volume) {
            Some((text, _)) => Some(d.locks.try_lock(LockKey::Volume(text))?),
            None => None,
        };
        if let Some(ContentSource::Snapshot(raw)) = &create.source {
            let ctx = d.snapshot_context()?;
            create.restore = Some(match crate::snapshot::restore::resolve(&ctx, raw).await {
                // Gone since: a retry of a CreateVolume that already restored it succeeds.
                Err(Error::Snapshot(gone @ SnapshotError::RestoreSourceNotFound { .. })) => {
                    crate::snapshot::restore::made_from(&ctx, &create.name, raw).ok_or(gone)?
                }
                resolved => resolved?,
            });
        }
        if request::is_nfs(&req.parameters) {
            if let Some((_, id)) = create.source.as_ref().and_then(ContentSource::volume) {
                // CSI spec, CreateVolume errors: a source that does not exist is NOT_FOUND,
                // one the plugin cannot use is INVALID_ARGUMENT. NFS sources: volume/nfs/clone.rs.
                match id {
                    VolumeRef::Unknown(raw) => return Err(Error::VolumeNotFound(raw.clone())),
                    VolumeRef::Block(_) => {
                        return Err(Error::invalid(
                            "volume_content_source.volume.volume_id",
                            "a block volume cannot fill an NFS volume; clone it into a block class",
                        ))
                    }
                    VolumeRef::Nfs(_) => {}
                }
            }
            d.nfs()?.create(&create).await
        } else {
            // A block clone of an NFS directory is measured through the NFS backend.
            let volume =
                crate::volume::block::controller::create(&d.block, &create, d.nfs.as_ref()).await?;
            if let Some(restore) = &create.restore {
                if !crate::volume::block::fill::done(&d.block, &volume.volume_id)? {
                    let ctx = d.snapshot_context()?;
                    crate::snapshot::restore::mark(&ctx, restore, &volume.volume_id).await?;
                }
            }
            Ok(volume)
        }
    }

    async fn delete(&self, req: DeleteVolumeRequest) -> Result<()> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&req.volume_id))?;
        match &volume {
            VolumeRef::Block(id) => {
                d.block.delete(id).await?;
                if let Ok(ctx) = d.snapshot_context() {
                    crate::snapshot::restore::unmark(&ctx, &req.volume_id).await;
                }
                Ok(())
            }
            VolumeRef::Nfs(id) => d.nfs()?.delete(id).await,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Delete, raw),
        }
    }

    async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        let cap = req.volume_capability.as_ref();
        let expand = request::expand(req.capacity_range.as_ref(), true, cap)?;
        let _guard = d.locks.try_lock(LockKey::Volume(&req.volume_id))?;
        let done = match &volume {
            VolumeRef::Block(id) => d.block.expand(id, &expand).await?,
            VolumeRef::Nfs(id) => d.nfs()?.expand(id, &expand).await?,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Other, raw)?,
        };
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: done.capacity as i64,
            node_expansion_required: done.node_expansion_required,
        })
    }

    async fn validate(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        let d = &self.driver;
        let volume = request::volume_ref(&req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::invalid(
                "volume_capabilities",
                "at least one capability is required",
            ));
        }
        let caps = &req.volume_capabilities;
        let refused = match &volume {
            VolumeRef::Block(id) => d.block.validate(id, caps).await?,
            VolumeRef::Nfs(id) => d.nfs()?.validate(id, caps).await?,
            VolumeRef::Unknown(raw) => d.unknown_volume(Call::Other, raw)?,
        };
        Ok(match refused {
            None => confirmed(req),
            Some(message) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
        })
    }

    fn list(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse> {
        let after = page_start(req.max_entries, &req.starting_token)?;
        let d = &self.driver;
        // One more than a page from each backend tells whether another page follows.
        let want = match req.max_entries {
            0 => 0,
            n => n as usize + 1,
        };
        let nfs = d.nfs.as_ref().map(|n| n.list(after, want));
        let mut entries: Vec<_> = d
            .block
            .list(after, want)
            .into_iter()
            .chain(nfs.unwrap_or_default())
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

    async fn list_snapshots(&self, req: ListSnapshotsRequest) -> Result<ListSnapshotsResponse> {
        let after = page_start(req.max_entries, &req.starting_token)?;
        let snapshot = request::snapshot::list_snapshots_filter(&req);
        let ctx = self.driver.snapshot_context()?;
        let mut entries: Vec<Snapshot> =
            crate::snapshot::list(&ctx, snapshot.as_ref(), &req.source_volume_id)
                .await?
                .into_iter()
                .filter(|s| after.is_none_or(|a| s.snapshot_id.as_str() > a))
                .collect();
        entries.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        let mut next_token = String::new();
        if req.max_entries > 0 && entries.len() > req.max_entries as usize {
            entries.truncate(req.max_entries as usize);
            let last = entries.last().map(|s| s.snapshot_id.as_str()).unwrap_or("");
            next_token = format!("{TOKEN_PREFIX}{last}");
        }
        Ok(ListSnapshotsResponse {
            entries: entries
                .into_iter()
                .map(|s| list_snapshots_response::Entry { snapshot: Some(s) })
                .collect(),
            next_token,
        })
    }

    fn capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse> {
        request::parameters(&req.parameters)?;
        if request::is_nfs(&req.parameters) {
            return Ok(crate::volume::nfs::controller::capacity());
        }
        crate::volume::block::controller::capacity(&self.driver.block, &req)
    }
}

/// A list call's paging: `max_entries` not negative, and where the page starts (after the
/// id a `starting_token` this driver issued names; none from the start).
fn page_start(max_entries: i32, starting_token: &str) -> Result<Option<&str>> {
    if max_entries < 0 {
        return Err(Error::invalid("max_entries", "must not be negative"));
    }
    match starting_token {
        "" => Ok(None),
        token => token
            .strip_prefix(TOKEN_PREFIX)
            .map(Some)
            .ok_or_else(|| Error::ForeignToken {
                token: token.to_owned(),
            }),
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
            RpcType::ExpandVolume,
            RpcType::CloneVolume,
            RpcType::CreateDeleteSnapshot,
            RpcType::ListSnapshots,
            RpcType::GetSnapshot,
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
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request::snapshot::create_snapshot(request.get_ref())?;
        let ctx = self.driver.snapshot_context()?;
        let locks = &self.driver.locks;
        let _guard = locks.try_lock(LockKey::SnapshotName(&req.name))?;
        // A copy this call starts holds its block source's guard to its end.
        let source_guard = match &req.source {
            VolumeRef::Block(_) if crate::snapshot::copy_needed(&ctx, &req.name).await? => {
                Some(locks.try_lock(LockKey::Volume(&req.source.raw()))?)
            }
            _ => None,
        };
        let snapshot = crate::snapshot::create(&ctx, &req, source_guard).await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let snapshot = request::snapshot::delete_snapshot(request.get_ref())?;
        let ctx = self.driver.snapshot_context()?;
        let name = match snapshot.ours() {
            Some(id) => ctx.snapshots.by_id(id)?.map(|r| r.name),
            None => None,
        };
        let _guard = match &name {
            Some(name) => Some(self.driver.locks.try_lock(LockKey::SnapshotName(name))?),
            None => None,
        };
        crate::snapshot::delete(&ctx, &snapshot).await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Ok(Response::new(
            self.list_snapshots(request.into_inner()).await?,
        ))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let snapshot = request::snapshot::get_snapshot(request.get_ref())?;
        let ctx = self.driver.snapshot_context()?;
        let snapshot = crate::snapshot::get(&ctx, &snapshot).await?;
        Ok(Response::new(GetSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        Ok(Response::new(self.expand(request.into_inner()).await?))
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
