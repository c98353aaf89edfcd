//! Root-only (issue 13, "long work survives the caller giving up"): the partition
//! layout's erase on DeleteVolume is a job. A delete cancelled by its client deadline
//! leaves the zero-out running; the retry joins it (one zero-out in all) and the
//! partition's blocks read back as zeros. The drive is made slow the way a dying or busy
//! one is: its loop device writes into a file on an ext4 frozen with `fsfreeze`, so the
//! zero-out blocks in the kernel until the thaw. `GDS_CSI_NO_SKIP=1` fails a skip.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::*;
use gds_csi::partition::kernel;
use tonic::Code;

use common::{requests, Rig};

const MIB: u64 = 1 << 20;

/// A loop device whose writes block while `freeze(true)`: its backing file sits on an
/// ext4 of its own (on another loop device).
struct Freezable {
    _dir: tempfile::TempDir,
    outer: PathBuf,
    mnt: PathBuf,
    dev: PathBuf,
}

impl Freezable {
    fn new(size: u64) -> Option<Freezable> {
        if !common::is_root() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-erase-")
            .tempdir_in("/tmp")
            .unwrap();
        let img = dir.path().join("outer.img");
        fs::File::create(&img)
            .unwrap()
            .set_len(size + 64 * MIB)
            .unwrap();
        common::run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
        let outer = common::attach_loop(&img);
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        common::run("mount", &[outer.to_str().unwrap(), mnt.to_str().unwrap()]);
        let inner = mnt.join("dev.img");
        fs::File::create(&inner).unwrap().set_len(size).unwrap();
        let dev = common::attach_loop(&inner);
        Some(Freezable {
            _dir: dir,
            outer,
            mnt,
            dev,
        })
    }

    fn freeze(&self, on: bool) {
        let flag = if on { "-f" } else { "-u" };
        common::run("fsfreeze", &[flag, self.mnt.to_str().unwrap()]);
    }
}

impl Drop for Freezable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze")
            .args(["-u", self.mnt.to_str().unwrap()])
            .stderr(std::process::Stdio::null())
            .status();
        for p in kernel::list(&self.dev).unwrap_or_default() {
            for _ in 0..100 {
                if kernel::delete(&self.dev, p.number).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        common::detach_loop(&self.dev);
        for _ in 0..100 {
            let umount = std::process::Command::new("umount").arg(&self.mnt).status();
            if umount.is_ok_and(|s| s.success()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        common::detach_loop(&self.outer);
    }
}

fn create_req(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![requests::capability(
            volume_capability::access_mode::Mode::SingleNodeWriter,
            true,
        )],
        parameters: [
            ("gdsPolicy".to_string(), "disabled".to_string()),
            ("layout".to_string(), "partition".to_string()),
        ]
        .into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

fn count(logs: &str, needle: &str) -> usize {
    logs.lines().filter(|l| l.contains(needle)).count()
}

/// Writes one MiB of 0xA5 at byte `at` of `node` and flushes it to the device.
fn scribble(node: &Path, at: u64) {
    let mut f = fs::OpenOptions::new().write(true).open(node).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&vec![0xA5; MIB as usize]).unwrap();
    f.sync_all().unwrap();
}

/// Whether `len` bytes at `start` of `dev` are all zero (its page cache dropped first).
fn zeros(dev: &Path, start: u64, len: u64) -> bool {
    common::run("blockdev", &["--flushbufs", dev.to_str().unwrap()]);
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        f.read_exact(&mut buf[..n]).unwrap();
        if buf[..n].iter().any(|&b| b != 0) {
            return false;
        }
        left -= n as u64;
    }
    true
}

async fn delete(
    c: &mut gds_csi::client::Clients,
    id: &str,
    within: Duration,
) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(requests::delete_request(id));
    req.set_timeout(within);
    c.controller.delete_volume(req).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_delete_leaves_the_erase_running_and_the_retry_joins_it() {
    let Some(f) = Freezable::new(768 * MIB) else {
        return;
    };
    let mut rig = Rig::with_sizes(&[]).unwrap();
    let mut c = rig
        .start_with(&[], &["--pool-device", f.dev.to_str().unwrap()])
        .await;
    let vol = requests::create_volume(&mut c, create_req("big", 512 * MIB)).await;
    let parts = kernel::list(&f.dev).unwrap();
    assert_eq!(parts.len(), 1, "{parts:?}");
    let part = parts[0].clone();
    let node = PathBuf::from("/dev").join(&part.name);
    for at in [0, part.len / 2, part.len - MIB] {
        scribble(&node, at);
    }
    assert!(!zeros(&f.dev, part.start, part.len));

    f.freeze(true);
    let began = Instant::now();
    let first = delete(&mut c, &vol.volume_id, Duration::from_secs(1)).await;
    let err = first.expect_err("the zero-out cannot finish on a frozen device");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    let zeroing = |rig: &Rig| count(&rig.logs(), "zeroing the partition");
    let deadline = Instant::now() + Duration::from_secs(20);
    while zeroing(&rig) == 0 {
        assert!(
            Instant::now() < deadline,
            "no zero-out started: {}",
            rig.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The retry joins the running job; the thaw lets it finish.
    let retry = tokio::spawn({
        let (mut c, id) = (c.clone(), vol.volume_id.clone());
        async move {
            let began = Instant::now();
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match delete(&mut c, &id, Duration::from_secs(60)).await {
                    Err(e) if e.code() == Code::Aborted && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    other => return other.map(|()| began.elapsed()),
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!retry.is_finished(), "the retry waits for the erase");
    f.freeze(false);
    let retry_took = retry.await.unwrap().expect("the retry joins the erase");
    let full = began.elapsed();
    let logs = rig.logs();
    assert_eq!(
        count(&logs, "zeroing the partition"),
        1,
        "one zero-out: {logs}"
    );
    assert_eq!(count(&logs, "long job started"), 1, "one erase job: {logs}");
    assert!(
        retry_took < full,
        "the retry ({retry_took:?}) did not start over ({full:?})"
    );
    assert!(
        kernel::list(&f.dev).unwrap().is_empty(),
        "partition removed"
    );
    assert!(rig.state()["volumes"].as_object().unwrap().is_empty());
    rig.kill9();
    assert!(
        zeros(&f.dev, part.start, part.len),
        "the deleted partition reads back zeros"
    );
    println!("erase from the first call: {full:?}; the retry waited {retry_took:?}");
}
