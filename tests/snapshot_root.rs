//! Snapshots through the real binary on loop devices, kept on a directory store that a
//! second driver (another node id, its own state dir and pool) also reaches:
//! - a volume nobody uses: its files (owners, modes, links, holes) in `tree/` with a
//!   manifest; the source volume deleted; restored on the other node byte for byte;
//!   DeleteSnapshot refused while a restore of it is not filled yet, then allowed;
//! - a mounted volume under a steady writer: the snapshot is a state that existed (every
//!   file the writer's counter names complete, nothing past the next), the filesystem
//!   frozen only for the last pass and thawed (the writer goes on); with a freeze limit
//!   too short for that pass it fails Aborted, thawed, nothing listed ready;
//! - volumes without a filesystem: one nobody wrote is an empty snapshot that restores
//!   to a usable volume; one in use as a raw block device is refused FailedPrecondition.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gds_csi::csi::volume_content_source::Type;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::snapshots::{restore_req, snapshot_req, stage_publish, store_dir, take, take_down};
use common::{digest_file, requests, Rig};

fn fill(root: &Path) {
    fs::create_dir_all(root.join("ckpt/deep")).unwrap();
    let payload: Vec<u8> = (0..(3 << 20) + 7)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    fs::write(root.join("ckpt/weights.bin"), &payload).unwrap();
    fs::write(root.join("ckpt/deep/meta"), b"step 1200").unwrap();
    nix::unistd::chown(
        &root.join("ckpt/deep/meta"),
        Some(1000.into()),
        Some(1001.into()),
    )
    .unwrap();
    fs::set_permissions(
        root.join("ckpt/deep/meta"),
        fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    symlink("weights.bin", root.join("ckpt/latest")).unwrap();
    fs::hard_link(
        root.join("ckpt/weights.bin"),
        root.join("ckpt/weights.link"),
    )
    .unwrap();
    // A sparse file: 1 MiB of data after an 8 MiB hole.
    let f = fs::File::create(root.join("ckpt/sparse")).unwrap();
    f.write_all_at(&[7u8; 1 << 20], 8 << 20).unwrap();
}

fn check_filled(root: &Path, original: &Path) {
    for rel in ["ckpt/weights.bin", "ckpt/deep/meta", "ckpt/sparse"] {
        assert_eq!(
            digest_file(&root.join(rel)),
            digest_file(&original.join(rel)),
            "{rel}"
        );
    }
    let meta = fs::metadata(root.join("ckpt/deep/meta")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1000, 1001, 0o640)
    );
    assert_eq!(
        fs::read_link(root.join("ckpt/latest")).unwrap(),
        Path::new("weights.bin")
    );
    let ino = |p: &str| fs::metadata(root.join(p)).unwrap().ino();
    assert_eq!(ino("ckpt/weights.bin"), ino("ckpt/weights.link"));
    let sparse = fs::metadata(root.join("ckpt/sparse")).unwrap();
    assert!(
        sparse.blocks() * 512 < 4 << 20,
        "holes kept: {} blocks",
        sparse.blocks()
    );
}

fn manifest(store: &Path, name: &str) -> serde_json::Value {
    let text = fs::read_to_string(store.join(name).join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The volume answers the snapshot as its content source.
fn assert_restored_from(v: &Volume, snapshot_id: &str) {
    match v.content_source.as_ref().and_then(|s| s.r#type.as_ref()) {
        Some(Type::Snapshot(s)) => assert_eq!(s.snapshot_id, snapshot_id),
        other => panic!("content source {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_leaves_its_node_and_restores_on_another_byte_for_byte() {
    let Some(mut a) = Rig::new(2) else { return };
    let Some(mut b) = Rig::new(1) else { return };
    let store = store_dir();
    let mut ca = a.start().await;
    let source = requests::create_volume_id(&mut ca, "ckpt", requests::single_writer_mount()).await;
    let (staging, target) = stage_publish(&mut ca, &a, &source, "src").await;
    fill(&target);
    let original = a.path("original");
    fs::create_dir_all(&original).unwrap();
    assert!(std::process::Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(target.join("ckpt"))
        .arg(&original)
        .status()
        .unwrap()
        .success());
    take_down(&mut ca, &source, &staging, &target).await;

    let snap = take(&mut ca, snapshot_req("snap-1", &source, store.path())).await;
    assert_eq!(snap.source_volume_id, source);
    assert!(
        snap.size_bytes >= 64 << 20,
        "restore size is the source's capacity"
    );
    assert!(
        snap.snapshot_id.starts_with("snap:dir:"),
        "{}",
        snap.snapshot_id
    );
    let m = manifest(store.path(), "snap-1");
    assert_eq!(m["content"], "files");
    assert_eq!(m["fs_type"], "ext4");
    let weights = m["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "ckpt/weights.bin")
        .unwrap()
        .clone();
    let want: String = digest_file(&original.join("ckpt/weights.bin"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(weights["sha256"], want.as_str());
    // A file with holes records where its data is (what a restore reads of it); a dense
    // file records nothing.
    let entry = |path: &str| {
        m["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == path)
            .unwrap()
            .clone()
    };
    assert_eq!(
        entry("ckpt/sparse")["data"],
        serde_json::json!([[8 << 20, 9 << 20]])
    );
    assert!(weights.get("data").is_none(), "{weights}");
    // Idempotent: the same name and source answer the same snapshot.
    let again = take(&mut ca, snapshot_req("snap-1", &source, store.path())).await;
    assert_eq!(again.snapshot_id, snap.snapshot_id);
    assert_eq!(again.creation_time, snap.creation_time);
    // The same name of another volume is AlreadyExists.
    let other = requests::create_volume_id(&mut ca, "other", requests::single_writer_mount()).await;
    let e = ca
        .controller
        .create_snapshot(snapshot_req("snap-1", &other, store.path()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // The source volume and its node's copy go; the snapshot stays.
    ca.controller
        .delete_volume(requests::delete_request(&source))
        .await
        .unwrap();
    a.kill9();

    // Another node, its own pool and state, the same store.
    let mut cb = b.start_as("node-b", &[], &[]).await;
    let listed = cb
        .controller
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1, "found on the store by its id");
    assert!(listed.entries[0].snapshot.as_ref().unwrap().ready_to_use);
    let restore = restore_req(
        "restored",
        &snap.snapshot_id,
        requests::single_writer_mount(),
    );
    let restored = requests::create_volume(&mut cb, restore.clone()).await;
    assert!(
        restored.volume_id.ends_with(":node-b"),
        "{}",
        restored.volume_id
    );
    assert_restored_from(&restored, &snap.snapshot_id);
    // Not filled yet: the snapshot cannot go, asked on either node (the mark on the store).
    let mut ca = a.start().await;
    for c in [&mut cb, &mut ca] {
        let e = c
            .controller
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snap.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains(&restored.volume_id), "{}", e.message());
    }
    let (rs, rt) = stage_publish(&mut cb, &b, &restored.volume_id, "restored").await;
    check_filled(&rt, &original);
    take_down(&mut cb, &restored.volume_id, &rs, &rt).await;
    // Filled: the node that took it deletes it.
    ca.controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        !store.path().join("snap-1").exists(),
        "removed from the store"
    );
    let e = cb
        .controller
        .create_volume(restore_req(
            "late",
            &snap.snapshot_id,
            requests::single_writer_mount(),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // The volume made from it, asked for again (a provisioner's retry): the same volume,
    // with the snapshot as its source, not NotFound; nothing comes back on the store.
    let again = requests::create_volume(&mut cb, restore).await;
    assert_eq!(again.volume_id, restored.volume_id);
    assert_restored_from(&again, &snap.snapshot_id);
    assert!(
        !store.path().join("snap-1").exists(),
        "the snapshot's directory stays gone"
    );
}

/// Writes `f<n>` (64 KiB of byte n) one after another, then `counter` = n through a
/// rename: in any state the filesystem ever had, every file up to the counter is whole.
fn writer(dir: PathBuf, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        fs::write(dir.join(format!("f{n}")), vec![(n % 251) as u8; 64 << 10]).unwrap();
        fs::write(dir.join("counter.tmp"), n.to_string()).unwrap();
        fs::rename(dir.join("counter.tmp"), dir.join("counter")).unwrap();
        written.store(n + 1, Ordering::Relaxed);
        n += 1;
        if n.is_multiple_of(200) {
            // Room on a 64 MiB volume: the oldest files go, as checkpoints rotate.
            for old in n.saturating_sub(400)..n.saturating_sub(200) {
                let _ = fs::remove_file(dir.join(format!("f{old}")));
            }
        }
    }
}

/// [`writer`] on its own thread.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    fn start(dir: &Path) -> Writer {
        let (stop, written) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (d, s, w) = (dir.to_owned(), Arc::clone(&stop), Arc::clone(&written));
        let thread = std::thread::spawn(move || writer(d, s, w));
        Writer {
            stop,
            written,
            thread,
        }
    }

    /// Waits (30 s at most) until the writer has written more than `n` files.
    async fn wait_past(&self, n: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.written.load(Ordering::Relaxed) <= n {
            assert!(Instant::now() < deadline, "the writer wrote no {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops it; how many files it wrote.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.written.load(Ordering::Relaxed)
    }
}

fn check_consistent(tree: &Path) -> u64 {
    let n: u64 = fs::read_to_string(tree.join("counter"))
        .unwrap()
        .parse()
        .unwrap();
    for i in n.saturating_sub(150)..=n {
        let data = fs::read(tree.join(format!("f{i}"))).unwrap();
        assert_eq!(
            data,
            vec![(i % 251) as u8; 64 << 10],
            "f{i} whole at counter {n}"
        );
    }
    assert!(
        !tree.join(format!("f{}", n + 2)).exists(),
        "nothing past the next file"
    );
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_volume_under_a_writer_is_frozen_only_for_the_last_pass() {
    let Some(mut rig) = Rig::new(2) else { return };
    let store = store_dir();
    let mut c = rig.start().await;
    let id = requests::create_volume_id(&mut c, "busy", requests::single_writer_mount()).await;
    let (staging, target) = stage_publish(&mut c, &rig, &id, "busy").await;
    let w = Writer::start(&target);
    w.wait_past(300, "its first files").await;
    let snap = take(&mut c, snapshot_req("busy-1", &id, store.path())).await;
    let at_snapshot = check_consistent(&store.path().join("busy-1/tree"));
    let m = manifest(store.path(), "busy-1");
    let frozen = m["freeze_seconds"].as_f64().unwrap();
    assert!(frozen < 5.0, "frozen {frozen} s");
    // A volume in use may have changed since its copy: no data extents are recorded.
    assert!(
        !m.to_string().contains("\"data\""),
        "extents recorded of a live source"
    );
    // Thawed: the writer goes on past what the snapshot holds.
    w.wait_past(at_snapshot + 50, "more files: left frozen?")
        .await;
    let total = w.stop();
    eprintln!(
        "snapshot under a steady writer: frozen {frozen:.3} s, counter {at_snapshot} of {total}"
    );
    assert!(rig.logs().contains("froze it for the last pass"));
    // Restored on this node: the state the snapshot holds.
    let restored = requests::create_volume(
        &mut c,
        restore_req(
            "busy-restored",
            &snap.snapshot_id,
            requests::single_writer_mount(),
        ),
    );
    let e = restored.await;
    let (rs, rt) = stage_publish(&mut c, &rig, &e.volume_id, "busy-restored").await;
    assert_eq!(check_consistent(&rt), at_snapshot);
    take_down(&mut c, &e.volume_id, &rs, &rt).await;
    take_down(&mut c, &id, &staging, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_longer_than_the_limit_fails_the_snapshot_thawed_and_unlisted() {
    let Some(mut rig) = Rig::new(1) else { return };
    let store = store_dir();
    let mut c = rig
        .start_with(&[], &["--snapshot-freeze-limit", "1us"])
        .await;
    let id = requests::create_volume_id(&mut c, "busy", requests::single_writer_mount()).await;
    let (staging, target) = stage_publish(&mut c, &rig, &id, "busy").await;
    let w = Writer::start(&target);
    w.wait_past(100, "its first files").await;
    let e = c
        .controller
        .create_snapshot(snapshot_req("too-slow", &id, store.path()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert!(
        e.message().contains("--snapshot-freeze-limit"),
        "{}",
        e.message()
    );
    let before = w.written.load(Ordering::Relaxed);
    w.wait_past(before + 50, "more files: left frozen?").await;
    w.stop();
    assert!(!store.path().join("too-slow/manifest.json").exists());
    let listed = c
        .controller
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .all(|e| !e.snapshot.as_ref().unwrap().ready_to_use),
        "{listed:?}"
    );
    take_down(&mut c, &id, &staging, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_volumes_snapshot_their_bytes_empty_or_whole_and_are_refused_in_use() {
    let Some(mut rig) = Rig::new(2) else { return };
    let store = store_dir();
    let mut c = rig.start().await;
    let block = requests::capability(
        gds_csi::csi::volume_capability::access_mode::Mode::SingleNodeWriter,
        true,
    );
    let raw = requests::create_volume_id(&mut c, "raw", block.clone()).await;
    let snap = take(&mut c, snapshot_req("blank-1", &raw, store.path())).await;
    assert_eq!(manifest(store.path(), "blank-1")["content"], "empty");
    assert!(!store.path().join("blank-1/device.img").exists());
    // An empty snapshot restores into a usable filesystem volume.
    let restored = requests::create_volume(
        &mut c,
        restore_req(
            "from-blank",
            &snap.snapshot_id,
            requests::single_writer_mount(),
        ),
    )
    .await;
    let (rs, rt) = stage_publish(&mut c, &rig, &restored.volume_id, "from-blank").await;
    fs::write(rt.join("ok"), b"ok").unwrap();
    take_down(&mut c, &restored.volume_id, &rs, &rt).await;
    c.controller
        .delete_volume(requests::delete_request(&restored.volume_id))
        .await
        .unwrap();

    // Bytes written through the raw device: a device snapshot, holes where zeros are.
    let staging = rig.path("staging/raw");
    let target = rig.path("pods/raw/dev");
    fs::create_dir_all(&staging).unwrap();
    requests::stage(&mut c, &raw, &staging, block.clone())
        .await
        .unwrap();
    requests::publish(&mut c, &raw, &staging, &target, block.clone())
        .await
        .unwrap();
    let payload: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8 + 1).collect();
    {
        let dev = fs::OpenOptions::new().write(true).open(&target).unwrap();
        dev.write_all_at(&payload, 16 << 20).unwrap();
        dev.sync_all().unwrap();
    }
    // In use as a raw block device: refused, nothing kept.
    let e = c
        .controller
        .create_snapshot(snapshot_req("raw-busy", &raw, store.path()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("no filesystem to freeze"),
        "{}",
        e.message()
    );
    requests::unpublish(&mut c, &raw, &target).await.unwrap();
    requests::unstage(&mut c, &raw, &staging).await.unwrap();
    let data = take(&mut c, snapshot_req("raw-1", &raw, store.path())).await;
    let m = manifest(store.path(), "raw-1");
    assert_eq!(m["content"], "device");
    let image = fs::metadata(store.path().join("raw-1/device.img")).unwrap();
    assert_eq!(image.len(), 64 << 20);
    assert!(
        image.blocks() * 512 <= 4 << 20,
        "zeros are holes: {} blocks",
        image.blocks()
    );
    // Its bytes restore only raw.
    let e = c
        .controller
        .create_volume(restore_req(
            "as-files",
            &data.snapshot_id,
            requests::single_writer_mount(),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let copy = requests::create_volume(
        &mut c,
        restore_req("raw-copy", &data.snapshot_id, block.clone()),
    )
    .await;
    let (cs, ct) = (rig.path("staging/copy"), rig.path("pods/copy/dev"));
    fs::create_dir_all(&cs).unwrap();
    requests::stage(&mut c, &copy.volume_id, &cs, block.clone())
        .await
        .unwrap();
    requests::publish(&mut c, &copy.volume_id, &cs, &ct, block)
        .await
        .unwrap();
    let mut got = vec![0u8; payload.len()];
    fs::File::open(&ct)
        .unwrap()
        .read_exact_at(&mut got, 16 << 20)
        .unwrap();
    assert!(
        got == payload,
        "the restored device holds the snapshot's bytes"
    );
    let mut zeros = vec![1u8; 1 << 20];
    fs::File::open(&ct)
        .unwrap()
        .read_exact_at(&mut zeros, 40 << 20)
        .unwrap();
    assert!(zeros.iter().all(|&b| b == 0));
    requests::unpublish(&mut c, &copy.volume_id, &ct)
        .await
        .unwrap();
    requests::unstage(&mut c, &copy.volume_id, &cs)
        .await
        .unwrap();
}

/// Only a directory the driver made for a snapshot is written to or removed: a name whose
/// directory on the store holds someone else's files is AlreadyExists with nothing
/// written, and a forged id naming such a directory (or any other) is refused by
/// DeleteSnapshot with the directory untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_the_driver_did_not_make_is_never_written_or_removed() {
    let Some(mut rig) = Rig::new(1) else { return };
    let store = store_dir();
    let mut c = rig.start().await;
    let id = requests::create_volume_id(&mut c, "v", requests::single_writer_mount()).await;
    fs::create_dir_all(store.path().join("precious")).unwrap();
    fs::write(store.path().join("precious/data"), b"keep me").unwrap();
    let e = c
        .controller
        .create_snapshot(snapshot_req("precious", &id, store.path()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(
        e.message().contains("no snapshot of this driver"),
        "{}",
        e.message()
    );
    let names: Vec<_> = fs::read_dir(store.path().join("precious"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["data"], "nothing written beside it");
    let forged = format!(
        "snap:dir:{}:precious",
        store.path().display().to_string().replace('/', "~")
    );
    for id in [forged.as_str(), "snap:dir:~tmp:precious-nowhere"] {
        let r = c
            .controller
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.into(),
                ..Default::default()
            })
            .await;
        if id == forged {
            let e = r.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        } else {
            r.unwrap();
        }
    }
    assert_eq!(
        fs::read(store.path().join("precious/data")).unwrap(),
        b"keep me"
    );
}
