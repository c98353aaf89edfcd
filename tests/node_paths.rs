//! Root tests of the node service's path handling: the real
//! `gds-csi` binary on loop devices, driven through its socket, with callers that aim
//! outside their volume. Without root they report a skip.
//!
//! - `unpublish_acts_only_on_this_volumes_own_mounts_and_files`: NodeUnpublishVolume with
//!   an unknown id, a gone id and a real id against another pod's tmpfs, a file and an
//!   empty directory; only the volume's own publish is taken down and removed.
//! - `raw_block_publish_never_hides_or_deletes_an_existing_file`.
//! - `paths_with_spaces_and_backslashes_stage_publish_and_unstage_cleanly`.
//! - `a_symlink_swapped_in_during_stage_never_gets_the_volume_mounted_outside`.
//! - `a_mount_below_the_root_is_not_crossed_and_a_file_is_not_a_staging_dir`.
//! - `stage_and_publish_mounts_propagate_to_the_kubelets_side` (and read-only publish).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::requests::{self, publish, stage, unpublish, unstage};
use common::Rig;
use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::os::mount;
use tonic::Code;

fn mount_cap() -> VolumeCapability {
    requests::single_writer_mount()
}

fn block_cap() -> VolumeCapability {
    requests::capability(Mode::SingleNodeWriter, true)
}

async fn create(c: &mut Clients, name: &str, cap: VolumeCapability) -> String {
    requests::create_volume_id(c, name, cap).await
}

fn code(r: &Result<(), tonic::Status>) -> Code {
    match r {
        Ok(()) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Mount points (decoded) at or below `prefix`.
fn mounts_under(prefix: &Path) -> Vec<PathBuf> {
    mount::read_table()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(prefix))
        .collect()
}

fn is_mounted(path: &Path) -> bool {
    mounts_under(path).iter().any(|p| p == path)
}

/// Mount points of the device `dev` (by major:minor), anywhere.
fn mounts_of(dev: &Path) -> Vec<PathBuf> {
    let rdev = fs::metadata(dev).unwrap().rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    mount::read_table()
        .unwrap()
        .into_iter()
        .filter(|m| m.is_device(major, minor))
        .map(|m| m.mount_point)
        .collect()
}

/// Unmounts (lazily, deepest first) everything left below these directories, also when
/// a test fails: declared after the Rig, it runs before the Rig removes its directory.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for prefix in &self.0 {
            let mut left = mounts_under(prefix);
            left.sort();
            for m in left.iter().rev() {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_acts_only_on_this_volumes_own_mounts_and_files() {
    let Some(mut rig) = Rig::new(1) else { return };
    let _cleanup = Cleanup(vec![rig.dir.path().to_owned()]);
    let mut c = rig.start().await;
    let id = create(&mut c, "u", mount_cap()).await;
    let staging = rig.path("staging/u");
    let target = rig.path("pods/p1/mount");
    stage(&mut c, &id, &staging, mount_cap()).await.unwrap();
    publish(&mut c, &id, &staging, &target, mount_cap())
        .await
        .unwrap();
    fs::write(target.join("data"), b"volume data").unwrap();

    // Another pod's tmpfs, a file and an empty directory under the same root.
    let other = rig.path("pods/other/mount");
    fs::create_dir_all(&other).unwrap();
    common::run("mount", &["-t", "tmpfs", "tmpfs", other.to_str().unwrap()]);
    fs::write(other.join("theirs"), b"another pod").unwrap();
    let config = rig.path("config.yaml");
    fs::write(&config, b"precious").unwrap();
    let empty = rig.path("empty");
    fs::create_dir(&empty).unwrap();

    // Well formed, of this node, but no such volume (deleted).
    let gone = "blk:dev-0000000000000000:0:node-a".to_string();
    let cases: Vec<(&str, &str, &Path, Code)> = vec![
        (
            "unknown id, other pod's tmpfs",
            "no-such-volume",
            &other,
            Code::NotFound,
        ),
        (
            "gone id, other pod's tmpfs",
            &gone,
            &other,
            Code::FailedPrecondition,
        ),
        (
            "this id, other pod's tmpfs",
            &id,
            &other,
            Code::FailedPrecondition,
        ),
        (
            "unknown id, a file",
            "no-such-volume",
            &config,
            Code::NotFound,
        ),
        ("gone id, a file", &gone, &config, Code::Ok),
        ("this id, a file", &id, &config, Code::Ok),
        (
            "unknown id, an empty dir",
            "no-such-volume",
            &empty,
            Code::NotFound,
        ),
        ("gone id, an empty dir", &gone, &empty, Code::Ok),
        ("this id, an empty dir", &id, &empty, Code::Ok),
        (
            "unknown id, this volume's target",
            "no-such-volume",
            &target,
            Code::NotFound,
        ),
        (
            "gone id, this volume's target",
            &gone,
            &target,
            Code::FailedPrecondition,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, vid, path, want) in &cases {
        let got = code(&unpublish(&mut c, vid, path).await);
        if got != *want {
            wrong.push(format!("{what}: want {want:?}, got {got:?}"));
        }
    }
    let intact = is_mounted(&other)
        && fs::read(other.join("theirs")).ok().as_deref() == Some(&b"another pod"[..])
        && fs::read(&config).ok().as_deref() == Some(&b"precious"[..])
        && empty.is_dir()
        && is_mounted(&target)
        && fs::read(target.join("data")).ok().as_deref() == Some(&b"volume data"[..]);
    // The driver may have taken it down already (that is the bug this test is about).
    let _ = Command::new("umount").arg(&other).status();
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(intact, "an unpublish reached beyond its own volume");

    // The volume's own unpublish takes its mount down and removes the target it made,
    // and a repeat is OK.
    unpublish(&mut c, &id, &target).await.unwrap();
    assert!(!is_mounted(&target));
    assert!(!target.exists(), "the target publish created is removed");
    unpublish(&mut c, &id, &target).await.unwrap();
    unstage(&mut c, &id, &staging).await.unwrap();
    eprintln!("unpublish cases refused or left alone: {}", cases.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_block_publish_never_hides_or_deletes_an_existing_file() {
    let Some(mut rig) = Rig::new(1) else { return };
    let _cleanup = Cleanup(vec![rig.dir.path().to_owned()]);
    let mut c = rig.start().await;
    let id = create(&mut c, "b", block_cap()).await;
    let staging = rig.path("staging/b");
    stage(&mut c, &id, &staging, block_cap()).await.unwrap();

    let kubeconfig = rig.path("kubeconfig");
    fs::write(&kubeconfig, b"apiVersion: v1").unwrap();
    let err = publish(&mut c, &id, &staging, &kubeconfig, block_cap())
        .await
        .expect_err("publish onto an existing file");
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("target_path"), "{}", err.message());
    assert!(!is_mounted(&kubeconfig), "the file was hidden by a mount");
    unpublish(&mut c, &id, &kubeconfig).await.unwrap();
    assert_eq!(fs::read(&kubeconfig).unwrap(), b"apiVersion: v1");

    // A new target file is created, published, and removed again by unpublish.
    let target = rig.path("volumeDevices/publish/b/pod1");
    publish(&mut c, &id, &staging, &target, block_cap())
        .await
        .unwrap();
    assert!(is_mounted(&target));
    unpublish(&mut c, &id, &target).await.unwrap();
    assert!(!is_mounted(&target));
    assert!(!target.exists(), "the file publish created is removed");
    assert_eq!(fs::read(&kubeconfig).unwrap(), b"apiVersion: v1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_with_spaces_and_backslashes_stage_publish_and_unstage_cleanly() {
    let Some(mut rig) = Rig::new(1) else { return };
    let _cleanup = Cleanup(vec![rig.dir.path().to_owned()]);
    let mut c = rig.start().await;
    let id = create(&mut c, "s", mount_cap()).await;
    let staging = rig.path("staging/a b\\c/globalmount");
    let target = rig.path("pods/p 1\\x/mount");
    stage(&mut c, &id, &staging, mount_cap()).await.unwrap();
    assert!(is_mounted(&staging));
    stage(&mut c, &id, &staging, mount_cap()).await.unwrap();
    publish(&mut c, &id, &staging, &target, mount_cap())
        .await
        .unwrap();
    assert!(is_mounted(&target));
    unpublish(&mut c, &id, &target).await.unwrap();
    assert!(!is_mounted(&target));
    unstage(&mut c, &id, &staging).await.unwrap();
    assert!(!is_mounted(&staging), "unstage left the mount behind");
    assert!(mounts_of(&rig.loops[0]).is_empty());
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            secrets: Default::default(),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_during_stage_never_gets_the_volume_mounted_outside() {
    let Some(mut rig) = Rig::new(1) else { return };
    let outside = tempfile::Builder::new()
        .prefix("gds-outside-")
        .tempdir_in("/tmp")
        .unwrap();
    let _cleanup = Cleanup(vec![rig.dir.path().to_owned(), outside.path().to_owned()]);
    fs::create_dir_all(outside.path().join("globalmount")).unwrap();
    let race = rig.path("race");
    fs::create_dir_all(race.join("a/globalmount")).unwrap();
    std::os::unix::fs::symlink(outside.path(), race.join("b")).unwrap();
    let staging = race.join("a/globalmount");

    let mut c = rig.start().await;
    let id = create(&mut c, "r", mount_cap()).await;
    // Format once before the race: the race is about the mount.
    stage(&mut c, &id, &staging, mount_cap()).await.unwrap();
    unstage(&mut c, &id, &staging).await.unwrap();

    // `a` (the real directory) and `b` (a link out of the root) trade places all along.
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps, race) = (stop.clone(), swaps.clone(), race.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &race.join("a"),
                    nix::fcntl::AT_FDCWD,
                    &race.join("b"),
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut staged, mut refused, mut taken_down, mut escaped) = (0, 0, 0, Vec::new());
    let mut leaked = Vec::new();
    for _ in 0..60 {
        let r = stage(&mut c, &id, &staging, mount_cap()).await;
        escaped.extend(mounts_under(outside.path()));
        match r {
            Ok(()) => {
                staged += 1;
                // Unstage until the name resolves to the real directory again.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !mounts_of(&rig.loops[0]).is_empty() && Instant::now() < deadline {
                    let _ = unstage(&mut c, &id, &staging).await;
                }
            }
            Err(e) => {
                refused += 1;
                // Mounted, then the swap moved it away from the path: taken down again.
                if e.message().contains("not mounted after mount succeeded") {
                    taken_down += 1;
                }
                leaked.extend(mounts_of(&rig.loops[0]));
            }
        }
        if !escaped.is_empty() || !leaked.is_empty() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!(
        "stage under a symlink race: {staged} staged, {refused} refused \
         ({taken_down} mounted then taken down), {} swaps",
        swaps.load(Ordering::Relaxed)
    );
    assert!(swaps.load(Ordering::Relaxed) > 0, "the race never ran");
    assert!(escaped.is_empty(), "mounted outside the root: {escaped:?}");
    assert!(leaked.is_empty(), "a failed stage left mounts: {leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_below_the_root_is_not_crossed_and_a_file_is_not_a_staging_dir() {
    let Some(mut rig) = Rig::new(1) else { return };
    // Stands for a bind mount of `/` placed under the kubelet directory; an own
    // directory keeps the test from writing to the host's /tmp.
    let outside = tempfile::Builder::new()
        .prefix("gds-outside-")
        .tempdir_in("/tmp")
        .unwrap();
    let elsewhere = rig.path("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    let _cleanup = Cleanup(vec![rig.dir.path().to_owned(), outside.path().to_owned()]);
    common::run(
        "mount",
        &[
            "--bind",
            outside.path().to_str().unwrap(),
            elsewhere.to_str().unwrap(),
        ],
    );
    let mut c = rig.start().await;
    let id = create(&mut c, "x", mount_cap()).await;
    let file = rig.path("a-file");
    fs::write(&file, b"keep").unwrap();

    let staging = elsewhere.join("tmp/escape/globalmount");
    let err = stage(&mut c, &id, &staging, mount_cap())
        .await
        .expect_err("staging across a mount below the root");
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains("staging_target_path"),
        "{}",
        err.message()
    );
    assert!(
        !outside.path().join("tmp").exists(),
        "a directory was created outside the root's filesystem"
    );
    let err = stage(&mut c, &id, &file, mount_cap())
        .await
        .expect_err("a file as staging path");
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains("not a directory"),
        "{}",
        err.message()
    );
    assert_eq!(fs::read(&file).unwrap(), b"keep");
    assert!(mounts_of(&rig.loops[0]).is_empty());
    // The same volume stages fine on the root's own filesystem.
    let good = rig.path("staging/x");
    stage(&mut c, &id, &good, mount_cap()).await.unwrap();
    unstage(&mut c, &id, &good).await.unwrap();
}

/// The driver container sees the kubelet directory through a bind mount with Bidirectional
/// propagation: a mount made with `move_mount` (publish) or `mount(2)` on a descriptor
/// (stage) must show on the kubelet's (host's) side as `mount(8)`'s did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_and_publish_mounts_propagate_to_the_kubelets_side() {
    let Some(mut rig) = Rig::new(1) else { return };
    let _cleanup = Cleanup(vec![rig.dir.path().to_owned()]);
    let host_side = rig.path("host-kubelet");
    let container_side = rig.path("container-kubelet");
    fs::create_dir_all(&host_side).unwrap();
    fs::create_dir_all(&container_side).unwrap();
    let (h, k) = (
        host_side.to_str().unwrap(),
        container_side.to_str().unwrap(),
    );
    common::run("mount", &["--bind", h, h]);
    common::run("mount", &["--make-shared", h]);
    common::run("mount", &["--bind", h, k]);
    let mut c = rig.start_with(&[], &["--allowed-path-root", k]).await;
    let id = create(&mut c, "p", mount_cap()).await;
    let staging = container_side.join("plugins/kubernetes.io/csi/d/h/globalmount");
    let target = container_side.join("pods/u/volumes/kubernetes.io~csi/pv/mount");
    stage(&mut c, &id, &staging, mount_cap()).await.unwrap();
    publish(&mut c, &id, &staging, &target, mount_cap())
        .await
        .unwrap();
    fs::write(target.join("seen"), b"from the pod").unwrap();
    let on_host = host_side.join("pods/u/volumes/kubernetes.io~csi/pv/mount");
    assert!(is_mounted(&on_host), "publish did not propagate");
    assert!(is_mounted(
        &host_side.join("plugins/kubernetes.io/csi/d/h/globalmount")
    ));
    assert_eq!(fs::read(on_host.join("seen")).unwrap(), b"from the pod");
    // A read-only publish appears read-only at once (mount_setattr on the detached copy).
    let ro_target = container_side.join("pods/v/volumes/kubernetes.io~csi/pv/mount");
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
            target_path: ro_target.to_str().unwrap().into(),
            volume_capability: Some(mount_cap()),
            readonly: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let err = fs::write(ro_target.join("nope"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(fs::read(ro_target.join("seen")).unwrap(), b"from the pod");
    unpublish(&mut c, &id, &ro_target).await.unwrap();
    unpublish(&mut c, &id, &target).await.unwrap();
    assert!(!is_mounted(&on_host), "unpublish did not propagate");
    unstage(&mut c, &id, &staging).await.unwrap();
    assert!(mounts_of(&rig.loops[0]).is_empty());
}
