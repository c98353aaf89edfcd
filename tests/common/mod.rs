//! The real `gds-csi` binary on real loop devices, for the root tests of
//! `tests/faults.rs` and `tests/security.rs` (same shape as the Rig in `block_root.rs`):
//! start, SIGKILL, restart with other environment, count real mkfs runs (an mkfs.ext4
//! stand-in first on the driver's PATH, `tools.rs`).
//! Also the in-process server the gRPC tests over host doubles share.
#![allow(dead_code)]

pub mod frozen;
pub mod gds_fixture;
pub mod host_double;
pub mod requests;
pub mod snapshots;
pub mod tools;

use std::fs;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use gds_csi::csi::Clients;
use gds_csi::runtime::config::Mode;
use gds_csi::service::Driver;
use sha2::{Digest, Sha256};

pub const SIZE: u64 = 64 << 20;

/// Initialises `driver` and serves it in this process on `<dir>/csi.sock` (all services,
/// as `serve --mode all` does), returning connected clients.
pub async fn serve_in_process(driver: Arc<Driver>, dir: &Path) -> Clients {
    driver.initialise().await.unwrap();
    let socket = dir.join("csi.sock");
    let listener = gds_csi::os::socket::bind(&socket, 0o600).unwrap();
    tokio::spawn(gds_csi::service::server::serve(
        listener,
        driver,
        Mode::All,
        std::future::pending(),
    ));
    // Ready, as every client waits: the Probe round trip also brings the server's HTTP/2
    // SETTINGS (its stream limit), so a burst of calls right after is queued, not refused.
    Clients::connect_ready(&socket, Duration::from_secs(30))
        .await
        .unwrap()
}

/// Adds `serve --mode all` for node-a with its socket (`csi.sock`), state and allowed
/// path root in `dir`, without any fault injection from this test's environment.
pub fn serve_in<'a>(cmd: &'a mut Command, dir: &Path) -> &'a mut Command {
    serve_as(cmd, dir, "node-a")
}

/// As [`serve_in`], for node `node_id`.
pub fn serve_as<'a>(cmd: &'a mut Command, dir: &Path, node_id: &str) -> &'a mut Command {
    cmd.args(["serve", "--mode", "all", "--node-id", node_id])
        .arg("--endpoint")
        .arg(format!("unix://{}", dir.join("csi.sock").display()))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--allowed-path-root")
        .arg(dir)
        .env_remove(gds_csi::runtime::faults::ENV)
}

/// Clients connected to `socket` once Probe answers ready; `None` before that.
pub async fn ready_clients(socket: &Path) -> Option<Clients> {
    let mut c = Clients::connect(socket).await.ok()?;
    let r = c.identity.probe(gds_csi::csi::ProbeRequest {}).await.ok()?;
    (r.into_inner().ready == Some(true)).then_some(c)
}

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub loops: Vec<PathBuf>,
    /// The test-only stand-ins on every driver's PATH.
    pub tools: tools::Tools,
    pub child: Option<Child>,
    pub starts: usize,
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Set by scripts/test.sh: there a test that cannot run (no root, no block device, no C
/// compiler) is a failure, not a skip that reports ok.
pub const NO_SKIP_ENV: &str = "GDS_CSI_NO_SKIP";

/// Reports a skip, or fails the test under `GDS_CSI_NO_SKIP=1`.
pub fn skip(reason: &str) {
    if std::env::var_os(NO_SKIP_ENV).is_some_and(|v| v == "1") {
        panic!("{reason}, and {NO_SKIP_ENV}=1 turns this skip into a failure");
    }
    eprintln!("skipped: {reason}");
}

/// Whether we are root; without root the callers skip, so this reports the skip (or, under
/// `GDS_CSI_NO_SKIP=1`, fails the test) itself.
pub fn is_root() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    if !root {
        skip("needs root for loop devices and mounts");
    }
    root
}

impl Rig {
    /// `None` (and a skip notice) without root.
    pub fn new(devices: usize) -> Option<Rig> {
        Rig::with_size(devices, SIZE)
    }

    /// Like `new`, with loop devices of `size` bytes (sparse backing files).
    pub fn with_size(devices: usize, size: u64) -> Option<Rig> {
        Rig::with_sizes(&vec![size; devices])
    }

    /// One loop device per entry of `sizes`, in that order.
    pub fn with_sizes(sizes: &[u64]) -> Option<Rig> {
        if !is_root() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-root-")
            .tempdir_in("/tmp")
            .unwrap();
        let mut loops = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let img = dir.path().join(format!("dev{i}.img"));
            fs::File::create(&img).unwrap().set_len(*size).unwrap();
            loops.push(attach_loop(&img));
        }
        let tools = tools::Tools::install(dir.path());
        Some(Rig {
            dir,
            loops,
            tools,
            child: None,
            starts: 0,
        })
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn socket(&self) -> PathBuf {
        self.path("csi.sock")
    }

    pub fn log_path(&self, start: usize) -> PathBuf {
        self.path(&format!("driver{start}.log"))
    }

    pub async fn start(&mut self) -> Clients {
        self.start_with(&[], &[]).await
    }

    /// Starts the driver with extra environment and arguments; waits until Probe is ready.
    pub async fn start_with(&mut self, env: &[(&str, &str)], args: &[&str]) -> Clients {
        self.start_as("node-a", env, args).await
    }

    /// As [`Rig::start_with`], the driver of node `node_id`.
    pub async fn start_as(
        &mut self,
        node_id: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Clients {
        self.starts += 1;
        let log = fs::File::create(self.log_path(self.starts)).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gds-csi"));
        serve_as(&mut cmd, self.dir.path(), node_id)
            .args(args)
            .env("PATH", self.tools.path_env())
            .envs(env.iter().copied());
        for dev in &self.loops {
            cmd.arg("--pool-device").arg(dev);
        }
        self.child = Some(cmd.stdout(Stdio::null()).stderr(log).spawn().unwrap());
        match Clients::connect_ready(&self.socket(), Duration::from_secs(15)).await {
            Ok(c) => c,
            Err(e) => panic!(
                "{e}: {}",
                fs::read_to_string(self.log_path(self.starts)).unwrap_or_default()
            ),
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the driver to exit on its own (a fault kill point) and reaps it.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every log of every run so far, concatenated.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|i| fs::read_to_string(self.log_path(i)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// How many real mkfs.ext4 runs any run of the driver started.
    pub fn mkfs_count(&self) -> usize {
        self.tools.mkfs_runs()
    }

    /// The volume records as JSON (`{"volumes":{id: record}}`), from their files.
    pub fn state(&self) -> serde_json::Value {
        state_records(&self.path("state"))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.kill9();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts = mount_points_under(&mountinfo, self.dir.path());
        mounts.sort();
        for m in mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        for dev in &self.loops {
            detach_loop(dev);
        }
    }
}

/// Mount points (unescaped) in `mountinfo` whose path starts with `prefix`'s text.
pub fn mount_points_under(mountinfo: &str, prefix: &Path) -> Vec<String> {
    let prefix = prefix.to_string_lossy();
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape_mountinfo))
        .filter(|m| m.starts_with(prefix.as_ref()))
        .collect()
}

/// Attaches `img` to the first free loop device and returns that device.
pub fn attach_loop(img: &Path) -> PathBuf {
    PathBuf::from(run("losetup", &["--find", "--show", img.to_str().unwrap()]))
}

/// Detaches `dev`, for clean-up: a failure is ignored.
pub fn detach_loop(dev: &Path) {
    let _ = Command::new("losetup").arg("-d").arg(dev).status();
}

/// A loop device a test attached itself, detached when dropped (after the rig's
/// mounts are gone: declare it before the rig).
pub struct LoopDevice(pub Option<PathBuf>);

impl LoopDevice {
    pub fn attach(img: &Path) -> LoopDevice {
        LoopDevice(Some(attach_loop(img)))
    }
    pub fn path(&self) -> &Path {
        self.0.as_deref().unwrap()
    }
    /// The device's path as a command-line argument.
    pub fn arg(&self) -> String {
        self.path().to_str().unwrap().to_owned()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(dev) = self.0.take() {
            detach_loop(&dev);
        }
    }
}

/// A mountinfo path field as the path it names: the kernel writes space, tab, newline and
/// backslash as `\040`, `\011`, `\012`, `\134` (fs/proc_namespace.c, show_mountinfo ->
/// seq_path_root(..., " \t\n\\")), so a path holding them cannot be unmounted by its field.
pub fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn killed_by_sigkill(status: &ExitStatus) -> bool {
    status.signal() == Some(9)
}

pub fn digest_file(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    fs::File::open(path)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    Sha256::digest(&bytes).to_vec()
}

/// How many mounts sit exactly at `path` (stacked mounts count each).
pub fn mounts_at(path: &Path) -> usize {
    let p = path.to_string_lossy().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4).map(unescape_mountinfo).as_deref() == Some(p.as_str()))
        .count()
}

/// `blkid -p` exit code: 0 a signature, 2 nothing found.
pub fn blkid_code(dev: &Path) -> Option<i32> {
    Command::new("blkid")
        .args(["-p", dev.to_str().unwrap()])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .code()
}

/// A rig whose loop devices lose their partitions before they are detached, even when the
/// test fails: a plain loop device keeps them after `losetup -d`, and the next test given
/// that device would find them (partition/mod.rs). Mounts under the rig go first, so no
/// partition is held open.
pub struct PartRig(pub Rig);

impl PartRig {
    /// `count` loop devices of `size` bytes; None where root tests skip.
    pub fn with_size(count: usize, size: u64) -> Option<PartRig> {
        Rig::with_size(count, size).map(PartRig)
    }
}

impl Drop for PartRig {
    fn drop(&mut self) {
        use gds_csi::disk::gpt::kernel;
        self.0.kill9();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts = mount_points_under(&mountinfo, self.0.dir.path());
        mounts.sort();
        for m in mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        for dev in &self.0.loops {
            for p in kernel::list(dev).unwrap_or_default() {
                let mut tries = 0;
                while let Err(e) = kernel::delete(dev, p.number) {
                    tries += 1;
                    if tries == 50 {
                        eprintln!("cleanup of {}: {e}", dev.display());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

impl std::ops::Deref for PartRig {
    type Target = Rig;
    fn deref(&self) -> &Rig {
        &self.0
    }
}

impl std::ops::DerefMut for PartRig {
    fn deref_mut(&mut self) -> &mut Rig {
        &mut self.0
    }
}

/// A state dir's volume records (`<state>/volumes/*.json`, each `{"id", "record"}`) as
/// `{"volumes": {id: record}}`.
pub fn state_records(state_dir: &Path) -> serde_json::Value {
    let mut volumes = serde_json::Map::new();
    for entry in fs::read_dir(state_dir.join("volumes"))
        .into_iter()
        .flatten()
    {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let stored: serde_json::Value =
                serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
            let id = stored["id"].as_str().unwrap().to_owned();
            volumes.insert(id, stored["record"].clone());
        }
    }
    serde_json::json!({ "volumes": volumes })
}
