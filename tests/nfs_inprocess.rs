//! In-process gRPC tests of the NFS backend: the real services on a unix socket, over
//! a `Host` double whose `mount_nfs` records an nfs4 mount (with the super options the
//! "kernel" negotiated) and whose export is a local directory. No root, no NFS client.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::host_double::HostDouble;
use gds_csi::csi::volume_capability::{
    access_mode::Mode as AccessModeKind, AccessMode, AccessType, BlockVolume, MountVolume,
};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::os::MountEntry;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::Driver;
use gds_csi::volume::nfs::NfsStore;
use tokio::sync::Semaphore;
use tonic::Code;

struct Harness {
    dir: tempfile::TempDir,
    host: Arc<HostDouble>,
    c: Clients,
}

async fn harness() -> Harness {
    harness_with(true).await
}

/// `nfs`: whether the driver instance has the NFS backend.
async fn harness_with(nfs: bool) -> Harness {
    harness_in(tempfile::tempdir().unwrap(), nfs, Some(SLOW_CI)).await
}

/// Clone copies wait this long here: a debug build checksums slowly on 2 busy cores.
const SLOW_CI: std::time::Duration = std::time::Duration::from_secs(120);

/// A driver instance on `dir` (a restarted driver finds its state there); `clone_wait`:
/// another wait of a clone's CreateVolume for its copy.
async fn harness_in(
    dir: tempfile::TempDir,
    nfs: bool,
    clone_wait: Option<std::time::Duration>,
) -> Harness {
    let state = dir.path().join("state");
    let host = Arc::new(HostDouble::tracking(HashMap::new()));
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: dir.path().join("sys"),
        host_dev: dir.path().join("dev"),
        listed: vec![],
        nvme_discover: false,
        state_dir: state.clone(),
    })
    .unwrap();
    let mut driver = Driver::new(
        "gds.csi.test".into(),
        "node-a".into(),
        vec![dir.path().join("kubelet")],
        pool,
        host.clone(),
    );
    if nfs {
        let mut store = NfsStore::open(&state, std::time::Duration::from_secs(5)).unwrap();
        if let Some(wait) = clone_wait {
            store = store.with_clone_wait(wait);
        }
        driver = driver.with_nfs(store);
    }
    let driver =
        Arc::new(driver.with_snapshots(gds_csi::snapshot::Snapshots::open(&state).unwrap()));
    // A restarted driver serves on a socket of its own (the first one's server task
    // lives on, unused, as the in-process server cannot be stopped).
    let mut run = dir.path().to_owned();
    while run.join("csi.sock").exists() {
        run = run.join("again");
    }
    std::fs::create_dir_all(&run).unwrap();
    let c = common::serve_in_process(driver, &run).await;
    Harness { dir, host, c }
}

fn cap(mode: AccessModeKind, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })),
    }
}

fn params(extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut p: HashMap<String, String> = [("server", "192.0.2.1"), ("share", "/export")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in extra {
        p.insert(k.to_string(), v.to_string());
    }
    p
}

impl Harness {
    async fn create(
        &self,
        name: &str,
        params: HashMap<String, String>,
        cap: VolumeCapability,
        required: i64,
    ) -> std::result::Result<Volume, tonic::Status> {
        let mut c = self.c.controller.clone();
        c.create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap],
            parameters: params,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().volume.unwrap())
    }

    /// The local directory standing in for the export (the fake mounts nothing).
    fn export(&self) -> PathBuf {
        let dir = self.dir.path().join("state/nfs-exports");
        std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .expect("an export was mounted")
            .unwrap()
            .path()
    }

    fn paths(&self, name: &str) -> (String, String) {
        let k = self.dir.path().join("kubelet");
        (
            k.join(format!("staging/{name}")).display().to_string(),
            k.join(format!("pods/{name}/mount")).display().to_string(),
        )
    }

    async fn stage(
        &self,
        name: &str,
        v: &Volume,
        cap: VolumeCapability,
    ) -> std::result::Result<(), tonic::Status> {
        let (staging, _) = self.paths(name);
        let mut n = self.c.node.clone();
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging,
            volume_capability: Some(cap),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    /// NodePublishVolume of a staged `name` at its target; returns the target path.
    async fn publish(&self, name: &str, v: &Volume, cap: VolumeCapability) -> String {
        let (staging, target) = self.paths(name);
        let mut n = self.c.node.clone();
        n.node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging,
            target_path: target.clone(),
            volume_capability: Some(cap),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        target
    }

    async fn delete(&self, id: &str) -> std::result::Result<(), tonic::Status> {
        let mut c = self.c.controller.clone();
        c.delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(|_| ())
    }
}

#[tokio::test]
async fn create_is_idempotent_multi_node_and_topology_free() {
    let h = harness().await;
    let multi = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h
        .create("vol-1", params(&[]), multi.clone(), 1 << 30)
        .await
        .unwrap();
    assert_eq!(v.volume_id, "nfs:d-rdma-20049-4.1:~export:vol-1:192.0.2.1");
    // No gdsPolicy means required: only nodes ready for GDS over NFS/RDMA.
    assert_eq!(v.accessible_topology.len(), 1);
    assert_eq!(
        v.accessible_topology[0].segments,
        HashMap::from([("gds.csi.test/gds-nfs-rdma".to_string(), "true".to_string())])
    );
    assert_eq!(v.capacity_bytes, 1 << 30);
    let dir = h.export().join("vol-1");
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o777
    );
    // The controller mounted server:/share with the transport defaults.
    let calls = h.host.state.lock().unwrap().nfs_calls.clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "192.0.2.1:/export");
    assert_eq!(calls[0].2, vec!["rdma", "port=20049", "vers=4.1"]);

    let again = h
        .create("vol-1", params(&[]), multi.clone(), 1 << 30)
        .await
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    assert_eq!(
        h.host.state.lock().unwrap().nfs_calls.len(),
        1,
        "export mounted once"
    );
    let bigger = h.create("vol-1", params(&[]), multi.clone(), 2 << 30).await;
    assert_eq!(bigger.unwrap_err().code(), Code::AlreadyExists);
    let other = h
        .create("vol-1", params(&[("onDelete", "retain")]), multi, 1 << 30)
        .await;
    assert_eq!(other.unwrap_err().code(), Code::AlreadyExists);

    let mut c = h.c.controller.clone();
    let list = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1);
    let confirmed = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_capabilities: vec![cap(AccessModeKind::MultiNodeReaderOnly, &[])],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(confirmed.confirmed.is_some());
    let block = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: AccessModeKind::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let refused = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_capabilities: vec![block],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(refused.confirmed.is_none());
}

#[tokio::test]
async fn hostile_parameters_and_options_are_invalid_and_touch_nothing() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeWriter, &[]);
    let cases: Vec<(HashMap<String, String>, VolumeCapability, &str)> = vec![
        (
            params(&[("server", "192.0.2.1,proto=tcp")]),
            w.clone(),
            "n1",
        ),
        (params(&[("share", "/export\nx")]), w.clone(), "n2"),
        (params(&[("share", "/export/../etc")]), w.clone(), "n3"),
        (params(&[("onDelete", "shred")]), w.clone(), "n4"),
        (params(&[("subDir", "fixed")]), w.clone(), "n5"),
        (
            params(&[]),
            cap(AccessModeKind::SingleNodeWriter, &["rdma", "proto=tcp"]),
            "n6",
        ),
        (
            params(&[]),
            cap(AccessModeKind::SingleNodeWriter, &["bg"]),
            "n7",
        ),
        (
            params(&[]),
            cap(AccessModeKind::SingleNodeWriter, &["rdma,port=1"]),
            "n8",
        ),
        (params(&[]), w.clone(), ".."),
        (params(&[]), w.clone(), "a/b"),
    ];
    for (p, c, name) in cases {
        let err = h.create(name, p.clone(), c, 0).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{name} {p:?}: {err:?}");
    }
    assert!(h.host.state.lock().unwrap().nfs_calls.is_empty());
    // share without server is refused for block volumes too.
    let mut only_share = HashMap::new();
    only_share.insert("share".to_string(), "/x".to_string());
    let err = h.create("n9", only_share, w, 0).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_symlink_planted_in_the_export_is_never_followed() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeWriter, &[]);
    h.create("first", params(&[]), w.clone(), 0).await.unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), h.export().join("planted")).unwrap();
    let err = h
        .create("planted", params(&[]), w.clone(), 0)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    // Below a planted parent as well.
    let mut p = params(&[("subDir", "${pvc.metadata.namespace}/${pvc.metadata.name}")]);
    p.insert("csi.storage.k8s.io/pvc/namespace".into(), "planted".into());
    p.insert("csi.storage.k8s.io/pvc/name".into(), "claim".into());
    let err = h.create("pv-2", p, w, 0).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn stage_publish_unstage_with_merged_options() {
    let h = harness().await;
    let w = cap(
        AccessModeKind::MultiNodeMultiWriter,
        &["rdma", "port=20049", "vers=4.1", "nconnect=4"],
    );
    let v = h.create("vol-s", params(&[]), w.clone(), 0).await.unwrap();
    h.stage("vol-s", &v, w.clone()).await.unwrap();
    h.stage("vol-s", &v, w.clone()).await.unwrap();
    let calls = h.host.state.lock().unwrap().nfs_calls.clone();
    assert_eq!(calls.len(), 2, "export + one stage");
    assert_eq!(calls[1].0, "192.0.2.1:/export/vol-s");
    assert_eq!(
        calls[1].2,
        vec!["rdma", "port=20049", "vers=4.1", "nconnect=4"]
    );
    let (staging, target) = h.paths("vol-s");
    let mut n = h.c.node.clone();
    let publish = NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.clone(),
        target_path: target.clone(),
        volume_capability: Some(w.clone()),
        readonly: true,
        volume_context: v.volume_context.clone(),
        ..Default::default()
    };
    n.node_publish_volume(publish.clone()).await.unwrap();
    n.node_publish_volume(publish).await.unwrap();
    let stats = n
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: v.volume_id.clone(),
            volume_path: target.clone(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stats.volume_condition.unwrap().abnormal);
    for _ in 0..2 {
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.clone(),
        })
        .await
        .unwrap();
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap();
    }
    assert!(!Path::new(&target).exists());
    let mounts = h.host.state.lock().unwrap().mounts.len();
    assert_eq!(mounts, 1, "only the controller's export mount is left");
}

/// NodeUnpublishVolume of an NFS volume takes down only its own bind and removes only
/// the target its publish created, through the same path-safe helpers
/// as block volumes.
#[tokio::test]
async fn nfs_unpublish_leaves_other_mounts_and_files_alone() {
    let h = harness().await;
    let w = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h.create("vol-u", params(&[]), w.clone(), 0).await.unwrap();
    h.stage("vol-u", &v, w.clone()).await.unwrap();
    let kubelet = h.dir.path().join("kubelet");
    // Another pod's volume (another share of the same server) and a plain file.
    let other = kubelet.join("pods/other/mount");
    std::fs::create_dir_all(&other).unwrap();
    h.host.state.lock().unwrap().mounts.push(MountEntry {
        major: 0,
        minor: 99,
        root: "/".into(),
        mount_point: other.clone(),
        mount_options: HashMap::from([("rw".to_owned(), None)]),
        fs_type: "nfs4".into(),
        source: Some("192.0.2.1:/export/someone-else".into()),
        super_options: HashMap::new(),
    });
    let config = kubelet.join("config.yaml");
    std::fs::write(&config, b"precious").unwrap();
    let node = h.c.node.clone();
    let unpublish = |target: &Path| {
        let mut n = node.clone();
        let req = NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.display().to_string(),
        };
        async move { n.node_unpublish_volume(req).await.map(drop) }
    };
    let err = unpublish(&other).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    let still = h
        .host
        .state
        .lock()
        .unwrap()
        .mounts
        .iter()
        .any(|m| m.mount_point == other);
    assert!(still, "another volume's mount was taken down");
    unpublish(&config).await.unwrap();
    assert_eq!(std::fs::read(&config).unwrap(), b"precious");

    // Its own publish is undone, and the target it created removed.
    let target = h.publish("vol-u", &v, w).await;
    unpublish(Path::new(&target)).await.unwrap();
    assert!(!Path::new(&target).exists());
}

#[tokio::test]
async fn a_mount_without_rdma_is_taken_down_and_refused() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeWriter, &[]);
    let v = h.create("vol-t", params(&[]), w.clone(), 0).await.unwrap();
    *h.host.negotiate_proto.lock().unwrap() = Some("tcp".into());
    let err = h.stage("vol-t", &v, w).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("proto=tcp"), "{}", err.message());
    let (staging, _) = h.paths("vol-t");
    assert!(!h
        .host
        .state
        .lock()
        .unwrap()
        .mounts
        .iter()
        .any(|m| m.mount_point == Path::new(&staging)));
}

#[tokio::test]
async fn a_hung_mount_blocks_only_its_own_volume() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeWriter, &[]);
    let hung = h.create("vol-h", params(&[]), w.clone(), 0).await.unwrap();
    let fine = h.create("vol-f", params(&[]), w.clone(), 0).await.unwrap();
    let gate = Arc::new(Semaphore::new(0));
    h.host
        .hang_nfs
        .lock()
        .unwrap()
        .insert("192.0.2.1:/export/vol-h".into(), gate.clone());
    let h = Arc::new(h);
    let (h2, v2, w2) = (h.clone(), hung.clone(), w.clone());
    let pending = tokio::spawn(async move { h2.stage("vol-h", &v2, w2).await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    h.stage("vol-f", &fine, w.clone()).await.unwrap();
    let busy = h.stage("vol-h", &hung, w.clone()).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted);
    gate.add_permits(1);
    pending.await.unwrap().unwrap();
}

#[tokio::test]
async fn delete_honours_on_delete_and_is_idempotent() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeWriter, &[]);
    let mut ids = Vec::new();
    for (name, mode) in [("del", "delete"), ("ret", "retain"), ("arc", "archive")] {
        let v = h
            .create(name, params(&[("onDelete", mode)]), w.clone(), 0)
            .await
            .unwrap();
        std::fs::write(h.export().join(name).join("f"), b"x").unwrap();
        ids.push(v.volume_id);
    }
    for id in &ids {
        h.delete(id).await.unwrap();
        h.delete(id).await.unwrap();
    }
    let export = h.export();
    assert!(!export.join("del").exists());
    assert!(export.join("ret/f").exists());
    assert!(!export.join("arc").exists());
    let archived: Vec<String> = std::fs::read_dir(&export)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("archived-arc-"))
        .collect();
    assert_eq!(archived.len(), 1, "{archived:?}");
    assert!(export.join(&archived[0]).join("f").exists());
    let mut c = h.c.controller.clone();
    let list = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.entries.is_empty());
}

/// The server gone after publish (kubernetes#31272, csi-driver-nfs#601): unpublish and
/// unstage must not hang until the kubelet gives up, again and again, leaving the pod
/// in Terminating. After the deadline (the harness's 5 s) the mount is forced, then,
/// as `umount -f` fails too, detached lazily; both calls answer OK.
#[tokio::test]
async fn unmounts_with_the_server_gone_force_then_detach_and_succeed() {
    let h = harness().await;
    let w = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h
        .create("vol-gone", params(&[]), w.clone(), 0)
        .await
        .unwrap();
    h.stage("vol-gone", &v, w.clone()).await.unwrap();
    let target = h.publish("vol-gone", &v, w).await;
    let (staging, _) = h.paths("vol-gone");
    let mut n = h.c.node.clone();
    h.host
        .server_gone
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let within = std::time::Duration::from_secs(30);
    tokio::time::timeout(
        within,
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.clone(),
        }),
    )
    .await
    .expect("unpublish must not hang")
    .unwrap();
    tokio::time::timeout(
        within,
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.clone(),
        }),
    )
    .await
    .expect("unstage must not hang")
    .unwrap();
    let steps = |p: &str| {
        vec![
            format!("umount {p}"),
            format!("umount -f {p}"),
            format!("umount -l {p}"),
        ]
    };
    let mut expected = steps(&target);
    expected.extend(steps(&staging));
    assert_eq!(h.host.calls_of("umount"), expected);
    let left: Vec<PathBuf> = h
        .host
        .state
        .lock()
        .unwrap()
        .mounts
        .iter()
        .map(|m| m.mount_point.clone())
        .collect();
    assert!(
        !left
            .iter()
            .any(|m| m == Path::new(&target) || m == Path::new(&staging)),
        "{left:?}"
    );
    assert!(!Path::new(&target).exists());
}

/// Stage and publish one NFS volume; its target and staging paths.
async fn published(h: &Harness, name: &str) -> (String, String, String) {
    let w = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h.create(name, params(&[]), w.clone(), 0).await.unwrap();
    h.stage(name, &v, w.clone()).await.unwrap();
    let target = h.publish(name, &v, w).await;
    let (staging, _) = h.paths(name);
    (v.volume_id, target, staging)
}

async fn unpublish(h: &Harness, volume: &str, target: &str) -> Result<(), tonic::Status> {
    let mut n = h.c.node.clone();
    let call = n.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: volume.to_owned(),
        target_path: target.to_owned(),
    });
    tokio::time::timeout(std::time::Duration::from_secs(30), call)
        .await
        .expect("unpublish must not hang")
        .map(drop)
}

/// A plain unmount that ran into its own deadline (umount(8) killed at the host's
/// command deadline) escalates like a hung one; once `umount -f` has taken the mount
/// away, nothing is detached lazily.
#[tokio::test]
async fn an_unmount_that_timed_out_is_forced_and_no_more() {
    let h = harness().await;
    let (volume, target, _) = published(&h, "vol-slow").await;
    *h.host.unmount_fails.lock().unwrap() = Some(|| {
        gds_csi::error::CommandError::Timeout {
            command: "umount".into(),
            after: std::time::Duration::from_secs(1),
        }
        .into()
    });
    unpublish(&h, &volume, &target).await.unwrap();
    assert_eq!(
        h.host.calls_of("umount"),
        vec![format!("umount {target}"), format!("umount -f {target}")]
    );
    assert_eq!(h.host.mounts_at(Path::new(&target)), 0);
}

/// A plain unmount refused for another reason (the mount point is busy) is the answer:
/// nothing is forced, the mount stays.
#[tokio::test]
async fn a_busy_unmount_is_reported_not_forced() {
    let h = harness().await;
    let (volume, target, _) = published(&h, "vol-busy").await;
    *h.host.unmount_fails.lock().unwrap() = Some(|| {
        gds_csi::error::HostError::TaskFailed {
            what: "umount".into(),
            why: "target is busy".into(),
        }
        .into()
    });
    let err = unpublish(&h, &volume, &target).await.unwrap_err();
    assert!(err.message().contains("target is busy"), "{err:?}");
    assert_eq!(h.host.calls_of("umount"), vec![format!("umount {target}")]);
    assert_eq!(h.host.mounts_at(Path::new(&target)), 1);
}

/// `umount -f` that answers OK while the mount is still there (another one stacked
/// below) is followed by the lazy detach, within the one call.
#[tokio::test]
async fn a_forced_unmount_that_leaves_the_mount_is_followed_by_a_detach() {
    let h = harness().await;
    let (volume, target, _) = published(&h, "vol-stuck").await;
    h.host
        .server_gone
        .store(true, std::sync::atomic::Ordering::SeqCst);
    h.host
        .force_leaves_mount
        .store(true, std::sync::atomic::Ordering::SeqCst);
    unpublish(&h, &volume, &target).await.unwrap();
    assert_eq!(
        h.host.calls_of("umount"),
        vec![
            format!("umount {target}"),
            format!("umount -f {target}"),
            format!("umount -l {target}"),
        ]
    );
    assert_eq!(h.host.mounts_at(Path::new(&target)), 0);
}

/// NodeGetVolumeStats where the volume's path does not exist (unpublished since):
/// NotFound naming the path (csi-sanity's "volume does not exist on the specified
/// path"), not an abnormal condition of a path that is not there.
#[tokio::test]
async fn stats_of_a_path_that_is_gone_is_not_found() {
    let h = harness().await;
    let (volume, target, _) = published(&h, "vol-where").await;
    unpublish(&h, &volume, &target).await.unwrap();
    assert!(!Path::new(&target).exists());
    let mut n = h.c.node.clone();
    let err = n
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume,
            volume_path: target.clone(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains(&target), "{err:?}");
}

/// A repeated NodePublishVolume (the kubelet retries one whose answer it lost) finds
/// the volume at its target and mounts nothing more.
#[tokio::test]
async fn a_repeated_publish_mounts_once() {
    let h = harness().await;
    let w = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h
        .create("vol-twice", params(&[]), w.clone(), 0)
        .await
        .unwrap();
    h.stage("vol-twice", &v, w.clone()).await.unwrap();
    let target = h.publish("vol-twice", &v, w.clone()).await;
    let binds = h.host.count("bind");
    assert_eq!(h.publish("vol-twice", &v, w).await, target);
    assert_eq!(h.host.count("bind"), binds, "{:?}", h.host.calls());
    assert_eq!(h.host.mounts_at(Path::new(&target)), 1);
}

/// SINGLE_NODE_SINGLE_WRITER counts publications at the paths the driver serves: copies
/// of the volume's mounts that propagation lists elsewhere (a container's root
/// filesystem under containerd's task directory) neither block the first publish nor
/// stand in for it; a second real target is refused, naming the first.
#[tokio::test]
async fn single_writer_ignores_copies_of_its_mounts_propagated_elsewhere() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeSingleWriter, &[]);
    let v = h
        .create("vol-one", params(&[]), w.clone(), 0)
        .await
        .unwrap();
    h.stage("vol-one", &v, w.clone()).await.unwrap();
    let (staging, _) = h.paths("vol-one");
    let rootfs = h.dir.path().join("containerd/k8s.io/c1/rootfs");
    let copy_of = |path: &str| {
        let mut m = h
            .host
            .state
            .lock()
            .unwrap()
            .mounts
            .iter()
            .rev()
            .find(|m| m.mount_point == Path::new(path))
            .cloned()
            .unwrap();
        m.mount_point = rootfs.join(path.trim_start_matches('/'));
        h.host.state.lock().unwrap().mounts.push(m);
    };
    copy_of(&staging);
    let first = h.publish("vol-one", &v, w.clone()).await;
    copy_of(&first);
    assert_eq!(h.publish("vol-one", &v, w.clone()).await, first);
    let second = h.dir.path().join("kubelet/pods/other/mount");
    let mut n = h.c.node.clone();
    let err = n
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging,
            target_path: second.display().to_string(),
            volume_capability: Some(w),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(&format!("published at {first}")),
        "{}",
        err.message()
    );
}

/// A staging directory that holds files is refused (a mount there would hide them):
/// FailedPrecondition naming the path, nothing mounted, the file left as it was.
#[tokio::test]
async fn a_staging_directory_with_files_in_it_is_refused() {
    let h = harness().await;
    let w = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h
        .create("vol-full", params(&[]), w.clone(), 0)
        .await
        .unwrap();
    let (staging, _) = h.paths("vol-full");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(Path::new(&staging).join("keep"), b"operator data").unwrap();
    let err = h.stage("vol-full", &v, w).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("is not empty"), "{err:?}");
    assert!(err.message().contains(&staging), "{err:?}");
    assert_eq!(h.host.mounts_at(Path::new(&staging)), 0);
    assert_eq!(
        std::fs::read(Path::new(&staging).join("keep")).unwrap(),
        b"operator data"
    );
}

/// The chart's per-node external-provisioners take an immediate-binding NFS claim only
/// when GetCapacity says `request <= available` (external-provisioner v6.4.0,
/// pkg/controller/controller.go:1736): NFS capacity is not enforced, so no request may
/// read as too large, while the NVMe answer on the same node stays the pool's.
#[tokio::test]
async fn nfs_get_capacity_never_turns_a_claim_away() {
    let h = harness().await;
    let mut c = h.c.controller.clone();
    let nfs = c
        .get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap(AccessModeKind::MultiNodeMultiWriter, &[])],
            parameters: params(&[]),
            accessible_topology: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nfs.available_capacity, i64::MAX);
    let nvme = c
        .get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap(AccessModeKind::SingleNodeWriter, &[])],
            parameters: HashMap::new(),
            accessible_topology: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nvme.available_capacity, 0, "this harness has an empty pool");
}

/// Teardown needs only the mount table: an instance without the NFS backend still unstages
/// and unpublishes an NFS volume (nothing there is success), while everything that needs
/// the backend is refused.
#[tokio::test]
async fn teardown_works_without_the_nfs_backend() {
    let h = harness_with(false).await;
    let id = "nfs:d-rdma-20049-4.1:~export:vol-1:192.0.2.1";
    let path = |p: &str| h.dir.path().join("kubelet").join(p).display().to_string();
    let mut n = h.c.node.clone();
    n.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: path("pods/p/mount"),
    })
    .await
    .unwrap();
    n.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: path("staging/v"),
    })
    .await
    .unwrap();
    let err = n
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: path("staging/v"),
            volume_capability: Some(cap(AccessModeKind::SingleNodeWriter, &[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("not enabled"), "{err:?}");
    assert_eq!(h.host.count("mount_nfs"), 0);
}

/// Stages and publishes `name`; returns the target path.
async fn stage_and_publish(h: &Harness, name: &str, v: &Volume, w: VolumeCapability) -> String {
    h.stage(name, v, w.clone()).await.unwrap();
    h.publish(name, v, w).await
}

async fn stats_of(h: &Harness, id: &str, path: &str) -> NodeGetVolumeStatsResponse {
    let mut n = h.c.node.clone();
    n.node_get_volume_stats(NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Someone remounted the target over TCP behind the driver (the VM rig does it for real):
/// NodeGetVolumeStats reports it abnormal and says what the kernel negotiated.
#[tokio::test]
async fn stats_of_a_volume_remounted_over_tcp_names_the_proto() {
    let h = harness().await;
    let w = cap(AccessModeKind::SingleNodeWriter, &[]);
    let v = h.create("vol-s", params(&[]), w.clone(), 0).await.unwrap();
    let target = stage_and_publish(&h, "vol-s", &v, w).await;
    let healthy = stats_of(&h, &v.volume_id, &target).await;
    let cond = healthy.volume_condition.unwrap();
    assert!(!cond.abnormal, "{}", cond.message);
    assert_eq!(healthy.usage.len(), 2);
    for m in h.host.state.lock().unwrap().mounts.iter_mut() {
        if m.mount_point == Path::new(&target) {
            m.super_options.insert("proto".into(), Some("tcp".into()));
            m.super_options.insert("port".into(), Some("2049".into()));
        }
    }
    let cond = stats_of(&h, &v.volume_id, &target)
        .await
        .volume_condition
        .unwrap();
    assert!(cond.abnormal);
    assert!(
        cond.message.contains("without RDMA") && cond.message.contains("proto=tcp"),
        "{}",
        cond.message
    );
}

/// The server gone: statvfs of a hard NFS mount blocks in the kernel. NodeGetVolumeStats
/// answers abnormal at the NFS deadline (the harness's 5 s), and a second call while the
/// first statvfs is still stuck answers at once instead of parking one more thread.
#[tokio::test]
async fn stats_with_the_server_gone_answer_abnormal_within_the_deadline() {
    let h = harness().await;
    let w = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let v = h.create("vol-d", params(&[]), w.clone(), 0).await.unwrap();
    let target = stage_and_publish(&h, "vol-d", &v, w).await;
    let gone = |on| {
        h.host
            .server_gone
            .store(on, std::sync::atomic::Ordering::SeqCst)
    };
    gone(true);
    let bound = std::time::Duration::from_secs(15);
    let t = std::time::Instant::now();
    let first = tokio::time::timeout(bound, stats_of(&h, &v.volume_id, &target)).await;
    let took = t.elapsed();
    let t = std::time::Instant::now();
    let second = tokio::time::timeout(bound, stats_of(&h, &v.volume_id, &target)).await;
    let took_second = t.elapsed();
    let statvfs_calls = h.host.count("statvfs");
    gone(false);
    let first = first.expect("NodeGetVolumeStats must not hang with the server gone");
    let cond = first.volume_condition.unwrap();
    assert!(cond.abnormal);
    assert!(cond.message.contains("does not answer"), "{}", cond.message);
    assert!(took < std::time::Duration::from_secs(8), "took {took:?}");
    let cond = second.unwrap().volume_condition.unwrap();
    assert!(cond.abnormal, "{}", cond.message);
    assert!(
        took_second < std::time::Duration::from_secs(1),
        "took {took_second:?}"
    );
    assert_eq!(statvfs_calls, 1, "one statvfs stuck at a time");
    // Back again: healthy once the stuck call has returned.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let cond = stats_of(&h, &v.volume_id, &target)
        .await
        .volume_condition
        .unwrap();
    assert!(!cond.abnormal, "{}", cond.message);
}

fn clone_req(name: &str, source: &str, required: i64, limit: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![cap(AccessModeKind::MultiNodeMultiWriter, &[])],
        parameters: params(&[("verify", "checksum")]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: source.into(),
                },
            )),
        }),
        ..Default::default()
    }
}

/// CSI spec, CreateVolume errors: a content source that does not exist is NOT_FOUND, one
/// the plugin cannot use (a block volume) INVALID_ARGUMENT naming the field, and one larger
/// than the clone's limit OUT_OF_RANGE naming both sizes. None creates a directory.
#[tokio::test]
async fn an_nfs_clone_of_a_missing_block_or_larger_source_is_refused_and_creates_nothing() {
    let h = harness().await;
    let multi = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let src = h
        .create("src", params(&[]), multi.clone(), 2 << 30)
        .await
        .unwrap();
    let mut c = h.c.controller.clone();
    let e = c
        .create_volume(clone_req("clone", "no-such-volume", 1 << 30, 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    // A well-formed NFS id whose directory is not there.
    let gone = src.volume_id.replace(":src:", ":gone:");
    let e = c
        .create_volume(clone_req("clone", &gone, 1 << 30, 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    let block = "blk:0000000000000001:vol:node-a";
    let e = c
        .create_volume(clone_req("clone", block, 1 << 30, 0))
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::InvalidArgument | Code::NotFound),
        "{e:?}"
    );
    let e = c
        .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 1 << 30))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{}", e.message());
    assert!(
        e.message().contains(&(2u64 << 30).to_string())
            && e.message().contains(&(1u64 << 30).to_string()),
        "{}",
        e.message()
    );
    assert!(!h.export().join("clone").exists(), "nothing created");
    let listed = c.list_volumes(ListVolumesRequest::default()).await.unwrap();
    assert_eq!(listed.into_inner().entries.len(), 1, "only the source");
}

/// The source tree of the clone tests: nested directories, odd names, modes and owners,
/// a hard link, a sparse file, an empty file, a FIFO, and symlinks pointing inside the
/// share and outside it (at `outside`).
/// An NFS volume `src` of `bytes` whose directory holds [`fill_source`]'s tree (its
/// outside symlink pointing into `outside`); returns the volume and its directory.
async fn filled_source(h: &Harness, outside: &Path, bytes: i64) -> (Volume, PathBuf) {
    let multi = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let src = h.create("src", params(&[]), multi, bytes).await.unwrap();
    let src_dir = h.export().join("src");
    fill_source(&src_dir, outside);
    (src, src_dir)
}

fn fill_source(src: &Path, outside: &Path) {
    use std::os::unix::fs::{symlink, OpenOptionsExt};
    std::fs::create_dir_all(src.join("a/b/c")).unwrap();
    for i in 0..20 {
        std::fs::write(
            src.join(format!("a/b/f{i}")),
            format!("file {i}\n").repeat(i + 1),
        )
        .unwrap();
    }
    std::fs::write(src.join("a/b/c/odd name \u{e9}\t!"), b"odd").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("big.bin"), &big).unwrap();
    std::fs::hard_link(src.join("big.bin"), src.join("a/big-link")).unwrap();
    let sparse = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(src.join("sparse"))
        .unwrap();
    sparse.set_len(16 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, b"tail", (16 << 20) - 4).unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::fs::set_permissions(src.join("a/b/f3"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(src.join("a/b/c"), std::fs::Permissions::from_mode(0o750)).unwrap();
    nix::unistd::mkfifo(
        &src.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    symlink(outside.join("secret"), src.join("escape")).unwrap();
    symlink("a/b/f1", src.join("inside")).unwrap();
    if common::is_root() {
        let f = src.join("a/b/f4");
        std::os::unix::fs::lchown(&f, Some(1234), Some(5678)).unwrap();
    }
}

/// Every entry of `a` is in `b` with the same kind, mode, owner, mtime, size, bytes
/// (files) and text (symlinks, which are never followed).
fn assert_same_tree(a: &Path, b: &Path) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0;
    while let Some(rel) = stack.pop() {
        let (x, y) = (a.join(&rel), b.join(&rel));
        let (mx, my) = (
            std::fs::symlink_metadata(&x).unwrap(),
            std::fs::symlink_metadata(&y).unwrap(),
        );
        assert_eq!(mx.mode(), my.mode(), "mode of {rel:?}");
        assert_eq!(
            (mx.uid(), mx.gid()),
            (my.uid(), my.gid()),
            "owner of {rel:?}"
        );
        assert_eq!(mx.len(), my.len(), "size of {rel:?}");
        if !mx.is_dir() {
            assert_eq!(mx.mtime(), my.mtime(), "mtime of {rel:?}");
        }
        seen += 1;
        let ft = mx.file_type();
        if ft.is_symlink() {
            assert_eq!(
                std::fs::read_link(&x).unwrap(),
                std::fs::read_link(&y).unwrap()
            );
        } else if ft.is_file() {
            assert!(
                std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(),
                "bytes of {rel:?}"
            );
        } else if ft.is_dir() {
            for e in std::fs::read_dir(&x).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    assert!(seen > 25, "walked {seen} entries");
}

/// NFS → NFS: the clone's directory is a copy of the source's (checksum-verified),
/// symlinks copied as links (the one pointing outside the share too), hard links kept,
/// holes kept; the Volume names its content source and has the source's capacity; a
/// repeated CreateVolume answers the same; DeleteVolume removes the copy.
#[tokio::test]
async fn an_nfs_clone_is_a_verified_copy_of_the_source_directory() {
    use std::os::unix::fs::MetadataExt;
    let h = harness().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"not for the clone").unwrap();
    let (src, src_dir) = filled_source(&h, outside.path(), 2 << 30).await;
    let mut c = h.c.controller.clone();
    let v = c
        .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 2 << 30, "the source's capacity");
    let source_of = |v: &Volume| match v.content_source.as_ref().and_then(|s| s.r#type.as_ref()) {
        Some(volume_content_source::Type::Volume(s)) => s.volume_id.clone(),
        other => panic!("content source {other:?}"),
    };
    assert_eq!(source_of(&v), src.volume_id);
    let dst = h.export().join("clone");
    assert_same_tree(&src_dir, &dst);
    let escape = std::fs::symlink_metadata(dst.join("escape")).unwrap();
    assert!(
        escape.file_type().is_symlink(),
        "copied as a link, not followed"
    );
    assert_eq!(
        std::fs::read_link(dst.join("escape")).unwrap(),
        outside.path().join("secret")
    );
    assert_eq!(
        std::fs::metadata(dst.join("big.bin")).unwrap().ino(),
        std::fs::metadata(dst.join("a/big-link")).unwrap().ino(),
        "the hard link is one inode in the copy"
    );
    let sparse = std::fs::metadata(dst.join("sparse")).unwrap();
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "holes stay holes: {} blocks",
        sparse.blocks()
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(dst.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    // The same request again: the same volume, nothing copied again.
    let again = c
        .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let entry = listed
        .entries
        .iter()
        .find(|e| e.volume.as_ref().unwrap().volume_id == v.volume_id);
    assert_eq!(
        source_of(entry.unwrap().volume.as_ref().unwrap()),
        src.volume_id
    );
    // Another source under the same name is another request.
    let e = c
        .create_volume(CreateVolumeRequest {
            volume_content_source: None,
            ..clone_req("clone", &src.volume_id, 1 << 30, 0)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{}", e.message());
    h.delete(&v.volume_id).await.unwrap();
    assert!(!dst.exists());
    assert!(outside.path().join("secret").exists());
    assert_eq!(
        std::fs::read_dir(&src_dir).unwrap().count(),
        7,
        "the source is untouched"
    );
}

/// Sets `filling` in `id`'s record file, as a driver killed mid-copy leaves it.
fn mark_filling(dir: &Path, id: &str) {
    for entry in std::fs::read_dir(dir.join("state/nfs-volumes")).unwrap() {
        let path = entry.unwrap().path();
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if json["id"] == id {
            json["record"]["filling"] = true.into();
            std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
            return;
        }
    }
    panic!("no record of {id}");
}

/// A driver killed mid-copy: its record still says `filling` and the clone's directory
/// holds a half copy. After the restart the half copy is no volume (ListVolumes leaves it
/// out), the retried CreateVolume finishes the copy, and DeleteVolume of a half copy
/// removes it even under `onDelete: retain`.
#[tokio::test]
async fn a_clone_left_filling_by_a_killed_driver_is_finished_or_removed_after_restart() {
    let h = harness().await;
    let outside = tempfile::tempdir().unwrap();
    let (src, src_dir) = filled_source(&h, outside.path(), 1 << 30).await;
    let mut c = h.c.controller.clone();
    let v = c
        .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let dst = h.export().join("clone");
    // What a kill mid-copy leaves: the record filling, files missing or cut short.
    mark_filling(h.dir.path(), &v.volume_id);
    std::fs::write(dst.join("big.bin"), b"cut").unwrap();
    std::fs::remove_dir_all(dst.join("a/b/c")).unwrap();
    let Harness { dir, c: old, .. } = h;
    drop(old);
    let h = harness_in(dir, true, Some(SLOW_CI)).await;
    let mut c = h.c.controller.clone();
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .all(|e| e.volume.as_ref().unwrap().volume_id != v.volume_id),
        "a half copy is not listed"
    );
    let again = c
        .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    assert_same_tree(&src_dir, &dst);
    // A half copy under onDelete: retain is removed by DeleteVolume all the same.
    let retain = params(&[("onDelete", "retain"), ("verify", "checksum")]);
    let r = c
        .create_volume(CreateVolumeRequest {
            parameters: retain,
            ..clone_req("kept", &src.volume_id, 1 << 30, 0)
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    mark_filling(h.dir.path(), &r.volume_id);
    let Harness { dir, c: old, .. } = h;
    drop(old);
    let h = harness_in(dir, true, Some(SLOW_CI)).await;
    h.delete(&r.volume_id).await.unwrap();
    assert!(
        !h.export().join("kept").exists(),
        "the half copy is removed"
    );
    assert!(
        h.export().join("clone/big.bin").exists(),
        "the finished clone stays"
    );
}

/// A copy that outlasts CreateVolume's wait (here a wait of 0): the answer is
/// UNAVAILABLE (external-provisioner: ProvisioningInBackground, retried) with the progress
/// as the message, the copy goes on as a job, and the retries join it until it is done.
#[tokio::test]
async fn a_clone_create_that_cannot_wait_answers_the_progress_and_the_retry_joins() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness_in(dir, true, Some(std::time::Duration::ZERO)).await;
    let outside = tempfile::tempdir().unwrap();
    let (src, src_dir) = filled_source(&h, outside.path(), 1 << 30).await;
    let mut c = h.c.controller.clone();
    let e = c
        .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(
        e.message()
            .starts_with("pre-staging from 192.0.2.1:/export/src: "),
        "{}",
        e.message()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let v = loop {
        match c
            .create_volume(clone_req("clone", &src.volume_id, 1 << 30, 0))
            .await
        {
            Ok(r) => break r.into_inner().volume.unwrap(),
            Err(e) if e.code() == Code::Unavailable && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert!(v.content_source.is_some());
    assert_same_tree(&src_dir, &h.export().join("clone"));
}

/// The source and the clone on different exports (another share, another server): each is
/// reached through its own export mount, and the copy goes from one to the other.
#[tokio::test]
async fn an_nfs_clone_may_live_on_another_export_than_its_source() {
    let h = harness().await;
    let outside = tempfile::tempdir().unwrap();
    let (src, src_dir) = filled_source(&h, outside.path(), 1 << 30).await;
    let other = params(&[("server", "192.0.2.7"), ("share", "/scratch")]);
    let mut c = h.c.controller.clone();
    let v = c
        .create_volume(CreateVolumeRequest {
            parameters: other,
            ..clone_req("clone", &src.volume_id, 1 << 30, 0)
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(v.volume_id.ends_with(":192.0.2.7"), "{}", v.volume_id);
    let calls = h.host.state.lock().unwrap().nfs_calls.clone();
    let sources: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert!(sources.contains(&"192.0.2.7:/scratch"), "{sources:?}");
    let exports = h.dir.path().join("state/nfs-exports");
    let clone_dir = std::fs::read_dir(&exports)
        .unwrap()
        .map(|e| e.unwrap().path().join("clone"))
        .find(|p| p.exists())
        .expect("the clone's directory on the other export");
    assert_ne!(clone_dir.parent(), src_dir.parent(), "another export mount");
    assert_same_tree(&src_dir, &clone_dir);
}

#[tokio::test]
async fn list_volumes_pages_through_every_volume_once_in_order() {
    let h = harness().await;
    let rw = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let mut made = Vec::new();
    for i in 0..7 {
        let v = h
            .create(&format!("page-{i}"), params(&[]), rw.clone(), 0)
            .await
            .unwrap();
        made.push(v.volume_id);
    }
    made.sort();
    let mut c = h.c.controller.clone();
    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = c
            .list_volumes(ListVolumesRequest {
                max_entries: 3,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 3, "{}", page.entries.len());
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        pages += 1;
        token = page.next_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, made, "every volume once, in id order");
    assert_eq!(pages, 3);
    let all = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 7);
    assert!(all.next_token.is_empty());
}

/// An NFS volume's snapshot on an NFS store (another export path of the same server): its
/// directory copied into `<storePath>/<name>/tree` through the export mounts with a
/// manifest; restored into a new NFS volume (content source answered) holding the same
/// tree; a directory-store snapshot cannot restore into NFS (InvalidArgument naming the
/// field); DeleteSnapshot removes it from the store and a restore of it is NotFound.
#[tokio::test]
async fn an_nfs_volume_is_snapshotted_to_an_nfs_store_and_restored_into_a_new_nfs_volume() {
    let h = harness().await;
    let outside = tempfile::tempdir().unwrap();
    let (src, src_dir) = filled_source(&h, outside.path(), 1 << 30).await;
    let mut c = h.c.controller.clone();
    let req = CreateSnapshotRequest {
        name: "nightly".into(),
        source_volume_id: src.volume_id.clone(),
        parameters: [
            ("storeServer", "192.0.2.1"),
            ("storeShare", "/export"),
            ("storePath", "snapshots"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let snap = loop {
        let s = c
            .create_snapshot(req.clone())
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        if s.ready_to_use {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        snap.snapshot_id
            .starts_with("snap:nfs:r-rdma-20049-4.1:~export:snapshots~nightly:"),
        "{}",
        snap.snapshot_id
    );
    let stored = h.export().join("snapshots/nightly");
    assert_same_tree(&src_dir, &stored.join("tree"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stored.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["content"], "files");
    assert_eq!(manifest["source_volume_id"], src.volume_id.as_str());
    let restore = |name: &str, id: &str| CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(AccessModeKind::MultiNodeMultiWriter, &[])],
        parameters: params(&[("verify", "checksum")]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: id.into(),
                },
            )),
        }),
        ..Default::default()
    };
    let restored = restore("restored", &snap.snapshot_id);
    let v = c
        .create_volume(restored.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    match v.content_source.and_then(|s| s.r#type) {
        Some(volume_content_source::Type::Snapshot(s)) => {
            assert_eq!(s.snapshot_id, snap.snapshot_id)
        }
        other => panic!("{other:?}"),
    }
    assert_same_tree(&src_dir, &h.export().join("restored"));
    let e = c
        .create_volume(restore("from-dir", "snap:dir:~var~lib~snaps:nightly"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // A snapshot on a directory store (its id file and manifest naming it).
    std::fs::create_dir_all(outside.path().join("snaps/x/tree")).unwrap();
    let dir_id = format!(
        "snap:dir:{}:x",
        outside
            .path()
            .join("snaps")
            .display()
            .to_string()
            .replace('/', "~")
    );
    let manifest_text = String::from_utf8(std::fs::read(stored.join("manifest.json")).unwrap())
        .unwrap()
        .replace(&snap.snapshot_id, &dir_id)
        .replace("\"nightly\"", "\"x\"");
    std::fs::write(outside.path().join("snaps/x/manifest.json"), manifest_text).unwrap();
    std::fs::write(
        outside.path().join("snaps/x/snapshot-id"),
        format!("{dir_id}\n"),
    )
    .unwrap();
    let e = c
        .create_volume(restore("from-dir", &dir_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .starts_with("volume_content_source.snapshot.snapshot_id: "),
        "{}",
        e.message()
    );
    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!stored.exists());
    let e = c
        .create_volume(restore("late", &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // The volume made from it, asked for again: the same volume, its tree as it was.
    let again = c
        .create_volume(restored)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    assert_same_tree(&src_dir, &h.export().join("restored"));
    assert!(!stored.exists());
}

/// An NFS snapshot store tampered with through its export: a snapshot directory planted as
/// a symlink is refused by CreateSnapshot (nothing written where it points), a `tree/`
/// swapped for a symlink is refused by a restore, and a file changed after a snapshot with
/// checksums was taken is refused naming it, the new volume left empty.
#[tokio::test]
async fn a_tampered_nfs_snapshot_store_is_refused_never_followed() {
    use std::os::unix::fs::symlink;
    let h = harness().await;
    let outside = tempfile::tempdir().unwrap();
    let multi = cap(AccessModeKind::MultiNodeMultiWriter, &[]);
    let src = h
        .create("src", params(&[]), multi.clone(), 1 << 30)
        .await
        .unwrap();
    std::fs::write(h.export().join("src/data.bin"), b"nightly bytes").unwrap();
    let mut c = h.c.controller.clone();
    let snapshot = |name: &str| CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: src.volume_id.clone(),
        parameters: [
            ("storeServer", "192.0.2.1"),
            ("storeShare", "/export"),
            ("storePath", "snapshots"),
            ("checksums", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    let restore = |name: &str, id: &str| CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![multi.clone()],
        parameters: params(&[]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: id.into(),
                },
            )),
        }),
        ..Default::default()
    };
    std::fs::create_dir_all(h.export().join("snapshots")).unwrap();
    symlink(outside.path(), h.export().join("snapshots/planted")).unwrap();
    let e = c.create_snapshot(snapshot("planted")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let snap = loop {
        let s = c.create_snapshot(snapshot("nightly")).await.unwrap();
        let s = s.into_inner().snapshot.unwrap();
        if s.ready_to_use {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let stored = h.export().join("snapshots/nightly");
    std::fs::write(stored.join("tree/data.bin"), b"NIGHTLY bytes").unwrap();
    let e = c
        .create_volume(restore("changed", &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("data.bin") && e.message().contains("SHA-256"),
        "{e:?}"
    );
    assert!(
        std::fs::read_dir(h.export().join("changed")).map_or(true, |mut d| d.next().is_none()),
        "the changed bytes reached the volume"
    );

    std::fs::write(outside.path().join("secret"), b"host").unwrap();
    std::fs::rename(stored.join("tree"), stored.join("tree.real")).unwrap();
    symlink(outside.path(), stored.join("tree")).unwrap();
    let e = c
        .create_volume(restore("linked", &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!h.export().join("linked/secret").exists());
}
