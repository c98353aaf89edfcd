//! NodeGetVolumeStats of block volumes: usage from statvfs (or the device size for a raw
//! block volume), the condition from the mount table and the GDS gate's compat marks.

use std::path::Path;

use super::BlockBackend;
use crate::csi::id::BlockVolumeId;
use crate::csi::{self, volume_usage::Unit, VolumeCondition, VolumeUsage};
use crate::error::{MountError, Result};
use crate::os::{blockdev, mount, FileKind};

fn condition(abnormal: bool, message: impl Into<String>) -> Option<VolumeCondition> {
    Some(VolumeCondition {
        abnormal,
        message: message.into(),
    })
}

pub fn stats(
    b: &BlockBackend,
    id: &BlockVolumeId,
    path: &Path,
    staging: Option<&Path>,
) -> Result<csi::NodeGetVolumeStatsResponse> {
    let located = b.locate(id)?;
    if !b.mounter.exists_beneath(path)? {
        return Err(MountError::NotMountedAt {
            volume: located.id.to_string(),
            path: path.to_owned(),
        }
        .into());
    }
    let mounts = b.mounter.mount_table()?;
    let dev = &located.device;
    let entry = mount::at(&mounts, path).filter(|m| blockdev::carries(m, dev.major, dev.minor));
    let Some(entry) = entry else {
        return Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![],
            volume_condition: condition(
                true,
                format!(
                    "{} exists but the volume is no longer mounted there",
                    path.display()
                ),
            ),
        });
    };
    let host = b.mounter.host.as_ref();
    let is_dir = matches!(host.stat(path), Ok(Some(FileKind::Dir)));
    let raw_block = entry.fs_type == "devtmpfs" || !is_dir;
    let healthy = if entry.fs_read_only() {
        condition(
            true,
            "the filesystem is read-only (remounted after errors?); check dmesg",
        )
    } else if let Some(staging) = staging.filter(|s| *s != path && !raw_block) {
        staging_lost(&mounts, staging, dev.major, dev.minor).or_else(|| condition(false, "mounted"))
    } else {
        condition(false, "mounted")
    };
    let usage = if raw_block {
        vec![VolumeUsage {
            total: dev.size_bytes as i64,
            unit: Unit::Bytes as i32,
            ..Default::default()
        }]
    } else {
        crate::volume::mounts::usage_of(&host.statvfs(path)?)
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: healthy.map(|c| b.compat_condition(&located.id.to_string(), c)),
    })
}

/// A published volume whose staging mount is gone (unmounted behind the driver's back): the
/// target still holds the filesystem, but unstage and the next publish find nothing at the
/// staging path. Raw block volumes are never asked: staging mounts nothing for them.
fn staging_lost(
    mounts: &[mount::MountEntry],
    staging: &Path,
    major: u32,
    minor: u32,
) -> Option<VolumeCondition> {
    let staged = mount::at(mounts, staging).is_some_and(|m| blockdev::carries(m, major, minor));
    if staged {
        return None;
    }
    condition(
        true,
        format!(
            "the staging path {} no longer has the volume mounted (unmounted outside the \
             driver?); the target still holds it until unpublished: unpublish, unstage and \
             stage it again",
            staging.display()
        ),
    )
}

impl BlockBackend {
    /// The GDS gate's say on a healthy-looking volume: published in compat mode is
    /// abnormal, with the reason.
    fn compat_condition(&self, volume_id: &str, c: VolumeCondition) -> VolumeCondition {
        crate::volume::compat_condition(self.gate.as_deref(), volume_id, c)
    }
}
