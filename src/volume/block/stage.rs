//! NodeStageVolume and NodeUnstageVolume of block volumes, each one pipeline: format
//! once (`format.rs`), mount with the options GDS needs, verify.

use std::path::Path;

use super::{fill, format, BlockBackend, Located};
use crate::csi::id::{BlockVolumeId, SnapshotId};
use crate::error::{Error, MountError, Result, VolumeError};
use crate::os::{mountinfo, DeviceUse, FsType, MountEntry};
use crate::pool::{SourceOf, VolumeRecord};
use crate::request::node::Stage;
use crate::request::{Access, Capability};
use crate::runtime::faults::{self, KillPoint};
use crate::volume::Staged;

/// NodeStageVolume of a block volume, one pipeline over the parsed request: the pool
/// ready → the layout's own preparation (a stripe's array assembled) → the clones of
/// this volume take their copy, before anything can write it again → the volume located,
/// once → the fill step (a volume with a content source is filled and verified, a
/// filesystem one formatted first: nothing can publish it half copied) → format if blank,
/// mount and verify the options GDS needs (mount access; a raw block volume is published
/// straight from its device node).
pub async fn stage(
    b: &BlockBackend,
    id: &BlockVolumeId,
    req: &Stage<Capability>,
) -> Result<Staged> {
    let cap = &req.capability;
    b.check_ready()?;
    b.layout_of(id.layout)
        .prepare_stage(b.mounter.host.as_ref(), id)
        .await?;
    fill::fill_clones_of(b, id).await?;
    let mut vol = b.locate(id)?;
    if vol.record.source.is_some() {
        fill::fill(b, &mut vol, cap).await?;
    }
    if cap.access == Access::Mount {
        mount(b, &mut vol, &req.staging, cap).await?;
    }
    Ok(Staged {
        restored_from: restored_from(&vol.record),
    })
}

/// The snapshot a volume's record says it was restored from.
fn restored_from(rec: &VolumeRecord) -> Option<SnapshotId> {
    match &rec.source.as_ref()?.of {
        SourceOf::Snapshot { id, .. } => Some(id.clone()),
        SourceOf::Volume(_) | SourceOf::Dataset(_) => None,
    }
}

/// NodeUnstageVolume of a block volume: its filesystem unmounted from the staging path
/// (the directory itself belongs to the kubelet), then the layout's own take-down (a
/// stripe's array stopped), then the gate's compat mark forgotten: it belongs to the
/// staged volume, and the next stage publishes anew.
pub async fn unstage(b: &BlockBackend, id: &BlockVolumeId, staging: &Path) -> Result<()> {
    unmount(b, id, staging).await?;
    b.layout_of(id.layout)
        .after_unstage(b.mounter.host.as_ref(), id)
        .await?;
    match &b.gate {
        Some(gate) => gate.forget(&id.to_string()),
        None => Ok(()),
    }
}

/// Format if blank, mount, verify; a mount already at the staging path is a retry.
async fn mount(
    b: &BlockBackend,
    vol: &mut Located,
    staging: &Path,
    cap: &Capability,
) -> Result<()> {
    let fs = cap.fs_type.unwrap_or(vol.record.fs_type);
    let mounts = b.mounter.mount_table()?;
    if let Some(m) = mountinfo::at(&mounts, staging) {
        return restage(b, vol, staging, fs, m).await;
    }
    check_stageable(b, vol, fs, &mounts)?;
    b.verify_located(vol)?;
    let pinned = b.mounter.mount_dir("staging_target_path", staging, None)?;
    format::format_if_blank(b, vol, fs).await?;
    b.verify_located(vol)?;
    b.mounter
        .host
        .mount(&vol.device.path, &pinned, fs, &cap.mount_flags)
        .await?;
    faults::reached(KillPoint::AfterStageMount);
    let verified = verify_staged(b, staging, fs).await;
    if verified.is_err() {
        // Never leave a mount behind on a failed call: take down what this call made
        // (the topmost mount in the pinned directory, wherever it shows in the table).
        if let Err(e) = b.mounter.host.unmount(&pinned).await {
            tracing::warn!(staging = %staging.display(), error = %e, "unmounting after a failed stage");
        }
    }
    verified
}

/// Something is mounted at the staging path already: this volume (a retry, maybe after a
/// crash right after mount), checked again for the options GDS needs and taken down
/// without them; anything else is refused.
async fn restage(
    b: &BlockBackend,
    vol: &Located,
    staging: &Path,
    fs: FsType,
    m: &MountEntry,
) -> Result<()> {
    let dev = &vol.device;
    if !(m.is_device(dev.major, dev.minor) && m.root == "/") {
        return Err(crate::volume::mounts::staging_taken(staging, m));
    }
    let verified = verify_staged(b, staging, fs).await;
    if verified.is_err() {
        let ours = |m: &MountEntry, _: Option<&nix::sys::stat::FileStat>| {
            m.is_device(dev.major, dev.minor)
        };
        b.mounter
            .unmount_ours("staging_target_path", staging, &vol.id.to_string(), &ours)
            .await?;
    }
    verified
}

/// The device is not in use anywhere else and holds (or will hold) the asked filesystem.
fn check_stageable(
    b: &BlockBackend,
    vol: &Located,
    fs: FsType,
    mounts: &[MountEntry],
) -> Result<()> {
    if let Some(u) = b.pool.uses(&vol.device, mounts).first() {
        let why = match u {
            DeviceUse::Mounted(at) => format!("is already staged at {}", at.display()),
            other => format!("is in use: {other}"),
        };
        return Err(VolumeError::DeviceInUse {
            volume: vol.id.to_string(),
            why,
        }
        .into());
    }
    if !vol.record.formatted && fs != vol.record.fs_type {
        // A blank volume's filesystem is its class's promise, as CreateVolume checked.
        return Err(Error::invalid(
            "volume_capability.mount.fs_type",
            format!(
                "volume {} was created as an {} volume (its class's fsType) and is not \
                 formatted yet; stage it with fs_type {} or none, not {}",
                vol.id,
                vol.record.fs_type.as_str(),
                vol.record.fs_type.as_str(),
                fs.as_str()
            ),
        ));
    }
    if vol.record.formatted && fs != vol.record.fs_type {
        return Err(VolumeError::FsMismatch {
            volume: vol.id.to_string(),
            holds: vol.record.fs_type.as_str(),
            asked: fs.as_str(),
        }
        .into());
    }
    Ok(())
}

/// The kernel must show what GDS needs; a mount that lost it is taken down again.
async fn verify_staged(b: &BlockBackend, staging: &Path, fs: FsType) -> Result<()> {
    let mounts = b.mounter.host.mount_table()?;
    let entry = mountinfo::at(&mounts, staging).ok_or_else(|| MountError::MissingAfterMount {
        path: staging.to_owned(),
        from: String::new(),
    })?;
    let ok = match fs {
        FsType::Ext4 => entry.super_options.get("data") == Some(&Some("ordered".to_owned())),
        FsType::Xfs => entry.fs_type == "xfs",
    };
    if ok {
        return Ok(());
    }
    Err(VolumeError::WithoutGdsOptions {
        path: staging.to_owned(),
        options: format!("{:?}", entry.super_options),
    }
    .into())
}

async fn unmount(b: &BlockBackend, id: &BlockVolumeId, staging: &Path) -> Result<()> {
    let mounts = b.mounter.mount_table()?;
    if mountinfo::at(&mounts, staging).is_none() {
        return Ok(());
    }
    // Only ever unmount this volume's own filesystem.
    let dev = &b.mounted_device(id)?;
    let ours =
        |m: &MountEntry, _: Option<&nix::sys::stat::FileStat>| m.is_device(dev.major, dev.minor);
    b.mounter
        .unmount_ours("staging_target_path", staging, &id.to_string(), &ours)
        .await
        .map(drop)
}
