//! The storm: N concurrent CreateVolume + NodeStage + NodePublish on distinct 16 MiB
//! partition volumes, the creates on one connection (the external-provisioner's) and the
//! node calls on another (the kubelet's), against the same calls one at a time in the
//! same run. The driver's open fds and threads are read before, sampled during, and
//! polled after the storm's volumes are torn down, until they are back or SETTLE passed.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gds_csi::csi::Clients;

use super::scale_common::{
    create, delete, ms_of, open_fds, pct, publish, rss_kib, stage, threads, unpublish, unstage,
    Result, Vol, MIB,
};
use super::{params, Driver, Pool};

const VOLUME_BYTES: u64 = 16 * MIB;
/// Beside a device's volumes: the label and alignment (2 MiB), less than one more volume.
const SLACK_BYTES: u64 = 14 * MIB;
/// How long the fds and threads may take to come back after the teardown.
const SETTLE: Duration = Duration::from_secs(10);
const CALLS: [&str; 3] = ["CreateVolume", "NodeStageVolume", "NodePublishVolume"];

#[derive(Clone, Copy, Default)]
struct Counts {
    fds: u64,
    threads: u64,
    rss_kib: u64,
}

impl Counts {
    fn read(pid: u32) -> Counts {
        Counts {
            fds: open_fds(pid),
            threads: threads(pid),
            rss_kib: rss_kib(pid),
        }
    }

    fn within(&self, base: &Counts) -> bool {
        self.fds <= base.fds && self.threads <= base.threads
    }
}

/// Polls until the fds and threads are back to `base` or SETTLE passed: what it read
/// last, and when.
async fn settle(pid: u32, base: &Counts) -> (Counts, Duration) {
    let began = Instant::now();
    loop {
        let now = Counts::read(pid);
        if now.within(base) || began.elapsed() >= SETTLE {
            return (now, began.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The highest fds, threads and RSS seen, sampled on a thread of its own (the client's
/// runtime is busy with the storm) until stopped.
struct Peak {
    stop: Arc<AtomicBool>,
    seen: Arc<[AtomicU64; 3]>,
    thread: std::thread::JoinHandle<()>,
}

impl Peak {
    fn start(pid: u32) -> Peak {
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
        let thread = {
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let c = Counts::read(pid);
                    seen[0].fetch_max(c.fds, Ordering::Relaxed);
                    seen[1].fetch_max(c.threads, Ordering::Relaxed);
                    seen[2].fetch_max(c.rss_kib, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Peak { stop, seen, thread }
    }

    fn stop(self) -> Counts {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let get = |i: usize| self.seen[i].load(Ordering::Relaxed);
        Counts {
            fds: get(0),
            threads: get(1),
            rss_kib: get(2),
        }
    }
}

/// One volume's create, stage and publish: each call's time, the volume if it was
/// created, and the first failure.
#[derive(Default)]
struct Outcome {
    took: [Option<Duration>; 3],
    vol: Option<Vol>,
    failed: Option<String>,
}

async fn bring_up(ctl: &mut Clients, node: &mut Clients, dir: &Path, name: &str) -> Outcome {
    let mut out = Outcome::default();
    let began = Instant::now();
    let v = match create(ctl, dir, name, VOLUME_BYTES, &params()).await {
        Ok(v) => v,
        Err(e) => {
            out.failed = Some(format!("{}: {e}", CALLS[0]));
            return out;
        }
    };
    out.took[0] = Some(began.elapsed());
    out.vol = Some(v.clone());
    let began = Instant::now();
    if let Err(e) = stage(node, &v).await {
        out.failed = Some(format!("{}: {e}", CALLS[1]));
        return out;
    }
    out.took[1] = Some(began.elapsed());
    let began = Instant::now();
    if let Err(e) = publish(node, &v).await {
        out.failed = Some(format!("{}: {e}", CALLS[2]));
        return out;
    }
    out.took[2] = Some(began.elapsed());
    out
}

async fn tear_down(ctl: &mut Clients, node: &mut Clients, v: &Vol) -> Result<()> {
    unpublish(node, v).await?;
    unstage(node, v).await?;
    delete(ctl, &v.id).await
}

/// Per call: its samples; over all: each volume's create-to-published, the failures.
#[derive(Default)]
struct Phase {
    calls: [Vec<Duration>; 3],
    volume: Vec<Duration>,
    failed: Vec<String>,
    vols: Vec<Vol>,
}

impl Phase {
    fn add(&mut self, o: Outcome) {
        for (i, t) in o.took.iter().enumerate() {
            if let Some(t) = t {
                self.calls[i].push(*t);
            }
        }
        if o.took.iter().all(Option::is_some) {
            self.volume.push(o.took.iter().flatten().sum());
        }
        self.failed.extend(o.failed);
        self.vols.extend(o.vol);
    }

    fn sum(&self) -> Duration {
        self.calls.iter().flatten().sum()
    }
}

fn p50_p99(d: &[Duration]) -> String {
    let ms = ms_of(d);
    format!("{:.1} ({:.1})", pct(&ms, 0.5), pct(&ms, 0.99))
}

fn ratio(a: &[Duration], b: &[Duration]) -> f64 {
    pct(&ms_of(a), 0.5) / pct(&ms_of(b), 0.5)
}

pub async fn run(bin: &Path, work: &Path, n: usize, per_device: usize) -> Result<()> {
    let dir = work.join("storm");
    std::fs::create_dir_all(&dir)?;
    let devices = n.div_ceil(per_device);
    let pool = Pool::new(
        &dir,
        devices,
        per_device as u64 * VOLUME_BYTES + SLACK_BYTES,
    )?;
    let (driver, mut ctl, _) = Driver::start(bin, &dir, &pool).await?;
    let mut node = Clients::connect(&driver.socket).await?;
    let pid = driver.pid();
    let kubelet = dir.join("kubelet");
    let start = Counts::read(pid);

    eprintln!("storm: {n} volumes one at a time");
    let mut serial = Phase::default();
    for i in 0..n {
        let o = bring_up(&mut ctl, &mut node, &kubelet, &format!("serial-{i}")).await;
        serial.add(o);
    }
    let began = Instant::now();
    for v in &serial.vols {
        tear_down(&mut ctl, &mut node, v).await?;
    }
    let serial_down = began.elapsed();
    if !serial.failed.is_empty() {
        return Err(format!("one at a time: {}", serial.failed.join("; ")).into());
    }
    // The storm starts from where the driver stood before any call, as far as it returns.
    let (before, _) = settle(pid, &start).await;

    eprintln!("storm: {n} volumes at once");
    let peak = Peak::start(pid);
    let began = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (mut ctl, mut node, kubelet) = (ctl.clone(), node.clone(), kubelet.clone());
        set.spawn(
            async move { bring_up(&mut ctl, &mut node, &kubelet, &format!("storm-{i}")).await },
        );
    }
    let mut storm = Phase::default();
    while let Some(o) = set.join_next().await {
        storm.add(o?);
    }
    let wall = began.elapsed();
    let at_peak = peak.stop();
    let peak = Peak::start(pid);
    let began = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for v in storm.vols.clone() {
        let (mut ctl, mut node) = (ctl.clone(), node.clone());
        set.spawn(async move { tear_down(&mut ctl, &mut node, &v).await });
    }
    let mut down_failed = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Err(e) = r? {
            down_failed.push(e.to_string());
        }
    }
    let storm_down = began.elapsed();
    let in_teardown = peak.stop();
    let (after, waited) = settle(pid, &before).await;
    driver.stop();
    drop(pool);

    println!(
        "Storm: {n} x (CreateVolume, NodeStage, NodePublish), 16 MiB ext4 partitions, \
         {devices} loop device(s) of {per_device}; creates on one connection, node calls on \
         another"
    );
    println!();
    println!(
        "| call | one at a time: p50 (p99) ms | storm: p50 (p99) ms | p50 storm / one at a time |"
    );
    println!("|---|---|---|---|");
    for (i, what) in CALLS.iter().enumerate() {
        println!(
            "| {what} | {} | {} | {:.1} |",
            p50_p99(&serial.calls[i]),
            p50_p99(&storm.calls[i]),
            ratio(&storm.calls[i], &serial.calls[i])
        );
    }
    println!(
        "| a volume, create to published | {} | {} | {:.1} |",
        p50_p99(&serial.volume),
        p50_p99(&storm.volume),
        ratio(&storm.volume, &serial.volume)
    );
    let (sum, wall_s) = (serial.sum().as_secs_f64(), wall.as_secs_f64());
    println!(
        "| all {n}: serial sum vs storm wall, s | {sum:.2} | {wall_s:.2} | {:.2} |",
        wall_s / sum
    );
    println!(
        "| teardown of all {n} (unpublish, unstage, delete), s | {:.2} | {:.2} | {:.2} |",
        serial_down.as_secs_f64(),
        storm_down.as_secs_f64(),
        storm_down.as_secs_f64() / serial_down.as_secs_f64()
    );
    println!();
    println!(
        "| driver | at start | before the storm | peak in the storm | peak in its teardown \
         | after the teardown (+{:.2} s) | back to before |",
        waited.as_secs_f64()
    );
    println!("|---|---|---|---|---|---|---|");
    let row = |what: &str, get: &dyn Fn(&Counts) -> String, back: &str| {
        println!(
            "| {what} | {} | {} | {} | {} | {} | {back} |",
            get(&start),
            get(&before),
            get(&at_peak),
            get(&in_teardown),
            get(&after)
        );
    };
    row(
        "open fds",
        &|c| c.fds.to_string(),
        yes(after.fds <= before.fds),
    );
    row(
        "threads",
        &|c| c.threads.to_string(),
        yes(after.threads <= before.threads),
    );
    row(
        "RSS, MiB",
        &|c| format!("{:.1}", c.rss_kib as f64 / 1024.0),
        "",
    );
    println!();
    let failed: Vec<_> = storm.failed.iter().chain(&down_failed).collect();
    if failed.is_empty() {
        println!("no call failed");
    } else {
        println!("{} calls failed:", failed.len());
        for f in failed {
            println!("- {f}");
        }
    }
    Ok(())
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "no"
    }
}
