//! CreateVolume knows each filesystem's smallest size, read from the installed mkfs (issue
//! 16 item 10): an xfs volume on a device mkfs.xfs refuses would stay unstageable forever.

mod common;

use std::process::Command;

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
    assert!(ext4 > 0 && ext4 < (1 << 20), "ext4 minimum {ext4}");
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
