//! CreateVolume, DeleteVolume, ValidateVolumeCapabilities and ListVolumes of NFS
//! volumes: a directory on the export, created, removed, retained or archived.

use std::collections::HashMap;

use tracing::info;

use super::{clone, fsops, NfsBackend, NfsRecord, NfsVolumeId, OnDelete};
use crate::csi;
use crate::error::{AllocationError, Error, Result};
use crate::pool::SourceOf;
use crate::request::{nfs, nfs_options, ContentSource, CreateVolume, NfsParams, Transport};
use crate::volume::{Expand, Expanded};

fn fits(capacity: u64, required: u64, limit: u64) -> bool {
    capacity >= required && (limit == 0 || capacity <= limit)
}

fn volume_of(
    b: &NfsBackend,
    id: &str,
    rec: &NfsRecord,
    parsed: Option<&NfsVolumeId>,
) -> csi::Volume {
    let mut ctx: HashMap<String, String> = rec.parameters.clone().into_iter().collect();
    if let Some(p) = parsed {
        ctx.insert("dir".into(), p.dir.clone());
    }
    csi::Volume {
        capacity_bytes: rec.capacity_bytes as i64,
        volume_id: id.to_owned(),
        volume_context: ctx,
        content_source: clone::content_source(rec),
        // Reachable from every node that can reach the server; gated volumes only where the
        // node advertises NFS-over-RDMA GDS readiness.
        accessible_topology: crate::gds::gate::nfs_topology(&b.driver_name, &rec.parameters),
    }
}

/// The volume id a CreateVolume asks for: parameters, directory and transport checked.
fn requested_id(req: &CreateVolume<'_>) -> Result<NfsVolumeId> {
    let params = NfsParams::parse(&req.params.stored)?;
    if req.capabilities.is_empty() {
        return Err(Error::invalid(
            "volume_capabilities",
            "at least one capability is required",
        ));
    }
    let mut flags = Vec::new();
    for cap in req.capabilities {
        flags.extend(nfs::required(cap, "volume_capabilities")?.mount_flags);
    }
    let merged = nfs_options::merge(&Transport::default(), &flags)?;
    let dir = nfs::expand(&params.sub_dir, &req.name, req.raw_parameters)?;
    NfsVolumeId::fitted(&params, dir, merged.transport)
}

/// An existing volume of that name, or that directory, must be this very request.
fn check_existing(b: &NfsBackend, req: &CreateVolume<'_>, id: &NfsVolumeId) -> Result<()> {
    let (name, id_text) = (&req.name, id.to_string());
    if let Some((existing, rec)) = b.store.registry.by_name(name) {
        if existing != id_text
            || rec.parameters != req.params.stored
            || rec.source.as_ref().map(SourceOf::id) != req.source.as_ref().map(ContentSource::text)
        {
            return Err(AllocationError::NameTakenOtherSource {
                name: name.to_string(),
            }
            .into());
        }
        if !fits(rec.capacity_bytes, req.required_bytes, req.limit_bytes) {
            return Err(AllocationError::NameTakenOtherSize {
                name: name.to_string(),
                bytes: rec.capacity_bytes,
            }
            .into());
        }
    }
    if let Some(other) = b.store.registry.get(&id_text).filter(|r| &r.name != name) {
        return Err(AllocationError::DirectoryTaken {
            dir: id.source(),
            owner: other.name,
        }
        .into());
    }
    Ok(())
}

/// CreateVolume of an NFS volume: a directory on a shared server, no pool, no node
/// topology, capacity recorded and not enforced.
pub async fn create(b: &NfsBackend, req: &CreateVolume<'_>) -> Result<csi::Volume> {
    let id = requested_id(req)?;
    let id_text = id.to_string();
    check_existing(b, req, &id)?;
    if let Some((_, source)) = req.source.as_ref().and_then(ContentSource::volume) {
        let rec = clone::create(b, req, &id, source).await?;
        return Ok(volume_of(b, &id_text, &rec, Some(&id)));
    }
    if let Some(restore) = &req.restore {
        let rec = clone::restore(b, req, &id, restore).await?;
        return Ok(volume_of(b, &id_text, &rec, Some(&id)));
    }
    let root = b.export_root(&id).await?;
    let rel = id.dir.clone();
    b.blocking(format!("creating {}", id.source()), move || {
        fsops::ensure_dir(&root, &rel)
    })
    .await?;
    let capacity = b
        .store
        .registry
        .get(&id_text)
        .map(|r| r.capacity_bytes)
        .unwrap_or(req.required_bytes);
    let rec = NfsRecord {
        name: req.name.clone(),
        capacity_bytes: capacity,
        parameters: req.params.stored.clone(),
        ..NfsRecord::default()
    };
    b.store.registry.put(&id_text, &rec)?;
    info!(volume_id = %id_text, source = %id.source(), "NFS volume ready");
    Ok(volume_of(b, &id_text, &rec, Some(&id)))
}

/// DeleteVolume: remove, retain or archive the directory per `onDelete`. Idempotent.
pub async fn delete(b: &NfsBackend, id: &NfsVolumeId) -> Result<()> {
    let id_text = id.to_string();
    let root = b.export_root(id).await?;
    let rel = id.dir.clone();
    let filling = clone::delete_filling(b, id).await?;
    match id.on_delete {
        _ if filling => {}
        OnDelete::Retain => info!(volume_id = %id_text, "onDelete=retain: directory kept"),
        OnDelete::Delete => {
            let (key, what) = (
                format!("remove:{id_text}"),
                format!("removing {}", id.source()),
            );
            let wait = b.store.op_timeout;
            b.removals
                .remove_tree(&key, &what, (root, rel), wait)
                .await?;
            info!(volume_id = %id_text, "directory removed");
        }
        OnDelete::Archive => {
            let suffix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
                .to_string();
            let moved = b
                .blocking(format!("archiving {}", id.source()), move || {
                    fsops::archive(&root, &rel, &suffix)
                })
                .await?;
            info!(volume_id = %id_text, archived_as = ?moved, "directory archived");
        }
    }
    crate::metrics::clone::forget(&id_text);
    b.store.registry.remove(&id_text)
}

/// ControllerExpandVolume as csi-driver-nfs answers it (pkg/nfs/controllerserver.go,
/// ControllerExpandVolume at d3b27c0: the required size, no node step): capacity is not
/// enforced for NFS (see GetCapacity), so the directory takes the new size as it is. The
/// record keeps the larger size for ListVolumes.
pub async fn expand(b: &NfsBackend, id: &NfsVolumeId, req: &Expand) -> Result<Expanded> {
    let id_text = id.to_string();
    let known = b.store.registry.get(&id_text).is_some();
    if !known && !b.dir_exists(id).await? {
        return Err(Error::VolumeNotFound(id_text));
    }
    b.store.registry.modify(&id_text, |r| {
        r.capacity_bytes = r.capacity_bytes.max(req.required);
    })?;
    Ok(Expanded {
        capacity: req.required,
        node_expansion_required: false,
    })
}

/// ValidateVolumeCapabilities: `Ok(None)` confirms, `Ok(Some(why))` does not.
pub async fn validate(
    b: &NfsBackend,
    id: &NfsVolumeId,
    caps: &[csi::VolumeCapability],
) -> Result<Option<String>> {
    let known = b.store.registry.get(&id.to_string()).is_some();
    if !known && !b.dir_exists(id).await? {
        return Err(Error::VolumeNotFound(id.to_string()));
    }
    for cap in caps {
        if let Err(why) = nfs::capability(cap, "volume_capabilities")? {
            return Ok(Some(why));
        }
    }
    Ok(None)
}

/// ListVolumes entries of NFS volumes, by id.
pub fn list(b: &NfsBackend, after: Option<&str>, limit: usize) -> Vec<(String, csi::Volume)> {
    let limit = if limit == 0 { usize::MAX } else { limit };
    // A clone still filling is no volume yet: no CreateVolume has answered it.
    b.store
        .registry
        .page(after, limit, |rec| !rec.filling)
        .into_iter()
        .map(|(id, rec)| {
            let parsed = NfsVolumeId::parse(&id);
            let v = volume_of(b, &id, &rec, parsed.as_ref());
            (id, v)
        })
        .collect()
}

/// GetCapacity of an NFS class, answered without the backend (an instance without it
/// answers the same). The server's free space is not tracked: capacity is not enforced
/// for NFS, so no request is too large. Not 0: the chart's per-node
/// external-provisioners take an immediate-binding (NFS) claim only when
/// `request <= available` (external-provisioner v6.4.0 pkg/controller/controller.go:1736,
/// checkCapacity, called from becomeOwner), and 0 would leave every NFS claim Pending.
pub fn capacity() -> csi::GetCapacityResponse {
    csi::GetCapacityResponse {
        available_capacity: i64::MAX,
        ..Default::default()
    }
}
