//! NodeGetVolumeStats of block volumes: usage from statvfs (or the device size for a raw
//! block volume), the condition from the mount table and the GDS gate's compat marks.

use std::path::Path;

use super::BlockBackend;
use crate::csi::{self, volume_usage::Unit, VolumeCondition, VolumeUsage};
use crate::error::{Error, Result};
use crate::os::{blockdev, mountinfo, FileKind};
use crate::volume_id::BlockVolumeId;

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
) -> Result<csi::NodeGetVolumeStatsResponse> {
    let located = b.locate(id)?;
    if !b.mounter.exists_beneath(path)? {
        return Err(Error::NotFound(format!(
            "volume {} is not published or staged at {}",
            located.id,
            path.display()
        )));
    }
    let mounts = b.mounter.mount_table()?;
    let dev = &located.device;
    let entry = mountinfo::at(&mounts, path).filter(|m| blockdev::carries(m, dev.major, dev.minor));
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
    let healthy = if entry.fs_read_only() {
        condition(
            true,
            "the filesystem is read-only (remounted after errors?); check dmesg",
        )
    } else {
        condition(false, "mounted")
    };
    let host = b.mounter.host.as_ref();
    let is_dir = matches!(host.stat(path), Ok(Some(FileKind::Dir)));
    let usage = if entry.fs_type == "devtmpfs" || !is_dir {
        vec![VolumeUsage {
            total: dev.size_bytes as i64,
            unit: Unit::Bytes as i32,
            ..Default::default()
        }]
    } else {
        crate::mounts::usage_of(&host.statvfs(path)?)
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: healthy.map(|c| b.compat_condition(&located.id.to_string(), c)),
    })
}

impl BlockBackend {
    /// The GDS gate's say on a healthy-looking volume: published in compat mode is
    /// abnormal, with the reason.
    fn compat_condition(&self, volume_id: &str, c: VolumeCondition) -> VolumeCondition {
        crate::backend::compat_condition(self.gate.as_deref(), volume_id, c)
    }
}
