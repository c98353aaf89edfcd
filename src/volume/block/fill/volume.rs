//! A fill from another block volume of this node: CreateVolume's checks of the source
//! (here, not being deleted or filled itself, of the clone's access type, not in use
//! unless a filesystem copied from its mount: `volume_in_use.rs`), and the source's device
//! mounted read-only by the copy.

use super::mount::SourceMount;
use super::{done, is_raw_clone};
use crate::csi::id::BlockVolumeId;
use crate::error::{CloneError, CopyError, Error, Result};
use crate::os::MountEntry;
use crate::request::Access;
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
    if super::source::of_record(&rec)?.is_some() && !done(b, source)? {
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

/// A block source: mounted nowhere but in `dir`, and still its own device. None when it
/// was never formatted (nothing to copy).
pub(super) fn block_source(
    b: &BlockBackend,
    src_id: &BlockVolumeId,
    dir: &std::path::Path,
    mounts: &[MountEntry],
) -> Result<Option<SourceMount>> {
    let mut src = b.locate(src_id)?;
    if !src.record.formatted {
        return Ok(None);
    }
    refuse_in_use(b, &src, Some(dir), mounts, "source")
        .inspect_err(crate::metrics::clone::failed)?;
    b.verify_located(&mut src)?;
    Ok(Some(SourceMount::Device {
        dev: src.device.path.clone(),
        fs: src.record.fs_type,
    }))
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
