//! What the VM rig's scenario clients share (examples/vm_scenarios.rs and
//! examples/stripe_vm.rs, both run inside the guest against the driver's socket): shell
//! commands, checks, the `PASS`/`FAIL` report, the driver helper script, and the CSI calls
//! on one volume, with the kubelet's paths under the work dir.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::*;

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
/// A CSI call's own result, so a scenario can check the gRPC code.
pub type CsiResult<T> = std::result::Result<T, tonic::Status>;

pub const MIB: i64 = 1 << 20;
/// How long a (re)started driver may take to scan its pool.
pub const READY_DEADLINE: Duration = Duration::from_secs(60);

/// A mount volume capability; an empty `fs` leaves the choice to the class.
pub fn mount_cap(mode: Mode, fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

/// `sh -c CMD`: its trimmed stdout, or an error with its stderr.
pub fn sh(cmd: &str) -> Result<String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub fn ensure(cond: bool, what: impl Into<String>) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

/// One line per scenario: `PASS name: detail` or `FAIL name: error`.
pub fn report(name: &str, res: Result<String>, failed: &mut usize) {
    match res {
        Ok(detail) => println!("PASS {name}: {detail}"),
        Err(e) => {
            *failed += 1;
            println!("FAIL {name}: {e}");
        }
    }
}

/// Runs a subcommand of the guest's helper script (restart-driver, nfs-stop, ...).
pub fn helper(script: &str, what: &str) -> Result<()> {
    let status = std::process::Command::new("bash")
        .arg(script)
        .arg(what)
        .status()?;
    ensure(status.success(), format!("guest helper {what} failed"))
}

/// One mountinfo line's interesting fields: fs type, source, super options.
pub fn mountinfo(path: &Path) -> Option<(String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.display().to_string();
    text.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if left.split(' ').nth(4)? != want {
            return None;
        }
        let mut r = right.split(' ');
        Some((
            r.next()?.to_owned(),
            r.next()?.to_owned(),
            r.next()?.to_owned(),
        ))
    })
}

/// A created volume and where the kubelet would stage and publish it.
#[derive(Clone)]
pub struct Vol {
    pub id: String,
    pub ctx: HashMap<String, String>,
    pub cap: VolumeCapability,
    pub capacity: i64,
    pub topology: Vec<Topology>,
    pub staging: PathBuf,
    pub target: PathBuf,
}

/// CreateVolume with exactly these parameters.
pub async fn create(
    c: &mut Clients,
    work: &Path,
    name: &str,
    params: &[(&str, &str)],
    range: (i64, i64),
    cap: VolumeCapability,
) -> CsiResult<Vol> {
    let v = c
        .controller
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: range.0,
                limit_bytes: range.1,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .ok_or_else(|| tonic::Status::internal("no volume"))?;
    Ok(Vol {
        id: v.volume_id,
        ctx: v.volume_context,
        cap,
        capacity: v.capacity_bytes,
        topology: v.accessible_topology,
        staging: work.join(format!("kubelet/staging/{name}")),
        target: work.join(format!("kubelet/pods/{name}/mount")),
    })
}

pub async fn stage(c: &mut Clients, v: &Vol) -> CsiResult<()> {
    std::fs::create_dir_all(&v.staging).ok();
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
            volume_capability: Some(v.cap.clone()),
            volume_context: v.ctx.clone(),
            ..Default::default()
        })
        .await
        .map(drop)
}

pub async fn publish(c: &mut Clients, v: &Vol) -> CsiResult<()> {
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
            target_path: v.target.display().to_string(),
            volume_capability: Some(v.cap.clone()),
            volume_context: v.ctx.clone(),
            ..Default::default()
        })
        .await
        .map(drop)
}

pub async fn unpublish(c: &mut Clients, v: &Vol) -> CsiResult<()> {
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: v.target.display().to_string(),
        })
        .await
        .map(drop)
}

pub async fn unstage(c: &mut Clients, v: &Vol) -> CsiResult<()> {
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
        })
        .await
        .map(drop)
}

pub async fn delete(c: &mut Clients, v: &Vol) -> CsiResult<()> {
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await
        .map(drop)
}

/// Unpublish, unstage, delete: twice each, since every call must be idempotent.
pub async fn teardown(c: &mut Clients, v: &Vol) -> Result<()> {
    for _ in 0..2 {
        unpublish(c, v).await?;
    }
    for _ in 0..2 {
        unstage(c, v).await?;
    }
    for _ in 0..2 {
        delete(c, v).await?;
    }
    Ok(())
}

/// How many volumes ListVolumes reports.
pub async fn listed(c: &mut Clients) -> Result<usize> {
    Ok(c.controller
        .list_volumes(ListVolumesRequest::default())
        .await?
        .into_inner()
        .entries
        .len())
}
