//! Root-only tests: the real `gds-csi` binary on real loop devices, with real mkfs
//! and real mounts, driven through its CSI socket. Without root they report a skip.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::*;
use sha2::{Digest, Sha256};
use tonic::Code;

mod common;
use common::{digest_file, requests, Rig, SIZE};
use gds_csi::csi::Clients;

fn create_req(name: &str) -> CreateVolumeRequest {
    requests::create_without_gds(name, requests::single_writer_mount())
}

fn stage_req(id: &str, staging: &Path) -> NodeStageVolumeRequest {
    requests::stage_request(id, staging, requests::single_writer_mount())
}

/// Stages `id` as the single-writer mount this file's volumes are.
async fn stage(c: &mut Clients, id: &str, staging: &Path) -> Result<(), tonic::Status> {
    requests::stage(c, id, staging, requests::single_writer_mount()).await
}

async fn publish(
    c: &mut Clients,
    id: &str,
    staging: &Path,
    target: &Path,
) -> Result<(), tonic::Status> {
    requests::publish(c, id, staging, target, requests::single_writer_mount()).await
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
    let vol = requests::create_volume(&mut c, create_req("data")).await;
    assert_eq!(vol.capacity_bytes as u64, SIZE);
    let id = vol.volume_id;
    let (staging, target) = (rig.path("staging/v"), rig.path("pods/p1/mount"));
    fs::create_dir_all(&staging).unwrap();
    stage(&mut c, &id, &staging).await.unwrap();
    let line = mountinfo_line(&staging).expect("staged");
    assert!(
        line.contains(" - ext4 ") && line.contains("data=ordered"),
        "{line}"
    );
    publish(&mut c, &id, &staging, &target).await.unwrap();

    let payload: Vec<u8> = (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(target.join("weights.bin"), &payload).unwrap();
    let want = Sha256::digest(&payload).to_vec();

    // Unpublish, unstage, stage and publish again: same data, no second mkfs.
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    assert!(!target.exists(), "unpublish removes the target");
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    assert!(mountinfo_line(&staging).is_none());
    stage(&mut c, &id, &staging).await.unwrap();
    publish(&mut c, &id, &staging, &target).await.unwrap();
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
        stage(&mut c, &id, &staging).await.unwrap();
        publish(&mut c, &id, &staging, &target).await.unwrap();
    }
    let stats = requests::published_stats(&mut c, &id, &target).await;
    assert!(!stats.volume_condition.unwrap().abnormal);
    assert!(stats.usage[0].used >= 1 << 20, "{:?}", stats.usage);
    assert_eq!(rig.mkfs_count(), 1, "mkfs ran exactly once");

    // A staged volume cannot be deleted.
    let err = c
        .controller
        .delete_volume(requests::delete_request(&id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    c.controller
        .delete_volume(requests::delete_request(&id))
        .await
        .unwrap();
    // The device went back to the pool, wiped of the volume's filesystem.
    let probe = Command::new("blkid")
        .args(["-p", rig.loops[0].to_str().unwrap()])
        .status()
        .unwrap();
    assert_eq!(probe.code(), Some(2), "no signature left after delete");
    let cap = requests::capacity(&mut c).await;
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
    let cap = requests::capacity(&mut c).await;
    assert_eq!(
        cap.available_capacity as u64, SIZE,
        "only the clean device counts"
    );

    // The clean device is allocated; then someone writes a partition table onto it.
    let vol = requests::create_volume(&mut c, create_req("first")).await;
    write_partition_table(&rig.loops[1]);
    let before1 = device_digest(&rig.loops[1]);
    let staging = rig.path("staging/first");
    fs::create_dir_all(&staging).unwrap();
    let err = stage(&mut c, &vol.volume_id, &staging).await.unwrap_err();
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
    let vol = requests::create_volume(&mut c, create_req("h")).await;
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

/// fsType=xfs end to end with the real mkfs.xfs and a real xfs mount: formatted once with
/// the UUID chosen at allocation, data kept across unstage/restage, wiped on delete.
/// 512 MiB devices: mkfs.xfs (xfsprogs >= 5.19) refuses filesystems under 300 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_is_formatted_once_mounted_and_wiped_on_real_devices() {
    let Some(mut rig) = Rig::with_size(1, 512 << 20) else {
        return;
    };
    let dev = rig.loops[0].clone();
    let mut c = rig.start().await;
    let mut req = create_req("xfs-vol");
    req.parameters.insert("fsType".into(), "xfs".into());
    let vol = requests::create_volume(&mut c, req).await;
    let id = vol.volume_id;
    let fs_uuid = rig.state()["volumes"][&id]["fs_uuid"]
        .as_str()
        .expect("fs_uuid in the state file")
        .to_owned();
    let (staging, target) = (rig.path("staging/x"), rig.path("pods/px/mount"));
    fs::create_dir_all(&staging).unwrap();
    // A blank xfs volume staged with an ext4 capability: refused, nothing formatted.
    let mut ext4 = requests::single_writer_mount();
    if let Some(volume_capability::AccessType::Mount(m)) = &mut ext4.access_type {
        m.fs_type = "ext4".into();
    }
    let e = requests::stage(&mut c, &id, &staging, ext4)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("xfs") && e.message().contains("ext4"),
        "{e:?}"
    );
    assert_eq!(rig.mkfs_count(), 0, "nothing formatted");
    for _ in 0..2 {
        stage(&mut c, &id, &staging).await.unwrap();
    }
    assert_eq!(common::mounts_at(&staging), 1, "staged once");
    let line = mountinfo_line(&staging).expect("staged");
    assert!(
        line.contains(&format!(" - xfs {} ", dev.display())),
        "{line}"
    );
    let probe = |what: &str| {
        common::run(
            "blkid",
            &["-p", "-o", "value", "-s", what, dev.to_str().unwrap()],
        )
    };
    assert_eq!(probe("TYPE"), "xfs");
    assert_eq!(
        probe("UUID"),
        fs_uuid,
        "mkfs.xfs used the allocation's UUID"
    );

    publish(&mut c, &id, &staging, &target).await.unwrap();
    let payload: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    fs::write(target.join("x.bin"), &payload).unwrap();
    let want = Sha256::digest(&payload).to_vec();
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    assert!(mountinfo_line(&staging).is_none());
    stage(&mut c, &id, &staging).await.unwrap();
    publish(&mut c, &id, &staging, &target).await.unwrap();
    assert_eq!(digest_file(&target.join("x.bin")), want, "data kept");
    assert_eq!(rig.mkfs_count(), 1, "mkfs.xfs ran once");
    assert_eq!(probe("UUID"), fs_uuid);

    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    c.controller
        .delete_volume(requests::delete_request(&id))
        .await
        .unwrap();
    assert_eq!(
        common::blkid_code(&dev),
        Some(2),
        "DeleteVolume wiped the xfs signature"
    );
}

/// The rig's teardown unmounts a staging path that mountinfo has to escape (space,
/// backslash) and detaches its loop device: nothing outlives a test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rig_tears_down_mounts_whose_paths_mountinfo_escapes() {
    assert_eq!(
        common::unescape_mountinfo("/x/a\\040b\\134c\\011d"),
        "/x/a b\\c\td"
    );
    let (dir, dev) = {
        let Some(rig) = Rig::new(1) else { return };
        // Mounted by hand (the driver's own handling of such paths is tested elsewhere).
        let dev = rig.loops[0].clone();
        let staging = rig.path("staging/a b\\c/globalmount");
        fs::create_dir_all(&staging).unwrap();
        common::run("mkfs.ext4", &["-q", dev.to_str().unwrap()]);
        common::run("mount", &[dev.to_str().unwrap(), staging.to_str().unwrap()]);
        assert_eq!(common::mounts_at(&staging), 1);
        (rig.dir.path().to_owned(), dev)
    };
    let prefix = dir.to_string_lossy().to_string();
    let left =
        common::mount_points_under(&fs::read_to_string("/proc/self/mountinfo").unwrap(), &dir);
    assert!(left.is_empty(), "mounts left: {left:?}");
    let bound = common::run(
        "losetup",
        &["--list", "--noheadings", "-O", "NAME,BACK-FILE"],
    );
    assert!(
        !bound
            .lines()
            .any(|l| l.starts_with(&format!("{} ", dev.display())) && l.contains(&prefix)),
        "{} still bound: {bound}",
        dev.display()
    );
}

/// The rig's directory made a shared mount and bound, recursively and as a slave, into a
/// directory outside every allowed root: the copies a container's root filesystem holds
/// of the kubelet's mounts (containerd's task directory, seen by the node plugin). Taken
/// down when dropped (declare it after the rig).
struct PropagatedCopy {
    dir: tempfile::TempDir,
}

impl PropagatedCopy {
    fn of(rig: &Rig) -> PropagatedCopy {
        let own = rig.dir.path().to_str().unwrap();
        common::run("mount", &["--bind", own, own]);
        common::run("mount", &["--make-private", own]);
        common::run("mount", &["--make-shared", own]);
        let dir = tempfile::Builder::new()
            .prefix("gds-foreign-")
            .tempdir_in("/tmp")
            .unwrap();
        let rootfs = dir.path().join("rootfs");
        fs::create_dir_all(&rootfs).unwrap();
        common::run("mount", &["--rbind", own, rootfs.to_str().unwrap()]);
        common::run("mount", &["--make-rslave", rootfs.to_str().unwrap()]);
        PropagatedCopy { dir }
    }

    /// Where the copy of `path` (beneath the rig's directory) is.
    fn copy_of(&self, rig: &Rig, path: &Path) -> std::path::PathBuf {
        let rel = path.strip_prefix(rig.dir.path()).unwrap();
        self.dir.path().join("rootfs").join(rel)
    }
}

impl Drop for PropagatedCopy {
    fn drop(&mut self) {
        let rootfs = self.dir.path().join("rootfs");
        let _ = Command::new("umount")
            .arg("-R")
            .arg("-l")
            .arg(rootfs)
            .status();
    }
}

/// SINGLE_NODE_SINGLE_WRITER counts the pods the volume is published to, not the copies of
/// its mounts that propagation puts elsewhere: with every staging and publish mount also
/// listed under another directory tree, the first publish of a filesystem and of a raw
/// block volume succeeds (and repeats), and a real second target is refused, naming the
/// first target rather than a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_writer_ignores_copies_of_its_mounts_propagated_elsewhere() {
    let Some(mut rig) = Rig::new(2) else { return };
    let mut c = rig.start().await;
    let copies = PropagatedCopy::of(&rig);
    for (name, block) in [("fs", false), ("raw", true)] {
        let cap = requests::capability(Mode::SingleNodeSingleWriter, block);
        let id = requests::create_volume_id(&mut c, name, cap.clone()).await;
        let staging = rig.path(&format!("plugins/{name}/globalmount"));
        let first = rig.path(&format!("pods/{name}-1/volume"));
        fs::create_dir_all(&staging).unwrap();
        requests::stage(&mut c, &id, &staging, cap.clone())
            .await
            .unwrap();
        if !block {
            assert!(
                mountinfo_line(&copies.copy_of(&rig, &staging)).is_some(),
                "the staging mount is copied into the other tree"
            );
        }
        for _ in 0..2 {
            requests::publish(&mut c, &id, &staging, &first, cap.clone())
                .await
                .unwrap_or_else(|e| panic!("{name}: first publish: {e:?}"));
        }
        assert!(mountinfo_line(&copies.copy_of(&rig, &first)).is_some());
        let second = rig.path(&format!("pods/{name}-2/volume"));
        let err = requests::publish(&mut c, &id, &staging, &second, cap.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{name}: {err:?}");
        assert!(
            err.message()
                .contains(&format!("published at {}", first.display())),
            "{name}: {}",
            err.message()
        );
        requests::unpublish(&mut c, &id, &first).await.unwrap();
        requests::unstage(&mut c, &id, &staging).await.unwrap();
        assert!(
            mountinfo_line(&copies.copy_of(&rig, &first)).is_none(),
            "the copies go with their mounts"
        );
    }
}

fn monotonic_ns() -> u128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    assert_eq!(rc, 0);
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

/// The windows `tools/stage-trace.sh` reads: one plain NodeStage of a fresh volume (mkfs
/// included), and an idle window as long, so that background work can be told apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by tools/stage-trace.sh under bpftrace"]
async fn stage_trace_windows() {
    let Some(mut rig) = Rig::new(1) else { return };
    let mut c = rig.start().await;
    let id = requests::create_volume(&mut c, create_req("traced"))
        .await
        .volume_id;
    let staging = rig.path("staging/v");
    fs::create_dir_all(&staging).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let t0 = monotonic_ns();
    stage(&mut c, &id, &staging).await.unwrap();
    let t1 = monotonic_ns();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let t2 = monotonic_ns();
    tokio::time::sleep(std::time::Duration::from_nanos((t1 - t0) as u64)).await;
    let t3 = monotonic_ns();
    println!("STAGE_WINDOW {t0} {t1}");
    println!("IDLE_WINDOW {t2} {t3}");
    requests::unstage(&mut c, &id, &staging).await.unwrap();
}
