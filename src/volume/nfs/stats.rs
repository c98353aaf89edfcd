//! NodeGetVolumeStats of NFS volumes: statvfs under the deadline (a dead server would
//! stall it), the condition from the mount table, the transport and the GDS gate.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use super::{transport_mismatch, NfsBackend, NfsVolumeId};
use crate::csi::{self, VolumeCondition};
use crate::error::{MountError, Result};
use crate::os::mount;

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
        return Err(MountError::NotMountedAt {
            volume: id.to_string(),
            path: path.to_owned(),
        }
        .into());
    }
    let mounts = b.mounter.mount_table()?;
    let Some(entry) = mount::at(&mounts, path)
        .filter(|m| m.fs_type.starts_with("nfs"))
        .cloned()
    else {
        return Ok(abnormal(format!(
            "{} exists but the volume is no longer mounted there",
            path.display()
        )));
    };
    let st = match statvfs_once(b, path).await {
        Ok(st) => st,
        Err(e) => return Ok(abnormal(format!("the NFS server does not answer: {e}"))),
    };
    let condition = match transport_mismatch(&entry, &id.transport) {
        Some(why) => VolumeCondition {
            abnormal: true,
            message: format!("mounted without RDMA: {why}"),
        },
        None => VolumeCondition {
            abnormal: false,
            message: "mounted".into(),
        },
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage: crate::volume::mounts::usage_of(&st),
        volume_condition: Some(crate::volume::compat_condition(
            b.gate.as_deref(),
            &id.to_string(),
            condition,
        )),
    })
}

/// Paths with a statvfs still stuck in the kernel: a hard NFS mount's statvfs waits until
/// the server answers, and its thread cannot be taken back at the deadline.
static STATVFS_IN_FLIGHT: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(Mutex::default);

fn in_flight() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    STATVFS_IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Leaves the set when the statvfs returns, however late.
struct Leave(PathBuf);

impl Drop for Leave {
    fn drop(&mut self) {
        in_flight().remove(&self.0);
    }
}

/// statvfs of `path` under the deadline, at most one per path at a time: the kubelet asks
/// every minute, and with the server gone each call would otherwise leave one more
/// blocking thread stuck until the pool is exhausted and every other call waits behind it.
async fn statvfs_once(b: &NfsBackend, path: &Path) -> Result<crate::os::FsUsage> {
    if !in_flight().insert(path.to_owned()) {
        return Err(MountError::StatvfsPending {
            path: path.to_owned(),
        }
        .into());
    }
    let leave = Leave(path.to_owned());
    let (host, owned) = (std::sync::Arc::clone(&b.mounter.host), path.to_owned());
    b.with_deadline(format!("statvfs {}", path.display()), move || {
        let _leave = leave;
        host.statvfs(&owned)
    })
    .await
}
