//! Incremental snapshots through the real binary on loop devices and a directory store:
//! each snapshot of a volume after its first links the files unchanged since the last one
//! and copies the rest, stays a whole tree of its own (the middle one of three deleted,
//! the others restore byte for byte; all deleted, the store is as empty as before), and a
//! store writer who changes the base gets a full copy of the tenant's bytes, never theirs.
//! The figures (an unchanged volume, 10 % of its files changed) are an ignored bench:
//! `cargo test --release --test snapshot_incremental_root -- --ignored --nocapture`.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Instant;

use gds_csi::csi::Clients;

mod common;
use common::snapshots::{
    assert_same_tree, bytes_used, delete_snapshot, restore_req, snapshot_req, stage_publish,
    store_dir, take, take_down, tree_state,
};
use common::{requests, Rig};

fn manifest(store: &Path, name: &str) -> serde_json::Value {
    let text = fs::read_to_string(store.join(name).join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// `count` files of `size` bytes below `root/set`, 100 to a directory, each byte a
/// function of the file's number and `seed`.
fn write_files(root: &Path, count: usize, size: usize, seed: u8) {
    for i in 0..count {
        let dir = root.join(format!("set/d{}", i / 100));
        fs::create_dir_all(&dir).unwrap();
        let byte = (i as u8).wrapping_mul(31).wrapping_add(seed);
        fs::write(dir.join(format!("f{i}")), vec![byte; size]).unwrap();
    }
}

/// Volume `id` staged and published, `change` run on its files, taken down again: the
/// tree's state as a restore must give it back.
async fn change(
    c: &mut Clients,
    rig: &Rig,
    id: &str,
    tag: &str,
    change: impl FnOnce(&Path),
) -> std::collections::BTreeMap<String, String> {
    let (staging, target) = stage_publish(c, rig, id, tag).await;
    change(&target);
    let state = tree_state(&target);
    take_down(c, id, &staging, &target).await;
    state
}

/// A restore of `snapshot_id`, staged: its tree's state; the volume deleted after.
async fn restored_state(
    c: &mut Clients,
    rig: &Rig,
    snapshot_id: &str,
    tag: &str,
) -> std::collections::BTreeMap<String, String> {
    let req = restore_req(tag, snapshot_id, requests::single_writer_mount());
    let v = requests::create_volume(c, req).await;
    let (staging, target) = stage_publish(c, rig, &v.volume_id, tag).await;
    let state = tree_state(&target);
    take_down(c, &v.volume_id, &staging, &target).await;
    c.controller
        .delete_volume(requests::delete_request(&v.volume_id))
        .await
        .unwrap();
    state
}

fn first_state(root: &Path) {
    write_files(root, 40, 64 << 10, 0);
    fs::create_dir_all(root.join("ckpt")).unwrap();
    fs::write(root.join("ckpt/step"), b"1200").unwrap();
    nix::unistd::chown(
        &root.join("ckpt/step"),
        Some(1000.into()),
        Some(1001.into()),
    )
    .unwrap();
    fs::set_permissions(root.join("ckpt/step"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink("step", root.join("ckpt/latest")).unwrap();
    fs::write(root.join("ckpt/shared"), vec![9u8; 100_000]).unwrap();
    fs::hard_link(root.join("ckpt/shared"), root.join("ckpt/shared.link")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_snapshots_share_unchanged_files_and_each_restores_alone_after_the_middle_one_goes() {
    let Some(mut rig) = Rig::new(3) else { return };
    let store = store_dir();
    let empty = bytes_used(store.path());
    let mut c = rig.start().await;
    let id = requests::create_volume_id(&mut c, "ckpt", requests::single_writer_mount()).await;
    let state1 = change(&mut c, &rig, &id, "w1", first_state).await;
    let s1 = take(&mut c, snapshot_req("snap-1", &id, store.path())).await;
    let state2 = change(&mut c, &rig, &id, "w2", |root| {
        fs::write(root.join("set/d0/f3"), b"rewritten").unwrap();
        fs::remove_file(root.join("set/d0/f4")).unwrap();
        fs::write(root.join("ckpt/new"), b"new file").unwrap();
    })
    .await;
    let s2 = take(&mut c, snapshot_req("snap-2", &id, store.path())).await;
    let state3 = change(&mut c, &rig, &id, "w3", |root| {
        fs::set_permissions(root.join("set/d0/f5"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(root.join("ckpt/step"), b"1300").unwrap();
    })
    .await;
    let s3 = take(&mut c, snapshot_req("snap-3", &id, store.path())).await;

    let (m1, m2, m3) = (
        manifest(store.path(), "snap-1"),
        manifest(store.path(), "snap-2"),
        manifest(store.path(), "snap-3"),
    );
    assert!(
        m1.get("base_snapshot_id").is_none(),
        "the first is a full copy"
    );
    assert_eq!(m2["base_snapshot_id"], s1.snapshot_id.as_str());
    assert_eq!(m3["base_snapshot_id"], s2.snapshot_id.as_str());
    let (full, second) = (
        m1["written_bytes"].as_u64().unwrap(),
        m2["written_bytes"].as_u64().unwrap(),
    );
    assert!(full >= 40 * (64 << 10), "{m1}");
    assert!(
        second <= 2 * 4096,
        "only the two new small files are written: {second}"
    );
    let tree = |n: &str, rel: &str| store.path().join(n).join("tree").join(rel);
    assert_eq!(
        ino(&tree("snap-1", "set/d0/f0")),
        ino(&tree("snap-3", "set/d0/f0"))
    );
    assert_eq!(
        ino(&tree("snap-1", "ckpt/shared")),
        ino(&tree("snap-3", "ckpt/shared.link"))
    );
    assert_ne!(
        ino(&tree("snap-1", "set/d0/f3")),
        ino(&tree("snap-2", "set/d0/f3"))
    );
    assert_ne!(
        ino(&tree("snap-2", "set/d0/f5")),
        ino(&tree("snap-3", "set/d0/f5")),
        "mode changed"
    );

    delete_snapshot(&mut c, &s2.snapshot_id).await;
    assert_same_tree(
        &restored_state(&mut c, &rig, &s1.snapshot_id, "r1").await,
        &state1,
        "restored",
    );
    assert_same_tree(
        &restored_state(&mut c, &rig, &s3.snapshot_id, "r3").await,
        &state3,
        "restored",
    );
    assert_ne!(state2, state3);
    delete_snapshot(&mut c, &s1.snapshot_id).await;
    assert_same_tree(
        &restored_state(&mut c, &rig, &s3.snapshot_id, "r3b").await,
        &state3,
        "restored",
    );
    delete_snapshot(&mut c, &s3.snapshot_id).await;
    assert_eq!(bytes_used(store.path()), empty, "the store's space is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_writer_who_changes_the_base_gets_the_tenants_bytes_copied_never_theirs() {
    let Some(mut rig) = Rig::new(2) else { return };
    let store = store_dir();
    let mut c = rig.start().await;
    let id = requests::create_volume_id(&mut c, "ckpt", requests::single_writer_mount()).await;
    change(&mut c, &rig, &id, "w1", first_state).await;
    let s1 = take(&mut c, snapshot_req("snap-1", &id, store.path())).await;
    // Another inode of the same size and time in the base's tree, and a symlink out of it.
    let tree = |n: &str, rel: &str| store.path().join(n).join("tree").join(rel);
    let swapped = tree("snap-1", "set/d0/f1");
    let mtime = fs::metadata(&swapped).unwrap().modified().unwrap();
    fs::remove_file(&swapped).unwrap();
    fs::write(&swapped, vec![0xEEu8; 64 << 10]).unwrap();
    fs::File::options()
        .write(true)
        .open(&swapped)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    fs::remove_file(tree("snap-1", "set/d0/f2")).unwrap();
    symlink("/etc/hostname", tree("snap-1", "set/d0/f2")).unwrap();
    let state2 = change(&mut c, &rig, &id, "w2", |root| {
        fs::write(root.join("ckpt/new"), b"new").unwrap();
    })
    .await;
    let s2 = take(&mut c, snapshot_req("snap-2", &id, store.path())).await;
    assert_eq!(
        manifest(store.path(), "snap-2")["base_snapshot_id"],
        s1.snapshot_id.as_str()
    );
    assert_ne!(ino(&tree("snap-2", "set/d0/f1")), ino(&swapped));
    assert_same_tree(
        &restored_state(&mut c, &rig, &s2.snapshot_id, "r2").await,
        &state2,
        "restored",
    );
    // The base's manifest rewritten: it is no base any more (a full copy).
    let path = store.path().join("snap-2/manifest.json");
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, text.replace("\"size\": 65536", "\"size\":  65536")).unwrap();
    let state3 = change(&mut c, &rig, &id, "w3", |root| {
        fs::write(root.join("ckpt/newer"), b"newer").unwrap();
    })
    .await;
    let s3 = take(&mut c, snapshot_req("snap-3", &id, store.path())).await;
    let m3 = manifest(store.path(), "snap-3");
    assert!(
        m3.get("base_snapshot_id").is_none(),
        "{}",
        m3["base_snapshot_id"]
    );
    assert_ne!(
        ino(&tree("snap-3", "set/d0/f0")),
        ino(&tree("snap-2", "set/d0/f0"))
    );
    assert_same_tree(
        &restored_state(&mut c, &rig, &s3.snapshot_id, "r3").await,
        &state3,
        "restored",
    );
}

/// A snapshot of `id` named `name` onto `store`: its seconds and the bytes it wrote.
async fn timed_snapshot(c: &mut Clients, id: &str, store: &Path, name: &str) -> (f64, u64) {
    let started = Instant::now();
    take(c, snapshot_req(name, id, store)).await;
    let seconds = started.elapsed().as_secs_f64();
    (
        seconds,
        manifest(store, name)["written_bytes"].as_u64().unwrap(),
    )
}

/// Seconds and bytes written of snapshots of one volume: a full one (a fresh store each
/// round) against an incremental one of it unchanged, then after 10 % of files changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "bench: 1 GiB in 10,000 files, several snapshots"]
async fn bench_incremental_snapshots() {
    let Some(mut rig) = Rig::with_size(3, 1536 << 20) else {
        return;
    };
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut c = rig.start().await;
    let id = requests::create_volume_id(&mut c, "ckpt", requests::single_writer_mount()).await;
    let (files, size) = (10_000, 100 << 10);
    change(&mut c, &rig, &id, "fill", |root| {
        write_files(root, files, size, 0)
    })
    .await;
    let (mut full, mut same, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut w_full, mut w_same, mut w_changed) = (0, 0, 0);
    for round in 0..rounds {
        let store = store_dir();
        let (t, w) = timed_snapshot(&mut c, &id, store.path(), &format!("full-{round}")).await;
        full.push(t);
        w_full = w;
        let (t, w) = timed_snapshot(&mut c, &id, store.path(), &format!("same-{round}")).await;
        same.push(t);
        w_same = w;
        let seed = round as u8 + 1;
        change(&mut c, &rig, &id, &format!("c{round}"), |root| {
            for i in (0..files).step_by(10) {
                let byte = (i as u8).wrapping_mul(31).wrapping_add(seed);
                fs::write(
                    root.join(format!("set/d{}/f{i}", i / 100)),
                    vec![byte; size],
                )
                .unwrap();
            }
        })
        .await;
        let (t, w) = timed_snapshot(&mut c, &id, store.path(), &format!("changed-{round}")).await;
        changed.push(t);
        w_changed = w;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, s, ch) = (median(&mut full), median(&mut same), median(&mut changed));
    let changed_bytes = (files / 10 * size) as u64;
    println!(
        "snapshot of {files} files of {} KiB, {rounds} rounds, medians:",
        size >> 10
    );
    println!("  full copy       {f:7.2} s  written {w_full} bytes");
    println!("  unchanged       {s:7.2} s  written {w_same} bytes  time {:.3} x full, bytes {:.4} x full", s / f, w_same as f64 / w_full as f64);
    println!(
        "  10 % changed    {ch:7.2} s  written {w_changed} bytes  {:.3} x the changed bytes",
        w_changed as f64 / changed_bytes as f64
    );
    assert!(w_same as f64 <= 0.01 * w_full as f64);
    assert!(w_changed as f64 <= 1.1 * changed_bytes as f64);
}
