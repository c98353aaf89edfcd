//! NodeStageVolume and NodeUnstageVolume of block volumes, each one pipeline: format
//! once, mount with the options GDS needs, verify.
//!
//! Format once: a block volume's device gets a filesystem only when it is provably this
//! volume's and blank (a full signature probe that succeeded and found nothing, mkfs never
//! completed for it). The one format step of staging, used by the NodeStage pipeline, the
//! fill step (`fill/`) and a clone copied at CreateVolume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::info;

use super::{fill, BlockBackend, Located};
use crate::csi::id::{BlockVolumeId, SnapshotId};
use crate::error::{Error, MountError, Result, VolumeError};
use crate::os::{mount, DeviceUse, FsType, Host, MountEntry, Signature, StripeGeometry};
use crate::pool::{describe_signatures, SourceOf, VolumeRecord};
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
    if let Some(m) = mount::at(&mounts, staging) {
        return restage(b, vol, staging, fs, m).await;
    }
    check_stageable(b, vol, fs, &mounts)?;
    b.verify_located(vol)?;
    let pinned = b.mounter.mount_dir("staging_target_path", staging, None)?;
    format_if_blank(b, vol, fs).await?;
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
    let entry = mount::at(&mounts, staging).ok_or_else(|| MountError::MissingAfterMount {
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
    if mount::at(&mounts, staging).is_none() {
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

#[derive(Debug, PartialEq, Eq)]
pub enum FormatDecision {
    /// Fresh device of this volume, probe found nothing: format it.
    Format,
    /// The volume's own filesystem (recognised by the uuid given to mkfs).
    /// `adopt`: mkfs finished but the state update did not (crash in between).
    UseExisting {
        adopt: bool,
    },
    Refuse(String),
}

/// The data-safety table. Formatting needs all of: the device is this volume's,
/// mkfs never completed for it, and a successful probe found no signature at all.
pub fn decide_format(
    record: &VolumeRecord,
    fs: FsType,
    device: &Path,
    sigs: &[Signature],
) -> FormatDecision {
    if sigs.is_empty() {
        return if record.formatted {
            FormatDecision::Refuse(format!(
                "{} was formatted for this volume but no longer carries its filesystem (uuid {}); \
                 refusing to format it again: inspect the device before doing anything else",
                device.display(),
                record.fs_uuid
            ))
        } else {
            FormatDecision::Format
        };
    }
    let ours = sigs
        .iter()
        .all(|s| s.uuid.as_deref() == Some(record.fs_uuid.as_str()) && s.kind == fs.as_str());
    if ours {
        FormatDecision::UseExisting {
            adopt: !record.formatted,
        }
    } else {
        FormatDecision::Refuse(format!(
            "{} carries {}, which is not this volume's {} filesystem (uuid {}); it will not be \
             formatted or mounted: wipe it by hand only if its contents are disposable",
            device.display(),
            describe_signatures(sigs),
            fs.as_str(),
            record.fs_uuid
        ))
    }
}

/// Formats the device when the data-safety table says so (a job a retry joins), records
/// a finished mkfs, refuses what the table refuses.
pub(crate) async fn format_if_blank(b: &BlockBackend, vol: &mut Located, fs: FsType) -> Result<()> {
    let key = format!("format:{}", vol.id);
    // An mkfs that a cancelled call started holds the device: join it before probing.
    if let Some(outcome) = b.pool.jobs.join(&key).await {
        outcome?;
    }
    let sigs = b.mounter.host.probe_signatures(&vol.device.path).await?;
    match decide_format(&vol.record, fs, &vol.device.path, &sigs) {
        FormatDecision::Refuse(why) => Err(VolumeError::FormatRefused(why).into()),
        FormatDecision::Format => {
            b.verify_located(vol)?;
            let geometry = b.layout_of(vol.id.layout).mkfs_geometry(&vol.record)?;
            let job = format_job(
                Arc::clone(&b.mounter.host),
                vol.id.to_string(),
                vol.device.path.clone(),
                vol.record.clone(),
                (fs, geometry),
            );
            b.pool.jobs.run(&key, "mkfs", job).await?;
            mark_formatted(b, vol, fs)
        }
        FormatDecision::UseExisting { adopt: true } => mark_formatted(b, vol, fs),
        FormatDecision::UseExisting { adopt: false } => Ok(()),
    }
}

/// mkfs under the device hold, after probing again under it: whatever appeared since the
/// first probe, or whoever holds the device now (a mount, an mkfs left running by an
/// earlier driver process), is refused. Runs as a job, so a cancelled call leaves it
/// running and the retry joins it.
async fn format_job(
    host: Arc<dyn Host>,
    volume_id: String,
    device: PathBuf,
    record: VolumeRecord,
    (fs, geometry): (FsType, Option<StripeGeometry>),
) -> Result<()> {
    let _hold = crate::os::hold_when_free(host.as_ref(), &device, crate::os::HOLD_PATIENCE).await?;
    let sigs = host.probe_signatures(&device).await?;
    match decide_format(&record, fs, &device, &sigs) {
        FormatDecision::Format => {}
        FormatDecision::UseExisting { .. } => return Ok(()),
        FormatDecision::Refuse(why) => return Err(VolumeError::FormatRefused(why).into()),
    }
    info!(%volume_id, device = %device.display(), fs = fs.as_str(), uuid = %record.fs_uuid, "formatting fresh device");
    host.mkfs(&device, fs, &record.fs_uuid, geometry).await?;
    faults::reached(KillPoint::AfterMkfs);
    Ok(())
}

/// Records a finished mkfs, in the state and in `vol`'s copy of its record.
fn mark_formatted(b: &BlockBackend, vol: &mut Located, fs: FsType) -> Result<()> {
    let raw = vol.id.to_string();
    b.pool.state.update(|s| {
        let rec = s
            .get_mut(&raw)
            .ok_or_else(|| Error::VolumeNotFound(raw.clone()))?;
        rec.formatted = true;
        rec.fs_type = fs;
        Ok(())
    })?;
    vol.record.formatted = true;
    vol.record.fs_type = fs;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn record(formatted: bool) -> VolumeRecord {
        VolumeRecord {
            name: "v".into(),
            device_id: "dev-1".into(),
            device_key: "path:/dev/loop1".into(),
            capacity_bytes: 1,
            fs_type: FsType::Ext4,
            parameters: BTreeMap::new(),
            fs_uuid: "uuid-1".into(),
            formatted,
            deleting: false,
            device_identity: None,
            partition: None,
            stripe: None,
            source: None,
        }
    }

    fn sig(kind: &str, uuid: Option<&str>) -> Signature {
        Signature {
            kind: kind.into(),
            uuid: uuid.map(Into::into),
            offset: None,
            seen_by: "test",
        }
    }

    #[test]
    fn format_decision_table() {
        let dev = Path::new("/dev/loop1");
        let ext4 = FsType::Ext4;
        assert_eq!(
            decide_format(&record(false), ext4, dev, &[]),
            FormatDecision::Format
        );
        assert!(matches!(
            decide_format(&record(true), ext4, dev, &[]),
            FormatDecision::Refuse(_)
        ));
        let ours = [sig("ext4", Some("uuid-1")), sig("ext4", Some("uuid-1"))];
        assert_eq!(
            decide_format(&record(true), ext4, dev, &ours),
            FormatDecision::UseExisting { adopt: false }
        );
        assert_eq!(
            decide_format(&record(false), ext4, dev, &ours),
            FormatDecision::UseExisting { adopt: true }
        );
        for foreign in [
            vec![sig("dos", Some("abcd"))],
            vec![sig("ext4", Some("other"))],
            vec![sig("ext4", Some("uuid-1")), sig("gpt", None)],
            vec![sig("xfs", Some("uuid-1"))],
            vec![sig("unknown", None)],
        ] {
            for formatted in [false, true] {
                match decide_format(&record(formatted), ext4, dev, &foreign) {
                    FormatDecision::Refuse(msg) => assert!(msg.contains("/dev/loop1"), "{msg}"),
                    other => panic!("{foreign:?} formatted={formatted}: {other:?}"),
                }
            }
        }
    }
}
