//! Kill points of the partition layout, through the real binary on one loop
//! device: a neighbour volume carved first (staged, written, unstaged), then volume `v`
//! lives create, stage, write, unstage, delete. The step that reaches the point runs on
//! a driver armed with it, dies by SIGKILL, is checked against what the point promises,
//! and is retried three times on a restarted driver. Converged means: nothing leaked
//! (the GPT, the kernel and the state file list the neighbour only), mkfs ran once per
//! volume over all runs (counted by the mkfs stand-in), `v`'s blocks read back zeros,
//! and every other byte of the disk (the neighbour's data, the free space, the label
//! itself) is what it was before `v` was created.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::common::tools::blkid_tag;
use super::common::{killed_by_sigkill, requests, run, PartRig, Rig};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::disk::gpt::kernel;
use gds_csi::runtime::faults::KillPoint;

const MIB: u64 = 1 << 20;
const DISK: u64 = 96 * MIB;
const V_SIZE: u64 = 32 * MIB;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    Stage,
    Write,
    Unstage,
    Delete,
}

const LIFE: [Step; 5] = [
    Step::Create,
    Step::Stage,
    Step::Write,
    Step::Unstage,
    Step::Delete,
];

fn killed_step(point: KillPoint) -> Step {
    match point {
        KillPoint::PartAfterClaim | KillPoint::PartAfterLabel | KillPoint::AfterAllocate => {
            Step::Create
        }
        KillPoint::AfterMkfs => Step::Stage,
        _ => Step::Delete,
    }
}

/// Unmounts and takes the partitions out of the kernel before the rig detaches the
/// device (a plain loop device keeps them after `losetup -d`).
fn create_req(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![requests::single_writer_mount()],
        parameters: [
            ("gdsPolicy".to_string(), "disabled".to_string()),
            ("layout".to_string(), "partition".to_string()),
        ]
        .into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: bytes as i64,
        }),
        ..Default::default()
    }
}

struct Ctx {
    disk: PathBuf,
    id: String,
    staging: PathBuf,
    /// `v`'s span on the disk in bytes, once carved.
    span: Option<(u64, u64)>,
}

async fn do_step(c: &mut Clients, ctx: &mut Ctx, step: Step) -> Result<(), tonic::Status> {
    let cap = requests::single_writer_mount();
    match step {
        Step::Create => {
            let v = c.controller.create_volume(create_req("v", V_SIZE)).await?;
            let v = v.into_inner().volume.unwrap();
            assert_eq!(v.capacity_bytes as u64, V_SIZE);
            if !ctx.id.is_empty() {
                assert_eq!(v.volume_id, ctx.id, "a retried create returns the same id");
            }
            ctx.id = v.volume_id;
        }
        Step::Stage => requests::stage(c, &ctx.id, &ctx.staging, cap).await?,
        Step::Write => {
            fs::write(ctx.staging.join("data"), b"v".repeat(1 << 20)).unwrap();
            run("sync", &[]);
        }
        Step::Unstage => requests::unstage(c, &ctx.id, &ctx.staging).await?,
        Step::Delete => {
            c.controller
                .delete_volume(requests::delete_request(&ctx.id))
                .await?;
        }
    }
    Ok(())
}

/// The GPT as `sfdisk -J` reads it: (name, start byte, bytes) per partition.
fn gpt_partitions(disk: &Path) -> Vec<(String, u64, u64)> {
    let out = run("sfdisk", &["-J", disk.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let parts = v["partitiontable"]["partitions"].as_array().cloned();
    parts
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            (
                name,
                p["start"].as_u64().unwrap() * 512,
                p["size"].as_u64().unwrap() * 512,
            )
        })
        .collect()
}

fn allocation(id: &str) -> String {
    gds_csi::csi::id::BlockVolumeId::parse(id)
        .unwrap()
        .allocation
}

/// Drops the whole disk's page cache first: it is not the partitions' (each block device
/// node has its own), so a page read before the driver wrote through a partition node
/// would otherwise be compared as if it were the disk (seen once in CI: a stale neighbour).
fn flush_cache(disk: &Path) {
    let ok = std::process::Command::new("blockdev")
        .arg("--flushbufs")
        .arg(disk)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "blockdev --flushbufs {}", disk.display());
}

fn read_disk(disk: &Path) -> Vec<u8> {
    flush_cache(disk);
    let mut buf = Vec::new();
    fs::File::open(disk).unwrap().read_to_end(&mut buf).unwrap();
    buf
}

fn range(disk: &Path, (start, len): (u64, u64)) -> Vec<u8> {
    flush_cache(disk);
    let mut f = fs::File::open(disk).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// The partition node of `v` while the kernel shows it.
fn v_node(ctx: &Ctx) -> Option<PathBuf> {
    let (start, _) = ctx.span?;
    let shown = kernel::list(&ctx.disk).unwrap();
    let k = shown.iter().find(|k| k.start == start)?;
    Some(PathBuf::from("/dev").join(&k.name))
}

fn check_at_kill(rig: &Rig, ctx: &Ctx, point: KillPoint) {
    let state = rig.state();
    let rec = &state["volumes"][&ctx.id];
    let gpt = gpt_partitions(&ctx.disk);
    let in_gpt = |ctx: &Ctx| gpt.iter().any(|(n, _, _)| *n == allocation(&ctx.id));
    match point {
        KillPoint::PartAfterClaim => {
            let recs = state["volumes"].as_object().unwrap();
            assert_eq!(recs.len(), 2, "claimed: {state}");
            assert_eq!(gpt.len(), 1, "nothing carved yet: {gpt:?}");
        }
        KillPoint::PartAfterLabel => {
            assert!(rec["partition"].is_null(), "record not updated yet: {rec}");
            assert!(in_gpt(ctx), "the GPT has the partition: {gpt:?}");
        }
        KillPoint::AfterAllocate => assert!(rec["partition"]["partuuid"].is_string()),
        KillPoint::AfterMkfs => {
            assert_eq!(rec["formatted"], false, "killed before the state update");
            let node = v_node(ctx).expect("shown");
            assert_eq!(blkid_tag(&node, "UUID"), rec["fs_uuid"].as_str().unwrap());
        }
        KillPoint::DeleteBeforeWipe => {
            assert_eq!(rec["deleting"], true);
            assert_eq!(blkid_tag(&v_node(ctx).expect("shown"), "TYPE"), "ext4");
        }
        KillPoint::DeleteAfterWipe => {
            assert!(range(&ctx.disk, ctx.span.unwrap()).iter().all(|b| *b == 0));
            assert!(in_gpt(ctx), "still in the GPT");
        }
        KillPoint::PartAfterUnshow => {
            assert!(v_node(ctx).is_none(), "out of the kernel");
            assert!(in_gpt(ctx), "still in the GPT");
        }
        KillPoint::PartAfterRemove => {
            assert!(!in_gpt(ctx), "out of the GPT: {gpt:?}");
            assert!(rec.is_object(), "record not dropped yet");
        }
        other => panic!("{other:?} is not a partition kill point"),
    }
}

/// The neighbour volume: carved, formatted, written, unstaged.
async fn neighbour(rig: &Rig, c: &mut Clients) -> String {
    let v = requests::create_volume(c, create_req("neighbour", 16 * MIB)).await;
    let staging = rig.path("staging-n");
    let cap = requests::single_writer_mount();
    requests::stage(c, &v.volume_id, &staging, cap)
        .await
        .unwrap();
    fs::write(staging.join("data"), b"n".repeat(3 << 20)).unwrap();
    requests::unstage(c, &v.volume_id, &staging).await.unwrap();
    v.volume_id
}

async fn kill_and_retry(rig: &mut Rig, ctx: &mut Ctx, point: KillPoint, step: Step) -> Clients {
    rig.kill9();
    let mut armed = rig
        .start_with(&[(gds_csi::runtime::faults::ENV, point.as_str())], &[])
        .await;
    let err = do_step(&mut armed, ctx, step)
        .await
        .expect_err("the call that reaches the kill point never answers");
    let status = rig
        .wait_exit(Duration::from_secs(20))
        .expect("died at the point");
    assert!(killed_by_sigkill(&status), "{status:?}");
    let died = format!("killed at {}", point.as_str());
    assert!(rig.logs().contains(&died), "died at the point ({err:?})");
    if step == Step::Create && ctx.id.is_empty() {
        let state = rig.state();
        let recs = state["volumes"].as_object().unwrap();
        let found = recs.iter().find(|(_, r)| r["name"] == "v");
        ctx.id = found.map(|(id, _)| id.clone()).unwrap_or_default();
    }
    ctx.span = span_of(ctx).or(ctx.span);
    check_at_kill(rig, ctx, point);
    let mut c = rig.start().await;
    for _ in 0..3 {
        do_step(&mut c, ctx, step)
            .await
            .unwrap_or_else(|e| panic!("retry of {step:?} after the kill: {e:?}"));
    }
    c
}

fn span_of(ctx: &Ctx) -> Option<(u64, u64)> {
    if ctx.id.is_empty() {
        return None;
    }
    let name = allocation(&ctx.id);
    let gpt = gpt_partitions(&ctx.disk);
    gpt.into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, s, l)| (s, l))
}

pub async fn scenario(point: KillPoint) -> String {
    let mut rig = PartRig(Rig::with_size(1, DISK).expect("root checked by the caller"));
    let disk = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let n_id = neighbour(&rig.0, &mut c).await;
    let before = read_disk(&disk);
    let mut ctx = Ctx {
        disk: disk.clone(),
        id: String::new(),
        staging: rig.0.path("staging-v"),
        span: None,
    };
    let kill_step = killed_step(point);
    for step in LIFE {
        if step == kill_step {
            c = kill_and_retry(&mut rig.0, &mut ctx, point, step).await;
        } else {
            do_step(&mut c, &mut ctx, step)
                .await
                .unwrap_or_else(|e| panic!("{step:?}: {e:?}"));
        }
        ctx.span = span_of(&ctx).or(ctx.span);
    }
    // Converged: only the neighbour left, everywhere.
    let gpt = gpt_partitions(&disk);
    assert_eq!(gpt.len(), 1, "a partition leaked: {gpt:?}");
    assert_eq!(gpt[0].0, allocation(&n_id));
    assert_eq!(
        kernel::list(&disk).unwrap().len(),
        1,
        "the kernel shows a leak"
    );
    let state = rig.0.state();
    let recs: Vec<_> = state["volumes"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(recs, vec![n_id.clone()], "a record leaked");
    assert_eq!(rig.0.mkfs_count(), 2, "mkfs once per volume over every run");
    let span = ctx.span.expect("v was carved");
    let after = read_disk(&disk);
    let (s, e) = (span.0 as usize, (span.0 + span.1) as usize);
    assert!(
        after[s..e].iter().all(|b| *b == 0),
        "v's blocks read back zeros"
    );
    let first = before[..s]
        .iter()
        .zip(&after[..s])
        .position(|(a, b)| a != b);
    let last = before[..s]
        .iter()
        .zip(&after[..s])
        .rposition(|(a, b)| a != b);
    assert!(
        before[..s] == after[..s],
        "a byte before v's partition changed: first {first:?} last {last:?}, v at {span:?}"
    );
    assert!(
        before[e..] == after[e..],
        "a byte after v's partition changed"
    );
    let staging = rig.0.path("staging-n");
    requests::stage(&mut c, &n_id, &staging, requests::single_writer_mount())
        .await
        .unwrap();
    assert_eq!(
        fs::read(staging.join("data")).unwrap(),
        b"n".repeat(3 << 20)
    );
    requests::unstage(&mut c, &n_id, &staging).await.unwrap();
    format!("killed in {kill_step:?}, retried: converged, mkfs 2 (one per volume), 0 leaked, other bytes identical")
}
