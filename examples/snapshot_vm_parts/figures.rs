//! The snapshot figures, printed as `FIGURES ...` lines: the snapshot's throughput (a
//! written, unstaged NVMe volume to the NFS-over-RDMA store, CreateSnapshot's first call
//! to its ready answer, three runs) against fio's O_DIRECT read of the same tree on the
//! volume and fio's buffered write to the store, flushed at its end (three runs each,
//! medians); the restore's throughput (its first NodeStage: mkfs, the store's mount, the
//! copy; three runs) beside fio's read of the snapshot's tree on the store (one run); the freeze time under a steady writer
//! (the driver's log) and the writer's longest stall; the bytes moved after a SIGKILL
//! mid-snapshot and mid-restore over the snapshot's size.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{drop_caches, ensure, sh, vm_common, Result, Rig, MIB, SERVER, STORE};

#[derive(Default)]
struct Recorded {
    /// (bytes, seconds) of each snapshot of the unstaged source.
    snapshots: Vec<(u64, f64)>,
    /// (bytes, seconds) of each restore's first NodeStage.
    restores: Vec<(u64, f64)>,
    /// The driver's freeze and the writer's gap across it, seconds.
    freeze: Option<(f64, f64)>,
    /// The store written and the source read after a SIGKILL mid-snapshot, and the store
    /// written in all, x the snapshot.
    kill: Option<(f64, f64, f64)>,
    /// The store read after a SIGKILL mid-restore, and in all, x the snapshot.
    restore_kill: Option<(f64, f64)>,
}

static RECORDED: Mutex<Option<Recorded>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Recorded) -> T) -> T {
    f(RECORDED
        .lock()
        .unwrap()
        .get_or_insert_with(Recorded::default))
}

pub fn record_snapshot(bytes: u64, secs: f64) {
    with(|r| r.snapshots.push((bytes, secs)));
}

pub fn record_restore(bytes: u64, secs: f64) {
    with(|r| r.restores.push((bytes, secs)));
}

pub fn record_freeze(freeze: f64, stall: f64) {
    with(|r| r.freeze = Some((freeze, stall)));
}

pub fn record_kill(written: f64, read: f64, all: f64) {
    with(|r| r.kill = Some((written, read, all)));
}

pub fn record_restore_kill(after: f64, all: f64) {
    with(|r| r.restore_kill = Some((after, all)));
}

/// The driver log's length now (DRIVER_LOG names it), to read what comes after.
pub fn log_len() -> Result<u64> {
    Ok(std::fs::metadata(std::env::var("DRIVER_LOG")?)?.len())
}

/// The freeze time the driver logged after byte `from` of its log: the first number (in
/// seconds, or with a `ms` unit) on the first line that mentions a freeze.
pub fn freeze_seconds(from: u64) -> Result<f64> {
    let log = std::fs::read(std::env::var("DRIVER_LOG")?)?;
    let text = String::from_utf8_lossy(&log[from as usize..]).into_owned();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("froze") || l.contains("freeze")
        })
        .collect();
    for line in &lines {
        if let Some(secs) = seconds_in(line) {
            return Ok(secs);
        }
    }
    Err(format!("no freeze time in the driver's log; lines about a freeze: {lines:?}").into())
}

/// The first `freeze...=N`/`froze...=N` field of a log line (N in seconds, `Ns` or `Nms`),
/// else the first number followed by ` s`.
fn seconds_in(line: &str) -> Option<f64> {
    let parse = |v: &str| -> Option<f64> {
        let v = v.trim_matches(|c| c == '"' || c == ',');
        if let Some(ms) = v.strip_suffix("ms") {
            return ms.parse::<f64>().ok().map(|m| m / 1000.0);
        }
        v.trim_end_matches('s').parse().ok()
    };
    for word in line.split_whitespace() {
        if let Some((k, v)) = word.split_once('=') {
            let k = k.to_lowercase();
            if (k.contains("froze") || k.contains("freeze")) && !k.contains("limit") {
                if let Some(s) = parse(v) {
                    return Some(s);
                }
            }
        }
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    words.windows(2).find_map(|w| match w[1] {
        "s" | "s," | "s)" | "seconds" => parse(w[0]),
        _ => None,
    })
}

/// The writer's gaps between two completed writes (its file holds one timestamp a line):
/// the longest after byte `from` of the driver's log began (the snapshot), the longest
/// before it, and the one spanning the end of the freeze the log reports (its line's time).
pub fn writer_gaps(times: &str, from: u64) -> Result<(f64, f64, f64)> {
    let text = std::fs::read_to_string(times)?;
    let t: Vec<f64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    ensure(t.len() > 2, "the writer wrote nothing")?;
    let log = std::fs::read(std::env::var("DRIVER_LOG")?)?;
    let text = String::from_utf8_lossy(&log[from as usize..]).into_owned();
    let stamp = |l: &str| -> Result<f64> {
        let ts = l.split_whitespace().next().ok_or("empty log line")?;
        Ok(sh(&format!("date -d '{ts}' +%s.%N"))?.parse()?)
    };
    let first = text
        .lines()
        .next()
        .ok_or("nothing logged after the snapshot began")?;
    let froze = text
        .lines()
        .find(|l| l.contains("freeze_seconds="))
        .ok_or("no freeze line")?;
    let (start, thawed) = (stamp(first)?, stamp(froze)?);
    let gaps: Vec<(f64, f64)> = t.windows(2).map(|w| (w[0], w[1])).collect();
    let longest = |f: &dyn Fn(&(f64, f64)) -> bool| {
        gaps.iter()
            .filter(|g| f(g))
            .map(|g| g.1 - g.0)
            .fold(0.0, f64::max)
    };
    let during = longest(&|g| g.1 >= start);
    let before = longest(&|g| g.1 < start);
    let across = longest(&|g| g.0 <= thawed && g.1 >= thawed);
    Ok((during, before, across))
}

/// The seconds of the job `key` in the driver's log (`runtime/overlap.rs`: `long job
/// finished job=... key=KEY seconds=S`; a snapshot's is `snapshot:NAME`, a restore's
/// `clone:VOLUME_ID`), the last one logged.
pub fn job_seconds(key: &str) -> Option<f64> {
    let log = std::fs::read_to_string(std::env::var("DRIVER_LOG").ok()?).ok()?;
    let needle = format!("key={key} seconds=");
    let line = log.lines().rev().find(|l| l.contains(&needle))?;
    line.rsplit_once("seconds=")?.1.trim().parse().ok()
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / MIB as f64 / secs
}

/// fio's bandwidth in MiB/s of one job (`json` output).
fn fio(args: &str) -> Result<f64> {
    let out = sh(&format!("fio --output-format=json --name=fig {args}"))?;
    // `--opendir` prints how many files it added before the JSON.
    let json = out.find('{').map_or(out.as_str(), |at| &out[at..]);
    let v: serde_json::Value = serde_json::from_str(json)?;
    let job = &v["jobs"][0];
    let bw = job["read"]["bw_bytes"].as_f64().unwrap_or(0.0)
        + job["write"]["bw_bytes"].as_f64().unwrap_or(0.0);
    Ok(bw / MIB as f64)
}

/// `runs` runs of a fio job, the page cache dropped before each: the median MiB/s.
pub fn fio_median(runs: usize, args: &str) -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..runs {
        drop_caches()?;
        v.push(fio(args)?);
    }
    Ok(median(v))
}

pub const RUNS: usize = 3;
/// Every regular file of a tree read raw by fio: O_DIRECT, 4 in flight, requests of 512 B
/// to 8 MiB (fio passes over a file smaller than its smallest request).
pub const TREE_READ: &str =
    "--rw=read --bsrange=512-8m --direct=1 --ioengine=libaio --iodepth=4 --readonly";

pub async fn run(rig: &mut Rig) -> Result<String> {
    let a = rig.source.clone().ok_or("run the restore scenario first")?;
    // fio's read of the source's tree on its NVMe volume, staged for it alone.
    vm_common::stage(&mut rig.c, &a).await?;
    vm_common::publish(&mut rig.c, &a).await?;
    let tree_read = fio_median(
        RUNS,
        &format!("--opendir={} {TREE_READ}", a.target.display()),
    );
    vm_common::unpublish(&mut rig.c, &a).await?;
    vm_common::unstage(&mut rig.c, &a).await?;
    let tree_read = tree_read?;
    // fio's write to the store and read of the snapshot's tree there, through a mount
    // with the store's options.
    let mnt = "/run/fig-store";
    sh(&format!(
        "mkdir -p {mnt} && mount -t nfs -o rdma,port=20049,vers=4.1 {SERVER}:/{STORE} {mnt}"
    ))?;
    // Buffered and flushed at the end (as the copy writes: page cache, then syncfs); NFS
    // O_DIRECT writes are each a round trip to the server, slower than the store is.
    let size = (rig.data_bytes / MIB as u64).max(8);
    let store_write = fio_median(
        RUNS,
        &format!(
            "--filename={mnt}/fio.bin --rw=write --bs=1m --ioengine=psync --end_fsync=1 \
             --size={size}m"
        ),
    );
    let stored = format!("{mnt}/snap-a/tree");
    let store_read = if std::path::Path::new(&stored).is_dir() {
        fio_median(1, &format!("--opendir={stored} {TREE_READ}"))
    } else {
        Err("no snap-a on the store".into())
    };
    sh(&format!("rm -f {mnt}/fio.bin; umount {mnt}"))?;
    let store_write = store_write?;
    println!(
        "  fio: tree read on the source volume {tree_read:.1} MiB/s, write to the store {store_write:.1} MiB/s, \
         snapshot tree read on the store {:.1?} MiB/s",
        store_read.as_ref().ok()
    );
    let store_read = store_read?;
    let snap = rig
        .snaps
        .get("snap-a")
        .ok_or("run the restore scenario first")?
        .clone();
    // Two more restores, and a snapshot of each restored volume once unstaged: a full
    // copy, since no other snapshot of that volume is on the store to link from (a
    // further snapshot of the source would link every file from snap-a).
    let mut restore_jobs = Vec::new();
    for i in 2..=RUNS {
        let r = rig.restore(&format!("restore-fig-{i}"), &snap, 0).await?;
        drop_caches()?;
        let t0 = Instant::now();
        rig.stage_until_done(&r, Duration::from_secs(300)).await?;
        record_restore(rig.data_bytes, t0.elapsed().as_secs_f64());
        restore_jobs.extend(job_seconds(&format!("clone:{}", r.id)));
        vm_common::unstage(&mut rig.c, &r).await?;
        let name = format!("snap-fig-{i}");
        drop_caches()?;
        let t = rig
            .snapshot_until_ready(&name, &r.id, Duration::from_secs(300))
            .await?;
        record_snapshot(rig.data_bytes, t.secs);
        rig.c
            .controller
            .delete_snapshot(gds_csi::csi::DeleteSnapshotRequest {
                snapshot_id: t.snap.snapshot_id,
                ..Default::default()
            })
            .await?;
        vm_common::teardown(&mut rig.c, &r).await?;
    }
    let rec = RECORDED.lock().unwrap();
    let rec = rec.as_ref().ok_or("nothing recorded")?;
    let snaps: Vec<f64> = rec.snapshots.iter().map(|&(b, s)| mib_s(b, s)).collect();
    let jobs: Vec<f64> = [
        "snapshot:snap-a",
        "snapshot:snap-fig-2",
        "snapshot:snap-fig-3",
    ]
    .iter()
    .filter_map(|n| job_seconds(n))
    .map(|s| mib_s(rig.data_bytes, s))
    .collect();
    let restores: Vec<f64> = rec.restores.iter().map(|&(b, s)| mib_s(b, s)).collect();
    let restore_jobs: Vec<f64> = restore_jobs
        .iter()
        .map(|&s| mib_s(rig.data_bytes, s))
        .collect();
    let (snap_bw, restore_bw) = (median(snaps.clone()), median(restores.clone()));
    // Compared on the same work: fio reads every file's size (holes as zeros) and writes
    // the allocated bytes; the figures are MiB/s of the allocated bytes.
    let (data, read) = (
        rig.data_bytes as f64 / MIB as f64,
        rig.read_bytes as f64 / MIB as f64,
    );
    let slower = data / (read / tree_read).max(data / store_write);
    let ratio = snap_bw / slower;
    let store_read_bw = data / (read / store_read);
    let (restore_ratio, job_ratio) = (
        restore_bw / store_read_bw,
        median(restore_jobs.clone()) / store_read_bw,
    );
    let mut lines = vec![format!(
        "FIGURES snapshot (full copies): {data:.1} MiB dataset (unstaged ext4 NVMe volume -> NFS v4.1 over soft-RoCE), median {snap_bw:.1} MiB/s \
         of {snaps:.1?} (CreateSnapshot to ready; the copy job alone, from the log: {jobs:.1?}); fio tree read on the volume {tree_read:.1} MiB/s \
         of {read:.1} MiB, fio buffered write to the store (end_fsync) {store_write:.1} MiB/s (medians of {RUNS}): the slower takes {:.2} s, \
         {slower:.1} MiB/s of the dataset; snapshot / slower = {ratio:.2} (goal >= 0.9: {})",
        data / slower,
        if ratio >= 0.9 { "met" } else { "MISSED" }
    )];
    lines.push(format!(
        "FIGURES restore: median {restore_bw:.1} MiB/s of {restores:.1?} (first NodeStage: mkfs, store mount, copy), the copy job alone \
         {restore_jobs:.1?}; fio tree read on the store {store_read:.1} MiB/s of {read:.1} MiB (one run; NFS v4.1 reads holes as zeros, \
         as the restore does), {store_read_bw:.1} MiB/s of the dataset; restore / fio = {restore_ratio:.2}, copy job / fio = {job_ratio:.2} (goal >= 0.9: {})",
        if restore_ratio >= 0.9 { "met" } else if job_ratio >= 0.9 { "met by the copy; MISSED with mkfs and mount" } else { "MISSED" }
    ));
    if let Some((freeze, stall)) = rec.freeze {
        lines.push(format!(
            "FIGURES freeze under a steady writer (64 KiB O_DSYNC rewrites of a 1 MiB file; the rest, a {:.0} MiB \
             dataset of 234 entries, unchanged; 256 MiB namespace): driver froze {freeze:.3} s (goal <= 1 s: {}); the writer's gap across the freeze {stall:.3} s",
            rig.data_bytes as f64 / MIB as f64,
            if freeze <= 1.0 { "met" } else { "MISSED" }
        ));
    }
    if let Some((written, read, all)) = rec.kill {
        lines.push(format!(
            "FIGURES SIGKILL mid-snapshot: after the restart the store was written {written:.2} x and the source read \
             {read:.2} x the snapshot (nfsd io; /sys/block/nvme0c0nN/stat), the store written {all:.2} x in all"
        ));
    }
    if let Some((after, all)) = rec.restore_kill {
        lines.push(format!(
            "FIGURES SIGKILL mid-restore: read from the store after the kill {after:.2} x the snapshot (goal <= 1.5: {}), \
             in all {all:.2} x (nfsd io counter, server side)",
            if after <= 1.5 { "met" } else { "MISSED" }
        ));
    }
    for l in &lines {
        println!("{l}");
    }
    Ok(format!("{} figure lines", lines.len()))
}
