//! NodeStageVolume, NodeUnstageVolume, NodePublishVolume and NodeUnpublishVolume of NFS
//! volumes: the staging mount of `server:/share/dir` (verified to run over RDMA when
//! asked), and bind mounts of it.

use std::path::Path;

use tracing::{info, warn};

use super::{is_nfs_from, transport_mismatch, verify_mounted, NfsBackend, NfsVolumeId};
use crate::error::{Error, Result, VolumeError};
use crate::gds::gate::{MountedVolume, Policy};
use crate::os::{mount, MountEntry};
use crate::request::{nfs_options, NfsCapability};
use crate::volume::mounts::{already_published, Mounter};
use crate::volume::{Publish, Stage};

/// NodeStageVolume: mount `server:/share/dir` at the staging path.
pub async fn stage(b: &NfsBackend, id: &NfsVolumeId, req: &Stage<NfsCapability>) -> Result<()> {
    let (staging, cap) = (req.staging.as_path(), &req.capability);
    let opts = nfs_options::merge(&id.transport, &cap.mount_flags)?;
    let source = id.source();
    let mounts = b.mounter.mount_table()?;
    if let Some(m) = mount::at(&mounts, staging) {
        if !is_nfs_from(m, &source) {
            return Err(crate::volume::mounts::staging_taken(staging, m));
        }
        if let Some(why) = transport_mismatch(m, &opts.transport) {
            return Err(VolumeError::StagedWithoutRdma {
                path: staging.to_owned(),
                why,
            }
            .into());
        }
        return Ok(());
    }
    // Created and checked beneath the root like a block staging path; mount.nfs then
    // resolves the path once more by name (the window docs/design.md describes).
    let pinned = b.mounter.mount_dir("staging_target_path", staging, None)?;
    info!(volume_id = %id, %source, options = %opts.to_vec().join(","), "mounting NFS volume");
    let host = b.host();
    host.mount_nfs(&source, staging, &opts.to_vec()).await?;
    let verified = verify_mounted(host, &pinned, &source, &opts.transport).await;
    if verified.is_err() {
        // Never leave a mount behind on a failed call.
        if let Err(e) = host.unmount(&pinned).await {
            warn!(staging = %staging.display(), error = %e, "unmounting after a failed stage");
        }
    }
    verified
}

/// NodeUnstageVolume: unmount the staging path if it holds this volume. Needs only the
/// mount table: it works (as teardown must) where the backend is not enabled.
pub async fn unstage(mounter: &Mounter, id: &NfsVolumeId, staging: &Path) -> Result<()> {
    let source = id.source();
    let ours = |m: &MountEntry, _: Option<&nix::sys::stat::FileStat>| is_nfs_from(m, &source);
    mounter
        .unmount_ours("staging_target_path", staging, &id.to_string(), &ours)
        .await
        .map(drop)
}

/// NodeUnpublishVolume: unmount this volume's bind at the target, remove what publish
/// created. Like unstage, it needs only the mount table.
pub async fn unpublish(mounter: &Mounter, id: &NfsVolumeId, target: &Path) -> Result<()> {
    let source = id.source();
    let ours = |m: &MountEntry, _: Option<&nix::sys::stat::FileStat>| is_nfs_from(m, &source);
    mounter.unpublish(&id.to_string(), target, &ours).await
}

fn not_staged(id: &NfsVolumeId, staging: &Path) -> Error {
    crate::volume::mounts::not_staged(&id.to_string(), staging)
}

/// SINGLE_NODE_SINGLE_WRITER: no other mount of this volume but the staging one at a
/// served path (`Mounter::served`: copies propagated elsewhere are not publications).
fn check_single_writer(
    id: &NfsVolumeId,
    mounts: Vec<&MountEntry>,
    staged: &MountEntry,
    staging: &Path,
) -> Result<()> {
    let source = id.source();
    let other = mounts.into_iter().find(|m| {
        // NFS superblocks (and mountinfo roots) are shared between mounts of one server,
        // the controller's export mount included: the source tells this volume's mounts
        // apart (a bind mount shows its origin's source).
        m.major == staged.major
            && m.minor == staged.minor
            && is_nfs_from(m, &source)
            && m.mount_point != staging
    });
    match other {
        Some(other) => Err(crate::volume::mounts::single_writer(
            &id.to_string(),
            &other.mount_point,
        )),
        None => Ok(()),
    }
}

/// NodePublishVolume: bind the staged mount to the target.
pub async fn publish(b: &NfsBackend, id: &NfsVolumeId, req: &Publish<NfsCapability>) -> Result<()> {
    let cap = &req.capability;
    let (staging, target) = (req.staging.as_path(), req.target.as_path());
    let readonly = req.readonly || cap.read_only_mode;
    let source = id.source();
    let mounts = b.mounter.mount_table()?;
    let staged = mount::at(&mounts, staging)
        .filter(|m| is_nfs_from(m, &source))
        .cloned();
    // A bind mount of this volume shows the volume's own source.
    if already_published(&mounts, target, readonly, |m| is_nfs_from(m, &source))? {
        return Ok(());
    }
    let staged = staged.ok_or_else(|| not_staged(id, staging))?;
    if cap.single_writer {
        check_single_writer(id, b.mounter.served(&mounts), &staged, staging)?;
    }
    gate(b, id, req).await?;
    // Both ends pinned beneath the root: the source must still be this volume's mount.
    let pinned_staging = b
        .mounter
        .open("staging_target_path", staging)?
        .ok_or_else(|| not_staged(id, staging))?;
    let pinned_target = b
        .mounter
        .mount_dir("target_path", target, Some(&id.to_string()))?;
    let opts: Vec<String> = if readonly { vec!["ro".into()] } else { vec![] };
    b.host()
        .bind_mount(&pinned_staging, &pinned_target, &opts)
        .await
}

/// NodePublishVolume's GDS gate, the NFS backend's one call into it: the policy from the
/// volume context, the staged mount checked for NFS over RDMA.
async fn gate(b: &NfsBackend, id: &NfsVolumeId, req: &Publish<NfsCapability>) -> Result<()> {
    let Some(gate) = &b.gate else {
        return Ok(());
    };
    let policy = Policy::from_parameters(req.volume_context.iter())?;
    let mounted = MountedVolume::nfs(id.to_string(), &req.staging);
    gate.check_publish(&mounted, policy).await.map(drop)
}
