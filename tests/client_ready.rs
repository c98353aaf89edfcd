//! Clients wait for Probe `ready`, not for the socket: the driver listens
//! before its pool scan ends and answers Unavailable until then. The scan is held here by a
//! `blkid` stand-in at a gate (no fixed sleeps), the way a loaded machine slows it down.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

fn create_request() -> CreateVolumeRequest {
    use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    CreateVolumeRequest {
        name: "ready-vol".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })),
        }],
        parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn clients_wait_for_probe_ready_not_the_socket() {
    let Some(rig) = common::Rig::new(1) else {
        return;
    };
    let bin = rig.tools.dir.join("bin");
    let gate = rig.path("scan-gate");
    let blkid = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v blkid"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    fs::write(
        bin.join("blkid"),
        format!(
            "#!/bin/sh\nwhile [ -e {} ]; do sleep 0.05; done\nexec {} \"$@\"\n",
            gate.display(),
            blkid.trim()
        ),
    )
    .unwrap();
    fs::set_permissions(bin.join("blkid"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(&gate, "").unwrap();

    let socket = rig.socket();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gds-csi"))
        .args(["serve", "--mode", "all", "--node-id", "node-a"])
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--state-dir")
        .arg(rig.path("state"))
        .arg("--allowed-path-root")
        .arg(rig.dir.path())
        .arg("--pool-device")
        .arg(&rig.loops[0])
        .env_remove(gds_csi::runtime::faults::ENV)
        .env("PATH", rig.tools.path_env())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // What the old demo did: the socket is there, so call. The scan still runs: Unavailable.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut plain = loop {
        if let Ok(c) = Clients::connect(&socket).await {
            break c;
        }
        assert!(Instant::now() < deadline, "the socket never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let early = plain.controller.create_volume(create_request()).await;
    assert_eq!(early.unwrap_err().code(), Code::Unavailable);

    // The waiting client keeps to its deadline and says what it saw.
    let t = Instant::now();
    let err = Clients::connect_ready(&socket, Duration::from_millis(300))
        .await
        .err()
        .expect("ready while the pool scan is held");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(err.to_string().contains("ready: Some(false)"), "{err}");

    // And the `gds-csi probe` that the scripts use exits 1 while not ready.
    let probe = |timeout: &str| {
        Command::new(env!("CARGO_BIN_EXE_gds-csi"))
            .args(["probe", "--timeout", timeout, "--endpoint"])
            .arg(format!("unix://{}", socket.display()))
            .output()
            .unwrap()
    };
    let out = probe("200ms");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not ready"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Scan released: the waiting client gets a driver that serves the first call.
    fs::remove_file(&gate).unwrap();
    let mut c = Clients::connect_ready(&socket, Duration::from_secs(30))
        .await
        .unwrap();
    let vol = c.controller.create_volume(create_request()).await.unwrap();
    assert!(probe("30s").status.success());
    let id = vol.into_inner().volume.unwrap().volume_id;
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
}
