//! Drives a running driver through the calls whose metrics the Grafana dashboard
//! (`deploy/helm/gds-csi/dashboards/gds-csi.json`) charts, and leaves the volumes in place,
//! staged and published, so that their series stay exported while Prometheus is queried:
//! a whole-device volume published as raw block (which the partition layout then passes
//! over), a filesystem volume with a file in it, its clone (copied at CreateVolume from the
//! mounted source), a refused raw-block clone of the block volume in use, and calls that
//! fail as a client's mistakes do. `tests/e2e/dashboard.sh` runs it.
//!
//! Usage: dashboard_load SOCKET WORK_DIR ROUND (names the volumes; each round makes its own,
//! so that a second round moves every counter after Prometheus has seen the first)
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gds_csi::csi::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const MIB: i64 = 1 << 20;
/// How long the driver may take to scan its pool (slow on a loaded machine).
const READY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

fn cap(block: bool) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })
        }),
    }
}

/// No GPU here: the GDS gate is turned off explicitly, as the demo does.
fn params(layout: &str) -> HashMap<String, String> {
    [
        ("gdsPolicy".to_string(), "disabled".to_string()),
        ("layout".to_string(), layout.to_string()),
    ]
    .into()
}

struct Load {
    c: Clients,
    work: PathBuf,
}

impl Load {
    async fn create(
        &mut self,
        name: &str,
        layout: &str,
        mib: i64,
        block: bool,
        source: Option<&str>,
    ) -> std::result::Result<Volume, tonic::Status> {
        let vol = self
            .c
            .controller
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: mib * MIB,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap(block)],
                parameters: params(layout),
                volume_content_source: source.map(|id| VolumeContentSource {
                    r#type: Some(Type::Volume(VolumeSource {
                        volume_id: id.into(),
                    })),
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(vol.volume.expect("CreateVolume answered no volume"))
    }

    /// Stages and publishes `vol`; returns the published path.
    async fn use_volume(&mut self, name: &str, vol: &Volume, block: bool) -> Result<PathBuf> {
        let staging = self.work.join("kubelet/staging").join(name);
        let pod = self.work.join("kubelet/pods").join(name);
        std::fs::create_dir_all(&staging)?;
        std::fs::create_dir_all(&pod)?;
        let target = pod.join("volume");
        self.c
            .node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: vol.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap(block)),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            })
            .await?;
        self.c
            .node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap(block)),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            })
            .await?;
        self.c
            .node
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: vol.volume_id.clone(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await?;
        Ok(target)
    }
}

fn expect_refused<T>(
    what: &str,
    r: std::result::Result<T, tonic::Status>,
    code: tonic::Code,
) -> Result<()> {
    match r {
        Err(s) if s.code() == code => {
            println!("  {what}: {code:?} as expected");
            Ok(())
        }
        Err(s) => Err(format!("{what}: expected {code:?}, got {s}").into()),
        Ok(_) => Err(format!("{what}: expected {code:?}, got OK").into()),
    }
}

fn write_file(path: &Path, mib: usize) -> Result<()> {
    let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    let mut data = Vec::with_capacity(mib * chunk.len());
    for _ in 0..mib {
        data.extend_from_slice(&chunk);
    }
    std::fs::write(path, &data)?;
    std::fs::File::open(path)?.sync_all()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: dashboard_load SOCKET WORK_DIR ROUND";
    let socket = PathBuf::from(args.next().ok_or(usage)?);
    let work = PathBuf::from(args.next().ok_or(usage)?);
    let round = args.next().ok_or(usage)?;
    let name = |what: &str| format!("dash-{round}-{what}");
    let c = Clients::connect_ready(&socket, READY_DEADLINE).await?;
    let mut l = Load { c, work };

    l.c.identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await?;
    l.c.identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await?;
    l.c.controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await?;
    l.c.node.node_get_info(NodeGetInfoRequest {}).await?;
    l.c.node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await?;

    // A whole device first: the partition layout then passes over it (a refusal counted
    // by reason), and a raw-block clone of it while published is refused (a clone failure).
    let whole = l.create(&name("whole"), "device", 32, true, None).await?;
    l.use_volume(&name("whole"), &whole, true).await?;
    println!("  whole-device volume published as raw block");

    let source = l
        .create(&name("source"), "partition", 48, false, None)
        .await?;
    let at = l.use_volume(&name("source"), &source, false).await?;
    write_file(&at.join("data.bin"), 16)?;
    println!("  partition volume published, 16 MiB written");

    // The source is mounted: the clone is copied at CreateVolume from its frozen mount.
    let clone = l
        .create(
            &name("clone"),
            "partition",
            48,
            false,
            Some(&source.volume_id),
        )
        .await?;
    let at = l.use_volume(&name("clone"), &clone, false).await?;
    let copied = std::fs::metadata(at.join("data.bin"))?.len();
    if copied != 16 * MIB as u64 {
        return Err(format!("the clone holds {copied} bytes of data.bin, not 16 MiB").into());
    }
    println!("  clone made from the mounted source and published");

    let r = l
        .create(
            &name("raw-clone"),
            "device",
            32,
            true,
            Some(&whole.volume_id),
        )
        .await;
    expect_refused(
        "raw-block clone of a published block volume",
        r,
        tonic::Code::FailedPrecondition,
    )?;
    let r =
        l.c.controller
            .create_volume(CreateVolumeRequest {
                name: name("bad-parameter"),
                volume_capabilities: vec![cap(false)],
                parameters: [("noSuchParameter".to_string(), "x".to_string())].into(),
                ..Default::default()
            })
            .await;
    expect_refused(
        "CreateVolume with an unknown parameter",
        r,
        tonic::Code::InvalidArgument,
    )?;
    let r =
        l.c.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: String::new(),
                staging_target_path: l.work.join("kubelet/staging/none").display().to_string(),
            })
            .await;
    expect_refused(
        "NodeUnstageVolume without a volume id",
        r,
        tonic::Code::InvalidArgument,
    )?;

    l.c.controller
        .get_capacity(GetCapacityRequest {
            parameters: params("partition"),
            ..Default::default()
        })
        .await?;
    l.c.controller
        .list_volumes(ListVolumesRequest::default())
        .await?;
    println!("dashboard load: OK (volumes left staged and published)");
    Ok(())
}
