//! NFS → block clones in process, over the host double: the real services,
//! a fixture NVMe namespace, and an NFS export that is a local directory (the double
//! records NFS mounts in its mount table, with the options the "kernel" negotiated, and
//! mounts nothing). What they prove: CreateVolume measures the source tree through the
//! export and refuses a limit it cannot fit (OutOfRange, both sizes, nothing allocated),
//! NotFound for a missing source, FailedPrecondition without the NFS backend; a class's
//! dataset parameters are checked field by field; NodeStage mounts the source read-only,
//! soft, over the source's transport, refuses one that did not negotiate RDMA, and
//! leaves no mount behind. The real copy over a real mount: `clone_nfs_root.rs`.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::host_double::HostDouble;
use gds_csi::csi::volume_capability::{
    access_mode::Mode as AccessModeKind, AccessMode, AccessType, MountVolume,
};
use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::Driver;
use gds_csi::volume::nfs::NfsStore;
use tonic::Code;

const DEV_SIZE: u64 = 1 << 30;

struct Harness {
    dir: tempfile::TempDir,
    host: Arc<HostDouble>,
    c: Clients,
}

/// One fixture namespace of 1 GiB; `nfs`: whether the driver has the NFS backend.
async fn harness(nfs: bool) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let host = Arc::new(HostDouble::tracking(HashMap::from([(
        dir.path().join("dev/nvme0n1"),
        (259, 0),
    )])));
    let c = common::serve_in_process(Arc::new(driver(dir.path(), &host, nfs)), dir.path()).await;
    Harness { dir, host, c }
}

/// The plugin of node-a over `dir`'s fixture and state (a restart keeps both).
fn driver(dir: &Path, host: &Arc<HostDouble>, nfs: bool) -> Driver {
    let (sys, dev, state) = (dir.join("sys"), dir.join("dev"), dir.join("state"));
    let ns = sys.join("block/nvme0n1");
    std::fs::create_dir_all(ns.join("holders")).unwrap();
    std::fs::write(ns.join("wwid"), "nvme.1b36-fixture-0000\n").unwrap();
    std::fs::write(ns.join("dev"), "259:0\n").unwrap();
    let by_dev = sys.join("dev/block/259:0");
    std::fs::create_dir_all(&by_dev).unwrap();
    std::fs::write(by_dev.join("size"), format!("{}\n", DEV_SIZE / 512)).unwrap();
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: sys,
        host_dev: dev,
        listed: vec![],
        nvme_discover: true,
        state_dir: state.clone(),
    })
    .unwrap();
    let driver = Driver::new(
        "gds.csi.test".into(),
        "node-a".into(),
        vec![dir.join("kubelet")],
        pool,
        host.clone(),
    );
    if nfs {
        driver.with_nfs(NfsStore::open(&state, std::time::Duration::from_secs(5)).unwrap())
    } else {
        driver
    }
}

fn cap(mode: AccessModeKind) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const DATASET: &[(&str, &str)] = &[
    ("datasetServer", "192.0.2.1"),
    ("datasetShare", "/export"),
    ("datasetPath", "sets/a"),
];

fn block_req(
    name: &str,
    params: &[(&str, &str)],
    source: Option<&str>,
    limit: i64,
) -> CreateVolumeRequest {
    let mut p = map(&[("gdsPolicy", "disabled")]);
    p.extend(map(params));
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 0,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![cap(AccessModeKind::SingleNodeWriter)],
        parameters: p,
        volume_content_source: source.map(|id| VolumeContentSource {
            r#type: Some(Type::Volume(VolumeSource {
                volume_id: id.into(),
            })),
        }),
        ..Default::default()
    }
}

impl Harness {
    async fn create(&self, req: CreateVolumeRequest) -> Result<Volume, tonic::Status> {
        let mut c = self.c.controller.clone();
        c.create_volume(req)
            .await
            .map(|r| r.into_inner().volume.unwrap())
    }

    /// An NFS volume `name` on 192.0.2.1:/export; its directory in the local export.
    async fn nfs_volume(&self, name: &str) -> (String, PathBuf) {
        let v = self
            .create(CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![cap(AccessModeKind::MultiNodeMultiWriter)],
                parameters: map(&[("server", "192.0.2.1"), ("share", "/export")]),
                ..Default::default()
            })
            .await
            .unwrap();
        let export = std::fs::read_dir(self.dir.path().join("state/nfs-exports"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        (v.volume_id, export.join(name))
    }

    fn staging(&self, name: &str) -> PathBuf {
        self.dir.path().join("kubelet/staging").join(name)
    }

    /// An NFS volume `data` holding the test tree, and a block clone of it named `clone`.
    async fn filled_clone(&self) -> (String, Volume) {
        let (src, dir) = self.nfs_volume("data").await;
        fill(&dir);
        let v = self
            .create(block_req("clone", &[], Some(&src), 0))
            .await
            .unwrap();
        (src, v)
    }

    async fn stage(&self, v: &Volume, name: &str) -> Result<(), tonic::Status> {
        let mut n = self.c.node.clone();
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: self.staging(name).display().to_string(),
            volume_capability: Some(cap(AccessModeKind::SingleNodeWriter)),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        })
        .await
        .map(drop)
    }

    async fn listed(&self) -> usize {
        let mut c = self.c.controller.clone();
        c.list_volumes(ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .entries
            .len()
    }

    /// The last NFS mount the double saw: source, target, options.
    fn last_nfs(&self) -> (String, PathBuf, Vec<String>) {
        self.host
            .state
            .lock()
            .unwrap()
            .nfs_calls
            .last()
            .cloned()
            .unwrap()
    }
}

fn fill(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("weights.bin"), vec![7u8; 3 << 20]).unwrap();
    std::fs::write(dir.join("sub/small"), b"small").unwrap();
}

/// 3 MiB + 5 bytes of files: 3 MiB + 4 KiB in blocks, plus root and sub: 3 MiB + 12 KiB,
/// × 16/15, rounded up to 4 KiB (src/volume/copy/measure.rs).
const DATA: u64 = (3 << 20) + 5;
const NEEDED: u64 = (((3u64 << 20) + (12 << 10)) * 16)
    .div_ceil(15)
    .div_ceil(4096)
    * 4096;

#[tokio::test]
async fn an_nfs_volume_sizes_its_clone_and_the_stage_mounts_it_read_only_and_soft() {
    let h = harness(true).await;
    let (src, dir) = h.nfs_volume("data").await;
    fill(&dir);
    let before = h.listed().await;
    let limit = 2 << 20;
    let err = h
        .create(block_req("small", &[], Some(&src), limit))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    for size in [DATA, NEEDED, limit as u64] {
        assert!(
            err.message().contains(&format!(" {size} bytes")),
            "{size}: {}",
            err.message()
        );
    }
    assert_eq!(h.listed().await, before, "nothing created");
    assert_eq!(h.host.count("mkfs"), 0);
    let err = h
        .create(block_req(
            "lost",
            &[],
            Some("nfs:d-rdma-20049-4.1:~export:gone:192.0.2.1"),
            0,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    let v = h
        .create(block_req("clone", &[], Some(&src), 0))
        .await
        .unwrap();
    assert_eq!(v.capacity_bytes as u64, DEV_SIZE);
    assert!(
        matches!(&v.content_source, Some(VolumeContentSource { r#type: Some(Type::Volume(s)) }) if s.volume_id == src)
    );
    h.stage(&v, "clone").await.unwrap();
    let (source, at, opts) = h.last_nfs();
    assert_eq!(source, "192.0.2.1:/export/data");
    assert!(at.starts_with(h.dir.path().join("state/clone-mnt")) && at.ends_with("source"));
    assert_eq!(
        opts,
        [
            "rdma",
            "port=20049",
            "vers=4.1",
            "ro",
            "softerr",
            "timeo=100",
            "retrans=2"
        ]
    );
    assert_eq!(h.host.mounts_at(&at), 0, "the private source mount is gone");
    assert_eq!(h.host.mounts_at(&h.staging("clone")), 1);
    // Done: a restage mounts no source again.
    let n = h.host.count("mount_nfs");
    h.stage(&v, "clone").await.unwrap();
    assert_eq!(h.host.count("mount_nfs"), n);
}

#[tokio::test]
async fn a_source_mount_without_rdma_is_refused_and_nothing_is_staged() {
    let h = harness(true).await;
    let (_, v) = h.filled_clone().await;
    *h.host.negotiate_proto.lock().unwrap() = Some("tcp".into());
    let err = h.stage(&v, "clone").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("RDMA was requested"),
        "{}",
        err.message()
    );
    let (_, at, _) = h.last_nfs();
    assert_eq!(h.host.mounts_at(&at), 0, "the TCP mount was taken down");
    assert_eq!(h.host.mounts_at(&h.staging("clone")), 0, "nothing staged");
}

#[tokio::test]
async fn without_the_nfs_backend_an_nfs_source_is_a_failed_precondition() {
    let h = harness(false).await;
    let before = h.listed().await;
    for req in [
        block_req(
            "c1",
            &[],
            Some("nfs:d-rdma-20049-4.1:~export:data:192.0.2.1"),
            0,
        ),
        block_req("c2", DATASET, None, 0),
    ] {
        let err = h.create(req).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(
            err.message().contains("NFS backend is not enabled"),
            "{}",
            err.message()
        );
    }
    assert_eq!(h.listed().await, before);
    assert_eq!(h.host.count("mount_nfs"), 0);
}

#[tokio::test]
async fn a_node_without_the_nfs_backend_refuses_to_fill_an_nfs_clone_and_changes_nothing() {
    let mut h = harness(true).await;
    let (src, v) = h.filled_clone().await;
    // The node's plugin restarted without the NFS backend (same state, same host).
    let second = h.dir.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    let restarted = driver(h.dir.path(), &h.host, false);
    h.c = common::serve_in_process(Arc::new(restarted), &second).await;
    let calls = h.host.state.lock().unwrap().calls.len();
    let err = h.stage(&v, "clone").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(&src) && err.message().contains("NFS backend is not enabled"),
        "{}",
        err.message()
    );
    let made: Vec<String> = h.host.state.lock().unwrap().calls[calls..]
        .iter()
        .filter(|c| !c.starts_with("mount_table"))
        .cloned()
        .collect();
    assert!(made.is_empty(), "the refused stage did {made:?}");
    assert_eq!(h.host.mounts_at(&h.staging("clone")), 0);
}

#[tokio::test]
async fn a_class_names_a_dataset_that_each_of_its_volumes_is_cloned_from() {
    let h = harness(true).await;
    // The export's local directory exists once something mounted it.
    let (_, vol_dir) = h.nfs_volume("other").await;
    let set = vol_dir.parent().unwrap().join("sets/a");
    fill(&set);
    // A limit at the smallest ext4 that stages (2 MiB), below what the dataset needs.
    let err = h
        .create(block_req("small", DATASET, None, 2 << 20))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("192.0.2.1:/export/sets/a")
            && err.message().contains(&NEEDED.to_string()),
        "{}",
        err.message()
    );
    let mut missing = DATASET.to_vec();
    missing[2] = ("datasetPath", "sets/none");
    let err = h
        .create(block_req("none", &missing, None, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    let v = h.create(block_req("copy", DATASET, None, 0)).await.unwrap();
    assert_eq!(v.content_source, None, "no content source was asked for");
    assert_eq!(
        v.volume_context.get("datasetPath").map(String::as_str),
        Some("sets/a")
    );
    h.stage(&v, "copy").await.unwrap();
    let (source, _, opts) = h.last_nfs();
    assert_eq!(source, "192.0.2.1:/export/sets/a");
    assert_eq!(&opts[..3], ["rdma", "port=20049", "vers=4.1"]);
}

#[tokio::test]
async fn malformed_dataset_parameters_are_refused_naming_the_field() {
    let h = harness(true).await;
    let before = h.listed().await;
    let with = |k: &'static str, v: &'static str| {
        let mut p = DATASET.to_vec();
        p.retain(|(key, _)| *key != k);
        if !v.is_empty() {
            p.push((k, v));
        }
        p
    };
    for (params, field) in [
        (with("datasetShare", ""), "parameters.datasetShare"),
        (with("datasetServer", "a b"), "parameters.datasetServer"),
        (with("datasetPath", "../up"), "parameters.datasetPath"),
        (with("datasetPort", "x"), "parameters.datasetPort"),
        (with("datasetProto", "carrier"), "parameters.datasetProto"),
        (with("datasetVers", "9"), "parameters.datasetVers"),
    ] {
        let err = h
            .create(block_req("bad", &params, None, 0))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().starts_with(&format!("{field}: ")),
            "{}",
            err.message()
        );
    }
    // One source only; and a dataset fills block volumes, not NFS ones.
    let src = "nfs:d-rdma-20049-4.1:~export:data:192.0.2.1";
    let err = h
        .create(block_req("two", DATASET, Some(src), 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("volume_content_source: "),
        "{}",
        err.message()
    );
    let mut nfs_class = DATASET.to_vec();
    nfs_class.extend([("server", "192.0.2.1"), ("share", "/export")]);
    let err = h
        .create(block_req("nfs", &nfs_class, None, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("parameters.datasetServer: "),
        "{}",
        err.message()
    );
    assert_eq!(h.listed().await, before);
    assert_eq!(h.host.count("mount_nfs"), 0);
}
