//! Scenarios of the real-kernel VM rig (tests/vm/run.sh), driven through the driver's
//! socket inside the VM: NVMe namespaces by wwid, ext4 with data=ordered, data across
//! unstage/restage with mkfs run once, a foreign filesystem never allocated, NFS over
//! RDMA really negotiated, a dead NFS server timing out while an NVMe volume stages, and
//! a SIGKILLed driver restarted with every published volume still working.
//! Prints one line per scenario (`PASS name: detail` / `FAIL name: error`), exits 1 on
//! any failure.
//!
//! With a third argument `partition`, only the partition layout's scenario runs
//! (`vm_scenarios/partition.rs`: partitions dropped with `partx -d`, the driver
//! restarted, checksums compared).
//!
//! Usage: vm_scenarios SOCKET WORK_DIR [partition]
//! Env: GUEST_HELPER (tests/vm/guest.sh), DRIVER_LOG, NFS_SERVER, NFS_EXPORT_DIR.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

#[path = "vm_scenarios/partition.rs"]
mod partition;
#[allow(dead_code)] // each example uses part of it
mod vm_common;
use vm_common::{
    ensure, mount_cap, mountinfo, report, sh, CsiResult, Result, Vol, MIB, READY_DEADLINE,
};

fn cap(mode: Mode) -> VolumeCapability {
    mount_cap(mode, "")
}

struct Rig {
    socket: PathBuf,
    work: PathBuf,
    c: Clients,
    helper: String,
    driver_log: PathBuf,
    nfs_server: String,
    export_dir: PathBuf,
    /// Where the driver's log stood when the scenarios began.
    log_start: usize,
}

impl Rig {
    async fn create(
        &mut self,
        name: &str,
        params: &[(&str, &str)],
        required: i64,
        limit: i64,
        cap: VolumeCapability,
    ) -> CsiResult<Vol> {
        // The VM has no GPU: the GDS gate (on by default) is turned off explicitly.
        let params: Vec<(&str, &str)> = params
            .iter()
            .copied()
            .chain([("gdsPolicy", "disabled")])
            .collect();
        self.create_raw(name, &params, required, limit, cap).await
    }

    /// CreateVolume with exactly these parameters (no gdsPolicy added).
    async fn create_raw(
        &mut self,
        name: &str,
        params: &[(&str, &str)],
        required: i64,
        limit: i64,
        cap: VolumeCapability,
    ) -> CsiResult<Vol> {
        vm_common::create(
            &mut self.c,
            &self.work,
            name,
            params,
            (required, limit),
            cap,
        )
        .await
    }

    async fn stage(&mut self, v: &Vol) -> CsiResult<()> {
        vm_common::stage(&mut self.c, v).await
    }

    async fn publish(&mut self, v: &Vol) -> CsiResult<()> {
        vm_common::publish(&mut self.c, v).await
    }

    async fn unpublish(&mut self, v: &Vol) -> CsiResult<()> {
        vm_common::unpublish(&mut self.c, v).await
    }

    async fn unstage(&mut self, v: &Vol) -> CsiResult<()> {
        vm_common::unstage(&mut self.c, v).await
    }

    async fn teardown(&mut self, v: &Vol) -> Result<()> {
        vm_common::teardown(&mut self.c, v).await
    }

    fn helper(&self, what: &str) -> Result<()> {
        vm_common::helper(&self.helper, what)
    }

    /// mkfs runs on the volume's namespace, from the driver's log. The format runs as a job
    /// outside the request's span, so its line names the device (`device=/dev/nvmeXnY`), not
    /// the volume.
    fn mkfs_count(&self, volume_id: &str) -> Result<usize> {
        let (dev, _) = namespace_of(volume_id)?;
        let field = format!("device={dev} ");
        let log = std::fs::read_to_string(&self.driver_log)?;
        // Only this run's lines: csi-sanity before it formats namespaces too.
        Ok(log[self.log_start.min(log.len())..]
            .lines()
            .filter(|l| l.contains("formatting fresh device") && l.contains(&field))
            .count())
    }
}

/// The device id docs/design.md ("Volume ids") documents for an NVMe namespace: `nvme-` and
/// the first 16 hex digits of SHA-256 over `wwid:<wwid>`. Computed here from the documented
/// rule, not by the driver's own function, so a changed derivation cannot pass unnoticed.
fn documented_nvme_id(wwid: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("wwid:{wwid}").as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("nvme-{hex}")
}

/// The worked example of docs/design.md, so the rule above is the documented one.
const DOCUMENTED_EXAMPLE: (&str, &str) = ("nvme.1b36-fixture-0000", "nvme-7320841ec6c40aae");

/// `/dev/nvmeXnY` of the namespace whose device id the volume id carries.
fn namespace_of(volume_id: &str) -> Result<(String, String)> {
    let dev_id = volume_id.split(':').nth(1).ok_or("not a block volume id")?;
    for entry in std::fs::read_dir("/sys/block")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !name.starts_with("nvme") {
            continue;
        }
        let wwid = std::fs::read_to_string(format!("/sys/block/{name}/wwid"))?;
        let wwid = wwid.trim();
        if documented_nvme_id(wwid) == dev_id {
            return Ok((format!("/dev/{name}"), wwid.to_owned()));
        }
    }
    Err(format!("no namespace's wwid hashes to {dev_id}").into())
}

fn s_wwid(a: &Vol) -> Result<String> {
    let (wwid, id) = DOCUMENTED_EXAMPLE;
    ensure(
        documented_nvme_id(wwid) == id,
        "the scenario's id rule is not the documented one",
    )?;
    let (dev, wwid) = namespace_of(&a.id)?;
    let size = sh(&format!("blockdev --getsize64 {dev}"))?;
    Ok(format!("{} -> {dev} (wwid {wwid}, {size} bytes)", a.id))
}

async fn s_data_ordered(r: &mut Rig, a: &Vol) -> Result<String> {
    r.stage(a).await?;
    r.stage(a).await?; // idempotent
    let (fs, src, opts) = mountinfo(&a.staging).ok_or("staging path not mounted")?;
    let (dev, _) = namespace_of(&a.id)?;
    ensure(fs == "ext4", format!("fs {fs}"))?;
    ensure(src == dev, format!("source {src}, expected {dev}"))?;
    ensure(
        opts.split(',').any(|o| o == "data=ordered"),
        format!("super options {opts}"),
    )?;
    Ok(format!("{fs} {src} {opts}"))
}

/// What s_restage writes on the block volume, and s_restart reads back.
const BLOCK_FILE: &str = "data.bin";
fn block_payload() -> String {
    (0..4096)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}
/// What s_nfs writes on the NFS volume.
const NFS_FILE: &str = "hello.txt";
const NFS_PAYLOAD: &str = "over rdma\n";

async fn s_restage(r: &mut Rig, a: &Vol) -> Result<String> {
    let (dev, _) = namespace_of(&a.id)?;
    r.publish(a).await?;
    let uuid_before = sh(&format!("blkid -p -o value -s UUID {dev}"))?;
    let payload = block_payload();
    let file = a.target.join(BLOCK_FILE);
    std::fs::write(&file, &payload)?;
    sh(&format!("sync -f {}", file.display()))?;
    r.unpublish(a).await?;
    r.unstage(a).await?;
    ensure(
        mountinfo(&a.staging).is_none(),
        "still mounted after unstage",
    )?;
    r.stage(a).await?;
    r.publish(a).await?;
    let back = std::fs::read_to_string(&file)?;
    ensure(back == payload, "data differs after restage")?;
    let uuid_after = sh(&format!("blkid -p -o value -s UUID {dev}"))?;
    ensure(uuid_before == uuid_after, "filesystem uuid changed")?;
    let mkfs = r.mkfs_count(&a.id)?;
    ensure(mkfs == 1, format!("mkfs ran {mkfs} times"))?;
    Ok(format!(
        "4096 bytes intact, fs uuid {uuid_after} unchanged, mkfs ran {mkfs} time"
    ))
}

async fn s_foreign(r: &mut Rig) -> Result<String> {
    let dev = sh("blkid -U 0f0f0f0f-1111-2222-3333-444444444444")?;
    let before = sh(&format!(
        "blkid -p -o export {dev} | grep -E '^(UUID|LABEL|TYPE)='"
    ))?;
    let err = match r
        .create(
            "vm-foreign",
            &[],
            80 * MIB,
            80 * MIB,
            cap(Mode::SingleNodeWriter),
        )
        .await
    {
        Ok(v) => return Err(format!("allocated {} on a foreign namespace", v.id).into()),
        Err(e) => e,
    };
    ensure(
        err.code() == Code::ResourceExhausted && err.message().contains(&dev),
        format!("{:?}: {}", err.code(), err.message()),
    )?;
    let after = sh(&format!(
        "blkid -p -o export {dev} | grep -E '^(UUID|LABEL|TYPE)='"
    ))?;
    ensure(before == after, "the foreign signature changed")?;
    Ok(format!(
        "{dev} ({}) refused: {:?}; signature unchanged",
        before.replace('\n', " "),
        err.code()
    ))
}

async fn s_nfs(r: &mut Rig, n: &Vol) -> Result<String> {
    ensure(n.id.starts_with("nfs:"), format!("id {}", n.id))?;
    r.stage(n).await?;
    r.stage(n).await?;
    let (fs, src, opts) = mountinfo(&n.staging).ok_or("staging path not mounted")?;
    for want in ["proto=rdma", "port=20049", "vers=4.1"] {
        ensure(
            opts.split(',').any(|o| o == want),
            format!("{want} missing in {opts}"),
        )?;
    }
    r.publish(n).await?;
    let file = n.target.join(NFS_FILE);
    std::fs::write(&file, NFS_PAYLOAD)?;
    let dir = n.ctx.get("dir").ok_or("no dir in the volume context")?;
    let server_side = r.export_dir.join(dir).join(NFS_FILE);
    let seen = std::fs::read_to_string(&server_side)?;
    ensure(seen == NFS_PAYLOAD, "the server does not see the file")?;
    let opts: Vec<&str> = opts
        .split(',')
        .filter(|o| o.starts_with("proto=") || o.starts_with("port=") || o.starts_with("vers="))
        .collect();
    Ok(format!(
        "{fs} {src} {}; file visible on the server at {}",
        opts.join(","),
        server_side.display()
    ))
}

/// `vols`: each published volume with a file written on it before the kill and its content.
async fn s_restart(r: &mut Rig, vols: &[(&Vol, &str, String)]) -> Result<String> {
    r.helper("restart-driver")?;
    r.c = Clients::connect_ready(&r.socket, READY_DEADLINE).await?;
    let mut checked = 0;
    let read_back = |v: &Vol, file: &str, want: &str, when: &str| -> Result<()> {
        let got = std::fs::read(v.target.join(file))
            .map_err(|e| format!("{}: {file} unreadable {when}: {e}", v.id))?;
        ensure(
            got == want.as_bytes(),
            format!(
                "{}: {file} differs {when} ({} bytes, want {})",
                v.id,
                got.len(),
                want.len()
            ),
        )
    };
    for (v, file, want) in vols {
        // The published mounts outlived the driver, with their data.
        ensure(
            mountinfo(&v.target).is_some(),
            format!("{} unpublished", v.id),
        )?;
        read_back(v, file, want, "after the restart")?;
        for _ in 0..3 {
            r.stage(v).await?;
            r.publish(v).await?;
        }
        read_back(v, file, want, "after repeated stage/publish")?;
        checked += 1;
    }
    let vols: Vec<&Vol> = vols.iter().map(|(v, _, _)| *v).collect();
    let a = r
        .create("vm-a", &[], 90 * MIB, 0, cap(Mode::SingleNodeWriter))
        .await?;
    ensure(
        a.id == vols[0].id,
        "CreateVolume after restart gave another id",
    )?;
    let list =
        r.c.controller
            .list_volumes(ListVolumesRequest::default())
            .await?
            .into_inner();
    let ids: Vec<String> = list
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    for v in &vols {
        ensure(ids.contains(&v.id), format!("{} not listed", v.id))?;
    }
    let mkfs = r.mkfs_count(&vols[0].id)?;
    ensure(mkfs == 1, format!("mkfs ran {mkfs} times"))?;
    Ok(format!(
        "SIGKILL + restart: {checked} published volumes still mounted, their files read back \
         byte for byte before and after stage/publish repeated 3x, CreateVolume same id, \
         ListVolumes lists them, mkfs still once"
    ))
}

async fn s_dead_server(r: &mut Rig, n2: &Vol, b: &Vol) -> Result<String> {
    r.helper("nfs-stop")?;
    let mut rn = r.c.clone();
    let req = NodeStageVolumeRequest {
        volume_id: n2.id.clone(),
        staging_target_path: n2.staging.display().to_string(),
        volume_capability: Some(n2.cap.clone()),
        volume_context: n2.ctx.clone(),
        ..Default::default()
    };
    std::fs::create_dir_all(&n2.staging)?;
    let t0 = Instant::now();
    let nfs = tokio::spawn(async move {
        let res = rn.node.node_stage_volume(req).await;
        (res, t0.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tb = Instant::now();
    r.stage(b).await?;
    let nvme_done = t0.elapsed();
    let nvme_took = tb.elapsed();
    let (res, nfs_took) = nfs.await?;
    r.helper("nfs-start")?;
    let err = match res {
        Ok(_) => return Err("NodeStageVolume against a stopped server succeeded".into()),
        Err(e) => e,
    };
    ensure(
        err.code() == Code::DeadlineExceeded,
        format!("{:?}: {}", err.code(), err.message()),
    )?;
    ensure(
        nfs_took < Duration::from_secs(26),
        format!("took {nfs_took:?}"),
    )?;
    ensure(
        nvme_done < nfs_took,
        format!("NVMe stage finished at {nvme_done:?}, after the NFS call ({nfs_took:?})"),
    )?;
    ensure(mountinfo(&n2.staging).is_none(), "a mount was left behind")?;
    Ok(format!(
        "NFS stage: {:?} after {:.1} s (--mount-timeout 20s); NVMe stage meanwhile OK in {:.1} s",
        err.code(),
        nfs_took.as_secs_f64(),
        nvme_took.as_secs_f64()
    ))
}

/// The driver binary beside this example (target/release/examples/.. -> target/release).
fn driver_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(Path::parent).ok_or("no target dir")?;
    Ok(dir.join("gds-csi"))
}

/// NodeGetVolumeStats' condition for a published volume.
async fn condition(r: &mut Rig, v: &Vol) -> Result<VolumeCondition> {
    let resp =
        r.c.node
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: v.id.clone(),
                volume_path: v.target.display().to_string(),
                ..Default::default()
            })
            .await?
            .into_inner();
    Ok(resp.volume_condition.ok_or("no volume_condition")?)
}

/// On a real kernel: NFS volumes follow GDS readiness. The VM has NFS over
/// RDMA for real but no GPU and no nvidia_fs, so the node is not ready for gds-nfs-rdma.
/// `req`: gdsPolicy absent (required), `pref`: preferred, `off`: disabled.
async fn s_gate_nfs(r: &mut Rig, req: &Vol, pref: &Vol, off: &Vol) -> Result<String> {
    let name =
        r.c.identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await?
            .into_inner()
            .name;
    let key = format!("{name}/gds-nfs-rdma");
    // CreateVolume: only the required volume is confined to ready nodes.
    let topo = |v: &Vol| -> Vec<HashMap<String, String>> {
        v.topology.iter().map(|t| t.segments.clone()).collect()
    };
    let want = vec![HashMap::from([(key.clone(), "true".to_owned())])];
    ensure(
        topo(req) == want,
        format!("required volume's topology {:?}, want {want:?}", topo(req)),
    )?;
    ensure(
        !req.ctx.contains_key("gdsPolicy"),
        "gdsPolicy was not absent",
    )?;
    for v in [pref, off] {
        ensure(
            topo(v).is_empty(),
            format!("{} has topology {:?}", v.id, topo(v)),
        )?;
    }
    // NodeGetInfo: this node is not ready for NFS over RDMA GDS.
    let info =
        r.c.node
            .node_get_info(NodeGetInfoRequest {})
            .await?
            .into_inner();
    let segs = info
        .accessible_topology
        .map(|t| t.segments)
        .unwrap_or_default();
    ensure(
        !segs.contains_key(&key),
        format!("NodeGetInfo topology {segs:?}, want no {key} (not ready)"),
    )?;

    // Required: staged over real RDMA, publish refused naming the failed checks.
    r.stage(req).await?;
    let (_, _, opts) = mountinfo(&req.staging).ok_or("required volume not staged")?;
    ensure(
        opts.split(',').any(|o| o == "proto=rdma"),
        format!("staged without RDMA: {opts}"),
    )?;
    let err = match r.publish(req).await {
        Ok(()) => return Err("NodePublishVolume of a required NFS volume succeeded".into()),
        Err(e) => e,
    };
    let msg = err.message();
    ensure(
        err.code() == Code::FailedPrecondition,
        format!("{:?}: {msg}", err.code()),
    )?;
    // No GPU: these fail here; the mount and the RDMA device pass, so they are not named.
    for id in ["gpu.driver", "nvidia_fs."] {
        ensure(
            msg.contains(id),
            format!("refusal does not name {id}: {msg}"),
        )?;
    }
    for id in ["volume.filesystem", "volume.mount", "rdma.devices"] {
        ensure(!msg.contains(id), format!("refusal names {id}: {msg}"))?;
    }
    ensure(
        mountinfo(&req.target).is_none(),
        "the refused volume is mounted at its target",
    )?;
    let failed: Vec<&str> = msg
        .lines()
        .skip(1)
        .filter_map(|l| l.split(':').next())
        .collect();
    // What the gate's checks say about the mount (doctor runs the same checks).
    let out = std::process::Command::new(driver_exe()?)
        .args(["doctor", "--backend", "nfs-rdma", "--json", "--path"])
        .arg(&req.staging)
        .output()?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "doctor --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let check = |id: &str| -> Option<(String, String)> {
        doc["checks"].as_array()?.iter().find_map(|c| {
            (c["id"] == id).then(|| {
                (
                    c["status"].as_str().unwrap_or("").to_owned(),
                    c["evidence"].as_str().unwrap_or("").to_owned(),
                )
            })
        })
    };
    let (st, fs_ev) = check("volume.filesystem").ok_or("doctor: no volume.filesystem")?;
    ensure(
        st == "pass" && fs_ev.contains("proto=rdma"),
        format!("doctor volume.filesystem {st}: {fs_ev}"),
    )?;
    let (st, rdma_ev) = check("rdma.devices").ok_or("doctor: no rdma.devices")?;
    ensure(st == "pass", format!("doctor rdma.devices {st}: {rdma_ev}"))?;
    ensure(
        doc["ready"] == false,
        "doctor says the node is ready for NFS GDS",
    )?;

    // Preferred: published in compat mode, reported abnormal.
    r.stage(pref).await?;
    r.publish(pref).await?;
    ensure(mountinfo(&pref.target).is_some(), "preferred not mounted")?;
    let c = condition(r, pref).await?;
    ensure(
        c.abnormal && c.message.contains("compat mode"),
        format!("preferred volume condition {c:?}"),
    )?;
    // Disabled: published, normal.
    r.stage(off).await?;
    r.publish(off).await?;
    let c_off = condition(r, off).await?;
    ensure(
        !c_off.abnormal,
        format!("disabled volume condition {c_off:?}"),
    )?;
    Ok(format!(
        "CreateVolume topology {key}=true (required), none (preferred, disabled); NodeGetInfo \
         {key}=false; required publish {:?} naming {}; mount judged by the gate's checks: \
         volume.filesystem pass ({}), rdma.devices pass; preferred published, condition \
         abnormal \"{}\"; disabled published, condition \"{}\"",
        err.code(),
        failed.join(","),
        fs_ev
            .split([' ', ','])
            .filter(|o| o.starts_with("proto=") || o.starts_with("vers="))
            .collect::<Vec<_>>()
            .join(","),
        c.message.chars().take(80).collect::<String>(),
        c_off.message
    ))
}

/// Unpublish and unstage of an NFS volume whose server is gone answer OK within
/// the kubelet's 2-minute deadline, leave no mount, and the driver logs the escalation.
async fn s_unmount_dead(r: &mut Rig, v: &Vol) -> Result<String> {
    const KUBELET: Duration = Duration::from_secs(120);
    const STEP: Duration = Duration::from_secs(20);
    r.stage(v).await?;
    r.publish(v).await?;
    let file = v.target.join(NFS_FILE);
    std::fs::write(&file, NFS_PAYLOAD)?;
    sh(&format!("sync -f {}", file.display()))?;
    let log_before = std::fs::read_to_string(&r.driver_log)?.len();
    r.helper("nfs-stop")?;
    let res = unmount_dead(r, v, KUBELET).await;
    // Later scenarios and the teardown need the server.
    let started = r.helper("nfs-start");
    let (took_unpub, took_unstage) = res?;
    started?;
    let log = std::fs::read_to_string(&r.driver_log)?;
    let log = &log[log_before.min(log.len())..];
    let steps = |path: &Path| -> Vec<&'static str> {
        let p = path.display().to_string();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&p)).collect();
        [
            ("forcing it (umount -f)", "umount timed out"),
            ("force-unmounted", "umount -f done"),
            ("detaching it lazily (umount -l)", "umount -f not enough"),
            ("detached lazily", "umount -l done"),
        ]
        .into_iter()
        .filter(|(needle, _)| lines.iter().any(|l| l.contains(needle)))
        .map(|(_, step)| step)
        .collect()
    };
    let (s_pub, s_stage) = (steps(&v.target), steps(&v.staging));
    // A call that outlasted the plain unmount's deadline (--mount-timeout 20s) must have
    // escalated, and said so.
    for (call, took, logged) in [
        ("unpublish", took_unpub, &s_pub),
        ("unstage", took_unstage, &s_stage),
    ] {
        ensure(
            took < STEP || logged.first() == Some(&"umount timed out"),
            format!("{call} took {took:?} and logged no escalation"),
        )?;
    }
    Ok(format!(
        "server stopped: NodeUnpublishVolume OK in {:.1} s (logged: {}), NodeUnstageVolume OK \
         in {:.1} s (logged: {}), both < 120 s; no mount left at target or staging",
        took_unpub.as_secs_f64(),
        if s_pub.is_empty() {
            "plain umount".into()
        } else {
            s_pub.join(" -> ")
        },
        took_unstage.as_secs_f64(),
        if s_stage.is_empty() {
            "plain umount".into()
        } else {
            s_stage.join(" -> ")
        },
    ))
}

/// NodeGetVolumeStats' condition of `v`'s target, bounded by `bound` on the client side.
async fn condition_within(
    r: &mut Rig,
    v: &Vol,
    bound: Duration,
) -> Result<(VolumeCondition, Duration)> {
    let t = Instant::now();
    let cond = tokio::time::timeout(bound, condition(r, v))
        .await
        .map_err(|_| {
            format!(
                "NodeGetVolumeStats: no answer within {bound:?}; driver threads in NFS: {}",
                nfs_stacks(&r.work)
            )
        })??;
    Ok((cond, t.elapsed()))
}

/// An NFS volume whose server is stopped, on a real kernel. NodeGetVolumeStats
/// answers abnormal within the NFS deadline (--mount-timeout 20s) while statvfs hangs in the
/// kernel, and at once while that statvfs is still stuck; healthy again once it is back.
/// (Mounted without RDMA is tested in-process only: here a TCP mount of the same server made
/// behind the driver's back came up proto=rdma in two runs, also with the volume's own
/// mounts gone; the driver keeps the export itself mounted over RDMA (src/volume/nfs/mod.rs), and
/// the kernel gave the new mount that RDMA client.)
async fn s_stats_conditions(r: &mut Rig, v: &Vol) -> Result<String> {
    const BOUND: Duration = Duration::from_secs(40);
    r.stage(v).await?;
    r.publish(v).await?;
    let (cond, _) = condition_within(r, v, BOUND).await?;
    ensure(!cond.abnormal, format!("healthy volume: {}", cond.message))?;
    r.helper("nfs-stop")?;
    let dead = async {
        let first = condition_within(r, v, BOUND).await?;
        let second = condition_within(r, v, BOUND).await?;
        Ok::<_, Box<dyn std::error::Error>>((first, second))
    }
    .await;
    let started = r.helper("nfs-start");
    let ((c1, took1), (c2, took2)) = dead?;
    started?;
    ensure(
        c1.abnormal && c1.message.contains("does not answer"),
        format!("server stopped: {}", c1.message),
    )?;
    ensure(took1 < Duration::from_secs(30), format!("took {took1:?}"))?;
    ensure(
        c2.abnormal && took2 < Duration::from_secs(5),
        format!(
            "second call, statvfs still stuck: {took2:?}: {}",
            c2.message
        ),
    )?;
    // The server back (NFSv4.1 grace: 10 s in the rig): healthy again.
    let t = Instant::now();
    loop {
        let (c, _) = condition_within(r, v, BOUND).await?;
        if !c.abnormal {
            break;
        }
        ensure(
            t.elapsed() < Duration::from_secs(90),
            format!("still abnormal after the server came back: {}", c.message),
        )?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let recovered = t.elapsed();
    Ok(format!(
        "server stopped: abnormal in {:.1} s (\"{}\"), again in {:.1} s while statvfs is \
         stuck; healthy {:.1} s after the restart",
        took1.as_secs_f64(),
        c1.message,
        took2.as_secs_f64(),
        recovered.as_secs_f64(),
    ))
}

/// Kernel stacks of the driver's threads that wait in NFS or RPC code (where a call hangs).
fn nfs_stacks(work: &Path) -> String {
    let cmd = format!(
        "pid=$(cat {}/driver.pid); for t in /proc/$pid/task/*; do \
         s=$(cat $t/stack 2>/dev/null | awk '{{print $2}}' | tr '\n' ' '); \
         case \"$s\" in *nfs*|*rpc*) echo \"$(cat $t/comm): $s\";; esac; done",
        work.display()
    );
    sh(&cmd)
        .unwrap_or_else(|e| e.to_string())
        .replace('\n', " | ")
}

/// The two calls against the stopped server, each bounded by the kubelet's deadline.
async fn unmount_dead(r: &mut Rig, v: &Vol, bound: Duration) -> Result<(Duration, Duration)> {
    let t = Instant::now();
    match tokio::time::timeout(bound, r.unpublish(v)).await {
        Err(_) => {
            return Err(format!(
                "NodeUnpublishVolume: no answer within {bound:?}; driver threads in NFS: {}",
                nfs_stacks(&r.work)
            )
            .into())
        }
        Ok(res) => res.map_err(|e| format!("NodeUnpublishVolume: {e}"))?,
    }
    let took_unpub = t.elapsed();
    ensure(
        mountinfo(&v.target).is_none(),
        "target still mounted after unpublish",
    )?;
    let t = Instant::now();
    match tokio::time::timeout(bound, r.unstage(v)).await {
        Err(_) => {
            return Err(format!(
                "NodeUnstageVolume: no answer within {bound:?}; driver threads in NFS: {}",
                nfs_stacks(&r.work)
            )
            .into())
        }
        Ok(res) => res.map_err(|e| format!("NodeUnstageVolume: {e}"))?,
    }
    let took_unstage = t.elapsed();
    ensure(
        mountinfo(&v.staging).is_none(),
        "staging still mounted after unstage",
    )?;
    Ok((took_unpub, took_unstage))
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = PathBuf::from(args.next().ok_or("usage: vm_scenarios SOCKET WORK_DIR")?);
    let work = PathBuf::from(args.next().ok_or("usage: vm_scenarios SOCKET WORK_DIR")?);
    let env = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let c = Clients::connect_ready(&socket, READY_DEADLINE).await?;
    let mut r = Rig {
        socket,
        work,
        c,
        helper: env("GUEST_HELPER")?,
        driver_log: env("DRIVER_LOG")?.into(),
        nfs_server: env("NFS_SERVER")?,
        export_dir: env("NFS_EXPORT_DIR")?.into(),
        log_start: 0,
    };
    r.log_start = std::fs::read_to_string(&r.driver_log)?.len();
    let started = Instant::now();
    let mut failed = 0;
    if args.next().as_deref() == Some("partition") {
        let res = partition::s_partx_restart(&mut r).await;
        report(
            "partition layout: partx -d, driver restarted (re-sync), restaged, checksums equal",
            res,
            &mut failed,
        );
        return finish(failed, started);
    }
    let server = r.nfs_server.clone();
    let nfs_params = [("server", server.as_str()), ("share", "/")];

    let a = r
        .create("vm-a", &[], 90 * MIB, 0, cap(Mode::SingleNodeWriter))
        .await?;
    let res = s_wwid(&a);
    report("nvme namespace found by wwid", res, &mut failed);
    let res = s_data_ordered(&mut r, &a).await;
    report(
        "ext4 staged with data=ordered (mountinfo)",
        res,
        &mut failed,
    );
    let res = s_restage(&mut r, &a).await;
    report(
        "write, unstage, restage: data intact, mkfs once",
        res,
        &mut failed,
    );
    let res = s_foreign(&mut r).await;
    report("foreign filesystem never allocated", res, &mut failed);

    let n = r
        .create("vm-nfs", &nfs_params, 0, 0, cap(Mode::MultiNodeMultiWriter))
        .await?;
    let res = s_nfs(&mut r, &n).await;
    report(
        "NFS volume mounted proto=rdma,port=20049,vers=4.1",
        res,
        &mut failed,
    );

    let expected = [
        (&a, BLOCK_FILE, block_payload()),
        (&n, NFS_FILE, NFS_PAYLOAD.to_owned()),
    ];
    let res = s_restart(&mut r, &expected).await;
    report("driver SIGKILLed and restarted", res, &mut failed);

    // Dead server: the first NFS volume is taken down first (its mount would hang).
    let res = r.teardown(&n).await;
    report(
        "NFS volume torn down (each call twice)",
        res.map(|_| n.id.clone()),
        &mut failed,
    );
    let n2 = r
        .create("vm-nfs-2", &nfs_params, 0, 0, cap(Mode::SingleNodeWriter))
        .await?;
    let b = r
        .create("vm-b", &[], 64 * MIB, 64 * MIB, cap(Mode::SingleNodeWriter))
        .await?;
    let res = s_dead_server(&mut r, &n2, &b).await;
    report(
        "NFS server stopped: stage fails in its deadline, NVMe stages meanwhile",
        res,
        &mut failed,
    );

    let nfs_only = [("server", server.as_str()), ("share", "/")];
    let gated = [
        ("vm-gate-required", None),
        ("vm-gate-preferred", Some("preferred")),
        ("vm-gate-disabled", Some("disabled")),
    ];
    let mut g = Vec::new();
    for (name, policy) in gated {
        let mut p = nfs_only.to_vec();
        p.extend(policy.map(|v| ("gdsPolicy", v)));
        g.push(
            r.create_raw(name, &p, 0, 0, cap(Mode::MultiNodeMultiWriter))
                .await?,
        );
    }
    let res = s_gate_nfs(&mut r, &g[0], &g[1], &g[2]).await;
    report(
        "NFS GDS gate: required refused on a node without GPU, preferred compat, disabled normal",
        res,
        &mut failed,
    );
    for v in &g {
        if let Err(e) = r.teardown(v).await {
            report("NFS gate volumes torn down", Err(e), &mut failed);
        }
    }

    let n4 = r
        .create("vm-nfs-4", &nfs_params, 0, 0, cap(Mode::SingleNodeWriter))
        .await?;
    let res = s_stats_conditions(&mut r, &n4).await;
    report(
        "NFS stats: server stopped is abnormal within the deadline, healthy once back",
        res,
        &mut failed,
    );
    let res = r.teardown(&n4).await;
    report(
        "NFS stats volume torn down (each call twice)",
        res.map(|_| n4.id.clone()),
        &mut failed,
    );

    let n3 = r
        .create("vm-nfs-3", &nfs_params, 0, 0, cap(Mode::SingleNodeWriter))
        .await?;
    let res = s_unmount_dead(&mut r, &n3).await;
    report(
        "NFS server stopped: unpublish and unstage OK within 2 min, no mount left",
        res,
        &mut failed,
    );

    let mut cleanup = Ok(());
    for v in [&a, &b, &n2, &n3] {
        if let Err(e) = r.teardown(v).await {
            cleanup = Err(format!("{}: {e}", v.id));
            break;
        }
    }
    let left =
        r.c.controller
            .list_volumes(ListVolumesRequest::default())
            .await?
            .into_inner()
            .entries
            .len();
    report(
        "teardown of everything, each call twice",
        cleanup
            .map_err(Into::into)
            .and_then(|_| ensure(left == 0, format!("{left} volumes still listed")))
            .map(|_| "ListVolumes empty".to_owned()),
        &mut failed,
    );
    finish(failed, started)
}

fn finish(failed: usize, started: Instant) -> Result<()> {
    println!(
        "scenarios: {} failed, {:.1} s",
        failed,
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
