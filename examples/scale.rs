//! The scale benchmarks of the driver binary (`DRIVER`) on loop devices, `layout: partition`.
//!
//! `block`: how each call's cost grows with the volumes a node holds. For each count, a
//! pool of a fixed number of devices (a node with eight drives), the driver filled with
//! that many 2 MiB volumes, then ROUNDS of CreateVolume, NodeStage (an ext4 of 16 MiB),
//! NodePublish, DeleteVolume, every page of ListVolumes (100 a page) and GetCapacity,
//! three restarts to Probe ready, the driver's RSS and the state's size. Prints a
//! markdown table of p50 (p99) and the ratio of the largest count to the smallest.
//!
//! `storm`: N concurrent CreateVolume + NodeStage + NodePublish on distinct volumes, as
//! the external-provisioner and the kubelet send them, against the same calls one at a
//! time in the same run; the driver's open fds and threads before, at peak and after.
//!
//! Usage (root; `scripts/bench.sh scale` and `scripts/bench.sh storm` build and run it):
//!   scale [block] DRIVER WORK_DIR [COUNTS=10,100,1000] [ROUNDS=30] [--devices 8]
//!   scale storm DRIVER WORK_DIR [N=256] [--per-device 255]
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod scale_common;
#[path = "scale_parts/storm.rs"]
mod storm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gds_csi::csi::Clients;
use scale_common::{add_state, fill, print_table, round, rss_kib, Figures, Result, MIB};

/// Pool devices of the block run: the same whatever the count, so the figures follow the
/// volume count alone.
const DEVICES: usize = 8;
/// Partition volumes one pool device holds: the usable entries of its GPT label (255;
/// 128 in builds before labels of 256 entries). The storm's devices follow from it.
const PER_DEVICE: usize = 255;
/// The fill volumes: the smallest ext4 with a journal the driver carves (its mkfs's floor,
/// rounded up to whole MiB).
const FILL_BYTES: u64 = 2 * MIB;
/// The measured volumes: large enough for an ext4 with a journal (`data=ordered`).
const ROUND_BYTES: u64 = 16 * MIB;
/// What one volume of `bytes` takes while the device has room: its span and the growth
/// room kept after it (half its size, whole MiB).
const fn span(bytes: u64) -> u64 {
    bytes + (bytes / 2).div_ceil(MIB) * MIB
}
/// A create may land on any device (best fit, busy devices passed over), so each must hold
/// a full label of fill volumes and a measured one with their growth room, beside the label
/// (2 MiB with alignment). Sparse files: the size costs nothing.
const DEVICE_BYTES: u64 = PER_DEVICE as u64 * span(FILL_BYTES) + span(ROUND_BYTES) + 16 * MIB;

fn params() -> HashMap<String, String> {
    [
        ("gdsPolicy".to_string(), "disabled".to_string()),
        ("layout".to_string(), "partition".to_string()),
    ]
    .into()
}

fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd).args(args).output()?;
    if !out.status.success() {
        return Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Loop devices on sparse files; their partitions leave the kernel and they are detached
/// on drop.
struct Pool(Vec<PathBuf>);

impl Pool {
    fn new(dir: &Path, n: usize, bytes: u64) -> Result<Pool> {
        let mut pool = Pool(Vec::new());
        for i in 0..n {
            let img = dir.join(format!("dev{i}.img"));
            std::fs::File::create(&img)?.set_len(bytes)?;
            let dev = run("losetup", &["-f", "--show", img.to_str().unwrap()])?;
            pool.0.push(PathBuf::from(dev));
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for dev in &self.0 {
            for p in gds_csi::disk::gpt::kernel::list(dev).unwrap_or_default() {
                let _ = gds_csi::disk::gpt::kernel::delete(dev, p.number);
            }
            let _ = run("losetup", &["-d", dev.to_str().unwrap()]);
        }
    }
}

/// The driver process on `dir` with `pool`; killed on drop.
struct Driver {
    child: Child,
    socket: PathBuf,
}

impl Driver {
    /// Started and ready; the clients that saw Probe ready, and how long that took.
    async fn start(bin: &Path, dir: &Path, pool: &Pool) -> Result<(Driver, Clients, Duration)> {
        let socket = dir.join("csi.sock");
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--mode", "all", "--node-id", "scale-node"])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--allowed-path-root")
            .arg(dir);
        for d in &pool.0 {
            cmd.arg("--pool-device").arg(d);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("driver.log"))?;
        let began = Instant::now();
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn()?;
        let driver = Driver { child, socket };
        let clients = Clients::connect_ready(&driver.socket, Duration::from_secs(120)).await?;
        Ok((driver, clients, began.elapsed()))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(mut self) {
        // Only a child not reaped yet: a reaped one's pid may be another process's by now.
        if let Ok(None) = self.child.try_wait() {
            let _ = run("kill", &["-TERM", &self.child.id().to_string()]);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn measure(
    bin: &Path,
    work: &Path,
    count: usize,
    rounds: usize,
    devices: usize,
) -> Result<Figures> {
    // Rounds run one at a time: one measured volume beside the fill at any moment.
    if count + 1 > devices * PER_DEVICE {
        return Err(format!(
            "{count} volumes and a measured one need more than {devices} devices of \
             {PER_DEVICE} partitions; raise --devices"
        )
        .into());
    }
    let dir = work.join(format!("n{count}"));
    std::fs::create_dir_all(&dir)?;
    let pool = Pool::new(&dir, devices, DEVICE_BYTES)?;
    let (driver, mut c, _) = Driver::start(bin, &dir, &pool).await?;
    let began = Instant::now();
    fill(&c, &dir, count, FILL_BYTES, &params()).await?;
    let filled = began.elapsed();
    eprintln!(
        "{count} volumes on {devices} devices in {:.1} s",
        filled.as_secs_f64()
    );
    let mut f = Figures::default();
    // Start-up to Probe ready with every volume recorded.
    driver.stop();
    let mut driver = None;
    for _ in 0..3 {
        drop(driver.take());
        let (d, clients, took) = Driver::start(bin, &dir, &pool).await?;
        f.add("start-up to Probe ready", took);
        c = clients;
        driver = Some(d);
    }
    let driver = driver.ok_or("no driver")?;
    for r in 0..rounds {
        round(&mut c, &mut f, &dir, r, ROUND_BYTES, &params()).await?;
    }
    f.value("driver RSS (MiB)", rss_kib(driver.pid()) as f64 / 1024.0);
    add_state(&mut f, &dir.join("state"));
    f.value("fill, all volumes (s)", filled.as_secs_f64());
    driver.stop();
    drop(pool);
    Ok(f)
}

/// Takes `--name VALUE` out of `args`.
fn flag(args: &mut Vec<String>, name: &str) -> Result<Option<usize>> {
    let Some(i) = args.iter().position(|a| a == name) else {
        return Ok(None);
    };
    if i + 1 >= args.len() {
        return Err(format!("{name} needs a value").into());
    }
    let v = args.remove(i + 1).parse()?;
    args.remove(i);
    Ok(Some(v))
}

const USAGE: &str = "usage: scale [block] DRIVER WORK_DIR [COUNTS=10,100,1000] [ROUNDS=30] \
                     [--devices 8]\n       scale storm DRIVER WORK_DIR [N=256] [--per-device 255]";

#[tokio::main]
async fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let devices = flag(&mut args, "--devices")?.unwrap_or(DEVICES);
    let per_device = flag(&mut args, "--per-device")?.unwrap_or(PER_DEVICE);
    let mode = match args.first().map(String::as_str) {
        Some(m @ ("block" | "storm")) => {
            let m = m.to_owned();
            args.remove(0);
            m
        }
        _ => "block".to_owned(),
    };
    if args.len() < 2 || devices == 0 || per_device == 0 {
        return Err(USAGE.into());
    }
    let (bin, work) = (PathBuf::from(&args[0]), PathBuf::from(&args[1]));
    if mode == "storm" {
        let n: usize = args.get(2).map_or(Ok(256), |n| n.parse())?;
        return storm::run(&bin, &work, n, per_device).await;
    }
    let counts = scale_common::parse_counts(args.get(2).map_or("10,100,1000", String::as_str))?;
    let rounds: usize = args.get(3).map_or(Ok(30), |r| r.parse())?;
    let mut all = Vec::new();
    for &n in &counts {
        all.push((n, measure(&bin, &work, n, rounds, devices).await?));
    }
    println!(
        "Block, `layout: partition`: {devices} loop devices, 2 MiB volumes, {rounds} rounds \
         on 16 MiB volumes"
    );
    println!();
    print_table(&all);
    Ok(())
}
