//! Block → block clones through the real binary on loop devices: CreateVolume
//! with `volume_content_source.volume` checks the source (missing: NotFound; too small
//! a limit: OutOfRange naming both sizes, nothing created; raw block: InvalidArgument),
//! refuses a source that is staged (a clone is the source as it is at CreateVolume),
//! pins the clone to the source's node and answers the content source; the first
//! NodeStage copies (after mkfs, before the staging mount) and the published clone holds
//! the source's files, owners, modes, symlinks and hard links; a restage copies nothing
//! again; delete drops the record.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{digest_file, requests, Rig, SIZE};

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
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut c = rig.start_with(&[], &["--metrics-address", &addr]).await;
    let mount = requests::single_writer_mount();
    let source = requests::create_volume_id(&mut c, "source", mount.clone()).await;
    let (s_staging, s_target) = (rig.path("staging/src"), rig.path("pods/p1/src"));
    fs::create_dir_all(&s_staging).unwrap();
    requests::stage_and_publish(&mut c, &source, &s_staging, &s_target, mount.clone()).await;
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
    assert_eq!(listed(&mut c).await, before, "nothing created");

    // The source is staged: refused (a clone is the source as it is at CreateVolume, and
    // a staged source may still change), nothing created.
    let err = c
        .controller
        .create_volume(clone_req("clone", &source))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("in use"), "{}", err.message());
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

    // The figures: every byte of the two files (the hard link once) copied; the source
    // in use counted as the cause of the refused CreateVolume.
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
    assert!(
        text.contains("gds_csi_clone_failures_total{cause=\"in_use\"} 1"),
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

/// The clone's private directory name (src/block/clone.rs `short`).
fn short(id: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(id.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
