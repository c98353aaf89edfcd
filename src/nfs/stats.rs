//! NodeGetVolumeStats of NFS volumes: statvfs under the deadline (a dead server would
//! stall it), the condition from the mount table, the transport and the GDS gate.

use std::path::Path;

use super::{transport_mismatch, NfsBackend, NfsVolumeId};
use crate::csi::{self, VolumeCondition};
use crate::error::{Error, Result};
use crate::os::mountinfo;

fn abnormal(message: String) -> csi::NodeGetVolumeStatsResponse {
    csi::NodeGetVolumeStatsResponse {
        usage: vec![],
        volume_condition: Some(VolumeCondition {
            abnormal: true,
            message,
        }),
    }
}

pub async fn stats(
    b: &NfsBackend,
    id: &NfsVolumeId,
    path: &Path,
) -> Result<csi::NodeGetVolumeStatsResponse> {
    if !b.mounter.exists_beneath(path)? {
        return Err(Error::NotFound(format!(
            "volume {id} is not published or staged at {}",
            path.display()
        )));
    }
    let mounts = b.mounter.mount_table()?;
    let Some(entry) = mountinfo::at(&mounts, path)
        .filter(|m| m.fs_type.starts_with("nfs"))
        .cloned()
    else {
        return Ok(abnormal(format!(
            "{} exists but the volume is no longer mounted there",
            path.display()
        )));
    };
    let (host, owned) = (std::sync::Arc::clone(&b.mounter.host), path.to_owned());
    let st = b
        .with_deadline(format!("statvfs {}", path.display()), move || {
            host.statvfs(&owned)
        })
        .await;
    let st = match st {
        Ok(st) => st,
        Err(e) => return Ok(abnormal(format!("the NFS server does not answer: {e}"))),
    };
    let condition = if transport_mismatch(&entry, &id.transport).is_some() {
        VolumeCondition {
            abnormal: true,
            message: "mounted without RDMA".into(),
        }
    } else {
        VolumeCondition {
            abnormal: false,
            message: "mounted".into(),
        }
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage: crate::mounts::usage_of(&st),
        volume_condition: Some(crate::backend::compat_condition(
            b.gate.as_deref(),
            &id.to_string(),
            condition,
        )),
    })
}
