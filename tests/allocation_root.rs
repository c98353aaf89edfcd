//! Root tests: which device CreateVolume hands out when the pool's devices differ in size,
//! and a device whose size changed under the same major:minor is not the allocated one.
//! The real `gds-csi` binary on real loop devices; without root they report a skip.
//! (Both were claims without a test: cargo-mutants left `size <= limit` and the size term
//! of the identity check unkilled.)
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::process::Command;

use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{requests, Rig};

const MIB: u64 = 1 << 20;

fn create_req(name: &str, required: u64, limit: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: required as i64,
            limit_bytes: limit as i64,
        }),
        ..requests::create_without_gds(name, requests::single_writer_mount())
    }
}

/// The smallest free device that fits the range, never one over the limit.
#[tokio::test]
async fn the_smallest_device_that_fits_the_range_is_chosen() {
    let Some(mut rig) = Rig::with_sizes(&[256 * MIB, 64 * MIB, 128 * MIB]) else {
        return;
    };
    let mut c = rig.start().await;
    let available = |r: GetCapacityResponse| (r.available_capacity as u64) / MIB;
    assert_eq!(available(requests::capacity(&mut c).await), 448);

    let limited = create_req("limited", 10 * MIB, 100 * MIB);
    let v = requests::create_volume(&mut c, limited).await;
    assert_eq!(v.capacity_bytes, (64 * MIB) as i64, "{v:?}");
    // An allocated device is no longer free.
    assert_eq!(available(requests::capacity(&mut c).await), 384);

    let v = requests::create_volume(&mut c, create_req("at-least-100", 100 * MIB, 0)).await;
    assert_eq!(v.capacity_bytes, (128 * MIB) as i64, "{v:?}");
    assert_eq!(available(requests::capacity(&mut c).await), 256);

    // Only the 256 MiB device is free now, and it is over the limit: nothing is created.
    let err = c
        .controller
        .create_volume(create_req("limited-again", 10 * MIB, 100 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("10485760..=104857600 bytes"),
        "the range is named: {err:?}"
    );
    let listed = c
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 2, "{listed:?}");

    let v = requests::create_volume(&mut c, create_req("any", MIB, 0)).await;
    assert_eq!(v.capacity_bytes, (256 * MIB) as i64, "{v:?}");
}

/// A volume's loop device grown to another size (same path, same major:minor) is not the
/// allocated device: NodeStage refuses it and writes nothing.
#[tokio::test]
async fn a_device_whose_size_changed_is_not_the_allocated_one() {
    let Some(mut rig) = Rig::with_size(1, 64 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    let id = requests::create_volume(&mut c, create_req("v", MIB, 0))
        .await
        .volume_id;

    // The same loop device (path, major:minor) now 96 MiB: its backing file grown and the
    // new size taken (`losetup -c`), without ever letting go of the device, which a
    // parallel test could otherwise take.
    let dev = rig.loops[0].clone();
    let backing = rig.path("dev0.img");
    fs::OpenOptions::new()
        .write(true)
        .open(&backing)
        .unwrap()
        .set_len(96 * MIB)
        .unwrap();
    let status = Command::new("losetup")
        .arg("-c")
        .arg(&dev)
        .status()
        .unwrap();
    assert!(status.success(), "losetup -c {} failed", dev.display());

    let staging = rig.path("staging");
    let err = requests::stage(&mut c, &id, &staging, requests::single_writer_mount())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("is not the device allocated"),
        "{err:?}"
    );
    let bytes = fs::read(&backing).unwrap();
    assert!(
        bytes.iter().all(|b| *b == 0),
        "the refused stage wrote to the device"
    );
}

/// A filesystem written on a free device after the start-up scan is found by the probe at
/// CreateVolume: that device is not handed out, and the error names what it carries.
#[tokio::test]
async fn a_signature_written_after_the_scan_keeps_the_device_out() {
    let Some(mut rig) = Rig::with_size(1, 64 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    let dev = rig.loops[0].clone();
    common::run(
        "mkfs.ext4",
        &["-q", "-L", "someone-else", dev.to_str().unwrap()],
    );

    let err = c
        .controller
        .create_volume(create_req("v", MIB, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("ext4"), "{err:?}");
    assert_eq!(
        err.message().matches(" carries ").count(),
        1,
        "each refused device is named once: {err:?}"
    );
    let label = common::run(
        "blkid",
        &["-s", "LABEL", "-o", "value", dev.to_str().unwrap()],
    );
    assert_eq!(label, "someone-else");
}

/// The same name asked again with another filesystem (and the same parameters) is another
/// volume: AlreadyExists, and the first volume is unchanged.
#[tokio::test]
async fn the_same_name_with_another_filesystem_already_exists() {
    // Big enough for xfs's minimum, so the size check cannot be what refuses it.
    let Some(mut rig) = Rig::with_size(2, 512 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    let first = requests::create_volume(&mut c, create_req("v", MIB, 0)).await;
    let mut xfs = create_req("v", MIB, 0);
    xfs.volume_capabilities = vec![VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "xfs".into(),
                ..Default::default()
            },
        )),
        ..requests::single_writer_mount()
    }];
    let err = c.controller.create_volume(xfs).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains("fsType"), "{err:?}");
    let again = requests::create_volume(&mut c, create_req("v", MIB, 0)).await;
    assert_eq!(again.volume_id, first.volume_id);
}
