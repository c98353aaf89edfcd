//! CreateVolume, DeleteVolume, ValidateVolumeCapabilities, ListVolumes and GetCapacity
//! of block volumes.

use std::collections::HashMap;

use super::BlockBackend;
use crate::csi;
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::error::{AllocationError, Error, Result, VolumeError};
use crate::os::FsType;
use crate::os::StripeGeometry;
use crate::pool::{fs_min, AllocationRequest, VolumeRecord};
use crate::request::{self, CreateVolume, PARAM_FS_TYPE};

fn volume_context(rec: &VolumeRecord) -> HashMap<String, String> {
    let mut ctx: HashMap<String, String> = rec.parameters.clone().into_iter().collect();
    ctx.insert(PARAM_FS_TYPE.into(), rec.fs_type.as_str().into());
    ctx.extend(super::stripe::controllers::context(rec));
    ctx.extend(super::stripe::pcie::context(rec));
    ctx
}

impl BlockBackend {
    fn volume(&self, id: &str, rec: &VolumeRecord) -> csi::Volume {
        csi::Volume {
            capacity_bytes: rec.capacity_bytes as i64,
            volume_id: id.to_owned(),
            volume_context: volume_context(rec),
            content_source: crate::volume::block::fill::content_source(rec),
            accessible_topology: vec![csi::Topology {
                segments: self.node.segment(),
            }],
        }
    }

    /// A segment can be served here unless it names another node.
    fn serves(&self, segment: &csi::Topology) -> bool {
        segment
            .segments
            .get(&self.node.topology_key)
            .is_none_or(|node| *node == self.node.node_id)
    }
}

/// The one filesystem the capabilities and the fsType parameter agree on.
fn fs_type(req: &CreateVolume<'_>) -> Result<FsType> {
    let caps = request::capabilities(req.capabilities)?;
    let mut fs_types: Vec<FsType> = caps.iter().filter_map(|c| c.fs_type).collect();
    fs_types.extend(req.params.fs_type);
    fs_types.dedup();
    if fs_types.len() > 1 {
        return Err(Error::invalid(
            "volume_capabilities",
            "the capabilities and the fsType parameter ask for different filesystems",
        ));
    }
    Ok(fs_types.first().copied().unwrap_or(FsType::Ext4))
}

/// CreateVolume of a block volume; `nfs` is this instance's NFS backend, which a clone of
/// an NFS directory is measured through.
pub async fn create(
    b: &BlockBackend,
    req: &CreateVolume<'_>,
    nfs: Option<&crate::volume::nfs::NfsBackend>,
) -> Result<csi::Volume> {
    let fs_type = fs_type(req)?;
    if let Some(topo) = req.accessibility {
        if !topo.requisite.is_empty() && !topo.requisite.iter().any(|t| b.serves(t)) {
            return Err(AllocationError::NotThisNode {
                node: b.node.node_id.clone(),
            }
            .into());
        }
    }
    // A device that the node's mkfs refuses would never stage: round up or refuse here.
    let geometry = match req.params.stripe {
        Some(p) => Some(StripeGeometry::new(p.chunk_bytes, p.count)?),
        None => None,
    };
    let min = fs_min::min_bytes(fs_type, geometry).await?;
    let fitted = fs_min::fit(fs_type, min, req.required_bytes, req.limit_bytes)?;
    // A clone: at least what its source needs (a block source on its node),
    // refused before anything is allocated when the limit cannot hold it.
    let (required_bytes, source) =
        match crate::volume::block::fill::check_clone(b, req, nfs).await? {
            Some((size, recorded)) => (fitted.max(size), recorded),
            None => (fitted, None),
        };
    let alloc = AllocationRequest {
        name: req.name.clone(),
        required_bytes,
        limit_bytes: req.limit_bytes,
        fs_type,
        parameters: req.params.stored.clone(),
        source,
    };
    let kind = match req.params.layout {
        request::LayoutKind::Device => IdLayout::Device,
        request::LayoutKind::Partition => IdLayout::Partition,
        request::LayoutKind::Stripe => IdLayout::Stripe,
    };
    let (id, rec) = b
        .layout_of(kind)
        .allocate(b.mounter.host.as_ref(), &alloc)
        .await
        .map_err(|e| match e {
            e if b.pool.devices().is_empty() && e.is_out_of_room() => b.empty_pool().into(),
            e if e.is_range_unsatisfiable() && required_bytes > req.required_bytes => {
                AllocationError::RaisedToFsMinimum {
                    inner: Box::new(e),
                    min,
                    fs: fs_type.as_str(),
                }
                .into()
            }
            e => e,
        })?;
    // A source in use: its clone is copied now, while CreateVolume is its point in time.
    crate::volume::block::fill::fill_from_mounted_source(b, &id).await?;
    Ok(b.volume(&id.to_string(), &rec))
}

pub async fn delete(b: &BlockBackend, id: &BlockVolumeId) -> Result<()> {
    if id.node_id != b.node.node_id {
        return Err(VolumeError::OtherNode {
            volume: id.to_string(),
            node: id.node_id.clone(),
            this: b.node.node_id.clone(),
        }
        .into());
    }
    b.check_ready()?;
    crate::volume::block::fill::refuse_unfilled_clones(b, &id.to_string())?;
    crate::volume::block::fill::unmount_leftovers(b, &id.to_string()).await?;
    let mounts = b.mounter.mount_table()?;
    b.layout_of(id.layout)
        .release(&b.mounter.host, id, &mounts)
        .await?;
    crate::volume::block::fill::forget(b, &id.to_string());
    Ok(())
}

fn unconfirmed(message: impl Into<String>) -> Result<Option<String>> {
    Ok(Some(message.into()))
}

pub fn validate(
    b: &BlockBackend,
    id: &BlockVolumeId,
    caps: &[csi::VolumeCapability],
) -> Result<Option<String>> {
    let rec = b.record(&id.to_string())?;
    for cap in caps {
        let Some(parsed) = request::capability(cap, "volume_capabilities")? else {
            return unconfirmed(
                "multi-node access modes are not supported by node-local block volumes",
            );
        };
        if parsed.access == request::Access::Mount && crate::volume::block::fill::is_raw_clone(&rec)
        {
            return unconfirmed("the volume is a raw block clone: block access only");
        }
        if let Some(fs) = parsed.fs_type {
            if rec.formatted && fs != rec.fs_type {
                return unconfirmed(format!("the volume holds {}", rec.fs_type.as_str()));
            }
        }
    }
    Ok(None)
}

pub fn list(b: &BlockBackend, after: Option<&str>, limit: usize) -> Vec<(String, csi::Volume)> {
    let state = b.pool.state.snapshot();
    let limit = if limit == 0 { usize::MAX } else { limit };
    state
        .after(after)
        .take(limit)
        .map(|(id, rec)| (id.clone(), b.volume(id, rec)))
        .collect()
}

pub fn capacity(
    b: &BlockBackend,
    req: &csi::GetCapacityRequest,
) -> Result<csi::GetCapacityResponse> {
    let elsewhere = req
        .accessible_topology
        .as_ref()
        .is_some_and(|t| !b.serves(t));
    let unsupported = req
        .volume_capabilities
        .iter()
        .any(|c| !matches!(request::capability(c, "volume_capabilities"), Ok(Some(_))));
    if elsewhere || unsupported {
        return Ok(csi::GetCapacityResponse::default());
    }
    let params: std::collections::BTreeMap<String, String> = req
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let kind = request::layout_kind(&params)?;
    let stripe = request::stripe::stripe_params(&params, kind == request::LayoutKind::Stripe)?;
    let capacity = match (kind, stripe) {
        (_, Some(geo)) => b.striped.capacity_for(geo),
        (request::LayoutKind::Partition, _) => b.layout_of(IdLayout::Partition).capacity(),
        _ => b.layout_of(IdLayout::Device).capacity(),
    };
    Ok(csi::GetCapacityResponse {
        available_capacity: capacity.available as i64,
        maximum_volume_size: capacity.maximum.map(|m| m as i64),
        minimum_volume_size: None,
    })
}
