//! The stripe layout's share of the partition layout's guards: every member's device
//! lock, taken in one order, and label steps under the label deadline, tried again while
//! udevd holds the disk for a moment.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{stripe_of, Striped};
use crate::block::partition::csi_error;
use crate::block::partition::guard::{bounded, DeviceGuard};
use crate::error::Result;
use crate::partition as gpt;

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

    /// Runs an idempotent label step or BLKPG call on `device` through the partition
    /// layout's deadline (`guard::bounded`: its own thread, Aborted at the deadline), again
    /// while the kernel answers a transient refusal, for at most [`UDEV_SETTLE`]; the
    /// pause between tries is tokio's timer (no runtime thread blocked). Seen on the VM
    /// rig (kernel 6.1 with systemd-udevd): after a member is written (`mdadm
    /// --zero-superblock`, the zero-out) udevd's probe holds it open briefly, so BLKPG
    /// delete fails with EBUSY and succeeds 3 s later; after a label write udevd's
    /// re-read (see `crate::partition`) can add our partition just before we do, and
    /// during that re-read the kernel shows none of the disk's partitions for a moment
    /// (kernel::node's NotFound), and right after it the kernel lists a partition whose
    /// /dev node devtmpfs has not made yet (kernel::node's stat: ENOENT on the
    /// partition's node, seen on the rig's 4-member create).
    pub(super) async fn settled<T: Send + 'static>(
        &self,
        device: &Path,
        what: &'static str,
        step: impl Fn() -> gpt::Result<T> + Send + Sync + 'static,
    ) -> Result<T> {
        let step = Arc::new(step);
        let until = tokio::time::Instant::now() + UDEV_SETTLE;
        loop {
            let once = Arc::clone(&step);
            let deadline = self.parts.label_deadline();
            let result = bounded(device, what, deadline, move || Ok(once())).await?;
            if !transient(&result, device) || tokio::time::Instant::now() >= until {
                return result.map_err(csi_error);
            }
            tokio::time::sleep(UDEV_PAUSE).await;
        }
    }
}

/// Whether a partition step failed only because udevd had the disk for a moment.
fn transient<T>(result: &gpt::Result<T>, disk: &Path) -> bool {
    match result {
        Err(gpt::Error::Kernel { source, .. }) => source.raw_os_error() == Some(libc::EBUSY),
        Err(gpt::Error::NotFound(m)) => m.contains("in the kernel's view"),
        // A partition's node not yet in /dev (never the disk itself missing).
        Err(gpt::Error::Io { device, source, .. }) => {
            device.as_path() != disk && source.raw_os_error() == Some(libc::ENOENT)
        }
        _ => false,
    }
}

/// How long a partition step is tried again while udevd holds the disk (3 s seen).
const UDEV_SETTLE: Duration = Duration::from_secs(5);
const UDEV_PAUSE: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    fn io(device: &str, errno: i32) -> gpt::Result<()> {
        Err(gpt::Error::Io {
            what: "stat",
            device: device.into(),
            source: std::io::Error::from_raw_os_error(errno),
        })
    }

    /// Only udevd's moments are waited out: a missing partition node, not a missing
    /// disk or any other error.
    #[test]
    fn only_udevs_moments_are_tried_again() {
        let disk = Path::new("/dev/nvme0n1");
        assert!(transient(&io("/dev/nvme0n1p1", libc::ENOENT), disk));
        assert!(!transient(&io("/dev/nvme0n1", libc::ENOENT), disk));
        assert!(!transient(&io("/dev/nvme0n1p1", libc::EIO), disk));
        let gone = gpt::Error::NotFound("1 in the kernel's view of /dev/nvme0n1".into());
        assert!(transient::<()>(&Err(gone), disk));
        assert!(!transient::<()>(
            &Err(gpt::Error::NotFound("3".into())),
            disk
        ));
        assert!(!transient(&Ok(()), disk));
    }
}
