//! The stripe layout's share of the partition layout's guards: every member's device
//! lock, taken in one order, and label steps run like the partition layout's (the whole
//! disk's lock, udevd's moments waited out, the label deadline).

use std::path::Path;

use super::{stripe_of, Striped};
use crate::disk::gpt;
use crate::error::Result;
use crate::volume::block::partition::guard::{settled, DeviceGuard};

impl Striped {
    /// The device locks of `ids`, taken in sorted order (each once): the one order every
    /// multi-device caller takes them in, so none waits for another crosswise.
    pub(super) async fn lock_sorted(
        &self,
        ids: impl IntoIterator<Item = String>,
    ) -> Vec<(String, DeviceGuard)> {
        let mut ids: Vec<String> = ids.into_iter().collect();
        ids.sort();
        ids.dedup();
        let mut held = Vec::with_capacity(ids.len());
        for id in ids {
            let guard = self.parts.device_lock(&id).await;
            held.push((id, guard));
        }
        held
    }

    /// The pool device ids of a recorded stripe volume's members.
    pub(super) fn member_ids(&self, raw: &str) -> Result<Vec<String>> {
        let rec = self.record(raw)?;
        let stripe = stripe_of(raw, &rec)?;
        Ok(stripe.members.iter().map(|m| m.device_id.clone()).collect())
    }

    /// Every member device's lock of a recorded stripe volume.
    pub(super) async fn lock_members(&self, raw: &str) -> Result<Vec<(String, DeviceGuard)>> {
        Ok(self.lock_sorted(self.member_ids(raw)?).await)
    }

    /// Runs an idempotent label step or BLKPG call on `device` the way the partition
    /// layout runs its own: under the whole disk's BSD lock, udevd's moments waited out,
    /// within the label deadline (`guard::settled`, `crate::disk::gpt::wholedisk`). Seen
    /// on the VM rig (kernel 6.1 with systemd-udevd): after a member is written (`mdadm
    /// --zero-superblock`, the zero-out) udevd's probe holds it open briefly, so BLKPG
    /// delete failed with EBUSY and succeeded 3 s later.
    pub(super) async fn settled<T: Send + 'static>(
        &self,
        device: &Path,
        what: &'static str,
        step: impl Fn() -> gpt::Result<T> + Send + Sync + 'static,
    ) -> Result<T> {
        settled(device, what, self.parts.label_deadline(), step).await
    }
}
