//! The snapshot figures, printed as `FIGURES ...` lines: in paired rounds (`ROUNDS`), a
//! restore's throughput (its first NodeStage: mkfs, the store's mount, the copy) after
//! fio's O_DIRECT read of the snapshot's tree on the store, and the snapshot of the
//! restored, unstaged NVMe volume to the NFS-over-RDMA store (CreateSnapshot's first call
//! to its ready answer) after fio's O_DIRECT read of that volume's tree and fio's buffered
//! write to the store, flushed at its end; the freeze time under a steady writer (the
//! driver's log) and the writer's longest stall; the bytes moved after a SIGKILL
//! mid-snapshot and mid-restore over the snapshot's size.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{drop_caches, ensure, sh, vm_common, Result, Rig, MIB, SERVER, STORE};

#[derive(Default)]
struct Recorded {
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
/// Paired rounds of the large-file figures: the host's load moves TCG's speed by a factor
/// of two within minutes, so each of ours is timed right after the fio run it is compared
/// with, and the ratio is the median of the rounds' ratios.
pub const ROUNDS: usize = 5;
/// Every regular file of a tree read raw by fio: O_DIRECT, 4 in flight, requests of 512 B
/// to 8 MiB (fio passes over a file smaller than its smallest request).
pub const TREE_READ: &str =
    "--rw=read --bsrange=512-8m --direct=1 --ioengine=libaio --iodepth=4 --readonly";

/// One paired round, in MiB/s of the dataset's allocated bytes.
struct Round {
    /// fio's tree read of the snapshot on the store, then the restore's first NodeStage
    /// and its copy job alone.
    store_read: f64,
    restore: f64,
    restore_job: f64,
    /// fio's tree read of the restored volume and its buffered write to the store (the
    /// slower of the two), then the snapshot of that volume, unstaged.
    slower: f64,
    snapshot: f64,
    snapshot_job: f64,
}

/// The store mounted for fio with the store's options, `f` run, the mount taken down.
pub const FIO_STORE: &str = "/run/fig-store";

pub async fn run(rig: &mut Rig) -> Result<String> {
    let snap = rig
        .snaps
        .get("snap-a")
        .ok_or("run the restore scenario first")?
        .clone();
    sh(&format!(
        "mkdir -p {FIO_STORE} && mount -t nfs -o rdma,port=20049,vers=4.1 {SERVER}:/{STORE} {FIO_STORE}"
    ))?;
    let mut rounds = Vec::new();
    let mut outcome = Ok(());
    for i in 1..=ROUNDS {
        match round(rig, &snap, i).await {
            Ok(r) => rounds.push(r),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    sh(&format!("rm -f {FIO_STORE}/fio.bin; umount {FIO_STORE}"))?;
    outcome?;
    let mut lines = large_file_lines(rig, &rounds);
    let rec = with(std::mem::take);
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

/// Round `i`: restore-fig-I from `snap` timed after fio's read of `snap`'s tree on the
/// store; the restored volume's tree read by fio, the store written by fio, then that
/// volume snapshotted (a full copy: no snapshot of it is on the store to link from).
async fn round(rig: &mut Rig, snap: &str, i: usize) -> Result<Round> {
    let data = rig.data_bytes as f64 / MIB as f64;
    // fio reads every file's size (holes as zeros) and writes the allocated bytes; each
    // figure below is in MiB/s of the allocated bytes, the dataset's.
    let of_dataset = |fio_mib_s: f64, fio_mib: f64| data / (fio_mib / fio_mib_s);
    let read = rig.read_bytes as f64 / MIB as f64;
    let stored = format!("{FIO_STORE}/snap-a/tree");
    let r = rig.restore(&format!("restore-fig-{i}"), snap, 0).await?;
    let store_read = of_dataset(
        fio_median(1, &format!("--opendir={stored} {TREE_READ}"))?,
        read,
    );
    drop_caches()?;
    let t0 = Instant::now();
    rig.stage_until_done(&r, Duration::from_secs(300)).await?;
    let restore = data / t0.elapsed().as_secs_f64();
    let restore_job = job_seconds(&format!("clone:{}", r.id)).map_or(f64::NAN, |s| data / s);
    vm_common::publish(&mut rig.c, &r).await?;
    let tree_read = fio_median(1, &format!("--opendir={} {TREE_READ}", r.target.display()));
    vm_common::unpublish(&mut rig.c, &r).await?;
    vm_common::unstage(&mut rig.c, &r).await?;
    let tree_read = of_dataset(tree_read?, read);
    let size = (rig.data_bytes / MIB as u64).max(8);
    // Buffered and flushed at the end (as the copy's small files are: page cache, then
    // syncfs); NFS O_DIRECT writes are each a round trip to the server.
    let store_write = fio_median(
        1,
        &format!(
            "--filename={FIO_STORE}/fio.bin --rw=write --bs=1m --ioengine=psync --end_fsync=1 \
             --size={size}m"
        ),
    )?;
    sh(&format!("rm -f {FIO_STORE}/fio.bin"))?;
    let name = format!("snap-fig-{i}");
    drop_caches()?;
    let t = rig
        .snapshot_until_ready(&name, &r.id, Duration::from_secs(300))
        .await?;
    let snapshot_job = job_seconds(&format!("snapshot:{name}")).map_or(f64::NAN, |s| data / s);
    rig.c
        .controller
        .delete_snapshot(gds_csi::csi::DeleteSnapshotRequest {
            snapshot_id: t.snap.snapshot_id,
            ..Default::default()
        })
        .await?;
    vm_common::teardown(&mut rig.c, &r).await?;
    println!(
        "  round {i}: store tree read {store_read:.1}, restore {restore:.1} (job {restore_job:.1}); \
         volume tree read {tree_read:.1}, store write {store_write:.1}, snapshot {:.1} (job {snapshot_job:.1}) MiB/s of the dataset",
        data / t.secs
    );
    Ok(Round {
        store_read,
        restore,
        restore_job,
        slower: tree_read.min(store_write),
        snapshot: data / t.secs,
        snapshot_job,
    })
}

/// The snapshot and restore lines: medians of the rounds' figures and of their ratios.
fn large_file_lines(rig: &Rig, rounds: &[Round]) -> Vec<String> {
    let data = rig.data_bytes as f64 / MIB as f64;
    let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let all = |f: &dyn Fn(&Round) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .map(|r| (f(r) * 100.0).round() / 100.0)
            .collect()
    };
    let verdict = |r: f64| if r >= 0.9 { "met" } else { "MISSED" };
    let snap_ratio = med(&|r| r.snapshot / r.slower);
    let snap_job_ratio = med(&|r| r.snapshot_job / r.slower);
    let restore_ratio = med(&|r| r.restore / r.store_read);
    let restore_job_ratio = med(&|r| r.restore_job / r.store_read);
    vec![
        format!(
            "FIGURES snapshot (full copies, {n} paired rounds): {data:.1} MiB dataset (unstaged ext4 NVMe volume -> NFS v4.1 over \
             soft-RoCE), CreateSnapshot to ready median {:.1} MiB/s, the copy job alone {:.1}; the slower of fio's tree read on \
             the volume and its buffered write to the store (end_fsync), each timed just before: median {:.1} MiB/s of the \
             dataset; snapshot / slower per round {:?}, median {snap_ratio:.2} (goal >= 0.9: {}); the copy job's {:?}, median \
             {snap_job_ratio:.2}",
            med(&|r| r.snapshot),
            med(&|r| r.snapshot_job),
            med(&|r| r.slower),
            all(&|r| r.snapshot / r.slower),
            verdict(snap_ratio),
            all(&|r| r.snapshot_job / r.slower),
            n = rounds.len(),
        ),
        format!(
            "FIGURES restore ({n} paired rounds): first NodeStage (mkfs, store mount, copy) median {:.1} MiB/s, the copy job \
             alone {:.1}; fio's tree read of the snapshot on the store (O_DIRECT; NFS v4.1 reads holes as zeros, as the \
             restore does), timed just before: median {:.1} MiB/s of the dataset; restore / fio per round {:?}, median \
             {restore_ratio:.2} (goal >= 0.9: {}); the copy job's {:?}, median {restore_job_ratio:.2}",
            med(&|r| r.restore),
            med(&|r| r.restore_job),
            med(&|r| r.store_read),
            all(&|r| r.restore / r.store_read),
            verdict(restore_ratio),
            all(&|r| r.restore_job / r.store_read),
            n = rounds.len(),
        ),
    ]
}
