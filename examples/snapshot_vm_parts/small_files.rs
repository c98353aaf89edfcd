//! (g) Many small files: 20,000 files of 0.5-6 KiB in 100 directories written into an
//! NVMe volume, snapshotted unstaged (a full copy: no other snapshot of that volume is on
//! the store) and restored into a new volume, both timed, the restore compared with the
//! source entry by entry. Against fio on the same kind of tree: its read of the tree on
//! the volume, its write of 20,000 files of those sizes to the store (8 jobs, as the copy
//! runs 8 streams, each file created when it is written, flushed at the end), and its
//! read of the snapshot's tree on the store. Per-entry round trips weigh here, not bytes.

use std::path::Path;
use std::time::{Duration, Instant};

use super::figures::{fio_median, job_seconds, median, RUNS, TREE_READ};
use super::{compare_trees, drop_caches, ensure, sh, vm_common, Result, Rig, MIB, SERVER, STORE};

const DIRS: usize = 100;
const FILES_PER_DIR: usize = 200;
const SMALLEST: u64 = 512;
const LARGEST: u64 = 6 << 10;
/// fio keeps every file of a tree open by default: 20,000 pass the descriptor limit.
const OPEN_FEW: &str = "--openfiles=16 --file_service_type=sequential";

/// The files, each of a size in [SMALLEST, LARGEST] and its own bytes (xorshift, seeded):
/// their number and their sizes' sum.
fn write_files(root: &Path) -> Result<(usize, u64)> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut bytes = 0;
    for d in 0..DIRS {
        let dir = root.join(format!("d{d:03}"));
        std::fs::create_dir(&dir)?;
        for f in 0..FILES_PER_DIR {
            let len = SMALLEST + next() % (LARGEST - SMALLEST + 1);
            let data: Vec<u8> = (0..len.div_ceil(8))
                .flat_map(|_| next().to_le_bytes())
                .take(len as usize)
                .collect();
            std::fs::write(dir.join(format!("f{f:03}")), data)?;
            bytes += len;
        }
    }
    Ok((DIRS * FILES_PER_DIR, bytes))
}

pub async fn run(rig: &mut Rig) -> Result<String> {
    let v = rig.volume("src-small", 0).await?;
    vm_common::stage(&mut rig.c, &v).await?;
    vm_common::publish(&mut rig.c, &v).await?;
    let t0 = Instant::now();
    let (files, bytes) = write_files(&v.target)?;
    sh("sync")?;
    println!(
        "  {files} files, {:.1} MiB, written in {:.1} s",
        bytes as f64 / MIB as f64,
        t0.elapsed().as_secs_f64()
    );
    let tree_read = fio_median(
        RUNS,
        &format!("--opendir={} {TREE_READ} {OPEN_FEW}", v.target.display()),
    )?;
    println!("  fio tree read on the volume {tree_read:.2} MiB/s");
    vm_common::unpublish(&mut rig.c, &v).await?;
    vm_common::unstage(&mut rig.c, &v).await?;

    drop_caches()?;
    let snap = rig
        .snapshot_until_ready("snap-small", &v.id, Duration::from_secs(900))
        .await?;
    let snapshot_job = job_seconds("snapshot:snap-small");
    let r = rig
        .restore("restore-small", &snap.snap.snapshot_id, 0)
        .await?;
    drop_caches()?;
    let t0 = Instant::now();
    rig.stage_until_done(&r, Duration::from_secs(900)).await?;
    let restore_secs = t0.elapsed().as_secs_f64();
    let restore_job = job_seconds(&format!("clone:{}", r.id));
    println!(
        "  snapshot {:.1} s (job {snapshot_job:.1?} s), restore {restore_secs:.1} s (job {restore_job:.1?} s)",
        snap.secs
    );
    vm_common::publish(&mut rig.c, &r).await?;
    vm_common::stage(&mut rig.c, &v).await?;
    vm_common::publish(&mut rig.c, &v).await?;
    let compared = compare_trees(&v.target, &r.target, &[])?;
    vm_common::teardown(&mut rig.c, &r).await?;
    vm_common::teardown(&mut rig.c, &v).await?;

    let (store_write, store_read) = fio_on_store(files)?;
    let removed_in = delete_until_done(rig, &snap.snap.snapshot_id).await?;

    let mib = bytes as f64 / MIB as f64;
    let (snap_bw, restore_bw) = (mib / snap.secs, mib / restore_secs);
    let slower = tree_read.min(store_write);
    let job = |s: Option<f64>| s.map_or(f64::NAN, |s| mib / s);
    let (snap_ratio, restore_ratio) = (snap_bw / slower, restore_bw / store_read);
    let verdict = |r: f64| if r >= 0.9 { "met" } else { "MISSED" };
    Ok(format!(
        "{compared} entries of the restore equal the source's\nFIGURES small files: {files} files of 0.5-6 KiB ({mib:.1} MiB) in {DIRS} \
         directories; snapshot (full copy, CreateSnapshot to ready) {snap_bw:.2} MiB/s, the copy job alone {:.2}; fio tree read on the \
         volume {tree_read:.2} MiB/s, fio write of {files} files to the store (8 jobs) {store_write:.2} MiB/s: snapshot / slower = \
         {snap_ratio:.2} (goal >= 0.9: {}); restore (first NodeStage) {restore_bw:.2} MiB/s, the copy job alone {:.2}; fio tree read \
         on the store {store_read:.2} MiB/s: restore / fio = {restore_ratio:.2} (goal >= 0.9: {}); DeleteSnapshot done in {:.1} s \
         ({} calls: a retry joins the removal)",
        job(snapshot_job),
        verdict(snap_ratio),
        job(restore_job),
        verdict(restore_ratio),
        removed_in.0,
        removed_in.1,
    ))
}

/// DeleteSnapshot as the csi-snapshotter calls it: again while it answers Unavailable
/// (a removal of 20,000 entries outlasts one call's deadline; a retry joins it). The
/// seconds it took and the calls.
async fn delete_until_done(rig: &mut Rig, id: &str) -> Result<(f64, u32)> {
    let start = Instant::now();
    let mut calls = 0;
    loop {
        calls += 1;
        let answer = rig
            .c
            .controller
            .delete_snapshot(gds_csi::csi::DeleteSnapshotRequest {
                snapshot_id: id.into(),
                ..Default::default()
            })
            .await;
        match answer {
            Ok(_) => break,
            Err(e)
                if e.code() == tonic::Code::Unavailable
                    && start.elapsed() < Duration::from_secs(600) =>
            {
                println!("  DeleteSnapshot {calls}: {}", e.message());
            }
            Err(e) => return Err(format!("DeleteSnapshot after {calls} calls: {e}").into()),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    ensure(
        !rig.store_dir("snap-small").exists(),
        "DeleteSnapshot left the snapshot's directory",
    )?;
    Ok((secs, calls))
}

/// fio on a mount with the store's options: the write of `files` files of the dataset's
/// sizes (medians of `RUNS`, each into an emptied directory) and the read of the snapshot's
/// tree (one run).
fn fio_on_store(files: usize) -> Result<(f64, f64)> {
    let mnt = "/run/fig-store-small";
    sh(&format!(
        "mkdir -p {mnt} && mount -t nfs -o rdma,port=20049,vers=4.1 {SERVER}:/{STORE} {mnt}"
    ))?;
    let per_job = files / 8;
    let mut writes = Vec::new();
    for _ in 0..RUNS {
        sh(&format!("rm -rf {mnt}/fio-small && mkdir {mnt}/fio-small"))?;
        writes.push(fio_median(
            1,
            &format!(
                "--directory={mnt}/fio-small --numjobs=8 --group_reporting --nrfiles={per_job} \
                 --filesize={SMALLEST}-{LARGEST} --bsrange=512-64k --bs_unaligned=1 --rw=write --ioengine=psync \
                 --openfiles=1 --file_service_type=sequential --create_on_open=1 --end_fsync=1"
            ),
        )?);
    }
    println!("  fio writes to the store {writes:.2?} MiB/s");
    let read = fio_median(
        1,
        &format!("--opendir={mnt}/snap-small/tree {TREE_READ} {OPEN_FEW}"),
    );
    sh(&format!("rm -rf {mnt}/fio-small; umount {mnt}"))?;
    Ok((median(writes), read?))
}
