//! The GDS gate through the CSI handlers: a driver over a fixture host tree, a recording host
//! double (no real mounts), one real block device node for the pool (any /dev/loopN: the
//! pool only stats it; these tests skip where there is none), and the real `gds-csi
//! cufile-probe` child (with a missing libcufile, a clean LibraryMissing) or a stand-in.
//!
//! Also here, ignored: `publish_latency_bench` (NodePublish medians, gate on vs off) and
//! `h200_flow`, the client half of scripts/h200-gds-check.sh.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Code, Request};

use common::gds_fixture::Tree;
use common::host_double::HostDouble;
use gds_csi::csi::controller_server::Controller;
use gds_csi::csi::node_server::Node;
use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::*;
use gds_csi::gds::gate::{GateConfig, GdsGate};
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::controller::ControllerService;
use gds_csi::service::node::NodeService;
use gds_csi::service::Driver;

const DRIVER: &str = "gds.csi.gds-csi.io";

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
            gds_csi::gds::doctor::probe_prefix(),
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
        listed: vec![dev.clone()],
        nvme_discover: false,
        state_dir: dir.path().join("state"),
    })
    .unwrap();
    let host = Arc::new(HostDouble::tracking(HashMap::from([(
        dev.clone(),
        (major, minor),
    )])));
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
    // Not ready: no readiness keys at all (never "false", which the kubelet could not
    // later change to "true").
    assert_eq!(topo.get(&format!("{DRIVER}/gds-nvme")), None);
    assert_eq!(topo.get(&format!("{DRIVER}/gds-nfs-rdma")), None);
    assert_eq!(topo.len(), 1);
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

    // The mark lives as long as the staged volume: unstaging forgets it (persisted marks
    // of volumes long gone would otherwise pile up in the state dir).
    let gate = r.driver.gds_gate.as_ref().unwrap();
    assert!(gate.compat_reason(&id).is_some());
    r.unpublish(&id, &target).await;
    r.node
        .node_unstage_volume(Request::new(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        }))
        .await
        .unwrap();
    assert_eq!(gate.compat_reason(&id), None);
}

#[tokio::test]
async fn disabled_publishes_without_checks_and_absent_policy_means_required() {
    let Some(r) = rig(false, Probe::Stub("compat"), Duration::from_secs(60)).await else {
        return;
    };
    let (id, staging) = r.create_and_stage(&[("gdsPolicy", "disabled")]).await;
    let target = r.target(1);
    r.publish(&id, &staging, &target).await.unwrap();
    assert_eq!(r.tree.probe_runs(), 0);
    let c = r.condition(&id, &target).await;
    assert!(!c.abnormal, "{c:?}");

    // No gdsPolicy at all: the gate is on (the default is required) and refuses this node.
    let Some(r) = rig(false, Probe::Stub("compat"), Duration::from_secs(60)).await else {
        return;
    };
    let (id, staging) = r.create_and_stage(&[]).await;
    let err = r.publish(&id, &staging, &r.target(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("gdsPolicy=required"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("\ncufile.probe: "),
        "{}",
        err.message()
    );
    assert_eq!(r.tree.probe_runs(), 1);
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
    assert_eq!(topo.get(&format!("{DRIVER}/gds-nfs-rdma")), None);
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
            "gdsPolicy absent (= required), fixtures pass, probe cached",
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
    let mut c = gds_csi::csi::Clients::connect(&socket).await.unwrap();
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
        // Off must be said: no gdsPolicy means required.
        ("h200-off", Some("disabled")),
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

// ----- node states, for the gate and for doctor ------------------------------------------------

#[path = "../crates/gds-check/tests/fake/nvfs_double.rs"]
mod nvfs_double;

/// The fake libcufile (also the CUDA calls of the read check), built once.
fn fake_cufile() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libfakecufile-gate.so");
    BUILD.call_once(|| {
        let src = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crates/gds-check/tests/fake/fake_cufile.c"
        );
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cc failed to build the fake libcufile");
    });
    out
}

/// One node state: what the host looks like, what the fake libcufile does, and the verdict.
struct NodeState {
    name: &'static str,
    /// Storage drivers whose registration symbols the kernel exports (nvidia-fs double);
    /// None: nvidia_fs not loaded.
    nvfs: Option<&'static [&'static str]>,
    cufile_json: &'static str,
    /// The volume is an NVMe namespace (else a loop device).
    nvme: bool,
    /// Some: the volume is md RAID0 over two namespaces instead; whether the udev rule for RAID
    /// volumes exported its members.
    md_rule: Option<bool>,
    udev: bool,
    /// Extra fixture files (path, text).
    extra: &'static [(&'static str, &'static str)],
    /// Env for the fake libcufile; `FAKE_CUFILE_GDS_DEVS` is added when `gds_dev`.
    env: &'static [(&'static str, &'static str)],
    /// The fake libcufile has a GDS path for the volume's filesystem.
    gds_dev: bool,
    /// None: ready; Some(ids): refused, naming at least these checks.
    refused: Option<&'static [&'static str]>,
}

const CUFILE_P2P: &str =
    r#"{ "properties": { "use_pci_p2pdma": true, "allow_compat_mode": false } }"#;
/// P2PDMA mode with the md RAID0 route's key (`block.raid.use_pci_p2pdma`).
const CUFILE_P2P_RAID: &str = r#"{ "properties": { "use_pci_p2pdma": true, "allow_compat_mode": false },
     "block": { "raid": { "use_pci_p2pdma": true } } }"#;
const CUFILE_FORCE: &str =
    r#"{ "properties": { "force_compat_mode": true, "allow_compat_mode": false } }"#;

/// What NVIDIA's P2PDMA troubleshooting section asks of a node without nvidia_fs, on kernel
/// `release`.
fn p2p_node(release: &str) -> &'static [(&'static str, &'static str)] {
    let release: &'static str = Box::leak(format!("{release}\n").into_boxed_str());
    Box::leak(
        vec![
            ("proc/sys/kernel/osrelease", release),
            ("proc/kallsyms", "0000000000000000 D p2pdma_pgmap_ops\n"),
            ("proc/modules", "nvme 1 0 - Live\n"),
            (
                "proc/driver/nvidia/version",
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06\n",
            ),
            (
                "proc/driver/nvidia/params",
                "RegistryDwords: \"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\"\n",
            ),
            ("sys/module/nvme_core/parameters/multipath", "N\n"),
        ]
        .into_boxed_slice(),
    )
}

fn node_states(vol: &Path) -> Vec<NodeState> {
    let deny: &'static str = Box::leak(
        format!(
            r#"{{ "properties": {{ "allow_compat_mode": false }}, "denylist": {{ "mounts": ["{}"] }} }}"#,
            vol.display()
        )
        .into_boxed_str(),
    );
    let gds = common::gds_fixture::CUFILE_STRICT;
    vec![
        NodeState {
            name: "idle GDS node",
            nvfs: Some(&["nvme", "nvme_rdma"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: None,
            extra: &[],
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: None,
        },
        NodeState {
            name: "nvme not registered",
            nvfs: Some(&["nvme_rdma"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: None,
            extra: &[],
            env: &[],
            gds_dev: false,
            refused: Some(&["nvidia_fs.storage_driver", "nvme.p2pdma", "cufile.probe"]),
        },
        NodeState {
            name: "P2PDMA on a backported kernel",
            nvfs: None,
            cufile_json: CUFILE_P2P,
            nvme: true,
            udev: true,
            md_rule: None,
            extra: p2p_node("5.14.0-427.13.1.el9_4.x86_64"),
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: None,
        },
        NodeState {
            name: "compat forced",
            nvfs: Some(&["nvme"]),
            cufile_json: CUFILE_FORCE,
            nvme: true,
            udev: true,
            md_rule: None,
            extra: &[],
            env: &[],
            gds_dev: false,
            refused: Some(&["cufile.force_compat", "cufile.probe"]),
        },
        NodeState {
            name: "denylisted mount",
            nvfs: Some(&["nvme"]),
            cufile_json: deny,
            nvme: true,
            udev: true,
            md_rule: None,
            extra: &[],
            env: &[
                ("FAKE_CUFILE_DSTATUS", "16"),
                ("FAKE_CUFILE_REG_ERR", "5034"),
            ],
            gds_dev: true,
            refused: Some(&["volume.denylist", "cufile.probe"]),
        },
        NodeState {
            name: "loop device under a GDS-capable driver",
            nvfs: Some(&["nvme"]),
            cufile_json: gds,
            nvme: false,
            udev: true,
            md_rule: None,
            extra: &[],
            // The driver advertises NVMe; only the per-file strict probe tells.
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: false,
            refused: Some(&["cufile.probe"]),
        },
        NodeState {
            name: "no udev entry for the volume",
            nvfs: Some(&["nvme"]),
            cufile_json: gds,
            nvme: true,
            udev: false,
            md_rule: None,
            extra: &[],
            env: &[
                ("FAKE_CUFILE_DSTATUS", "16"),
                ("FAKE_CUFILE_REG_ERR", "5027"),
            ],
            gds_dev: true,
            refused: Some(&["volume.udev", "cufile.probe"]),
        },
        // mdadm's stock rule exports no members (`--no-devices`); libcufile then
        // cannot verify the RAID group and leaves it to compat mode.
        NodeState {
            name: "md RAID0 without the udev rule for RAID volumes",
            nvfs: Some(&["nvme"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: Some(false),
            extra: &[],
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: false,
            refused: Some(&["volume.md_udev", "volume.md_udev_rule", "cufile.probe"]),
        },
        NodeState {
            name: "md RAID0 with the udev rule for RAID volumes",
            nvfs: Some(&["nvme"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: &[],
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: None,
        },
        // A stripe's md RAID0: level 0 only; the array must run with every member; every member's
        // driver registered with nvidia_fs. The fake libcufile would say true GDS each time:
        // the refusal comes from the checks alone.
        NodeState {
            name: "md RAID1 over NVMe partitions",
            nvfs: Some(&["nvme"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: &[("sys/devices/virtual/block/md0/md/level", "raid1\n")],
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: Some(&["volume.block_stack"]),
        },
        NodeState {
            name: "md RAID0 that lost a member (array_state broken)",
            nvfs: Some(&["nvme"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: &[("sys/devices/virtual/block/md0/md/array_state", "broken\n")],
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: Some(&["volume.md_members"]),
        },
        NodeState {
            name: "md RAID0 whose members' nvme driver is not registered with nvidia_fs",
            nvfs: Some(&["nvme_rdma"]),
            cufile_json: gds,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: &[],
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: Some(&["volume.md_members", "nvidia_fs.storage_driver"]),
        },
        // md RAID0 in P2PDMA mode (no nvidia_fs): on a kernel that may pass P2PDMA through md
        // (7.1 or newer) with the RAID key, the checks pass the stripe pending the strict probe,
        // and the probe decides.
        NodeState {
            name: "P2PDMA md RAID0 with block.raid.use_pci_p2pdma on kernel 7.2",
            nvfs: None,
            cufile_json: CUFILE_P2P_RAID,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: p2p_node("7.2.0"),
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: None,
        },
        NodeState {
            name: "P2PDMA md RAID0 with the RAID key on kernel 7.2, no GDS path for the probe",
            nvfs: None,
            cufile_json: CUFILE_P2P_RAID,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: p2p_node("7.2.0"),
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: false,
            refused: Some(&["cufile.probe"]),
        },
        // Without the key, or on an older kernel, the checks refuse it whatever the probe says.
        NodeState {
            name: "P2PDMA md RAID0 without block.raid.use_pci_p2pdma",
            nvfs: None,
            cufile_json: CUFILE_P2P,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: p2p_node("7.2.0"),
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: Some(&["volume.p2pdma"]),
        },
        NodeState {
            name: "P2PDMA md RAID0 with the RAID key on kernel 6.8",
            nvfs: None,
            cufile_json: CUFILE_P2P_RAID,
            nvme: true,
            udev: true,
            md_rule: Some(true),
            extra: p2p_node("6.8.0-45-generic"),
            env: &[("FAKE_CUFILE_DSTATUS", "16")],
            gds_dev: true,
            refused: Some(&["volume.p2pdma"]),
        },
    ]
}

/// A laid-out node state, with the cuFile library and the probe command both the gate
/// and doctor run.
struct LaidOut<'a> {
    tree: &'a Tree,
    vol: &'a Path,
    lib: &'a Path,
    exe: &'a Path,
    prefix: &'a [String],
}

impl LaidOut<'_> {
    /// The gate under `Required` publishes `volume_id` exactly when `refused` is `None`,
    /// and otherwise names each of its check ids.
    async fn gate_agrees(
        &self,
        name: &str,
        volume_id: &str,
        backend: gds_check::Backend,
        refused: Option<&[&str]>,
    ) {
        let gate = GdsGate::new(GateConfig {
            paths: self.tree.paths.clone(),
            probe_exe: self.exe.to_owned(),
            probe_prefix: self.prefix.to_vec(),
            cufile_library: Some(self.lib.to_owned()),
            probe_timeout: Duration::from_secs(20),
            cache_ttl: Duration::ZERO,
        });
        let vol = gds_csi::gds::gate::MountedVolume {
            id: volume_id.into(),
            backend,
            mount_path: Some(self.vol.to_owned()),
            device: None,
        };
        let got = gate
            .check_publish(&vol, gds_csi::gds::gate::Policy::Required)
            .await;
        match (refused, &got) {
            (None, Ok(o)) => assert_eq!(
                o.verdict,
                gds_csi::gds::gate::Verdict::Ready,
                "{name}: {}",
                o.report.to_text()
            ),
            (Some(ids), Err(e)) => {
                assert!(
                    matches!(e, gds_csi::error::Error::GdsRequired { .. }),
                    "{name}: not FAILED_PRECONDITION: {e:?}"
                );
                let msg = e.to_string();
                for id in ids {
                    assert!(
                        msg.contains(&format!("\n{id}: ")),
                        "{name}: {id} not named:\n{msg}"
                    );
                }
            }
            (want, got) => panic!("{name}: wanted refused={want:?}, got {got:?}"),
        }
    }

    /// `doctor --probe` finds the node ready exactly when `refused` is `None`; returns its
    /// diagnosis.
    fn doctor_agrees(
        &self,
        name: &str,
        backend: gds_check::Backend,
        refused: Option<&[&str]>,
    ) -> gds_csi::gds::doctor::Diagnosis {
        let args = doctor_args(backend, self.tree, self.vol, self.lib);
        let d = gds_csi::gds::doctor::diagnose(&args, self.exe, self.prefix);
        assert_eq!(
            d.ready(),
            refused.is_none(),
            "{name}: doctor says\n{}",
            d.to_text()
        );
        d
    }
}

/// `gds-csi doctor --probe` on `vol` for `backend`, against the host laid out in `tree`
/// and the cuFile library `lib`.
fn doctor_args(
    backend: gds_check::Backend,
    tree: &Tree,
    vol: &Path,
    lib: &Path,
) -> gds_csi::runtime::config::DoctorArgs {
    gds_csi::runtime::config::DoctorArgs {
        backend,
        path: Some(vol.to_owned()),
        json: false,
        probe: true,
        host_proc: tree.paths.proc_root.clone(),
        host_sys: tree.paths.sys_root.clone(),
        host_dev: tree.paths.dev_root.clone(),
        pod: None,
        runtime_state_dir: "/nonexistent".into(),
        kubelet_dir: "/nonexistent".into(),
        driver: gds_csi::runtime::config::DriverName {
            name: "gds.csi.gds-csi.io".into(),
        },
        state_dir: "/nonexistent".into(),
        gds: gds_csi::runtime::config::GdsArgs {
            cufile_json: tree.paths.cufile_json.clone(),
            udev_data_dir: tree.paths.udev_data_dir.clone(),
            udev_rules_dirs: tree.paths.udev_rules_dirs.clone(),
            cufile_library: Some(lib.to_owned()),
            probe_timeout: Duration::from_secs(20),
        },
    }
}

/// Lays out a state; returns the double (kept alive for the checks) and the probe command.
fn lay_out(
    st: &NodeState,
    tree: &Tree,
    vol: &Path,
) -> (Option<nvfs_double::NvfsDouble>, PathBuf, Vec<String>) {
    tree.gpu_node().write("etc/cufile.json", st.cufile_json);
    let double = st.nvfs.map(|regs| {
        nvfs_double::NvfsDouble::start(&tree.root, regs, 1, false)
            .unwrap_or_else(|e| panic!("nvidia-fs double needs fanotify (root): {e}"))
    });
    if let Some(rule) = st.md_rule {
        tree.md_volume(vol, rule);
    } else if st.nvme {
        tree.nvme_volume(vol, st.udev);
    } else {
        tree.write(
            "sys/devices/virtual/block/loop0/loop/backing_file",
            "/var/img\n",
        )
        .link("sys/dev/block/7:0", "../../devices/virtual/block/loop0")
        .mountinfo(&format!(
            "400 29 7:0 / {} rw - ext4 /dev/loop0 rw,data=ordered",
            vol.display()
        ));
        if st.udev {
            tree.write(
                "run/udev/data/b7:0",
                "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n",
            );
        }
    }
    for (rel, text) in st.extra {
        tree.write(rel, text);
    }
    let lib = fake_cufile();
    let mut script = String::new();
    for (k, v) in st.env {
        script += &format!("export {k}='{v}'; ");
    }
    if st.gds_dev {
        let d = std::fs::metadata(vol).unwrap().dev();
        script += &format!(
            "export FAKE_CUFILE_GDS_DEVS={}:{}; ",
            libc::major(d),
            libc::minor(d)
        );
    }
    script += &format!(
        "exec {} cufile-probe -- \"$@\" --cuda-library {}",
        env!("CARGO_BIN_EXE_gds-csi"),
        lib.display()
    );
    (
        double,
        "/bin/sh".into(),
        vec!["-c".into(), script, "sh".into()],
    )
}

/// The node-state table: each node state gets the same verdict from the gate (NodePublish's
/// check) and from `gds-csi doctor --probe --path`, and a refusal names the checks that failed.
#[tokio::test]
async fn node_state_table_gate_and_doctor_agree() {
    let lib = fake_cufile();
    for i in 0..node_states(Path::new("/x")).len() {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let tree = Tree::new(&dir.path().join("host"));
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        let st = node_states(&vol).remove(i);
        let (double, exe, prefix) = lay_out(&st, &tree, &vol);

        let node = LaidOut {
            tree: &tree,
            vol: &vol,
            lib: &lib,
            exe: &exe,
            prefix: &prefix,
        };
        node.gate_agrees(st.name, "vol-t", gds_check::Backend::Nvme, st.refused)
            .await;
        // doctor, the same way.
        let d = node.doctor_agrees(st.name, gds_check::Backend::Nvme, st.refused);
        if let Some(ids) = st.refused {
            let failed: Vec<&str> = d.report.failures().iter().map(|c| c.id).collect();
            for id in ids {
                assert!(
                    failed.contains(id),
                    "{}: doctor did not fail {id}: {failed:?}",
                    st.name
                );
            }
        }
        if let Some(d) = &double {
            assert!(
                d.opens_seen() >= 1,
                "{}: nobody held a device open",
                st.name
            );
        }
        // Nothing of the probe's is left on the volume.
        assert_eq!(std::fs::read_dir(&vol).unwrap().count(), 0, "{}", st.name);
        println!(
            "{}: {}",
            st.name,
            if st.refused.is_none() {
                "ready"
            } else {
                "refused"
            }
        );
    }
}

/// A stripe volume's md RAID0, one breakage at a time. Each refusal is
/// FAILED_PRECONDITION naming what is wrong and how to fix it, and `doctor --json` carries the
/// md checks with their evidence. The tree is laid out as drivers/md/md.c shows an array (this
/// kernel has no md driver; the VM rig's stripe scenario has a real one).
#[tokio::test]
async fn md_raid0_refusals_name_the_fix_and_doctor_json_carries_them() {
    let lib = fake_cufile();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tree = Tree::new(&dir.path().join("host"));
    let vol = dir.path().join("vol");
    std::fs::create_dir_all(&vol).unwrap();
    let st = node_states(&vol)
        .into_iter()
        .find(|s| s.md_rule == Some(true) && s.refused.is_none())
        .unwrap();
    let (_double, exe, prefix) = lay_out(&st, &tree, &vol);
    let node = LaidOut {
        tree: &tree,
        vol: &vol,
        lib: &lib,
        exe: &exe,
        prefix: &prefix,
    };
    let md = "sys/devices/virtual/block/md0/md";
    // (what breaks, file, broken text, good text, words the refusal must hold)
    let rows: [(&str, String, &str, &str, &[&str]); 4] = [
        (
            "level",
            format!("{md}/level"),
            "raid10\n",
            "raid0\n",
            &["volume.block_stack: ", "md0 is raid10 (md/level)", "-> put the volume on md RAID0"],
        ),
        (
            "faulty member",
            format!("{md}/dev-nvme1n1p1/state"),
            "faulty\n",
            "in_sync\n",
            &["volume.md_members: ", "member nvme1n1p1 is faulty", "-> replace or bring back"],
        ),
        (
            "masked rule",
            "etc/udev/rules.d/63-md-raid-arrays.rules".into(),
            "# masked\n",
            "IMPORT{program}=\"/sbin/mdadm --detail --export $devnode\"\n",
            &["volume.md_udev_rule: ", "no rule in", "-> install mdadm and"],
        ),
        (
            "members missing from the udev entry",
            "run/udev/data/b9:0".into(),
            "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:MD_LEVEL=raid0\nE:MD_DEVICES=2\n",
            "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:MD_LEVEL=raid0\nE:MD_DEVICES=2\n\
             E:MD_DEVICE_dev_nvme0n1p1_DEV=/dev/nvme0n1p1\nE:MD_DEVICE_dev_nvme1n1p1_DEV=/dev/nvme1n1p1\n",
            &["volume.md_udev: ", "--no-devices", "mdadm --detail --export"],
        ),
    ];
    for (what, rel, broken, good, words) in rows {
        tree.write(&rel, good);
        node.gate_agrees(what, "md-t", gds_check::Backend::Nvme, None)
            .await;
        tree.write(&rel, broken);
        let gate = GdsGate::new(GateConfig {
            paths: tree.paths.clone(),
            probe_exe: exe.clone(),
            probe_prefix: prefix.clone(),
            cufile_library: Some(lib.clone()),
            probe_timeout: Duration::from_secs(20),
            cache_ttl: Duration::ZERO,
        });
        let mounted = gds_csi::gds::gate::MountedVolume::block("md-t".into(), Some(&vol), 9, 0);
        let err = gate
            .check_publish(&mounted, gds_csi::gds::gate::Policy::Required)
            .await
            .expect_err(what);
        let msg = err.to_string();
        assert_eq!(tonic::Status::from(err).code(), Code::FailedPrecondition);
        for w in words {
            assert!(msg.contains(w), "{what}: {w:?} not in\n{msg}");
        }
        // doctor --json: every md check, with its status and evidence.
        let d = node.doctor_agrees(what, gds_check::Backend::Nvme, Some(&[]));
        assert!(
            d.to_text().contains("* md RAID volume: md0 (raid"),
            "{what}: {}",
            d.to_text()
        );
        let v: serde_json::Value = serde_json::from_str(&d.to_json()).unwrap();
        let ids: Vec<&str> = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["id"].as_str())
            .collect();
        for id in ["volume.md_members", "volume.md_udev", "volume.md_udev_rule"] {
            assert!(
                ids.contains(&id),
                "{what}: doctor --json lacks {id}: {ids:?}"
            );
        }
        assert!(
            v["failed"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().is_some_and(|f| f.starts_with(words[0]))),
            "{what}: {}",
            v["failed"]
        );
        tree.write(&rel, good);
    }
}

/// The NFS gate, as the block gate is tested: one verdict per node state from the
/// gate and from doctor, over the nvidia-fs double and the real probe child. The VM rig runs
/// the real NFS over RDMA; here the mount is a fixture line and the probe's file a local one.
#[tokio::test]
async fn nfs_node_states_gate_and_doctor_agree() {
    let lib = fake_cufile();
    // (name, registrable, RDMA device, mount options, refused ids)
    type Row = (
        &'static str,
        &'static [&'static str],
        bool,
        &'static str,
        Option<&'static [&'static str]>,
    );
    let rows: [Row; 4] = [
        (
            "NFS over RDMA ready",
            &["rpcrdma"],
            true,
            "rw,vers=4.1,proto=rdma,port=20049",
            None,
        ),
        (
            "rpcrdma not registered",
            &["nvme"],
            true,
            "rw,vers=4.1,proto=rdma,port=20049",
            Some(&["nvidia_fs.storage_driver", "cufile.probe"]),
        ),
        (
            "mounted over TCP",
            &["rpcrdma"],
            true,
            "rw,vers=4.1,proto=tcp",
            Some(&["volume.filesystem"]),
        ),
        (
            "no RDMA device",
            &["rpcrdma"],
            false,
            "rw,vers=4.1,proto=rdma,port=20049",
            Some(&["rdma.devices"]),
        ),
    ];
    for (name, regs, rdma, opts, refused) in rows {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let tree = Tree::new(&dir.path().join("host"));
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        tree.gpu_node().mountinfo(&format!(
            "200 29 0:55 / {} rw,relatime - nfs4 10.0.0.1:/export/v {opts}",
            vol.display()
        ));
        if rdma {
            tree.write("sys/class/infiniband/rxe0/ports/1/state", "4: ACTIVE\n");
        }
        let _double = nvfs_double::NvfsDouble::start(&tree.root, regs, 1, false)
            .unwrap_or_else(|e| panic!("nvidia-fs double needs fanotify (root): {e}"));
        // The fake libcufile has an NFS GDS path (dstatusflags bit 2) only with rpcrdma.
        let d = std::fs::metadata(&vol).unwrap().dev();
        let dstatus = if regs.contains(&"rpcrdma") { 4 } else { 0 };
        let script = format!(
            "export FAKE_CUFILE_DSTATUS={dstatus} FAKE_CUFILE_GDS_DEVS={}:{}; exec {} cufile-probe -- \"$@\" --cuda-library {}",
            libc::major(d),
            libc::minor(d),
            env!("CARGO_BIN_EXE_gds-csi"),
            lib.display()
        );
        let (exe, prefix) = (
            PathBuf::from("/bin/sh"),
            vec!["-c".to_string(), script, "sh".into()],
        );
        let node = LaidOut {
            tree: &tree,
            vol: &vol,
            lib: &lib,
            exe: &exe,
            prefix: &prefix,
        };
        node.gate_agrees(name, "nfs-t", gds_check::Backend::NfsRdma, refused)
            .await;
        node.doctor_agrees(name, gds_check::Backend::NfsRdma, refused);
        println!(
            "{name}: {}",
            if refused.is_none() {
                "ready"
            } else {
                "refused"
            }
        );
    }
}
