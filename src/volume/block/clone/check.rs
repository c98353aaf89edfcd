//! CreateVolume of a clone: its source checked and its kind told before anything is
//! allocated; DeleteVolume of a source refused while a clone of it is not filled.

use super::{done, is_raw_clone};
use crate::csi::id::BlockVolumeId;
use crate::error::{CloneError, CopyError, Error, Result};
use crate::os::MountEntry;
use crate::pool::{RecordedSource, SourceOf};
use crate::request::{self, Access};
use crate::volume::block::clone_source::{self, Source};
use crate::volume::block::{BlockBackend, Located};

const SOURCE_FIELD: &str = "volume_content_source.volume.volume_id";

/// CreateVolume with `volume_content_source.volume` naming a block volume: the source
/// must be a block volume of this node, not being deleted or filled itself, fit `limit`
/// (0: none), and when the clone is `new` (a repeated CreateVolume answers what it made)
/// be of the clone's `access` and not in use. Returns its capacity, the clone's smallest
/// size.
pub fn check_source(
    b: &BlockBackend,
    (id, source): (&BlockVolumeId, &str),
    limit: u64,
    new: bool,
    access: Access,
) -> Result<u64> {
    check_local(b, id)?;
    let rec = filled_source_record(b, source)?;
    if limit != 0 && limit < rec.capacity_bytes {
        return Err(CloneError::LimitBelowSource {
            origin: source.to_owned(),
            bytes: rec.capacity_bytes,
            limit,
        }
        .into());
    }
    if new {
        same_access(source, &rec, access)?;
    }
    // A filesystem source in use is copied at CreateVolume from its own mount, frozen
    // (`fill_from_mounted_source`); a raw one has no filesystem to freeze.
    if let Some(at) = in_use(b, id).filter(|_| new && (access == Access::Block || !rec.formatted)) {
        let e = CloneError::RawSourceInUse {
            field: SOURCE_FIELD,
            origin: source.to_owned(),
            at,
        }
        .into();
        crate::metrics::clone::failed(&e);
        return Err(e);
    }
    Ok(rec.capacity_bytes)
}

fn source_missing(source: &str) -> CloneError {
    CloneError::SourceMissing {
        field: SOURCE_FIELD,
        origin: source.to_owned(),
    }
}

/// Block volume `id` must be one of this node.
fn check_local(b: &BlockBackend, id: &BlockVolumeId) -> Result<()> {
    if id.node_id != b.node.node_id {
        return Err(CloneError::SourceOnOtherNode {
            field: SOURCE_FIELD,
            node: id.node_id.clone(),
            this: b.node.node_id.clone(),
        }
        .into());
    }
    Ok(())
}

/// The record of volume `source`, which must not be being deleted, nor be a clone whose
/// own copy has not finished.
fn filled_source_record(b: &BlockBackend, source: &str) -> Result<crate::pool::VolumeRecord> {
    let rec = b
        .pool
        .state
        .snapshot()
        .get(source)
        .cloned()
        .ok_or_else(|| source_missing(source))?;
    if rec.deleting {
        return Err(CloneError::SourceDeleting {
            field: SOURCE_FIELD,
            origin: source.to_owned(),
        }
        .into());
    }
    if clone_source::of_record(&rec)?.is_some() && !done(b, source)? {
        return Err(CloneError::SourceNotFilled {
            field: SOURCE_FIELD,
            origin: source.to_owned(),
        }
        .into());
    }
    Ok(rec)
}

/// A raw block clone is made of a raw block source and a filesystem clone of a
/// filesystem source, as Kubernetes asks (a claim is cloned only from a claim of its
/// volumeMode). A source that holds a filesystem of ours, or is a raw block clone, shows
/// its kind; one never staged with a filesystem may be either and is copied as asked.
fn same_access(source: &str, rec: &crate::pool::VolumeRecord, access: Access) -> Result<()> {
    match access {
        Access::Block if rec.formatted => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the source volume {source} holds an {} filesystem (it is used with mount \
                 access): a raw block clone copies a raw block volume; ask for mount access, \
                 as the source's (Kubernetes: volumeMode: Filesystem)",
                rec.fs_type.as_str()
            ),
        )),
        Access::Mount if is_raw_clone(rec) => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the source volume {source} is a raw block clone (used with block access): \
                 its clone is one too; ask for block access, as the source's (Kubernetes: \
                 volumeMode: Block)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Where the volume's device is staged or held now; None when nothing uses it (or its
/// device cannot be found, so nothing can).
pub(crate) fn in_use(b: &BlockBackend, id: &BlockVolumeId) -> Option<String> {
    let dev = b.mounted_device(id).ok()?;
    let mounts = b.mounter.mount_table().ok()?;
    let uses = b.pool.uses(&dev, &mounts);
    (!uses.is_empty()).then(|| {
        uses.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Block clones of `source` recorded but not filled yet.
pub fn unfilled_clones_of(b: &BlockBackend, source: &str) -> Result<Vec<BlockVolumeId>> {
    let state = b.pool.state.snapshot();
    let mut out = Vec::new();
    for (id, rec) in state.entries() {
        let names = rec.source.as_ref().is_some_and(|s| s.id() == source);
        if names && !rec.deleting && !done(b, &id.to_string())? {
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// DeleteVolume of a clone's source: refused while a clone of it is not filled (its copy
/// is made from the source at the clone's first NodeStage).
pub fn refuse_unfilled_clones(b: &BlockBackend, source: &str) -> Result<()> {
    let clones = unfilled_clones_of(b, source)?;
    if clones.is_empty() {
        return Ok(());
    }
    Err(CloneError::UnfilledClones {
        origin: source.to_owned(),
        clones: clones
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
    .into())
}

/// CreateVolume of a clone: the smallest size its source needs, checked against the
/// limit before anything is allocated, and the source to record with the volume (none
/// for a class's dataset, which is in the class's own parameters).
pub async fn check_clone(
    b: &BlockBackend,
    req: &request::CreateVolume<'_>,
    nfs: Option<&crate::volume::nfs::NfsBackend>,
) -> Result<Option<(u64, Option<RecordedSource>)>> {
    let Some(source) = clone_source::requested(req)? else {
        return Ok(None);
    };
    let access = clone_access(req, &source)?;
    let mut recorded = None;
    let size = match (&source, &req.restore) {
        // A snapshot's manifest says how large a volume it needs.
        (_, Some(restore)) => {
            if req.limit_bytes != 0 && req.limit_bytes < restore.size_bytes {
                return Err(CloneError::LimitBelowSource {
                    origin: restore.text.clone(),
                    bytes: restore.size_bytes,
                    limit: req.limit_bytes,
                }
                .into());
            }
            recorded = Some(SourceOf::Snapshot {
                id: restore.id.clone(),
                content: restore.content,
            });
            restore.size_bytes
        }
        (Source::Block { id, label }, None) => {
            let new = b.pool.state.snapshot().by_name(&req.name).is_none();
            check_source(b, (id, label), req.limit_bytes, new, access)?
        }
        (Source::Nfs { id, label }, None) => {
            clone_source::check_nfs(nfs, id, label, req.limit_bytes).await?
        }
        (Source::Snapshot { .. } | Source::Empty { .. } | Source::Image { .. }, None) => {
            unreachable!("only a snapshot restores from a directory, an image or nothing")
        }
    };
    if let Some((_, id)) = req.source.as_ref().and_then(request::ContentSource::volume) {
        recorded = Some(SourceOf::Volume(id.clone()));
    }
    let recorded = recorded.map(|of| RecordedSource {
        of,
        raw_block: access == Access::Block,
    });
    Ok(Some((size, recorded)))
}

/// The clone's kind, from its capabilities, before anything is allocated: one access
/// type, and block access only from a block volume (an NFS directory is copied file by
/// file into a filesystem).
pub fn clone_access(req: &request::CreateVolume<'_>, source: &Source) -> Result<Access> {
    let caps = request::capabilities(req.capabilities)?;
    let block = caps.iter().any(|c| c.access == Access::Block);
    if block && caps.iter().any(|c| c.access == Access::Mount) {
        return Err(Error::invalid(
            "volume_capabilities",
            "a clone is either a raw block copy of its source (block access) or a copy of \
             its files (mount access): ask for one access type",
        ));
    }
    match source {
        Source::Image { label, .. } if !block => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "snapshot {label} holds a raw block volume's bytes: restore it with block \
                 access (Kubernetes: volumeMode: Block)"
            ),
        )),
        Source::Nfs { label, .. } | Source::Snapshot { label, .. } if block => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the clone's source {label} is an NFS directory, copied file by file into a \
                 filesystem; a raw block clone copies a block volume of this node: ask for \
                 mount access (Kubernetes: volumeMode: Filesystem)"
            ),
        )),
        _ if block => Ok(Access::Block),
        _ => Ok(Access::Mount),
    }
}

/// The volume's device is mounted nowhere but (after a killed driver) in the copy's
/// private `dir`, if it has one.
pub(super) fn refuse_in_use(
    b: &BlockBackend,
    vol: &Located,
    dir: Option<&std::path::Path>,
    mounts: &[MountEntry],
    what: &str,
) -> Result<()> {
    let uses = b.pool.uses(&vol.device, mounts);
    let private = |at: &std::path::Path| dir.is_some_and(|d| at.starts_with(d));
    let elsewhere: Vec<String> = uses
        .iter()
        .filter(|u| !matches!(u, crate::os::DeviceUse::Mounted(at) if private(at)))
        .map(|u| u.to_string())
        .collect();
    if elsewhere.is_empty() {
        return Ok(());
    }
    Err(CopyError::InUse {
        what: format!("the {what} volume {}", vol.id),
        uses: elsewhere.join(", "),
        fix: "a clone is copied only from and into volumes nothing has staged, so the copy \
              is consistent: stop what uses it; the kubelet's retry then copies",
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType};
    use crate::csi::volume_content_source::{Type, VolumeSource};

    fn capability(block: bool) -> crate::csi::VolumeCapability {
        crate::csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(if block {
                AccessType::Block(Default::default())
            } else {
                AccessType::Mount(Default::default())
            }),
        }
    }

    fn clone_of(source: &str, caps: &[bool]) -> crate::csi::CreateVolumeRequest {
        crate::csi::CreateVolumeRequest {
            name: "clone".into(),
            volume_capabilities: caps.iter().map(|&b| capability(b)).collect(),
            volume_content_source: Some(crate::csi::VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: source.into(),
                })),
            }),
            ..Default::default()
        }
    }

    fn access(source: &str, caps: &[bool]) -> Result<Access> {
        let req = clone_of(source, caps);
        let req = request::create_volume(&req)?;
        let source = clone_source::requested(&req)?.expect("a clone");
        clone_access(&req, &source)
    }

    #[test]
    fn a_clone_is_one_kind_and_raw_only_of_a_block_volume() {
        let block = "blk:dev-0123456789abcdef:0badf00d:node-a";
        assert_eq!(access(block, &[true]).unwrap(), Access::Block);
        assert_eq!(access(block, &[false]).unwrap(), Access::Mount);
        let both = tonic::Status::from(access(block, &[true, false]).unwrap_err());
        assert_eq!(both.code(), tonic::Code::InvalidArgument);
        assert!(
            both.message()
                .starts_with("volume_capabilities: a clone is either a raw block copy"),
            "{}",
            both.message()
        );
        let nfs = "nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1";
        assert_eq!(access(nfs, &[false]).unwrap(), Access::Mount);
        let raw_of_nfs = tonic::Status::from(access(nfs, &[true]).unwrap_err());
        assert_eq!(raw_of_nfs.code(), tonic::Code::InvalidArgument);
        assert!(
            raw_of_nfs.message().starts_with(
                "volume_capabilities: the clone's source nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1 is an NFS directory"
            ) && raw_of_nfs.message().contains("ask for mount access"),
            "{}",
            raw_of_nfs.message()
        );
    }
}
