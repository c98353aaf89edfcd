//! The benchmark client: drives a running `gds-csi serve` through its CSI socket and
//! prints a markdown table. `scripts/bench.sh` sets up the loop-device pool it expects:
//! one 64 MiB device (volume lifecycle), STORM devices of 32 MiB (the storm) and one of
//! 512 MiB (O_DIRECT reads through ext4, then xfs, vs the raw device).
//!
//! Usage: bench SOCKET WORK_DIR DRIVER_PID [ROUNDS] [STORM]
//! Section p (the partition layout, `bench_parts/partition.rs`) runs only when BENCH_ONLY
//! names p1 or p4, against a driver on the pool that section expects.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

#[path = "bench_parts/partition.rs"]
mod partition;

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MIB: u64 = 1 << 20;
const BLOCK: usize = 1 << 20;
const READ_BYTES: u64 = 256 * MIB;

fn cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

#[derive(Clone)]
struct Vol {
    id: String,
    fs: &'static str,
    context: std::collections::HashMap<String, String>,
    staging: PathBuf,
    target: PathBuf,
}

async fn create(
    c: &mut Clients,
    work: &Path,
    name: &str,
    range: (u64, u64),
    fs: &'static str,
) -> Result<Vol> {
    create_with(c, work, name, range, fs, &[]).await
}

/// `create` with extra StorageClass parameters (`layout`).
async fn create_with(
    c: &mut Clients,
    work: &Path,
    name: &str,
    range: (u64, u64),
    fs: &'static str,
    extra: &[(&str, &str)],
) -> Result<Vol> {
    // Measures the driver, not GDS: the gate (on by default) is turned off explicitly.
    let mut parameters: std::collections::HashMap<String, String> =
        [("gdsPolicy".to_string(), "disabled".to_string())].into();
    parameters.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let v = c
        .controller
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: range.0 as i64,
                limit_bytes: range.1 as i64,
            }),
            volume_capabilities: vec![cap(fs)],
            parameters,
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .ok_or("no volume in the response")?;
    let staging = work.join(format!("kubelet/staging/{name}"));
    let target = work.join(format!("kubelet/pods/{name}/volumes/{name}"));
    std::fs::create_dir_all(&staging)?;
    Ok(Vol {
        id: v.volume_id,
        fs,
        context: v.volume_context,
        staging,
        target,
    })
}

async fn stage(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
            volume_capability: Some(cap(v.fs)),
            volume_context: v.context.clone(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

async fn publish(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
            target_path: v.target.display().to_string(),
            volume_capability: Some(cap(v.fs)),
            volume_context: v.context.clone(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

async fn unpublish(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: v.target.display().to_string(),
        })
        .await?;
    Ok(())
}

async fn unstage(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
        })
        .await?;
    Ok(())
}

async fn delete(c: &mut Clients, v: &Vol) -> Result<()> {
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

async fn teardown(c: &mut Clients, v: &Vol) -> Result<()> {
    unpublish(c, v).await?;
    unstage(c, v).await?;
    delete(c, v).await
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile of durations in ms: the sample at rank ceil(p/100 x n). For
/// p99 of fewer than 100 samples that is the maximum (25 samples: rank 25 of 25).
fn pct(samples: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = samples.iter().map(|d| ms(*d)).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// VmRSS of `pid` in KiB. A failed read (the driver died, no such field) is an error: a 0
/// here would read as "met" against every RSS target.
fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("driver RSS: reading {path}: {e}"))?;
    parse_rss_kib(&text).ok_or_else(|| format!("driver RSS: no VmRSS line in {path}").into())
}

fn parse_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The device mounted at `path`, from our mountinfo.
fn source_of(path: &Path) -> Result<PathBuf> {
    let want = path.display().to_string();
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(4) == Some(&want.as_str()) {
            if let Some((_, post)) = line.split_once(" - ") {
                if let Some(src) = post.split(' ').nth(1) {
                    return Ok(PathBuf::from(src));
                }
            }
        }
    }
    Err(format!("nothing is mounted at {want}").into())
}

/// A BLOCK-sized buffer aligned for O_DIRECT, inside an over-allocated Vec.
fn aligned(storage: &mut Vec<u8>) -> &mut [u8] {
    storage.resize(BLOCK + 4096, 0);
    let off = storage.as_ptr().align_offset(4096);
    &mut storage[off..off + BLOCK]
}

fn write_direct(path: &Path, bytes: u64) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut storage = Vec::new();
    let buf = aligned(&mut storage);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    for _ in 0..bytes / BLOCK as u64 {
        f.write_all(buf)?;
    }
    f.sync_all()?;
    Ok(())
}

/// Sequential O_DIRECT read of `bytes` from the start of `path`; MiB/s.
fn read_direct(path: &Path, bytes: u64) -> Result<f64> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    f.seek(SeekFrom::Start(0))?;
    let mut storage = Vec::new();
    let buf = aligned(&mut storage);
    let start = Instant::now();
    let mut done = 0u64;
    while done < bytes {
        let n = f.read(buf)?;
        if n == 0 {
            return Err(format!("{} ended after {done} bytes", path.display()).into());
        }
        done += n as u64;
    }
    Ok(done as f64 / MIB as f64 / start.elapsed().as_secs_f64())
}

struct Table(Vec<[String; 4]>);

impl Table {
    fn row(
        &mut self,
        what: impl Into<String>,
        value: impl Into<String>,
        target: impl Into<String>,
        verdict: impl Into<String>,
    ) {
        self.0
            .push([what.into(), value.into(), target.into(), verdict.into()]);
    }
    fn print(&self) {
        println!("| measurement | result | target | met |");
        println!("|---|---|---|---|");
        for r in &self.0 {
            println!("| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        }
    }
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

async fn lifecycle(c: &mut Clients, work: &Path, rounds: usize, t: &mut Table) -> Result<()> {
    let names = [
        "CreateVolume",
        "NodeStageVolume (mkfs.ext4 + mount)",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
        "DeleteVolume (wipefs)",
    ];
    let mut d: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    for r in 0..rounds {
        let s = Instant::now();
        let v = create(c, work, &format!("life-{r}"), (40 * MIB, 100 * MIB), "ext4").await?;
        d[0].push(s.elapsed());
        let s = Instant::now();
        stage(c, &v).await?;
        d[1].push(s.elapsed());
        let s = Instant::now();
        publish(c, &v).await?;
        d[2].push(s.elapsed());
        let s = Instant::now();
        unpublish(c, &v).await?;
        d[3].push(s.elapsed());
        let s = Instant::now();
        unstage(c, &v).await?;
        d[4].push(s.elapsed());
        let s = Instant::now();
        delete(c, &v).await?;
        d[5].push(s.elapsed());
    }
    for (name, samples) in names.iter().zip(&d) {
        t.row(
            format!("a. {name}, 64 MiB loop, {rounds} rounds"),
            format!(
                "p50 {:.1} ms, p99 {:.1} ms",
                pct(samples, 50.0),
                pct(samples, 99.0)
            ),
            "",
            "",
        );
    }
    Ok(())
}

async fn storm(c: &mut Clients, work: &Path, pid: u32, n: usize, t: &mut Table) -> Result<()> {
    let range = (16 * MIB, 40 * MIB);
    // Serial: each volume staged and published alone.
    let mut vols = Vec::new();
    for i in 0..n {
        vols.push(create(c, work, &format!("serial-{i}"), range, "ext4").await?);
    }
    let mut serial = Vec::new();
    for v in &vols {
        let s = Instant::now();
        stage(c, v).await?;
        publish(c, v).await?;
        serial.push(s.elapsed());
    }
    for v in &vols {
        teardown(c, v).await?;
    }
    let serial_sum: Duration = serial.iter().sum();

    // Concurrent: the same devices (wiped by DeleteVolume, so mkfs runs again), all at once.
    let mut vols = Vec::new();
    for i in 0..n {
        vols.push(create(c, work, &format!("storm-{i}"), range, "ext4").await?);
    }
    let peak = Arc::new(AtomicU64::new(rss_kib(pid)?));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (Arc::clone(&peak), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid)?, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
    };
    let wall = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for v in vols.clone() {
        let mut c = c.clone();
        set.spawn(async move {
            let s = Instant::now();
            stage(&mut c, &v).await?;
            publish(&mut c, &v).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(s.elapsed())
        });
    }
    let mut each = Vec::new();
    while let Some(r) = set.join_next().await {
        each.push(r??);
    }
    let wall = wall.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampler.await??;
    let during = peak.load(Ordering::Relaxed);
    for v in &vols {
        teardown(c, v).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid)?;

    let ratio = wall.as_secs_f64() / serial_sum.as_secs_f64();
    let (p50, p99) = (pct(&each, 50.0), pct(&each, 99.0));
    t.row(
        format!("b. serial stage+publish, {n} x 32 MiB ext4"),
        format!(
            "sum {:.0} ms (p50 {:.1} ms, p99 {:.1} ms)",
            ms(serial_sum),
            pct(&serial, 50.0),
            pct(&serial, 99.0)
        ),
        "",
        "",
    );
    t.row(
        format!("b. storm wall, {n} concurrent stage+publish"),
        format!("{:.0} ms = {ratio:.2} x serial sum", ms(wall)),
        "<= 0.6 x",
        yes(ratio <= 0.6),
    );
    t.row(
        "b. storm per-volume latency",
        format!("p50 {p50:.0} ms, p99 {p99:.0} ms ({:.2} x p50)", p99 / p50),
        "p99 <= 2 x p50",
        yes(p99 <= 2.0 * p50),
    );
    t.row(
        "c. node plugin RSS, peak during the storm",
        mib(during),
        "",
        "",
    );
    t.row(
        "c. node plugin RSS, after the storm (torn down, +1 s)",
        mib(after),
        "<= 12 MiB",
        yes(after <= 12 * 1024),
    );
    Ok(())
}

async fn rate(socket: &Path, clients: usize, secs: f64, node_caps: bool) -> Result<f64> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let mut c = Clients::connect(socket).await?;
        set.spawn(async move {
            let end = Instant::now() + Duration::from_secs_f64(secs);
            let mut n = 0u64;
            while Instant::now() < end {
                if node_caps {
                    c.node
                        .node_get_capabilities(NodeGetCapabilitiesRequest {})
                        .await?;
                } else {
                    c.identity.probe(ProbeRequest {}).await?;
                }
                n += 1;
            }
            Ok::<_, tonic::Status>(n)
        });
    }
    let start = Instant::now();
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn reads(c: &mut Clients, work: &Path, t: &mut Table) -> Result<()> {
    for fs in ["ext4", "xfs"] {
        let v = create(c, work, &format!("read-{fs}"), (400 * MIB, 0), fs).await?;
        stage(c, &v).await?;
        publish(c, &v).await?;
        let result = async {
            let device = source_of(&v.staging)?;
            let file = v.target.join("bench.dat");
            write_direct(&file, READ_BYTES)?;
            let (mut best_fs, mut best_raw) = (0f64, 0f64);
            // Alternate, best of 5 each: the loop devices sit on the host's page cache.
            for _ in 0..5 {
                best_fs = best_fs.max(read_direct(&file, READ_BYTES)?);
                best_raw = best_raw.max(read_direct(&device, READ_BYTES)?);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((device, best_fs, best_raw))
        }
        .await;
        teardown(c, &v).await?;
        let (device, through_fs, raw) = result?;
        let ratio = through_fs / raw;
        t.row(
            format!(
                "e. O_DIRECT 1 MiB seq. read, 256 MiB, {fs} mount vs raw {}",
                device.display()
            ),
            format!("{through_fs:.0} vs {raw:.0} MiB/s = {ratio:.2} x"),
            ">= 0.95 x",
            yes(ratio >= 0.95),
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: bench SOCKET WORK_DIR DRIVER_PID [ROUNDS] [STORM]";
    let socket = PathBuf::from(args.first().ok_or(usage)?);
    let work = PathBuf::from(args.get(1).ok_or(usage)?);
    let pid: u32 = args.get(2).ok_or(usage)?.parse()?;
    let rounds: usize = args.get(3).map_or(Ok(25), |s| s.parse())?;
    let n: usize = args.get(4).map_or(Ok(64), |s| s.parse())?;
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let want = |k: &str| only.is_empty() || only.split(',').any(|o| o == k);
    let named = |k: &str| only.split(',').any(|o| o == k);
    if named("p1") || named("p4") {
        let mut c = Clients::connect_ready(&socket, Duration::from_secs(60)).await?;
        let mut t = Table(Vec::new());
        if named("p1") {
            eprintln!("bench: p. partition layout on one device, {rounds} rounds");
            partition::reads(&mut c, &work, &mut t).await?;
            partition::lifecycle(&mut c, &work, rounds, &mut t).await?;
            partition::storm(&mut c, &work, n, 1, &mut t).await?;
        } else {
            eprintln!("bench: p. partition layout on four devices");
            partition::storm(&mut c, &work, n, 4, &mut t).await?;
        }
        t.print();
        return Ok(());
    }

    // Ready means the pool is scanned: the idle figure below is after the scan.
    let mut c = Clients::connect_ready(&socket, Duration::from_secs(60)).await?;
    let mut t = Table(Vec::new());
    let idle = rss_kib(pid)?;
    t.row(
        "c. node plugin RSS, idle (pool scanned)",
        mib(idle),
        "<= 8 MiB",
        yes(idle <= 8 * 1024),
    );
    if want("a") {
        eprintln!("bench: a. volume lifecycle x {rounds}");
        lifecycle(&mut c, &work, rounds, &mut t).await?;
    }
    if want("b") {
        eprintln!("bench: b. storm of {n}");
        storm(&mut c, &work, pid, n, &mut t).await?;
    }
    if want("d") {
        eprintln!("bench: d. gRPC rates");
        for clients in [1, 4] {
            let probe = rate(&socket, clients, 2.0, false).await?;
            let caps = rate(&socket, clients, 2.0, true).await?;
            t.row(
                format!("d. Probe, {clients} client(s), 2 s"),
                format!("{probe:.0} calls/s"),
                "",
                "",
            );
            t.row(
                format!("d. NodeGetCapabilities, {clients} client(s), 2 s"),
                format!("{caps:.0} calls/s"),
                "",
                "",
            );
        }
    }
    if want("e") {
        eprintln!("bench: e. O_DIRECT reads");
        reads(&mut c, &work, &mut t).await?;
    }
    t.row("c. node plugin RSS, at the end", mib(rss_kib(pid)?), "", "");
    t.print();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_of_25_samples_is_the_maximum() {
        let samples: Vec<Duration> = (1..=25).map(Duration::from_millis).collect();
        assert_eq!(pct(&samples, 99.0), 25.0);
        assert_eq!(pct(&samples, 50.0), 13.0);
        let hundred: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(pct(&hundred, 99.0), 99.0);
    }

    #[test]
    fn a_failed_rss_read_is_an_error_not_zero() {
        assert_eq!(parse_rss_kib("Name:\tx\nVmRSS:\t  6860 kB\n"), Some(6860));
        assert_eq!(parse_rss_kib("Name:\tx\n"), None);
        assert!(rss_kib(u32::MAX).is_err());
        assert!(rss_kib(std::process::id()).unwrap() > 0);
    }
}
