//! A snapshot store tampered with by someone who can write to it, through the real binary
//! on loop devices and a directory store: a symlink anywhere in a snapshot is refused and
//! never followed (no host file reaches a volume, nothing is written outside the store, no
//! file's contents reach a message); a directory is a snapshot only when it names itself;
//! one name, one directory; ready means restorable; a full store is ResourceExhausted.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::os::unix::fs::{symlink, FileExt};
use std::path::Path;
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::volume_content_source::{SnapshotSource, Type};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{requests, Rig};

const SECRET: &str = "host-secret-7f3a";

fn snapshot_req(name: &str, source: &str, store: &Path) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        parameters: [("storeDir".to_string(), store.display().to_string())].into(),
        ..Default::default()
    }
}

/// CreateSnapshot repeated until ready, or its first error.
async fn take(c: &mut Clients, req: CreateSnapshotRequest) -> Result<Snapshot, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = c.controller.create_snapshot(req.clone()).await?;
        let s = s.into_inner().snapshot.unwrap();
        if s.ready_to_use {
            return Ok(s);
        }
        assert!(Instant::now() < deadline, "{} never ready", req.name);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn restore_req(name: &str, snapshot_id: &str, cap: VolumeCapability) -> CreateVolumeRequest {
    let mut req = requests::create_without_gds(name, cap);
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.into(),
        })),
    });
    req
}

fn tmp(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap()
}

/// A filesystem volume holding `data.bin` = `content`, unstaged again.
async fn volume_with(c: &mut Clients, rig: &Rig, name: &str, content: &[u8]) -> String {
    let id = requests::create_volume_id(c, name, requests::single_writer_mount()).await;
    let (staging, target) = (
        rig.path(&format!("staging/{name}")),
        rig.path(&format!("pods/{name}/v")),
    );
    let cap = requests::single_writer_mount();
    requests::stage_and_publish(c, &id, &staging, &target, cap).await;
    fs::write(target.join("data.bin"), content).unwrap();
    requests::unpublish(c, &id, &target).await.unwrap();
    requests::unstage(c, &id, &staging).await.unwrap();
    id
}

async fn list(c: &mut Clients, snapshot_id: &str) -> Vec<Snapshot> {
    c.controller
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: snapshot_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.snapshot)
        .collect()
}

async fn delete_snapshot(c: &mut Clients, id: &str) -> Result<(), tonic::Status> {
    c.controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop)
}

fn assert_refused(e: &tonic::Status, code: Code, needle: &str) {
    assert_eq!(e.code(), code, "{e:?}");
    assert!(e.message().contains(needle), "{}", e.message());
    assert!(
        !e.message().contains(SECRET),
        "a file's contents in a message: {e:?}"
    );
}

/// `tree/`, the snapshot directory itself and `restores/` planted as symlinks: every call
/// refuses, nothing of the host reaches a volume or a message, nothing is written outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_anywhere_in_a_snapshot_is_refused_and_never_followed() {
    let Some(mut rig) = Rig::new(3) else { return };
    let (store, host) = (tmp("gds-store-"), tmp("gds-host-"));
    fs::write(host.path().join("secret.txt"), SECRET).unwrap();
    let mut c = rig.start().await;
    let source = volume_with(&mut c, &rig, "src", b"snapshot data").await;
    let snap = take(&mut c, snapshot_req("s1", &source, store.path()))
        .await
        .unwrap();
    let dir = store.path().join("s1");

    // tree/ swapped for a link to a host directory: the fill refuses, the volume stays
    // unfilled, and fills from the real tree once the store is repaired.
    fs::rename(dir.join("tree"), dir.join("tree.real")).unwrap();
    symlink(host.path(), dir.join("tree")).unwrap();
    let cap = requests::single_writer_mount();
    let restored =
        requests::create_volume(&mut c, restore_req("r1", &snap.snapshot_id, cap.clone())).await;
    let (staging, target) = (rig.path("staging/r1"), rig.path("pods/r1/v"));
    fs::create_dir_all(&staging).unwrap();
    let e = requests::stage(&mut c, &restored.volume_id, &staging, cap.clone())
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "symlink");
    fs::remove_file(dir.join("tree")).unwrap();
    fs::rename(dir.join("tree.real"), dir.join("tree")).unwrap();
    requests::stage_and_publish(&mut c, &restored.volume_id, &staging, &target, cap.clone()).await;
    assert_eq!(fs::read(target.join("data.bin")).unwrap(), b"snapshot data");
    assert!(!target.join("secret.txt").exists());

    // restores/ a link to the host directory: a restore is refused (no mark written
    // there), and DeleteSnapshot's refusal repeats no file's contents.
    fs::remove_dir_all(dir.join("restores")).ok();
    symlink(host.path(), dir.join("restores")).unwrap();
    let e = c
        .controller
        .create_volume(restore_req("r2", &snap.snapshot_id, cap.clone()))
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "symlink");
    let e = delete_snapshot(&mut c, &snap.snapshot_id)
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "restores");
    let names: Vec<_> = fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["secret.txt"],
        "nothing written into the host directory"
    );
    fs::remove_file(dir.join("restores")).unwrap();

    // A forged id naming a directory with a restores/ of someone else's: refused before
    // anything in it is read.
    fs::create_dir_all(store.path().join("forged/restores")).unwrap();
    fs::write(store.path().join("forged/restores/x"), SECRET).unwrap();
    let forged = format!(
        "snap:dir:{}:forged",
        store.path().display().to_string().replace('/', "~")
    );
    let e = delete_snapshot(&mut c, &forged).await.unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "no directory of snapshot");
    assert!(store.path().join("forged/restores/x").exists());

    // The snapshot's directory planted as a link before CreateSnapshot: refused, nothing
    // written where it points.
    let elsewhere = tmp("gds-elsewhere-");
    symlink(elsewhere.path(), store.path().join("s2")).unwrap();
    let e = take(&mut c, snapshot_req("s2", &source, store.path()))
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "symlink");
    assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    requests::unpublish(&mut c, &restored.volume_id, &target)
        .await
        .unwrap();
    requests::unstage(&mut c, &restored.volume_id, &staging)
        .await
        .unwrap();
}

/// A raw block snapshot's `device.img` swapped for a link to a host file: the restore's
/// fill refuses, and the new device never holds the host file's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_snapshot_image_that_is_a_symlink_is_never_copied() {
    let Some(mut rig) = Rig::new(2) else { return };
    let (store, host) = (tmp("gds-store-"), tmp("gds-host-"));
    let mut c = rig.start().await;
    let block = requests::capability(Mode::SingleNodeWriter, true);
    let raw = requests::create_volume_id(&mut c, "raw", block.clone()).await;
    let (staging, target) = (rig.path("staging/raw"), rig.path("pods/raw/dev"));
    requests::stage_and_publish(&mut c, &raw, &staging, &target, block.clone()).await;
    let dev = fs::OpenOptions::new().write(true).open(&target).unwrap();
    dev.write_all_at(&[0x11; 4096], 0).unwrap();
    dev.sync_all().unwrap();
    drop(dev);
    requests::unpublish(&mut c, &raw, &target).await.unwrap();
    requests::unstage(&mut c, &raw, &staging).await.unwrap();
    let snap = take(&mut c, snapshot_req("raw-1", &raw, store.path()))
        .await
        .unwrap();
    let image = store.path().join("raw-1/device.img");
    let host_file = host.path().join("host.img");
    fs::write(&host_file, [0x5a; 65536]).unwrap();
    fs::remove_file(&image).unwrap();
    symlink(&host_file, &image).unwrap();

    let restored =
        requests::create_volume(&mut c, restore_req("r", &snap.snapshot_id, block.clone())).await;
    let rs = rig.path("staging/r");
    fs::create_dir_all(&rs).unwrap();
    let e = requests::stage(&mut c, &restored.volume_id, &rs, block.clone())
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "symlink");
    let mut head = [0u8; 4096];
    fs::File::open(&rig.loops[1])
        .unwrap()
        .read_exact_at(&mut head, 0)
        .unwrap();
    assert!(
        !head.contains(&0x5a),
        "the host file's bytes reached the device"
    );
    requests::unstage(&mut c, &restored.volume_id, &rs)
        .await
        .unwrap();
}

/// A directory is a snapshot only when it names itself; one name, one directory; ready
/// means a readable manifest naming the snapshot is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_directory_that_names_the_snapshot_is_that_snapshot() {
    let Some(mut rig) = Rig::new(3) else { return };
    let store = tmp("gds-store-");
    let mut c = rig.start().await;
    let a = volume_with(&mut c, &rig, "a", b"data of a").await;
    let orig = take(&mut c, snapshot_req("orig", &a, store.path()))
        .await
        .unwrap();

    // Another directory holding copies of its id file and manifest is not it.
    let (dir, evil) = (store.path().join("orig"), store.path().join("evil"));
    fs::create_dir_all(evil.join("tree")).unwrap();
    fs::write(evil.join("tree/data.bin"), b"planted").unwrap();
    for f in ["snapshot-id", "manifest.json"] {
        fs::copy(dir.join(f), evil.join(f)).unwrap();
    }
    let forged = orig.snapshot_id.replace(":orig", ":evil");
    assert!(
        list(&mut c, &forged).await.is_empty(),
        "a copy listed as a snapshot"
    );
    let e = c
        .controller
        .create_volume(restore_req(
            "from-evil",
            &forged,
            requests::single_writer_mount(),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(
        !evil.join("restores").exists(),
        "a mark written into a foreign directory"
    );

    // A name that looks like another name's encoded directory gets its own.
    let b = volume_with(&mut c, &rig, "b", b"data of b").await;
    let odd = take(&mut c, snapshot_req("x/y", &a, store.path()))
        .await
        .unwrap();
    let encoded = odd.snapshot_id.rsplit(':').next().unwrap().to_owned();
    let plain = take(&mut c, snapshot_req(&encoded, &b, store.path()))
        .await
        .unwrap();
    assert_ne!(plain.snapshot_id, odd.snapshot_id);
    let m: serde_json::Value = serde_json::from_slice(
        &fs::read(store.path().join(&encoded).join("manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        m["source_volume_id"],
        a.as_str(),
        "x/y's snapshot overwritten"
    );

    // The manifest removed: not ready anywhere, a restore is not ready, and the next
    // CreateSnapshot takes it again.
    fs::remove_file(dir.join("manifest.json")).unwrap();
    let listed = list(&mut c, &orig.snapshot_id).await;
    assert!(!listed[0].ready_to_use, "{listed:?}");
    let e = c
        .controller
        .create_volume(restore_req(
            "from-orig",
            &orig.snapshot_id,
            requests::single_writer_mount(),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        !e.message().contains("still being taken"),
        "{}",
        e.message()
    );
    take(&mut c, snapshot_req("orig", &a, store.path()))
        .await
        .unwrap();
    assert!(list(&mut c, &orig.snapshot_id).await[0].ready_to_use);

    // A manifest that is garbage: not ready, and a restore says what is wrong.
    fs::write(dir.join("manifest.json"), SECRET).unwrap();
    assert!(!list(&mut c, &orig.snapshot_id).await[0].ready_to_use);
    let e = c
        .controller
        .create_volume(restore_req(
            "from-orig",
            &orig.snapshot_id,
            requests::single_writer_mount(),
        ))
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "manifest");

    // Deleted, it is listed no more.
    delete_snapshot(&mut c, &orig.snapshot_id).await.unwrap();
    assert!(list(&mut c, &orig.snapshot_id).await.is_empty());
}

/// A DeleteSnapshot cut short after the manifest and the tree went (the id file is
/// removed last) is finished by the next one; a directory whose id file is gone while its
/// tree is there was never left so by a delete, and is refused, nothing removed.
#[tokio::test]
async fn a_delete_cut_short_is_finished_by_the_next_and_a_directory_without_its_id_is_kept() {
    let Some(mut rig) = Rig::new(2) else { return };
    let store = tmp("gds-store-");
    let mut c = rig.start().await;
    let a = volume_with(&mut c, &rig, "a", b"data of a").await;
    let cut = take(&mut c, snapshot_req("cut", &a, store.path()))
        .await
        .unwrap();
    let dir = store.path().join("cut");
    fs::remove_file(dir.join("manifest.json")).unwrap();
    fs::remove_dir_all(dir.join("tree")).unwrap();
    delete_snapshot(&mut c, &cut.snapshot_id).await.unwrap();
    assert!(!dir.exists(), "the rest of the cut delete left");

    let kept = take(&mut c, snapshot_req("kept", &a, store.path()))
        .await
        .unwrap();
    let dir = store.path().join("kept");
    fs::remove_file(dir.join("snapshot-id")).unwrap();
    let e = delete_snapshot(&mut c, &kept.snapshot_id)
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "snapshot-id");
    assert!(dir.join("tree").exists() && dir.join("manifest.json").exists());
}

/// A store with no room left: ResourceExhausted naming the store, not Internal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_is_resource_exhausted() {
    let Some(mut rig) = Rig::new(1) else { return };
    let store = tmp("gds-store-");
    let at = store.path().to_str().unwrap();
    common::run(
        "mount",
        &["-t", "tmpfs", "-o", "size=1m", "gds-full-store", at],
    );
    let mut c = rig.start().await;
    let big: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    let source = volume_with(&mut c, &rig, "big", &big).await;
    let e = take(&mut c, snapshot_req("full-1", &source, store.path()))
        .await
        .unwrap_err();
    let _ = std::process::Command::new("umount").arg(at).status();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains(at), "{}", e.message());
}

/// A snapshot taken with checksums whose file was changed on the store afterwards: the
/// restore refuses it naming the file and both digests, the volume stays empty, and once
/// the store's copy is put back the retry restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_checks_the_checksums_its_snapshot_recorded() {
    let Some(mut rig) = Rig::new(2) else { return };
    let store = tmp("gds-store-");
    let mut c = rig.start().await;
    let source = volume_with(&mut c, &rig, "src", b"the checkpoint's bytes").await;
    let mut req = snapshot_req("summed", &source, store.path());
    req.parameters.insert("checksums".into(), "true".into());
    let snap = take(&mut c, req).await.unwrap();
    let file = store.path().join("summed/tree/data.bin");
    fs::write(&file, b"the checkpoint's BYTES").unwrap();

    let cap = requests::single_writer_mount();
    let restored =
        requests::create_volume(&mut c, restore_req("r", &snap.snapshot_id, cap.clone())).await;
    let (staging, target) = (rig.path("staging/r"), rig.path("pods/r/v"));
    fs::create_dir_all(&staging).unwrap();
    let e = requests::stage(&mut c, &restored.volume_id, &staging, cap.clone())
        .await
        .unwrap_err();
    assert_refused(&e, Code::FailedPrecondition, "data.bin");
    assert!(e.message().contains("SHA-256"), "{}", e.message());
    fs::write(&file, b"the checkpoint's bytes").unwrap();
    requests::stage_and_publish(&mut c, &restored.volume_id, &staging, &target, cap).await;
    assert_eq!(
        fs::read(target.join("data.bin")).unwrap(),
        b"the checkpoint's bytes"
    );
    requests::unpublish(&mut c, &restored.volume_id, &target)
        .await
        .unwrap();
    requests::unstage(&mut c, &restored.volume_id, &staging)
        .await
        .unwrap();
}
