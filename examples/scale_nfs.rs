//! The scale benchmark of the NFS backend, in process: the real driver services on a unix
//! socket over the `Host` double of the in-process tests (an export is a local directory,
//! an NFS mount a recorded one), so it needs neither root nor an NFS server. For each
//! count, the driver filled with that many volumes, then ROUNDS of CreateVolume,
//! NodeStage, NodePublish, DeleteVolume, every page of ListVolumes (100 a page) and
//! GetCapacity; the process's RSS growth, the state's size, and three re-opens of the
//! driver on that state to Probe ready. Each count runs in a child process of its own, so
//! its RSS starts clean. Prints the table of examples/scale.rs.
//!
//! It benches the driver code it is built with (there is no binary to point it at).
//!
//! Usage (`scripts/bench.sh scale-nfs` builds and runs it):
//!   scale_nfs WORK_DIR [COUNTS=10,100,1000,10000] [ROUNDS=30]
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

#[allow(dead_code)]
#[path = "../tests/common/host_double.rs"]
mod host_double;
mod scale_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gds_csi::csi::Clients;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::runtime::config::Mode;
use gds_csi::service::{server, Driver};
use gds_csi::volume::nfs::NfsStore;
use host_double::HostDouble;
use scale_common::{add_state, fill, print_table, round, rss_kib, Figures, Result, MIB};

const FILL_BYTES: u64 = MIB;
const ROUND_BYTES: u64 = 16 * MIB;
/// The NFS mount deadline of `serve` (`--mount-timeout`'s default).
const OP_TIMEOUT: Duration = Duration::from_secs(30);

fn params() -> HashMap<String, String> {
    [("server", "192.0.2.1"), ("share", "/export")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A driver instance served in this process, as `serve --mode all` builds it.
struct Instance {
    c: Clients,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>,
    socket: PathBuf,
}

impl Instance {
    /// Opens the driver's state in `dir` and serves it; how long until Probe answered ready.
    async fn open(dir: &Path, host: &Arc<HostDouble>) -> Result<(Instance, Duration)> {
        let began = Instant::now();
        let state = dir.join("state");
        let pool = Pool::open(PoolConfig {
            node_id: "scale-node".into(),
            host_sys: dir.join("sys"),
            host_dev: dir.join("dev"),
            listed: vec![],
            nvme_discover: false,
            state_dir: state.clone(),
        })?;
        let driver = Driver::new(
            "gds.csi.scale".into(),
            "scale-node".into(),
            vec![dir.join("kubelet")],
            pool,
            host.clone(),
        )
        .with_nfs(NfsStore::open(&state, OP_TIMEOUT)?)
        .with_snapshots(gds_csi::snapshot::Snapshots::open(&state)?);
        let driver = Arc::new(driver);
        driver.initialise().await?;
        let socket = dir.join("csi.sock");
        let listener = gds_csi::os::socket::bind(&socket, 0o600)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(server::serve(listener, driver, Mode::All, async {
            let _ = stopped.await;
        }));
        let c = Clients::connect_ready(&socket, Duration::from_secs(30)).await?;
        let took = began.elapsed();
        Ok((
            Instance {
                c,
                stop,
                server,
                socket,
            },
            took,
        ))
    }

    /// Stops serving; the driver goes with its last connection.
    async fn close(self) -> Result<()> {
        drop(self.c);
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.server).await???;
        let _ = std::fs::remove_file(&self.socket);
        Ok(())
    }
}

/// What the double recorded (every call, every NFS mount): the harness's memory, not the
/// driver's.
fn forget_calls(host: &HostDouble) {
    let mut s = host.state.lock().unwrap();
    s.calls = Vec::new();
    s.nfs_calls = Vec::new();
}

/// One count, in this process (a child of the one that prints the table).
async fn measure(dir: &Path, count: usize, rounds: usize) -> Result<Figures> {
    std::fs::create_dir_all(dir.join("kubelet"))?;
    let host = Arc::new(HostDouble::tracking(HashMap::new()));
    let rss0 = rss_kib(std::process::id());
    let (mut inst, _) = Instance::open(dir, &host).await?;
    let kubelet = dir.join("kubelet");
    let began = Instant::now();
    fill(&inst.c, &kubelet, count, FILL_BYTES, &params()).await?;
    let filled = began.elapsed();
    eprintln!("{count} NFS volumes in {:.1} s", filled.as_secs_f64());
    forget_calls(&host);
    let mut f = Figures::default();
    for r in 0..rounds {
        round(&mut inst.c, &mut f, &kubelet, r, ROUND_BYTES, &params()).await?;
        forget_calls(&host);
    }
    let rss = rss_kib(std::process::id());
    inst.close().await?;
    // Re-opens with every volume recorded: the registry read, the services up, Probe.
    for _ in 0..3 {
        let (inst, took) = Instance::open(dir, &host).await?;
        f.add("start-up (re-open) to Probe ready", took);
        inst.close().await?;
    }
    f.value(
        "process RSS growth (MiB)",
        rss.saturating_sub(rss0) as f64 / 1024.0,
    );
    add_state(&mut f, &dir.join("state"));
    f.value("fill, all volumes (s)", filled.as_secs_f64());
    Ok(f)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--one") {
        let (count, rounds) = (args[2].parse()?, args[3].parse()?);
        let f = measure(Path::new(&args[4]), count, rounds).await?;
        println!("{}", serde_json::to_string(&f)?);
        return Ok(());
    }
    let Some(work) = args.get(1).map(PathBuf::from) else {
        return Err("usage: scale_nfs WORK_DIR [COUNTS=10,100,1000,10000] [ROUNDS=30]".into());
    };
    let counts =
        scale_common::parse_counts(args.get(2).map_or("10,100,1000,10000", String::as_str))?;
    let rounds: usize = args.get(3).map_or(Ok(30), |r| r.parse())?;
    let mut all = Vec::new();
    for &n in &counts {
        let dir = work.join(format!("nfs{n}"));
        let out = Command::new(std::env::current_exe()?)
            .args(["--one", &n.to_string(), &rounds.to_string()])
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            return Err(format!("the run of {n} volumes failed ({})", out.status).into());
        }
        let text = String::from_utf8(out.stdout)?;
        let last = text.lines().last().ok_or("the run printed no figures")?;
        all.push((n, serde_json::from_str::<Figures>(last)?));
        std::fs::remove_dir_all(&dir)?;
    }
    println!(
        "NFS, in process over the Host double: 1 MiB volumes, {rounds} rounds on 16 MiB volumes"
    );
    println!();
    print_table(&all);
    Ok(())
}
