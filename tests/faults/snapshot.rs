//! An incremental snapshot killed after it linked the unchanged files from its base and
//! before anything else: nothing is listed ready, the base is unchanged (every file's
//! bytes, owners, modes and times), and the retry completes a snapshot that restores
//! the volume as it was.

use std::fs;
use std::time::Duration;

use gds_csi::csi::*;
use gds_csi::runtime::faults::KillPoint;

use super::common::snapshots::{
    assert_same_tree, restore_req, snapshot_req, stage_publish, store_dir, take, take_down,
    tree_state,
};
use super::common::{killed_by_sigkill, requests, Rig};

async fn write(
    c: &mut Clients,
    rig: &Rig,
    id: &str,
    tag: &str,
    seed: u8,
    every: usize,
) -> std::collections::BTreeMap<String, String> {
    let (staging, target) = stage_publish(c, rig, id, tag).await;
    for i in (0..300).step_by(every) {
        let dir = target.join(format!("d{}", i / 100));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("f{i}")), vec![(i as u8) ^ seed; 32 << 10]).unwrap();
    }
    let state = tree_state(&target);
    take_down(c, id, &staging, &target).await;
    state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_snapshot_killed_after_its_links_leaves_the_base_whole_and_the_retry_completes(
) {
    let Some(mut rig) = Rig::new(2) else { return };
    let store = store_dir();
    let mut c = rig.start().await;
    let id = requests::create_volume_id(&mut c, "v", requests::single_writer_mount()).await;
    write(&mut c, &rig, &id, "w1", 0, 1).await;
    take(&mut c, snapshot_req("snap-1", &id, store.path())).await;
    let base = store.path().join("snap-1/tree");
    let base_before = tree_state(&base);
    let state2 = write(&mut c, &rig, &id, "w2", 0x5A, 10).await;

    rig.kill9();
    let point = KillPoint::SnapshotAfterLinks;
    let mut armed = rig
        .start_with(&[(gds_csi::runtime::faults::ENV, point.as_str())], &[])
        .await;
    let _ = armed
        .controller
        .create_snapshot(snapshot_req("snap-2", &id, store.path()))
        .await;
    let status = rig
        .wait_exit(Duration::from_secs(60))
        .expect("died at the point");
    assert!(killed_by_sigkill(&status), "{status:?}");
    assert!(rig
        .logs()
        .contains(&format!("killed at {}", point.as_str())));
    assert!(
        !store.path().join("snap-2/manifest.json").exists(),
        "nothing ready on the store"
    );
    assert_same_tree(&tree_state(&base), &base_before, "the base is as it was");

    let mut c = rig.start().await;
    let listed = c
        .controller
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    for e in &listed.entries {
        let s = e.snapshot.as_ref().unwrap();
        assert!(
            s.ready_to_use == (s.snapshot_id.contains("snap-1")),
            "{s:?}"
        );
    }
    let s2 = take(&mut c, snapshot_req("snap-2", &id, store.path())).await;
    assert_same_tree(&tree_state(&base), &base_before, "the base is as it was");
    let v = requests::create_volume(
        &mut c,
        restore_req("r", &s2.snapshot_id, requests::single_writer_mount()),
    )
    .await;
    let (staging, target) = stage_publish(&mut c, &rig, &v.volume_id, "r").await;
    assert_same_tree(&tree_state(&target), &state2, "restored");
    take_down(&mut c, &v.volume_id, &staging, &target).await;
}
