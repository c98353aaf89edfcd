//! Node-side operations of block volumes: stage (format once, mount), publish (bind),
//! unpublish, unstage and stats. Each decides from the mount table and the device's
//! signatures, so every call is safe to repeat and survives a plugin restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::info;

use crate::error::{Error, Result};
use crate::faults::{self, KillPoint};
use crate::os::safepath::{self, Anchored, Create};
use crate::os::{blockdev, mountinfo, DeviceUse, FsType, Host, MountEntry, Signature};
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
    // Hot-plugged, renamed, re-attached or re-pointed since the last scan: look again.
    let mounts = driver.host.mount_table()?;
    let device = driver
        .pool
        .fresh_device(&record.device_id, &mounts)
        .ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "the device of volume {raw} ({}) is not present on this node; reattach it",
                record.device_key
            ))
        })?;
    Ok(Located {
        id: id.clone(),
        record,
        device,
    })
}

/// A staging or target directory, pinned beneath its allowed root (created with its
/// parents when missing, `mark`ed when publish creates it). It must be a directory, and
/// an empty one unless something is mounted there already: a mount would hide what it
/// holds.
pub fn mount_dir(
    driver: &Driver,
    field: &'static str,
    path: &Path,
    mark: Option<&str>,
) -> Result<Anchored> {
    let dir = safepath::open(field, &driver.allowed_roots, path, Create::Dir, mark)?
        .ok_or_else(|| Error::invalid(field, format!("{} could not be created", path.display())))?;
    let st = dir
        .stat_now()?
        .ok_or_else(|| Error::invalid(field, format!("{} disappeared", path.display())))?;
    if safepath::kind(&st) != nix::sys::stat::SFlag::S_IFDIR {
        return Err(Error::invalid(
            field,
            format!("{} exists and is not a directory", path.display()),
        ));
    }
    let mounted = mountinfo::at(&driver.host.mount_table()?, path).is_some();
    if !mounted && !safepath::dir_is_empty(&dir)? {
        return Err(Error::FailedPrecondition(format!(
            "{field} {} is not empty; a volume is mounted only onto an empty directory, \
             which would otherwise hide what it holds",
            path.display()
        )));
    }
    Ok(dir)
}

/// Whether a mount entry (and what the mount point holds now) is this device: its own
/// filesystem, or the device node itself bind-mounted there (raw block).
pub fn is_this_device(
    m: &MountEntry,
    st: Option<&nix::sys::stat::FileStat>,
    dev: &PoolDevice,
) -> bool {
    m.is_device(dev.major, dev.minor)
        || st.is_some_and(|st| {
            safepath::kind(st) == nix::sys::stat::SFlag::S_IFBLK
                && st.st_rdev == nix::sys::stat::makedev(dev.major.into(), dev.minor.into())
        })
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
            // GDS needs are checked again, not assumed; a mount without them is taken down.
            let verified = verify_staged(driver, staging, fs).await;
            if verified.is_err() {
                let id = vol.id.to_string();
                let ours = |m: &MountEntry, _: Option<&nix::sys::stat::FileStat>| {
                    m.is_device(dev.major, dev.minor)
                };
                unmount_ours(driver, "staging_target_path", staging, &id, ours).await?;
            }
            return verified;
        }
        return Err(Error::FailedPrecondition(format!(
            "staging path {} already has another filesystem mounted ({} {}); unmount it first",
            staging.display(),
            m.fs_type,
            m.source.as_deref().unwrap_or("?")
        )));
    }
    if let Some(u) = driver.pool.uses(dev, &mounts).first() {
        let why = match u {
            DeviceUse::Mounted(at) => format!("is already staged at {}", at.display()),
            other => format!("is in use: {other}"),
        };
        return Err(Error::FailedPrecondition(format!(
            "volume {} {why}; unpublish and unstage it there first",
            vol.id
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
    let raw_id = vol.id.to_string();
    driver.pool.verify_identity(&raw_id, dev, &vol.record)?;
    let pinned = mount_dir(driver, "staging_target_path", staging, None)?;
    let key = format!("format:{}", vol.id);
    // An mkfs that a cancelled call started holds the device: join it before probing.
    if let Some(outcome) = driver.pool.jobs.join(&key).await {
        outcome?;
    }
    let sigs = driver.host.probe_signatures(&dev.path).await?;
    match decide_format(&vol.record, fs, &dev.path, &sigs) {
        FormatDecision::Refuse(why) => return Err(Error::FailedPrecondition(why)),
        FormatDecision::Format => {
            driver.pool.verify_identity(&raw_id, dev, &vol.record)?;
            let job = format_job(
                Arc::clone(&driver.host),
                vol.id.to_string(),
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
    driver.pool.verify_identity(&raw_id, dev, &vol.record)?;
    driver
        .host
        .mount(&dev.path, &pinned, fs, &cap.mount_flags)
        .await?;
    faults::reached(KillPoint::AfterStageMount);
    let verified = verify_staged(driver, staging, fs).await;
    if verified.is_err() {
        // Never leave a mount behind on a failed call: take down what this call made
        // (the topmost mount in the pinned directory, wherever it shows in the table).
        if let Err(e) = driver.host.unmount(&pinned).await {
            tracing::warn!(staging = %staging.display(), error = %e, "unmounting after a failed stage");
        }
    }
    verified
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
    fs: FsType,
) -> Result<()> {
    let _hold = crate::os::hold_when_free(host.as_ref(), &device, crate::os::HOLD_PATIENCE).await?;
    let sigs = host.probe_signatures(&device).await?;
    match decide_format(&record, fs, &device, &sigs) {
        FormatDecision::Format => {}
        FormatDecision::UseExisting { .. } => return Ok(()),
        FormatDecision::Refuse(why) => return Err(Error::FailedPrecondition(why)),
    }
    info!(%volume_id, device = %device.display(), fs = fs.as_str(), uuid = %record.fs_uuid, "formatting fresh device");
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
    Err(Error::FailedPrecondition(format!(
        "{} was mounted without the options GDS needs ({:?}); check the kernel's ext4 support",
        staging.display(),
        entry.super_options
    )))
}

/// Unmounts every mount stacked at `path` (a retried mount that half-succeeded) as
/// long as the topmost is this volume's (`is_ours`, given the entry and what the path
/// holds now); another mount there is refused and left alone. Returns the pinned path,
/// or `None` when it does not exist.
pub async fn unmount_ours(
    driver: &Driver,
    field: &'static str,
    path: &Path,
    volume: &str,
    is_ours: impl Fn(&MountEntry, Option<&nix::sys::stat::FileStat>) -> bool,
) -> Result<Option<Anchored>> {
    let Some(pinned) = safepath::open(field, &driver.allowed_roots, path, Create::Nothing, None)?
    else {
        return Ok(None);
    };
    // Looked up afresh from here: a descriptor of the mount's root would keep it busy.
    let pinned = pinned.without_final();
    for _ in 0..8 {
        let mounts = driver.host.mount_table()?;
        let Some(m) = mountinfo::at(&mounts, path) else {
            return Ok(Some(pinned));
        };
        // Never fstat an NFS mount's root: nfs_getattr (fs/nfs/inode.c, ~l. 857 in 6.1:
        // `do_update |= ... cache_validity & NFS_INO_INVALID_CHANGE`) asks the server when
        // the cached attributes are stale (a file created in it is enough), and with the
        // server gone that stat hung here, outside any deadline (VM rig, s_unmount_dead).
        // NFS volumes are told apart by their mount source, not by what the path holds.
        let st = if m.fs_type.starts_with("nfs") {
            None
        } else {
            pinned.stat_now()?
        };
        if !is_ours(m, st.as_ref()) {
            return Err(Error::FailedPrecondition(format!(
                "{} holds another mount ({} {}), not volume {volume}; not unmounting it",
                path.display(),
                m.fs_type,
                m.source.as_deref().unwrap_or("?")
            )));
        }
        crate::nfs::unmount::unmount(driver, &pinned).await?;
    }
    Err(Error::FailedPrecondition(format!(
        "{} is still mounted after repeated unmounts",
        path.display()
    )))
}

/// NodeUnstageVolume of a block volume: unmount its filesystem at `staging`. The
/// staging directory itself belongs to the kubelet.
pub async fn unstage(driver: &Driver, vol: &Located, staging: &Path) -> Result<()> {
    let dev = &vol.device;
    unmount_ours(
        driver,
        "staging_target_path",
        staging,
        &vol.id.to_string(),
        |m, _| m.is_device(dev.major, dev.minor),
    )
    .await
    .map(drop)
}

/// NodePublishVolume's GDS gate for a block volume: its policy from its record, and the
/// volume as mounted (raw block volumes: no filesystem, so only the node checks and a
/// driver-level probe run). A volume not staged from its device is left to [`publish`],
/// which reports that.
pub async fn gate_publish(
    gate: Option<&crate::gds_gate::GdsGate>,
    host: &dyn Host,
    vol: &Located,
    staging: &Path,
    cap: &Capability,
) -> Result<()> {
    use crate::gds_gate::{MountedVolume, Policy};
    let Some(gate) = gate else {
        return Ok(());
    };
    let policy = Policy::from_parameters(&vol.record.parameters)?;
    let dev = &vol.device;
    let mount_path = match cap.access {
        Access::Block => None,
        Access::Mount => {
            let mounts = host.mount_table()?;
            let staged =
                mountinfo::at(&mounts, staging).is_some_and(|m| m.is_device(dev.major, dev.minor));
            if !staged && policy != Policy::Disabled {
                return Ok(());
            }
            Some(staging)
        }
    };
    let mounted = MountedVolume::block(vol.id.to_string(), mount_path, dev.major, dev.minor);
    gate.check_publish(&mounted, policy).await.map(drop)
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
    // A filesystem publish is a mount of the device; a raw-block one a bind of its node.
    if already_published(&mounts, target, readonly, |m| match cap.access {
        Access::Mount => m.is_device(dev.major, dev.minor),
        Access::Block => blockdev::is_node_bind(m, dev.major, dev.minor),
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
    let mark = vol.id.to_string();
    match cap.access {
        Access::Mount => {
            let not_staged = || {
                Error::FailedPrecondition(format!(
                    "volume {} is not staged at {}; call NodeStageVolume first",
                    vol.id,
                    staging.display()
                ))
            };
            // The bind source is pinned too, and the table read after pinning: a staging
            // path swapped before that shows up as another mount there.
            let source = safepath::open(
                "staging_target_path",
                &driver.allowed_roots,
                staging,
                Create::Nothing,
                None,
            )?
            .ok_or_else(not_staged)?;
            let mounts = driver.host.mount_table()?;
            if !mountinfo::at(&mounts, staging).is_some_and(|m| m.is_device(dev.major, dev.minor)) {
                return Err(not_staged());
            }
            let target = mount_dir(driver, "target_path", target, Some(&mark))?;
            driver.host.bind_mount(&source, &target, &options).await?;
            faults::reached(KillPoint::AfterBindMount);
            Ok(())
        }
        Access::Block => {
            let pinned = safepath::open(
                "target_path",
                &driver.allowed_roots,
                target,
                Create::File,
                Some(&mark),
            )?
            .ok_or_else(|| {
                Error::invalid(
                    "target_path",
                    format!("{} could not be created", target.display()),
                )
            })?;
            // Only an empty regular file is mounted over: anything else would be hidden
            // (and a file with contents is not a publish target someone made for us).
            let st = pinned.stat_now()?;
            let empty_file = st.is_some_and(|st| {
                safepath::kind(&st) == nix::sys::stat::SFlag::S_IFREG && st.st_size == 0
            });
            if !empty_file {
                return Err(Error::FailedPrecondition(format!(
                    "target_path {} exists and is not an empty file; a raw block volume is \
                     published only onto a new or empty file, which would otherwise be hidden",
                    target.display()
                )));
            }
            driver
                .pool
                .verify_identity(&vol.id.to_string(), dev, &vol.record)?;
            driver
                .host
                .bind_mount(&Anchored::unpinned(&dev.path), &pinned, &options)
                .await
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

/// Mounts of the device other than its staging mount: filesystem binds and, for raw
/// block, binds of its node.
fn published_targets<'a>(
    mounts: &'a [MountEntry],
    dev: &'a PoolDevice,
    staging: &'a Path,
) -> impl Iterator<Item = PathBuf> + 'a {
    blockdev::mounts(mounts, dev.major, dev.minor)
        .into_iter()
        .filter_map(|u| u.mount_point().map(Path::to_owned))
        .filter(move |p| p != staging)
}

/// NodeUnpublishVolume, for every backend: unmount this volume's mounts at `target`
/// (`is_ours`), then remove the target only if this volume's publish created it (the
/// `safepath::PUBLISHED_BY` mark). Anything else at the target is left as it is.
pub async fn unpublish(
    driver: &Driver,
    volume: &str,
    target: &Path,
    is_ours: impl Fn(&MountEntry, Option<&nix::sys::stat::FileStat>) -> bool,
) -> Result<()> {
    let Some(pinned) = unmount_ours(driver, "target_path", target, volume, is_ours).await? else {
        return Ok(());
    };
    if pinned.published_by()?.as_deref() != Some(volume) {
        return Ok(());
    }
    let is_dir = pinned
        .stat_now()?
        .is_some_and(|st| safepath::kind(&st) == nix::sys::stat::SFlag::S_IFDIR);
    pinned.remove(is_dir)
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
