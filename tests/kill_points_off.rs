//! The product build (no `fault-injection` feature: the release binary and the image)
//! ignores the kill switch: with `GDS_CSI_FAULT_KILL_AT` naming each kill point in turn,
//! the real binary goes through a volume's whole life, which passes every point, and is
//! still running; a value that names no point does not stop it from starting either.
//! Root, one loop device. With the feature, `tests/faults.rs` proves the opposite.
#![cfg(not(feature = "fault-injection"))]
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::time::Duration;

use common::requests::{
    create_volume_id, delete_request, publish, single_writer_mount, stage, unpublish, unstage,
};
use common::Rig;
use gds_csi::runtime::faults::{KillPoint, ENV};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_product_binary_ignores_the_kill_switch() {
    let Some(mut rig) = Rig::new(1) else { return };
    let staging = rig.path("kubelet/staging/v");
    let target = rig.path("kubelet/pods/p1/volumes/v/mount");
    std::fs::create_dir_all(&staging).unwrap();
    for (i, point) in KillPoint::ALL.into_iter().enumerate() {
        let mut c = rig.start_with(&[(ENV, point.as_str())], &[]).await;
        let cap = single_writer_mount();
        let id = create_volume_id(&mut c, &format!("v{i}"), cap.clone()).await;
        stage(&mut c, &id, &staging, cap.clone()).await.unwrap();
        publish(&mut c, &id, &staging, &target, cap).await.unwrap();
        unpublish(&mut c, &id, &target).await.unwrap();
        unstage(&mut c, &id, &staging).await.unwrap();
        c.controller
            .delete_volume(delete_request(&id))
            .await
            .unwrap_or_else(|e| panic!("delete with {ENV}={}: {e:?}", point.as_str()));
        assert!(
            rig.wait_exit(Duration::from_millis(200)).is_none(),
            "the driver died with {ENV}={}: {}",
            point.as_str(),
            rig.logs()
        );
        rig.kill9();
    }
    assert!(!rig.logs().contains("killed at"), "{}", rig.logs());
    // With the feature this value is refused at start-up (no such kill point).
    rig.start_with(&[(ENV, "not-a-kill-point")], &[]).await;
}
