//! DeleteVolume of the stripe layout, a job (`crate::runtime::overlap::Jobs`, key `erase:<volume id>`, as
//! the partition layout's) holding every member's device lock: stop our array if it runs,
//! check every member (not in use, nothing on it but this array's md superblock) before
//! any is changed, then erase each through the partition layout's one erase path
//! (`partition::erase_partition`: signatures wiped, every block zeroed) and remove it.
//! A zero-out of N members takes minutes; the job goes on when the call is cancelled, and
//! a retry joins it.

use std::sync::Arc;

use tracing::info;

use super::{member_as_device, stripe_of, Striped};
use crate::csi::id::BlockVolumeId;
use crate::disk::gpt::{self, volume};
use crate::disk::md;
use crate::error::{LayoutError, Result};
use crate::os::{Host, MountEntry, Signature};
use crate::pool::{PoolDevice, StripeRecord};
use crate::volume::block::partition::erase_partition;

impl Striped {
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
        self.pool.jobs.run(&key, "stripe-erase", job).await
    }

    /// The delete job's work, under every member's device lock.
    async fn release_held(
        &self,
        host: &Arc<dyn Host>,
        id: &BlockVolumeId,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let volume_id = id.to_string();
        let volume_id = volume_id.as_str();
        if self.record(volume_id).is_err() {
            return Ok(());
        }
        let _members = self.lock_members(volume_id).await?;
        // Read again under the locks: an earlier job may have finished it meanwhile.
        let Ok(rec) = self.record(volume_id) else {
            return Ok(());
        };
        let stripe = stripe_of(volume_id, &rec)?;
        self.stop_ours(host.as_ref(), volume_id, stripe, mounts)
            .await?;
        let members = self.present_members(id, &rec, mounts)?;
        // No UUID recorded: a create that finished or was cut short by a kill may still
        // have left this volume's own superblocks. When they cannot be read, only blank
        // members are erased.
        let ours = match &stripe.array_uuid {
            Some(uuid) => Some(uuid.clone()),
            None => (self.unrecorded_uuid(host.as_ref(), id, &rec, mounts).await).unwrap_or(None),
        };
        let ours = ours.as_deref();
        self.check_members(host.as_ref(), volume_id, ours, &members, mounts)
            .await?;
        self.pool.state.update(|s| {
            if let Some(r) = s.get_mut(volume_id) {
                r.deleting = true;
            }
            Ok(())
        })?;
        for (parent, carved) in &members {
            // Probed again by the erase: still nothing but our array's superblock.
            erase_partition(host, volume_id, &carved.node, |sigs| {
                (!member_erasable(sigs, ours)).then(|| foreign(volume_id, parent, carved, sigs))
            })
            .await?;
            self.mark_member_erased(volume_id, carved.partuuid)?;
            let (path, guid) = (parent.path.clone(), carved.partuuid);
            let step = move || volume::remove(&path, &guid);
            self.settled(&parent.path, "removing a stripe member", step)
                .await?;
            self.parts.keep_from_whole_device_use(parent);
        }
        self.pool.state.update(|s| {
            s.remove(volume_id);
            Ok(())
        })?;
        info!(volume_id, "stripe released");
        Ok(())
    }

    /// The record says member `partuuid`'s blocks are zeroed: its entry leaving the label
    /// from now on is this delete's own step, not another tool's change.
    fn mark_member_erased(&self, volume_id: &str, partuuid: uuid::Uuid) -> Result<()> {
        let partuuid = partuuid.to_string();
        self.pool.state.update(|s| {
            let members = s
                .get_mut(volume_id)
                .and_then(|r| r.stripe.as_mut())
                .map(|st| st.members.iter_mut());
            for m in members.into_iter().flatten() {
                if let Some(p) = m.partition.as_mut().filter(|p| p.partuuid == partuuid) {
                    p.erased = true;
                }
            }
            Ok(())
        })
    }

    /// Stops the volume's array when the kernel runs it (found by our UUID only);
    /// refused while its device is mounted.
    pub(crate) async fn stop_ours(
        &self,
        host: &dyn Host,
        volume_id: &str,
        stripe: &StripeRecord,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let Some(uuid) = &stripe.array_uuid else {
            return Ok(());
        };
        let Some(array) = md::sysfs::find(self.pool.host_sys(), uuid) else {
            return Ok(());
        };
        let (major, minor) = crate::os::blockdev::devnum_of(&array.node).map_err(|e| {
            LayoutError::NoDeviceNumber {
                what: "md array",
                why: e.to_string(),
            }
        })?;
        let used = crate::os::blockdev::uses(mounts, self.pool.host_sys(), major, minor);
        if let Some(u) = used.first() {
            return Err(LayoutError::ArrayInUse {
                array: array.node.clone(),
                volume: volume_id.to_owned(),
                uses: u.to_string(),
            }
            .into());
        }
        md::stop(host, &array.node).await
    }

    /// Every member is checked before any is changed: one in use or foreign stops all.
    async fn check_members(
        &self,
        host: &dyn Host,
        volume_id: &str,
        ours: Option<&str>,
        members: &[(PoolDevice, gpt::Carved)],
        mounts: &[MountEntry],
    ) -> Result<()> {
        for (parent, carved) in members {
            if let Some(u) = self
                .pool
                .uses(&member_as_device(parent, carved)?, mounts)
                .first()
            {
                return Err(LayoutError::MemberInUse {
                    member: carved.node.clone(),
                    volume: volume_id.to_owned(),
                    uses: u.to_string(),
                    fix: "unstage the volume (which stops its array) first",
                }
                .into());
            }
            let sigs = host.probe_signatures(&carved.node).await?;
            if !member_erasable(&sigs, ours) {
                let why = foreign(volume_id, parent, carved, &sigs);
                return Err(LayoutError::NotOurs { why }.into());
            }
        }
        Ok(())
    }
}

/// Why a member is not erased: it carries something other than our array's superblock.
fn foreign(
    volume_id: &str,
    parent: &PoolDevice,
    carved: &gpt::Carved,
    sigs: &[Signature],
) -> String {
    format!(
        "stripe member {} (drive {}) of volume {volume_id} carries {}, not this volume's md \
         superblock; nothing was erased",
        carved.node.display(),
        parent.path.display(),
        crate::pool::describe_signatures(sigs)
    )
}

/// A member's signatures allow erasing it: none, or only the md superblock of our array.
pub(super) fn member_erasable(sigs: &[Signature], array_uuid: Option<&str>) -> bool {
    sigs.iter().all(|s| {
        s.kind == "linux_raid_member"
            && array_uuid
                .is_some_and(|ours| s.uuid.as_deref().is_some_and(|u| md::same_uuid(u, ours)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(kind: &str, uuid: &str) -> Signature {
        Signature {
            kind: kind.into(),
            uuid: Some(uuid.into()),
            offset: None,
            seen_by: "blkid",
        }
    }

    #[test]
    fn only_our_arrays_superblock_lets_a_member_be_erased() {
        let ours = "0f1e2d3c:4b5a6978:8796a5b4:c3d2e1f0";
        let blkid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        assert!(member_erasable(&[], None));
        assert!(member_erasable(
            &[sig("linux_raid_member", blkid)],
            Some(ours)
        ));
        let other = "11111111-4b5a-6978-8796-a5b4c3d2e1f0";
        assert!(!member_erasable(
            &[sig("linux_raid_member", other)],
            Some(ours)
        ));
        assert!(!member_erasable(&[sig("linux_raid_member", blkid)], None));
        assert!(!member_erasable(&[sig("ext4", blkid)], Some(ours)));
        assert!(!md::same_uuid("", ""));
    }
}
