//! `gds-csi populate` from an NFS Dataset, as the populator's fill pod runs it: the export
//! mounted over RDMA by the fill's own mount code (soft, `proto=rdma` verified), copied
//! into an ext4 volume and verified by checksum, compared with the export entry by entry.

use std::path::PathBuf;
use std::time::Instant;

use super::vm_common::{ensure, sh, Result};
use super::{compare_trees, Rig, DATA, SERVER};

pub fn run(rig: &Rig) -> Result<String> {
    let bin = std::env::current_exe()?
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no bin dir")?
        .join("gds-csi");
    let dev = std::env::var("CP_DEV")?;
    let (dst, work, record) = ("/run/pop-dst", "/run/pop-work", "/run/pop-record.json");
    sh(&format!(
        "mkdir -p {dst} && mount -o data=ordered {dev} {dst} && find {dst} -mindepth 1 -delete"
    ))?;
    let t0 = Instant::now();
    let out = std::process::Command::new(&bin)
        .args([
            "populate",
            &format!("--nfs-server={SERVER}"),
            "--nfs-share=/",
            &format!("--nfs-path={DATA}"),
        ])
        .args([
            format!("--work={work}"),
            format!("--target={dst}"),
            format!("--record={record}"),
        ])
        .args(["--verify=checksum", "--label=vm/dataset", "--every=1s"])
        .output()?;
    let secs = t0.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&out.stdout).to_string();
    let compared = compare_trees(&rig.export.join(DATA), &PathBuf::from(dst));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    // Left empty for the figures' cp -a.
    sh(&format!("find {dst} -mindepth 1 -delete; umount {dst}"))?;
    ensure(
        out.status.success(),
        format!(
            "populate failed: {log} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    let last = log.lines().last().unwrap_or_default();
    ensure(
        last.contains(r#""phase":"Done""#),
        format!("last report: {last}"),
    )?;
    let lines = log
        .lines()
        .filter(|l| l.contains(r#""phase":"Copying""#))
        .count();
    let n = compared?;
    ensure(
        !mounts.contains(&format!("{work}/source")),
        "the export is still mounted",
    )?;
    ensure(
        !std::path::Path::new(record).exists(),
        "the record was left",
    )?;
    Ok(format!(
        "{n} entries match (checksum, mode, owner, links) in {secs:.1} s; {lines} progress lines; export unmounted, record removed"
    ))
}
