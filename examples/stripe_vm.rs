//! The stripe layout's scenarios on the VM rig (issue 14), run inside the guest against
//! a driver serving SOCKET, with mdadm and Debian's md driver present. Prints
//! `PASS name: detail` / `FAIL name: error` per scenario; exits 1 on any failure.
//! Usage: stripe_vm SOCKET WORK_DIR DETACH_CMD
//! DETACH_CMD is a shell command that detaches one pool drive (run last).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
const MIB: i64 = 1 << 20;

fn cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

fn sh(cmd: &str) -> Result<String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()?;
    if !out.status.success() {
        return Err(format!("{cmd}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn ensure(cond: bool, what: impl Into<String>) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

async fn create(c: &mut Clients, name: &str, count: &str, fs: &str, bytes: i64) -> Result<Volume> {
    let params: HashMap<String, String> = [
        ("gdsPolicy", "disabled"),
        ("layout", "stripe"),
        ("stripeCount", count),
        ("stripeChunk", "512K"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let req = CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![cap(fs)],
        parameters: params,
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    Ok(c.controller
        .create_volume(req)
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?)
}

async fn stage(
    c: &mut Clients,
    id: &str,
    staging: &Path,
    fs: &str,
) -> std::result::Result<(), tonic::Status> {
    let req = NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap(fs)),
        ..Default::default()
    };
    c.node.node_stage_volume(req).await.map(drop)
}

async fn unstage(c: &mut Clients, id: &str, staging: &Path) -> Result<()> {
    let req = NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    };
    c.node.node_unstage_volume(req).await?;
    Ok(())
}

async fn delete(c: &mut Clients, id: &str) -> Result<()> {
    let req = DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    c.controller.delete_volume(req).await?;
    Ok(())
}

fn md_count() -> usize {
    sh("ls -d /sys/block/md* 2>/dev/null | wc -l")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Create, stage, write, unstage (array stopped), restage, data intact; stop by hand
/// (as after a reboot), restage, data intact. Returns the staging path's source.
async fn s_lifecycle(
    c: &mut Clients,
    work: &Path,
    count: &str,
    fs: &str,
) -> Result<(String, String)> {
    let v = create(c, &format!("stripe-{count}-{fs}"), count, fs, 48 * MIB).await?;
    let id = v.volume_id.clone();
    let staging = work.join(format!("staging-{count}-{fs}"));
    let before = md_count();
    stage(c, &id, &staging, fs).await?;
    let src = sh(&format!("findmnt -n -o SOURCE {}", staging.display()))?;
    ensure(src.starts_with("/dev/md"), format!("staged from {src}"))?;
    let size = sh(&format!("blockdev --getsize64 {src}"))?;
    ensure(
        size == v.capacity_bytes.to_string(),
        format!("array {size} bytes, volume {}", v.capacity_bytes),
    )?;
    let geometry = match fs {
        "ext4" => sh(&format!(
            "dumpe2fs -h {src} 2>/dev/null | grep -E 'RAID (stride|stripe width)'"
        ))?,
        _ => sh(&format!(
            "xfs_info {} | grep -o 'sunit=[0-9]* *swidth=[0-9]* blks'",
            staging.display()
        ))?,
    };
    let file = staging.join("data");
    sh(&format!(
        "dd if=/dev/urandom of={} bs=1M count=20 status=none && sync",
        file.display()
    ))?;
    let sum = sh(&format!("sha256sum {} | cut -d' ' -f1", file.display()))?;
    unstage(c, &id, &staging).await?;
    ensure(
        md_count() == before,
        "the array still runs after NodeUnstage",
    )?;
    stage(c, &id, &staging, fs).await?;
    ensure(
        sh(&format!("sha256sum {} | cut -d' ' -f1", file.display()))? == sum,
        "data changed after restage",
    )?;
    // By hand, as a reboot would: unmount and stop the array.
    let node = sh(&format!("findmnt -n -o SOURCE {}", staging.display()))?;
    sh(&format!(
        "umount {} && mdadm --stop {node}",
        staging.display()
    ))?;
    stage(c, &id, &staging, fs).await?;
    ensure(
        sh(&format!("sha256sum {} | cut -d' ' -f1", file.display()))? == sum,
        "data changed after reassembly",
    )?;
    unstage(c, &id, &staging).await?;
    Ok((id, geometry.replace('\n', "; ")))
}

async fn s_delete(c: &mut Clients, ids: &[String]) -> Result<String> {
    let parts_before = sh("cat /proc/partitions | grep -c 'nvme.*p[0-9]' || true")?;
    for id in ids {
        if let Err(e) = delete(c, id).await {
            // Diagnostics for the report: who holds the members, then one retry.
            let diag = sh("cat /proc/mdstat; for h in /sys/block/nvme*/nvme*p*/holders; do echo $h: $(ls $h); done; ls /sys/block | tr '\\n' ' '")
                .unwrap_or_else(|e| e.to_string());
            println!("DIAG delete {id}: {e}\n{diag}");
            tokio::time::sleep(Duration::from_secs(3)).await;
            delete(c, id)
                .await
                .map_err(|e2| format!("{e}; retried after 3 s: {e2}"))?;
        }
    }
    let parts = sh("cat /proc/partitions | grep -c 'nvme.*p[0-9]' || true")?;
    let sb = sh("for d in /dev/nvme*n*; do mdadm --examine --export $d 2>/dev/null | grep MD_NAME=gds-csi; done || true")?;
    ensure(sb.is_empty(), format!("md superblocks of ours left: {sb}"))?;
    ensure(parts == "0", format!("partitions left: {parts}"))?;
    Ok(format!(
        "partitions {parts_before} -> {parts}, no gds-csi md superblock"
    ))
}

async fn s_foreign(c: &mut Clients, work: &Path, foreign_uuid: &str) -> Result<String> {
    let v = create(c, "stripe-near-foreign", "2", "ext4", 16 * MIB).await?;
    let staging = work.join("staging-near-foreign");
    stage(c, &v.volume_id, &staging, "ext4").await?;
    unstage(c, &v.volume_id, &staging).await?;
    delete(c, &v.volume_id).await?;
    let still = sh(&format!(
        "cat /sys/block/md*/md/uuid | grep -c {foreign_uuid} || true"
    ))?;
    ensure(still == "1", "the foreign array is no longer running")?;
    Ok(format!(
        "foreign array {foreign_uuid} still running, untouched"
    ))
}

async fn s_detached(c: &mut Clients, work: &Path, detach: &str) -> Result<String> {
    let v = create(c, "stripe-detach", "4", "ext4", 32 * MIB).await?;
    let staging = work.join("staging-detach");
    stage(c, &v.volume_id, &staging, "ext4").await?;
    unstage(c, &v.volume_id, &staging).await?;
    sh(detach)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = md_count();
    let err = match stage(c, &v.volume_id, &staging, "ext4").await {
        Ok(()) => return Err("staged with a member detached".into()),
        Err(e) => e,
    };
    ensure(
        err.code() == tonic::Code::FailedPrecondition,
        format!("{err}"),
    )?;
    ensure(err.message().contains("member"), format!("{err}"))?;
    ensure(
        md_count() == before,
        "an array was started with a member missing",
    )?;
    Ok(err.message().to_owned())
}

fn report(name: &str, res: Result<String>, failed: &mut usize) {
    match res {
        Ok(d) => println!("PASS {name}: {d}"),
        Err(e) => {
            *failed += 1;
            println!("FAIL {name}: {e}");
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = PathBuf::from(
        args.next()
            .ok_or("usage: stripe_vm SOCKET WORK_DIR DETACH FOREIGN_UUID")?,
    );
    let work = PathBuf::from(args.next().ok_or("WORK_DIR")?);
    let detach = args.next().ok_or("DETACH")?;
    let foreign = args.next().ok_or("FOREIGN_UUID")?;
    let mut c = Clients::connect_ready(&socket, Duration::from_secs(60)).await?;
    let mut failed = 0;
    let mut ids = Vec::new();
    for (count, fs) in [("2", "ext4"), ("4", "xfs")] {
        let res = s_lifecycle(&mut c, &work, count, fs).await;
        let res = res.map(|(id, geo)| {
            ids.push(id);
            format!("staged, unstaged (array stopped), restaged, stopped by hand, reassembled: data intact; {geo}")
        });
        report(&format!("stripe-{count}-{fs}"), res, &mut failed);
    }
    report("delete", s_delete(&mut c, &ids).await, &mut failed);
    report(
        "foreign-array",
        s_foreign(&mut c, &work, &foreign).await,
        &mut failed,
    );
    report(
        "member-detached",
        s_detached(&mut c, &work, &detach).await,
        &mut failed,
    );
    println!("stripe scenarios: {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
