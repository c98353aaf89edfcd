//! NodePublishVolume and NodeUnpublishVolume of block volumes: a bind of the staged
//! filesystem (mount access) or of the device node (raw block access), after the GDS
//! gate.

use std::path::{Path, PathBuf};

use super::{fill, BlockBackend, Located};
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::error::{Error, Result, VolumeError};
use crate::gds::gate::{GateOutcome, MountedVolume, Policy};
use crate::os::{blockdev, mount, Anchored, MountEntry};
use crate::pool::PoolDevice;
use crate::request::{Access, Capability};
use crate::runtime::faults::{self, KillPoint};
use crate::volume::mounts::already_published;
use crate::volume::Publish;

/// NodePublishVolume of a block volume: the pool ready → (raw block access) the fill
/// step → the GDS gate → a bind of the staged filesystem or of the device node.
pub async fn publish(
    b: &BlockBackend,
    id: &BlockVolumeId,
    req: &Publish<Capability>,
) -> Result<()> {
    let cap = &req.capability;
    b.check_ready()?;
    // A raw block volume is written through its publish, and a CO may publish it while it
    // is still staged from before a clone of it was made (NodeStage of block access
    // mounts nothing that CreateVolume could see): its clones take their copy first, and
    // a raw clone is filled before its first bind.
    if cap.access == Access::Block {
        fill::fill_clones_of(b, id).await?;
    }
    let mut vol = b.locate(id)?;
    if cap.access == Access::Block {
        fill::fill(b, &mut vol, cap).await?;
    }
    let (staging, target) = (req.staging.as_path(), req.target.as_path());
    gate(b, &vol, staging, cap).await?;
    let readonly = req.readonly || cap.read_only_mode;
    let dev = &vol.device;
    let mounts = b.mounter.mount_table()?;
    // A filesystem publish is a mount of the device; a raw-block one a bind of its node.
    if already_published(&mounts, target, readonly, |m| match cap.access {
        Access::Mount => m.is_device(dev.major, dev.minor),
        Access::Block => blockdev::is_node_bind(m, dev.major, dev.minor),
    })? {
        return Ok(());
    }
    if cap.single_writer {
        let served = b.mounter.served(&mounts);
        if let Some(other) = published_targets(served, dev, staging).next() {
            return Err(crate::volume::mounts::single_writer(
                &vol.id.to_string(),
                &other,
            ));
        }
    }
    let mut options = cap.mount_flags.clone();
    if readonly {
        options.push("ro".into());
    }
    match cap.access {
        Access::Mount => bind_filesystem(b, &vol, staging, target, &options).await,
        Access::Block => bind_device(b, &vol, target, &options).await,
    }
}

/// NodePublishVolume's GDS gate, the block backend's one call into it: the volume's
/// policy from its record, its staged filesystem (raw block volumes: none, so only the
/// node checks and a driver-level probe run). A volume that is not staged is left to
/// `bind_filesystem`, which reports that.
async fn gate(
    b: &BlockBackend,
    vol: &Located,
    staging: &Path,
    cap: &Capability,
) -> Result<Option<GateOutcome>> {
    let Some(gate) = &b.gate else {
        return Ok(None);
    };
    let policy = Policy::from_parameters(&vol.record.parameters)?;
    let mounted = match cap.access {
        Access::Block => None,
        Access::Mount => {
            let mounts = b.mounter.mount_table()?;
            let dev = &vol.device;
            let staged =
                mount::at(&mounts, staging).is_some_and(|m| m.is_device(dev.major, dev.minor));
            if !staged && policy != Policy::Disabled {
                return Ok(None);
            }
            Some(staging)
        }
    };
    let dev = &vol.device;
    let mounted = MountedVolume::block(vol.id.to_string(), mounted, dev.major, dev.minor);
    gate.check_publish(&mounted, policy).await.map(Some)
}

async fn bind_filesystem(
    b: &BlockBackend,
    vol: &Located,
    staging: &Path,
    target: &Path,
    options: &[String],
) -> Result<()> {
    let dev = &vol.device;
    let not_staged = || crate::volume::mounts::not_staged(&vol.id.to_string(), staging);
    // The bind source is pinned too, and the table read after pinning: a staging path
    // swapped before that shows up as another mount there.
    let source = b
        .mounter
        .open("staging_target_path", staging)?
        .ok_or_else(not_staged)?;
    let mounts = b.mounter.mount_table()?;
    if !mount::at(&mounts, staging).is_some_and(|m| m.is_device(dev.major, dev.minor)) {
        return Err(not_staged());
    }
    let mark = vol.id.to_string();
    let target = b.mounter.mount_dir("target_path", target, Some(&mark))?;
    b.mounter.host.bind_mount(&source, &target, options).await?;
    faults::reached(KillPoint::AfterBindMount);
    Ok(())
}

async fn bind_device(
    b: &BlockBackend,
    vol: &Located,
    target: &Path,
    options: &[String],
) -> Result<()> {
    let pinned = b.mounter.target_file(target, &vol.id.to_string())?;
    let mut vol = vol.clone();
    b.verify_located(&mut vol)?;
    b.mounter
        .host
        .bind_mount(&Anchored::unpinned(&vol.device.path), &pinned, options)
        .await
}

/// Mounts of the device other than its staging mount: filesystem binds and, for raw
/// block, binds of its node. `mounts`: those at served paths (`Mounter::served`).
fn published_targets<'a>(
    mounts: Vec<&'a MountEntry>,
    dev: &'a PoolDevice,
    staging: &'a Path,
) -> impl Iterator<Item = PathBuf> + 'a {
    blockdev::mounts(mounts, dev.major, dev.minor)
        .into_iter()
        .filter_map(|u| u.mount_point().map(Path::to_owned))
        .filter(move |p| p != staging)
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
            crate::os::safepath::kind(st) == nix::sys::stat::SFlag::S_IFBLK
                && st.st_rdev == nix::sys::stat::makedev(dev.major.into(), dev.minor.into())
        })
}

pub async fn unpublish(b: &BlockBackend, id: &BlockVolumeId, target: &Path) -> Result<()> {
    let raw = id.to_string();
    match b.mounted_device(id) {
        Ok(dev) => {
            let dev = &dev;
            let ours =
                |m: &MountEntry, st: Option<&nix::sys::stat::FileStat>| is_this_device(m, st, dev);
            b.mounter.unpublish(&raw, target, &ours).await
        }
        // A volume of this node whose record is gone (deleted): nothing at the target can
        // be recognised as its, so nothing is unmounted or removed.
        Err(Error::VolumeNotFound(_)) if id.node_id == b.node.node_id => {
            b.mounter.unpublish(&raw, target, &|_, _| false).await
        }
        // A stripe's device is its md array, which runs only while the volume is staged
        // (an array cannot be stopped while mounted): with none running, nothing at the
        // target is of it (csi-sanity unpublishes volumes it never staged).
        Err(Error::Volume(VolumeError::DeviceAbsent { .. })) if id.layout == IdLayout::Stripe => {
            b.mounter.unpublish(&raw, target, &|_, _| false).await
        }
        Err(e) => Err(e),
    }
}
