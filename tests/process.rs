//! The driver as a process, with the real binary: one process per state dir, restarts
//! right after a SIGKILL, special files where the state files should be, running out
//! of file descriptors, memory under a flood of unfinished requests, and thousands of
//! idle connections.
//!
//! - `a_second_driver_on_one_state_dir_refuses_to_start` (root: a loop device)
//! - `a_restart_waits_for_a_predecessor_that_is_still_exiting`
//! - `sigkill_and_restart_at_once_always_comes_back`
//! - `state_files_that_are_fifos_are_refused_at_start`
//! - `running_out_of_file_descriptors_does_not_stop_the_server`
//! - `memory_stays_bounded_under_a_flood_of_unfinished_requests`
//! - `thousands_of_idle_connections_never_lock_a_new_client_out` (root: a loop device)
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_gds-csi");

/// A driver process on its own directory: `<dir>/csi.sock`, `<dir>/state`, logs in
/// `<dir>/driverN.log`.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }
    /// Waits for the process to exit on its own.
    fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
    /// Waits until the log shows `text` (true), or the process has exited (false).
    fn wait_log(&mut self, text: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.log().contains(text) {
                return true;
            }
            if self.exited().is_some() {
                return self.log().contains(text);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
    /// Sends `sig` to the child while it is still ours: one already reaped may have had its
    /// pid handed to another process, which must never get the signal. False when not sent.
    fn signal(&mut self, sig: Signal) -> bool {
        if self.exited().is_some() {
            return false;
        }
        // Not reaped: even if it exited just now its pid stays a zombie's, not reusable.
        kill(Pid::from_raw(self.pid() as i32), sig).is_ok()
    }
    fn terminate(&mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        self.wait_exit(Duration::from_secs(20))
            .expect("exits on SIGTERM")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Dir {
    dir: tempfile::TempDir,
    starts: usize,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            dir: tempfile::Builder::new()
                .prefix("gds-proc-")
                .tempdir_in("/tmp")
                .unwrap(),
            starts: 0,
        }
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn socket(&self) -> PathBuf {
        self.path("csi.sock")
    }
    /// Starts the binary (behind `prefix`, e.g. `prlimit`), returning at once.
    fn spawn(&mut self, prefix: &[&str], args: &[&str]) -> Proc {
        self.starts += 1;
        let log = self.path(&format!("driver{}.log", self.starts));
        let mut cmd = match prefix.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg("--").arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        common::serve_in(&mut cmd, self.dir.path())
            .args(args)
            .env("RUST_LOG", "info");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc { child, log }
    }
}

/// Waits until Probe on `socket` answers ready.
async fn ready(socket: &Path, proc: &mut Proc, within: Duration) -> Clients {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = proc.exited() {
            panic!(
                "driver exited ({status}) before it was ready:\n{}",
                proc.log()
            );
        }
        if let Some(c) = common::ready_clients(socket).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("driver not ready within {within:?}:\n{}", proc.log());
}

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_driver_on_one_state_dir_refuses_to_start() {
    let Some(mut rig) = common::Rig::new(1) else {
        return;
    };
    let mut a = rig.start().await;
    let id = a
        .controller
        .create_volume(CreateVolumeRequest {
            name: "a1".into(),
            volume_capabilities: vec![cap()],
            parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let state_of_a = || {
        let records = common::state_records(&rig.path("state"));
        (fs::read(rig.path("state/volumes.json")).unwrap(), records)
    };
    let before = state_of_a();
    assert_eq!(before.1["volumes"].as_object().unwrap().len(), 1);
    let a_pid = rig.child.as_ref().unwrap().id();

    // B: the same state dir and pool, its own socket (a second release, an operator).
    let log = rig.path("b.log");
    let mut b = Proc {
        child: Command::new(BIN)
            .args(["serve", "--mode", "all", "--node-id", "node-a"])
            .arg(format!(
                "--endpoint=unix://{}",
                rig.path("b.sock").display()
            ))
            .arg("--state-dir")
            .arg(rig.path("state"))
            .arg("--allowed-path-root")
            .arg(rig.dir.path())
            .arg("--pool-device")
            .arg(&rig.loops[0])
            .arg("--state-lock-wait=300ms")
            .env_remove(gds_csi::runtime::faults::ENV)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log,
    };
    let status = b.wait_exit(Duration::from_secs(15));
    let text = b.log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "B must refuse to start ({status:?}):\n{text}"
    );
    let state_dir = rig.path("state").display().to_string();
    assert!(
        text.contains(&state_dir),
        "the error names the state dir:\n{text}"
    );
    assert!(
        text.contains(&format!("pid {a_pid}")),
        "the error names the holder's pid {a_pid}:\n{text}"
    );
    assert_eq!(state_of_a(), before, "A's state untouched");
    let listed = a
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .any(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id)),
        "A still serves its volume"
    );
}

/// A predecessor that is still exiting: its state-dir lock is held, then released
/// while its socket still answers for a moment (the order in which a SIGKILLed process's
/// files are closed). The new driver waits for both instead of refusing to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_waits_for_a_predecessor_that_is_still_exiting() {
    let mut d = Dir::new();
    fs::create_dir_all(d.path("state")).unwrap();
    let lock_file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(d.path("state").join("gds-csi.lock"))
        .unwrap();
    let held = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).unwrap();
    let listener = UnixListener::bind(d.socket()).unwrap();

    let mut p = d.spawn(&[], &["--state-lock-wait=20s"]);
    assert!(
        p.wait_log("waiting for it to exit", Duration::from_secs(15)),
        "the driver waits for the state dir's lock ({:?}):\n{}",
        p.exited(),
        p.log()
    );
    drop(held);
    assert!(
        p.wait_log("socket still answers", Duration::from_secs(15)),
        "then for the old socket to go quiet ({:?}):\n{}",
        p.exited(),
        p.log()
    );
    drop(listener);
    ready(&d.socket(), &mut p, Duration::from_secs(15)).await;
    assert!(p.terminate().success());
}

/// The driver's sockets and its state-dir lock are close-on-exec: no child (mkfs,
/// mount, the cuFile probe) can keep them alive after the driver dies. (Descriptors
/// inherited from whoever started the test are not the driver's and are skipped.)
fn assert_cloexec(pid: u32) {
    let mut checked = 0;
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap() {
        let entry = entry.unwrap();
        let fd: i32 = entry.file_name().to_str().unwrap().parse().unwrap();
        if fd <= 2 {
            continue;
        }
        let Ok(info) = fs::read_to_string(entry.path()) else {
            continue; // closed meanwhile
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        let target = fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap_or_default();
        let text = target.display().to_string();
        if !text.starts_with("socket:") && !text.ends_with("gds-csi.lock") {
            continue;
        }
        checked += 1;
        assert!(
            flags & libc::O_CLOEXEC as u32 != 0,
            "fd {fd} ({}) lacks O_CLOEXEC",
            target.display()
        );
    }
    assert!(checked >= 2, "the socket and the lock were found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_at_once_always_comes_back() {
    let mut d = Dir::new();
    let mut p = d.spawn(&[], &[]);
    ready(&d.socket(), &mut p, Duration::from_secs(30)).await;
    assert_cloexec(p.pid());
    for round in 0..20 {
        // SIGKILL and start the next one at once, reaping the old one only afterwards.
        assert!(
            p.signal(Signal::SIGKILL),
            "round {round}: the driver exited before its SIGKILL"
        );
        let mut next = d.spawn(&[], &[]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = next.exited() {
                panic!("round {round}: restart failed ({status}):\n{}", next.log());
            }
            if let Ok(mut c) = Clients::connect(&d.socket()).await {
                if let Ok(r) = c.identity.probe(ProbeRequest {}).await {
                    if r.into_inner().ready == Some(true) {
                        break;
                    }
                }
            }
            assert!(Instant::now() < deadline, "round {round}: not ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(std::mem::replace(&mut p, next));
    }
}

#[test]
fn state_files_that_are_fifos_are_refused_at_start() {
    for name in ["volumes.json", "nfs-volumes.json"] {
        let mut d = Dir::new();
        fs::create_dir_all(d.path("state")).unwrap();
        let fifo = d.path("state").join(name);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let mut p = d.spawn(&[], &[]);
        let status = p.wait_exit(Duration::from_secs(15));
        let log = p.log();
        assert!(
            status.is_some_and(|s| !s.success()),
            "{name} as a FIFO: start-up must fail, not hang ({status:?}):\n{log}"
        );
        assert!(
            log.contains(&fifo.display().to_string()) && log.contains("FIFO"),
            "{name}: the error names the file and what it is:\n{log}"
        );
    }
}

/// `Max open files` from /proc/<pid>/limits: (soft, hard).
fn nofile(pid: u32) -> (u64, u64) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (v[0], v[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_file_descriptors_does_not_stop_the_server() {
    // The soft limit is raised to the hard one at start.
    let mut d = Dir::new();
    let mut p = d.spawn(&["prlimit", "--nofile=64:4096"], &[]);
    ready(&d.socket(), &mut p, Duration::from_secs(30)).await;
    assert_eq!(nofile(p.pid()), (4096, 4096), "soft limit raised");
    assert!(p.terminate().success(), "SIGTERM exits 0");
    drop(p);

    // Where it cannot be raised, running out of descriptors is survived.
    let mut d = Dir::new();
    let mut p = d.spawn(&["prlimit", "--nofile=48:48"], &[]);
    ready(&d.socket(), &mut p, Duration::from_secs(30)).await;
    // The driver runs out of descriptors accepting; the listen backlog (at least 128)
    // holds the rest, so no connect blocks.
    let flood: Vec<UnixStream> = (0..100)
        .map(|_| UnixStream::connect(d.socket()).unwrap())
        .collect();
    let hit = p.wait_log("cannot accept connections", Duration::from_secs(15));
    assert!(
        p.exited().is_none(),
        "the driver must keep serving, exited {:?}:\n{}",
        p.exited(),
        p.log()
    );
    assert!(hit, "EMFILE is logged:\n{}", p.log());
    drop(flood);
    ready(&d.socket(), &mut p, Duration::from_secs(15)).await;
    assert!(
        p.log().contains("accepting connections again"),
        "{}",
        p.log()
    );
    assert!(p.terminate().success());
}

fn rss_bytes(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// Opens up to `streams` NodeStageVolume calls on one new connection, each declaring a
/// `declared`-byte message and sending all of it but the last KiB, never ending it.
/// Keeps them open until the returned handles are dropped.
async fn unfinished_calls(
    socket: &Path,
    streams: usize,
    declared: usize,
    payload: &Bytes,
) -> Vec<Box<dyn std::any::Any + Send>> {
    let io = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (mut client, conn) = h2::client::handshake(io).await.unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut held: Vec<Box<dyn std::any::Any + Send>> = vec![Box::new(AbortOnDrop(conn))];
    let mut header = vec![0u8];
    header.extend_from_slice(&(declared as u32).to_be_bytes());
    for _ in 0..streams {
        // The server caps streams per connection: stop when no slot frees up.
        match tokio::time::timeout(Duration::from_millis(500), client.clone().ready()).await {
            Ok(Ok(c)) => client = c,
            _ => break,
        }
        let req = http::Request::post("http://localhost/csi.v1.Node/NodeStageVolume")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let Ok((response, mut body)) = client.send_request(req, false) else {
            break;
        };
        let _ = body.send_data(Bytes::from(header.clone()), false);
        let _ = body.send_data(payload.slice(..declared - 1024), false);
        held.push(Box::new((response, body)));
    }
    held
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Peak RSS while it still grows; done once it has not grown for 1.5 s.
async fn peak_rss(pid: u32, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    let mut peak = rss_bytes(pid);
    let mut since = Instant::now();
    while Instant::now() < deadline && since.elapsed() < Duration::from_millis(1500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss_bytes(pid);
        if now > peak + (1 << 20) {
            since = Instant::now();
        }
        peak = peak.max(now);
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_a_flood_of_unfinished_requests() {
    let mut d = Dir::new();
    let mut p = d.spawn(&[], &[]);
    ready(&d.socket(), &mut p, Duration::from_secs(30)).await;
    let base = rss_bytes(p.pid());
    // One buffer, shared by every stream (Bytes slices), so the client stays small.
    let payload = Bytes::from(vec![0x0au8; 4 << 20]);

    // The reported attack: one connection, 160 unfinished 4 MB requests.
    let big = unfinished_calls(&d.socket(), 160, 4_000_000, &payload).await;
    let peak_big = peak_rss(p.pid(), Duration::from_secs(30)).await;
    // Requests just under the size limit, on several connections.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(unfinished_calls(&d.socket(), 160, (1 << 20) - 64, &payload).await);
    }
    let peak_small = peak_rss(p.pid(), Duration::from_secs(30)).await;
    // Probe still answers meanwhile, on a connection of its own.
    let mut c = Clients::connect(&d.socket()).await.unwrap();
    let probe = tokio::time::timeout(Duration::from_secs(5), c.identity.probe(ProbeRequest {}))
        .await
        .expect("Probe answers during the flood")
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    let mib = |b: u64| b >> 20;
    eprintln!(
        "RSS: baseline {} MiB, 160 x 4 MB on one connection {} MiB, 4 x 160 x 1 MiB {} MiB",
        mib(base),
        mib(peak_big),
        mib(peak_small)
    );
    assert!(
        peak_big < base + (64 << 20),
        "4 MB requests are refused before they are buffered: {} -> {} MiB",
        mib(base),
        mib(peak_big)
    );
    assert!(
        peak_small < base + (200 << 20),
        "under the size limit, buffering is bounded: {} -> {} MiB",
        mib(base),
        mib(peak_small)
    );
    drop(big);
    drop(held);
    assert!(p.exited().is_none(), "{}", p.log());
    assert!(p.terminate().success());
}

/// Descriptors the process holds open.
fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Opens `n` connections that never send a byte, kept until dropped. A connect the full
/// listen backlog refuses (EAGAIN) is tried again, as a client would.
async fn idle_connections(socket: &Path, n: usize) -> Vec<tokio::net::UnixStream> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        match tokio::net::UnixStream::connect(socket).await {
            Ok(s) => held.push(s),
            Err(e) if Instant::now() < deadline => {
                assert!(
                    e.kind() == std::io::ErrorKind::WouldBlock,
                    "connect {}: {e}",
                    held.len()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("only {} of {n} connections within 60 s: {e}", held.len()),
        }
    }
    held
}

/// Probe, CreateVolume, NodeStage and NodePublish from a new client, each within 10 s;
/// returns when Probe answered, from `began`.
async fn new_client_is_served(d: &Dir, name: &str, began: Instant) -> Duration {
    let within = Duration::from_secs(10);
    let mut c = tokio::time::timeout(within, async {
        loop {
            if let Some(c) = common::ready_clients(&d.socket()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a new client's Probe answers within 10 s");
    let first = began.elapsed();
    let req = common::requests::create_without_gds(name, cap());
    let id = tokio::time::timeout(within, c.controller.create_volume(req))
        .await
        .expect("CreateVolume within 10 s")
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let (staging, target) = (
        d.path(&format!("staging/{name}")),
        d.path(&format!("pods/{name}")),
    );
    fs::create_dir_all(&staging).unwrap();
    tokio::time::timeout(within, async {
        common::requests::stage(&mut c, &id, &staging, cap()).await?;
        common::requests::publish(&mut c, &id, &staging, &target, cap()).await
    })
    .await
    .expect("NodeStage and NodePublish within 10 s")
    .unwrap();
    common::requests::unpublish(&mut c, &id, &target)
        .await
        .unwrap();
    common::requests::unstage(&mut c, &id, &staging)
        .await
        .unwrap();
    c.controller
        .delete_volume(common::requests::delete_request(&id))
        .await
        .unwrap();
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_never_lock_a_new_client_out() {
    if !common::is_root() {
        return;
    }
    // This process holds the idle connections' other ends.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let img = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    img.as_file().set_len(common::SIZE).unwrap();
    let dev = common::LoopDevice::attach(img.path());
    for (held, prefix) in [
        (5000, &[][..]),
        (1100, &["prlimit", "--nofile=1024:1024"][..]),
    ] {
        let mut d = Dir::new();
        let mut p = d.spawn(prefix, &["--pool-device", &dev.arg()]);
        ready(&d.socket(), &mut p, Duration::from_secs(30)).await;
        let pid = p.pid();
        let base = (rss_bytes(pid), open_fds(pid));
        let idle = idle_connections(&d.socket(), held).await;
        let during = (rss_bytes(pid), open_fds(pid));
        let began = Instant::now();
        let first = new_client_is_served(&d, &format!("v{held}"), began).await;
        let all = began.elapsed();
        drop(idle);
        // Back to the baseline once the idle clients are gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_fds(pid) > base.1 + 8 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let after = (rss_bytes(pid), open_fds(pid));
        let mib = |b: u64| b >> 20;
        eprintln!(
            "{held} idle connections{}: first answer {first:?}, Probe to NodePublish {all:?}; \
             RSS {} / {} / {} MiB, fds {} / {} / {} (before / during / after)",
            if prefix.is_empty() {
                ""
            } else {
                " at a 1024 fd limit"
            },
            mib(base.0),
            mib(during.0),
            mib(after.0),
            base.1,
            during.1,
            after.1
        );
        assert!(
            during.1 <= base.1 + gds_csi::service::server::MAX_CONNECTIONS + 8,
            "open connections are bounded: {} fds",
            during.1
        );
        assert!(
            after.1 <= base.1 + 8,
            "fds back to the baseline: {after:?} vs {base:?}"
        );
        assert!(
            after.0 < base.0 + (32 << 20),
            "RSS back near the baseline: {} -> {} MiB",
            mib(base.0),
            mib(after.0)
        );
        assert!(p.exited().is_none(), "{}", p.log());
        assert!(p.terminate().success());
    }
}

/// A driver that exited and was reaped is never signalled: its pid may belong to another
/// process by then, which the test's cleanup must not reach.
#[test]
fn a_reaped_driver_is_not_signalled() {
    let mut d = Dir::new();
    let mut p = d.spawn(&[], &["--socket-mode", "not-octal"]);
    let status = p
        .wait_exit(Duration::from_secs(20))
        .expect("a bad flag ends the driver");
    assert!(!status.success(), "{status:?}");
    assert!(!p.signal(Signal::SIGTERM), "a reaped child was signalled");
    assert_eq!(
        p.terminate(),
        status,
        "terminate answers the status it reaped"
    );
}
