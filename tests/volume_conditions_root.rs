//! Root tests through the real binary on loop devices: every abnormal condition
//! NodeGetVolumeStats reports for a block volume (staging unmounted behind the driver's
//! back, filesystem read-only by remount or by ext4 errors, target no longer a mount,
//! and the healthy case); the pool gauges for unavailable and excluded devices; and a
//! signature probe that fails is a refusal that CreateVolume names.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{requests, run, Rig};

/// A published mount volume of `rig`'s first device: (clients, id, staging, target).
async fn published(rig: &mut Rig) -> (Clients, String, PathBuf, PathBuf) {
    let mut c = rig.start().await;
    let cap = requests::single_writer_mount();
    let id = requests::create_volume_id(&mut c, "cond", cap.clone()).await;
    let (staging, target) = (rig.path("staging/v"), rig.path("pods/p1/mount"));
    requests::stage_and_publish(&mut c, &id, &staging, &target, cap).await;
    (c, id, staging, target)
}

/// NodeGetVolumeStats as the kubelet sends it for a published volume (both paths).
async fn condition(
    c: &mut Clients,
    id: &str,
    volume_path: &Path,
    staging: &Path,
) -> VolumeCondition {
    c.node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: volume_path.to_str().unwrap().into(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume_condition
        .expect("VOLUME_CONDITION is advertised: every answer carries a condition")
}

fn abnormal_naming(cond: &VolumeCondition, words: &[&str]) {
    assert!(cond.abnormal, "{cond:?}");
    for w in words {
        assert!(
            cond.message.contains(w),
            "message must name {w:?}: {cond:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_published_volumes_are_normal() {
    let Some(mut rig) = Rig::new(2) else { return };
    let (mut c, id, staging, target) = published(&mut rig).await;
    for path in [&target, &staging] {
        let cond = condition(&mut c, &id, path, &staging).await;
        assert!(!cond.abnormal, "{}: {cond:?}", path.display());
        assert_eq!(cond.message, "mounted");
    }
    // A raw block volume: staging mounts nothing, the device node is bound at the target.
    let cap = requests::capability(Mode::SingleNodeWriter, true);
    let id = requests::create_volume_id(&mut c, "raw", cap.clone()).await;
    let (staging, target) = (rig.path("staging/raw"), rig.path("pods/p2/dev"));
    requests::stage_and_publish(&mut c, &id, &staging, &target, cap).await;
    let cond = condition(&mut c, &id, &target, &staging).await;
    assert!(!cond.abnormal, "raw block: {cond:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_mount_unmounted_behind_the_driver_is_abnormal() {
    let Some(mut rig) = Rig::new(1) else { return };
    let (mut c, id, staging, target) = published(&mut rig).await;
    run("umount", &["-l", staging.to_str().unwrap()]);
    // The target still holds the filesystem; the staging path does not.
    let cond = condition(&mut c, &id, &target, &staging).await;
    abnormal_naming(
        &cond,
        &[
            staging.to_str().unwrap(),
            "no longer has the volume mounted",
        ],
    );
    let cond = condition(&mut c, &id, &staging, &staging).await;
    abnormal_naming(&cond, &[staging.to_str().unwrap(), "no longer mounted"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_remounted_read_only_is_abnormal() {
    let Some(mut rig) = Rig::new(1) else { return };
    let (mut c, id, staging, target) = published(&mut rig).await;
    run("mount", &["-o", "remount,ro", staging.to_str().unwrap()]);
    for path in [&target, &staging] {
        let cond = condition(&mut c, &id, path, &staging).await;
        abnormal_naming(&cond, &["read-only"]);
    }
}

/// ext4 with errors=remount-ro after an error: since Linux 6.10 the super options stay
/// `rw` and show `emergency_ro` (older kernels: `ro`); either way writes fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ext4_error_with_errors_remount_ro_is_abnormal() {
    let Some(mut rig) = Rig::new(1) else { return };
    let (mut c, id, staging, target) = published(&mut rig).await;
    let name = rig.loops[0]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let trigger = format!("/sys/fs/ext4/{name}/trigger_fs_error");
    if !Path::new(&trigger).exists() {
        common::skip(&format!("{trigger} is missing (kernel without it)"));
        return;
    }
    run(
        "mount",
        &["-o", "remount,errors=remount-ro", staging.to_str().unwrap()],
    );
    assert!(!condition(&mut c, &id, &target, &staging).await.abnormal);
    fs::write(&trigger, "gds-csi volume condition test").unwrap();
    let err = fs::write(target.join("after-error"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    for path in [&target, &staging] {
        let cond = condition(&mut c, &id, path, &staging).await;
        abnormal_naming(&cond, &["read-only", "dmesg"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_no_longer_a_mount_is_abnormal() {
    let Some(mut rig) = Rig::new(1) else { return };
    let (mut c, id, staging, target) = published(&mut rig).await;
    run("umount", &[target.to_str().unwrap()]);
    assert!(target.is_dir(), "the directory stays, empty");
    let cond = condition(&mut c, &id, &target, &staging).await;
    abnormal_naming(&cond, &[target.to_str().unwrap(), "no longer mounted"]);
}

/// GET /metrics of the driver at `addr`, the body.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_gauges_count_unavailable_and_excluded_devices() {
    let Some(mut rig) = Rig::new(2) else { return };
    // One device with a foreign filesystem (classified unavailable at start), one clean.
    run("mkfs.ext4", &["-q", rig.loops[0].to_str().unwrap()]);
    let plain_file = rig.path("not-a-device");
    fs::write(&plain_file, b"").unwrap();
    let missing = rig.path("no-such-device");
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let args = [
        "--metrics-address",
        &addr,
        "--pool-device",
        plain_file.to_str().unwrap(),
        "--pool-device",
        missing.to_str().unwrap(),
    ];
    let _c = rig.start_with(&[], &args).await;
    let text = scrape(&addr);
    let want = [
        ("gds_csi_pool_devices{state=\"total\"}", 2.0),
        ("gds_csi_pool_devices{state=\"free\"}", 1.0),
        ("gds_csi_pool_devices{state=\"allocated\"}", 0.0),
        ("gds_csi_pool_devices{state=\"unavailable\"}", 1.0),
        (
            "gds_csi_pool_bytes{state=\"unavailable\"}",
            common::SIZE as f64,
        ),
        ("gds_csi_pool_excluded_devices", 2.0),
    ];
    for (name, value) in want {
        assert_eq!(sample(&text, name), Some(value), "{name} in\n{text}");
    }
    // The driver said why each was left out.
    let logs = rig.logs();
    for path in [&plain_file, &missing, &rig.loops[0]] {
        assert!(logs.contains(path.to_str().unwrap()), "{path:?}: {logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_fails_is_a_refusal_named_by_create_volume() {
    let Some(mut rig) = Rig::new(1) else { return };
    let dev = rig.loops[0].clone();
    let mut c = rig.start().await;
    // Clean at start (classified free); its probe fails at CreateVolume.
    rig.tools.fail_probe_of(&dev);
    let req = requests::create_without_gds("probe", requests::single_writer_mount());
    let err = c.controller.create_volume(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    for w in [
        dev.to_str().unwrap(),
        "signature probe",
        "injected read error",
    ] {
        assert!(err.message().contains(w), "must name {w:?}: {err:?}");
    }
    assert!(rig.state()["volumes"].as_object().unwrap().is_empty());
    assert_eq!(rig.mkfs_count(), 0);

    // A probe failing at start: the device is never free, and the refusal names it.
    rig.kill9();
    let mut c = rig.start().await;
    let err = c.controller.create_volume(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    for w in [dev.to_str().unwrap(), "injected read error"] {
        assert!(err.message().contains(w), "must name {w:?}: {err:?}");
    }
    assert_eq!(requests::capacity(&mut c).await.available_capacity, 0);

    // Healed and rescanned at restart: the same request allocates it.
    rig.tools.heal_probe();
    rig.kill9();
    let mut c = rig.start().await;
    let vol = requests::create_volume(&mut c, req).await;
    assert!(
        rig.state()["volumes"].get(&vol.volume_id).is_some(),
        "{:?}",
        rig.state()
    );
}
