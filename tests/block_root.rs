//! Root-only tests: the real `gds-csi` binary on real loop devices, with real mkfs
//! and real mounts, driven through its CSI socket. Without root they report a skip.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gds_csi::client::Clients;
use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::*;
use sha2::{Digest, Sha256};
use tonic::Code;

const SIZE: u64 = 64 << 20;

struct Rig {
    dir: tempfile::TempDir,
    loops: Vec<PathBuf>,
    child: Option<Child>,
    starts: usize,
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

impl Rig {
    fn new(devices: usize) -> Option<Rig> {
        if !is_root() {
            eprintln!("skipped: needs root for loop devices and mounts");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-root-")
            .tempdir_in("/tmp")
            .unwrap();
        let mut loops = Vec::new();
        for i in 0..devices {
            let img = dir.path().join(format!("dev{i}.img"));
            fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
            loops.push(PathBuf::from(run(
                "losetup",
                &["--find", "--show", img.to_str().unwrap()],
            )));
        }
        Some(Rig {
            dir,
            loops,
            child: None,
            starts: 0,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn socket(&self) -> PathBuf {
        self.path("csi.sock")
    }

    async fn start(&mut self) -> Clients {
        self.starts += 1;
        let log = fs::File::create(self.path(&format!("driver{}.log", self.starts))).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gds-csi"));
        cmd.args(["serve", "--mode", "all", "--node-id", "node-a"])
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket().display()))
            .arg("--state-dir")
            .arg(self.path("state"))
            .arg("--allowed-path-root")
            .arg(self.dir.path());
        for dev in &self.loops {
            cmd.arg("--pool-device").arg(dev);
        }
        self.child = Some(cmd.stdout(Stdio::null()).stderr(log).spawn().unwrap());
        for _ in 0..100 {
            if let Ok(mut c) = Clients::connect(&self.socket()).await {
                if let Ok(r) = c.identity.probe(ProbeRequest {}).await {
                    if r.into_inner().ready == Some(true) {
                        return c;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("driver did not become ready");
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// How many times any run of the driver formatted a device.
    fn mkfs_count(&self) -> usize {
        (1..=self.starts)
            .map(|i| {
                fs::read_to_string(self.path(&format!("driver{i}.log")))
                    .unwrap_or_default()
                    .matches("formatting fresh device")
                    .count()
            })
            .sum()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.kill9();
        let prefix = self.dir.path().to_string_lossy().to_string();
        let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort();
        for m in mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        for dev in &self.loops {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

fn mount_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn create_req(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

fn stage_req(id: &str, staging: &Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

fn publish_req(id: &str, staging: &Path, target: &Path) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        target_path: target.to_str().unwrap().into(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

fn digest_file(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    fs::File::open(path)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    Sha256::digest(&bytes).to_vec()
}

fn mountinfo_line(path: &Path) -> Option<String> {
    let p = path.to_string_lossy().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_restage_and_a_killed_plugin_and_mkfs_runs_once() {
    let Some(mut rig) = Rig::new(1) else { return };
    let mut c = rig.start().await;
    let vol = c
        .controller
        .create_volume(create_req("data"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.capacity_bytes as u64, SIZE);
    let id = vol.volume_id;
    let (staging, target) = (rig.path("staging/v"), rig.path("pods/p1/mount"));
    fs::create_dir_all(&staging).unwrap();
    c.node
        .node_stage_volume(stage_req(&id, &staging))
        .await
        .unwrap();
    let line = mountinfo_line(&staging).expect("staged");
    assert!(
        line.contains(" - ext4 ") && line.contains("data=ordered"),
        "{line}"
    );
    c.node
        .node_publish_volume(publish_req(&id, &staging, &target))
        .await
        .unwrap();

    let payload: Vec<u8> = (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(target.join("weights.bin"), &payload).unwrap();
    let want = Sha256::digest(&payload).to_vec();

    // Unpublish, unstage, stage and publish again: same data, no second mkfs.
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_str().unwrap().into(),
        })
        .await
        .unwrap();
    assert!(!target.exists(), "unpublish removes the target");
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await
        .unwrap();
    assert!(mountinfo_line(&staging).is_none());
    c.node
        .node_stage_volume(stage_req(&id, &staging))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req(&id, &staging, &target))
        .await
        .unwrap();
    assert_eq!(digest_file(&target.join("weights.bin")), want);

    // SIGKILL the plugin while the volume is published, then restart it.
    rig.kill9();
    let mut c = rig.start().await;
    assert_eq!(
        digest_file(&target.join("weights.bin")),
        want,
        "mounts outlive the plugin"
    );
    for _ in 0..3 {
        c.node
            .node_stage_volume(stage_req(&id, &staging))
            .await
            .unwrap();
        c.node
            .node_publish_volume(publish_req(&id, &staging, &target))
            .await
            .unwrap();
    }
    let stats = c
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.to_str().unwrap().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stats.volume_condition.unwrap().abnormal);
    assert!(stats.usage[0].used >= 1 << 20, "{:?}", stats.usage);
    assert_eq!(rig.mkfs_count(), 1, "mkfs ran exactly once");

    // A staged volume cannot be deleted.
    let err = c
        .controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_str().unwrap().into(),
        })
        .await
        .unwrap();
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await
        .unwrap();
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
    // The device went back to the pool, wiped of the volume's filesystem.
    let probe = Command::new("blkid")
        .args(["-p", rig.loops[0].to_str().unwrap()])
        .status()
        .unwrap();
    assert_eq!(probe.code(), Some(2), "no signature left after delete");
    let cap = c
        .controller
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.available_capacity as u64, SIZE);
}

fn device_digest(dev: &Path) -> Vec<u8> {
    digest_file(dev)
}

fn write_partition_table(dev: &Path) {
    let mut child = Command::new("sfdisk")
        .args(["--quiet", dev.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: dos\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_signatures_are_never_allocated_formatted_or_changed() {
    let Some(mut rig) = Rig::new(2) else { return };
    // Device 0 carries a partition table before the plugin ever sees it.
    write_partition_table(&rig.loops[0]);
    let before0 = device_digest(&rig.loops[0]);
    let mut c = rig.start().await;
    let cap = c
        .controller
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        cap.available_capacity as u64, SIZE,
        "only the clean device counts"
    );

    // The clean device is allocated; then someone writes a partition table onto it.
    let vol = c
        .controller
        .create_volume(create_req("first"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    write_partition_table(&rig.loops[1]);
    let before1 = device_digest(&rig.loops[1]);
    let staging = rig.path("staging/first");
    fs::create_dir_all(&staging).unwrap();
    let err = c
        .node
        .node_stage_volume(stage_req(&vol.volume_id, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(rig.loops[1].to_str().unwrap()) && err.message().contains("dos"),
        "{}",
        err.message()
    );

    // No device left that is clean: CreateVolume says so, naming the refused one.
    let err = c
        .controller
        .create_volume(create_req("second"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("dos"), "{}", err.message());

    assert_eq!(rig.mkfs_count(), 0);
    assert!(mountinfo_line(&staging).is_none());
    assert_eq!(
        device_digest(&rig.loops[0]),
        before0,
        "foreign device untouched"
    );
    assert_eq!(
        device_digest(&rig.loops[1]),
        before1,
        "allocated-then-foreign device untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_and_change_nothing() {
    let Some(mut rig) = Rig::new(1) else { return };
    let mut c = rig.start().await;
    let vol = c
        .controller
        .create_volume(create_req("h"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let staging = rig.path("staging/h");
    let long_id = "x".repeat(4096);
    let cases: Vec<(&str, NodeStageVolumeRequest, Code)> = vec![
        (
            "id with ..",
            stage_req("blk:../../etc:a:node-a", &staging),
            Code::InvalidArgument,
        ),
        (
            "id with NUL",
            stage_req("blk:a\0b:a:node-a", &staging),
            Code::InvalidArgument,
        ),
        (
            "4 KiB id",
            stage_req(&long_id, &staging),
            Code::InvalidArgument,
        ),
        (
            "unknown id",
            stage_req("blk:dev-0000000000000000:0:node-a", &staging),
            Code::NotFound,
        ),
        (
            "other node",
            stage_req("blk:dev-0000000000000000:0:node-b", &staging),
            Code::NotFound,
        ),
        (
            "path outside roots",
            stage_req(&vol.volume_id, Path::new("/etc/gds")),
            Code::InvalidArgument,
        ),
        (
            "relative path",
            NodeStageVolumeRequest {
                staging_target_path: "staging/h".into(),
                ..stage_req(&vol.volume_id, &staging)
            },
            Code::InvalidArgument,
        ),
        (
            "no capability",
            NodeStageVolumeRequest {
                volume_capability: None,
                ..stage_req(&vol.volume_id, &staging)
            },
            Code::InvalidArgument,
        ),
        (
            "injected mount flag",
            NodeStageVolumeRequest {
                volume_capability: Some(VolumeCapability {
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                    access_type: Some(AccessType::Mount(MountVolume {
                        mount_flags: vec!["ro,exec".into()],
                        ..Default::default()
                    })),
                }),
                ..stage_req(&vol.volume_id, &staging)
            },
            Code::InvalidArgument,
        ),
    ];
    let tried = cases.len();
    for (what, req, want) in cases {
        let err = c.node.node_stage_volume(req).await.expect_err(what);
        assert_eq!(err.code(), want, "{what}: {}", err.message());
    }
    let mut params = HashMap::new();
    params.insert("fsType".to_string(), "ext4".to_string());
    params.insert("mountOptions".to_string(), "exec".to_string());
    let err = c
        .controller
        .create_volume(CreateVolumeRequest {
            parameters: params,
            ..create_req("p")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("mountOptions"), "{}", err.message());
    assert!(!staging.exists(), "nothing was created on the host");
    assert_eq!(rig.mkfs_count(), 0);
    eprintln!("hostile requests refused: {}/{}", tried + 1, tried + 1);
}
