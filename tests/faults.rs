//! Crash recovery at every step (root, real loop devices, the real binary).
//!
//! For each kill point of `src/runtime/faults.rs`, a volume goes through its whole life
//! (create, stage, write, publish, write, unpublish, unstage, restage, republish,
//! verify, unpublish, unstage, delete). The step that reaches the kill point runs
//! on a driver started with `GDS_CSI_FAULT_KILL_AT=<point>`; the driver must die
//! there by SIGKILL without answering; a driver restarted without the switch gets
//! the same call again and must converge: mkfs once in all runs (counted by an
//! mkfs.ext4 stand-in on the driver's PATH that records each real run), one device per
//! volume (state file = ListVolumes = GetCapacity), every byte written before the
//! kill still there (sha256), one mount per path, `data=ordered` after every stage
//! (retries included), and a device that reads back as zeros at the end. The state at
//! each kill is checked against what the point promises before the restart.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;
#[path = "faults/partition.rs"]
mod partition;
#[path = "faults/relocate.rs"]
mod relocate;
#[path = "faults/snapshot.rs"]
mod snapshot;

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use common::tools::{blkid_tag, reads_back_zeros, Tools};
use common::{blkid_code, digest_file, killed_by_sigkill, mounts_at, requests, Rig, SIZE};
use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::runtime::faults::KillPoint;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    Stage,
    WriteA,
    Publish,
    WriteB,
    Unpublish,
    Unstage,
    Restage,
    Republish,
    Verify,
    Unpublish2,
    Unstage2,
    Delete,
}

const LIFE: [Step; 13] = [
    Step::Create,
    Step::Stage,
    Step::WriteA,
    Step::Publish,
    Step::WriteB,
    Step::Unpublish,
    Step::Unstage,
    Step::Restage,
    Step::Republish,
    Step::Verify,
    Step::Unpublish2,
    Step::Unstage2,
    Step::Delete,
];

/// The step whose call reaches the kill point. Restage and republish run with data on the
/// volume, so a kill there must not lose any of it.
fn killed_step(point: KillPoint) -> Step {
    match point {
        KillPoint::AfterAllocate => Step::Create,
        KillPoint::AfterMkfs => Step::Stage,
        KillPoint::AfterStageMount => Step::Restage,
        KillPoint::AfterBindMount => Step::Republish,
        KillPoint::DeleteBeforeWipe | KillPoint::DeleteAfterWipe => Step::Delete,
        other => panic!("{other:?} is a partition layout point (tests/faults/partition.rs)"),
    }
}

/// The points the whole-device layout passes.
const DEVICE_POINTS: [KillPoint; 6] = [
    KillPoint::AfterAllocate,
    KillPoint::AfterMkfs,
    KillPoint::AfterStageMount,
    KillPoint::AfterBindMount,
    KillPoint::DeleteBeforeWipe,
    KillPoint::DeleteAfterWipe,
];

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

struct Ctx {
    id: String,
    staging: PathBuf,
    target: PathBuf,
    want: Vec<(PathBuf, Vec<u8>)>,
}

fn payload(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn write_synced(path: &std::path::Path, bytes: &[u8]) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

/// One CSI step; `Ok` carries nothing, data steps never fail softly.
async fn do_step(c: &mut Clients, ctx: &mut Ctx, step: Step) -> Result<(), tonic::Status> {
    let staging = ctx.staging.to_str().unwrap().to_owned();
    let target = ctx.target.to_str().unwrap().to_owned();
    match step {
        Step::Create => {
            let vol = c
                .controller
                .create_volume(CreateVolumeRequest {
                    name: "v".into(),
                    volume_capabilities: vec![cap()],
                    // No GPU here: the GDS gate (on by default) is turned off explicitly.
                    parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .volume
                .unwrap();
            assert_eq!(vol.capacity_bytes as u64, SIZE);
            if !ctx.id.is_empty() {
                assert_eq!(
                    vol.volume_id, ctx.id,
                    "a retried create returns the same id"
                );
            }
            ctx.id = vol.volume_id;
        }
        Step::Stage | Step::Restage => {
            c.node
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: ctx.id.clone(),
                    staging_target_path: staging,
                    volume_capability: Some(cap()),
                    ..Default::default()
                })
                .await?;
        }
        Step::Publish | Step::Republish => {
            c.node
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id: ctx.id.clone(),
                    staging_target_path: staging,
                    target_path: target,
                    volume_capability: Some(cap()),
                    ..Default::default()
                })
                .await?;
        }
        Step::Unpublish | Step::Unpublish2 => {
            c.node
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: ctx.id.clone(),
                    target_path: target,
                })
                .await?;
        }
        Step::Unstage | Step::Unstage2 => {
            c.node
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: ctx.id.clone(),
                    staging_target_path: staging,
                })
                .await?;
        }
        Step::Delete => {
            c.controller
                .delete_volume(requests::delete_request(&ctx.id))
                .await?;
        }
        Step::WriteA => {
            let bytes = payload(1, 3 << 20);
            write_synced(&ctx.staging.join("a.bin"), &bytes);
            ctx.want
                .push((PathBuf::from("a.bin"), Sha256::digest(&bytes).to_vec()));
        }
        Step::WriteB => {
            check_data(ctx, &ctx.target);
            let bytes = payload(2, (1 << 20) + 4097);
            fs::create_dir_all(ctx.target.join("sub")).unwrap();
            write_synced(&ctx.target.join("sub/b.bin"), &bytes);
            ctx.want
                .push((PathBuf::from("sub/b.bin"), Sha256::digest(&bytes).to_vec()));
        }
        Step::Verify => {
            check_data(ctx, &ctx.target);
            check_data(ctx, &ctx.staging);
        }
    }
    Ok(())
}

fn check_data(ctx: &Ctx, root: &std::path::Path) {
    for (rel, want) in &ctx.want {
        assert_eq!(
            &digest_file(&root.join(rel)),
            want,
            "{} lost bytes",
            root.join(rel).display()
        );
    }
}

/// Expected mounts after each step (the staging and target paths, one mount each at most).
fn expected_mounts(step: Step) -> (usize, usize) {
    match step {
        Step::Create | Step::Unstage | Step::Unstage2 | Step::Delete => (0, 0),
        Step::Stage | Step::WriteA | Step::Unpublish | Step::Restage | Step::Unpublish2 => (1, 0),
        Step::Publish | Step::WriteB | Step::Republish | Step::Verify => (1, 1),
    }
}

/// One volume per device, the same in the state file, ListVolumes and GetCapacity.
async fn check_allocation(rig: &Rig, c: &mut Clients, volumes: usize) {
    let state = rig.state();
    let recs = state["volumes"].as_object().unwrap();
    assert_eq!(recs.len(), volumes, "state file volumes: {state}");
    let mut devices: Vec<_> = recs.values().map(|r| r["device_id"].to_string()).collect();
    devices.sort();
    devices.dedup();
    assert_eq!(devices.len(), volumes, "a device allocated twice: {state}");
    let list = c
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), volumes, "ListVolumes");
    let cap = requests::capacity(c).await;
    assert_eq!(
        cap.available_capacity as u64,
        (rig.loops.len() - volumes) as u64 * SIZE,
        "GetCapacity"
    );
}

/// The volume's device, from the state file's record.
fn volume_device(rig: &Rig, ctx: &Ctx) -> PathBuf {
    let state = rig.state();
    let key = state["volumes"][&ctx.id]["device_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = key.strip_prefix("path:").unwrap_or(&key).to_owned();
    rig.loops
        .iter()
        .find(|d| d.to_str() == Some(path.as_str()))
        .unwrap_or_else(|| panic!("device {key} is not one of the rig's"))
        .clone()
}

/// The staging mount carries `data=ordered` in its superblock options (GDS needs it).
fn assert_data_ordered(staging: &std::path::Path, when: &str) {
    let p = staging.to_string_lossy().to_string();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .unwrap_or_else(|| panic!("{when}: {p} is not mounted"));
    let super_opts = line.rsplit(' ').next().unwrap();
    assert!(
        super_opts.split(',').any(|o| o == "data=ordered"),
        "{when}: {p} mounted without data=ordered: {line}"
    );
}

/// What must be true between the kill and the restart: the step got exactly as far as the point.
fn check_at_kill(rig: &Rig, tools: &Tools, ctx: &Ctx, point: KillPoint) {
    let state = rig.state();
    let recs = state["volumes"].as_object().unwrap();
    match point {
        KillPoint::AfterAllocate => {
            assert_eq!(recs.len(), 1, "allocation written: {state}");
            let rec = recs.values().next().unwrap();
            assert_eq!(rec["formatted"], false);
            assert_eq!(tools.mkfs_runs(), 0, "nothing formatted yet");
            assert!(rig.loops.iter().all(|d| blkid_code(d) == Some(2)), "blank");
        }
        KillPoint::AfterMkfs => {
            let rec = &recs[&ctx.id];
            assert_eq!(rec["formatted"], false, "killed before the state update");
            assert_eq!(tools.mkfs_runs(), 1, "mkfs ran");
            let dev = volume_device(rig, ctx);
            assert_eq!(
                blkid_tag(&dev, "TYPE"),
                "ext4",
                "mkfs finished before the kill"
            );
            assert_eq!(blkid_tag(&dev, "UUID"), rec["fs_uuid"].as_str().unwrap());
            assert_eq!(mounts_at(&ctx.staging), 0);
        }
        KillPoint::AfterStageMount => {
            assert_eq!(mounts_at(&ctx.staging), 1);
            assert_data_ordered(&ctx.staging, "at the kill");
        }
        KillPoint::AfterBindMount => {
            assert_eq!(mounts_at(&ctx.target), 1);
            check_data(ctx, &ctx.target);
        }
        KillPoint::DeleteBeforeWipe => {
            assert_eq!(recs[&ctx.id]["deleting"], true);
            let dev = volume_device(rig, ctx);
            assert_eq!(blkid_code(&dev), Some(0), "not wiped yet");
            assert!(!reads_back_zeros(&dev), "not erased yet");
        }
        KillPoint::DeleteAfterWipe => {
            assert_eq!(recs[&ctx.id]["deleting"], true, "record not removed yet");
            let dev = volume_device(rig, ctx);
            assert_eq!(blkid_code(&dev), Some(2), "wiped");
            assert!(reads_back_zeros(&dev), "erased before the kill");
        }
        other => panic!("{other:?} is not a whole-device point"),
    }
}

async fn scenario(point: KillPoint) -> String {
    let mut rig = Rig::new(2).expect("root checked by the caller");
    let mut ctx = Ctx {
        id: String::new(),
        staging: rig.path("kubelet/staging/v"),
        target: rig.path("kubelet/pods/p1/volumes/v/mount"),
        want: Vec::new(),
    };
    fs::create_dir_all(&ctx.staging).unwrap();
    let tools = rig.tools.clone();
    let kill_step = killed_step(point);
    let mut c = rig.start().await;
    let mut device = None;
    for step in LIFE {
        if step != kill_step {
            do_step(&mut c, &mut ctx, step)
                .await
                .unwrap_or_else(|e| panic!("{step:?}: {e:?}"));
        } else {
            rig.kill9();
            let mut armed = rig
                .start_with(&[(gds_csi::runtime::faults::ENV, point.as_str())], &[])
                .await;
            let err = do_step(&mut armed, &mut ctx, step)
                .await
                .expect_err("the call that reaches the kill point never answers");
            let status = rig
                .wait_exit(Duration::from_secs(10))
                .expect("the driver died at the kill point");
            assert!(killed_by_sigkill(&status), "{status:?}");
            assert!(
                rig.logs()
                    .contains(&format!("killed at {}", point.as_str())),
                "died at the point, not elsewhere ({err:?})"
            );
            check_at_kill(&rig, &tools, &ctx, point);
            c = rig.start().await;
            // The CO retries until it gets an answer; retry twice more for idempotency.
            for i in 0..3 {
                do_step(&mut c, &mut ctx, step)
                    .await
                    .unwrap_or_else(|e| panic!("retry of {step:?} after the kill: {e:?}"));
                if matches!(step, Step::Stage | Step::Restage) {
                    assert_data_ordered(&ctx.staging, &format!("retry {i} of {step:?}"));
                }
            }
        }
        if matches!(step, Step::Stage | Step::Restage) {
            assert_data_ordered(&ctx.staging, &format!("after {step:?}"));
        }
        if step == Step::Create {
            device = Some(volume_device(&rig, &ctx));
        }
        let (staged, published) = expected_mounts(step);
        assert_eq!(mounts_at(&ctx.staging), staged, "after {step:?}");
        assert_eq!(mounts_at(&ctx.target), published, "after {step:?}");
        let volumes = usize::from(step != Step::Delete);
        check_allocation(&rig, &mut c, volumes).await;
    }
    // Converged: mkfs once over every run, the device erased and back in the pool.
    assert_eq!(
        tools.mkfs_runs(),
        1,
        "mkfs ran exactly once across all runs"
    );
    for dev in &rig.loops {
        assert_eq!(blkid_code(dev), Some(2), "{} wiped", dev.display());
    }
    let device = device.expect("created");
    assert!(reads_back_zeros(&device), "{} erased", device.display());
    assert!(!ctx.target.exists(), "target removed");
    format!(
        "killed in {kill_step:?} (SIGKILL), retried: converged, mkfs 1, {} files intact, 0 leaked devices",
        ctx.want.len()
    )
}

/// Runs `run` for each point (each in a task of its own, so one panic is one row) and
/// prints the table; fails unless every point converged.
async fn run_points<F, Fut>(points: &[KillPoint], run: F)
where
    F: Fn(KillPoint) -> Fut,
    Fut: std::future::Future<Output = String> + Send + 'static,
{
    let mut rows = Vec::new();
    for &point in points {
        let outcome = match tokio::spawn(run(point)).await {
            Ok(text) => Ok(text),
            Err(e) => {
                let msg = e.try_into_panic().ok().and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                });
                Err(msg.unwrap_or_else(|| "panicked".into()))
            }
        };
        rows.push((point, outcome));
    }
    let survived = rows.iter().filter(|(_, o)| o.is_ok()).count();
    println!("{:<24} | outcome", "kill point");
    println!("{:-<24}-|-{:-<60}", "", "");
    for (point, outcome) in &rows {
        match outcome {
            Ok(text) => println!("{:<24} | ok: {text}", point.as_str()),
            Err(why) => println!("{:<24} | FAILED: {why}", point.as_str()),
        }
    }
    println!("kill points survived: {survived}/{}", rows.len());
    assert_eq!(survived, rows.len(), "every kill point must converge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kill_point_converges_after_restart() {
    if !common::is_root() {
        eprintln!("skipped: needs root for loop devices and mounts");
        return;
    }
    run_points(&DEVICE_POINTS, scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_partition_kill_point_converges_after_restart() {
    if !common::is_root() {
        eprintln!("skipped: needs root for loop devices and mounts");
        return;
    }
    run_points(&KillPoint::PARTITION, partition::scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_move_kill_point_converges_after_restart() {
    if !common::is_root() {
        eprintln!("skipped: needs root for loop devices and mounts");
        return;
    }
    run_points(&KillPoint::MOVE, relocate::scenario).await;
}
