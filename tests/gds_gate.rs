//! The GDS gate through the CSI handlers: a driver over a fixture host tree, a recording host
//! double (no real mounts), one real block device node for the pool (any /dev/loopN: the
//! pool only stats it; these tests skip where there is none), and the real `gds-csi
//! cufile-probe` child (with a missing libcufile, a clean LibraryMissing) or a stand-in.
//!
//! Also here, ignored: `publish_latency_bench` (NodePublish medians, gate on vs off) and
//! `h200_flow`, the client half of scripts/h200-gds-check.sh.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tonic::{Code, Request};

use gds_csi::csi::controller_server::Controller;
use gds_csi::csi::node_server::Node;
use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::*;
use gds_csi::error::Result as DResult;
use gds_csi::gds_gate::fixture::Tree;
use gds_csi::gds_gate::{GateConfig, GdsGate};
use gds_csi::os::{FsType, Host, MountEntry, Signature};
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::controller::ControllerService;
use gds_csi::service::node::NodeService;
use gds_csi::service::Driver;

const DRIVER: &str = "gds.csi.gds-csi.io";

/// Mounts are entries in a table; nothing touches the real host.
struct FakeHost {
    mounts: Mutex<Vec<MountEntry>>,
    dev: (u32, u32),
}

impl FakeHost {
    fn entry(&self, target: &Path, ro: bool) -> MountEntry {
        let mut mount_options = HashMap::new();
        mount_options.insert(if ro { "ro" } else { "rw" }.to_string(), None);
        let mut super_options = HashMap::new();
        super_options.insert("rw".to_string(), None);
        super_options.insert("data".to_string(), Some("ordered".to_string()));
        MountEntry {
            major: self.dev.0,
            minor: self.dev.1,
            root: "/".into(),
            mount_point: target.to_path_buf(),
            mount_options,
            fs_type: "ext4".into(),
            source: Some("/dev/loop-fixture".into()),
            super_options,
        }
    }
}

#[async_trait]
impl Host for FakeHost {
    fn mount_table(&self) -> DResult<Vec<MountEntry>> {
        Ok(self.mounts.lock().unwrap().clone())
    }
    async fn probe_signatures(&self, _: &Path) -> DResult<Vec<Signature>> {
        Ok(vec![])
    }
    async fn mkfs(&self, _: &Path, _: FsType, _: &str) -> DResult<()> {
        Ok(())
    }
    async fn wipe_signatures(&self, _: &Path) -> DResult<()> {
        Ok(())
    }
    async fn mount(&self, _: &Path, target: &Path, _: FsType, _: &[String]) -> DResult<()> {
        let e = self.entry(target, false);
        self.mounts.lock().unwrap().push(e);
        Ok(())
    }
    async fn bind_mount(&self, _: &Path, target: &Path, options: &[String]) -> DResult<()> {
        let e = self.entry(target, options.iter().any(|o| o == "ro"));
        self.mounts.lock().unwrap().push(e);
        Ok(())
    }
    async fn unmount(&self, target: &Path) -> DResult<()> {
        let mut m = self.mounts.lock().unwrap();
        if let Some(i) = m.iter().rposition(|e| e.mount_point == target) {
            m.remove(i);
        }
        Ok(())
    }
}

/// Any block device node: the pool stats it for its major:minor; its size comes from the
/// fixture sysfs. Nothing is ever read from or written to it here.
fn some_block_device() -> Option<(PathBuf, u32, u32)> {
    let mut names: Vec<_> = std::fs::read_dir("/dev")
        .ok()?
        .filter_map(|e| e.ok())
        .collect();
    names.sort_by_key(|e| e.file_name());
    names.into_iter().find_map(|e| {
        let meta = std::fs::metadata(e.path()).ok()?;
        meta.file_type().is_block_device().then(|| {
            let rdev = meta.rdev();
            (e.path(), libc::major(rdev), libc::minor(rdev))
        })
    })
}

struct Rig {
    _dir: tempfile::TempDir,
    tree: Tree,
    driver: Arc<Driver>,
    node: NodeService,
    controller: ControllerService,
    kubelet: PathBuf,
    majmin: String,
}

enum Probe {
    /// The real `gds-csi cufile-probe` child with a libcufile path that does not exist.
    MissingLibrary,
    /// `/bin/sh` answering a completed probe in this mode (`true_gds`, `compat`).
    Stub(&'static str),
}

/// `ready`: fixtures where every check passes (GPU, nvidia_fs with nvme, udev entry, ext4
/// data=ordered); otherwise the field failure (nvidia_fs with only `wekafsio: 1`, no udev).
async fn rig(ready: bool, probe: Probe, ttl: Duration) -> Option<Rig> {
    let Some((dev, major, minor)) = some_block_device() else {
        // scripts/test.sh sets GDS_CSI_NO_SKIP=1: there a skip is a failure.
        if std::env::var_os("GDS_CSI_NO_SKIP").is_some_and(|v| v == "1") {
            panic!("no block device node in /dev, and GDS_CSI_NO_SKIP=1");
        }
        eprintln!("no block device node in /dev: skipping the handler-level gate test");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    let majmin = format!("{major}:{minor}");
    tree.gpu_node()
        .nvidia_fs(if ready { "nvme: 1\n" } else { "wekafsio: 1\n" })
        .write("sys/devices/virtual/block/fixdev/size", "2097152\n")
        .write(
            "sys/devices/virtual/block/fixdev/dev",
            &format!("{majmin}\n"),
        )
        .link(
            &format!("sys/dev/block/{majmin}"),
            "../../devices/virtual/block/fixdev",
        );
    if ready {
        tree.write(
            &format!("run/udev/data/b{majmin}"),
            "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n",
        );
    }
    let kubelet = dir.path().join("kubelet");
    let (probe_exe, probe_prefix, library) = match probe {
        Probe::MissingLibrary => (
            PathBuf::from(env!("CARGO_BIN_EXE_gds-csi")),
            gds_csi::doctor::probe_prefix(),
            Some(PathBuf::from("/nonexistent/libcufile.so.0")),
        ),
        Probe::Stub(mode) => {
            let (exe, prefix) = tree.probe_stub(mode);
            (exe, prefix, None)
        }
    };
    let gate = GdsGate::new(GateConfig {
        paths: tree.paths.clone(),
        probe_exe,
        probe_prefix,
        cufile_library: library,
        probe_timeout: Duration::from_secs(20),
        cache_ttl: ttl,
    });
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: dir.path().join("sys"),
        host_dev: dir.path().join("dev"),
        listed: vec![dev],
        nvme_discover: false,
        state_dir: dir.path().join("state"),
    })
    .unwrap();
    let host = Arc::new(FakeHost {
        mounts: Mutex::new(vec![]),
        dev: (major, minor),
    });
    let driver = Arc::new(
        Driver::new(
            DRIVER.into(),
            "node-a".into(),
            vec![kubelet.clone()],
            pool,
            host,
        )
        .with_gds_gate(gate),
    );
    driver.initialise().await.unwrap();
    Some(Rig {
        node: NodeService {
            driver: Arc::clone(&driver),
        },
        controller: ControllerService {
            driver: Arc::clone(&driver),
        },
        driver,
        tree,
        _dir: dir,
        kubelet,
        majmin,
    })
}

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    }
}

impl Rig {
    /// CreateVolume with these StorageClass parameters, then NodeStageVolume. The fixture
    /// mountinfo then shows the staged ext4 with data=ordered, as the real kernel would.
    async fn create_and_stage(&self, params: &[(&str, &str)]) -> (String, PathBuf) {
        let vol = self
            .controller
            .create_volume(Request::new(CreateVolumeRequest {
                name: "pvc-1".into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap()],
                parameters: params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let staging = self.kubelet.join("staging/pv");
        self.node
            .node_stage_volume(Request::new(NodeStageVolumeRequest {
                volume_id: vol.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap()),
                ..Default::default()
            }))
            .await
            .unwrap();
        self.tree.mountinfo(&format!(
            "100 29 {} / {} rw,relatime shared:50 - ext4 /dev/loop-fixture rw,data=ordered",
            self.majmin,
            staging.display()
        ));
        (vol.volume_id, staging)
    }

    fn target(&self, n: usize) -> PathBuf {
        self.kubelet.join(format!("pods/p{n}/volumes/pv"))
    }

    async fn publish(&self, id: &str, staging: &Path, target: &Path) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(Request::new(NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap()),
                ..Default::default()
            }))
            .await
            .map(|_| ())
    }

    async fn unpublish(&self, id: &str, target: &Path) {
        self.node
            .node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: target.display().to_string(),
            }))
            .await
            .unwrap();
    }

    async fn condition(&self, id: &str, target: &Path) -> VolumeCondition {
        self.node
            .node_get_volume_stats(Request::new(NodeGetVolumeStatsRequest {
                volume_id: id.into(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            }))
            .await
            .unwrap()
            .into_inner()
            .volume_condition
            .unwrap()
    }

    async fn topology(&self) -> HashMap<String, String> {
        self.node
            .node_get_info(Request::new(NodeGetInfoRequest {}))
            .await
            .unwrap()
            .into_inner()
            .accessible_topology
            .unwrap()
            .segments
    }
}

#[tokio::test]
async fn required_refuses_publish_naming_every_failed_check() {
    let Some(r) = rig(false, Probe::MissingLibrary, Duration::from_secs(60)).await else {
        return;
    };
    let (id, staging) = r.create_and_stage(&[("gdsPolicy", "required")]).await;
    let target = r.target(1);
    let err = r.publish(&id, &staging, &target).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let msg = err.message();
    for id in ["nvidia_fs.storage_driver", "volume.udev", "cufile.probe"] {
        assert!(msg.contains(&format!("\n{id}: ")), "{id} not named:\n{msg}");
    }
    assert!(msg.contains("wekafsio"), "{msg}");
    assert!(msg.contains("/nonexistent/libcufile.so.0"), "{msg}");
    assert!(msg.contains("install libcufile"), "{msg}");
    // Refused before the bind mount: nothing at the target.
    assert!(r
        .driver
        .host
        .mount_table()
        .unwrap()
        .iter()
        .all(|m| m.mount_point != target));

    let topo = r.topology().await;
    assert_eq!(
        topo.get(&format!("{DRIVER}/node")).map(String::as_str),
        Some("node-a")
    );
    assert_eq!(
        topo.get(&format!("{DRIVER}/gds-nvme")).map(String::as_str),
        Some("false")
    );
    assert_eq!(
        topo.get(&format!("{DRIVER}/gds-nfs-rdma"))
            .map(String::as_str),
        Some("false")
    );
    assert_eq!(topo.len(), 3);
}

#[tokio::test]
async fn preferred_publishes_and_reports_compat_in_volume_condition() {
    let Some(r) = rig(false, Probe::MissingLibrary, Duration::from_secs(60)).await else {
        return;
    };
    let (id, staging) = r.create_and_stage(&[("gdsPolicy", "preferred")]).await;
    let target = r.target(1);
    r.publish(&id, &staging, &target).await.unwrap();
    assert!(r
        .driver
        .host
        .mount_table()
        .unwrap()
        .iter()
        .any(|m| m.mount_point == target));
    let c = r.condition(&id, &target).await;
    assert!(c.abnormal, "{c:?}");
    assert!(c.message.contains("compat mode"), "{}", c.message);
    assert!(c.message.contains("volume.udev"), "{}", c.message);
    assert!(
        c.message.contains("nvidia_fs.storage_driver"),
        "{}",
        c.message
    );
}

#[tokio::test]
async fn disabled_and_absent_policy_publish_without_checks() {
    for params in [&[("gdsPolicy", "disabled")][..], &[][..]] {
        let Some(r) = rig(false, Probe::Stub("compat"), Duration::from_secs(60)).await else {
            return;
        };
        let (id, staging) = r.create_and_stage(params).await;
        let target = r.target(1);
        r.publish(&id, &staging, &target).await.unwrap();
        assert_eq!(r.tree.probe_runs(), 0, "{params:?}");
        let c = r.condition(&id, &target).await;
        assert!(!c.abnormal, "{c:?}");
    }
}

#[tokio::test]
async fn required_on_a_ready_node_publishes_and_advertises_readiness() {
    let Some(r) = rig(true, Probe::Stub("true_gds"), Duration::from_secs(60)).await else {
        return;
    };
    let (id, staging) = r.create_and_stage(&[("gdsPolicy", "required")]).await;
    for n in 0..3 {
        let t = r.target(n);
        r.publish(&id, &staging, &t).await.unwrap();
    }
    // One probe for the volume, then the cache.
    assert_eq!(r.tree.probe_runs(), 1);
    assert!(!r.condition(&id, &r.target(0)).await.abnormal);
    let topo = r.topology().await;
    assert_eq!(
        topo.get(&format!("{DRIVER}/gds-nvme")).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        topo.get(&format!("{DRIVER}/gds-nfs-rdma"))
            .map(String::as_str),
        Some("false")
    );
    // The controller still takes a requirement that carries the extra keys.
    let vol = r
        .controller
        .create_volume(Request::new(CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap()],
            parameters: [("gdsPolicy".to_string(), "required".to_string())].into(),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![Topology {
                    segments: topo.clone(),
                }],
                preferred: vec![Topology { segments: topo }],
            }),
            ..Default::default()
        }))
        .await;
    assert!(vol.is_ok(), "{vol:?}");
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `cargo test --release --test gds_gate -- --ignored publish_latency_bench --nocapture`
#[tokio::test]
#[ignore]
async fn publish_latency_bench() {
    const N: usize = 200;
    let mut rows = Vec::new();
    for (label, ready, probe, ttl, params) in [
        (
            "gate off (gdsPolicy absent)",
            true,
            "true_gds",
            60,
            BTreeMap::new(),
        ),
        (
            "gate off (gdsPolicy=disabled)",
            true,
            "true_gds",
            60,
            BTreeMap::from([("gdsPolicy", "disabled")]),
        ),
        (
            "gate on, required, probe cached",
            true,
            "true_gds",
            60,
            BTreeMap::from([("gdsPolicy", "required")]),
        ),
        (
            "gate on, preferred (compat), cached",
            false,
            "compat",
            60,
            BTreeMap::from([("gdsPolicy", "preferred")]),
        ),
        (
            "gate on, required, probe every call",
            true,
            "true_gds",
            0,
            BTreeMap::from([("gdsPolicy", "required")]),
        ),
    ] {
        let Some(r) = rig(ready, Probe::Stub(probe), Duration::from_secs(ttl)).await else {
            return;
        };
        let params: Vec<(&str, &str)> = params.into_iter().collect();
        let (id, staging) = r.create_and_stage(&params).await;
        let mut times = Vec::with_capacity(N);
        for i in 0..N + 5 {
            let t = r.target(i);
            let start = Instant::now();
            r.publish(&id, &staging, &t).await.unwrap();
            let el = start.elapsed();
            r.unpublish(&id, &t).await;
            if i >= 5 {
                times.push(el);
            }
        }
        let m = median(&mut times);
        let p90 = times[times.len() * 9 / 10];
        rows.push((label, m, p90, r.tree.probe_runs()));
    }
    println!("NodePublishVolume latency, {N} calls each (fake mounts, fixture host tree):");
    for (label, m, p90, runs) in rows {
        println!(
            "  {label:<40} median {:>8.1} us   p90 {:>8.1} us   probe runs {runs}",
            m.as_secs_f64() * 1e6,
            p90.as_secs_f64() * 1e6
        );
    }
}

/// The client half of scripts/h200-gds-check.sh, against a real `gds-csi serve` on a real
/// node: env GDS_H200_SOCKET, GDS_H200_WORK. Creates three volumes (gdsPolicy preferred,
/// required, absent), stages them (mkfs.ext4, mount data=ordered), publishes each, prints what
/// the gate said, times NodePublish, and leaves the `preferred` volume staged for doctor: its
/// staging path goes to $GDS_H200_WORK/staged-path.
#[tokio::test]
#[ignore]
async fn h200_flow() {
    let socket = PathBuf::from(std::env::var("GDS_H200_SOCKET").expect("GDS_H200_SOCKET"));
    let work = PathBuf::from(std::env::var("GDS_H200_WORK").expect("GDS_H200_WORK"));
    let mut c = gds_csi::client::Clients::connect(&socket).await.unwrap();
    for _ in 0..100 {
        let ready = c
            .identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready;
        if ready == Some(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = c
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut topo: Vec<_> = info
        .accessible_topology
        .unwrap()
        .segments
        .into_iter()
        .collect();
    topo.sort();
    println!("NodeGetInfo topology: {topo:?}");
    for (name, policy) in [
        ("h200-preferred", Some("preferred")),
        ("h200-required", Some("required")),
        ("h200-off", None),
    ] {
        let params: HashMap<String, String> = policy
            .map(|p| ("gdsPolicy".to_string(), p.to_string()))
            .into_iter()
            .collect();
        let vol = c
            .controller
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 64 << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap()],
                parameters: params,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let staging = work.join(format!("kubelet/staging/{name}"));
        std::fs::create_dir_all(&staging).unwrap();
        c.node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: vol.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await
            .unwrap();
        let line = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .find(|l| l.contains(&staging.display().to_string()))
            .map(str::to_string)
            .unwrap_or_default();
        println!(
            "\n== {name} (gdsPolicy {policy:?}) volume {}\n   staged: {line}",
            vol.volume_id
        );
        let mut times = Vec::new();
        for i in 0..6 {
            let target = work.join(format!("kubelet/pods/{name}-{i}/vol"));
            let req = NodePublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap()),
                ..Default::default()
            };
            let t = Instant::now();
            let res = c.node.node_publish_volume(req).await;
            let el = t.elapsed();
            times.push(el);
            match res {
                Ok(_) => {
                    let st = c
                        .node
                        .node_get_volume_stats(NodeGetVolumeStatsRequest {
                            volume_id: vol.volume_id.clone(),
                            volume_path: target.display().to_string(),
                            staging_target_path: String::new(),
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    if i == 0 {
                        println!(
                            "   NodePublishVolume OK in {:.1} ms; volume_condition: {:?}",
                            el.as_secs_f64() * 1e3,
                            st.volume_condition
                        );
                    }
                    c.node
                        .node_unpublish_volume(NodeUnpublishVolumeRequest {
                            volume_id: vol.volume_id.clone(),
                            target_path: target.display().to_string(),
                        })
                        .await
                        .unwrap();
                }
                Err(e) => {
                    if i == 0 {
                        println!(
                            "   NodePublishVolume {:?} in {:.1} ms:\n{}",
                            e.code(),
                            el.as_secs_f64() * 1e3,
                            e.message()
                        );
                    }
                }
            }
        }
        let first = times[0];
        let mut rest = times[1..].to_vec();
        println!(
            "   NodePublish latency: first {:.1} ms, median of next {} {:.1} ms",
            first.as_secs_f64() * 1e3,
            rest.len(),
            median(&mut rest).as_secs_f64() * 1e3
        );
        if policy == Some("preferred") {
            std::fs::write(work.join("staged-path"), staging.display().to_string()).unwrap();
        }
    }
}
