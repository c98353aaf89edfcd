//! Root-only: `gds-csi pool discover` on loop devices (blank, ext4 holding a file, a GPT
//! with partitions the kernel shows, a mounted ext4) gives each its verdict and says what
//! is on it, writes nothing, and the driver started on the same devices takes exactly the
//! one it called taken.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::path::Path;
use std::process::Command;

use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{digest_file, requests, run, PartRig};

const MIB: u64 = 1 << 20;

fn discover(rig: &PartRig) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gds-csi"));
    cmd.args(["pool", "discover", "--json", "--state-dir"])
        .arg(rig.0.path("state"))
        .env("PATH", rig.0.tools.path_env());
    for dev in &rig.0.loops {
        cmd.arg("--pool-device").arg(dev);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn entry<'a>(found: &'a serde_json::Value, dev: &Path) -> &'a serde_json::Value {
    let all = found.as_array().unwrap();
    all.iter()
        .find(|c| c["device"] == dev.to_str().unwrap())
        .unwrap_or_else(|| panic!("{} not listed: {found}", dev.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_gives_the_pools_own_verdict_and_changes_nothing() {
    let Some(mut rig) = PartRig::with_size(4, 64 * MIB) else {
        return;
    };
    let d = rig.0.loops.clone();
    // 1: ext4 holding a file; 2: a GPT with two partitions the kernel shows; 3: ext4 mounted.
    run("mkfs.ext4", &["-q", d[1].to_str().unwrap()]);
    let mnt = rig.0.path("mnt-1");
    fs::create_dir_all(&mnt).unwrap();
    run("mount", &[d[1].to_str().unwrap(), mnt.to_str().unwrap()]);
    fs::write(mnt.join("keep"), b"data").unwrap();
    run("umount", &[mnt.to_str().unwrap()]);
    let gpt = d[2].to_str().unwrap();
    run("sgdisk", &["--new=1:2048:+8M", "--new=2:0:+8M", gpt]);
    run("partx", &["-u", gpt]);
    // Inode tables written by mkfs: ext4's lazy init thread would write them while mounted.
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            d[3].to_str().unwrap(),
        ],
    );
    let mnt = rig.0.path("mnt-3");
    fs::create_dir_all(&mnt).unwrap();
    run("mount", &[d[3].to_str().unwrap(), mnt.to_str().unwrap()]);
    let before: Vec<Vec<u8>> = d.iter().map(|p| digest_file(p)).collect();

    let found = discover(&rig);
    assert_eq!(found.as_array().unwrap().len(), 4, "{found}");
    let blank = entry(&found, &d[0]);
    assert_eq!(blank["verdict"]["verdict"], "taken", "{blank}");
    assert_eq!(blank["signatures"], "none");
    assert_eq!(blank["sizeBytes"], 64 * MIB);
    let ext4 = entry(&found, &d[1]);
    assert_eq!(ext4["verdict"]["verdict"], "refused", "{ext4}");
    assert!(
        ext4["signatures"].as_str().unwrap().contains("ext4"),
        "{ext4}"
    );
    let gpt = entry(&found, &d[2]);
    assert_eq!(gpt["verdict"]["verdict"], "refused", "{gpt}");
    assert!(gpt["signatures"].as_str().unwrap().contains("gpt"), "{gpt}");
    assert_eq!(gpt["partitions"].as_array().unwrap().len(), 2, "{gpt}");
    let mounted = entry(&found, &d[3]);
    assert_eq!(mounted["verdict"]["verdict"], "refused", "{mounted}");
    assert!(
        mounted["mounts"][0].as_str().unwrap().contains("mnt-3"),
        "{mounted}"
    );
    let after: Vec<Vec<u8>> = d.iter().map(|p| digest_file(p)).collect();
    assert_eq!(before, after, "discover wrote to a device");
    assert!(!rig.0.path("state").exists(), "discover made a state dir");
    let text = Command::new(env!("CARGO_BIN_EXE_gds-csi"))
        .args(["pool", "discover", "--pool-device", d[0].to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("verdict: taken into the pool"), "{text}");

    // The driver on the same devices: the blank one is allocated, then nothing.
    let mut c = rig.0.start().await;
    let mut req = requests::create_without_gds("whole-0", requests::single_writer_mount());
    req.capacity_range = Some(CapacityRange {
        required_bytes: MIB as i64,
        limit_bytes: 0,
    });
    let v = requests::create_volume(&mut c, req.clone()).await;
    let want = gds_csi::pool::inventory::device_id("dev", &format!("path:{}", d[0].display()));
    assert!(v.volume_id.contains(&want), "{} on {want}", v.volume_id);
    req.name = "whole-1".into();
    let err = c.controller.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let found = discover(&rig);
    let blank = entry(&found, &d[0]);
    assert_eq!(blank["verdict"]["verdict"], "inPool", "{blank}");
    run("umount", &[mnt.to_str().unwrap()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_warns_and_every_layout_says_what_to_set() {
    let Some(mut rig) = common::Rig::with_sizes(&[]) else {
        return;
    };
    let mut c = rig.start().await;
    let whole = requests::create_without_gds("whole", requests::single_writer_mount());
    let part = requests::partition_create("part", 16 * MIB);
    for req in [whole, part] {
        let err = c.controller.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        for words in [
            "node node-a's device pool is empty",
            "node.poolDevices",
            "pool discover",
        ] {
            assert!(err.message().contains(words), "{words:?} in {err}");
        }
    }
    let log = fs::read_to_string(rig.log_path(1)).unwrap();
    let warn = log.lines().find(|l| l.contains("device pool is empty"));
    assert!(warn.is_some_and(|l| l.contains("WARN")), "{log}");
}
