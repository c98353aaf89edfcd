//! Root tests: the pool knows a device by what it is, not by the path it was given, and
//! a published raw-block volume counts as in use. The real `gds-csi` binary on real loop
//! devices. Without root they report a skip.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{blkid_code, digest_file, requests, run, LoopDevice, Rig, SIZE};
use gds_csi::csi::Clients;

use common::requests::{
    capability as cap, delete_request as delete_req, publish_request as publish_req,
    stage_request as stage_req,
};

fn create_req(name: &str, block: bool) -> CreateVolumeRequest {
    requests::create_without_gds(name, cap(Mode::SingleNodeWriter, block))
}

/// Stages `id` as a mount, which must be refused as FailedPrecondition; returns the error.
async fn stage_refused(c: &mut Clients, id: &str, staging: &Path) -> tonic::Status {
    let err = c
        .node
        .node_stage_volume(stage_req(id, staging, requests::single_writer_mount()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    err
}

/// A sparse image of `size` bytes whose first MiB holds a recognisable pattern.
fn image_with_data(path: &Path, size: u64) -> Vec<u8> {
    let head: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    fs::write(path, &head).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(size)
        .unwrap();
    digest_file(path)
}

/// Detaches one of the rig's own loop devices and forgets it, so the rig's clean-up never
/// detaches a device another test attached to the same number afterwards.
fn detach(rig: &mut Rig, i: usize) -> PathBuf {
    let dev = rig.loops.remove(i);
    run("losetup", &["-d", dev.to_str().unwrap()]);
    dev
}

fn log_has(rig: &Rig, text: &str) -> bool {
    rig.logs().contains(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_raw_block_volume_is_in_use() {
    let Some(mut rig) = Rig::new(1) else { return };
    let mut c = rig.start().await;
    let block = cap(Mode::SingleNodeSingleWriter, true);
    let vol = requests::create_volume(&mut c, create_req("raw", true)).await;
    let id = vol.volume_id;
    let staging = rig.path("staging/raw");
    let target = rig.path("pods/p1/dev");
    fs::create_dir_all(&staging).unwrap();
    c.node
        .node_stage_volume(stage_req(&id, &staging, block.clone()))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req(&id, &staging, &target, block.clone()))
        .await
        .unwrap();
    // A pod writes through the published device node.
    let payload = vec![0x5au8; 8 << 20];
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().write(true).open(&target).unwrap();
        f.write_all(&payload).unwrap();
        f.sync_all().unwrap();
    }

    // Repeating the same publish is OK, not AlreadyExists.
    c.node
        .node_publish_volume(publish_req(&id, &staging, &target, block.clone()))
        .await
        .expect("a repeated raw-block publish is idempotent");

    // SINGLE_NODE_SINGLE_WRITER refuses a second target.
    let second = rig.path("pods/p2/dev");
    let err = c
        .node
        .node_publish_volume(publish_req(&id, &staging, &second, block.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(target.to_str().unwrap()),
        "{}",
        err.message()
    );

    // Stats of a published raw-block volume: normal, with the device's size.
    let stats = requests::published_stats(&mut c, &id, &target).await;
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{}", condition.message);
    assert_eq!(stats.usage[0].total as u64, SIZE, "{:?}", stats.usage);

    // DeleteVolume under the running pod is refused, naming where it is in use.
    let err = c
        .controller
        .delete_volume(delete_req(&id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(target.to_str().unwrap()),
        "{}",
        err.message()
    );
    // So the device is not handed out again.
    let err = c
        .controller
        .create_volume(create_req("next", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let mut head = vec![0u8; 8 << 20];
    {
        use std::io::Read;
        fs::File::open(&rig.loops[0])
            .unwrap()
            .read_exact(&mut head)
            .unwrap();
    }
    assert!(head == payload, "the pod's data is intact");

    // Unpublished, it can be deleted.
    c.node
        .node_unpublish_volume(requests::unpublish_request(&id, &target))
        .await
        .unwrap();
    c.controller.delete_volume(delete_req(&id)).await.unwrap();
}

fn blank_image(dir: &Path, name: &str) -> PathBuf {
    let img = dir.join(name);
    fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
    img
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_device_listed_twice_is_one_pool_device() {
    if !common::is_root() {
        return;
    }
    let images = tempfile::tempdir().unwrap();
    let dev = LoopDevice::attach(&blank_image(images.path(), "d.img"));
    let Some(mut rig) = Rig::new(0) else { return };
    let alias = rig.path("disk-alias");
    std::os::unix::fs::symlink(dev.path(), &alias).unwrap();
    let alias = alias.to_str().unwrap().to_owned();
    let mut c = rig
        .start_with(&[], &["--pool-device", &dev.arg(), "--pool-device", &alias])
        .await;
    let capacity = requests::capacity(&mut c).await;
    assert_eq!(
        capacity.available_capacity as u64, SIZE,
        "one device, counted once"
    );
    let vol = requests::create_volume(&mut c, create_req("a", false)).await;
    let err = c
        .controller
        .create_volume(create_req("b", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        log_has(&rig, "listed twice"),
        "the duplicate is named in a warning: {}",
        rig.logs()
    );

    // Listed the other way round after a restart: the allocated device keeps its id.
    rig.kill9();
    let mut c = rig
        .start_with(&[], &["--pool-device", &alias, "--pool-device", &dev.arg()])
        .await;
    let staging = rig.path("staging/a");
    fs::create_dir_all(&staging).unwrap();
    c.node
        .node_stage_volume(stage_req(
            &vol.volume_id,
            &staging,
            cap(Mode::SingleNodeWriter, false),
        ))
        .await
        .unwrap();
    let err = c
        .controller
        .create_volume(create_req("b", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(rig.mkfs_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_now_points_elsewhere_is_not_formatted_or_mounted() {
    if !common::is_root() {
        return;
    }
    let images = tempfile::tempdir().unwrap();
    let mine = LoopDevice::attach(&blank_image(images.path(), "mine.img"));
    let other_img = images.path().join("other.img");
    let other_digest = image_with_data(&other_img, 2 * SIZE);
    let other = LoopDevice::attach(&other_img);
    let Some(mut rig) = Rig::new(0) else { return };
    // The pool device is listed through a symlink, as /dev/disk/by-id paths are.
    let link = rig.path("disk0");
    std::os::unix::fs::symlink(mine.path(), &link).unwrap();
    let link_arg = link.to_str().unwrap().to_owned();
    let mut c = rig.start_with(&[], &["--pool-device", &link_arg]).await;
    let vol = requests::create_volume(&mut c, create_req("v", false)).await;
    let id = vol.volume_id;

    // The link now names another device, bigger and holding data.
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(other.path(), &link).unwrap();
    let staging = rig.path("staging/v");
    fs::create_dir_all(&staging).unwrap();
    for restart in [false, true] {
        if restart {
            rig.kill9();
            c = rig.start_with(&[], &["--pool-device", &link_arg]).await;
        }
        let err = stage_refused(&mut c, &id, &staging).await;
        let msg = err.message();
        assert!(msg.contains(&link_arg), "names the device: {msg}");
        assert!(
            msg.contains(&SIZE.to_string()),
            "says what was recorded: {msg}"
        );
        assert!(
            msg.contains(&(2 * SIZE).to_string()),
            "says what is there: {msg}"
        );
        let err = c
            .controller
            .delete_volume(delete_req(&id))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    }
    assert_eq!(rig.mkfs_count(), 0);
    assert_eq!(common::mounts_at(&staging), 0);
    assert_eq!(digest_file(other.path()), other_digest, "untouched");

    // Pointed back at the allocated device, the volume stages as usual.
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(mine.path(), &link).unwrap();
    c.node
        .node_stage_volume(stage_req(&id, &staging, requests::single_writer_mount()))
        .await
        .unwrap();
    assert_eq!(rig.mkfs_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_device_reattached_to_another_file_is_not_formatted() {
    let Some(mut rig) = Rig::new(1) else { return };
    let mut c = rig.start().await;
    let id = requests::create_volume(&mut c, create_req("v", false))
        .await
        .volume_id;
    // The same /dev/loopN now shows another, bigger file whose first MiB holds data.
    let img = rig.path("other.img");
    let digest = image_with_data(&img, 2 * SIZE);
    let dev = detach(&mut rig, 0);
    let dev_arg = dev.to_str().unwrap().to_owned();
    if Command::new("losetup")
        .args([&dev_arg, img.to_str().unwrap()])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        common::skip(&format!(
            "{dev_arg} was taken by someone else between detach and attach"
        ));
        return;
    }
    let _reattached = LoopDevice(Some(dev.clone()));
    let staging = rig.path("staging/v");
    fs::create_dir_all(&staging).unwrap();
    for restart in [false, true] {
        if restart {
            rig.kill9();
            c = rig.start_with(&[], &["--pool-device", &dev_arg]).await;
        }
        let err = stage_refused(&mut c, &id, &staging).await;
        assert!(err.message().contains(&dev_arg), "{}", err.message());
    }
    assert_eq!(rig.mkfs_count(), 0);
    assert_eq!(common::mounts_at(&staging), 0);
    assert_eq!(blkid_code(&dev), Some(2), "no signature written");
    assert_eq!(digest_file(&img), digest, "untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_device_detached_after_start_is_not_allocated() {
    let Some(mut rig) = Rig::new(2) else { return };
    let mut c = rig.start().await;
    let gone = detach(&mut rig, 0);
    let kept = rig.loops[0].clone();
    let vol = requests::create_volume(&mut c, create_req("a", false)).await;
    let key = rig.state()["volumes"][&vol.volume_id]["device_key"].clone();
    assert_eq!(
        key,
        serde_json::json!(format!("path:{}", kept.display())),
        "allocated the device still attached"
    );
    let err = c
        .controller
        .create_volume(create_req("b", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains(gone.to_str().unwrap()),
        "names the missing device: {}",
        err.message()
    );
}
