//! Root-only (long work survives the caller giving up): the partition
//! layout's DeleteVolume (erase, then partition removal) is a job. A delete cancelled by
//! its client deadline leaves the job running with the device held; the retry joins it
//! (one job, one zero-out in all) and the partition's blocks read back as zeros. The
//! drive is made slow the way a hung one is: its loop device writes into a file on an
//! ext4 frozen with `fsfreeze`. (On the 6.18 dev kernel the offloaded zero-out of such
//! a loop device returns at once even while frozen; the label write after it blocks
//! until the thaw.) Also: picking passes over a pool device that is a partition, and
//! the two layouts never both take one blank device. `GDS_CSI_NO_SKIP=1` fails a skip.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::*;
use gds_csi::disk::gpt::kernel;
use tonic::Code;

use common::frozen::FrozenDevice;
use common::tools::{scribble, zeros_at};
use common::{requests, Rig};

const MIB: u64 = 1 << 20;

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

async fn delete(
    c: &mut gds_csi::csi::Clients,
    id: &str,
    within: Duration,
) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(requests::delete_request(id));
    req.set_timeout(within);
    c.controller.delete_volume(req).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_delete_leaves_the_erase_running_and_the_retry_joins_it() {
    let Some(f) = FrozenDevice::new(768 * MIB) else {
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
        scribble(&node, at, 0xA5);
    }
    assert!(!zeros_at(&f.dev, part.start, part.len));

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
    let erase_jobs = count(&logs, "long job started job=\"partition-erase\"");
    assert_eq!(erase_jobs, 1, "one erase job: {logs}");
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
        zeros_at(&f.dev, part.start, part.len),
        "the deleted partition reads back zeros"
    );
    println!("erase from the first call: {full:?}; the retry waited {retry_took:?}");
}

/// The partition layout over `listed` devices, in process (real host).
fn layout(
    listed: Vec<PathBuf>,
    state: &Path,
) -> std::sync::Arc<gds_csi::volume::block::partition::Partitioned> {
    let pool = gds_csi::pool::Pool::open(gds_csi::pool::PoolConfig {
        node_id: "node-a".into(),
        host_sys: "/sys".into(),
        host_dev: "/dev".into(),
        listed,
        nvme_discover: false,
        state_dir: state.to_owned(),
    })
    .unwrap();
    pool.rescan(&real_host().mount_table().unwrap());
    std::sync::Arc::new(gds_csi::volume::block::partition::Partitioned::new(
        std::sync::Arc::new(pool),
    ))
}

fn real_host() -> std::sync::Arc<dyn gds_csi::os::Host> {
    std::sync::Arc::new(gds_csi::os::RealHost {
        command_timeout: Duration::from_secs(30),
        mount_timeout: Duration::from_secs(30),
    })
}

fn alloc_req(name: &str, bytes: u64) -> gds_csi::pool::AllocationRequest {
    gds_csi::pool::AllocationRequest {
        name: name.into(),
        required_bytes: bytes,
        limit_bytes: 0,
        fs_type: gds_csi::os::FsType::Ext4,
        parameters: [("layout".to_string(), "partition".to_string())].into(),
        source: None,
    }
}

/// Loop devices on sparse files; their partitions leave the kernel before the detach.
struct Loops(tempfile::TempDir, Vec<PathBuf>);

impl Loops {
    fn new(sizes: &[u64]) -> Option<Loops> {
        if !common::is_root() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-pick-")
            .tempdir_in("/tmp")
            .unwrap();
        let loops = sizes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let img = dir.path().join(format!("d{i}.img"));
                fs::File::create(&img).unwrap().set_len(*s).unwrap();
                common::attach_loop(&img)
            })
            .collect();
        Some(Loops(dir, loops))
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        for dev in &self.1 {
            for p in kernel::list(dev).unwrap_or_default() {
                for _ in 0..50 {
                    if kernel::delete(dev, p.number).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            common::detach_loop(dev);
        }
    }
}

/// A `--pool-device` that is itself a partition (blank, and the smallest, so tried
/// first) is passed over: the create carves the next device, and with nothing else the
/// ResourceExhausted message names the partition and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_device_that_is_a_partition_is_passed_over() {
    use gds_csi::volume::block::Layout;
    let Some(l) = Loops::new(&[64 * MIB, 128 * MIB]) else {
        return;
    };
    let (outer, whole) = (&l.1[0], &l.1[1]);
    // A foreign GPT with one 32 MiB partition on `outer`; the kernel told by partx.
    let mut ch = std::process::Command::new("sfdisk")
        .args(["--quiet", "--label", "gpt", outer.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ch.stdin.take().unwrap().write_all(b"size=32M\n").unwrap();
    assert!(ch.wait().unwrap().success());
    common::run("partx", &["-a", outer.to_str().unwrap()]);
    let part = kernel::list(outer).unwrap();
    assert_eq!(part.len(), 1, "{part:?}");
    let part_node = PathBuf::from("/dev").join(&part[0].name);
    let before = common::digest_file(&part_node);
    let host = real_host();

    let p = layout(
        vec![part_node.clone(), whole.clone()],
        &l.0.path().join("s1"),
    );
    let (_, rec) = p
        .allocate(host.as_ref(), &alloc_req("pv", 8 * MIB))
        .await
        .expect("carved on the whole device after passing over the partition");
    assert_eq!(p.pool.device(&rec.device_id).unwrap().path, *whole);
    assert_eq!(kernel::list(whole).unwrap().len(), 1);

    let alone = layout(vec![part_node.clone()], &l.0.path().join("s2"));
    let err = alone
        .allocate(host.as_ref(), &alloc_req("pv", 8 * MIB))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert_eq!(
        tonic::Status::from(err).code(),
        Code::ResourceExhausted,
        "{msg}"
    );
    assert!(
        msg.contains(part_node.to_str().unwrap()) && msg.contains("a partition"),
        "{msg}"
    );
    let text = gds_csi::metrics::encode(&gds_csi::metrics::registry(None, "/nonexistent".into()));
    assert!(
        text.lines()
            .any(|l| l.starts_with("gds_csi_partition_device_refusals_total{reason=\"foreign\"}")),
        "{text}"
    );
    assert_eq!(
        common::digest_file(&part_node),
        before,
        "the partition was not written"
    );
}

/// Two layouts, one driver: a whole-device create and a partition create racing for one
/// blank device never both take it (the partition layout marks it under the state lock
/// before its label write; the whole-device claim checks that mark under the same lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_layouts_never_both_take_one_blank_device() {
    use gds_csi::volume::block::Layout;
    use gds_csi::volume::block::WholeDevice;
    const ROUNDS: usize = 8;
    let Some(l) = Loops::new(&[64 * MIB; ROUNDS]) else {
        return;
    };
    let host = real_host();
    let mut both = Vec::new();
    for (i, dev) in l.1.iter().enumerate() {
        let p = layout(vec![dev.clone()], &l.0.path().join(format!("s{i}")));
        let whole = WholeDevice {
            pool: std::sync::Arc::clone(&p.pool),
        };
        let mut wreq = alloc_req("w", 8 * MIB);
        wreq.parameters.clear();
        let (h1, h2) = (std::sync::Arc::clone(&host), std::sync::Arc::clone(&host));
        let (w, c) = tokio::join!(
            async move { whole.allocate(h1.as_ref(), &wreq).await },
            async { p.allocate(h2.as_ref(), &alloc_req("p", 8 * MIB)).await },
        );
        if w.is_ok() && c.is_ok() {
            both.push(dev.clone());
        }
        assert!(
            w.is_ok() || c.is_ok(),
            "round {i}: one of them takes it: {w:?} {c:?}"
        );
    }
    assert!(both.is_empty(), "taken whole and carved at once: {both:?}");
}
