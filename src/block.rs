//! Node-side operations of block volumes: stage (format once, mount), publish (bind),
//! unpublish, unstage and stats. Each decides from the mount table and the device's
//! signatures, so every call is safe to repeat and survives a plugin restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::info;

use crate::error::{Error, Result};
use crate::faults::{self, KillPoint};
use crate::os::{mountinfo, FsType, Host, MountEntry, Signature};
use crate::pool::{describe_signatures, PoolDevice, VolumeRecord};
use crate::request::{Access, Capability};
use crate::service::Driver;
use crate::volume_id::BlockVolumeId;

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

/// The volume's record and where its device is now.
pub struct Located {
    pub id: BlockVolumeId,
    pub record: VolumeRecord,
    pub device: PoolDevice,
}

pub fn locate(driver: &Driver, id: &BlockVolumeId) -> Result<Located> {
    let raw = id.to_string();
    if id.node_id != driver.node_id {
        return Err(Error::NotFound(format!(
            "volume {raw} lives on node {}, not on this node ({})",
            id.node_id, driver.node_id
        )));
    }
    let record = driver
        .pool
        .state
        .snapshot()
        .volumes
        .get(&raw)
        .cloned()
        .ok_or_else(|| Error::VolumeNotFound(raw.clone()))?;
    let device = match driver.pool.device(&record.device_id) {
        Some(d) => d,
        None => {
            // Hot-plugged or renamed since the last scan: look again once.
            driver.pool.rescan(&driver.host.mount_table()?);
            driver.pool.device(&record.device_id).ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "the device of volume {raw} ({}) is not present on this node; reattach it",
                    record.device_key
                ))
            })?
        }
    };
    Ok(Located {
        id: id.clone(),
        record,
        device,
    })
}

fn ensure_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io("creating", path, e))
}

pub async fn stage(driver: &Driver, vol: &Located, staging: &Path, cap: &Capability) -> Result<()> {
    let dev = &vol.device;
    if cap.access == Access::Block {
        // Raw block volumes are published straight from the device node.
        return Ok(());
    }
    let fs = cap.fs_type.unwrap_or(vol.record.fs_type);
    let mounts = driver.host.mount_table()?;
    if let Some(m) = mountinfo::at(&mounts, staging) {
        if m.is_device(dev.major, dev.minor) && m.root == "/" {
            // Already staged (a retry, maybe after a crash right after mount): the options
            // GDS needs are checked again, not assumed.
            return verify_staged(driver, staging, fs).await;
        }
        return Err(Error::FailedPrecondition(format!(
            "staging path {} already has another filesystem mounted ({} {}); unmount it first",
            staging.display(),
            m.fs_type,
            m.source.as_deref().unwrap_or("?")
        )));
    }
    if let Some(m) = mounts
        .iter()
        .find(|m| m.is_device(dev.major, dev.minor) && m.root == "/")
    {
        return Err(Error::FailedPrecondition(format!(
            "volume {} is already staged at {}; unstage it there first",
            vol.id,
            m.mount_point.display()
        )));
    }
    if vol.record.formatted && fs != vol.record.fs_type {
        return Err(Error::FailedPrecondition(format!(
            "volume {} holds an {} filesystem; fs_type {} was requested",
            vol.id,
            vol.record.fs_type.as_str(),
            fs.as_str()
        )));
    }
    ensure_dir(staging)?;
    let key = format!("format:{}", vol.id);
    // An mkfs that a cancelled call started holds the device: join it before probing.
    if let Some(outcome) = driver.pool.jobs.join(&key).await {
        outcome?;
    }
    let sigs = driver.host.probe_signatures(&dev.path).await?;
    match decide_format(&vol.record, fs, &dev.path, &sigs) {
        FormatDecision::Refuse(why) => return Err(Error::FailedPrecondition(why)),
        FormatDecision::Format => {
            let job = format_job(
                Arc::clone(&driver.host),
                dev.path.clone(),
                vol.record.clone(),
                fs,
            );
            driver.pool.jobs.run(&key, "mkfs", job).await?;
            mark_formatted(driver, &vol.id, fs)?;
        }
        FormatDecision::UseExisting { adopt: true } => mark_formatted(driver, &vol.id, fs)?,
        FormatDecision::UseExisting { adopt: false } => {}
    }
    driver
        .host
        .mount(&dev.path, staging, fs, &cap.mount_flags)
        .await?;
    faults::reached(KillPoint::AfterStageMount);
    verify_staged(driver, staging, fs).await
}

/// mkfs under the device hold, after probing again under it: whatever appeared since the
/// first probe, or whoever holds the device now (a mount, an mkfs left running by an
/// earlier driver process), is refused. Runs as a job, so a cancelled call leaves it
/// running and the retry joins it.
async fn format_job(
    host: Arc<dyn Host>,
    device: PathBuf,
    record: VolumeRecord,
    fs: FsType,
) -> Result<()> {
    let _hold = crate::os::hold_when_free(host.as_ref(), &device, crate::os::HOLD_PATIENCE).await?;
    let sigs = host.probe_signatures(&device).await?;
    match decide_format(&record, fs, &device, &sigs) {
        FormatDecision::Format => {}
        FormatDecision::UseExisting { .. } => return Ok(()),
        FormatDecision::Refuse(why) => return Err(Error::FailedPrecondition(why)),
    }
    info!(device = %device.display(), fs = fs.as_str(), uuid = %record.fs_uuid, "formatting fresh device");
    host.mkfs(&device, fs, &record.fs_uuid).await?;
    faults::reached(KillPoint::AfterMkfs);
    Ok(())
}

fn mark_formatted(driver: &Driver, id: &BlockVolumeId, fs: FsType) -> Result<()> {
    driver.pool.state.update(|s| {
        let rec = s
            .volumes
            .get_mut(&id.to_string())
            .ok_or_else(|| Error::VolumeNotFound(id.to_string()))?;
        rec.formatted = true;
        rec.fs_type = fs;
        Ok(())
    })
}

/// The kernel must show what GDS needs; a mount that lost it is taken down again.
async fn verify_staged(driver: &Driver, staging: &Path, fs: FsType) -> Result<()> {
    let mounts = driver.host.mount_table()?;
    let entry = mountinfo::at(&mounts, staging).ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "{} is not mounted after mount succeeded",
            staging.display()
        ))
    })?;
    let ok = match fs {
        FsType::Ext4 => entry.super_options.get("data") == Some(&Some("ordered".to_owned())),
        FsType::Xfs => entry.fs_type == "xfs",
    };
    if ok {
        return Ok(());
    }
    driver.host.unmount(staging).await?;
    Err(Error::FailedPrecondition(format!(
        "{} was mounted without the options GDS needs ({:?}); check the kernel's ext4 support",
        staging.display(),
        entry.super_options
    )))
}

pub async fn unstage(driver: &Driver, staging: &Path) -> Result<()> {
    // Stacked mounts (a retried mount that half-succeeded) are all taken down.
    for _ in 0..8 {
        let mounts = driver.host.mount_table()?;
        if mountinfo::at(&mounts, staging).is_none() {
            return Ok(());
        }
        driver.host.unmount(staging).await?;
    }
    Err(Error::FailedPrecondition(format!(
        "{} is still mounted after repeated unmounts",
        staging.display()
    )))
}

pub async fn publish(
    driver: &Driver,
    vol: &Located,
    staging: &Path,
    target: &Path,
    readonly: bool,
    cap: &Capability,
) -> Result<()> {
    let dev = &vol.device;
    let mounts = driver.host.mount_table()?;
    if already_published(&mounts, target, readonly, |m| {
        m.is_device(dev.major, dev.minor)
    })? {
        return Ok(());
    }
    if cap.single_writer {
        if let Some(other) = published_targets(&mounts, dev, staging).next() {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is SINGLE_NODE_SINGLE_WRITER and already published at {}",
                vol.id,
                other.display()
            )));
        }
    }
    let mut options = cap.mount_flags.clone();
    if readonly {
        options.push("ro".into());
    }
    match cap.access {
        Access::Mount => {
            let staged =
                mountinfo::at(&mounts, staging).filter(|m| m.is_device(dev.major, dev.minor));
            if staged.is_none() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {} is not staged at {}; call NodeStageVolume first",
                    vol.id,
                    staging.display()
                )));
            }
            ensure_dir(target)?;
            driver.host.bind_mount(staging, target, &options).await?;
            faults::reached(KillPoint::AfterBindMount);
            Ok(())
        }
        Access::Block => {
            if let Some(parent) = target.parent() {
                ensure_dir(parent)?;
            }
            if !target.exists() {
                std::fs::File::create(target).map_err(|e| Error::io("creating", target, e))?;
            }
            driver.host.bind_mount(&dev.path, target, &options).await
        }
    }
}

/// Publish idempotency from the mount table, for every backend: `true` when `target`
/// already carries this volume (`is_ours`) with the same read-only flag, `false` when
/// nothing is mounted there, `AlreadyExists` when something else or another flag is.
pub fn already_published(
    mounts: &[MountEntry],
    target: &Path,
    readonly: bool,
    is_ours: impl Fn(&MountEntry) -> bool,
) -> Result<bool> {
    let Some(m) = mountinfo::at(mounts, target) else {
        return Ok(false);
    };
    if !is_ours(m) {
        return Err(Error::AlreadyExists(format!(
            "target path {} already has another mount ({})",
            target.display(),
            m.fs_type
        )));
    }
    if m.read_only() != readonly {
        return Err(Error::AlreadyExists(format!(
            "{} is already published with readonly={}; unpublish it before changing readonly",
            target.display(),
            m.read_only()
        )));
    }
    Ok(true)
}

fn published_targets<'a>(
    mounts: &'a [MountEntry],
    dev: &'a PoolDevice,
    staging: &'a Path,
) -> impl Iterator<Item = PathBuf> + 'a {
    mounts
        .iter()
        .filter(move |m| m.is_device(dev.major, dev.minor) && m.mount_point != staging)
        .map(|m| m.mount_point.clone())
}

pub async fn unpublish(driver: &Driver, target: &Path) -> Result<()> {
    unstage(driver, target).await?;
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir(target),
        Ok(_) => std::fs::remove_file(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
    .map_err(|e| Error::io("removing", target, e))
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
