//! Block → block clones through the real binary on loop devices: CreateVolume
//! with `volume_content_source.volume` checks the source (missing: NotFound; too small
//! a limit: OutOfRange naming both sizes, nothing created; raw block access to a source
//! that holds a filesystem: InvalidArgument), copies a source in use at CreateVolume, frozen
//! (a clone is the source as it is at CreateVolume), pins the clone to the source's node and answers
//! the content source; the first NodeStage copies (after mkfs, before the staging mount)
//! and the published clone holds the source's files, owners, modes, symlinks and hard
//! links; a restage copies nothing again; delete drops the record.
//!
//! Raw block clones: the source's bytes as they were at the clone's CreateVolume (the
//! source's next stage fills its clone before anything writes it again), zeros past the
//! source's size on a bigger clone (whole device and partition), a published source
//! refused, a NodeStage given up while the copy waits on a frozen device joined by its
//! retry.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::frozen::{FrozenDevice, ThawOnDrop};
use common::{digest_file, requests, PartRig, Rig, SIZE};

fn clone_req(name: &str, source: &str) -> CreateVolumeRequest {
    let mut req = requests::create_without_gds(name, requests::single_writer_mount());
    req.parameters.insert("verify".into(), "checksum".into());
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: source.into(),
        })),
    });
    req
}

fn fill_source(root: &Path) {
    fs::create_dir_all(root.join("data/deep")).unwrap();
    let payload: Vec<u8> = (0..(5 << 20) + 11)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(root.join("data/weights.bin"), &payload).unwrap();
    fs::write(root.join("data/deep/small"), b"small").unwrap();
    nix::unistd::chown(
        &root.join("data/deep/small"),
        Some(1234.into()),
        Some(4321.into()),
    )
    .unwrap();
    fs::set_permissions(
        root.join("data/deep/small"),
        fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    symlink("/etc/hostname", root.join("data/outside")).unwrap();
    fs::hard_link(
        root.join("data/weights.bin"),
        root.join("data/weights.link"),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_is_filled_from_its_source_before_it_can_be_published() {
    let Some(rig) = Rig::new(3) else { return };
    let mut rig = rig;
    let (mut c, addr) = start_with_metrics(&mut rig).await;
    let mount = requests::single_writer_mount();
    let (source, s_staging, s_target) = published_source(&rig, &mut c).await;
    fill_source(&s_target);

    // Refused before anything is allocated.
    let listed = |c: &mut gds_csi::csi::Clients| {
        let mut c = c.clone();
        async move {
            c.controller
                .list_volumes(ListVolumesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .entries
                .len()
        }
    };
    let before = listed(&mut c).await;
    let mut small = clone_req("small", &source);
    small.capacity_range = Some(CapacityRange {
        required_bytes: 1 << 20,
        limit_bytes: 32 << 20,
    });
    let err = c.controller.create_volume(small).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains(&SIZE.to_string())
            && err.message().contains(&(32u64 << 20).to_string()),
        "{}",
        err.message()
    );
    let err = c
        .controller
        .create_volume(clone_req(
            "lost",
            "blk:dev-0123456789abcdef:0badf00d:node-a",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let mut raw = clone_req("raw", &source);
    raw.volume_capabilities = vec![requests::capability(
        volume_capability::access_mode::Mode::SingleNodeWriter,
        true,
    )];
    let err = c.controller.create_volume(raw).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .starts_with("volume_capabilities: the source volume")
            && err.message().contains("holds an ext4 filesystem")
            && err.message().contains("ask for mount access"),
        "{}",
        err.message()
    );
    assert_eq!(listed(&mut c).await, before, "nothing created");

    requests::unpublish(&mut c, &source, &s_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &source, &s_staging)
        .await
        .unwrap();
    let clone = requests::create_volume(&mut c, clone_req("clone", &source)).await;
    assert_eq!(clone.capacity_bytes as u64, SIZE);
    assert!(
        matches!(&clone.content_source, Some(VolumeContentSource { r#type: Some(Type::Volume(v)) }) if v.volume_id == source)
    );
    assert_eq!(
        clone.accessible_topology[0]
            .segments
            .get("gds.csi.gds-csi.io/node")
            .map(String::as_str),
        Some("node-a")
    );
    let id = clone.volume_id;

    let (staging, target) = (rig.path("staging/clone"), rig.path("pods/p2/clone"));
    fs::create_dir_all(&staging).unwrap();
    // What a driver killed mid-copy leaves: the source mounted in the clone's private
    // directory. The copy takes it down first, and leaves nothing mounted there.
    let private = rig.path("state/clone-mnt").join(short(&id)).join("source");
    fs::create_dir_all(&private).unwrap();
    common::run(
        "mount",
        &[
            "-o",
            "ro",
            &device_of(&rig, &source),
            private.to_str().unwrap(),
        ],
    );
    requests::stage_and_publish(&mut c, &id, &staging, &target, mount.clone()).await;
    assert_eq!(common::mounts_at(&private), 0);
    // The source again, read-only beside it: what was copied.
    requests::stage_and_publish(&mut c, &source, &s_staging, &s_target, mount.clone()).await;
    for f in ["data/weights.bin", "data/deep/small", "data/weights.link"] {
        assert_eq!(
            digest_file(&target.join(f)),
            digest_file(&s_target.join(f)),
            "{f}"
        );
    }
    let small = fs::metadata(target.join("data/deep/small")).unwrap();
    assert_eq!(
        (small.uid(), small.gid(), small.mode() & 0o7777),
        (1234, 4321, 0o640)
    );
    assert_eq!(
        fs::read_link(target.join("data/outside")).unwrap(),
        Path::new("/etc/hostname")
    );
    let (a, b) = (
        fs::metadata(target.join("data/weights.bin")).unwrap(),
        fs::metadata(target.join("data/weights.link")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "hard link kept");

    // The figures: every byte of the two files (the hard link once) copied.
    let text = scrape(&addr);
    let bytes = (5u64 << 20) + 11 + 5;
    let series = |name: &str| format!("{name}{{volume=\"{id}\"}} {bytes}");
    assert!(
        text.contains(&series("gds_csi_clone_copied_bytes")),
        "{text}"
    );
    assert!(
        text.contains(&series("gds_csi_clone_total_bytes")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "gds_csi_clone_duration_seconds{{volume=\"{id}\"}}"
        )),
        "{text}"
    );

    // A restage copies nothing again: a file written in the clone stays, the source's
    // newer file does not appear.
    fs::write(target.join("mine"), b"clone's own").unwrap();
    fs::write(s_target.join("later"), b"after the copy").unwrap();
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    requests::stage_and_publish(&mut c, &id, &staging, &target, mount.clone()).await;
    assert_eq!(fs::read(target.join("mine")).unwrap(), b"clone's own");
    assert!(!target.join("later").exists());

    // The progress record, done, goes with the clone.
    let records = || {
        fs::read_dir(rig.path("state/clones"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert_eq!(records(), 1);
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    // What a driver killed mid-copy leaves: the clone mounted in its private directory.
    // DeleteVolume takes it down instead of finding the clone in use for ever.
    let dev = device_of(&rig, &id);
    let private = fs::read_dir(rig.path("state/clone-mnt"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("target");
    common::run("mount", &[&dev, private.to_str().unwrap()]);
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(records(), 0);
    assert_eq!(common::mounts_at(&private), 0);
    requests::unpublish(&mut c, &source, &s_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &source, &s_staging)
        .await
        .unwrap();
    rig.kill9();
}

/// The driver started with its metrics on a free port, and that address.
async fn start_with_metrics(rig: &mut Rig) -> (gds_csi::csi::Clients, String) {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    (
        rig.start_with(&[], &["--metrics-address", &addr]).await,
        addr,
    )
}

/// A filesystem volume `source`, staged and published to a pod: its id, its staging path
/// and where the pod sees it.
async fn published_source(
    rig: &Rig,
    c: &mut gds_csi::csi::Clients,
) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let mount = requests::single_writer_mount();
    let source = requests::create_volume_id(c, "source", mount.clone()).await;
    let (s_staging, s_target) = (rig.path("staging/src"), rig.path("pods/p1/src"));
    fs::create_dir_all(&s_staging).unwrap();
    requests::stage_and_publish(c, &source, &s_staging, &s_target, mount).await;
    (source, s_staging, s_target)
}

/// GET /metrics of the driver at `addr`, the body.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

fn device_of(rig: &Rig, id: &str) -> String {
    let key = rig.state()["volumes"][id]["device_key"]
        .as_str()
        .unwrap()
        .to_owned();
    key.strip_prefix("path:").unwrap().to_owned()
}

/// The clone's private directory name (src/runtime/state_dir/mod.rs `short`, as src/volume/block/clone/ names it).
fn short(id: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(id.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const MIB: u64 = 1 << 20;

fn raw_access() -> VolumeCapability {
    requests::capability(volume_capability::access_mode::Mode::SingleNodeWriter, true)
}

/// A raw block clone of `source` (verified byte for byte: `verify: checksum`).
fn raw_clone_req(name: &str, source: &str) -> CreateVolumeRequest {
    let mut req = clone_req(name, source);
    req.volume_capabilities = vec![raw_access()];
    req
}

fn pattern(len: u64, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

/// Stages and publishes `id` with raw block access, writes `bytes` at its start through
/// the published device node, flushes, and takes it down again.
async fn write_raw(c: &mut Clients, rig: &Rig, id: &str, bytes: &[u8]) {
    let (staging, target) = (rig.path("staging/writer"), rig.path("pods/writer/dev"));
    requests::stage_and_publish(c, id, &staging, &target, raw_access()).await;
    let dev = fs::OpenOptions::new().write(true).open(&target).unwrap();
    dev.write_all_at(bytes, 0).unwrap();
    dev.sync_all().unwrap();
    drop(dev);
    requests::unpublish(c, id, &target).await.unwrap();
    requests::unstage(c, id, &staging).await.unwrap();
}

/// Every byte of `id`'s device, read through a raw block publish.
async fn read_raw(c: &mut Clients, rig: &Rig, id: &str) -> Vec<u8> {
    let (staging, target) = (rig.path("staging/reader"), rig.path("pods/reader/dev"));
    requests::stage_and_publish(c, id, &staging, &target, raw_access()).await;
    let bytes = fs::read(&target).unwrap();
    requests::unpublish(c, id, &target).await.unwrap();
    requests::unstage(c, id, &staging).await.unwrap();
    bytes
}

fn count(logs: &str, needle: &str) -> usize {
    logs.lines().filter(|l| l.contains(needle)).count()
}

const COPY_STARTED: &str = "copying the source device onto the raw block clone";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_clone_holds_its_source_as_it_was_at_create_volume() {
    let Some(rig) = Rig::new(2) else { return };
    let mut rig = rig;
    let (mut c, addr) = start_with_metrics(&mut rig).await;
    let source = requests::create_volume_id(&mut c, "source", raw_access()).await;
    let first = pattern(SIZE, 1);
    write_raw(&mut c, &rig, &source, &first).await;

    // Published: refused, as a copy of a device a pod writes is a state that never
    // existed; nothing is created.
    let (s_staging, s_target) = (rig.path("staging/src"), rig.path("pods/p1/src"));
    requests::stage_and_publish(&mut c, &source, &s_staging, &s_target, raw_access()).await;
    let err = c
        .controller
        .create_volume(raw_clone_req("clone", &source))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("is in use (published as a raw block device at"),
        "{}",
        err.message()
    );
    assert_eq!(rig.state()["volumes"].as_object().unwrap().len(), 1);
    requests::unpublish(&mut c, &source, &s_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &source, &s_staging)
        .await
        .unwrap();

    let clone = requests::create_volume(&mut c, raw_clone_req("clone", &source)).await;
    let id = clone.volume_id;
    assert!(
        matches!(&clone.content_source, Some(VolumeContentSource { r#type: Some(Type::Volume(v)) }) if v.volume_id == source)
    );
    let recorded = &rig.state()["volumes"][&id];
    assert_eq!(recorded["source"]["of"]["volume"], source.as_str());
    assert_eq!(recorded["source"]["rawBlock"], true);
    // The source is the record's, not a parameter the volume context would carry.
    assert_eq!(recorded["parameters"].get("cloneSource"), None);
    // A repeated CreateVolume answers the same clone.
    let again = requests::create_volume(&mut c, raw_clone_req("clone", &source)).await;
    assert_eq!(again.volume_id, id);

    // The source is written again before the clone's first stage: its own stage fills
    // the clone first, so none of this reaches it.
    let second = pattern(SIZE, 2);
    write_raw(&mut c, &rig, &source, &second).await;
    assert_eq!(count(&rig.logs(), COPY_STARTED), 1, "{}", rig.logs());
    assert!(
        read_raw(&mut c, &rig, &id).await == first,
        "the clone holds the first pattern"
    );
    assert!(read_raw(&mut c, &rig, &source).await == second);
    assert_eq!(count(&rig.logs(), COPY_STARTED), 1, "copied once");

    // Its figures: every byte of the source copied.
    let text = scrape(&addr);
    for name in ["gds_csi_clone_copied_bytes", "gds_csi_clone_total_bytes"] {
        let series = format!("{name}{{volume=\"{id}\"}} {SIZE}");
        assert!(text.contains(&series), "{series}: {text}");
    }

    // The other kind is refused, naming the field and the fix: a filesystem clone of a
    // raw block clone, and a raw block clone staged with mount access.
    let err = c
        .controller
        .create_volume(clone_req("fs-of-raw", &id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .starts_with("volume_capabilities: the source volume")
            && err.message().contains("ask for block access"),
        "{}",
        err.message()
    );
    let staging = rig.path("staging/mounted");
    fs::create_dir_all(&staging).unwrap();
    let err = requests::stage(&mut c, &id, &staging, requests::single_writer_mount())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("volume_capability: volume")
            && err
                .message()
                .contains("stage and publish it with block access"),
        "{}",
        err.message()
    );
    let dev = device_of(&rig, &id);
    assert_eq!(
        common::blkid_code(Path::new(&dev)),
        Some(2),
        "never formatted"
    );

    for v in [&id, &source] {
        c.controller
            .delete_volume(requests::delete_request(v))
            .await
            .unwrap();
    }
    assert!(rig.state()["volumes"].as_object().unwrap().is_empty());
    rig.kill9();
}

/// A raw clone of `bytes` more than its source: the source's pattern, then zeros.
async fn a_bigger_raw_clone(rig: &mut Rig, params: &[(&str, &str)], source_bytes: u64) {
    let mut c = rig.start().await;
    let sized = |name: &str, bytes: u64, source: Option<&str>| {
        let mut req = match source {
            Some(s) => raw_clone_req(name, s),
            None => requests::create_without_gds(name, raw_access()),
        };
        req.parameters
            .extend(params.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        req.capacity_range = Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        });
        req
    };
    let source = requests::create_volume(&mut c, sized("source", source_bytes, None))
        .await
        .volume_id;
    let written = pattern(source_bytes, 3);
    write_raw(&mut c, rig, &source, &written).await;
    let clone = requests::create_volume(
        &mut c,
        sized("clone", source_bytes + 32 * MIB, Some(&source)),
    )
    .await;
    assert!(clone.capacity_bytes as u64 > source_bytes, "{clone:?}");
    let held = read_raw(&mut c, rig, &clone.volume_id).await;
    assert_eq!(held.len() as u64, clone.capacity_bytes as u64);
    let (head, tail) = held.split_at(source_bytes as usize);
    assert!(head == written, "the source's bytes");
    assert!(tail.iter().all(|&b| b == 0), "zeros past the source's size");
    rig.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_clone_bigger_than_its_source_reads_zeros_past_it_whole_device() {
    let Some(rig) = Rig::with_sizes(&[SIZE, 2 * SIZE]) else {
        return;
    };
    let mut rig = rig;
    // What an earlier user of the bigger device left past the source's size, without a
    // signature: the pool takes the device, and the clone must not show it.
    for at in [SIZE, SIZE + SIZE / 2, 2 * SIZE - MIB] {
        common::tools::scribble(&rig.loops[1], at, 0xA5);
    }
    a_bigger_raw_clone(&mut rig, &[], SIZE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_clone_bigger_than_its_source_reads_zeros_past_it_partition() {
    let Some(mut rig) = PartRig::with_size(1, 512 * MIB) else {
        return;
    };
    a_bigger_raw_clone(&mut rig, &[("layout", "partition")], 64 * MIB).await;
}

/// NodeStage with raw block access, given up after `within` as the kubelet does.
async fn stage_within(
    c: &Clients,
    id: &str,
    staging: &Path,
    within: Duration,
) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(requests::stage_request(id, staging, raw_access()));
    req.set_timeout(within);
    c.clone().node.node_stage_volume(req).await.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_node_stage_joins_the_running_raw_copy() {
    // Declared before the rig: dropped after its mounts are gone.
    let Some(frozen) = FrozenDevice::new(SIZE + 32 * MIB) else {
        return;
    };
    let mut rig = Rig::new(1).unwrap();
    let mut c = rig
        .start_with(&[], &["--pool-device", frozen.dev.to_str().unwrap()])
        .await;
    let source = requests::create_volume_id(&mut c, "source", raw_access()).await;
    assert_ne!(device_of(&rig, &source), frozen.dev.to_str().unwrap());
    let written = pattern(SIZE, 4);
    write_raw(&mut c, &rig, &source, &written).await;
    let id = requests::create_volume(&mut c, raw_clone_req("clone", &source))
        .await
        .volume_id;
    assert_eq!(device_of(&rig, &id), frozen.dev.to_str().unwrap());

    frozen.freeze(true);
    let _thaw = ThawOnDrop(&frozen);
    let staging = rig.path("staging/clone");
    fs::create_dir_all(&staging).unwrap();
    // The kubelet gives up on a call that does not answer: the copy goes on.
    let err = stage_within(&c, &id, &staging, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert_eq!(count(&rig.logs(), COPY_STARTED), 1, "{}", rig.logs());
    // Its retry joins the running copy (a call still held by the first is Aborted: retried).
    let retry = tokio::spawn({
        let (c, id, staging) = (c.clone(), id.clone(), staging.clone());
        async move {
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match stage_within(&c, &id, &staging, Duration::from_secs(60)).await {
                    Err(e) if e.code() == Code::Aborted && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    other => return other,
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!retry.is_finished(), "the retry waits for the copy");
    frozen.freeze(false);
    retry.await.unwrap().expect("the retry joins the copy");
    assert_eq!(
        count(&rig.logs(), COPY_STARTED),
        1,
        "one copy: {}",
        rig.logs()
    );
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    let held = read_raw(&mut c, &rig, &id).await;
    assert!(held[..SIZE as usize] == written[..], "the source's bytes");
    assert!(held[SIZE as usize..].iter().all(|&b| b == 0));
    rig.kill9();
}

/// Mounts under the state dir's `clone-mnt`, by mount point.
fn clone_mnt_mounts(rig: &Rig) -> Vec<String> {
    common::mount_points_under(
        &fs::read_to_string("/proc/self/mountinfo").unwrap(),
        &rig.path("state/clone-mnt"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_clone_left_mounted_in_its_copy_directory_stages() {
    let Some(rig) = Rig::new(2) else { return };
    let mut rig = rig;
    let mut c = rig.start().await;
    let mount = requests::single_writer_mount();
    let (source, s_staging, s_target) = published_source(&rig, &mut c).await;
    fs::write(s_target.join("before"), b"copied").unwrap();
    requests::unpublish(&mut c, &source, &s_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &source, &s_staging)
        .await
        .unwrap();
    let id = requests::create_volume(&mut c, clone_req("clone", &source))
        .await
        .volume_id;
    let (staging, target) = (rig.path("staging/clone"), rig.path("pods/p2/clone"));
    fs::create_dir_all(&staging).unwrap();
    requests::stage_and_publish(&mut c, &id, &staging, &target, mount.clone()).await;
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();

    // The copy done and recorded, its private mount of the clone left behind (a driver
    // killed before its take-down, or a take-down that failed): the clone's NodeStage
    // takes it down instead of finding the clone staged there for ever.
    let private = rig.path("state/clone-mnt").join(short(&id)).join("target");
    fs::create_dir_all(&private).unwrap();
    common::run("mount", &[&device_of(&rig, &id), private.to_str().unwrap()]);
    rig.kill9();
    let mut c = rig.start().await;
    requests::stage_and_publish(&mut c, &id, &staging, &target, mount.clone()).await;
    assert_eq!(clone_mnt_mounts(&rig), Vec::<String>::new());
    assert_eq!(fs::read(target.join("before")).unwrap(), b"copied");
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    rig.kill9();
}

/// A clone of a source a pod uses is copied live, and the source frozen only for the pass
/// over what changed meanwhile: its writers wait for that pass, not for the whole copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_in_use_is_frozen_only_for_the_last_pass_of_its_clone() {
    // Large enough that copying it takes far longer than freezing a filesystem.
    let Some(rig) = Rig::with_size(2, 512 << 20) else {
        return;
    };
    let mut rig = rig;
    let (mut c, addr) = start_with_metrics(&mut rig).await;
    let mount = requests::single_writer_mount();
    let (source, _, s_target) = published_source(&rig, &mut c).await;
    let data: Vec<u8> = (0..(320u32 << 20)).map(|i| (i % 251) as u8).collect();
    fs::write(s_target.join("weights.bin"), &data).unwrap();
    nix::unistd::sync();
    let id = requests::create_volume(&mut c, clone_req("clone", &source))
        .await
        .volume_id;
    let text = scrape(&addr);
    let figure = |name: &str| -> f64 {
        let prefix = format!("{name}{{volume=\"{id}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&prefix));
        line.unwrap_or_else(|| panic!("no {prefix}: {text}"))[prefix.len()..]
            .parse()
            .unwrap()
    };
    let (frozen, copied) = (
        figure("gds_csi_clone_freeze_seconds"),
        figure("gds_csi_clone_duration_seconds"),
    );
    eprintln!("clone of a source in use: frozen {frozen:.3} s, copy {copied:.3} s");
    assert!(
        frozen * 4.0 < copied,
        "frozen {frozen} s of a {copied} s copy: frozen for the whole copy"
    );
    assert!(!rig.path("state/freezes").join(short(&id)).exists());
    let (staging, target) = (rig.path("staging/clone"), rig.path("pods/p2/clone"));
    fs::create_dir_all(&staging).unwrap();
    requests::stage_and_publish(&mut c, &id, &staging, &target, mount.clone()).await;
    assert!(fs::read(target.join("weights.bin")).unwrap() == data);
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();
    rig.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_of_a_source_in_use_is_the_source_frozen_at_create_volume() {
    let Some(rig) = Rig::new(2) else { return };
    let mut rig = rig;
    let mut c = rig.start().await;
    let mount = requests::single_writer_mount();
    let (source, s_staging, s_target) = published_source(&rig, &mut c).await;
    fs::write(s_target.join("before"), b"written before").unwrap();
    let id = requests::create_volume(&mut c, clone_req("clone", &source))
        .await
        .volume_id;
    // Thawed: a write to the source returns.
    fs::write(s_target.join("after"), b"written after").unwrap();
    nix::unistd::sync();
    assert!(!rig.path("state/freezes").join(short(&id)).exists());
    assert_eq!(clone_mnt_mounts(&rig), Vec::<String>::new());
    // Repeated: answers what it made, copies nothing again.
    requests::create_volume(&mut c, clone_req("clone", &source)).await;
    let (staging, target) = (rig.path("staging/clone"), rig.path("pods/p2/clone"));
    fs::create_dir_all(&staging).unwrap();
    requests::stage_and_publish(&mut c, &id, &staging, &target, mount.clone()).await;
    assert_eq!(fs::read(target.join("before")).unwrap(), b"written before");
    assert!(!target.join("after").exists());
    requests::unpublish(&mut c, &id, &target).await.unwrap();
    requests::unstage(&mut c, &id, &staging).await.unwrap();

    assert_eq!(count(&rig.logs(), "froze the source filesystem"), 1);
    assert_eq!(count(&rig.logs(), "thawed the source filesystem"), 1);
    // A driver killed while the source was frozen: its start-up thaws it.
    rig.kill9();
    fs::create_dir_all(rig.path("state/freezes")).unwrap();
    let dev = fs::metadata(&s_staging).unwrap().dev();
    fs::write(
        rig.path("state/freezes/left"),
        format!("{}:{}\n", libc::major(dev), libc::minor(dev)),
    )
    .unwrap();
    common::run("fsfreeze", &["-f", s_staging.to_str().unwrap()]);
    let mut c = rig.start().await;
    let writer = std::thread::spawn({
        let f = s_target.join("after-restart");
        move || {
            fs::write(&f, b"x").unwrap();
            nix::unistd::syncfs(fs::File::open(f.parent().unwrap()).unwrap()).unwrap();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !writer.is_finished() {
        if Instant::now() > deadline {
            let _ = common::run("fsfreeze", &["-u", s_staging.to_str().unwrap()]);
            panic!("the source stayed frozen after a restart");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!rig.path("state/freezes/left").exists());
    requests::unpublish(&mut c, &source, &s_target)
        .await
        .unwrap();
    requests::unstage(&mut c, &source, &s_staging)
        .await
        .unwrap();
    rig.kill9();
}
