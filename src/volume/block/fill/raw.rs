//! A raw block clone filled at its NodeStage: its source device's bytes, or a raw block
//! snapshot's image, copied onto its own device.

use std::future::Future;
use std::os::fd::AsFd;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use super::volume::refuse_in_use;
use super::{copy_dir, count_outcome, on_blocking_pool, verify_of};
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::error::{CloneError, Error, Result, SnapshotError};
use crate::os::{Anchored, Host};
use crate::request::snapshot::SnapshotId;
use crate::volume::block::fill::mount::SourceMount;
use crate::volume::block::fill::source::{ImageAt, Source};
use crate::volume::block::{BlockBackend, Located};
use crate::volume::copy::raw::{DeviceAt, RawCopyRequest};
use crate::volume::copy::Progress;
use crate::volume::mounts::private::{clean_copy_dir, pin, unmount_retrying};

/// The job that fills raw block clone `vol` from `source`: both devices in use nowhere
/// and verified as the volumes' own now, then copied by device number.
pub(super) fn raw_fill(
    b: &BlockBackend,
    vol: &mut Located,
    source: &Source,
    progress: &Arc<Progress>,
) -> Result<Pin<Box<dyn Future<Output = Result<()>> + Send + 'static>>> {
    if let Source::Image { at, label } = source {
        return image_fill(b, vol, at, label, progress).map(|f| Box::pin(f) as _);
    }
    let src_id = raw_source_id(source, vol)?;
    let mut src = b.locate(&src_id)?;
    let mounts = b.mounter.mount_table()?;
    for (what, v) in [("clone", &*vol), ("source", &src)] {
        refuse_in_use(b, v, None, &mounts, what).inspect_err(crate::metrics::clone::failed)?;
    }
    if src.record.capacity_bytes > vol.record.capacity_bytes {
        return Err(CloneError::SourceGrew {
            origin: src.id.to_string(),
            bytes: src.record.capacity_bytes,
            volume: vol.id.to_string(),
            volume_bytes: vol.record.capacity_bytes,
        }
        .into());
    }
    b.verify_located(&mut src)?;
    b.verify_located(vol)?;
    let req = RawCopyRequest {
        source: device_at(&src),
        target: device_at(vol),
        bytes: src.record.capacity_bytes,
        // A partition (and a stripe over partitions) is zeroed when carved; a whole
        // device is zeroed only when a volume on it is deleted, so a device never used
        // by a volume before may hold anything.
        zero_tail: vol.id.layout == IdLayout::Device,
        label: source.label().to_owned(),
        streams: crate::volume::copy::STREAMS,
        chunk: crate::volume::copy::CHUNK,
        verify: verify_of(&vol.record),
    };
    let (progress, volume) = (Arc::clone(progress), vol.id.to_string());
    Ok(Box::pin(copy_source_device(req, progress, volume)))
}

/// The block volume a raw block clone `vol` copies; any other source is refused.
fn raw_source_id(source: &Source, vol: &Located) -> Result<BlockVolumeId> {
    match source {
        Source::Block { id, .. } => Ok(id.clone()),
        // CreateVolume refuses it: a raw copy needs a device.
        Source::Nfs { label, .. }
        | Source::Snapshot { label, .. }
        | Source::Empty { label }
        | Source::Image { label, .. } => Err(CloneError::RawCloneOfNfs {
            volume: vol.id.to_string(),
            label: label.clone(),
        }
        .into()),
    }
}

/// The volume's device as a raw copy opens it.
fn device_at(v: &Located) -> DeviceAt {
    DeviceAt {
        path: v.device.path.clone(),
        major: v.device.major,
        minor: v.device.minor,
        image: false,
    }
}

/// The job of `raw_fill`: the source device copied onto the clone's.
async fn copy_source_device(
    req: RawCopyRequest,
    progress: Arc<Progress>,
    volume: String,
) -> Result<()> {
    tracing::info!(volume_id = %volume, source = %req.label, bytes = req.bytes,
        from = %req.source.path.display(), to = %req.target.path.display(),
        "copying the source device onto the raw block clone");
    let p = Arc::clone(&progress);
    let outcome = on_blocking_pool(move || crate::volume::copy::raw::copy_device(&req, &p)).await;
    count_outcome(&volume, &progress, &outcome);
    outcome
}

/// The job that fills raw block volume `vol` from a raw block snapshot's image: the
/// volume in use nowhere and verified as its own device, the image (on an NFS store, in
/// the snapshot's directory mounted read-only in the volume's private directory) copied
/// onto it as a raw clone's source device is, then the mount taken down.
fn image_fill(
    b: &BlockBackend,
    vol: &mut Located,
    at: &ImageAt,
    label: &str,
    progress: &Arc<Progress>,
) -> Result<impl Future<Output = Result<()>> + Send + 'static> {
    let mounts = b.mounter.mount_table()?;
    refuse_in_use(b, vol, None, &mounts, "restored")?;
    b.verify_located(vol)?;
    let target = device_at(vol);
    let zero_tail = vol.id.layout == IdLayout::Device;
    let verify = verify_of(&vol.record);
    let (host, dir) = (
        Arc::clone(&b.mounter.host),
        copy_dir(b, &vol.id.to_string()),
    );
    let (at, label, progress) = (at.clone(), label.to_owned(), Arc::clone(progress));
    let volume = vol.id.to_string();
    Ok(async move {
        let (opened, mounted) = open_image_at(host.as_ref(), &dir, &at, &label).await?;
        let (image, bytes) = (
            crate::os::safepath::fd_path(opened.as_fd()),
            opened
                .metadata()
                .map_err(|e| Error::io("stat", &label, e))?
                .len(),
        );
        let req = RawCopyRequest {
            source: DeviceAt::image(image),
            target,
            bytes,
            zero_tail,
            label,
            streams: crate::volume::copy::STREAMS,
            chunk: crate::volume::copy::CHUNK,
            verify,
        };
        tracing::info!(volume_id = %volume, source = %req.label, bytes,
            "copying a raw block snapshot's image onto the volume");
        let p = Arc::clone(&progress);
        let copied = on_blocking_pool(move || {
            // The image is read through its descriptor's path while it is open.
            let copied = crate::volume::copy::raw::copy_device(&req, &p);
            drop(opened);
            copied
        })
        .await;
        let copied = match &mounted {
            Some((_, from)) => copied.map_err(|e| from.explain(e, &progress)),
            None => copied,
        };
        if let Some((m, _)) = mounted {
            unmount_retrying(host.as_ref(), &m.without_final()).await?;
        }
        count_outcome(&volume, &progress, &copied);
        copied
    })
}

/// A raw block snapshot's image opened where `at` says, with the mount it took: on an
/// NFS store, the snapshot's directory mounted read-only at `<dir>/source` (taken down
/// again when the image cannot be opened).
async fn open_image_at(
    host: &dyn Host,
    dir: &Path,
    at: &ImageAt,
    label: &str,
) -> Result<(std::fs::File, Option<(Anchored, SourceMount)>)> {
    let (opened, mounted) = match at {
        ImageAt::Local(id) => (open_image(id, None), None),
        ImageAt::Nfs {
            snapshot,
            dir: nfs_dir,
        } => {
            clean_copy_dir(host, dir).await?;
            let m = pin(dir, "source")?;
            let from = SourceMount::Nfs {
                id: nfs_dir.clone(),
                label: label.to_owned(),
            };
            from.mount(host, &m).await?;
            // Checked on what was mounted: the server resolved the path itself.
            let opened = open_image(snapshot, Some(m.path()));
            (opened, Some((m, from)))
        }
    };
    match opened {
        Ok(o) => Ok((o, mounted)),
        Err(e) => {
            if let Some((m, _)) = mounted {
                unmount_retrying(host, &m.without_final()).await?;
            }
            Err(e)
        }
    }
}

/// A raw block snapshot's image, opened without following a symlink in the directory
/// proven to be snapshot `id`'s (on a directory store, or an NFS store's snapshot
/// directory mounted at `mounted`): a regular file, never a link to one elsewhere.
fn open_image(id: &SnapshotId, mounted: Option<&Path>) -> Result<std::fs::File> {
    let dir = match mounted {
        None => super::snapshot::local_snapshot(id)?,
        Some(at) => {
            crate::volume::snapshot_store::open_ready(at, "", &id.to_string(), &id.location())?
        }
    };
    dir.open_file(crate::request::snapshot::IMAGE)?
        .ok_or_else(|| {
            SnapshotError::NoImage {
                id: id.to_string(),
                path: id.location(),
            }
            .into()
        })
}
