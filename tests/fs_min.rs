//! CreateVolume knows each filesystem's smallest size, read from the installed mkfs: an xfs
//! volume on a device mkfs.xfs refuses would stay unstageable forever. The dry runs that
//! read it leave no scratch file behind, even from a driver killed in the middle.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::tools::process_ended;
use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::*;
use gds_csi::os::{FsType, StripeGeometry};
use gds_csi::pool::fs_min;
use tonic::Code;

fn request(name: &str, fs: &str, required: i64, limit: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }],
        parameters: [
            ("gdsPolicy".to_string(), "disabled".to_string()),
            ("fsType".to_string(), fs.to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// mkfs.xfs -N on a sparse file of `bytes`, outside the driver.
fn xfs_accepts(bytes: u64) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("img");
    std::fs::File::create(&f).unwrap().set_len(bytes).unwrap();
    Command::new("mkfs.xfs")
        .arg("-N")
        .arg(&f)
        .output()
        .unwrap()
        .status
        .success()
}

#[tokio::test]
async fn the_minimum_is_what_the_installed_mkfs_accepts() {
    let xfs = fs_min::min_bytes(FsType::Xfs, None).await.unwrap();
    assert!(xfs_accepts(xfs), "mkfs.xfs refuses {xfs}");
    assert!(
        !xfs_accepts(xfs - 4096),
        "mkfs.xfs accepts {} too",
        xfs - 4096
    );
    let ext4 = fs_min::min_bytes(FsType::Ext4, None).await.unwrap();
    assert!(ext4 > 0 && ext4 < (8 << 20), "ext4 minimum {ext4}");
}

/// mkfs.ext4 as the driver runs it on a file of `bytes`, then a mount with the options
/// the driver stages with (`data=ordered`, which needs a journal); true when it mounted.
fn ext4_stages(bytes: u64) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let (img, at) = (dir.path().join("img"), dir.path().join("mnt"));
    std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
    std::fs::create_dir(&at).unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-m", "0", "-E", "nodiscard"])
        .arg(&img)
        .status()
        .unwrap();
    assert!(mkfs.success(), "mkfs.ext4 refused {bytes}");
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&img)
        .output()
        .unwrap();
    let dev = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mounted = Command::new("mount")
        .args(["-t", "ext4", "-o", "data=ordered", &dev])
        .arg(&at)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    if mounted {
        assert!(Command::new("umount").arg(&at).status().unwrap().success());
    }
    assert!(Command::new("losetup")
        .args(["-d", &dev])
        .status()
        .unwrap()
        .success());
    mounted
}

/// The ext4 minimum is a size that stages: mkfs.ext4 formats far smaller filesystems,
/// but gives them no journal, and `data=ordered` refuses to mount those.
#[tokio::test]
async fn the_ext4_minimum_is_the_smallest_size_that_stages() {
    if !common::is_root() {
        return;
    }
    let ext4 = fs_min::min_bytes(FsType::Ext4, None).await.unwrap();
    assert!(ext4_stages(ext4), "{ext4} bytes do not stage");
    assert!(!ext4_stages(ext4 - 4096), "{} bytes stage too", ext4 - 4096);
    assert!(!ext4_stages(1 << 20), "1 MiB stages: no case to test");
}

#[tokio::test]
async fn a_stripe_geometry_raises_the_minimum_to_what_mkfs_accepts_with_it() {
    // A 512 KiB stripe unit makes mkfs.xfs cap the log's stripe unit and ask for a 64 MiB
    // log: a stripe volume sized by the plain minimum would never format.
    let g = StripeGeometry::new(512 << 10, 2).unwrap();
    let accepts = |bytes: u64| {
        let f = std::env::temp_dir().join(format!("fs-min-su-{}", std::process::id()));
        std::fs::File::create(&f).unwrap().set_len(bytes).unwrap();
        let ok = Command::new("mkfs.xfs")
            .args(["-N", "-d", "su=512k,sw=2"])
            .arg(&f)
            .output()
            .unwrap()
            .status
            .success();
        std::fs::remove_file(&f).unwrap();
        ok
    };
    let plain = fs_min::min_bytes(FsType::Xfs, None).await.unwrap();
    let striped = fs_min::min_bytes(FsType::Xfs, Some(g)).await.unwrap();
    assert!(
        accepts(striped),
        "mkfs.xfs -d su=512k,sw=2 refuses {striped}"
    );
    assert!(
        !accepts(striped - 4096),
        "it accepts {} too",
        striped - 4096
    );
    assert!(
        !accepts(plain),
        "this mkfs.xfs takes the geometry at {plain}: no case to test"
    );
    assert!(striped > plain);
}

#[tokio::test]
async fn xfs_on_devices_below_its_minimum_is_refused_at_create() {
    // Devices of 64 MiB: ext4 fits, xfs (300 MiB and up since xfsprogs 5.19) does not.
    let Some(mut rig) = common::Rig::new(2) else {
        return;
    };
    let mut c = rig.start().await;
    let min = fs_min::min_bytes(FsType::Xfs, None).await.unwrap();
    assert!(
        min > common::SIZE,
        "this test needs an xfs minimum above 64 MiB"
    );

    // Rounded up, then nothing fits: OutOfRange that says why, no volume made.
    let e = c
        .controller
        .create_volume(request("xfs-small", "xfs", 32 << 20, 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{}", e.message());
    assert!(
        e.message().contains("smallest xfs") && e.message().contains(&min.to_string()),
        "{}",
        e.message()
    );
    // A limit below the minimum: OutOfRange naming the field.
    let e = c
        .controller
        .create_volume(request("xfs-limit", "xfs", 0, 100 << 20))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{}", e.message());
    assert!(e.message().contains("limit_bytes"), "{}", e.message());
    let listed = c
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty(), "{listed:?}");

    // ext4 on the same devices still works.
    let v = c
        .controller
        .create_volume(request("ext4-small", "ext4", 32 << 20, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.volume.unwrap().capacity_bytes, common::SIZE as i64);
}

/// Everything in `dir`, by name.
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Polls `done` every 20 ms for up to 30 s; false when it never held.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_during_a_dry_run_leaves_no_scratch_file() {
    // A container restart keeps its /tmp (an emptyDir): a scratch file named there would
    // pile up, 64 GiB apparent each, one per SIGKILL.
    let Some(mut rig) = common::Rig::new(1) else {
        return;
    };
    let tmp = rig.path("driver-tmp");
    std::fs::create_dir(&tmp).unwrap();
    let tmp_env = tmp.to_str().unwrap().to_owned();
    let env = [("TMPDIR", tmp_env.as_str())];

    rig.tools.close_dry_run_gate();
    let mut c = rig.start_with(&env, &[]).await;
    let create = tokio::spawn(async move {
        c.controller
            .create_volume(request("v1", "ext4", 0, 0))
            .await
    });
    assert!(
        wait_until(|| !rig.tools.mkfs_dry_runs().is_empty()),
        "no dry run started:\n{}",
        rig.logs()
    );
    let held = rig.tools.mkfs_dry_runs()[0];
    rig.kill9();
    assert!(create.await.unwrap().is_err(), "answered after SIGKILL");
    assert!(
        wait_until(|| process_ended(held)),
        "the dry run {held} outlived its driver"
    );
    assert_eq!(
        entries(&tmp),
        Vec::<String>::new(),
        "left by the killed driver"
    );

    // The restarted driver sizes the filesystem afresh and leaves nothing behind either.
    rig.tools.open_dry_run_gate();
    let mut c = rig.start_with(&env, &[]).await;
    c.controller
        .create_volume(request("v1", "ext4", 0, 0))
        .await
        .unwrap();
    assert!(
        rig.tools.mkfs_dry_runs().len() > 1,
        "the restarted driver ran no dry run"
    );
    assert_eq!(
        entries(&tmp),
        Vec::<String>::new(),
        "left after the restart"
    );
}
