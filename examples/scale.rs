//! The scale benchmark: how each call's cost grows with the number of volumes a node holds.
//! For each count it makes a pool of loop devices, starts the driver (`DRIVER`), fills it
//! with that many `layout: partition` volumes of 1 MiB, then measures (on 16 MiB volumes)
//! CreateVolume,
//! NodeStage, NodePublish, DeleteVolume, ListVolumes (100 a page), GetCapacity and the
//! driver's start-up to Probe ready, its RSS and the state file's size. Prints a markdown
//! table of medians (p99 beside) and the ratio of the largest count to the smallest.
//!
//! Usage (root; `scripts/bench.sh scale` builds and runs it):
//!   scale DRIVER WORK_DIR [COUNTS=10,100,1000] [ROUNDS=30]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MIB: u64 = 1 << 20;
/// Partitions a device holds: its label has 128 entries; 120 leaves room for the rounds.
const PER_DEVICE: usize = 120;
/// The measured volumes: large enough for an ext4 with a journal (`data=ordered`).
const ROUND_BYTES: u64 = 16 * MIB;
/// Each device: 128 partitions of 1 MiB, a measured volume, the label and some slack.
const DEVICE_BYTES: u64 = 160 * MIB;

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

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
    fn new(dir: &Path, n: usize) -> Result<Pool> {
        let mut pool = Pool(Vec::new());
        for i in 0..n {
            let img = dir.join(format!("dev{i}.img"));
            std::fs::File::create(&img)?.set_len(DEVICE_BYTES)?;
            let dev = run("losetup", &["-f", "--show", img.to_str().unwrap()])?;
            pool.0.push(PathBuf::from(dev));
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for dev in &self.0 {
            for p in gds_csi::gpt::kernel::list(dev).unwrap_or_default() {
                let _ = gds_csi::gpt::kernel::delete(dev, p.number);
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
        let _ = run("kill", &["-TERM", &self.child.id().to_string()]);
        let _ = self.child.wait();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn create_req(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![cap()],
        parameters: params(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

async fn create(c: &mut Clients, name: &str, bytes: u64) -> Result<String> {
    let v = c.controller.create_volume(create_req(name, bytes)).await?;
    Ok(v.into_inner().volume.ok_or("no volume")?.volume_id)
}

/// `count` volumes, 8 calls at a time.
async fn fill(c: &Clients, count: usize) -> Result<()> {
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while i < count {
                create(&mut c, &format!("fill-{i}"), MIB).await?;
                i += 8;
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Samples of each measured figure, in the order they are printed.
#[derive(Default)]
struct Figures {
    samples: Vec<(&'static str, Vec<Duration>)>,
    rss_kib: u64,
    state_bytes: u64,
}

impl Figures {
    fn add(&mut self, what: &'static str, d: Duration) {
        match self.samples.iter_mut().find(|(w, _)| *w == what) {
            Some((_, v)) => v.push(d),
            None => self.samples.push((what, vec![d])),
        }
    }

    fn pct(&self, what: &str, p: f64) -> f64 {
        let Some((_, v)) = self.samples.iter().find(|(w, _)| *w == what) else {
            return f64::NAN;
        };
        let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        let i = ((v.len() - 1) as f64 * p).round() as usize;
        v[i]
    }
}

async fn timed<T>(
    f: &mut Figures,
    what: &'static str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let began = Instant::now();
    let out = call.await?;
    f.add(what, began.elapsed());
    Ok(out)
}

async fn measure(bin: &Path, work: &Path, count: usize, rounds: usize) -> Result<Figures> {
    let dir = work.join(format!("n{count}"));
    std::fs::create_dir_all(&dir)?;
    let devices = (count + rounds + 8).div_ceil(PER_DEVICE);
    let pool = Pool::new(&dir, devices)?;
    let (driver, mut c, _) = Driver::start(bin, &dir, &pool).await?;
    let began = Instant::now();
    fill(&c, count).await?;
    eprintln!(
        "{count} volumes on {devices} devices in {:.1} s",
        began.elapsed().as_secs_f64()
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
        let id = timed(
            &mut f,
            "CreateVolume",
            create(&mut c, &format!("round-{r}"), ROUND_BYTES),
        )
        .await?;
        let staging = dir.join(format!("staging/{r}"));
        let target = dir.join(format!("pods/{r}"));
        std::fs::create_dir_all(&staging)?;
        let stage = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
            volume_capability: Some(cap()),
            ..Default::default()
        };
        let mut n = c.node.clone();
        timed(&mut f, "NodeStageVolume", async {
            Ok(n.node_stage_volume(stage).await?)
        })
        .await?;
        let publish = NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
            target_path: target.to_str().unwrap().into(),
            volume_capability: Some(cap()),
            ..Default::default()
        };
        timed(&mut f, "NodePublishVolume", async {
            Ok(n.node_publish_volume(publish).await?)
        })
        .await?;
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_str().unwrap().into(),
        })
        .await?;
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await?;
        let mut ctl = c.controller.clone();
        timed(&mut f, "DeleteVolume", async {
            Ok(ctl
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id,
                    ..Default::default()
                })
                .await?)
        })
        .await?;
        let mut token = String::new();
        loop {
            let req = ListVolumesRequest {
                max_entries: 100,
                starting_token: token.clone(),
            };
            let page = timed(&mut f, "ListVolumes (a page of 100)", async {
                Ok(ctl.list_volumes(req).await?.into_inner())
            })
            .await?;
            token = page.next_token;
            if token.is_empty() {
                break;
            }
        }
        let req = GetCapacityRequest {
            parameters: params(),
            ..Default::default()
        };
        timed(&mut f, "GetCapacity", async {
            Ok(ctl.get_capacity(req).await?)
        })
        .await?;
    }
    f.rss_kib = rss_kib(driver.pid());
    f.state_bytes = std::fs::metadata(dir.join("state/volumes.json"))
        .map(|m| m.len())
        .unwrap_or(0);
    driver.stop();
    drop(pool);
    Ok(f)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: scale DRIVER WORK_DIR [COUNTS=10,100,1000] [ROUNDS=30]".into());
    }
    let (bin, work) = (PathBuf::from(&args[1]), PathBuf::from(&args[2]));
    let counts: Vec<usize> = args
        .get(3)
        .map_or("10,100,1000", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let rounds: usize = args.get(4).map_or(Ok(30), |r| r.parse())?;
    let mut all = Vec::new();
    for &n in &counts {
        all.push((n, measure(&bin, &work, n, rounds).await?));
    }
    let (first, last) = (&all[0].1, &all[all.len() - 1].1);
    print!("| figure |");
    for (n, _) in &all {
        print!(" {n} volumes: p50 (p99) ms |");
    }
    println!(" p50 ratio {} / {} |", counts[counts.len() - 1], counts[0]);
    println!("|---|{}---|", "---|".repeat(all.len()));
    for (what, _) in &first.samples {
        print!("| {what} |");
        for (_, f) in &all {
            print!(" {:.2} ({:.2}) |", f.pct(what, 0.5), f.pct(what, 0.99));
        }
        println!(" {:.2} |", last.pct(what, 0.5) / first.pct(what, 0.5));
    }
    print!("| driver RSS (MiB) |");
    for (_, f) in &all {
        print!(" {:.1} |", f.rss_kib as f64 / 1024.0);
    }
    println!(
        " {:.2} |",
        last.rss_kib as f64 / first.rss_kib.max(1) as f64
    );
    print!("| state file (KiB) |");
    for (_, f) in &all {
        print!(" {:.1} |", f.state_bytes as f64 / 1024.0);
    }
    println!(
        " {:.2} |",
        last.state_bytes as f64 / first.state_bytes.max(1) as f64
    );
    Ok(())
}
