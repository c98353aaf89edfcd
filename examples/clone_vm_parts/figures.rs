//! The clone's figures (docs/benchmarks.md, "Clones"): the driver's copy (NodeStage of the
//! `volume` scenario: mkfs, mounts, the copy and its size check) against `cp -a` of the
//! same tree from the same NFS-over-RDMA export onto an ext4 NVMe namespace, fio's
//! O_DIRECT read of the source's large files and write of the target, as ratios; and
//! the driver's CPU seconds (utime + stime of /proc/<pid>/stat) per GiB copied.

use std::sync::Mutex;
use std::time::Instant;

use super::{ensure, sh, Result, Rig, DATA, SERVER};

/// Bytes, wall seconds and CPU seconds of the driver's copy.
static DRIVER: Mutex<Option<(u64, f64, f64)>> = Mutex::new(None);

pub fn record_driver(bytes: u64, secs: f64, cpu: f64) {
    *DRIVER.lock().unwrap() = Some((bytes, secs, cpu));
}

/// The driver's user + system CPU seconds so far (DRIVER_PID_FILE names its pid).
pub fn cpu_seconds() -> Result<f64> {
    let pid = std::fs::read_to_string(std::env::var("DRIVER_PID_FILE")?)?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))?;
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').ok_or("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    let hz: f64 = sh("getconf CLK_TCK")?.parse()?;
    Ok(ticks / hz)
}

/// The first clone job's duration in the driver's log (`runtime/overlap.rs`: mount, copy, check,
/// unmount; after mkfs).
fn job_seconds() -> Result<f64> {
    let line = first_log_line("long job finished job=\"clone\"")?;
    let secs = line.rsplit_once("seconds=").ok_or("no seconds")?.1;
    Ok(secs.split_whitespace().next().unwrap_or("").parse()?)
}

/// The first copy's phases in the driver's log (`src/volume/copy/mod.rs`, `copy finished ...
/// phases=walk 0.31 s, structure 0.22 s, data 7.78 s, ...`): (all of them, the data phase)
/// in seconds; the copy without the job's mounts and unmounts.
fn copy_phases() -> Result<(f64, f64)> {
    let line = first_log_line("copy finished")?;
    let phases = line.rsplit_once("phases=").ok_or("no phases")?.1;
    let (mut all, mut data) = (0.0, 0.0);
    for phase in phases.trim_matches('"').split(", ") {
        let mut words = phase.rsplit(' ');
        let (_, secs) = (words.next(), words.next().ok_or("phase")?.parse::<f64>()?);
        all += secs;
        if phase.starts_with("data ") {
            data = secs;
        }
    }
    Ok((all, data))
}

/// The driver log's first line holding `needle` (DRIVER_LOG names the log).
fn first_log_line(needle: &str) -> Result<String> {
    let log = std::fs::read_to_string(std::env::var("DRIVER_LOG")?)?;
    let line = log.lines().find(|l| l.contains(needle));
    Ok(line
        .ok_or_else(|| format!("no `{needle}` in the driver's log"))?
        .to_owned())
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
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
    Ok(bw / (1 << 20) as f64)
}

pub async fn run(rig: &Rig) -> Result<String> {
    let (bytes, secs, cpu) = DRIVER
        .lock()
        .unwrap()
        .ok_or("run the volume scenario first")?;
    let cp_dev = std::env::var("CP_DEV")?;
    sh("mkdir -p /run/fig-src /run/fig-dst")?;
    sh(&format!(
        "mount -t nfs -o rdma,port=20049,vers=4.1,ro {SERVER}:/ /run/fig-src"
    ))?;
    sh(&format!("mount -o data=ordered {cp_dev} /run/fig-dst"))?;
    let src = format!("/run/fig-src/{DATA}");
    let drop = || sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    // The source's raw read: its two large files, O_DIRECT, 8 MiB requests, 4 in flight
    // (the copy's streams and buffer size).
    drop()?;
    let read = fio(&format!(
        "--filename={src}/big0.bin:{src}/big1.bin --rw=read --bs=8m --direct=1 \
         --ioengine=libaio --iodepth=4 --readonly --size=64m"
    ))?;
    drop()?;
    let write = fio(
        "--filename=/run/fig-dst/fio.bin --rw=write --bs=8m --direct=1 \
         --ioengine=libaio --iodepth=4 --size=64m",
    )?;
    sh("rm -f /run/fig-dst/fio.bin")?;
    // The whole tree read raw by fio: every regular file (symlinks and the FIFO passed
    // over, the hard link's file under both names), O_DIRECT, 4 in flight. Requests of
    // 512 B to 8 MiB: fio passes over a file smaller than its smallest request, and the
    // tree's small files are part of what the copy reads.
    drop()?;
    let tree = fio(&format!(
        "--opendir={src} --rw=read --bsrange=512-8m --direct=1 --ioengine=libaio \
         --iodepth=4 --readonly"
    ))?;
    drop()?;
    let t0 = Instant::now();
    let cp_cpu = sh(&format!(
        "/usr/bin/time -f '%U %S' cp -a {src} /run/fig-dst/ 2>&1 >/dev/null | tail -1; sync"
    ))?;
    let cp_secs = t0.elapsed().as_secs_f64();
    let cp_cpu: f64 = cp_cpu
        .split_whitespace()
        .filter_map(|t| t.parse::<f64>().ok())
        .sum();
    let dst = format!("/run/fig-dst/{DATA}");
    let cp_tree = super::compare_trees(&rig.export.join(DATA), std::path::Path::new(&dst));
    sh("umount /run/fig-src; umount /run/fig-dst")?;
    ensure(
        cp_tree.is_ok(),
        format!("cp -a's copy differs: {cp_tree:?}"),
    )?;
    let job = job_seconds()?;
    let (copy_secs, data_secs) = copy_phases()?;
    let (driver, stage) = (mib_s(bytes, job), mib_s(bytes, secs));
    let (copy, data) = (mib_s(bytes, copy_secs), mib_s(bytes, data_secs));
    let cp = mib_s(bytes, cp_secs);
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let table = format!(
        "dataset {:.1} MiB; driver copy {copy:.1} MiB/s ({copy_secs:.2} s: walk, structure, \
         data, verify, metadata, syncfs; its data phase {data:.1} MiB/s); copy job \
         {driver:.1} MiB/s ({job:.2} s: the copy and the mounts; NodeStage with mkfs \
         {stage:.1} MiB/s, {secs:.2} s); cp -a {cp:.1} MiB/s ({cp_secs:.2} s); fio source tree \
         read {tree:.1} MiB/s; fio source large files read {read:.1} MiB/s; fio target write \
         {write:.1} MiB/s; copy/cp = {:.2}, copy/min(tree read, write) = {:.2}, copy/large-file \
         read = {:.2}, job/min(tree read, write) = {:.2}; CPU per GiB: driver {:.2} s, cp -a \
         {:.2} s",
        bytes as f64 / (1 << 20) as f64,
        copy / cp,
        copy / tree.min(write),
        copy / read,
        driver / tree.min(write),
        cpu / gib,
        cp_cpu / gib
    );
    println!("FIGURES {table}");
    Ok(table)
}
