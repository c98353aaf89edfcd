//! Root-only: the partition layout honours systemd's block device locking convention
//! (<https://systemd.io/BLOCK_DEVICE_LOCKING/>, `src/disk/gpt/wholedisk.rs`) on a real
//! loop device. A udevd worker probing a partition holds `flock(LOCK_SH)` on the whole
//! disk and the partition open (systemd 252 src/udev/udevd.c worker_lock_block_device,
//! then blkid); the kernel refuses BLKPG delete meanwhile (EBUSY). DeleteVolume must wait
//! for the probe to end and succeed, not fail with the kernel's EBUSY (what the VM rig's
//! csi-sanity run saw on Debian's kernel with systemd-udevd before the fix).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::*;
use gds_csi::disk::gpt::kernel;

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

/// What udevd's table re-read does to a disk whose label was just written (after the
/// writer let go of the lock; `src/disk/gpt/wholedisk.rs`): the kernel drops partition
/// `number` and adds it again from the label, at the same place but, as an NVMe's
/// partitions get, at a new minor. The freed minor is held by a partition of `other`
/// meanwhile so the new one cannot reuse it. Returns the (old, new) device numbers.
fn recreate_at_new_minor(disk: &Path, other: &Path, number: u32) -> ((u32, u32), (u32, u32)) {
    let lock = File::open(disk).unwrap();
    // SAFETY: flock on a descriptor this test owns; no memory is passed.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let part = kernel::list(disk)
        .unwrap()
        .into_iter()
        .find(|p| p.number == number)
        .unwrap();
    let span = gds_csi::disk::gpt::alloc::Extent {
        start: part.start,
        len: part.len,
    };
    kernel::delete(disk, number).unwrap();
    let holder = gds_csi::disk::gpt::alloc::Extent {
        start: MIB,
        len: MIB,
    };
    kernel::add(other, 1, holder).unwrap();
    kernel::add(disk, number, span).unwrap();
    kernel::delete(other, 1).unwrap();
    let now = kernel::list(disk)
        .unwrap()
        .into_iter()
        .find(|p| p.number == number)
        .unwrap();
    // The node must be there before the driver looks again (udevd would make it).
    let node = Path::new("/dev").join(&now.name);
    let deadline = Instant::now() + Duration::from_secs(5);
    while gds_csi::os::blockdev::devnum_of(&node).ok() != Some(now.dev) {
        assert!(Instant::now() < deadline, "{} not re-made", node.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    (part.dev, now.dev)
}

/// The VM rig's flake: NodeStage located a partition, then udevd's re-read (set off by
/// CreateVolume's label write) re-created it at a new minor before the stage checked the
/// device: "… is not the device allocated", a FailedPrecondition for a healthy volume.
/// The check now tells a partition that moved (recorded size, at another number) from a
/// different device, and locates a moved one again by its PARTUUID; a partition of
/// another size at that name is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_recreated_at_a_new_minor_is_located_again_not_refused() {
    use gds_csi::error::{Error, VolumeError};
    use gds_csi::os::{FsType, Host, RealHost};
    use gds_csi::pool::{AllocationRequest, Pool, PoolConfig};
    use gds_csi::volume::block::Layout;
    use gds_csi::volume::block::{BlockBackend, NodeIdentity};
    use gds_csi::volume::mounts::Mounter;
    use std::sync::Arc;

    let Some(rig) = PartRig::with_size(2, 64 * MIB) else {
        return;
    };
    let (disk, other) = (rig.loops[0].clone(), rig.loops[1].clone());
    let host: Arc<dyn Host> = Arc::new(RealHost {
        command_timeout: Duration::from_secs(30),
        mount_timeout: Duration::from_secs(30),
    });
    let pool = Arc::new(
        Pool::open(PoolConfig {
            node_id: "node-a".into(),
            host_sys: "/sys".into(),
            host_dev: "/dev".into(),
            listed: vec![disk.clone()],
            nvme_discover: false,
            state_dir: rig.dir.path().join("lib-state"),
        })
        .unwrap(),
    );
    pool.rescan(&host.mount_table().unwrap());
    let backend = BlockBackend::new(
        Mounter::new(Arc::clone(&host), vec![rig.dir.path().to_owned()]),
        Arc::clone(&pool),
        NodeIdentity {
            node_id: "node-a".into(),
            topology_key: "gds.csi.example/node".into(),
        },
    );
    let layout = gds_csi::volume::block::partition::Partitioned::new(Arc::clone(&pool));
    let (id, _) = layout
        .allocate(
            host.as_ref(),
            &AllocationRequest {
                name: "renumbered".into(),
                required_bytes: 16 * MIB,
                limit_bytes: 0,
                fs_type: FsType::Ext4,
                parameters: [("layout".to_string(), "partition".to_string())].into(),
                source: None,
            },
        )
        .await
        .unwrap();

    let mut located = backend.locate(&id).unwrap();
    let number = kernel::list(&disk).unwrap()[0].number;
    let (old, new) = recreate_at_new_minor(&disk, &other, number);
    assert_ne!(old, new, "the partition must come back at another minor");
    assert_eq!((located.device.major, located.device.minor), old);

    // The bare identity check sees the move and says so (it never acts on it).
    let raw = id.to_string();
    match pool.verify_identity(&raw, &located.device, &located.record) {
        Err(Error::Volume(VolumeError::DeviceMoved { .. })) => {}
        other => panic!("a moved partition must be told apart: {other:?}"),
    }
    backend.verify_located(&mut located).unwrap();
    assert_eq!((located.device.major, located.device.minor), new);

    // A different partition at that name (another size) is refused, not located again.
    let lock = File::open(&disk).unwrap();
    // SAFETY: flock on a descriptor this test owns; no memory is passed.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let part = kernel::list(&disk).unwrap()[0].clone();
    kernel::delete(&disk, number).unwrap();
    let smaller = gds_csi::disk::gpt::alloc::Extent {
        start: part.start,
        len: part.len / 2,
    };
    kernel::add(&disk, number, smaller).unwrap();
    drop(lock);
    let refused = backend.verify_located(&mut located).unwrap_err();
    let msg = refused.to_string();
    assert!(msg.contains("is not the device allocated"), "{msg}");
}
