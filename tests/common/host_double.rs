//! The one recording `Host` double of the in-process tests: a mount table and device
//! signatures kept like a host would, every call recorded (reads of the mount table
//! included), and the failures a test can switch on (a hung mkfs or NFS mount, a failing
//! probe, a dead NFS server, RDMA not negotiated). Paths are real (temporary) directories:
//! `stat`, `statvfs` and `create_dir_all` act on them for real.
//!
//! Over the real host (`HostDouble::nfs_by_bind`, root tests on loop devices) it stands in
//! for NFS only, which this machine has no client for: devices, filesystems and local
//! mounts are real, and an NFS mount is a bind of a local directory that the mount table
//! shows as the nfs4 mount the kernel would list.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use gds_csi::error::{Error, Result};
use gds_csi::os::{
    Anchored, DeviceHold, FileKind, ForceUnmount, FsType, FsUsage, Host, HostError, MountEntry,
    RealHost, Signature, StripeGeometry,
};
use tokio::sync::Semaphore;

#[derive(Default)]
pub struct DoubleState {
    pub mounts: Vec<MountEntry>,
    pub signatures: HashMap<PathBuf, Vec<Signature>>,
    /// Every call, e.g. `mkfs /dev/x`, `mount /dev/x /t`, `umount -f /t`, `mount_table`.
    pub calls: Vec<String>,
    /// Every NFS mount: source, target, options.
    pub nfs_calls: Vec<(String, PathBuf, Vec<String>)>,
    next_minor: u32,
}

#[derive(Default)]
pub struct HostDouble {
    pub state: Mutex<DoubleState>,
    /// Device node -> major:minor, for mounts and raw-block binds of the device.
    pub devnums: HashMap<PathBuf, (u32, u32)>,
    /// false: mount calls are only recorded, the table never changes.
    pub track_mounts: bool,
    /// mkfs on these devices waits for a permit: a hung mkfs on demand.
    pub hang_mkfs: Mutex<HashMap<PathBuf, Arc<Semaphore>>>,
    /// The low-level probe of these devices fails (an I/O error, a timeout).
    pub probe_fails: Mutex<Vec<PathBuf>>,
    /// mount_nfs of these sources waits for a permit: a hung server on demand.
    pub hang_nfs: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// What the "kernel" reports as an NFS mount's proto (None: what was asked).
    pub negotiate_proto: Mutex<Option<String>>,
    /// The NFS server is gone: a plain unmount of an NFS mount hangs, `umount -f` fails
    /// (busy), `umount -l` detaches, statvfs blocks until it is back.
    pub server_gone: AtomicBool,
    /// What a plain unmount answers instead of unmounting (a busy mount point, a
    /// `umount` that ran into its own deadline); `None`: it unmounts.
    pub unmount_fails: Mutex<Option<fn() -> Error>>,
    /// `umount -f` answers OK but the mount stays (a mount stacked below).
    pub force_leaves_mount: AtomicBool,
    /// Some: every call but `mount_nfs` goes to the real host (the switches above are off).
    pub over_real: Option<OverRealHost>,
}

/// The real host behind a double that stands in for NFS only.
pub struct OverRealHost {
    pub real: RealHost,
    /// `mount_nfs` of `server:/export/<dir>` binds `<exports>/<dir>`.
    pub exports: PathBuf,
}

fn opts_map(list: &[String]) -> HashMap<String, Option<String>> {
    list.iter()
        .map(|o| match o.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (o.clone(), None),
        })
        .collect()
}

fn rw(ro: bool) -> HashMap<String, Option<String>> {
    opts_map(&[if ro { "ro" } else { "rw" }.to_owned()])
}

/// A local mount of `major:minor` as mountinfo shows it (ext4 with data=ordered).
pub fn entry(major: u32, minor: u32, target: &Path, fs: &str, ro: bool) -> MountEntry {
    let mut super_options = rw(false);
    if fs == "ext4" {
        super_options.insert("data".to_owned(), Some("ordered".to_owned()));
    }
    MountEntry {
        major,
        minor,
        root: "/".into(),
        mount_point: target.to_owned(),
        mount_options: rw(ro),
        fs_type: fs.into(),
        source: None,
        super_options,
    }
}

impl HostDouble {
    /// A double whose mounts change its table, with these device numbers.
    pub fn tracking(devnums: HashMap<PathBuf, (u32, u32)>) -> Self {
        HostDouble {
            devnums,
            track_mounts: true,
            ..Default::default()
        }
    }

    /// A double that only records: every call succeeds and nothing changes.
    pub fn recording() -> Self {
        HostDouble::default()
    }

    /// The real host, except that an NFS mount of `server:/export/<dir>` is a bind of
    /// `<exports>/<dir>` (read-only when asked `ro`), listed as nfs4 (over RDMA when asked
    /// `rdma`).
    pub fn nfs_by_bind(real: RealHost, exports: PathBuf) -> Self {
        HostDouble {
            over_real: Some(OverRealHost { real, exports }),
            ..Default::default()
        }
    }

    fn real(&self) -> Option<&RealHost> {
        self.over_real.as_ref().map(|o| &o.real)
    }

    pub fn record(&self, call: String) {
        self.state.lock().unwrap().calls.push(call);
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    /// How many calls start with `prefix` followed by a space (`mkfs`, `umount`, ...).
    pub fn count(&self, prefix: &str) -> usize {
        let p = format!("{prefix} ");
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.starts_with(&p))
            .count()
    }

    /// The calls that start with `prefix` followed by a space, in order.
    pub fn calls_of(&self, prefix: &str) -> Vec<String> {
        let p = format!("{prefix} ");
        self.calls()
            .into_iter()
            .filter(|c| c.starts_with(&p))
            .collect()
    }

    pub fn mounts_at(&self, path: &Path) -> usize {
        let s = self.state.lock().unwrap();
        s.mounts.iter().filter(|m| m.mount_point == path).count()
    }

    fn push_mount(&self, m: MountEntry) {
        if self.track_mounts {
            self.state.lock().unwrap().mounts.push(m);
        }
    }

    fn remove_top(&self, target: &Path) {
        let mut s = self.state.lock().unwrap();
        if let Some(i) = s.mounts.iter().rposition(|m| m.mount_point == target) {
            s.mounts.remove(i);
        }
    }

    fn is_nfs_at(&self, target: &Path) -> bool {
        let s = self.state.lock().unwrap();
        let top = s.mounts.iter().rev().find(|m| m.mount_point == target);
        top.is_some_and(|m| m.fs_type.starts_with("nfs"))
    }

    /// The entry a bind of `source` shows: the mount there (its source and superblock),
    /// or the device node itself (raw block).
    fn bind_entry(&self, source: &Path, target: &Path, ro: bool) -> Option<MountEntry> {
        let from = {
            let s = self.state.lock().unwrap();
            s.mounts
                .iter()
                .rev()
                .find(|m| m.mount_point == source)
                .cloned()
        };
        let mut m = match from {
            Some(m) => m,
            None => {
                let (major, minor) = *self.devnums.get(source)?;
                entry(major, minor, target, "devtmpfs", ro)
            }
        };
        m.mount_point = target.to_owned();
        m.mount_options = rw(ro);
        Some(m)
    }

    fn nfs_entry(&self, source: &str, target: &Path, options: &[String]) -> MountEntry {
        let mut sup = opts_map(options);
        if sup.remove("rdma").is_some() {
            sup.insert("proto".into(), Some("rdma".into()));
        }
        if let Some(p) = self.negotiate_proto.lock().unwrap().clone() {
            sup.insert("proto".into(), Some(p));
            sup.insert("port".into(), Some("2049".into()));
        }
        let mut s = self.state.lock().unwrap();
        s.next_minor += 1;
        MountEntry {
            major: 0,
            minor: 100 + s.next_minor,
            root: "/".into(),
            mount_point: target.to_owned(),
            mount_options: rw(false),
            fs_type: "nfs4".into(),
            source: Some(source.to_owned()),
            super_options: sup,
        }
    }
}

/// Real file-system reads of the test's own temporary paths.
fn real_paths() -> RealHost {
    RealHost {
        command_timeout: std::time::Duration::from_secs(5),
        mount_timeout: std::time::Duration::from_secs(5),
    }
}

impl OverRealHost {
    /// A bind of the export's local directory at `target`, read-only when asked.
    fn bind_export(&self, source: &str, target: &Path, options: &[String]) -> Result<()> {
        let dir = source.split_once(":/export").unwrap().1;
        let local = self.exports.join(dir.trim_start_matches('/'));
        let ro = if options.iter().any(|o| o == "ro") {
            "ro"
        } else {
            "rw"
        };
        let out = Command::new("mount")
            .args(["--bind", "-o", ro])
            .arg(&local)
            .arg(target)
            .output()
            .unwrap();
        if out.status.success() {
            Ok(())
        } else {
            Err(HostError::TaskFailed {
                what: "mount --bind".into(),
                why: String::from_utf8_lossy(&out.stderr).into(),
            }
            .into())
        }
    }
}

/// `bind` as the kernel lists an NFS mount of `source` with `options`.
fn shown_as_nfs(bind: &mut MountEntry, source: &str, options: &[String]) {
    bind.fs_type = "nfs4".into();
    bind.source = Some(source.to_owned());
    if options.iter().any(|o| o == "rdma") {
        bind.super_options
            .insert("proto".into(), Some("rdma".into()));
        bind.super_options
            .insert("port".into(), Some("20049".into()));
    }
}

#[async_trait]
impl Host for HostDouble {
    fn mount_table(&self) -> Result<Vec<MountEntry>> {
        let mut s = self.state.lock().unwrap();
        s.calls.push("mount_table".into());
        let Some(real) = self.real() else {
            return Ok(s.mounts.clone());
        };
        let mut table = real.mount_table()?;
        for m in &mut table {
            let nfs = s
                .nfs_calls
                .iter()
                .rev()
                .find(|(_, t, _)| *t == m.mount_point);
            if let Some((source, _, options)) = nfs {
                shown_as_nfs(m, source, options);
            }
        }
        Ok(table)
    }
    async fn probe_signatures(&self, device: &Path) -> Result<Vec<Signature>> {
        self.record(format!("probe {}", device.display()));
        if let Some(real) = self.real() {
            return real.probe_signatures(device).await;
        }
        if self.probe_fails.lock().unwrap().iter().any(|d| d == device) {
            // What RealHost's probe_failed returns (src/os/host/real.rs).
            return Err(HostError::ProbeFailed {
                device: device.to_owned(),
                why: "I/O error, test double".into(),
            }
            .into());
        }
        let s = self.state.lock().unwrap();
        Ok(s.signatures.get(device).cloned().unwrap_or_default())
    }
    fn hold_device(&self, device: &Path) -> Result<DeviceHold> {
        self.record(format!("hold {}", device.display()));
        if let Some(real) = self.real() {
            return real.hold_device(device);
        }
        Ok(DeviceHold::nothing_to_lock())
    }
    async fn mkfs(
        &self,
        device: &Path,
        fs: FsType,
        uuid: &str,
        stripe: Option<StripeGeometry>,
    ) -> Result<()> {
        let hang = self.hang_mkfs.lock().unwrap().get(device).cloned();
        if let Some(hang) = hang {
            let _permit = hang.acquire().await.unwrap();
        }
        self.record(format!("mkfs {}", device.display()));
        if let Some(real) = self.real() {
            return real.mkfs(device, fs, uuid, stripe).await;
        }
        let sig = Signature {
            kind: fs.as_str().into(),
            uuid: Some(uuid.into()),
            offset: None,
            seen_by: "host double",
        };
        let mut s = self.state.lock().unwrap();
        s.signatures.insert(device.to_owned(), vec![sig]);
        Ok(())
    }
    async fn wipe_signatures(&self, device: &Path) -> Result<()> {
        self.record(format!("wipe {}", device.display()));
        if let Some(real) = self.real() {
            return real.wipe_signatures(device).await;
        }
        self.state.lock().unwrap().signatures.remove(device);
        Ok(())
    }
    async fn grow_filesystem(&self, device: &Path, mount_point: &Path, fs: FsType) -> Result<()> {
        self.record(format!(
            "grow {fs:?} {} at {}",
            device.display(),
            mount_point.display()
        ));
        if let Some(real) = self.real() {
            return real.grow_filesystem(device, mount_point, fs).await;
        }
        Ok(())
    }
    async fn zero_device(&self, device: &Path) -> Result<()> {
        self.record(format!("zero {}", device.display()));
        if let Some(real) = self.real() {
            return real.zero_device(device).await;
        }
        self.state.lock().unwrap().signatures.remove(device);
        Ok(())
    }
    async fn mount(
        &self,
        device: &Path,
        target: &Anchored,
        fs: FsType,
        options: &[String],
    ) -> Result<()> {
        self.record(format!(
            "mount {} {}",
            device.display(),
            target.path().display()
        ));
        if let Some(real) = self.real() {
            return real.mount(device, target, fs, options).await;
        }
        if let Some(&(major, minor)) = self.devnums.get(device) {
            self.push_mount(entry(major, minor, target.path(), fs.as_str(), false));
        }
        Ok(())
    }
    async fn bind_mount(
        &self,
        source: &Anchored,
        target: &Anchored,
        options: &[String],
    ) -> Result<()> {
        self.record(format!(
            "bind {} {}",
            source.path().display(),
            target.path().display()
        ));
        if let Some(real) = self.real() {
            return real.bind_mount(source, target, options).await;
        }
        let ro = options.iter().any(|o| o == "ro");
        if let Some(m) = self.bind_entry(source.path(), target.path(), ro) {
            self.push_mount(m);
        }
        Ok(())
    }
    async fn unmount(&self, target: &Anchored) -> Result<()> {
        self.record(format!("umount {}", target.path().display()));
        if let Some(real) = self.real() {
            return real.unmount(target).await;
        }
        let target = target.path();
        if self.server_gone.load(Ordering::SeqCst) && self.is_nfs_at(target) {
            std::future::pending::<()>().await;
        }
        if let Some(fails) = *self.unmount_fails.lock().unwrap() {
            return Err(fails());
        }
        self.remove_top(target);
        Ok(())
    }
    async fn unmount_forced(&self, target: &Path, how: ForceUnmount) -> Result<()> {
        let flag = match how {
            ForceUnmount::Force => "-f",
            ForceUnmount::Lazy => "-l",
        };
        self.record(format!("umount {flag} {}", target.display()));
        if let Some(real) = self.real() {
            return real.unmount_forced(target, how).await;
        }
        if how == ForceUnmount::Force && self.force_leaves_mount.load(Ordering::SeqCst) {
            return Ok(());
        }
        if how == ForceUnmount::Force && self.server_gone.load(Ordering::SeqCst) {
            return Err(HostError::TaskFailed {
                what: "umount.nfs4".into(),
                why: "device is busy".into(),
            }
            .into());
        }
        self.remove_top(target);
        Ok(())
    }
    async fn mount_nfs(&self, source: &str, target: &Path, options: &[String]) -> Result<()> {
        let hang = self.hang_nfs.lock().unwrap().get(source).cloned();
        if let Some(hang) = hang {
            let _permit = hang.acquire().await.unwrap();
        }
        self.record(format!("mount_nfs {source} {}", target.display()));
        // Over the real host the bind is in the real mount table already.
        let simulated = match &self.over_real {
            Some(over) => {
                over.bind_export(source, target, options)?;
                None
            }
            None => Some(self.nfs_entry(source, target, options)),
        };
        let mut s = self.state.lock().unwrap();
        s.nfs_calls
            .push((source.to_owned(), target.to_owned(), options.to_vec()));
        if let Some(m) = simulated.filter(|_| self.track_mounts) {
            s.mounts.push(m);
        }
        Ok(())
    }
    fn create_dir_all(&self, path: &Path) -> Result<()> {
        self.record(format!("mkdir {}", path.display()));
        match self.real() {
            Some(real) => real.create_dir_all(path),
            None => real_paths().create_dir_all(path),
        }
    }
    fn stat(&self, path: &Path) -> Result<Option<FileKind>> {
        self.record(format!("stat {}", path.display()));
        match self.real() {
            Some(real) => real.stat(path),
            None => real_paths().stat(path),
        }
    }
    fn statvfs(&self, path: &Path) -> Result<FsUsage> {
        self.record(format!("statvfs {}", path.display()));
        if let Some(real) = self.real() {
            return real.statvfs(path);
        }
        // A hard NFS mount's statvfs waits for the gone server (in the kernel, unkillable
        // from here): blocks its thread until the server is back.
        while self.server_gone.load(Ordering::SeqCst) && self.is_nfs_at(path) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        real_paths().statvfs(path)
    }
}
