//! The whole-disk lock of systemd's block device locking convention, and the settle
//! retries around it: the one place every label write and BLKPG call of the partition and
//! stripe layouts goes through ([`settled`]).
//!
//! The convention (<https://systemd.io/BLOCK_DEVICE_LOCKING/>): a program changing a
//! disk's partition table holds a BSD `flock(LOCK_EX)` on the whole disk's node. What
//! systemd-udevd does about it (systemd-stable tag v252.31, the series of Debian 12's udev
//! 252.39; src/udev/udevd.c unless named):
//! - `worker_process_device` (udevd.c:602, :621-623) calls `worker_lock_whole_disk`
//!   (udevd.c:516), which takes `flock(LOCK_SH|LOCK_NB)` (udevd.c:547) on the whole disk
//!   (`device_get_whole_disk`, udevd.c:468/490: a partition maps to its parent) before the
//!   rules (blkid probe included) run for the disk *or any of its partitions*, and holds
//!   it while they run. When the disk is locked the event is answered
//!   `EVENT_RESULT_TRY_AGAIN` and requeued (udevd.c:1219, `event_requeue` :999), tried
//!   again every 200 ms for up to 3 min (udevd.c:77-78). So taking LOCK_EX waits for a
//!   running probe (which holds a partition open: BLKPG delete EBUSY) to end, and no
//!   probe starts while we hold it.
//! - `on_inotify` (udevd.c:1404) → `synthesize_change` (udevd.c:1363, :1448): after a
//!   writer closes the disk node (IN_CLOSE_WRITE), `blockdev_reread_partition_table`
//!   (src/shared/blockdev-util.c:832) takes `flock(LOCK_EX|LOCK_NB)` (:843) and re-reads
//!   the table (BLKRRPART, :846); with a kernel GPT parser that drops every partition of
//!   the disk and adds them again (block/partitions/core.c bdev_disk_changed; refused
//!   while one is open), so for a moment the kernel shows none (NotFound) or lists one
//!   whose /dev node is not there yet (ENOENT). While the lock is held udevd skips the
//!   re-read and only synthesises "change" events (which its workers requeue as above).
//!   Taking LOCK_EX also waits for a re-read in progress: udevd holds the lock across it.
//!
//! So each step holds LOCK_EX on the disk from before it reads the kernel's view to after
//! its last BLKPG call; the label is written through a second descriptor (`label::write`
//! sees the lock is held by this thread and takes none of its own) and closed while the
//! lock is still held. (Before, only the label write held it: its close let go of the lock
//! and told udevd at once, and udevd's re-read raced the BLKPG add that followed: the 7
//! csi-sanity failures on the VM rig.) What remains (a re-read started after we let go, a probe of a
//! program that ignores the convention) is waited out: a step that failed only for such a
//! moment is tried again, with the lock let go in between, until the window ends.
//! Everything here is blocking: callers run it on a thread of its own under a deadline
//! (`block::partition::guard`).

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{Error, Result};

/// How long a step keeps trying while udevd holds the disk (3 s was seen on the VM rig).
pub const SETTLE: Duration = Duration::from_secs(10);
/// The pause between tries: udevd's own retry interval.
const PAUSE: Duration = Duration::from_millis(200);
/// How often a wait for the lock looks again.
const POLL: Duration = Duration::from_millis(10);

thread_local! {
    /// The nodes (filesystem, inode: a flock belongs to the inode) this thread holds
    /// the lock of.
    static HELD: RefCell<Vec<Node>> = const { RefCell::new(Vec::new()) };
}

/// LOCK_EX on a whole disk's node, let go when dropped (the descriptor closes).
#[derive(Debug)]
pub struct DiskLock {
    /// None when this thread held the disk already (the outer lock lets go).
    file: Option<File>,
    node: Node,
}

type Node = (u64, u64);

fn node_of(meta: &std::fs::Metadata) -> Node {
    (meta.dev(), meta.ino())
}

impl DiskLock {
    /// Takes the lock on whole disk `device`, waiting up to `patience` for udevd or
    /// another program that holds it. Re-entrant on one thread.
    pub fn take(device: &Path, patience: Duration) -> Result<DiskLock> {
        let file = File::open(device).map_err(|e| Error::io("opening", device, e))?;
        let meta = file.metadata().map_err(|e| Error::io("stat", device, e))?;
        let node = node_of(&meta);
        if held_node(node) {
            return Ok(DiskLock { file: None, node });
        }
        flock_patiently(&file, device, patience)?;
        HELD.with(|h| h.borrow_mut().push(node));
        Ok(DiskLock {
            file: Some(file),
            node,
        })
    }
}

impl Drop for DiskLock {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            HELD.with(|h| h.borrow_mut().retain(|n| *n != self.node));
        }
    }
}

fn held_node(node: Node) -> bool {
    HELD.with(|h| h.borrow().contains(&node))
}

/// Whether this thread holds the lock of the disk `file` is open on (`label::write`
/// then takes none of its own: a second descriptor's flock would wait for ours).
pub fn held_here(file: &File) -> bool {
    file.metadata().is_ok_and(|m| held_node(node_of(&m)))
}

/// `flock(LOCK_EX)` on `file`, waiting up to `patience` (polled: a blocking flock could
/// not be given up at a deadline).
pub fn flock_patiently(file: &File, device: &Path, patience: Duration) -> Result<()> {
    let until = Instant::now() + patience;
    loop {
        // SAFETY: flock on a descriptor the caller owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || Instant::now() >= until {
            return Err(Error::io(
                "locking the whole disk (udevd or another program holds its lock)",
                device,
                e,
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Runs `step` on whole disk `device` under its lock, and again (the lock let go in
/// between, so udevd can finish) while it fails only for one of udevd's moments
/// ([`transient`]), until `window` has passed; then its last answer.
pub fn settled<T>(device: &Path, window: Duration, step: impl Fn() -> Result<T>) -> Result<T> {
    settled_counting(device, window, step).0
}

/// [`settled`], with how many times the step ran (1 when udevd never got in the way).
pub fn settled_counting<T>(
    device: &Path,
    window: Duration,
    step: impl Fn() -> Result<T>,
) -> (Result<T>, u32) {
    let until = Instant::now() + window;
    let mut tries = 0;
    loop {
        tries += 1;
        let patience = until.saturating_duration_since(Instant::now());
        let result = DiskLock::take(device, patience.max(PAUSE)).and_then(|lock| {
            let r = step();
            drop(lock);
            r
        });
        if !transient(&result, device) || Instant::now() + PAUSE >= until {
            return (result, tries);
        }
        std::thread::sleep(PAUSE);
    }
}

/// Whether a step failed only because udevd had the disk for a moment: the kernel
/// refused a BLKPG call (EBUSY: a probe holds the partition open, or a re-read added it
/// first), showed none of the disk's partitions (a re-read in progress), or listed one
/// whose node devtmpfs had not made yet (ENOENT on a partition node, never the disk).
pub fn transient<T>(result: &Result<T>, disk: &Path) -> bool {
    match result {
        Err(Error::Kernel { source, .. }) => source.raw_os_error() == Some(libc::EBUSY),
        Err(Error::NotInKernel { .. }) => true,
        Err(Error::Io { device, source, .. }) => {
            device.as_path() != disk && source.raw_os_error() == Some(libc::ENOENT)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn io(device: &str, errno: i32) -> Result<()> {
        Err(Error::Io {
            what: "stat",
            device: device.into(),
            source: std::io::Error::from_raw_os_error(errno),
        })
    }

    fn busy() -> Result<()> {
        Err(Error::Kernel {
            op: "delete",
            number: 1,
            device: "/dev/x".into(),
            hint: "",
            source: std::io::Error::from_raw_os_error(libc::EBUSY),
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
        assert!(transient(&busy(), disk));
        let gone = Error::NotInKernel {
            number: 1,
            device: disk.to_owned(),
        };
        assert!(transient::<()>(&Err(gone), disk));
        assert!(!transient::<()>(&Err(Error::NotInLabel("3".into())), disk));
        assert!(!transient(&Ok(()), disk));
    }

    /// flock(`op`) on `file`; true when it was granted.
    fn flock(file: &File, op: libc::c_int) -> bool {
        // SAFETY: flock on a descriptor the test owns; no memory is passed.
        unsafe { libc::flock(file.as_raw_fd(), op) == 0 }
    }

    /// A real file stands in for the disk: flock works on any file.
    fn disk() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::write(&path, b"").unwrap();
        (dir, path)
    }

    /// Another holder (udevd's LOCK_SH, on another descriptor) makes the step wait
    /// until it lets go; the step runs with the lock held, and the lock is let go after.
    #[test]
    fn a_step_waits_for_another_holder_and_runs_under_the_lock() {
        let (_dir, path) = disk();
        let other = File::open(&path).unwrap();
        assert!(flock(&other, libc::LOCK_SH));
        let began = Instant::now();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(other);
        });
        let probe = File::open(&path).unwrap();
        let held = settled(&path, Duration::from_secs(5), || {
            Ok(!flock(&probe, libc::LOCK_SH | libc::LOCK_NB)
                && held_here(&File::open(&path).unwrap()))
        });
        release.join().unwrap();
        assert!(
            held.unwrap(),
            "udevd's LOCK_SH is refused while the step runs"
        );
        assert!(
            began.elapsed() >= Duration::from_millis(250),
            "waited for the holder"
        );
        assert!(
            !held_here(&File::open(&path).unwrap()),
            "let go after the step"
        );
        assert!(flock(&probe, libc::LOCK_SH | libc::LOCK_NB));
    }

    /// A transient failure is tried again until it passes; a lasting one ends at the
    /// window; anything else is answered at once.
    #[test]
    fn transient_failures_are_tried_again_within_the_window() {
        let (_dir, path) = disk();
        let tries = Cell::new(0);
        let r = settled(&path, Duration::from_secs(5), || {
            tries.set(tries.get() + 1);
            if tries.get() < 3 {
                busy()
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok() && tries.get() == 3, "{r:?} after {}", tries.get());
        let began = Instant::now();
        assert!(settled(&path, Duration::from_millis(700), busy).is_err());
        let took = began.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{took:?}"
        );
        tries.set(0);
        let r = settled(&path, Duration::from_secs(5), || {
            tries.set(tries.get() + 1);
            io("/dev/x", libc::EIO)
        });
        assert!(r.is_err() && tries.get() == 1);
    }

    /// A lock held elsewhere past the window is an error naming the disk, in time.
    #[test]
    fn a_lock_never_let_go_ends_at_the_window() {
        let (_dir, path) = disk();
        let other = File::open(&path).unwrap();
        assert!(flock(&other, libc::LOCK_EX));
        let began = Instant::now();
        let err = settled(&path, Duration::from_millis(500), || Ok(())).unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(3));
        assert!(err.to_string().contains("locking the whole disk"), "{err}");
        // Re-entrant on one thread: a nested take never waits for the outer one.
        drop(other);
        let outer = DiskLock::take(&path, Duration::from_secs(1)).unwrap();
        let inner = DiskLock::take(&path, Duration::from_millis(50)).unwrap();
        drop(inner);
        assert!(
            held_here(&File::open(&path).unwrap()),
            "the outer lock still holds"
        );
        drop(outer);
    }
}
