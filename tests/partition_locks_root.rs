//! Root-only: the partition layout's per-device lock on real loop devices.
//! A device held busy (its lock taken, as a long erase or label change holds it) never
//! delays a create or delete on another device, while work on the busy device waits its
//! turn; parallel creates on one device carve partitions that never overlap, each with
//! its own record (checked against the label as `sfdisk -J` reads it).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::frozen::FrozenDevice;
use gds_csi::csi::id::BlockVolumeId;
use gds_csi::disk::gpt::kernel;
use gds_csi::error::{Error, LayoutError};
use gds_csi::os::{FsType, Host, RealHost};
use gds_csi::pool::{AllocationRequest, Pool, PoolConfig};
use gds_csi::volume::block::partition::Partitioned;
use gds_csi::volume::block::Layout;

const MIB: u64 = 1 << 20;

/// Loop devices for one test; their partitions leave the kernel before they are
/// detached (a plain loop device keeps them after `losetup -d`).
struct Devices {
    dir: tempfile::TempDir,
    loops: Vec<PathBuf>,
}

impl Devices {
    fn new(sizes: &[u64]) -> Option<Devices> {
        if !common::is_root() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-locks-")
            .tempdir_in("/tmp")
            .unwrap();
        let loops = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let img = dir.path().join(format!("dev{i}.img"));
                std::fs::File::create(&img).unwrap().set_len(*size).unwrap();
                common::attach_loop(&img)
            })
            .collect();
        Some(Devices { dir, loops })
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        for dev in &self.loops {
            for p in kernel::list(dev).unwrap_or_default() {
                for _ in 0..50 {
                    if kernel::delete(dev, p.number).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            common::detach_loop(dev);
        }
    }
}

fn host() -> Arc<dyn Host> {
    Arc::new(RealHost {
        command_timeout: Duration::from_secs(30),
        mount_timeout: Duration::from_secs(30),
    })
}

/// The layout over `devs`, as the driver builds it (listed devices, real host).
fn layout(devs: &Devices, host: &Arc<dyn Host>) -> Arc<Partitioned> {
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: "/sys".into(),
        host_dev: "/dev".into(),
        listed: devs.loops.clone(),
        nvme_discover: false,
        state_dir: devs.dir.path().join("state"),
    })
    .unwrap();
    pool.rescan(&host.mount_table().unwrap());
    Arc::new(Partitioned::new(Arc::new(pool)))
}

fn req(name: &str, bytes: u64) -> AllocationRequest {
    AllocationRequest {
        name: name.into(),
        required_bytes: bytes,
        limit_bytes: 0,
        fs_type: FsType::Ext4,
        parameters: BTreeMap::from([("layout".into(), "partition".into())]),
        source: None,
    }
}

/// The pool device id a volume was carved from.
async fn create(
    p: &Partitioned,
    host: &Arc<dyn Host>,
    name: &str,
    bytes: u64,
) -> (BlockVolumeId, String) {
    let (id, rec) = p.allocate(host.as_ref(), &req(name, bytes)).await.unwrap();
    (id, rec.device_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_device_never_delays_work_on_another() {
    let Some(devs) = Devices::new(&[256 * MIB, 256 * MIB]) else {
        return;
    };
    let host = host();
    let p = layout(&devs, &host);
    let (first, busy_dev) = create(&p, &host, "first", 32 * MIB).await;
    // The device holding `first` is busy (as a long erase keeps it) until `held` drops.
    let held = p.device_lock(&busy_dev).await;

    let began = Instant::now();
    let other = tokio::time::timeout(
        Duration::from_secs(20),
        create(&p, &host, "second", 32 * MIB),
    )
    .await
    .expect("a create must not wait for another device's lock");
    assert_ne!(other.1, busy_dev, "carved on the free device");
    let took = began.elapsed();

    // Work on the busy device waits its turn: a delete of `first` and a create that fits
    // only there once `first` is gone (the free device has under 224 MiB left).
    let (h, p2, f) = (Arc::clone(&host), Arc::clone(&p), first.clone());
    let delete = tokio::spawn(async move { p2.release(&h, &f, &h.mount_table().unwrap()).await });
    // The lock is fair: the delete, queued first, goes first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (h, p2) = (Arc::clone(&host), Arc::clone(&p));
    let big = tokio::spawn(async move { create(&p2, &h, "big", 230 * MIB).await });
    // Meanwhile the free device still serves at once.
    let third = tokio::time::timeout(
        Duration::from_secs(20),
        create(&p, &host, "third", 16 * MIB),
    )
    .await
    .expect("a create on the free device while others wait on the busy one");
    assert_eq!(third.1, other.1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !delete.is_finished(),
        "the delete waited for the busy device"
    );
    assert!(
        !big.is_finished(),
        "the create that fits only there waited too"
    );
    drop(held);
    let deleted = tokio::time::timeout(Duration::from_secs(60), delete).await;
    deleted
        .expect("delete finished once the device was free")
        .unwrap()
        .unwrap();
    let big = tokio::time::timeout(Duration::from_secs(60), big).await;
    let big = big
        .expect("create finished once the device was free")
        .unwrap();
    assert_eq!(big.1, busy_dev, "the only device with room");
    println!("create on the free device while the other was held: {took:?}");
}

/// `sfdisk -J`'s partitions of `dev`: (start sector, sectors, name, PARTUUID).
fn sfdisk_partitions(dev: &std::path::Path) -> Vec<(u64, u64, String, String)> {
    let out = common::run("sfdisk", &["-J", dev.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["partitiontable"]["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["start"].as_u64().unwrap(),
                p["size"].as_u64().unwrap(),
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["uuid"].as_str().unwrap_or_default().to_lowercase(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_creates_on_one_device_never_overlap() {
    const N: u64 = 8;
    let Some(devs) = Devices::new(&[512 * MIB]) else {
        return;
    };
    let host = host();
    let p = layout(&devs, &host);
    let began = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let (p, h) = (Arc::clone(&p), Arc::clone(&host));
            tokio::spawn(async move {
                let (id, rec) = p
                    .allocate(h.as_ref(), &req(&format!("pv-{i}"), (8 + 4 * i) * MIB))
                    .await?;
                Ok::<_, gds_csi::error::Error>((id, rec))
            })
        })
        .collect();
    let mut made = Vec::new();
    for t in tasks {
        made.push(t.await.unwrap().expect("every create fits"));
    }
    println!("{N} parallel creates on one device: {:?}", began.elapsed());
    let parts = sfdisk_partitions(&devs.loops[0]);
    assert_eq!(parts.len() as u64, N, "one partition per create: {parts:?}");
    let mut spans: Vec<_> = parts.iter().map(|(s, l, _, _)| (*s, *l)).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "overlapping partitions: {spans:?}"
        );
    }
    let uuids: HashSet<_> = made
        .iter()
        .map(|(_, r)| r.partition.as_ref().unwrap().partuuid.to_lowercase())
        .collect();
    let numbers: HashSet<_> = made
        .iter()
        .map(|(_, r)| r.partition.as_ref().unwrap().number)
        .collect();
    assert_eq!(
        (uuids.len(), numbers.len()),
        (N as usize, N as usize),
        "distinct records"
    );
    for (id, rec) in &made {
        let part = rec.partition.as_ref().unwrap();
        let on_disk = parts
            .iter()
            .find(|(_, _, _, u)| *u == part.partuuid.to_lowercase());
        let (_, sectors, name, _) = on_disk.unwrap_or_else(|| panic!("{id}: not in the label"));
        assert_eq!(sectors * 512, rec.capacity_bytes, "{id}: size");
        assert_eq!(&id.allocation, name, "{id}: partition named {name}");
        assert!(kernel::list(&devs.loops[0])
            .unwrap()
            .iter()
            .any(|k| k.number == part.number));
    }
}

/// A label write that blocks in the kernel answers Aborted at its deadline; the device is
/// refused at once (nothing run) while that write is still blocked; once it returns, the
/// retried create finishes the same volume, and the label holds no partition twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_write_blocked_in_the_kernel_answers_at_its_deadline() {
    let Some(f) = FrozenDevice::new(64 * MIB) else {
        return;
    };
    let host = host();
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: "/sys".into(),
        host_dev: "/dev".into(),
        listed: vec![f.dev.clone()],
        nvme_discover: false,
        state_dir: f.dir.path().join("state"),
    })
    .unwrap();
    pool.rescan(&host.mount_table().unwrap());
    let deadline = Duration::from_secs(2);
    let p = Partitioned::new(Arc::new(pool)).with_label_deadline(deadline);
    create(&p, &host, "first", 8 * MIB).await;

    f.freeze(true);
    let began = Instant::now();
    let err = p
        .allocate(host.as_ref(), &req("second", 8 * MIB))
        .await
        .unwrap_err();
    let took = began.elapsed();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::Layout(LayoutError::Overran { .. })),
        "{err:?}"
    );
    assert_eq!(err.code(), tonic::Code::Aborted);
    assert!(msg.contains("did not finish within 2s"), "{msg}");
    assert!(
        took < deadline + Duration::from_secs(3),
        "answered at the deadline: {took:?}"
    );
    let began = Instant::now();
    let again = p.allocate(host.as_ref(), &req("third", 8 * MIB)).await;
    let Err(refused @ Error::Layout(LayoutError::DeviceStuck { .. })) = &again else {
        panic!("the device must be refused while the write is blocked: {again:?}")
    };
    let why = refused.to_string();
    assert!(why.contains("an earlier label write"), "{why}");
    assert!(began.elapsed() < Duration::from_secs(1), "refused at once");

    f.freeze(false);
    let mut retried = None;
    for _ in 0..50 {
        match p.allocate(host.as_ref(), &req("second", 8 * MIB)).await {
            Ok(v) => {
                retried = Some(v);
                break;
            }
            Err(Error::Layout(LayoutError::DeviceStuck { .. } | LayoutError::Overran { .. })) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("retry after the thaw: {e}"),
        }
    }
    let (_, rec) = retried.expect("the device is free once the write returned");
    assert!(rec.partition.is_some());
    let parts = sfdisk_partitions(&f.dev);
    assert_eq!(parts.len(), 2, "first and second, once each: {parts:?}");
    println!("blocked label write answered after {took:?} (deadline {deadline:?})");
}
