//! NFS → NVMe clones on the VM rig, run inside the guest against a driver
//! serving SOCKET, with the kernel's NFS server exporting EXPORT over soft-RoCE RDMA.
//! Prints `PASS name: detail` / `FAIL name: error` per scenario and the figures; exits 1
//! on any failure.
//! Usage: clone_vm SOCKET WORK_DIR EXPORT
//! Env: GUEST_HELPER (tests/vm/clone_guest.sh: kill-driver, start-driver, nfs-stop,
//! nfs-start), CLONE_SCENARIOS (space-separated subset of `volume dataset kill stop
//! nfs populate figures`, default all), CP_DEV (an ext4 NVMe namespace outside the pool,
//! for cp -a and the populate scenario).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::volume_content_source::{Type, VolumeSource};
use gds_csi::csi::*;

#[allow(dead_code)] // each example uses part of it
mod vm_common;
use vm_common::{ensure, mount_cap, report, sh, CsiResult, Result, Vol, MIB};

#[path = "clone_vm_parts/figures.rs"]
mod figures;
#[path = "clone_vm_parts/populate.rs"]
mod populate;

const SERVER: &str = "192.0.2.1";
/// The NFS volume (and the class's dataset) directory below the export.
const DATA: &str = "dataset";

pub struct Rig {
    pub c: Clients,
    socket: PathBuf,
    pub work: PathBuf,
    pub export: PathBuf,
    helper: String,
}

impl Rig {
    pub fn helper(&self, what: &str) -> Result<()> {
        vm_common::helper(&self.helper, what)
    }

    async fn reconnect(&mut self) -> Result<()> {
        self.c = Clients::connect_ready(&self.socket, vm_common::READY_DEADLINE).await?;
        Ok(())
    }

    /// A block clone: of the NFS volume `source`, or of the class's dataset when None.
    /// `required` picks the namespace (throttled ones are the larger).
    pub async fn clone_of(
        &mut self,
        name: &str,
        source: Option<&str>,
        required: i64,
    ) -> CsiResult<Vol> {
        let mut params = vec![("gdsPolicy", "disabled")];
        if source.is_none() {
            params.extend([
                ("datasetServer", SERVER),
                ("datasetShare", "/"),
                ("datasetPath", DATA),
                // The dataset's clone is also verified by checksum, over NFS.
                ("verify", "checksum"),
            ]);
        }
        let cap = mount_cap(Mode::SingleNodeWriter, "ext4");
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            volume_content_source: source.map(|id| VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: id.into(),
                })),
            }),
            ..Default::default()
        };
        let v = self
            .c
            .controller
            .create_volume(req)
            .await?
            .into_inner()
            .volume;
        let v = v.ok_or_else(|| tonic::Status::internal("no volume"))?;
        Ok(Vol {
            id: v.volume_id,
            ctx: v.volume_context,
            cap,
            capacity: v.capacity_bytes,
            topology: v.accessible_topology,
            staging: self.work.join(format!("kubelet/staging/{name}")),
            target: self.work.join(format!("kubelet/pods/{name}/mount")),
        })
    }

    /// NodeStage until it succeeds (Unavailable is the copy still running), at most
    /// `within`; the last error otherwise.
    pub async fn stage_until_done(&mut self, v: &Vol, within: Duration) -> Result<u32> {
        let start = Instant::now();
        let mut calls = 0;
        loop {
            calls += 1;
            match vm_common::stage(&mut self.c, v).await {
                Ok(()) => return Ok(calls),
                Err(e) if start.elapsed() < within => {
                    println!("  NodeStage {calls}: {:?} {}", e.code(), e.message());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(format!("NodeStage after {calls} calls: {e}").into()),
            }
        }
    }

    /// The clone's progress record (src/volume/block/clone.rs progress_path).
    pub fn progress(&self, v: &Vol) -> Option<serde_json::Value> {
        use sha2::Digest;
        let hash: String = sha2::Sha256::digest(v.id.as_bytes())[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = self.work.join(format!("state/clones/{hash}.json"));
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// Waits until the copy of `v` has copied at least `share` of its bytes.
    pub async fn wait_copied(&self, v: &Vol, share: f64) -> Result<(u64, u64)> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            if let Some(p) = self.progress(v) {
                let (c, t) = (
                    p["copied_bytes"].as_u64().unwrap_or(0),
                    p["total_bytes"].as_u64().unwrap_or(0),
                );
                ensure(
                    p["done"] != true,
                    "the copy finished before it could be interrupted",
                )?;
                if t > 0 && c as f64 >= share * t as f64 {
                    return Ok((c, t));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the copy made no progress in 120 s".into())
    }
}

/// Bytes the NFS server has read for its clients (`io` of /proc/net/rpc/nfsd).
pub fn nfsd_read_bytes() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/net/rpc/nfsd")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("io "))
        .ok_or("no io line")?;
    Ok(line.split(' ').nth(1).ok_or("io line")?.parse()?)
}

/// Every entry of the export's tree matches the published clone: checksum, mode, owner
/// (`find -printf` on both sides, read locally on the server side; files' sizes and
/// mtimes too, not directories' sizes, which differ between tmpfs and ext4); symlinks as
/// links.
pub fn compare_trees(source: &Path, target: &Path) -> Result<usize> {
    let list = |root: &Path| {
        sh(&format!(
            "cd '{}' && find . -path ./lost+found -prune -o -name . -o -type f -printf '%p f %m %U:%G %s %T@\\n' \
             -o -type d -printf '%p d %m %U:%G\\n' -o -printf '%p %y %m %U:%G %l\\n' | LC_ALL=C sort",
            root.display()
        ))
    };
    let sums = |root: &Path| {
        sh(&format!(
            "cd '{}' && find . -path ./lost+found -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum",
            root.display()
        ))
    };
    let (a, b) = (list(source)?, list(target)?);
    ensure(a == b, format!("trees differ:\n{}", diff(&a, &b)))?;
    let (sa, sb) = (sums(source)?, sums(target)?);
    ensure(sa == sb, format!("checksums differ:\n{}", diff(&sa, &sb)))?;
    let link = std::fs::symlink_metadata(target.join("outside"))?;
    ensure(
        link.file_type().is_symlink(),
        "the outside symlink was followed",
    )?;
    Ok(a.lines().count())
}

fn diff(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let only_a: Vec<&&str> = la.iter().filter(|l| !lb.contains(l)).take(5).collect();
    let only_b: Vec<&&str> = lb.iter().filter(|l| !la.contains(l)).take(5).collect();
    format!("source only: {only_a:?}\nclone only: {only_b:?}")
}

async fn publish_and_compare(rig: &mut Rig, v: &Vol) -> Result<usize> {
    vm_common::publish(&mut rig.c, v).await?;
    let n = compare_trees(&rig.export.join(DATA), &v.target)?;
    Ok(n)
}

fn private_mounts(rig: &Rig) -> usize {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = rig.work.join("state/clone-mnt").display().to_string();
    text.lines().filter(|l| l.contains(&dir)).count()
}

/// The NFS volume the clones come from, its tree built by the guest script.
async fn source_volume(rig: &mut Rig) -> Result<String> {
    let cap = mount_cap(Mode::MultiNodeMultiWriter, "");
    let params = [
        ("server", SERVER),
        ("share", "/"),
        ("gdsPolicy", "disabled"),
        ("onDelete", "retain"),
    ];
    let v = vm_common::create(&mut rig.c, &rig.work, DATA, &params, (0, 0), cap).await?;
    Ok(v.id)
}

async fn volume(rig: &mut Rig, src: &str) -> Result<String> {
    let small = rig
        .c
        .controller
        .create_volume(CreateVolumeRequest {
            name: "limited".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 0,
                limit_bytes: 32 * MIB,
            }),
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter, "ext4")],
            parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: src.into(),
                })),
            }),
            ..Default::default()
        })
        .await;
    let e = small.err().ok_or("a 32 MiB limit was accepted")?;
    ensure(e.code() == tonic::Code::OutOfRange, format!("{e:?}"))?;
    println!("  limit 32 MiB: {:?} {}", e.code(), e.message());
    let v = rig.clone_of("from-volume", Some(src), 0).await?;
    let cpu0 = figures::cpu_seconds()?;
    let t0 = Instant::now();
    let calls = rig.stage_until_done(&v, Duration::from_secs(600)).await?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = figures::cpu_seconds()? - cpu0;
    let total = rig
        .progress(&v)
        .and_then(|p| p["total_bytes"].as_u64())
        .unwrap_or(0);
    figures::record_driver(total, secs, cpu);
    let n = publish_and_compare(rig, &v).await?;
    ensure(private_mounts(rig) == 0, "private mounts left")?;
    Ok(format!(
        "{n} entries match (checksum, mode, owner; outside symlink a link); {} MiB on a {} MiB namespace in {secs:.1} s, {calls} NodeStage call(s), {cpu:.2} CPU s",
        total >> 20,
        v.capacity >> 20
    ))
}

async fn dataset(rig: &mut Rig) -> Result<String> {
    let v = rig.clone_of("from-class", None, 0).await?;
    ensure(
        v.ctx.get("datasetPath").map(String::as_str) == Some(DATA),
        "dataset in the context",
    )?;
    rig.stage_until_done(&v, Duration::from_secs(600)).await?;
    let n = publish_and_compare(rig, &v).await?;
    Ok(format!("{n} entries match; no claim named the source"))
}

/// The throttled namespaces are the 192 MiB ones: ask for more than the others hold.
const SLOW: i64 = 170 * MIB;

async fn kill(rig: &mut Rig, src: &str) -> Result<String> {
    let v = rig.clone_of("killed", Some(src), SLOW).await?;
    let read0 = nfsd_read_bytes()?;
    let (mut c, v2) = (rig.c.clone(), v.clone());
    let first = tokio::spawn(async move { vm_common::stage(&mut c, &v2).await });
    let (copied, total) = rig.wait_copied(&v, 0.3).await?;
    rig.helper("kill-driver")?;
    let _ = first.await;
    ensure(
        private_mounts(rig) > 0,
        "the killed driver left its private mounts (expected)",
    )?;
    rig.helper("start-driver")?;
    rig.reconnect().await?;
    let calls = rig.stage_until_done(&v, Duration::from_secs(600)).await?;
    let read = nfsd_read_bytes()? - read0;
    let ratio = read as f64 / total as f64;
    let n = publish_and_compare(rig, &v).await?;
    ensure(
        ratio < 1.5,
        format!("read {read} bytes for a {total}-byte dataset ({ratio:.2}x)"),
    )?;
    ensure(
        private_mounts(rig) == 0,
        "private mounts left after the resumed copy",
    )?;
    Ok(format!(
        "killed at {} of {} MiB; resumed in {calls} NodeStage call(s); the server read {} MiB = {ratio:.2}x the dataset (nfsd io); {n} entries match",
        copied >> 20,
        total >> 20,
        read >> 20
    ))
}

async fn stop(rig: &mut Rig, src: &str) -> Result<String> {
    let v = rig.clone_of("stopped", Some(src), SLOW).await?;
    let (mut c, v2) = (rig.c.clone(), v.clone());
    let first = tokio::spawn(async move { vm_common::stage(&mut c, &v2).await });
    let (copied, _) = rig.wait_copied(&v, 0.3).await?;
    rig.helper("nfs-stop")?;
    let t0 = Instant::now();
    let mut outcome: CsiResult<()> = first.await?;
    // The first call may answer the progress (still copying after 100 s); the retries
    // join the job until it ends.
    while let Err(e) = &outcome {
        if e.message().contains("did not answer")
            || e.message().contains("stalled")
            || t0.elapsed() > Duration::from_secs(400)
        {
            break;
        }
        println!(
            "  NodeStage while the server is stopped: {:?} {}",
            e.code(),
            e.message()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        outcome = vm_common::stage(&mut rig.c, &v).await;
    }
    let failed_after = t0.elapsed().as_secs_f64();
    let e = outcome
        .err()
        .ok_or("NodeStage succeeded with the server stopped")?;
    println!(
        "  server stopped: {:?} {} ({failed_after:.0} s)",
        e.code(),
        e.message()
    );
    ensure(
        e.message().contains("did not answer") || e.message().contains("stalled"),
        format!("unclear error: {}", e.message()),
    )?;
    let saved = rig.progress(&v).ok_or("no progress record")?;
    println!(
        "  progress record at the failure: {} of {} bytes, done {}",
        saved["copied_bytes"], saved["total_bytes"], saved["done"]
    );
    ensure(
        vm_common::mountinfo(&v.staging).is_none(),
        "staged with the server stopped",
    )?;
    ensure(
        vm_common::publish(&mut rig.c, &v).await.is_err(),
        "published with the server stopped",
    )?;
    rig.helper("nfs-start")?;
    let calls = rig.stage_until_done(&v, Duration::from_secs(600)).await?;
    let n = publish_and_compare(rig, &v).await?;
    Ok(format!(
        "stopped at {} MiB; '{}' after {failed_after:.0} s, nothing staged; resumed in {calls} call(s) after nfsd restart; {n} entries match",
        copied >> 20,
        e.message()
    ))
}

/// NFS → NFS: a new NFS volume filled from the source's directory at CreateVolume (the
/// driver copies through its export mounts; `src/volume/nfs/clone.rs`). Unavailable is the copy
/// still running; the retry joins it. The export's two directories compared locally.
async fn nfs_to_nfs(rig: &mut Rig, src: &str) -> Result<String> {
    let req = CreateVolumeRequest {
        name: "nfs-copy".into(),
        volume_capabilities: vec![mount_cap(Mode::MultiNodeMultiWriter, "")],
        parameters: [
            ("server", SERVER),
            ("share", "/"),
            ("gdsPolicy", "disabled"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(Type::Volume(VolumeSource {
                volume_id: src.into(),
            })),
        }),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut calls = 0;
    let v = loop {
        calls += 1;
        match rig.c.controller.create_volume(req.clone()).await {
            Ok(r) => break r.into_inner().volume.ok_or("no volume")?,
            Err(e) if e.code() == tonic::Code::Unavailable && t0.elapsed().as_secs() < 600 => {
                println!("  CreateVolume {calls}: {:?} {}", e.code(), e.message());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(format!("CreateVolume after {calls} calls: {e}").into()),
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let dir = v
        .volume_context
        .get("dir")
        .ok_or("no dir in the volume context")?;
    let n = compare_trees(&rig.export.join(DATA), &rig.export.join(dir))?;
    rig.c
        .controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await?;
    ensure(
        !rig.export.join(dir).exists(),
        "DeleteVolume left the copy's directory",
    )?;
    Ok(format!(
        "{n} entries match in {dir}; {calls} CreateVolume call(s), {secs:.1} s; deleted"
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (socket, work, export) = (
        PathBuf::from(&args[1]),
        PathBuf::from(&args[2]),
        PathBuf::from(&args[3]),
    );
    let only = std::env::var("CLONE_SCENARIOS")
        .unwrap_or_else(|_| "volume dataset kill stop nfs populate figures".into());
    let want = |s: &str| only.split_whitespace().any(|w| w == s);
    let mut rig = Rig {
        c: Clients::connect_ready(&socket, vm_common::READY_DEADLINE).await?,
        socket,
        work,
        export,
        helper: std::env::var("GUEST_HELPER")?,
    };
    let mut failed = 0;
    let src = source_volume(&mut rig).await?;
    println!("source volume {src}");
    if want("volume") {
        let r = volume(&mut rig, &src).await;
        report("clone-of-nfs-volume", r, &mut failed);
    }
    if want("dataset") {
        let r = dataset(&mut rig).await;
        report("clone-of-class-dataset", r, &mut failed);
    }
    if want("kill") {
        let r = kill(&mut rig, &src).await;
        report("sigkill-mid-copy-resumes", r, &mut failed);
    }
    if want("stop") {
        let r = stop(&mut rig, &src).await;
        report("nfs-server-stopped-mid-copy", r, &mut failed);
    }
    if want("nfs") {
        let r = nfs_to_nfs(&mut rig, &src).await;
        report("nfs-to-nfs-clone", r, &mut failed);
    }
    if want("populate") {
        let r = populate::run(&rig);
        report("populate-from-an-nfs-dataset", r, &mut failed);
    }
    if want("figures") {
        let r = figures::run(&rig).await;
        report("figures", r, &mut failed);
    }
    println!("clone scenarios: {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 })
}
