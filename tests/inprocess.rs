//! In-process gRPC tests: the real services and server on a unix socket in a temp
//! dir, over a recording `Host` double and a fixture sysfs with NVMe namespaces. No
//! root needed. They cover what real devices make hard to stage: a hung mkfs, exact
//! call records ("no mkfs ran"), and races.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gds_csi::client::Clients;
use gds_csi::csi::volume_capability::{
    access_mode::Mode as AccessModeKind, AccessMode, AccessType, MountVolume,
};
use gds_csi::csi::*;
use gds_csi::error::Result;
use gds_csi::os::{Anchored, DeviceHold, FsType, Host, MountEntry, Signature};
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::Driver;
use tokio::sync::Semaphore;
use tonic::Code;

#[derive(Default)]
struct FakeState {
    mounts: Vec<MountEntry>,
    signatures: HashMap<PathBuf, Vec<Signature>>,
    calls: Vec<String>,
}

/// Keeps a mount table and signatures like a host would, and records every call.
struct FakeHost {
    state: Mutex<FakeState>,
    devnums: HashMap<PathBuf, (u32, u32)>,
    /// mkfs on these devices waits for a permit: a hung mkfs on demand.
    hang_mkfs: Mutex<HashMap<PathBuf, Arc<Semaphore>>>,
}

impl FakeHost {
    fn calls(&self, prefix: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }
    fn mounts_at(&self, path: &Path) -> usize {
        self.state
            .lock()
            .unwrap()
            .mounts
            .iter()
            .filter(|m| m.mount_point == path)
            .count()
    }
}

fn entry(major: u32, minor: u32, target: &Path, fs: &str, ro: bool) -> MountEntry {
    let mut mount_options = HashMap::new();
    mount_options.insert(if ro { "ro" } else { "rw" }.to_owned(), None);
    let mut super_options = HashMap::new();
    super_options.insert("rw".to_owned(), None);
    if fs == "ext4" {
        super_options.insert("data".to_owned(), Some("ordered".to_owned()));
    }
    MountEntry {
        major,
        minor,
        root: "/".into(),
        mount_point: target.to_owned(),
        mount_options,
        fs_type: fs.into(),
        source: None,
        super_options,
    }
}

#[async_trait]
impl Host for FakeHost {
    fn mount_table(&self) -> Result<Vec<MountEntry>> {
        Ok(self.state.lock().unwrap().mounts.clone())
    }
    async fn probe_signatures(&self, device: &Path) -> Result<Vec<Signature>> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("probe {}", device.display()));
        Ok(s.signatures.get(device).cloned().unwrap_or_default())
    }
    async fn mkfs(&self, device: &Path, fs: FsType, uuid: &str) -> Result<()> {
        let gate = self.hang_mkfs.lock().unwrap().get(device).cloned();
        if let Some(gate) = gate {
            let _permit = gate.acquire().await.unwrap();
        }
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("mkfs {}", device.display()));
        let sig = Signature {
            kind: fs.as_str().into(),
            uuid: Some(uuid.into()),
            offset: None,
            seen_by: "fake",
        };
        s.signatures.insert(device.to_owned(), vec![sig]);
        Ok(())
    }
    async fn wipe_signatures(&self, device: &Path) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("wipe {}", device.display()));
        s.signatures.remove(device);
        Ok(())
    }
    fn hold_device(&self, _: &Path) -> Result<DeviceHold> {
        Ok(DeviceHold::nothing_to_lock())
    }
    async fn zero_device(&self, device: &Path) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("zero {}", device.display()));
        s.signatures.remove(device);
        Ok(())
    }
    async fn mount(
        &self,
        device: &Path,
        target: &Anchored,
        fs: FsType,
        _options: &[String],
    ) -> Result<()> {
        let target = target.path();
        let (major, minor) = self.devnums[device];
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("mount {}", target.display()));
        s.mounts
            .push(entry(major, minor, target, fs.as_str(), false));
        Ok(())
    }
    async fn bind_mount(
        &self,
        source: &Anchored,
        target: &Anchored,
        options: &[String],
    ) -> Result<()> {
        let source = source.path();
        let target = target.path();
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("bind {}", target.display()));
        let from = s
            .mounts
            .iter()
            .rev()
            .find(|m| m.mount_point == source)
            .cloned();
        let (major, minor, fs) = match from {
            Some(m) => (m.major, m.minor, m.fs_type),
            // A raw block publish binds the device node itself.
            None => {
                let (major, minor) = self.devnums[source];
                (major, minor, "devtmpfs".to_owned())
            }
        };
        s.mounts.push(entry(
            major,
            minor,
            target,
            &fs,
            options.iter().any(|o| o == "ro"),
        ));
        Ok(())
    }
    async fn unmount(&self, target: &Anchored) -> Result<()> {
        let target = target.path();
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("umount {}", target.display()));
        if let Some(i) = s.mounts.iter().rposition(|m| m.mount_point == target) {
            s.mounts.remove(i);
        }
        Ok(())
    }
}

struct Harness {
    dir: tempfile::TempDir,
    host: Arc<FakeHost>,
    clients: Clients,
    devices: Vec<PathBuf>,
}

const DEV_SIZE: u64 = 1 << 30;

async fn harness(namespaces: usize) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    let dev = dir.path().join("dev");
    let mut devnums = HashMap::new();
    let mut devices = Vec::new();
    for i in 0..namespaces {
        let name = format!("nvme{i}n1");
        let ns = sys.join("block").join(&name);
        std::fs::create_dir_all(ns.join("holders")).unwrap();
        std::fs::write(ns.join("wwid"), format!("nvme.1b36-fixture-{i:04}\n")).unwrap();
        std::fs::write(ns.join("dev"), format!("259:{i}\n")).unwrap();
        let by_dev = sys.join(format!("dev/block/259:{i}"));
        std::fs::create_dir_all(&by_dev).unwrap();
        std::fs::write(by_dev.join("size"), format!("{}\n", DEV_SIZE / 512)).unwrap();
        devnums.insert(dev.join(&name), (259, i as u32));
        devices.push(dev.join(&name));
    }
    let host = Arc::new(FakeHost {
        state: Mutex::default(),
        devnums,
        hang_mkfs: Mutex::default(),
    });
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: sys,
        host_dev: dev,
        listed: vec![],
        nvme_discover: true,
        state_dir: dir.path().join("state"),
    })
    .unwrap();
    let driver = Arc::new(Driver::new(
        "gds.csi.test".into(),
        "node-a".into(),
        vec![dir.path().join("kubelet")],
        pool,
        host.clone(),
    ));
    let clients = common::serve_in_process(driver, dir.path()).await;
    Harness {
        dir,
        host,
        clients,
        devices,
    }
}

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: AccessModeKind::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

impl Harness {
    async fn create(&self, name: &str) -> std::result::Result<Volume, tonic::Status> {
        let req = CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![cap()],
            ..Default::default()
        };
        Ok(self
            .clients
            .controller
            .clone()
            .create_volume(req)
            .await?
            .into_inner()
            .volume
            .unwrap())
    }
    fn staging(&self, name: &str) -> PathBuf {
        self.dir.path().join("kubelet/staging").join(name)
    }
    async fn stage(&self, id: &str, name: &str) -> std::result::Result<(), tonic::Status> {
        let req = NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: self.staging(name).display().to_string(),
            volume_capability: Some(cap()),
            ..Default::default()
        };
        self.clients
            .node
            .clone()
            .node_stage_volume(req)
            .await
            .map(|_| ())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_identical_creates_allocate_one_device() {
    let h = harness(4).await;
    let results = futures_join(64, |_| h.create("same-name")).await;
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert!(!ok.is_empty());
    assert!(
        ok.iter().all(|v| v.volume_id == ok[0].volume_id),
        "one volume id for one name"
    );
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code(), Code::Aborted, "{e:?}");
        }
    }
    let list = h
        .clients
        .controller
        .clone()
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1, "exactly one allocation");
    // A retry after the storm gets the same volume.
    assert_eq!(
        h.create("same-name").await.unwrap().volume_id,
        ok[0].volume_id
    );
}

async fn futures_join<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let futures: Vec<_> = (0..n).map(f).collect();
    let mut out = Vec::with_capacity(n);
    // join_all without a dependency: poll them together through a JoinSet-free select.
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<T>> = (0..n).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, fut) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => done[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.extend(done.into_iter().map(Option::unwrap));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_mkfs_on_one_volume_blocks_neither_other_volumes_nor_retries() {
    let h = Arc::new(harness(2).await);
    let a = h.create("a").await.unwrap();
    let b = h.create("b").await.unwrap();
    // Hang mkfs on the device that "a" got, and only there.
    let a_device = h
        .devices
        .iter()
        .enumerate()
        .find(|(i, _)| {
            let id = gds_csi::pool::inventory::device_id(
                "nvme",
                &format!("wwid:nvme.1b36-fixture-{i:04}"),
            );
            a.volume_id.contains(&id)
        })
        .map(|(_, d)| d.clone())
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    h.host
        .hang_mkfs
        .lock()
        .unwrap()
        .insert(a_device, gate.clone());
    let h2 = h.clone();
    let id_a = a.volume_id.clone();
    let stuck = tokio::spawn(async move { h2.stage(&id_a, "a").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!stuck.is_finished(), "mkfs of a is hung");

    // The same volume is busy: Aborted at once, not queued.
    let started = Instant::now();
    let err = h.stage(&a.volume_id, "a").await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(started.elapsed() < Duration::from_secs(1));

    // Another volume stages completely while "a" is still stuck.
    tokio::time::timeout(Duration::from_secs(5), h.stage(&b.volume_id, "b"))
        .await
        .expect("b finished while a was hung")
        .unwrap();
    assert!(!stuck.is_finished(), "a is still hung");
    assert_eq!(h.host.mounts_at(&h.staging("b")), 1);
    gate.add_permits(1);
    stuck.await.unwrap().unwrap();
    assert_eq!(h.host.calls("mkfs"), 2);
    assert_eq!(h.host.mounts_at(&h.staging("a")), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_stages_of_one_volume_mount_once_and_foreign_devices_never_see_mkfs() {
    let h = harness(2).await;
    let v = h.create("v").await.unwrap();
    let results = futures_join(16, |_| h.stage(&v.volume_id, "v")).await;
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code(), Code::Aborted, "{e:?}");
        }
    }
    h.stage(&v.volume_id, "v").await.unwrap();
    assert_eq!(h.host.mounts_at(&h.staging("v")), 1, "one mount effect");
    assert_eq!(h.host.calls("mkfs"), 1);

    // The other device gets a foreign signature after allocation: refused, no mkfs, no mount.
    let w = h.create("w").await.unwrap();
    let other = h
        .devices
        .iter()
        .find(|d| !h.host.state.lock().unwrap().signatures.contains_key(*d))
        .unwrap()
        .clone();
    h.host.state.lock().unwrap().signatures.insert(
        other.clone(),
        vec![Signature {
            kind: "LVM2_member".into(),
            uuid: Some("x".into()),
            offset: None,
            seen_by: "fake",
        }],
    );
    let err = h.stage(&w.volume_id, "w").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("LVM2_member") && err.message().contains(other.to_str().unwrap()),
        "{}",
        err.message()
    );
    assert_eq!(h.host.calls("mkfs"), 1, "no mkfs on the foreign device");
    assert_eq!(h.host.mounts_at(&h.staging("w")), 0);
}
