//! Root-only: the `stripe` block layout's controller side (issue 14) through the real
//! binary on four real loop devices: equal member partitions on distinct devices,
//! GetCapacity's maximum for a stripe class, ResourceExhausted counting the devices with
//! room, bad geometry refused before anything changes, and DeleteVolume that refuses a
//! member carrying a foreign signature (nothing erased) and otherwise zeroes and removes
//! every member; ControllerExpandVolume refused (OutOfRange) since stripes do not grow. (This machine has no md driver and no mdadm: NodeStage is refused
//! here; arrays are the VM rig's business.)

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::partition::kernel;
use tonic::Code;

mod common;
use common::{digest_file, requests, run, PartRig, Rig};

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
