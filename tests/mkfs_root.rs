//! Formatting and erasing under hostile timing (root, real loop devices, the real binary):
//! a filesystem written between probe and mkfs, a device held by another program, the
//! driver SIGKILLed during a slow mkfs, a caller that gives up during mkfs, and the
//! erase on delete. mkfs.ext4 and wipefs are stand-ins on the driver's PATH (the Rig puts
//! them there) that call the real tools, so real mkfs runs are counted, not log lines.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tools::{blkid_tag, process_ended, reads_back_zeros, Tools, FOREIGN_UUID};
use common::{mounts_at, requests, Rig};
use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

fn cap(block: bool) -> VolumeCapability {
    requests::capability(Mode::SingleNodeWriter, block)
}

async fn create(c: &mut Clients, name: &str, block: bool) -> String {
    requests::create_volume_id(c, name, cap(block)).await
}

async fn stage(c: &mut Clients, id: &str, staging: &std::path::Path) -> Result<(), tonic::Status> {
    requests::stage(c, id, staging, cap(false)).await
}

/// Closes the mkfs stand-in's gate and stages `id` in a task; returns once mkfs has been
/// called and waits at the gate.
async fn stage_held_in_mkfs(
    c: &Clients,
    tools: &Tools,
    id: &str,
    staging: &std::path::Path,
) -> tokio::task::JoinHandle<Result<(), tonic::Status>> {
    tools.close_gate();
    let call = tokio::spawn({
        let mut c = c.clone();
        let (id, staging) = (id.to_owned(), staging.to_owned());
        async move { stage(&mut c, &id, &staging).await }
    });
    wait_until("mkfs to be called", Duration::from_secs(10), || {
        !tools.mkfs_calls().is_empty()
    })
    .await;
    call
}

/// Runs `flock --nonblock --exclusive DEV true`: fails while another process holds
/// the block-device lock.
fn try_lock(dev: &std::path::Path) -> std::process::ExitStatus {
    Command::new("flock")
        .args(["--nonblock", "--exclusive", dev.to_str().unwrap(), "true"])
        .status()
        .unwrap()
}

async fn wait_until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn setup() -> Option<(Rig, Tools, PathBuf)> {
    let rig = Rig::new(1)?;
    let tools = rig.tools.clone();
    let staging = rig.path("kubelet/staging/v");
    fs::create_dir_all(&staging).unwrap();
    Some((rig, tools, staging))
}

/// `setup`, the driver started, and a mount volume "v" created: (rig, tools, staging,
/// clients, volume id).
async fn started_with_volume() -> Option<(Rig, Tools, PathBuf, Clients, String)> {
    let (mut rig, tools, staging) = setup()?;
    let mut c = rig.start().await;
    let id = create(&mut c, "v", false).await;
    Some((rig, tools, staging, c, id))
}

/// A foreign ext4 written after the first probe is found by the probe
/// taken again under the device hold; mkfs.ext4 (no tty) would have overwritten it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_written_after_the_first_probe_is_not_formatted() {
    let Some((rig, tools, staging, mut c, id)) = started_with_volume().await else {
        return;
    };
    let dev = rig.loops[0].clone();
    tools.inject_foreign_after_probe(&dev);
    let err = stage(&mut c, &id, &staging).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(FOREIGN_UUID), "{}", err.message());
    assert!(tools.mkfs_calls().is_empty(), "mkfs was not called");
    assert_eq!(
        blkid_tag(&dev, "UUID"),
        FOREIGN_UUID,
        "the foreign ext4 survived"
    );
    assert_eq!(mounts_at(&staging), 0);
}

/// While mkfs runs, the device carries util-linux's block-device lock,
/// so cooperating tools (sfdisk/wipefs --lock, flock(1), udev) keep off it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkfs_runs_under_the_block_device_lock() {
    let Some((rig, tools, staging, c, id)) = started_with_volume().await else {
        return;
    };
    let dev = rig.loops[0].clone();
    let call = stage_held_in_mkfs(&c, &tools, &id, &staging).await;
    let locked = try_lock(&dev);
    assert_eq!(locked.code(), Some(1), "the device is locked during mkfs");
    tools.open_gate();
    call.await.unwrap().expect("stage after the gate opened");
    assert_eq!(tools.mkfs_runs(), 1);
    let free = try_lock(&dev);
    assert!(free.success(), "the lock is released after mkfs");
}

/// A driver SIGKILLed while its mkfs waits takes the mkfs with it (parent-
/// death signal), and its restarted self formats once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_during_mkfs_takes_its_mkfs_with_it() {
    let Some((mut rig, tools, staging, c, id)) = started_with_volume().await else {
        return;
    };
    let call = stage_held_in_mkfs(&c, &tools, &id, &staging).await;
    let orphan = tools.mkfs_calls()[0];
    rig.kill9();
    assert!(
        call.await.unwrap().is_err(),
        "the killed call never answers"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !process_ended(orphan) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ended = process_ended(orphan);
    tools.open_gate();
    assert!(ended, "mkfs (pid {orphan}) outlived the SIGKILLed driver");
    let mut c = rig.start().await;
    stage(&mut c, &id, &staging)
        .await
        .expect("stage after restart");
    assert_eq!(tools.mkfs_calls().len(), 2);
    assert_eq!(
        tools.mkfs_runs(),
        1,
        "one real mkfs across both driver processes"
    );
    assert_eq!(mounts_at(&staging), 1);
}

/// A device that another program holds exclusively (an mkfs left running
/// by an earlier driver process, a mount in another namespace) is not taken for blank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_held_by_another_program_is_not_formatted() {
    let Some((rig, tools, staging, mut c, id)) = started_with_volume().await else {
        return;
    };
    let dev = rig.loops[0].clone();
    let holder = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&dev)
        .unwrap();
    let err = stage(&mut c, &id, &staging).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("in use"), "{}", err.message());
    assert!(tools.mkfs_calls().is_empty(), "mkfs was not called");
    drop(holder);
    stage(&mut c, &id, &staging)
        .await
        .expect("stage once released");
    assert_eq!(tools.mkfs_runs(), 1);
}

/// Long commands: the caller gives up during mkfs (the kubelet's deadline); mkfs
/// goes on, the retry joins it, and it runs once; start and end are logged with the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stage_leaves_mkfs_running_and_the_retry_joins_it() {
    let Some((rig, tools, staging, c, id)) = started_with_volume().await else {
        return;
    };
    let first = stage_held_in_mkfs(&c, &tools, &id, &staging).await;
    // The client cancels: the request future is dropped and the stream reset.
    first.abort();
    let _ = first.await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let retry = tokio::spawn({
        let mut c = c.clone();
        let (id, staging) = (id.clone(), staging.clone());
        let attempts = Arc::clone(&attempts);
        async move {
            // The CO retries; Aborted until the server has seen the cancel.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                attempts.fetch_add(1, Ordering::SeqCst);
                match stage(&mut c, &id, &staging).await {
                    Err(e) if e.code() == Code::Aborted && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    other => return other,
                }
            }
        }
    });
    // Whether the retry arrives while mkfs waits or after, it must not start mkfs again.
    wait_until("the retry to be sent", Duration::from_secs(10), || {
        attempts.load(Ordering::SeqCst) > 0
    })
    .await;
    tools.open_gate();
    retry
        .await
        .unwrap()
        .expect("the retry joins the running mkfs");
    assert_eq!(tools.mkfs_calls().len(), 1, "mkfs was not started over");
    assert_eq!(tools.mkfs_runs(), 1);
    assert_eq!(mounts_at(&staging), 1);
    let logs = rig.logs();
    assert!(logs.contains("long job started"), "{logs}");
    let finished = logs
        .lines()
        .find(|l| l.contains("long job finished") && l.contains("mkfs"))
        .unwrap_or_else(|| panic!("no end line: {logs}"));
    assert!(finished.contains("seconds="), "{finished}");
}

/// Writes `len` bytes of 0xa5 over the start of `path` from a child process. Not from this
/// process: the harness runs tests on several threads, and a descriptor held here is
/// inherited by every child another test forks meanwhile, keeping the staging mount busy
/// (EBUSY on the driver's unmount) until that child execs, which a loaded machine delays.
fn pattern_write(path: &std::path::Path, len: usize) {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"head -c "$1" /dev/zero | tr '\000' '\245' | dd of="$2" bs=1M iflag=fullblock conv=notrunc,fsync status=none"#)
        .arg("sh")
        .arg(len.to_string())
        .arg(path)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "writing the pattern to {}",
        path.display()
    );
}

/// Erase on delete: the next tenant of a device reads zeros, not the deleted
/// volume's blocks, whether they were written through a filesystem or raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_volumes_blocks_read_back_as_zeros() {
    let Some((mut rig, _tools, staging)) = setup() else {
        return;
    };
    let mut c = rig.start().await;
    let dev = rig.loops[0].clone();

    // Written through the staged filesystem.
    let id = create(&mut c, "fs", false).await;
    stage(&mut c, &id, &staging).await.unwrap();
    let file = staging.join("secret.bin");
    fs::File::create(&file).unwrap();
    pattern_write(&file, 8 << 20);
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    assert!(!reads_back_zeros(&dev), "the pattern is on the device");
    c.controller
        .delete_volume(requests::delete_request(&id))
        .await
        .unwrap();
    assert!(
        reads_back_zeros(&dev),
        "the deleted filesystem volume's blocks are zeros"
    );

    // Written raw, as a block-mode claim does (no filesystem, no signature).
    let id = create(&mut c, "raw", true).await;
    pattern_write(&dev, 4 << 20);
    assert!(!reads_back_zeros(&dev));
    c.controller
        .delete_volume(requests::delete_request(&id))
        .await
        .unwrap();
    assert!(
        reads_back_zeros(&dev),
        "the deleted raw volume's blocks are zeros"
    );
    // And the device is back in the pool.
    create(&mut c, "next", false).await;
}

/// A stage retried onto an existing mount of the volume (the retry after a
/// crash right after mount) checks `data=ordered` again instead of answering OK unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_stage_checks_the_mount_options_again() {
    let Some((rig, tools, staging, mut c, id)) = started_with_volume().await else {
        return;
    };
    stage(&mut c, &id, &staging).await.unwrap();
    let dev = rig.loops[0].clone();
    let staging_arg = staging.to_str().unwrap();
    common::run("umount", &[staging_arg]);
    common::run(
        "mount",
        &[
            "-t",
            "ext4",
            "-o",
            "data=writeback",
            dev.to_str().unwrap(),
            staging_arg,
        ],
    );
    let err = stage(&mut c, &id, &staging).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("options GDS needs"),
        "{}",
        err.message()
    );
    assert_eq!(
        mounts_at(&staging),
        0,
        "the mount without data=ordered was taken down"
    );
    stage(&mut c, &id, &staging)
        .await
        .expect("staged properly again");
    assert_eq!(tools.mkfs_runs(), 1);
}

/// Long commands: the erase on delete is a job too. Held up by util-linux's lock
/// (taken here as another tool would), the DeleteVolume call is cancelled; the retry joins
/// the erase, which runs once and zeroes the device once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_delete_leaves_the_erase_running_and_the_retry_joins_it() {
    let Some((mut rig, _tools, _staging)) = setup() else {
        return;
    };
    let mut c = rig.start().await;
    let dev = rig.loops[0].clone();
    let id = create(&mut c, "raw", true).await;
    pattern_write(&dev, 4 << 20);
    let lock = nix::fcntl::Flock::lock(
        fs::File::open(&dev).unwrap(),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .map_err(|(_, e)| e)
    .unwrap();
    let delete = |mut c: Clients, id: String| async move {
        c.controller
            .delete_volume(requests::delete_request(&id))
            .await
            .map(|_| ())
    };
    let first = tokio::spawn(delete(c.clone(), id.clone()));
    let erase_started = |rig: &Rig| {
        rig.logs()
            .lines()
            .filter(|l| l.contains("long job started") && l.contains("erase"))
            .count()
    };
    wait_until("the erase job to start", Duration::from_secs(10), || {
        erase_started(&rig) == 1
    })
    .await;
    first.abort();
    let _ = first.await;
    let retry = tokio::spawn({
        let c = c.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match delete(c.clone(), id.clone()).await {
                    Err(e) if e.code() == Code::Aborted && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    other => return other,
                }
            }
        }
    });
    assert!(
        !reads_back_zeros(&dev),
        "nothing erased while the lock is held"
    );
    drop(lock);
    retry.await.unwrap().expect("the retry joins the erase");
    assert!(reads_back_zeros(&dev));
    assert_eq!(erase_started(&rig), 1, "the erase was not started over");
    assert!(rig.state()["volumes"].as_object().unwrap().is_empty());
}
