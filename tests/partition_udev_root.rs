//! Root-only: the partition layout honours systemd's block device locking convention
//! (<https://systemd.io/BLOCK_DEVICE_LOCKING/>, `src/partition/wholedisk.rs`) on a real
//! loop device. A udevd worker probing a partition holds `flock(LOCK_SH)` on the whole
//! disk and the partition open (systemd 252 src/udev/udevd.c worker_lock_block_device,
//! then blkid); the kernel refuses BLKPG delete meanwhile (EBUSY). DeleteVolume must wait
//! for the probe to end and succeed, not fail with the kernel's EBUSY (what the VM rig's
//! csi-sanity run saw on Debian's kernel with systemd-udevd before the fix).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::*;
use gds_csi::partition::kernel;

mod common;
use common::{requests, PartRig};

const MIB: u64 = 1 << 20;
/// How long the stand-in for udevd's worker holds the disk.
const PROBE: Duration = Duration::from_millis(1500);

fn create_req(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![requests::single_writer_mount()],
        parameters: [
            ("gdsPolicy".to_string(), "disabled".to_string()),
            ("layout".to_string(), "partition".to_string()),
        ]
        .into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

/// What a udevd worker does while it probes `node`: LOCK_SH on the whole disk, the
/// partition open; both let go after `hold` (the partition first, as blkid returns
/// before the worker's lock is dropped). Returns once both are taken.
fn probe_like_udevd(disk: &Path, node: &Path, hold: Duration) -> std::thread::JoinHandle<()> {
    let lock = File::open(disk).unwrap();
    // SAFETY: flock on a descriptor this test owns; no memory is passed.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH) }, 0);
    let part = File::open(node).unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        drop(part);
        drop(lock);
    })
}

fn only_partition(disk: &Path) -> PathBuf {
    let parts = kernel::list(disk).unwrap();
    assert_eq!(parts.len(), 1, "{parts:?}");
    Path::new("/dev").join(&parts[0].name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_waits_for_a_udev_probe_instead_of_failing_ebusy() {
    let Some(mut rig) = PartRig::with_size(1, 64 * MIB) else {
        return;
    };
    let disk = rig.loops[0].clone();
    let mut c = rig.start().await;
    let v = requests::create_volume(&mut c, create_req("udev-probed", 16 * MIB)).await;
    let node = only_partition(&disk);

    // The probe really blocks a bare BLKPG delete: the kernel says EBUSY.
    let number = kernel::list(&disk).unwrap()[0].number;
    let probe = probe_like_udevd(&disk, &node, Duration::from_millis(300));
    let bare = kernel::delete(&disk, number).unwrap_err();
    assert!(bare.to_string().contains("busy"), "{bare}");
    probe.join().unwrap();

    let probe = probe_like_udevd(&disk, &node, PROBE);
    let began = Instant::now();
    let done = c
        .controller
        .delete_volume(requests::delete_request(&v.volume_id))
        .await;
    let took = began.elapsed();
    probe.join().unwrap();
    assert!(done.is_ok(), "DeleteVolume during a probe: {done:?}");
    assert!(
        took >= PROBE - Duration::from_millis(300),
        "answered after {took:?}, before the probe let go of the disk"
    );
    assert!(kernel::list(&disk).unwrap().is_empty(), "partition left");
    assert!(rig.state()["volumes"].get(&v.volume_id).is_none());
}
