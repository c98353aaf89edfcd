//! Root-only: the `stripe` block layout's controller side through the real
//! binary on four real loop devices: equal member partitions on distinct devices,
//! GetCapacity's maximum for a stripe class, ResourceExhausted counting the devices with
//! room, bad geometry refused before anything changes, and DeleteVolume that refuses a
//! member carrying a foreign signature (nothing erased) and otherwise zeroes and removes
//! every member; ControllerExpandVolume refused (OutOfRange) since stripes do not grow.
//! At the layout level: a device whose lock is held never stalls a stripe over other
//! devices, and namespaces of one NVMe controller count once. And mkfs through the host port aligns xfs and ext4 to the stripe geometry.
//! (This machine has no md driver and no mdadm: NodeStage is refused here; arrays are
//! the VM rig's business.)
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::disk::gpt::kernel;
use gds_csi::os::{FsType, Host, RealHost, StripeGeometry};
use gds_csi::pool::{AllocationRequest, Pool, PoolConfig};
use gds_csi::request::StripeParams;
use gds_csi::volume::block::partition::Partitioned;
use gds_csi::volume::block::stripe::Striped;
use gds_csi::volume::block::Layout;
use tonic::Code;

mod common;
use common::{digest_file, requests, run, LoopDevice, PartRig, Rig};

const MIB: u64 = 1 << 20;

/// Loop devices lose their partitions before they are detached, even when the test
/// fails (a plain loop device keeps them after `losetup -d`; partition/mod.rs).
fn params(count: &str, chunk: Option<&str>) -> HashMap<String, String> {
    let mut p: HashMap<String, String> = [
        ("gdsPolicy", "disabled"),
        ("layout", "stripe"),
        ("stripeCount", count),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(c) = chunk {
        p.insert("stripeChunk".into(), c.into());
    }
    p
}

fn create_req(name: &str, bytes: u64, p: HashMap<String, String>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![requests::single_writer_mount()],
        parameters: p,
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

fn expand_req(id: &str, required: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(requests::single_writer_mount()),
        ..Default::default()
    }
}

async fn maximum(c: &mut Clients, p: HashMap<String, String>) -> u64 {
    let r = c
        .controller
        .get_capacity(GetCapacityRequest {
            parameters: p,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    r.maximum_volume_size.unwrap_or(0) as u64
}

/// The partitions the kernel shows on each device: (device index, start, len, node).
fn members(rig: &Rig) -> Vec<(usize, u64, u64, String)> {
    let mut out = Vec::new();
    for (i, dev) in rig.loops.iter().enumerate() {
        for p in kernel::list(dev).unwrap() {
            out.push((i, p.start, p.len, format!("/dev/{}", p.name)));
        }
    }
    out
}

fn read_range(dev: &Path, start: u64, len: u64) -> Vec<u8> {
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_members_are_equal_partitions_on_distinct_devices_and_die_with_the_volume() {
    let Some(rig) = Rig::with_sizes(&[64 * MIB, 64 * MIB, 64 * MIB, 40 * MIB]) else {
        return;
    };
    let mut rig = PartRig(rig);
    let mut c = rig.0.start().await;
    // Four devices: the 4th-largest room (the 40 MiB device) bounds a 4-member stripe.
    let max4 = maximum(&mut c, params("4", None)).await;
    let max2 = maximum(&mut c, params("2", None)).await;
    assert!(
        max4 > 0 && max4 % (4 * MIB) == 0 && max4 < 4 * 40 * MIB,
        "{max4}"
    );
    assert!(max2 > max4 / 2 && max2 < 2 * 64 * MIB, "{max2}");

    // 2 members, 20 MiB: two 10 MiB shares + 1 MiB md offset each, on distinct devices.
    let v2 = c
        .controller
        .create_volume(create_req("s2", 20 * MIB, params("2", Some("512K"))))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v2.capacity_bytes as u64, 20 * MIB);
    assert!(v2.volume_id.ends_with(":stripe"), "{}", v2.volume_id);
    let m = members(&rig.0);
    assert_eq!(m.len(), 2, "{m:?}");
    assert_ne!(m[0].0, m[1].0, "members on one device: {m:?}");
    // Loop devices have no controller: each is its own, named in the volume context.
    let ctrls = &v2.volume_context["stripeControllers"];
    let on: Vec<&str> = ctrls.split(',').collect();
    let used: Vec<String> = m
        .iter()
        .map(|p| {
            rig.0.loops[p.0]
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(on.len(), 2, "{ctrls}");
    assert!(
        on.iter().all(|c| used.iter().any(|u| u == c)),
        "{ctrls} vs {used:?}"
    );
    assert_ne!(on[0], on[1], "{ctrls}");
    assert!(m.iter().all(|p| p.2 == 11 * MIB), "{m:?}");
    // Idempotent by name.
    let again = c
        .controller
        .create_volume(create_req("s2", 20 * MIB, params("2", Some("512K"))))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v2.volume_id);
    assert_eq!(members(&rig.0).len(), 2);

    // ControllerExpandVolume: a stripe does not grow yet; OutOfRange saying so, nothing
    // changed; its own size (a retried or no-op expand) is granted.
    let digests: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    let err = c
        .controller
        .controller_expand_volume(expand_req(&v2.volume_id, 40 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.message().contains("layout: stripe"), "{err}");
    assert!(err.message().contains("do not grow"), "{err}");
    let after: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    assert_eq!(digests, after, "a refused expand changed a device");
    let same = c
        .controller
        .controller_expand_volume(expand_req(&v2.volume_id, 20 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.capacity_bytes as u64, 20 * MIB);
    assert!(!same.node_expansion_required);

    // 4 members: one on every device.
    let v4 = c
        .controller
        .create_volume(create_req("s4", 30 * MIB, params("4", Some("1M"))))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v4.capacity_bytes as u64, 32 * MIB);
    let m = members(&rig.0);
    assert_eq!(m.len(), 6, "{m:?}");
    let mut devs: Vec<_> = m.iter().filter(|p| p.2 == 9 * MIB).map(|p| p.0).collect();
    devs.sort_unstable();
    assert_eq!(devs, vec![0, 1, 2, 3], "{m:?}");

    // Too big for four devices: the error says how many have room; nothing carved.
    let err = c
        .controller
        .create_volume(create_req("big", 4 * 50 * MIB, params("4", None)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let counted = err.message().contains("needs 4 distinct pool devices")
        && ["has 0 such", "has 1 such", "has 2 such", "has 3 such"]
            .iter()
            .any(|n| err.message().contains(n));
    assert!(counted, "{err}");
    assert_eq!(members(&rig.0).len(), 6);

    // NodeStage needs mdadm and the md driver, which this machine lacks: refused with
    // FailedPrecondition saying so, the members untouched (the VM rig stages stripes).
    let digests: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    let staging = rig.0.path("staging");
    let err = requests::stage(
        &mut c,
        &v2.volume_id,
        &staging,
        requests::single_writer_mount(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("mdadm"), "{err}");
    let after: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    assert_eq!(digests, after);
    // NodeUnpublish and NodeUnstage of a stripe never staged (no array running): OK,
    // as csi-sanity's cleanup expects.
    let target = rig.0.path("target");
    requests::unpublish(&mut c, &v2.volume_id, &target)
        .await
        .unwrap();
    requests::unstage(&mut c, &v2.volume_id, &staging)
        .await
        .unwrap();

    // A foreign filesystem on a member: delete refuses and erases no member.
    let s4_members: Vec<_> = members(&rig.0)
        .into_iter()
        .filter(|p| p.2 == 9 * MIB)
        .collect();
    let victim = &s4_members[2].3;
    run("mkfs.ext4", &["-q", "-F", victim]);
    let digests: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    let err = c
        .controller
        .delete_volume(requests::delete_request(&v4.volume_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains(victim.as_str()), "{err}");
    let after: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    assert_eq!(digests, after, "a refused delete changed a device");

    // Once the foreign signature is gone, delete zeroes and removes every member.
    run("wipefs", &["-a", "-q", victim]);
    for (_, _, _, node) in &s4_members {
        let mut f = fs::OpenOptions::new().write(true).open(node).unwrap();
        std::io::Write::write_all(&mut f, &[0xa5u8; 65536]).unwrap();
    }
    c.controller
        .delete_volume(requests::delete_request(&v4.volume_id))
        .await
        .unwrap();
    let m = members(&rig.0);
    assert_eq!(m.len(), 2, "{m:?}");
    for (i, start, len, _) in &s4_members {
        let bytes = read_range(&rig.0.loops[*i], *start, (*len).min(MIB));
        assert!(
            bytes.iter().all(|b| *b == 0),
            "member on device {i} not zeroed"
        );
    }
    c.controller
        .delete_volume(requests::delete_request(&v4.volume_id))
        .await
        .unwrap();
    c.controller
        .delete_volume(requests::delete_request(&v2.volume_id))
        .await
        .unwrap();
    assert!(members(&rig.0).is_empty());
    assert_eq!(maximum(&mut c, params("2", None)).await, max2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stripe_geometry_is_invalid_argument_naming_the_field_and_changes_nothing() {
    let Some(rig) = Rig::with_size(2, 32 * MIB) else {
        return;
    };
    let mut rig = PartRig(rig);
    let before: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    let mut c = rig.0.start().await;
    let mut partition_with_count = params("2", None);
    partition_with_count.insert("layout".into(), "partition".into());
    let mut no_count = params("2", None);
    no_count.remove("stripeCount");
    for (p, field) in [
        (params("1", None), "parameters.stripeCount"),
        (params("17", None), "parameters.stripeCount"),
        (no_count, "parameters.stripeCount"),
        (params("2", Some("3K")), "parameters.stripeChunk"),
        (params("2", Some("2G")), "parameters.stripeChunk"),
        (partition_with_count, "parameters.stripeCount"),
    ] {
        let err = c
            .controller
            .create_volume(create_req("pv", 8 * MIB, p.clone()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{p:?}: {err}");
        assert!(err.message().contains(field), "{p:?}: {err}");
    }
    rig.0.kill9();
    let after: Vec<_> = rig.0.loops.iter().map(|d| digest_file(d)).collect();
    assert_eq!(before, after);
}

fn host() -> Arc<dyn Host> {
    Arc::new(RealHost {
        command_timeout: Duration::from_secs(60),
        mount_timeout: Duration::from_secs(30),
    })
}

/// The stripe layout over the rig's loop devices, as the driver builds it.
fn striped(rig: &Rig, host: &Arc<dyn Host>) -> Arc<Striped> {
    striped_with_sys(rig, host, "/sys".into())
}

fn striped_with_sys(rig: &Rig, host: &Arc<dyn Host>, host_sys: std::path::PathBuf) -> Arc<Striped> {
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys,
        host_dev: "/dev".into(),
        listed: rig.loops.clone(),
        nvme_discover: false,
        state_dir: rig.dir.path().join("layout-state"),
    })
    .unwrap();
    pool.rescan(&host.mount_table().unwrap());
    let pool = Arc::new(pool);
    let parts = Arc::new(Partitioned::new(Arc::clone(&pool)));
    Arc::new(Striped::new(pool, parts))
}

fn stripe_req(name: &str, count: &str, bytes: u64) -> AllocationRequest {
    AllocationRequest {
        name: name.into(),
        required_bytes: bytes,
        limit_bytes: 0,
        fs_type: FsType::Ext4,
        parameters: BTreeMap::from([
            ("layout".into(), "stripe".into()),
            ("stripeCount".into(), count.into()),
        ]),
        source: None,
    }
}

/// The loop devices (by index in the rig) holding a stripe record's members.
fn member_devices(s: &Striped, rig: &Rig, rec: &gds_csi::pool::VolumeRecord) -> Vec<usize> {
    let devices = s.pool.devices();
    let mut at: Vec<usize> = rec
        .stripe
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| {
            let dev = devices.iter().find(|d| d.id == m.device_id).unwrap();
            rig.loops.iter().position(|l| *l == dev.path).unwrap()
        })
        .collect();
    at.sort_unstable();
    at
}

/// Placement try-locks: a device held busy (as a long erase holds it) never stalls a
/// stripe that fits on the others; a stripe that needs it waits its turn, then lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_device_never_stalls_a_stripe_over_other_devices() {
    let Some(rig) = PartRig::with_size(3, 64 * MIB) else {
        return;
    };
    let host = host();
    let s = striped(&rig.0, &host);
    let busy = s
        .pool
        .devices()
        .into_iter()
        .find(|d| d.path == rig.0.loops[0])
        .unwrap();
    let held = s.parts.device_lock(&busy.id).await;

    let began = Instant::now();
    let (id2, rec2) = tokio::time::timeout(
        Duration::from_secs(20),
        s.allocate(host.as_ref(), &stripe_req("two", "2", 8 * MIB)),
    )
    .await
    .expect("a stripe over free devices must not wait for a busy one")
    .unwrap();
    let took = began.elapsed();
    assert_eq!(member_devices(&s, &rig.0, &rec2), vec![1, 2]);
    // Each member's controller is recorded: a loop device is its own.
    let devices = s.pool.devices();
    for m in &rec2.stripe.as_ref().unwrap().members {
        let dev = devices.iter().find(|d| d.id == m.device_id).unwrap();
        let name = dev.path.file_name().unwrap().to_string_lossy();
        assert_eq!(m.controller.as_deref(), Some(name.as_ref()), "{m:?}");
    }

    // Three members need the busy device: the create waits for it, holding nothing.
    let (s2, h) = (Arc::clone(&s), Arc::clone(&host));
    let three = tokio::spawn(async move {
        s2.allocate(h.as_ref(), &stripe_req("three", "3", 6 * MIB))
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !three.is_finished(),
        "a stripe that needs the busy device waited"
    );
    // Meanwhile the free devices still serve at once.
    tokio::time::timeout(
        Duration::from_secs(20),
        s.allocate(host.as_ref(), &stripe_req("two-more", "2", 4 * MIB)),
    )
    .await
    .expect("the free devices serve while a create waits for the busy one")
    .unwrap();
    drop(held);
    let (id3, rec3) = tokio::time::timeout(Duration::from_secs(60), three)
        .await
        .expect("the create finished once the device was free")
        .unwrap()
        .unwrap();
    assert_eq!(member_devices(&s, &rig.0, &rec3), vec![0, 1, 2]);
    println!("stripe over the free devices while one was held: {took:?}");

    // Delete (the shared erase path) leaves the members' partitions gone.
    let mounts = host.mount_table().unwrap();
    for id in [&id2, &id3] {
        s.release(&host, id, &mounts).await.unwrap();
    }
    let left: usize = rig
        .0
        .loops
        .iter()
        .map(|d| kernel::list(d).unwrap().len())
        .sum();
    assert_eq!(left, 2, "only two-more's members remain");
}

/// mkfs through the host port with a stripe geometry: xfs `su`/`sw` and ext4
/// `stride`/`stripe_width` as `xfs_info` and `dumpe2fs` read them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkfs_aligns_the_filesystem_to_the_stripe_geometry() {
    if !common::is_root() {
        return;
    }
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let img = dir.path().join("fs.img");
    // mkfs.xfs wants more than 300 MB, and with a stripe unit more again (xfsprogs 6.1:
    // 512 MiB is refused, "Log size must be at least 64MB"; 700 MiB is taken).
    fs::File::create(&img).unwrap().set_len(1024 * MIB).unwrap();
    let dev = LoopDevice::attach(&img);
    let host = host();
    let uuid = "5e1f1a4c-0000-4000-8000-0000000000b1";

    let geo = StripeGeometry::new(512 * 1024, 4).unwrap();
    host.mkfs(dev.path(), FsType::Xfs, uuid, Some(geo))
        .await
        .unwrap();
    let info = run("xfs_info", &[&dev.arg()]);
    // In 4 KiB blocks: a 512 KiB unit, 4 of them per stripe.
    assert!(
        info.contains("sunit=128") && info.contains("swidth=512 blks"),
        "{info}"
    );

    run("wipefs", &["-a", "-q", &dev.arg()]);
    let geo = StripeGeometry::new(64 * 1024, 2).unwrap();
    host.mkfs(dev.path(), FsType::Ext4, uuid, Some(geo))
        .await
        .unwrap();
    let sb = run("dumpe2fs", &["-h", &dev.arg()]);
    let field = |name: &str| {
        sb.lines()
            .find(|l| l.starts_with(name))
            .map(|l| l[name.len()..].trim().to_owned())
    };
    assert_eq!(field("Block size:").as_deref(), Some("4096"), "{sb}");
    assert_eq!(field("RAID stride:").as_deref(), Some("16"), "{sb}");
    assert_eq!(field("RAID stripe width:").as_deref(), Some("32"), "{sb}");

    // Without a geometry nothing is aligned (the loop device reports no topology).
    run("wipefs", &["-a", "-q", &dev.arg()]);
    host.mkfs(dev.path(), FsType::Xfs, uuid, None)
        .await
        .unwrap();
    let info = run("xfs_info", &[&dev.arg()]);
    assert!(
        info.contains("sunit=0") && info.contains("swidth=0 blks"),
        "{info}"
    );
}

/// A sysfs for the pool (`host_sys`) that puts each loop device behind the NVMe
/// controller `ctrls[i]` the way the kernel links a namespace to its controller
/// (`<disk>/device -> ../../nvmeX`), with the device's real size; everything else the
/// layout reads (labels, partitions) is the real device's.
fn sysfs_with_controllers(rig: &Rig, ctrls: &[&str]) -> std::path::PathBuf {
    let sys = rig.dir.path().join("fake-sys");
    for (dev, ctrl) in rig.loops.iter().zip(ctrls) {
        let name = dev.file_name().unwrap().to_string_lossy().into_owned();
        let num = fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap();
        let size = fs::read_to_string(format!("/sys/block/{name}/size")).unwrap();
        let disk = sys.join(format!("devices/pci0000:00/nvme/{ctrl}/{name}"));
        fs::create_dir_all(disk.join("holders")).unwrap();
        fs::write(disk.join("size"), size).unwrap();
        fs::write(disk.join("dev"), &num).unwrap();
        std::os::unix::fs::symlink(format!("../../{ctrl}"), disk.join("device")).unwrap();
        fs::create_dir_all(sys.join("dev/block")).unwrap();
        let link = sys.join("dev/block").join(num.trim());
        std::os::unix::fs::symlink(&disk, link).unwrap();
    }
    sys
}

/// Two namespaces of one controller count once: a 2-member stripe takes one of them and
/// the other controller's device; a 3-member stripe is ResourceExhausted naming the
/// shared controller, nothing carved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_of_one_controller_count_once() {
    let Some(rig) = PartRig::with_size(3, 64 * MIB) else {
        return;
    };
    let host = host();
    let sys = sysfs_with_controllers(&rig.0, &["nvme0", "nvme0", "nvme1"]);
    let s = striped_with_sys(&rig.0, &host, sys);
    assert_eq!(s.pool.devices().len(), 3);
    let three = StripeParams {
        count: 3,
        chunk_bytes: 512 * 1024,
    };
    assert_eq!(
        s.capacity_for(three).maximum,
        None,
        "two controllers give no 3-member stripe"
    );

    let (_, rec) = s
        .allocate(host.as_ref(), &stripe_req("two", "2", 8 * MIB))
        .await
        .unwrap();
    let at = member_devices(&s, &rig.0, &rec);
    assert!(at == vec![0, 2] || at == vec![1, 2], "{at:?}");
    let mut ctrls: Vec<_> = rec
        .stripe
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| m.controller.clone().unwrap())
        .collect();
    ctrls.sort();
    assert_eq!(ctrls, vec!["nvme0", "nvme1"]);

    let before: Vec<_> = rig
        .0
        .loops
        .iter()
        .map(|d| kernel::list(d).unwrap().len())
        .collect();
    let err = s
        .allocate(host.as_ref(), &stripe_req("three", "3", 6 * MIB))
        .await
        .unwrap_err()
        .to_string();
    let mut shared: Vec<String> = rig.0.loops[..2]
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    shared.sort();
    assert!(err.contains("has 2 such device(s)"), "{err}");
    assert!(
        err.contains(&format!("nvme0 ({})", shared.join(", "))),
        "{err}"
    );
    let after: Vec<_> = rig
        .0
        .loops
        .iter()
        .map(|d| kernel::list(d).unwrap().len())
        .collect();
    assert_eq!(before, after, "a refused stripe carved nothing");
}

/// A sysfs like [`sysfs_with_controllers`] that also places each loop device's controller
/// at a PCI function (`funcs[i]`, below `devices/`) and one NVIDIA 3D controller (an
/// H200's class) at `gpu`, with NUMA nodes as the path's host bridge says.
fn sysfs_with_pcie(rig: &Rig, funcs: &[&str], gpu: &str) -> std::path::PathBuf {
    let sys = rig.dir.path().join("fake-pci-sys");
    let numa = |f: &str| {
        if f.starts_with("pci0000:80") {
            "1\n"
        } else {
            "0\n"
        }
    };
    for (i, (dev, func)) in rig.loops.iter().zip(funcs).enumerate() {
        let name = dev.file_name().unwrap().to_string_lossy().into_owned();
        let num = fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap();
        let size = fs::read_to_string(format!("/sys/block/{name}/size")).unwrap();
        let ctrl = format!("nvme{i}");
        let func_dir = sys.join("devices").join(func);
        let disk = func_dir.join(format!("nvme/{ctrl}/{name}"));
        fs::create_dir_all(disk.join("holders")).unwrap();
        fs::write(func_dir.join("numa_node"), numa(func)).unwrap();
        fs::write(disk.join("size"), size).unwrap();
        fs::write(disk.join("dev"), &num).unwrap();
        std::os::unix::fs::symlink(format!("../../{ctrl}"), disk.join("device")).unwrap();
        fs::create_dir_all(sys.join("dev/block")).unwrap();
        std::os::unix::fs::symlink(&disk, sys.join("dev/block").join(num.trim())).unwrap();
    }
    let gpu_dir = sys.join("devices").join(gpu);
    fs::create_dir_all(&gpu_dir).unwrap();
    fs::write(gpu_dir.join("vendor"), "0x10de\n").unwrap();
    fs::write(gpu_dir.join("class"), "0x030200\n").unwrap();
    fs::write(gpu_dir.join("numa_node"), numa(gpu)).unwrap();
    fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
    let bdf = gpu.rsplit('/').next().unwrap();
    std::os::unix::fs::symlink(&gpu_dir, sys.join("bus/pci/devices").join(bdf)).unwrap();
    sys
}

/// Where sysfs shows a GPU, a stripe takes the drives nearest it on PCIe (its switch
/// first, then its host bridge) over the tighter or earlier-listed ones on the other
/// socket, and its volume context names each member's nearness in `nvidia-smi topo`'s
/// words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_prefers_the_drives_nearest_the_gpus_on_pcie() {
    let Some(rig) = PartRig::with_size(4, 64 * MIB) else {
        return;
    };
    let host = host();
    let switch = "pci0000:00/0000:00:01.0/0000:01:00.0";
    let sys = sysfs_with_pcie(
        &rig.0,
        &[
            "pci0000:80/0000:80:01.0/0000:81:00.0",
            "pci0000:80/0000:80:02.0/0000:82:00.0",
            &format!("{switch}/0000:02:04.0/0000:05:00.0"),
            "pci0000:00/0000:00:02.0/0000:06:00.0",
        ],
        &format!("{switch}/0000:02:00.0/0000:03:00.0"),
    );
    let s = striped_with_sys(&rig.0, &host, sys);
    let (_, rec) = s
        .allocate(host.as_ref(), &stripe_req("near", "2", 80 * MIB))
        .await
        .unwrap();
    assert_eq!(member_devices(&s, &rig.0, &rec), vec![2, 3]);
    assert_eq!(
        gds_csi::volume::block::stripe::pcie::context(&rec),
        Some(("stripeGpuPcie".into(), "PXB,PHB".into()))
    );
    // The next one no longer fits near the GPU: it gets the far socket's drives, and
    // says so.
    let (_, far) = s
        .allocate(host.as_ref(), &stripe_req("far", "2", 60 * MIB))
        .await
        .unwrap();
    assert_eq!(member_devices(&s, &rig.0, &far), vec![0, 1]);
    assert_eq!(
        gds_csi::volume::block::stripe::pcie::context(&far)
            .unwrap()
            .1,
        "SYS,SYS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_entry_another_tool_removed_keeps_the_stripe_until_restored() {
    let Some(mut rig) = PartRig::with_size(2, 64 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    let id = requests::create_volume(&mut c, create_req("s", 20 * MIB, params("2", None)))
        .await
        .volume_id;
    let state = rig.state();
    let member = &state["volumes"][&id]["stripe"]["members"][1];
    let number = member["partition"]["number"].as_u64().unwrap();
    let dev = rig.loops[1].clone();
    common::tools::sgdisk(&[&format!("--delete={number}"), dev.to_str().unwrap()]);
    let err = c
        .controller
        .delete_volume(requests::delete_request(&id))
        .await
        .expect_err("a member whose entry is gone is not dropped unerased");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("removed its entry"),
        "{}",
        err.message()
    );
    assert!(rig.state()["volumes"].get(&id).is_some(), "record kept");
    // Restored as the message says, the delete goes through.
    common::tools::run_advice(err.message());
    c.controller
        .delete_volume(requests::delete_request(&id))
        .await
        .expect("restored: deleted");
    assert!(rig.state()["volumes"].get(&id).is_none());
    for d in &rig.loops {
        assert!(kernel::list(d).unwrap().is_empty(), "{}", d.display());
    }
}
