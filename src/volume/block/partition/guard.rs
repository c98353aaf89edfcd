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
//!   `os::mount` does for mount syscalls). The calls on one device also run one at a
//!   time on their threads: a caller that is cancelled (its gRPC call dropped) gives its
//!   device lock back while its write goes on, and the next write waits for it there.
//! - [`settled`] / [`settled_sync`]: [`bounded`] around a step that holds the whole
//!   disk's BSD lock and waits out udevd (`crate::disk::gpt::wholedisk`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::disk::gpt;
use crate::error::{Error, LayoutError, Result};

/// Each label write or BLKPG call (a few sectors, or one ioctl) must finish within this.
pub const LABEL_DEADLINE: Duration = Duration::from_secs(30);

/// One async lock per pool device id, made on first use (a node has a handful of drives).
/// Clones share the locks (a job that outlives its call holds its device through one).
#[derive(Default, Clone)]
pub struct DeviceLocks(Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>);

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
    LayoutError::DeviceStuck {
        what: what.to_owned(),
        device: device.to_owned(),
    }
    .into()
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
    LayoutError::Overran {
        what: what.to_owned(),
        device: device.to_owned(),
        after,
    }
    .into()
}

/// One lock per device path, held by the thread of each label call while it runs.
static RUNNING: LazyLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = LazyLock::new(Mutex::default);

fn running(device: &Path) -> Arc<Mutex<()>> {
    let mut map = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(map.entry(device.to_owned()).or_default())
}

/// Runs `f` once no earlier label call on `device` is still running on its thread.
fn serially<T>(device: &Path, f: impl FnOnce() -> T) -> T {
    let turn = running(device);
    let _turn = turn.lock().unwrap_or_else(|e| e.into_inner());
    f()
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
    let (tx, rx) = tokio::sync::oneshot::channel();
    let fate = start(device, what, f, move |r| drop(tx.send(r)))?;
    let got = tokio::time::timeout(deadline, rx)
        .await
        .ok()
        .map(Result::ok);
    finish(&fate, device, what, deadline, got)
}

/// [`bounded`] for the synchronous paths (locating a volume's partition for stage).
pub fn bounded_sync<T: Send + 'static>(
    device: &Path,
    what: &'static str,
    deadline: Duration,
    f: impl FnOnce() -> gpt::Result<T> + Send + 'static,
) -> Result<T> {
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel();
    let fate = start(device, what, f, move |r| drop(tx.send(r)))?;
    let got = match rx.recv_timeout(deadline) {
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => Some(None),
        Ok(r) => Some(Some(r)),
    };
    finish(&fate, device, what, deadline, got)
}

/// Starts `f` on its own thread, serialized per device; `deliver` hands its result to
/// the waiting caller (async or not).
fn start<T: Send + 'static>(
    device: &Path,
    what: &'static str,
    f: impl FnOnce() -> gpt::Result<T> + Send + 'static,
    deliver: impl FnOnce(gpt::Result<T>) + Send + 'static,
) -> Result<Shared> {
    let fate = enter(device, what)?;
    let (theirs, dev) = (Arc::clone(&fate), device.to_owned());
    spawn(what, move || {
        let r = serially(&dev, f);
        returned(&theirs, &dev, what);
        deliver(r);
    })?;
    Ok(fate)
}

/// What the caller answers: `got` is None when `deadline` passed, Some(None) when the
/// thread ended without a result.
fn finish<T>(
    fate: &Shared,
    device: &Path,
    what: &'static str,
    deadline: Duration,
    got: Option<Option<gpt::Result<T>>>,
) -> Result<T> {
    match got {
        None => Err(timed_out(fate, device, what, deadline)),
        Some(None) => Err(LayoutError::ThreadDied { what }.into()),
        Some(Some(r)) => r.map_err(Error::from),
    }
}

/// How long a step may keep trying while udevd has the disk: half the deadline at most,
/// so a settled step still answers before it.
fn window(deadline: Duration) -> Duration {
    gpt::wholedisk::SETTLE.min(deadline / 2)
}

/// `step` under the disk's lock within `within`; a step that had to wait for udevd says
/// so in the log (how often the rig's runs needed the retries at all).
fn locked_step<T>(
    device: &Path,
    what: &str,
    within: Duration,
    step: impl Fn() -> gpt::Result<T>,
) -> gpt::Result<T> {
    let (result, tries) = gpt::wholedisk::settled_counting(device, within, step);
    if tries > 1 {
        tracing::info!(device = %device.display(), what, tries, ok = result.is_ok(), "label step tried again while udevd had the disk");
    }
    result
}

/// A label write or BLKPG step on whole disk `device` under its lock, tried again while
/// udevd has the disk (`gpt::wholedisk::settled`), on its own thread within
/// `deadline` ([`bounded`]). Every label step of the partition and stripe layouts runs
/// through this (or [`settled_sync`]).
pub async fn settled<T: Send + 'static>(
    device: &Path,
    what: &'static str,
    deadline: Duration,
    step: impl Fn() -> gpt::Result<T> + Send + 'static,
) -> Result<T> {
    let dev = device.to_owned();
    let within = window(deadline);
    bounded(device, what, deadline, move || {
        locked_step(&dev, what, within, step)
    })
    .await
}

/// [`settled`] for the synchronous paths (locating a volume's partition for stage).
pub fn settled_sync<T: Send + 'static>(
    device: &Path,
    what: &'static str,
    deadline: Duration,
    step: impl Fn() -> gpt::Result<T> + Send + 'static,
) -> Result<T> {
    let dev = device.to_owned();
    let within = window(deadline);
    bounded_sync(device, what, deadline, move || {
        locked_step(&dev, what, within, step)
    })
}

fn spawn(what: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name("gds-csi-label".into())
        .spawn(f)
        .map(drop)
        .map_err(|e| {
            LayoutError::NoThread {
                what: what.to_owned(),
                why: e.to_string(),
            }
            .into()
        })
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
            matches!(&err, Error::Layout(LayoutError::Overran { .. }) if err.to_string().contains("100ms")),
            "{err}"
        );
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = Arc::clone(&ran);
        let again = bounded(&d, "BLKPG add", Duration::from_secs(5), move || {
            r2.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await;
        assert!(matches!(
            &again,
            Err(Error::Layout(LayoutError::DeviceStuck { .. }))
        ));
        assert_eq!(again.unwrap_err().code(), tonic::Code::Aborted);
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
        assert!(
            matches!(err, Error::Layout(LayoutError::Overran { .. })),
            "{err}"
        );
        std::thread::sleep(Duration::from_millis(600));
        assert!(!stuck().contains(&d), "freed when it returned");
        let e = bounded_sync(&d, "w", Duration::from_secs(5), || -> gpt::Result<()> {
            Err(gpt::Error::NotInLabel("3".into()))
        });
        assert!(matches!(e, Err(Error::Label(gpt::Error::NotInLabel(_)))));
    }

    /// A caller dropped mid-write (a cancelled gRPC call) frees its device lock, but the
    /// next label call on the device still runs only after that write has returned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_call_s_write_finishes_before_the_next_one_runs() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let d = dev("cancel");
        let order = Arc::new(AtomicU32::new(0));
        let (first_at, o1) = (Arc::new(AtomicU32::new(0)), Arc::clone(&order));
        let f1 = Arc::clone(&first_at);
        let (d1, long) = (d.clone(), Duration::from_secs(10));
        let first = tokio::spawn(async move {
            bounded(&d1, "w1", long, move || {
                std::thread::sleep(Duration::from_millis(500));
                f1.store(o1.fetch_add(1, SeqCst) + 1, SeqCst);
                Ok(())
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        first.abort();
        let o2 = Arc::clone(&order);
        let second = bounded(&d, "w2", long, move || Ok(o2.fetch_add(1, SeqCst) + 1)).await;
        assert_eq!(second.unwrap(), 2, "ran after the cancelled call's write");
        assert_eq!(first_at.load(SeqCst), 1);
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
