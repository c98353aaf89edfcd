//! The demo's CSI client: provisions, stages and publishes a volume through the
//! driver's socket, writes and reads a file through the published path, then tears
//! everything down. `scripts/demo.sh` runs it against a loop-device pool.
//!
//! Usage: demo SOCKET WORK_DIR
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::Instant;

use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;

/// How long the driver may take to scan its pool (slow on a loaded machine).
const READY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn step(what: &str, started: Instant) {
    println!(
        "  {:<44} {:>8.1} ms",
        what,
        started.elapsed().as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = PathBuf::from(args.next().ok_or("usage: demo SOCKET WORK_DIR")?);
    let work = PathBuf::from(args.next().ok_or("usage: demo SOCKET WORK_DIR")?);
    // Ready, not merely listening: the pool scan runs after the socket appears.
    let mut c = Clients::connect_ready(&socket, READY_DEADLINE).await?;
    let info = c
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await?
        .into_inner();
    println!("driver {} {}", info.name, info.vendor_version);

    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    };
    let t = Instant::now();
    let vol = c
        .controller
        .create_volume(CreateVolumeRequest {
            name: "demo-volume".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 100 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            // A demo without a GPU: the GDS gate (on by default) is turned off explicitly.
            parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .ok_or("no volume in the response")?;
    step(
        &format!("CreateVolume ({} MiB)", vol.capacity_bytes >> 20),
        t,
    );
    println!("  volume id: {}", vol.volume_id);
    let staging = work.join("kubelet/staging/demo");
    let target = work.join("kubelet/pods/demo-pod/volumes/demo");
    std::fs::create_dir_all(&staging)?;
    let id = vol.volume_id.clone();

    let t = Instant::now();
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap.clone()),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await?;
    step("NodeStageVolume (mkfs.ext4 + mount)", t);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    if let Some(line) = mountinfo
        .lines()
        .find(|l| l.contains(&staging.display().to_string()))
    {
        let fs = line.split(" - ").nth(1).unwrap_or("");
        println!("  staged: {fs}");
    }
    let t = Instant::now();
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap.clone()),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await?;
    step("NodePublishVolume (bind mount)", t);

    let file = target.join("hello.txt");
    let text = format!("written through {} by the gds-csi demo\n", target.display());
    std::fs::write(&file, &text)?;
    let back = std::fs::read_to_string(&file)?;
    println!(
        "  wrote and read back {} bytes: {}",
        back.len(),
        if back == text { "MATCH" } else { "MISMATCH" }
    );
    let stats = c
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await?
        .into_inner();
    if let Some(bytes) = stats.usage.first() {
        println!(
            "  usage: {} of {} KiB used, condition abnormal={}",
            bytes.used >> 10,
            bytes.total >> 10,
            stats.volume_condition.map(|c| c.abnormal).unwrap_or(false)
        );
    }

    let t = Instant::now();
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await?;
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await?;
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await?;
    step("unpublish + unstage + DeleteVolume", t);
    if back != text {
        return Err("data read back differs from data written".into());
    }
    println!("demo: OK");
    Ok(())
}
