//! Root-only: partition volumes and clones while another tool changes the world around the
//! driver, through the real binary on a real loop device, the changes made with sgdisk and
//! raw writes as an operator's tools make them:
//! - an entry removed from the label (`sgdisk --delete`) or given another PARTUUID
//!   (`sgdisk --partition-guid=N:R`): DeleteVolume refuses naming the change and the
//!   restoring command, keeps the record, and no create or grow hands out its blocks;
//!   once restored, the delete erases it;
//! - a new partition carved over free space that held someone's bytes reads zeros;
//! - a foreign partition in the label or a damaged primary GPT header: NodeUnpublish and
//!   NodeUnstage still take the mounts down, and NodeStage/NodePublish name the real cause;
//! - a label whose two copies differ (a crash between their writes) is whole again after
//!   a repeated CreateVolume and after a restart;
//! - a clone's source cannot be deleted before the clone is filled, and a clone holds its
//!   source as it was at CreateVolume.
//!
//! `GDS_CSI_NO_SKIP=1` turns a skip into a failure.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::*;
use gds_csi::disk::gpt::kernel;
use tonic::Code;

use common::tools::{run_advice, scribble, sgdisk, zeros_at};
use common::{requests, PartRig};

const MIB: u64 = 1 << 20;
const DISK: u64 = 256 * MIB;

fn clone_req(name: &str, source: &str) -> CreateVolumeRequest {
    let mut req = requests::partition_create(name, 32 * MIB);
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: source.into(),
        })),
    });
    req
}

async fn create(c: &mut gds_csi::csi::Clients, name: &str) -> String {
    requests::create_volume(c, requests::partition_create(name, 32 * MIB))
        .await
        .volume_id
}

/// The recorded partition number and PARTUUID of volume `id`.
fn recorded(rig: &PartRig, id: &str) -> (u32, String) {
    let state = rig.state();
    let p = &state["volumes"][id]["partition"];
    assert!(p.is_object(), "no partition recorded for {id}: {state}");
    (
        p["number"].as_u64().unwrap() as u32,
        p["partuuid"].as_str().unwrap().to_owned(),
    )
}

/// Partition `number` as the kernel shows it: its node and (start, len) on the disk.
fn shown(disk: &Path, number: u32) -> Option<(PathBuf, u64, u64)> {
    kernel::list(disk)
        .unwrap()
        .into_iter()
        .find(|k| k.number == number)
        .map(|k| (Path::new("/dev").join(&k.name), k.start, k.len))
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_another_tool_removed_is_never_handed_out_and_is_erased_once_restored() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let disk = rig.loops[0].clone();
    let mut c = rig.start().await;
    let v1 = create(&mut c, "v1").await;
    let v2 = create(&mut c, "v2").await;
    let v3 = create(&mut c, "v3").await;
    let (n2, uuid2) = recorded(&rig, &v2);
    let (node2, start2, len2) = shown(&disk, n2).unwrap();
    for at in [0, len2 / 2, len2 - MIB] {
        scribble(&node2, at, 0xA5);
    }
    // Someone's bytes in the free space after the three volumes (past v3's growth room,
    // where the next volume goes), too.
    let free_at = shown(&disk, recorded(&rig, &v3).0)
        .map(|(_, s, l)| s + l + gds_csi::disk::gpt::alloc::growth_room(l))
        .unwrap();
    scribble(&disk, free_at, 0x5A);

    sgdisk(&[&format!("--delete={n2}"), disk.to_str().unwrap()]);
    let err = c
        .controller
        .delete_volume(requests::delete_request(&v2))
        .await
        .expect_err("a volume whose entry is gone is not deleted unerased");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let msg = err.message().to_owned();
    assert!(
        msg.contains("removed its entry") && msg.contains(&uuid2) && msg.contains("sgdisk --new="),
        "{msg}"
    );
    assert!(rig.state()["volumes"].get(&v2).is_some(), "record kept");

    // Neither a create nor a grow reaches the held span; a new partition reads zeros.
    let v4 = create(&mut c, "v4").await;
    let (n4, _) = recorded(&rig, &v4);
    let (node4, start4, len4) = shown(&disk, n4).unwrap();
    assert_ne!(n4, n2, "the held number is not reused");
    assert!(
        !overlaps((start4, len4), (start2, len2)),
        "held span carved over"
    );
    assert!(
        overlaps((start4, len4), (free_at, MIB)),
        "the new volume lies where someone's bytes were"
    );
    assert!(zeros_at(&node4, 0, len4), "a new partition reads zeros");
    let grow = c
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: v1.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: (64 * MIB) as i64,
                limit_bytes: 0,
            }),
            volume_capability: Some(requests::single_writer_mount()),
            ..Default::default()
        })
        .await
        .expect("v1, unused, moves to grow");
    assert_eq!(grow.into_inner().capacity_bytes as u64, 64 * MIB);
    let (_, start1, len1) = shown(&disk, recorded(&rig, &v1).0).unwrap();
    assert!(
        !overlaps((start1, len1), (start2, len2)),
        "v1 moved over the held span"
    );
    assert!(!zeros_at(&node2, 0, MIB), "v2's data untouched");

    // Restored as the message says: the delete erases it and takes it out.
    run_advice(&msg);
    c.controller
        .delete_volume(requests::delete_request(&v2))
        .await
        .expect("a restored entry is deleted");
    assert!(rig.state()["volumes"].get(&v2).is_none());
    assert!(shown(&disk, n2).is_none(), "out of the kernel");
    assert!(zeros_at(&disk, start2, len2), "its blocks read zeros");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partuuid_another_tool_changed_is_refused_at_delete_until_restored() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let disk = rig.loops[0].clone();
    let mut c = rig.start().await;
    let _v1 = create(&mut c, "v1").await;
    let v2 = create(&mut c, "v2").await;
    let (n2, uuid2) = recorded(&rig, &v2);
    let (node2, start2, len2) = shown(&disk, n2).unwrap();
    scribble(&node2, 0, 0xA5);

    sgdisk(&[&format!("--partition-guid={n2}:R"), disk.to_str().unwrap()]);
    let err = c
        .controller
        .delete_volume(requests::delete_request(&v2))
        .await
        .expect_err("an orphan with data is not left behind");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let msg = err.message().to_owned();
    assert!(
        msg.contains("PARTUUID was changed") && msg.contains(&uuid2),
        "{msg}"
    );
    assert!(rig.state()["volumes"].get(&v2).is_some(), "record kept");
    assert!(shown(&disk, n2).is_some());
    // NodeStage names the same cause, not an absent device.
    let staging = rig.path("staging/v2");
    fs::create_dir_all(&staging).unwrap();
    let err = requests::stage(&mut c, &v2, &staging, requests::single_writer_mount())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("PARTUUID was changed") && !err.message().contains("reattach"),
        "{}",
        err.message()
    );

    run_advice(&msg);
    c.controller
        .delete_volume(requests::delete_request(&v2))
        .await
        .expect("restored: deleted");
    assert!(shown(&disk, n2).is_none());
    let listed = sgdisk(&["--print", disk.to_str().unwrap()]);
    assert!(!listed.contains(&format!("\n   {n2} ")), "{listed}");
    assert!(zeros_at(&disk, start2, len2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_come_down_whatever_another_tool_did_to_the_label() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let disk = rig.loops[0].clone();
    let mut c = rig.start().await;
    let fs_vol = create(&mut c, "fs").await;
    let mut raw_req = requests::partition_create("raw", 32 * MIB);
    let block = requests::capability(volume_capability::access_mode::Mode::SingleNodeWriter, true);
    raw_req.volume_capabilities = vec![block.clone()];
    let raw_vol = requests::create_volume(&mut c, raw_req).await.volume_id;
    let mount = requests::single_writer_mount();
    let (staging, target) = (rig.path("staging/fs"), rig.path("pods/a/fs"));
    let (r_staging, r_target) = (rig.path("staging/raw"), rig.path("pods/a/raw"));
    let up = |c: &mut gds_csi::csi::Clients| {
        let mut c = c.clone();
        let (fs_vol, raw_vol, mount, block) = (
            fs_vol.clone(),
            raw_vol.clone(),
            mount.clone(),
            block.clone(),
        );
        let (staging, target, r_staging, r_target) = (
            staging.clone(),
            target.clone(),
            r_staging.clone(),
            r_target.clone(),
        );
        async move {
            requests::stage_and_publish(&mut c, &fs_vol, &staging, &target, mount).await;
            requests::stage_and_publish(&mut c, &raw_vol, &r_staging, &r_target, block).await;
        }
    };
    let down = |c: &mut gds_csi::csi::Clients| {
        let mut c = c.clone();
        let (fs_vol, raw_vol) = (fs_vol.clone(), raw_vol.clone());
        let (staging, target, r_staging, r_target) = (
            staging.clone(),
            target.clone(),
            r_staging.clone(),
            r_target.clone(),
        );
        async move {
            requests::unpublish(&mut c, &fs_vol, &target).await.unwrap();
            requests::unstage(&mut c, &fs_vol, &staging).await.unwrap();
            requests::unpublish(&mut c, &raw_vol, &r_target)
                .await
                .unwrap();
            requests::unstage(&mut c, &raw_vol, &r_staging)
                .await
                .unwrap();
            for p in [&target, &staging, &r_target] {
                assert_eq!(common::mounts_at(p), 0, "{} still mounted", p.display());
            }
        }
    };

    // A foreign partition in the label.
    up(&mut c).await;
    let added = sgdisk(&["--new=0:0:+1M", "--typecode=0:8300", disk.to_str().unwrap()]);
    let second = rig.path("pods/b/fs");
    let err = requests::publish(&mut c, &fs_vol, &staging, &second, mount.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let m = err.message();
    assert!(
        m.contains("0fc63daf-8483-4772-8e79-3d69d8477de4")
            && m.contains("another tool")
            && !m.contains("reattach"),
        "{m}"
    );
    down(&mut c).await;
    let listed = sgdisk(&["--print", disk.to_str().unwrap()]);
    let number = listed
        .lines()
        .filter(|l| l.contains("8300"))
        .find_map(|l| l.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("{added}{listed}"));
    sgdisk(&[&format!("--delete={number}"), disk.to_str().unwrap()]);

    // The primary GPT header overwritten.
    up(&mut c).await;
    let f = fs::OpenOptions::new().write(true).open(&disk).unwrap();
    f.write_all_at(&[0x5A; 512], 512).unwrap();
    f.sync_all().unwrap();
    let err = requests::publish(&mut c, &fs_vol, &staging, &second, mount.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("primary GPT") && !err.message().contains("reattach"),
        "{}",
        err.message()
    );
    down(&mut c).await;
}

/// The backup GPT (its entry array and header: the last 33 sectors of 512 bytes).
fn backup(disk: &Path) -> Vec<u8> {
    let f = fs::File::open(disk).unwrap();
    let mut buf = vec![0u8; 33 * 512];
    let at = DISK - buf.len() as u64;
    f.read_exact_at(&mut buf, at).unwrap();
    buf
}

fn put_backup(disk: &Path, bytes: &[u8]) {
    let f = fs::OpenOptions::new().write(true).open(disk).unwrap();
    f.write_all_at(bytes, DISK - bytes.len() as u64).unwrap();
    f.sync_all().unwrap();
}

fn verified(disk: &Path) -> String {
    sgdisk(&["--verify", disk.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_left_with_two_different_copies_is_whole_again_after_a_retry_and_a_restart() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let disk = rig.loops[0].clone();
    let mut c = rig.start().await;
    create(&mut c, "v1").await;
    // A crash between the two copies' writes: the backup as it was before the carve.
    let old = backup(&disk);
    let v2 = create(&mut c, "v2").await;
    put_backup(&disk, &old);
    assert!(
        !verified(&disk).contains("No problems found"),
        "{}",
        verified(&disk)
    );
    let again = create(&mut c, "v2").await;
    assert_eq!(again, v2);
    let v = verified(&disk);
    assert!(v.contains("No problems found"), "after the retry: {v}");

    let old = backup(&disk);
    create(&mut c, "v3").await;
    rig.kill9();
    put_backup(&disk, &old);
    assert!(!verified(&disk).contains("No problems found"));
    let _c = rig.start().await;
    let v = verified(&disk);
    assert!(v.contains("No problems found"), "after the restart: {v}");
}

/// Stages and publishes `id` at `<rig>/staging/<name>` and `<rig>/pods/<name>`, writes
/// `token` there (after checking what it held, when `was` says), and takes both down.
async fn write_token(
    c: &mut gds_csi::csi::Clients,
    rig: &PartRig,
    id: &str,
    was: Option<&[u8]>,
    token: &[u8],
) {
    let name = id.rsplit(':').nth(1).unwrap();
    let (staging, target) = (
        rig.path(&format!("staging/{name}")),
        rig.path(&format!("pods/{name}")),
    );
    let mount = requests::single_writer_mount();
    requests::stage_and_publish(c, id, &staging, &target, mount).await;
    if let Some(was) = was {
        assert_eq!(fs::read(target.join("token")).unwrap(), was);
    }
    fs::write(target.join("token"), token).unwrap();
    requests::unpublish(c, id, &target).await.unwrap();
    requests::unstage(c, id, &staging).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_holds_its_source_as_it_was_at_its_create_volume() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let mut c = rig.start().await;
    let mount = requests::single_writer_mount();
    let src = create(&mut c, "src").await;
    let (staging, target) = (rig.path("staging/src"), rig.path("pods/a/src"));
    requests::stage_and_publish(&mut c, &src, &staging, &target, mount.clone()).await;
    fs::write(target.join("token"), b"first").unwrap();

    // In use: the clone is copied now, from the source's own mount, frozen for the copy.
    let early = requests::create_volume(&mut c, clone_req("early", &src))
        .await
        .volume_id;
    fs::write(target.join("token"), b"after").unwrap();
    requests::unpublish(&mut c, &src, &target).await.unwrap();
    requests::unstage(&mut c, &src, &staging).await.unwrap();
    let (e_staging, e_target) = (rig.path("staging/early"), rig.path("pods/b/early"));
    requests::stage_and_publish(&mut c, &early, &e_staging, &e_target, mount.clone()).await;
    assert_eq!(
        fs::read(e_target.join("token")).unwrap(),
        b"first",
        "a clone of a source in use is the source at its CreateVolume"
    );
    requests::unpublish(&mut c, &early, &e_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &early, &e_staging).await.unwrap();

    // Unstaged: the clone is filled at its first NodeStage, from the source as it was at
    // the clone's CreateVolume.
    let clone = requests::create_volume(&mut c, clone_req("clone", &src))
        .await
        .volume_id;
    // A repeated CreateVolume answers the same clone.
    let again = requests::create_volume(&mut c, clone_req("clone", &src)).await;
    assert_eq!(again.volume_id, clone);

    // The source is written again after the clone's CreateVolume.
    write_token(&mut c, &rig, &src, Some(b"after"), b"second").await;

    let (c_staging, c_target) = (rig.path("staging/clone"), rig.path("pods/b/clone"));
    requests::stage_and_publish(&mut c, &clone, &c_staging, &c_target, mount.clone()).await;
    assert_eq!(
        fs::read(c_target.join("token")).unwrap(),
        b"after",
        "the clone is the source at its CreateVolume"
    );
    requests::unpublish(&mut c, &clone, &c_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &clone, &c_staging).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_with_a_clone_not_filled_yet_is_not_deleted() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let mut c = rig.start().await;
    let mount = requests::single_writer_mount();
    let src = create(&mut c, "src").await;
    write_token(&mut c, &rig, &src, None, b"second").await;

    // A source with a clone not filled yet is not deleted.
    let late = requests::create_volume(&mut c, clone_req("late", &src))
        .await
        .volume_id;
    let err = c
        .controller
        .delete_volume(requests::delete_request(&src))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(&late), "{}", err.message());
    let (l_staging, l_target) = (rig.path("staging/late"), rig.path("pods/c/late"));
    requests::stage_and_publish(&mut c, &late, &l_staging, &l_target, mount.clone()).await;
    assert_eq!(fs::read(l_target.join("token")).unwrap(), b"second");
    requests::unpublish(&mut c, &late, &l_target).await.unwrap();
    requests::unstage(&mut c, &late, &l_staging).await.unwrap();
    c.controller
        .delete_volume(requests::delete_request(&src))
        .await
        .expect("every clone filled: the source is deleted");
}
