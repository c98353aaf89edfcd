//! DeleteVolume of the partition layout, a job holding the device's lock: erase the partition
//! (signatures wiped, every block zeroed), take it out of the kernel, then out of the
//! label, then drop the record. Each step is idempotent, so a retry after a crash at any
//! kill point finds where the last try stopped and finishes the job.

use std::path::Path;
use std::sync::Arc;

use tracing::info;

use super::guard::settled;
use super::{as_device, Partitioned, ZERO_CHUNK_DEADLINE};
use crate::csi::id::BlockVolumeId;
use crate::disk::gpt::{self, volume, Carved};
use crate::error::{LayoutError, Result};
use crate::os::{Host, MountEntry, Signature};
use crate::pool::{PoolDevice, VolumeRecord};
use crate::runtime::faults::{self, KillPoint};

impl Partitioned {
    /// The whole delete runs as a job (`crate::runtime::overlap::Jobs`, key `erase:<volume id>`): zeroing a
    /// big partition takes minutes, longer than a caller may wait, and the job (not the
    /// call) holds the device's lock, so a cancelled DeleteVolume's erase goes on with
    /// the device still held (no create changes its label meanwhile, and the partition
    /// stays in the label until erased, so nothing is carved over it), and the retry
    /// joins the running job instead of starting a second zero-out.
    pub(super) async fn release_volume(
        &self,
        host: &Arc<dyn Host>,
        id: &BlockVolumeId,
        mounts: &[MountEntry],
    ) -> Result<()> {
        if self.record(&id.to_string()).is_err() {
            return Ok(());
        }
        let key = format!("erase:{id}");
        let (this, host) = (self.clone(), Arc::clone(host));
        let (id, mounts) = (id.clone(), mounts.to_vec());
        let job = async move { this.release_held(&host, &id, &mounts).await };
        self.pool.jobs.run(&key, "partition-erase", job).await
    }

    /// The delete job's work, under the device's lock.
    async fn release_held(
        &self,
        host: &Arc<dyn Host>,
        id: &BlockVolumeId,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let volume_id = id.to_string();
        let volume_id = volume_id.as_str();
        let Ok(rec) = self.record(volume_id) else {
            return Ok(());
        };
        if self.moving_now(volume_id) {
            return Err(LayoutError::Moving {
                volume: volume_id.to_owned(),
            }
            .into());
        }
        let _device = self.device_lock(&rec.device_id).await;
        let parent = self.pool.fresh_device(&rec.device_id, mounts);
        if let Some(parent) = parent.as_ref().filter(|p| volume::ours(&p.path).is_ok()) {
            self.repair_label(&parent.path).await?;
            self.settle(volume_id, &parent.path).await?;
        }
        // Read again under the lock (and after a move settled): an earlier job may have
        // finished it meanwhile.
        let Ok(rec) = self.record(volume_id) else {
            return Ok(());
        };
        if let Some(parent) = &parent {
            if let Some(carved) = self.carved(id, &rec, &parent.path)? {
                self.erase(host, volume_id, &rec, parent, &carved, mounts)
                    .await?;
                self.mark_erased(volume_id)?;
                faults::reached(KillPoint::DeleteAfterWipe);
                self.remove(&parent.path, carved.partuuid).await?;
                self.keep_from_whole_device_use(parent);
            }
        }
        self.pool.state.update(|s| {
            s.remove(volume_id);
            Ok(())
        })?;
        info!(volume_id, "partition released");
        Ok(())
    }

    /// The record says the partition's blocks are zeroed: its entry leaving the label
    /// from now on is this delete's own step, not another tool's change.
    fn mark_erased(&self, volume_id: &str) -> Result<()> {
        self.pool.state.update(|s| {
            if let Some(p) = s.get_mut(volume_id).and_then(|r| r.partition.as_mut()) {
                p.erased = true;
            }
            Ok(())
        })
    }

    /// Out of the kernel (refused while open), then out of the label, each bounded.
    async fn remove(&self, parent: &std::path::Path, partuuid: uuid::Uuid) -> Result<()> {
        let path = parent.to_owned();
        let unshow = move || volume::unshow(&path, &partuuid);
        settled(
            parent,
            "removing a partition from the kernel",
            self.label_deadline,
            unshow,
        )
        .await?;
        faults::reached(KillPoint::PartAfterUnshow);
        let path = parent.to_owned();
        let remove = move || volume::remove(&path, &partuuid);
        settled(
            parent,
            "removing a partition from the label",
            self.label_deadline,
            remove,
        )
        .await?;
        faults::reached(KillPoint::PartAfterRemove);
        Ok(())
    }

    /// Wipes the volume's filesystem signature and zeroes the partition (offloaded where
    /// the device can, else written), so the next tenant reads zeros.
    async fn erase(
        &self,
        host: &Arc<dyn Host>,
        volume_id: &str,
        rec: &VolumeRecord,
        parent: &PoolDevice,
        carved: &Carved,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let dev = as_device(parent, rec, carved).ok_or_else(|| LayoutError::PartitionGone {
            node: carved.node.clone(),
        })?;
        if let Some(u) = self.pool.uses(&dev, mounts).first() {
            return Err(LayoutError::PartitionInUse {
                volume: volume_id.to_owned(),
                uses: u.to_string(),
            }
            .into());
        }
        self.pool.state.update(|s| {
            if let Some(r) = s.get_mut(volume_id) {
                r.deleting = true;
            }
            Ok(())
        })?;
        faults::reached(KillPoint::DeleteBeforeWipe);
        erase_partition(host, volume_id, &dev.path, |sigs| {
            let foreign = sigs
                .iter()
                .any(|s| s.uuid.as_deref() != Some(rec.fs_uuid.as_str()));
            foreign.then(|| {
                format!(
                    "partition {} of volume {volume_id} carries {}, not the volume's \
                     filesystem; it is left as it is",
                    dev.path.display(),
                    crate::pool::describe_signatures(sigs)
                )
            })
        })
        .await?;
        info!(volume_id, node = %dev.path.display(), "partition erased");
        Ok(())
    }
}

/// The one erase of a partition of ours, a partition volume or a stripe member: its
/// signatures probed again and refused (FailedPrecondition, `refuse`'s reason, nothing
/// changed) unless the caller knows them as its own, then wiped, then every block zeroed
/// (offloaded where the device can, else written), so the next tenant reads zeros.
pub(crate) async fn erase_partition(
    host: &Arc<dyn Host>,
    volume_id: &str,
    node: &Path,
    refuse: impl Fn(&[Signature]) -> Option<String>,
) -> Result<()> {
    let sigs = host.probe_signatures(node).await?;
    if let Some(why) = refuse(&sigs) {
        return Err(LayoutError::NotOurs { why }.into());
    }
    if !sigs.is_empty() {
        host.wipe_signatures(node).await?;
    }
    // One line per zero-out run: a retry that joins the job adds none.
    info!(volume_id, node = %node.display(), "zeroing the partition");
    let owned = node.to_owned();
    let offloaded = tokio::task::spawn_blocking(move || {
        gpt::kernel::zero_offloaded(&owned, ZERO_CHUNK_DEADLINE)
    })
    .await
    .map_err(|e| LayoutError::ZeroTaskFailed { why: e.to_string() })??;
    if offloaded == gpt::Erased::Unsupported {
        host.zero_device(node).await?;
    }
    Ok(())
}
