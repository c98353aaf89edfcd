//! Root-only: the `partition` block layout through the real binary on one
//! real loop device: volumes carved as GPT partitions, staged, published, surviving a
//! SIGKILL and a kernel that dropped the partitions, erased and removed on delete,
//! GetCapacity following the carving; a device with a foreign table is never carved.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{digest_file, requests, run, PartRig};

const MIB: u64 = 1 << 20;

fn part_rig(size: u64) -> Option<PartRig> {
    PartRig::with_size(1, size)
}

async fn capacity(c: &mut Clients) -> (u64, u64) {
    let r = c
        .controller
        .get_capacity(GetCapacityRequest {
            parameters: requests::partition_params(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (
        r.available_capacity as u64,
        r.maximum_volume_size.unwrap_or(0) as u64,
    )
}

async fn stage(c: &mut Clients, id: &str, staging: &Path) {
    requests::stage(c, id, staging, requests::single_writer_mount())
        .await
        .unwrap_or_else(|e| panic!("stage {id}: {e}"));
}

async fn publish(c: &mut Clients, id: &str, staging: &Path, target: &Path) {
    requests::publish(c, id, staging, target, requests::single_writer_mount())
        .await
        .unwrap_or_else(|e| panic!("publish {id}: {e}"));
}

/// The partition node's name in sysfs (`loop3p2`) and its start in bytes on the parent.
fn partition_start(parent: &Path, node_name: &str) -> u64 {
    let disk = parent.file_name().unwrap().to_str().unwrap();
    let start = fs::read_to_string(format!("/sys/class/block/{disk}/{node_name}/start")).unwrap();
    start.trim().parse::<u64>().unwrap() * 512
}

fn read_range(dev: &Path, start: u64, len: u64) -> Vec<u8> {
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// The partition node a staged volume's staging path is mounted from.
fn staged_node(staging: &Path) -> String {
    let src = run(
        "findmnt",
        &["-n", "-o", "SOURCE", staging.to_str().unwrap()],
    );
    PathBuf::from(src)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_partitions_on_one_device_live_and_die_apart() {
    let Some(mut rig) = part_rig(256 * MIB) else {
        return;
    };
    let parent = rig.loops[0].clone();
    let mut c = rig.start().await;
    let (free0, max0) = capacity(&mut c).await;
    assert!((250 * MIB..256 * MIB).contains(&free0), "blank: {free0}");
    assert_eq!(max0, free0, "a blank device is one free extent");

    let sizes = [32 * MIB, 48 * MIB, 64 * MIB];
    let mut ids = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let v = requests::create_volume(
            &mut c,
            requests::partition_create(&format!("pv-{i}"), *size),
        )
        .await;
        assert_eq!(v.capacity_bytes as u64, *size);
        assert!(v.volume_id.ends_with(":part"), "{}", v.volume_id);
        ids.push(v.volume_id);
    }
    // CreateVolume again with the same name is the same volume.
    let again = requests::create_volume(&mut c, requests::partition_create("pv-1", sizes[1])).await;
    assert_eq!(again.volume_id, ids[1]);
    let state = rig.state();
    for id in &ids {
        let rec = &state["volumes"][id];
        assert!(rec["partition"]["partuuid"].is_string(), "{rec}");
        assert_eq!(rec["device_id"], state["volumes"][&ids[0]]["device_id"]);
    }
    let carved: u64 = sizes.iter().sum();
    assert_eq!(capacity(&mut c).await.0, free0 - carved);

    let dirs: Vec<(PathBuf, PathBuf)> = (0..3)
        .map(|i| {
            (
                rig.path(&format!("staging{i}")),
                rig.path(&format!("target{i}")),
            )
        })
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let (staging, target) = &dirs[i];
        stage(&mut c, id, staging).await;
        publish(&mut c, id, staging, target).await;
        fs::write(target.join("data"), format!("volume {i}").repeat(1000)).unwrap();
        requests::unpublish(&mut c, id, target).await.unwrap();
        requests::unstage(&mut c, id, staging).await.unwrap();
        stage(&mut c, id, staging).await;
        assert_eq!(
            fs::read_to_string(staging.join("data")).unwrap(),
            format!("volume {i}").repeat(1000),
            "restaged"
        );
    }
    let nodes: Vec<String> = dirs.iter().map(|(s, _)| staged_node(s)).collect();
    assert_eq!(
        nodes.iter().collect::<std::collections::HashSet<_>>().len(),
        3
    );
    for (i, id) in ids.iter().enumerate() {
        requests::unstage(&mut c, id, &dirs[i].0).await.unwrap();
    }

    // SIGKILL, and the kernel forgets every partition: restart and restage find them.
    rig.kill9();
    run("partx", &["-d", parent.to_str().unwrap()]);
    let gone = format!("/sys/class/block/{}", nodes[0]);
    assert!(!Path::new(&gone).exists(), "partx -d left {gone}");
    let mut c = rig.start().await;
    for (i, id) in ids.iter().enumerate() {
        stage(&mut c, id, &dirs[i].0).await;
        assert_eq!(
            fs::read_to_string(dirs[i].0.join("data")).unwrap(),
            format!("volume {i}").repeat(1000),
            "after restart"
        );
    }

    // Delete the middle one: its range reads back zeros, its partition is gone.
    let start = partition_start(&parent, &nodes[1]);
    requests::unstage(&mut c, &ids[1], &dirs[1].0)
        .await
        .unwrap();
    c.controller
        .delete_volume(requests::delete_request(&ids[1]))
        .await
        .unwrap();
    assert!(
        read_range(&parent, start, sizes[1]).iter().all(|b| *b == 0),
        "the freed range is not zeroed"
    );
    let disk = parent.file_name().unwrap().to_str().unwrap();
    assert!(!Path::new(&format!("/sys/class/block/{disk}/{}", nodes[1])).exists());
    assert!(rig.state()["volumes"].get(&ids[1]).is_none());
    let (free, max) = capacity(&mut c).await;
    assert_eq!(free, free0 - sizes[0] - sizes[2]);
    assert!(max >= sizes[1] && max < free, "largest hole {max}");
    // The others are untouched.
    for i in [0, 2] {
        assert_eq!(
            fs::read_to_string(dirs[i].0.join("data")).unwrap(),
            format!("volume {i}").repeat(1000)
        );
    }
    for i in [0, 2] {
        requests::unstage(&mut c, &ids[i], &dirs[i].0)
            .await
            .unwrap();
        c.controller
            .delete_volume(requests::delete_request(&ids[i]))
            .await
            .unwrap();
    }
    assert_eq!(capacity(&mut c).await, (free0, free0));
    // Carved once, the device is no free whole device, even with no partition left.
    assert_eq!(requests::capacity(&mut c).await.available_capacity, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_partition_table_is_never_carved() {
    let Some(mut rig) = part_rig(64 * MIB) else {
        return;
    };
    let dev = rig.loops[0].clone();
    let out = std::process::Command::new("sfdisk")
        .args(["--quiet", "--label", "gpt", dev.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            use std::io::Write;
            ch.stdin.take().unwrap().write_all(b"size=8M\n")?;
            ch.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "sfdisk");
    let _ = std::process::Command::new("partx")
        .args(["-d", dev.to_str().unwrap()])
        .status();
    let before = digest_file(&dev);
    let mut c = rig.start().await;
    assert_eq!(capacity(&mut c).await, (0, 0));
    let err = c
        .controller
        .create_volume(requests::partition_create("pv", 8 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    rig.kill9();
    assert_eq!(digest_file(&dev), before, "the foreign device changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_layout_is_invalid_argument_naming_the_field() {
    let Some(mut rig) = part_rig(64 * MIB) else {
        return;
    };
    let before = digest_file(&rig.loops[0]);
    let mut c = rig.start().await;
    let mut req = requests::partition_create("pv", 8 * MIB);
    req.parameters.insert("layout".into(), "raid0".into());
    let err = c.controller.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("parameters.layout"), "{err}");
    rig.kill9();
    assert_eq!(digest_file(&rig.loops[0]), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_whose_label_is_full_of_entries_passes_the_next_claims_on() {
    // Room for 255 partitions of 2 MiB (the smallest ext4 that stages) with their growth
    // room (1 MiB each): the entries run out before the space.
    let Some(mut rig) = PartRig::with_size(2, 1024 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    let mut on = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..256 {
        let v = requests::create_volume(
            &mut c,
            requests::partition_create(&format!("v{i}"), 2 * MIB),
        )
        .await;
        let device = v.volume_id.split(':').nth(1).unwrap().to_owned();
        *on.entry(device).or_default() += 1;
    }
    let counts: Vec<usize> = on.values().copied().collect();
    assert_eq!(
        counts.len(),
        2,
        "the 256th claim went to the second device: {on:?}"
    );
    assert!(counts.contains(&255), "{on:?}");
    // GetCapacity counts no space behind a full label.
    let (available, _) = capacity(&mut c).await;
    assert!(available < 1024 * MIB, "{available}");
    assert!(available > 100 * MIB, "{available}");
}
