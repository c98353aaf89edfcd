//! NFS → block clones with the real copy, as root on a loop device: the driver
//! in process over the real host, except that this machine has no NFS client, so an NFS
//! mount is a read-only bind mount of a local directory standing in for the export,
//! shown in the mount table as the nfs4 mount over RDMA the kernel would list. What runs
//! for real: the measure of the tree through the export mount, mkfs, the private
//! read-only source mount, the O_DIRECT copy with checksums, owners, modes, times,
//! symlinks, hard links and holes, the stage and publish. The soft mount's timeout and a
//! real NFS server: the VM rig (tests/vm/clone.sh).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::*;
use gds_csi::os::RealHost;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::Driver;
use gds_csi::volume::nfs::NfsStore;

use common::host_double::HostDouble;
use common::{digest_file, requests, Rig};

/// The dataset: nested directories, a large file, a sparse file, an empty file, odd
/// names, owners and modes, a hard link and a symlink out of the share.
fn build_dataset(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for d in 0..4 {
        for f in 0..25 {
            let dir = root.join(format!("d{d}/e{}", f % 3));
            fs::create_dir_all(&dir).unwrap();
            let p = dir.join(format!("f{f}.bin"));
            let n = 1000 * (f + 1) + d * 7;
            let bytes: Vec<u8> = (0..n).map(|i| (i * 31 + f + d) as u8).collect();
            fs::write(&p, bytes).unwrap();
            files.push(p);
        }
    }
    let big: Vec<u8> = (0..(9u32 << 20) + 3)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    fs::write(root.join("big.bin"), big).unwrap();
    let sparse = fs::File::create(root.join("sparse.img")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(b"middle", 32 << 20).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("sp ace, comma & ünï"), b"odd").unwrap();
    fs::write(root.join("d0/owned"), b"mine").unwrap();
    nix::unistd::chown(&root.join("d0/owned"), Some(1234.into()), Some(4321.into())).unwrap();
    fs::set_permissions(root.join("d0/owned"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::hard_link(root.join("big.bin"), root.join("d1/big.link")).unwrap();
    symlink("/etc/hostname", root.join("outside")).unwrap();
    files.extend(
        [
            "big.bin",
            "sparse.img",
            "empty",
            "sp ace, comma & ünï",
            "d0/owned",
            "d1/big.link",
        ]
        .map(|f| root.join(f)),
    );
    files
}

/// The driver in process over `export` (bind mounts standing in for NFS mounts of it).
fn driver_over(rig: &Rig, export: &Path) -> Driver {
    let host = Arc::new(HostDouble::nfs_by_bind(
        RealHost {
            command_timeout: Duration::from_secs(60),
            mount_timeout: Duration::from_secs(30),
        },
        export.to_owned(),
    ));
    let state = rig.path("state");
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: "/sys".into(),
        host_dev: "/dev".into(),
        listed: rig.loops.clone(),
        nvme_discover: false,
        state_dir: state.clone(),
    })
    .unwrap();
    Driver::new(
        "gds.csi.gds-csi.io".into(),
        "node-a".into(),
        vec![rig.dir.path().to_owned()],
        pool,
        host,
    )
    .with_nfs(NfsStore::open(&state, Duration::from_secs(30)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nfs_directory_is_copied_into_a_block_clone_before_it_is_published() {
    let Some(rig) = Rig::with_sizes(&[256 << 20]) else {
        return;
    };
    let export = rig.path("export");
    fs::create_dir_all(&export).unwrap();
    let state = rig.path("state");
    let driver = driver_over(&rig, &export);
    let mut c = common::serve_in_process(Arc::new(driver), rig.dir.path()).await;

    let mut nfs_req = requests::create_without_gds("data", requests::single_writer_mount());
    nfs_req
        .parameters
        .insert("server".into(), "192.0.2.1".into());
    nfs_req.parameters.insert("share".into(), "/export".into());
    let src = requests::create_volume(&mut c, nfs_req).await.volume_id;
    let data = export.join("data");
    let files = build_dataset(&data);

    let mut req = requests::create_without_gds("clone", requests::single_writer_mount());
    req.parameters.insert("verify".into(), "checksum".into());
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: src.clone(),
        })),
    });
    let clone = requests::create_volume(&mut c, req).await;
    let id = clone.volume_id;
    let (staging, target) = (rig.path("staging/clone"), rig.path("pods/p/clone"));
    fs::create_dir_all(&staging).unwrap();
    requests::stage_and_publish(
        &mut c,
        &id,
        &staging,
        &target,
        requests::single_writer_mount(),
    )
    .await;

    for f in &files {
        let rel = f.strip_prefix(&data).unwrap();
        let (a, b) = (
            fs::metadata(f).unwrap(),
            fs::metadata(target.join(rel)).unwrap(),
        );
        assert_eq!(digest_file(f), digest_file(&target.join(rel)), "{rel:?}");
        assert_eq!(
            (a.mode(), a.uid(), a.gid(), a.len(), a.mtime()),
            (b.mode(), b.uid(), b.gid(), b.len(), b.mtime()),
            "{rel:?}"
        );
    }
    let link = fs::symlink_metadata(target.join("outside")).unwrap();
    assert!(link.file_type().is_symlink(), "copied as a link");
    assert_eq!(
        fs::read_link(target.join("outside")).unwrap(),
        Path::new("/etc/hostname")
    );
    let (a, b) = (
        fs::metadata(target.join("big.bin")).unwrap(),
        fs::metadata(target.join("d1/big.link")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "hard link kept");
    let sparse = fs::metadata(target.join("sparse.img")).unwrap();
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "holes kept: {} blocks",
        sparse.blocks()
    );
    // Nothing of the copy is left mounted; the progress record says done.
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        common::mount_points_under(&mountinfo, &state.join("clone-mnt")).is_empty(),
        "{mountinfo}"
    );
    let record = fs::read_dir(state.join("clones"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let saved: serde_json::Value =
        serde_json::from_slice(&fs::read(record.path()).unwrap()).unwrap();
    assert_eq!(saved["done"], true);
    assert_eq!(saved["source"], src.as_str());

    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    // The controller's export mount (a bind here) goes with the rig.
}

/// The record file of volume `id` in `state`.
fn record_file(state: &Path, id: &str) -> PathBuf {
    fs::read_dir(state.join("volumes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let stored: serde_json::Value = serde_json::from_slice(&fs::read(p).unwrap()).unwrap();
            stored["id"] == id
        })
        .unwrap()
}

/// A dataset class's volume records its dataset as its source (and answers no content
/// source: the CO named none); a record written before that, with the dataset only among
/// its class's parameters, is brought to the same form at start-up and filled from it.
#[test]
fn a_dataset_is_recorded_as_the_volumes_source_and_older_records_get_it_at_start() {
    let Some(rig) = Rig::with_sizes(&[256 << 20]) else {
        return;
    };
    let export = rig.path("export");
    let data = export.join("sets/a");
    let files = build_dataset(&data);
    let state = rig.path("state");
    let id = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let driver = Arc::new(driver_over(&rig, &export));
        let mut c = common::serve_in_process(driver, rig.dir.path()).await;
        let mut req = requests::create_without_gds("fromset", requests::single_writer_mount());
        for (k, v) in [
            ("datasetServer", "192.0.2.1"),
            ("datasetShare", "/export"),
            ("datasetPath", "sets/a"),
        ] {
            req.parameters.insert(k.into(), v.into());
        }
        let vol = requests::create_volume(&mut c, req).await;
        assert_eq!(vol.content_source, None);
        vol.volume_id
    });
    // The first driver is gone with its runtime: its state dir lock too.
    let path = record_file(&state, &id);
    let mut stored: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let dataset = stored["record"]["source"]["of"]["dataset"].clone();
    assert!(
        dataset
            .as_str()
            .is_some_and(|d| d.starts_with("nfs:") && d.contains(":~export:sets~a:192.0.2.1")),
        "{stored}"
    );
    stored["record"].as_object_mut().unwrap().remove("source");
    fs::write(&path, serde_json::to_vec(&stored).unwrap()).unwrap();

    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let driver = Arc::new(driver_over(&rig, &export));
        let second = rig.path("second");
        fs::create_dir_all(&second).unwrap();
        let mut c = common::serve_in_process(driver, &second).await;
        let again: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            again["record"]["source"]["of"]["dataset"], dataset,
            "{again}"
        );
        let (staging, target) = (rig.path("staging/set"), rig.path("pods/p/set"));
        fs::create_dir_all(&staging).unwrap();
        let cap = requests::single_writer_mount();
        requests::stage_and_publish(&mut c, &id, &staging, &target, cap).await;
        for f in &files {
            let rel = f.strip_prefix(&data).unwrap();
            assert_eq!(digest_file(f), digest_file(&target.join(rel)), "{rel:?}");
        }
        requests::unpublish(&mut c, &id, &target).await.unwrap();
        requests::unstage(&mut c, &id, &staging).await.unwrap();
    });
}
