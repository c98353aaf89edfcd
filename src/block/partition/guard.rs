//! What keeps label changes on a carved device safe from each other and from a device
//! that stops answering:
//!
//! - [`DeviceLocks`]: one lock per pool device. Creates and deletes on one drive take
//!   turns on that drive only; other drives never wait for it.
//! - [`bounded`] / [`bounded_sync`]: every label write and BLKPG call runs on a thread
//!   of its own with a deadline. A write to a device that stopped answering (a dying
//!   drive, a hung controller) blocks in the kernel where no signal reaches it; the call
//!   answers Aborted at the deadline, and the device is refused (Aborted) until that
//!   thread has come back, so no second label write races the one still pending (like
//!   `os::inflight` does for mount syscalls).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::error::{Error, Result};
use crate::partition as gpt;

/// Each label write or BLKPG call (a few sectors, or one ioctl) must finish within this.
pub const LABEL_DEADLINE: Duration = Duration::from_secs(30);

/// One async lock per pool device id, made on first use (a node has a handful of drives).
#[derive(Default)]
pub struct DeviceLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

/// Held while a device's label (and the partitions it lists) may change.
pub type DeviceGuard = OwnedMutexGuard<()>;

impl DeviceLocks {
    fn slot(&self, device_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(device_id.to_owned()).or_default())
    }

    /// Waits for device `device_id`'s turn.
    pub async fn lock(&self, device_id: &str) -> DeviceGuard {
        self.slot(device_id).lock_owned().await
    }

    /// The device's lock if nobody holds it now.
    pub fn try_lock(&self, device_id: &str) -> Option<DeviceGuard> {
        self.slot(device_id).try_lock_owned().ok()
    }
}

/// Devices with a label write or BLKPG call that outlived its deadline and has not
/// returned yet. Process-wide, like the kernel state it guards.
static STUCK: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(Mutex::default);

fn stuck() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    STUCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn refused(device: &Path, what: &str) -> Error {
    Error::Aborted(format!(
        "{what} on {}: an earlier label write or partition-table ioctl on this device \
         outlived its deadline and is still blocked in the kernel; the device is refused \
         until it returns (retry later; check dmesg and the drive's health if it never does)",
        device.display()
    ))
}

/// One call's fate, shared by the caller and its thread: whichever learns second of
/// "timed out" and "returned" settles the device's entry in [`STUCK`].
#[derive(Default)]
struct Fate {
    returned: bool,
    timed_out: bool,
}

type Shared = Arc<Mutex<Fate>>;

fn lock(f: &Shared) -> std::sync::MutexGuard<'_, Fate> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

/// The thread's side: it has returned; frees the device if the caller gave up on it.
fn returned(fate: &Shared, device: &Path, what: &str) {
    let mut f = lock(fate);
    f.returned = true;
    if f.timed_out {
        stuck().remove(device);
        tracing::warn!(device = %device.display(), what, "a label call returned after its deadline; the device is free again");
    }
}

/// The caller's side at the deadline: the device stays refused until the thread returns.
fn timed_out(fate: &Shared, device: &Path, what: &str, after: Duration) -> Error {
    let mut f = lock(fate);
    if !f.returned {
        f.timed_out = true;
        stuck().insert(device.to_owned());
    }
    Error::Aborted(format!(
        "{what} on {} did not finish within {after:?} and is still blocked in the kernel; \
         the device is refused until it returns (retry later; check dmesg and the drive)",
        device.display()
    ))
}

fn enter(device: &Path, what: &str) -> Result<Shared> {
    if stuck().contains(device) {
        return Err(refused(device, what));
    }
    Ok(Shared::default())
}

/// Runs `f` (a label write or BLKPG call on `device`) on its own thread; Aborted at
/// `deadline`, or at once while an earlier call on the device is still stuck.
pub async fn bounded<T: Send + 'static>(
    device: &Path,
    what: &'static str,
    deadline: Duration,
    f: impl FnOnce() -> gpt::Result<T> + Send + 'static,
) -> Result<T> {
    let fate = enter(device, what)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (theirs, dev) = (Arc::clone(&fate), device.to_owned());
    spawn(what, move || {
        let r = f();
        returned(&theirs, &dev, what);
        let _ = tx.send(r);
    })?;
    match tokio::time::timeout(deadline, rx).await {
        Err(_) => Err(timed_out(&fate, device, what, deadline)),
        Ok(Err(_)) => Err(Error::FailedPrecondition(format!(
            "{what}: its thread died"
        ))),
        Ok(Ok(r)) => r.map_err(super::csi_error),
    }
}

/// [`bounded`] for the synchronous paths (locating a volume's partition for stage).
pub fn bounded_sync<T: Send + 'static>(
    device: &Path,
    what: &'static str,
    deadline: Duration,
    f: impl FnOnce() -> gpt::Result<T> + Send + 'static,
) -> Result<T> {
    let fate = enter(device, what)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (theirs, dev) = (Arc::clone(&fate), device.to_owned());
    spawn(what, move || {
        let r = f();
        returned(&theirs, &dev, what);
        let _ = tx.send(r);
    })?;
    match rx.recv_timeout(deadline) {
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(timed_out(&fate, device, what, deadline))
        }
        Err(_) => Err(Error::FailedPrecondition(format!(
            "{what}: its thread died"
        ))),
        Ok(r) => r.map_err(super::csi_error),
    }
}

fn spawn(what: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name("gds-csi-label".into())
        .spawn(f)
        .map(drop)
        .map_err(|e| Error::FailedPrecondition(format!("{what}: no thread: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn dev(name: &str) -> PathBuf {
        PathBuf::from(format!("/dev/gds-csi-guard-test-{name}"))
    }

    /// A call that blocks past its deadline answers Aborted at the deadline; the device
    /// is refused (without running anything) until the call returns, then free again.
    #[tokio::test]
    async fn a_stuck_label_call_refuses_its_device_until_it_returns() {
        let d = dev("async");
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let began = Instant::now();
        let err = bounded(
            &d,
            "writing the label",
            Duration::from_millis(100),
            move || {
                let _ = wait.recv();
                Ok(())
            },
        )
        .await
        .unwrap_err();
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "answered at the deadline"
        );
        assert!(
            matches!(&err, Error::Aborted(m) if m.contains("100ms")),
            "{err}"
        );
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = Arc::clone(&ran);
        let again = bounded(&d, "BLKPG add", Duration::from_secs(5), move || {
            r2.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await;
        assert!(matches!(&again, Err(Error::Aborted(m)) if m.contains("still blocked")));
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "refused before running"
        );
        assert!(bounded_sync(&d, "locate", Duration::from_secs(1), || Ok(())).is_err());
        assert!(
            bounded(&dev("other"), "x", Duration::from_secs(5), || Ok(7))
                .await
                .is_ok(),
            "other devices are not refused"
        );
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while stuck().contains(&d) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let v = bounded(&d, "x", Duration::from_secs(5), || Ok(3)).await;
        assert_eq!(v.unwrap(), 3, "free again once the call returned");
    }

    #[test]
    fn the_sync_form_has_the_same_deadline_and_passes_errors_through() {
        let d = dev("sync");
        let err = bounded_sync(&d, "w", Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(400));
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, Error::Aborted(_)), "{err}");
        std::thread::sleep(Duration::from_millis(600));
        assert!(!stuck().contains(&d), "freed when it returned");
        let e = bounded_sync(&d, "w", Duration::from_secs(5), || -> gpt::Result<()> {
            Err(gpt::Error::NotFound("3".into()))
        });
        assert!(matches!(e, Err(Error::NotFound(_))));
    }

    #[tokio::test]
    async fn a_device_lock_serialises_one_device_and_leaves_the_others_free() {
        let locks = DeviceLocks::default();
        let a = locks.lock("a").await;
        assert!(locks.try_lock("a").is_none(), "a is held");
        assert!(locks.try_lock("b").is_some(), "b never waits for a");
        drop(a);
        assert!(locks.try_lock("a").is_some());
    }
}
