//! Root-only: volume expansion through the real binary on real loop devices.
//! A published partition volume grows (ControllerExpandVolume, then NodeExpandVolume)
//! with `df` showing the new size and the data intact, for ext4 and xfs, across a
//! restart between the two calls; a neighbour in the way of a volume in use refuses the
//! growth, named, and nothing changes, while an unused volume moves past it; a
//! whole-device volume grows only up to its device.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::path::Path;

use gds_csi::csi::volume_capability::{AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::disk::gpt::Held;
use tonic::Code;

mod common;
use common::{digest_file, requests, run, PartRig, Rig};

const MIB: u64 = 1 << 20;

fn part_rig(size: u64) -> Option<PartRig> {
    PartRig::with_size(1, size)
}

fn mount_cap(fs_type: &str) -> VolumeCapability {
    let mut cap = requests::single_writer_mount();
    cap.access_type = Some(AccessType::Mount(MountVolume {
        fs_type: fs_type.into(),
        ..Default::default()
    }));
    cap
}

fn create_req(name: &str, bytes: u64, fs_type: &str, layout: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![mount_cap(fs_type)],
        parameters: [
            ("gdsPolicy".to_string(), "disabled".to_string()),
            ("layout".to_string(), layout.to_string()),
        ]
        .into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

fn expand_req(id: &str, required: u64, limit: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required as i64,
            limit_bytes: limit as i64,
        }),
        volume_capability: Some(requests::single_writer_mount()),
        ..Default::default()
    }
}

async fn controller_expand(c: &mut Clients, id: &str, bytes: u64) -> (u64, bool) {
    let r = c
        .controller
        .controller_expand_volume(expand_req(id, bytes, 0))
        .await
        .unwrap_or_else(|e| panic!("ControllerExpandVolume {id}: {e}"))
        .into_inner();
    (r.capacity_bytes as u64, r.node_expansion_required)
}

async fn node_expand(c: &mut Clients, id: &str, path: &Path, bytes: u64) -> u64 {
    let r = c
        .node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: path.to_str().unwrap().into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("NodeExpandVolume {id}: {e}"))
        .into_inner();
    r.capacity_bytes as u64
}

/// `df`'s size of the filesystem mounted at `path`, in bytes.
fn df_size(path: &Path) -> u64 {
    let out = run("df", &["-B1", "--output=size", path.to_str().unwrap()]);
    out.lines().last().unwrap().trim().parse().unwrap()
}

/// Whether this process may grow a mounted ext4 (CAP_SYS_RESOURCE, bit 24 of CapEff).
fn cap_sys_resource() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap();
    u64::from_str_radix(hex.trim(), 16).unwrap() & (1 << 24) != 0
}

/// 16 MiB that no filesystem would make up: an xorshift stream.
fn data() -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..16 * MIB as usize / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// Create, stage, publish, write; grow by the controller then the node (each twice),
/// with a driver restart in between; `df` grows and the data reads back the same.
async fn grows_online(fs_type: &str, size: u64, grown: u64, device: u64) {
    let Some(mut rig) = part_rig(device) else {
        return;
    };
    let mut c = rig.0.start().await;
    let req = create_req("pv-grow", size, fs_type, "partition");
    let id = requests::create_volume(&mut c, req).await.volume_id;
    let (staging, target) = (rig.0.path("staging"), rig.0.path("target"));
    let cap = mount_cap(fs_type);
    requests::stage(&mut c, &id, &staging, cap.clone())
        .await
        .unwrap();
    requests::publish(&mut c, &id, &staging, &target, cap)
        .await
        .unwrap();
    fs::write(target.join("data"), data()).unwrap();
    run("sync", &[]);
    let sum = digest_file(&target.join("data"));
    let df_before = df_size(&target);

    assert_eq!(controller_expand(&mut c, &id, grown).await, (grown, true));
    assert_eq!(
        controller_expand(&mut c, &id, grown).await,
        (grown, true),
        "a retried ControllerExpandVolume answers the same"
    );
    assert_eq!(
        controller_expand(&mut c, &id, size).await.0,
        grown,
        "a smaller request answers the current size"
    );
    assert_eq!(rig.0.state()["volumes"][&id]["capacity_bytes"], grown);
    // A restart between the controller's and the node's step converges.
    rig.0.kill9();
    let mut c = rig.0.start().await;
    if fs_type == "ext4" && !cap_sys_resource() {
        // This sandbox withholds CAP_SYS_RESOURCE, without which the kernel refuses an
        // online ext4 grow (the node pod is privileged): the refusal must say so.
        let err = c
            .node
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: target.to_str().unwrap().into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
        assert!(err.message().contains("CAP_SYS_RESOURCE"), "{err}");
        assert_eq!(digest_file(&target.join("data")), sum, "data changed");
        // The refusal above is what this machine can check; failing here under
        // GDS_CSI_NO_SKIP would fail every run in a sandbox that withholds the capability.
        eprintln!("no CAP_SYS_RESOURCE here: checked the refusal, not the growth");
        return;
    }
    assert_eq!(node_expand(&mut c, &id, &target, grown).await, grown);
    assert_eq!(node_expand(&mut c, &id, &staging, grown).await, grown);
    let df_after = df_size(&target);
    assert!(
        df_after > df_before + (grown - size) * 8 / 10,
        "{fs_type}: df {df_before} -> {df_after} after growing {size} -> {grown}"
    );
    assert_eq!(df_size(&staging), df_after);
    assert_eq!(digest_file(&target.join("data")), sum, "data changed");
    // Still a healthy volume: unpublish, unstage, restage, read.
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    requests::stage(&mut c, &id, &staging, mount_cap(fs_type))
        .await
        .unwrap();
    assert_eq!(
        digest_file(&staging.join("data")),
        sum,
        "data after restage"
    );
    assert_eq!(df_size(&staging), df_after);
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    c.controller
        .delete_volume(requests::delete_request(&id))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ext4_partition_volume_grows_online_keeping_its_data() {
    grows_online("ext4", 64 * MIB, 192 * MIB, 256 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xfs_partition_volume_grows_online_keeping_its_data() {
    // mkfs.xfs wants 300 MiB and more (xfsprogs 5.19 and later).
    grows_online("xfs", 320 * MIB, 512 * MIB, 640 * MIB).await;
}

/// The label as `sfdisk -J` reads it: (name, PARTUUID, start byte, bytes) per entry.
fn gpt_entries(disk: &Path) -> Vec<(String, String, u64, u64)> {
    let out = run("sfdisk", &["-J", disk.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let parts = v["partitiontable"]["partitions"].as_array().cloned();
    parts
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["uuid"].as_str().unwrap_or_default().to_lowercase(),
                p["start"].as_u64().unwrap() * 512,
                p["size"].as_u64().unwrap() * 512,
            )
        })
        .collect()
}

fn entry_of(disk: &Path, id: &str) -> (String, String, u64, u64) {
    let alloc = gds_csi::csi::id::BlockVolumeId::parse(id)
        .unwrap()
        .allocation;
    let entries = gpt_entries(disk);
    entries.into_iter().find(|e| e.0 == alloc).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbour_in_the_way_moves_an_unused_volume_and_refuses_a_used_one() {
    let Some(mut rig) = part_rig(256 * MIB) else {
        return;
    };
    let dev = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let a = requests::create_volume(&mut c, create_req("pv-a", 32 * MIB, "ext4", "partition"))
        .await
        .volume_id;
    let b = requests::create_volume(&mut c, create_req("pv-b", 32 * MIB, "ext4", "partition"))
        .await
        .volume_id;
    let staging = rig.0.path("staging-a");
    requests::stage(&mut c, &a, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    fs::write(staging.join("data"), data()).unwrap();
    run("sync", &[]);
    let sum = digest_file(&staging.join("data"));
    let (label, state) = (gpt_entries(&dev), rig.0.state());

    // In use: refused with the numbers and when it can grow; nothing changes.
    let err = c
        .controller
        .controller_expand_volume(expand_req(&a, 64 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains(&b), "names the neighbour: {err}");
    assert!(err.message().contains("once no pod uses it"), "{err}");
    assert!(
        err.message().contains("at most 50331648 bytes fit"),
        "{err}"
    );
    assert_eq!(gpt_entries(&dev), label, "the label changed");
    assert_eq!(rig.0.state(), state, "the state changed");
    // No 1 MiB-aligned size fits between required and limit.
    let err = c
        .controller
        .controller_expand_volume(expand_req(&b, 40 * MIB + 1, 40 * MIB + 100))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    // Bad input: the field named, nothing changed.
    let err = c
        .controller
        .controller_expand_volume(expand_req(&b, 64 * MIB, 48 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("capacity_range"), "{err}");
    let mut no_range = expand_req(&b, 0, 0);
    no_range.capacity_range = None;
    let err = c
        .controller
        .controller_expand_volume(no_range)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("capacity_range"), "{err}");
    let err = c
        .controller
        .controller_expand_volume(expand_req("", MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("volume_id"), "{err}");
    let mut unknown = gds_csi::csi::id::BlockVolumeId::parse(&a).unwrap();
    unknown.allocation = "00000000".into();
    let unknown = unknown.to_string();
    let err = c
        .controller
        .controller_expand_volume(expand_req(&unknown, 64 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert_eq!(gpt_entries(&dev), label, "the label changed");

    // Unused: moved past b to an extent of the new size, PARTUUID and data kept.
    requests::unstage(&mut c, &a, &staging).await.unwrap();
    let old = entry_of(&dev, &a);
    assert_eq!(
        controller_expand(&mut c, &a, 64 * MIB).await,
        (64 * MIB, true)
    );
    assert_eq!(
        controller_expand(&mut c, &a, 64 * MIB).await.0,
        64 * MIB,
        "a retry"
    );
    let moved = entry_of(&dev, &a);
    assert_eq!(
        (moved.1.as_str(), moved.3),
        (old.1.as_str(), 64 * MIB),
        "{old:?} -> {moved:?}"
    );
    assert!(
        moved.2 >= old.2 + old.3,
        "moved past the neighbour: {moved:?}"
    );
    assert_eq!(gpt_entries(&dev).len(), 2, "no spare entry left");
    let verify = run("sgdisk", &["-v", dev.to_str().unwrap()]);
    assert!(verify.contains("No problems found"), "{verify}");
    requests::stage(&mut c, &a, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    assert_eq!(
        digest_file(&staging.join("data")),
        sum,
        "data after the move"
    );
    requests::unstage(&mut c, &a, &staging).await.unwrap();

    // Nowhere large enough: OutOfRange with what fits.
    let err = c
        .controller
        .controller_expand_volume(expand_req(&a, 200 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.message().contains("no free extent that large"), "{err}");
    // b grows in place into the room kept after it.
    assert_eq!(controller_expand(&mut c, &b, 48 * MIB).await.0, 48 * MIB);
    rig.0.kill9();
}

/// EXPAND_VOLUME on the controller and the node, VolumeExpansion ONLINE on the plugin:
/// without them the CO (and csi-sanity) never asks.
async fn advertises_expansion(c: &mut Clients) {
    use gds_csi::csi::plugin_capability::{volume_expansion, Type as PluginType};
    let ctl = c
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let expand = controller_service_capability::rpc::Type::ExpandVolume as i32;
    assert!(
        ctl.capabilities.iter().any(|cap| matches!(
            &cap.r#type,
            Some(controller_service_capability::Type::Rpc(r)) if r.r#type == expand
        )),
        "controller: {ctl:?}"
    );
    let node = c
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let expand = node_service_capability::rpc::Type::ExpandVolume as i32;
    assert!(
        node.capabilities.iter().any(|cap| matches!(
            &cap.r#type,
            Some(node_service_capability::Type::Rpc(r)) if r.r#type == expand
        )),
        "node: {node:?}"
    );
    let plugin = c
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let online = volume_expansion::Type::Online as i32;
    assert!(
        plugin.capabilities.iter().any(|cap| matches!(
            &cap.r#type,
            Some(PluginType::VolumeExpansion(v)) if v.r#type == online
        )),
        "plugin: {plugin:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_device_volume_grows_only_up_to_its_device() {
    let Some(mut rig) = Rig::with_size(1, 64 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    advertises_expansion(&mut c).await;
    let id = requests::create_volume(&mut c, create_req("pv-dev", 64 * MIB, "ext4", "device"))
        .await
        .volume_id;
    let before = digest_file(&rig.loops[0]);
    assert_eq!(
        controller_expand(&mut c, &id, 64 * MIB).await,
        (64 * MIB, false),
        "the volume is the whole device already"
    );
    let err = c
        .controller
        .controller_expand_volume(expand_req(&id, 128 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.message().contains("layout: partition"), "{err}");
    rig.kill9();
    assert_eq!(digest_file(&rig.loops[0]), before, "the device changed");

    // Staged and published, the node's expansion finds the filesystem filling the device.
    let mut c = rig.start().await;
    let (staging, target) = (rig.path("staging"), rig.path("target"));
    requests::stage(&mut c, &id, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    requests::publish(&mut c, &id, &staging, &target, mount_cap("ext4"))
        .await
        .unwrap();
    let df = df_size(&target);
    assert_eq!(node_expand(&mut c, &id, &target, 64 * MIB).await, 64 * MIB);
    assert_eq!(df_size(&target), df);
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
}

/// A crash after the label grew and before the record did (the partition longer than
/// its record says): NodeStage refuses the volume, the retried ControllerExpandVolume
/// adopts the label's size, and the volume stages with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_label_and_record_converges_on_retry() {
    let Some(mut rig) = part_rig(256 * MIB) else {
        return;
    };
    let dev = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let id = requests::create_volume(
        &mut c,
        create_req("pv-crash", 32 * MIB, "ext4", "partition"),
    )
    .await
    .volume_id;
    let staging = rig.0.path("staging");
    requests::stage(&mut c, &id, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    fs::write(staging.join("data"), data()).unwrap();
    let sum = digest_file(&staging.join("data"));
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    rig.0.kill9();
    let partuuid = rig.0.state()["volumes"][&id]["partition"]["partuuid"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    gds_csi::disk::gpt::volume::grow(&dev, &partuuid, 64 * MIB, &Held::default()).unwrap();

    let mut c = rig.0.start().await;
    let err = requests::stage(&mut c, &id, &staging, mount_cap("ext4"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert_eq!(
        controller_expand(&mut c, &id, 64 * MIB).await,
        (64 * MIB, true)
    );
    assert_eq!(rig.0.state()["volumes"][&id]["capacity_bytes"], 64 * MIB);
    requests::stage(&mut c, &id, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    assert_eq!(
        digest_file(&staging.join("data")),
        sum,
        "data after the crash"
    );
    assert_eq!(rig.0.mkfs_count(), 1, "formatted once");
    requests::unstage(&mut c, &id, &staging).await.unwrap();
}

/// Rewrites the record of volume `id` in the stopped driver's state dir with `change`.
fn edit_record(rig: &Rig, id: &str, change: impl FnOnce(&mut serde_json::Value)) {
    for entry in fs::read_dir(rig.path("state").join("volumes")).unwrap() {
        let path = entry.unwrap().path();
        let mut stored: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        if stored["id"] == id {
            change(&mut stored["record"]);
            fs::write(&path, serde_json::to_vec_pretty(&stored).unwrap()).unwrap();
            return;
        }
    }
    panic!("no record of {id}");
}

fn bytes_at(disk: &Path, start: u64, len: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    run("blockdev", &["--flushbufs", disk.to_str().unwrap()]);
    let mut f = fs::File::open(disk).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// A move recorded that the label does not bear out (a planted record, an entry moved by
/// another tool) is refused at start-up and by every call on the volume, and nothing is
/// zeroed: neither the neighbour the record points at nor the extent the entry was moved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_the_label_does_not_bear_out_zeroes_nothing() {
    let Some(mut rig) = part_rig(256 * MIB) else {
        return;
    };
    let dev = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let a = requests::create_volume(&mut c, create_req("pv-a", 32 * MIB, "ext4", "partition"))
        .await
        .volume_id;
    let b = requests::create_volume(&mut c, create_req("pv-b", 32 * MIB, "ext4", "partition"))
        .await
        .volume_id;
    let staging = rig.0.path("staging");
    requests::stage(&mut c, &b, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    fs::write(staging.join("data"), data()).unwrap();
    run("sync", &[]);
    let sum = digest_file(&staging.join("data"));
    requests::unstage(&mut c, &b, &staging).await.unwrap();
    let (ea, eb) = (entry_of(&dev, &a), entry_of(&dev, &b));
    let b_bytes = bytes_at(&dev, eb.2, eb.3);

    // A planted move whose spare entry is b's own.
    rig.0.kill9();
    edit_record(&rig.0, &a, |r| {
        r["partition"]["moving"] = serde_json::json!({
            "to": [eb.2, eb.3], "from": [ea.2, ea.3], "spare": eb.1,
        });
    });
    let mut c = rig.0.start().await;
    assert!(
        rig.0.logs().contains("a move could not be settled"),
        "logged at start-up"
    );
    assert_eq!(bytes_at(&dev, eb.2, eb.3), b_bytes, "b untouched");
    let err = requests::stage(&mut c, &a, &staging, mount_cap("ext4"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err}");
    assert!(err.message().contains("being moved"), "{err}");
    let err = c
        .controller
        .controller_expand_volume(expand_req(&a, 64 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message().contains("not as this driver left it"),
        "{err}"
    );
    let err = c
        .controller
        .delete_volume(requests::delete_request(&a))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert_eq!(bytes_at(&dev, eb.2, eb.3), b_bytes, "b untouched");

    // A spare entry of the right name that another tool moved off the recorded extent.
    rig.0.kill9();
    let spare = "0a1b2c3d-0000-4000-8000-00000000abcd";
    let alloc = ea.0.clone();
    let (to, moved_to) = ((160 * MIB, 16 * MIB), (200 * MIB, 16 * MIB));
    let (first, last) = (moved_to.0 / 512, (moved_to.0 + moved_to.1) / 512 - 1);
    run(
        "sgdisk",
        &[
            &format!("--new=9:{first}:{last}"),
            &format!("--partition-guid=9:{spare}"),
            &format!("--typecode=9:{}", gds_csi::disk::gpt::TYPE_GUID),
            &format!("--change-name=9:{alloc}.move"),
            dev.to_str().unwrap(),
        ],
    );
    let pattern = vec![0x5a_u8; 4096];
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&dev).unwrap();
        f.write_all_at(&pattern, moved_to.0).unwrap();
        f.sync_all().unwrap();
    }
    edit_record(&rig.0, &a, |r| {
        r["partition"]["moving"] = serde_json::json!({
            "to": [to.0, to.1], "from": [ea.2, ea.3], "spare": spare,
        });
    });
    let mut c = rig.0.start().await;
    assert!(rig.0.logs().contains("a move could not be settled"));
    assert_eq!(bytes_at(&dev, moved_to.0, 4096), pattern, "nothing zeroed");
    let err = c
        .controller
        .controller_expand_volume(expand_req(&a, 64 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message().contains(".move"),
        "names the spare entry: {err}"
    );
    assert_eq!(bytes_at(&dev, moved_to.0, 4096), pattern, "nothing zeroed");

    // The record put right: the move goes through, b intact.
    rig.0.kill9();
    edit_record(&rig.0, &a, |r| {
        r["partition"].as_object_mut().unwrap().remove("moving");
    });
    run("sgdisk", &["--delete=9", dev.to_str().unwrap()]);
    let mut c = rig.0.start().await;
    assert_eq!(controller_expand(&mut c, &a, 64 * MIB).await.0, 64 * MIB);
    requests::stage(&mut c, &b, &staging, mount_cap("ext4"))
        .await
        .unwrap();
    assert_eq!(digest_file(&staging.join("data")), sum, "b's data");
    requests::unstage(&mut c, &b, &staging).await.unwrap();
    rig.0.kill9();
}

/// A partition another program holds open exclusively is in use: no move, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_held_open_is_not_moved() {
    use std::os::unix::fs::OpenOptionsExt;
    let Some(mut rig) = part_rig(256 * MIB) else {
        return;
    };
    let dev = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let a = requests::create_volume(&mut c, create_req("pv-a", 32 * MIB, "ext4", "partition"))
        .await
        .volume_id;
    requests::create_volume(&mut c, create_req("pv-b", 32 * MIB, "ext4", "partition")).await;
    let ea = entry_of(&dev, &a);
    let parts = gds_csi::disk::gpt::kernel::list(&dev).unwrap();
    let k = parts.iter().find(|k| k.start == ea.2).expect("a shown");
    let node = Path::new("/dev").join(&k.name);
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&node)
        .unwrap();
    let (label, state) = (gpt_entries(&dev), rig.0.state());
    let err = c
        .controller
        .controller_expand_volume(expand_req(&a, 64 * MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("once no pod uses it"), "{err}");
    assert_eq!(gpt_entries(&dev), label, "the label changed");
    assert_eq!(rig.0.state(), state, "the state changed");
    drop(held);
    assert_eq!(controller_expand(&mut c, &a, 64 * MIB).await.0, 64 * MIB);
    rig.0.kill9();
}
