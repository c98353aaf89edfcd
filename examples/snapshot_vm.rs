//! CSI snapshots on the VM rig, run inside the guest against a driver serving SOCKET, with
//! the kernel's NFS server exporting EXPORT over soft-RoCE RDMA; the snapshot store is
//! `EXPORT/snaps` (class parameters storeServer, storeShare `/`, storePath `snaps`). DATA is
//! the dataset (a tmpfs the guest script filled) written into the source volumes.
//! Prints `PASS name: detail` / `FAIL name: error` per scenario and `FIGURES ...` lines;
//! exits 1 on any failure.
//! Usage: snapshot_vm SOCKET WORK_DIR EXPORT DATA
//! Env: GUEST_HELPER (tests/vm/snapshot_guest.sh: kill-driver, start-driver, nfs-stop,
//! nfs-start), SNAPSHOT_SCENARIOS (space-separated subset of `restore live kill
//! restore-kill figures delete stop small`, default all), DRIVER_PID_FILE, DRIVER_LOG.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::volume_content_source::{SnapshotSource, Type};
use gds_csi::csi::*;

#[allow(dead_code)] // each example uses part of it
mod vm_common;
use vm_common::{ensure, mount_cap, mountinfo, report, sh, CsiResult, Result, Vol, MIB};

#[path = "snapshot_vm_parts/figures.rs"]
mod figures;
#[path = "snapshot_vm_parts/small_files.rs"]
mod small_files;

const SERVER: &str = "192.0.2.1";
/// The snapshot store's directory below the export (the class's `storePath`).
const STORE: &str = "snaps";
/// Sizes that steer smallest-fit allocation onto the namespaces tests/vm/snapshot.sh made:
/// the 256 MiB one (steady writer), the 224 MiB read-throttled one, the 192 MiB
/// write-throttled ones; 0 lands on a 160 MiB one.
const LIVE: i64 = 240 * MIB;
const SLOW_SOURCE: i64 = 200 * MIB;
const SLOW_TARGET: i64 = 170 * MIB;
/// The snapshot taken with `checksums: "true"`.
const CHECKSUMMED: &str = "snap-stop";

pub struct Rig {
    pub c: Clients,
    socket: PathBuf,
    pub work: PathBuf,
    pub export: PathBuf,
    pub data: PathBuf,
    helper: String,
    /// Bytes of the dataset as stored (`du -s -B1`: the sparse file's data, the hard link once).
    pub data_bytes: u64,
    /// Bytes one full read of the dataset's files moves over NFS v4.1, which has no
    /// SEEK_DATA, so a hole travels as zeros: every file's size, the hard link once.
    pub read_bytes: u64,
    /// Snapshot ids by name, for the later scenarios.
    pub snaps: HashMap<String, String>,
    /// The source volume `src-a` once written.
    pub source: Option<Vol>,
    /// The read-throttled source once written.
    pub slow: Option<Vol>,
}

/// A snapshot's final answer and how it got there.
pub struct Taken {
    pub snap: Snapshot,
    pub calls: u32,
    pub secs: f64,
}

impl Rig {
    pub fn helper(&self, what: &str) -> Result<()> {
        vm_common::helper(&self.helper, what)
    }

    async fn reconnect(&mut self) -> Result<()> {
        self.c = Clients::connect_ready(&self.socket, vm_common::READY_DEADLINE).await?;
        Ok(())
    }

    /// An empty ext4 block volume of at least `required` bytes.
    pub async fn volume(&mut self, name: &str, required: i64) -> CsiResult<Vol> {
        let cap = mount_cap(Mode::SingleNodeWriter, "ext4");
        vm_common::create(
            &mut self.c,
            &self.work,
            name,
            &[("gdsPolicy", "disabled")],
            (required, 0),
            cap,
        )
        .await
    }

    /// CreateVolume from a snapshot (filled at its first NodeStage).
    pub async fn restore(&mut self, name: &str, snap: &str, required: i64) -> CsiResult<Vol> {
        let cap = mount_cap(Mode::SingleNodeWriter, "ext4");
        let v = self
            .c
            .controller
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: required,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap.clone()],
                parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
                volume_content_source: Some(VolumeContentSource {
                    r#type: Some(Type::Snapshot(SnapshotSource {
                        snapshot_id: snap.into(),
                    })),
                }),
                ..Default::default()
            })
            .await?
            .into_inner()
            .volume
            .ok_or_else(|| tonic::Status::internal("no volume"))?;
        let source = v.content_source.as_ref().and_then(|s| s.r#type.as_ref());
        if !matches!(source, Some(Type::Snapshot(s)) if s.snapshot_id == snap) {
            return Err(tonic::Status::internal(format!(
                "the restored volume does not name its snapshot as content source: {source:?}"
            )));
        }
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

    /// The snapshot class: the NFS-over-RDMA store on the export; the snapshot named
    /// CHECKSUMMED with `checksums: "true"` (every file's SHA-256 in its manifest).
    pub fn class(name: &str) -> HashMap<String, String> {
        let mut class: HashMap<String, String> = [
            ("storeServer", SERVER),
            ("storeShare", "/"),
            ("storePath", STORE),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if name == CHECKSUMMED {
            class.insert("checksums".into(), "true".into());
        }
        class
    }

    pub async fn create_snapshot(&mut self, name: &str, source: &str) -> CsiResult<Snapshot> {
        self.c
            .controller
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: source.into(),
                name: name.into(),
                parameters: Self::class(name),
                ..Default::default()
            })
            .await?
            .into_inner()
            .snapshot
            .ok_or_else(|| tonic::Status::internal("no snapshot in the answer"))
    }

    /// CreateSnapshot in the background: the driver waits up to 20 s for the copy before
    /// it answers, and the scenarios interrupt it meanwhile.
    pub fn spawn_snapshot(
        &self,
        name: &str,
        source: &str,
    ) -> tokio::task::JoinHandle<CsiResult<Snapshot>> {
        let mut c = self.c.clone();
        let req = CreateSnapshotRequest {
            source_volume_id: source.into(),
            name: name.into(),
            parameters: Self::class(name),
            ..Default::default()
        };
        tokio::spawn(async move {
            c.controller
                .create_snapshot(req)
                .await?
                .into_inner()
                .snapshot
                .ok_or_else(|| tonic::Status::internal("no snapshot in the answer"))
        })
    }

    /// CreateSnapshot until it answers ready_to_use (false is the copy still running; a
    /// retry joins it), at most `within`.
    pub async fn snapshot_until_ready(
        &mut self,
        name: &str,
        source: &str,
        within: Duration,
    ) -> Result<Taken> {
        let start = Instant::now();
        let mut calls = 0;
        loop {
            calls += 1;
            match self.create_snapshot(name, source).await {
                Ok(s) if s.ready_to_use => {
                    ensure(
                        s.source_volume_id == source,
                        format!("source {} in the answer", s.source_volume_id),
                    )?;
                    self.snaps.insert(name.into(), s.snapshot_id.clone());
                    return Ok(Taken {
                        snap: s,
                        calls,
                        secs: start.elapsed().as_secs_f64(),
                    });
                }
                Ok(_) if start.elapsed() < within => {}
                Err(e) if e.code() == tonic::Code::Unavailable && start.elapsed() < within => {
                    println!("  CreateSnapshot {calls}: {:?} {}", e.code(), e.message());
                }
                Ok(_) => return Err(format!("{name} not ready after {calls} calls").into()),
                Err(e) => return Err(format!("CreateSnapshot {name} call {calls}: {e}").into()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// NodeStage until it succeeds (Unavailable is the fill still running), at most
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
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(format!("NodeStage after {calls} calls: {e}").into()),
            }
        }
    }

    /// Stages and publishes `v`, copies the dataset onto it, takes it down again; its
    /// NVMe device.
    pub async fn write_dataset(&mut self, v: &Vol) -> Result<String> {
        vm_common::stage(&mut self.c, v).await?;
        vm_common::publish(&mut self.c, v).await?;
        let dev = mountinfo(&v.staging).ok_or("not staged")?.1;
        sh(&format!(
            "cp -a '{}/.' '{}/' && sync",
            self.data.display(),
            v.target.display()
        ))?;
        vm_common::unpublish(&mut self.c, v).await?;
        vm_common::unstage(&mut self.c, v).await?;
        Ok(dev)
    }

    /// The store's directory of snapshot `name`.
    pub fn store_dir(&self, name: &str) -> PathBuf {
        self.export.join(STORE).join(name)
    }

    pub async fn list(&mut self) -> Result<Vec<Snapshot>> {
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            self.c
                .controller
                .list_snapshots(ListSnapshotsRequest::default()),
        )
        .await
        .map_err(|_| "ListSnapshots did not answer in 60 s")??;
        Ok(r.into_inner()
            .entries
            .into_iter()
            .filter_map(|e| e.snapshot)
            .collect())
    }
}

/// A restore's fill progress (copied, total bytes): the block clone's record
/// (`<state>/clones/<short hash of the volume id>.json`, src/volume/block/clone.rs).
pub fn fill_progress(work: &Path, v: &Vol) -> Option<(u64, u64)> {
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(v.id.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = work.join(format!("state/clones/{hash}.json"));
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some((p["copied_bytes"].as_u64()?, p["total_bytes"].as_u64()?))
}

/// Waits until the NFS server has read `share` of the restore's data bytes since `from`
/// (its reads, not the fill's progress: the streams read ahead of a throttled target's
/// writes); then the fill's progress, which must not be done.
async fn wait_restore_reading(rig: &Rig, v: &Vol, from: u64, share: f64) -> Result<(u64, u64)> {
    let want = from + (share * rig.data_bytes as f64) as u64;
    wait_for("the restore's reads", want, || Ok(nfsd_io()?.0)).await?;
    let (c, t) = fill_progress(&rig.work, v).ok_or("no fill progress recorded")?;
    ensure(c < t, "the restore finished before it could be interrupted")?;
    Ok((c, t))
}

/// (read, written) bytes of the NFS server for its clients (`io` of /proc/net/rpc/nfsd).
pub fn nfsd_io() -> Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/net/rpc/nfsd")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("io "))
        .ok_or("no io line")?;
    let f: Vec<u64> = line
        .split(' ')
        .skip(1)
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    Ok((f[0], f[1]))
}

/// Bytes read from a block device so far (sectors read x 512 of `/sys/block/*/stat`).
/// With NVMe multipath (Debian's kernel) the namespace's head `nvme0nN` keeps no I/O
/// statistics: its paths `nvme0cCnN` do, and are summed.
pub fn device_read_bytes(dev: &str) -> Result<u64> {
    let name = dev.trim_start_matches("/dev/");
    let mut paths: Vec<String> = Vec::new();
    if let Some((ctrl, ns)) = name.strip_prefix("nvme").and_then(|r| r.split_once('n')) {
        for entry in std::fs::read_dir("/sys/block")?.flatten() {
            let e = entry.file_name().to_string_lossy().into_owned();
            let path_of = e
                .strip_prefix(&format!("nvme{ctrl}c"))
                .and_then(|r| r.split_once('n'))
                .is_some_and(|(c, n)| c.parse::<u32>().is_ok() && n == ns);
            if path_of {
                paths.push(e);
            }
        }
    }
    if paths.is_empty() {
        paths.push(name.to_owned());
    }
    let mut bytes = 0;
    for p in &paths {
        let stat = std::fs::read_to_string(format!("/sys/block/{p}/stat"))?;
        let sectors: u64 = stat.split_whitespace().nth(2).ok_or("stat")?.parse()?;
        bytes += sectors * 512;
    }
    Ok(bytes)
}

/// Bytes allocated below `dir` (`du -s -B1`), 0 when it does not exist.
pub fn du(dir: &Path) -> u64 {
    sh(&format!(
        "du -s -B1 '{}' 2>/dev/null | cut -f1",
        dir.display()
    ))
    .ok()
    .and_then(|s| s.parse().ok())
    .unwrap_or(0)
}

/// The bytes the filesystem allocated to file `p`.
pub fn allocated(p: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::symlink_metadata(p)?.blocks() * 512)
}

pub fn drop_caches() -> Result<()> {
    sh("sync; echo 3 > /proc/sys/vm/drop_caches").map(drop)
}

/// Waits until `bytes()` reaches `want`; the value reached.
pub async fn wait_for(what: &str, want: u64, bytes: impl Fn() -> Result<u64>) -> Result<u64> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        let b = bytes()?;
        if b >= want {
            return Ok(b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{what}: {want} bytes not reached in 120 s").into())
}

/// Every entry below `source` matches `target`: kind, mode, owner, files' size and mtime
/// (`find -printf`), every file's SHA-256; ext4's lost+found and the names in `skip` left
/// out; the outside symlink a link. The number of entries compared.
pub fn compare_trees(source: &Path, target: &Path, skip: &[&str]) -> Result<usize> {
    let prune: String = ["lost+found"]
        .iter()
        .chain(skip)
        .map(|n| format!("-path './{n}' -prune -o "))
        .collect();
    let list = |root: &Path| {
        sh(&format!(
            "cd '{}' && find . {prune}-name . -o -type f -printf '%p f %m %U:%G %s %T@\\n' \
             -o -type d -printf '%p d %m %U:%G\\n' -o -printf '%p %y %m %U:%G %l\\n' | LC_ALL=C sort",
            root.display()
        ))
    };
    let sums = |root: &Path| {
        sh(&format!(
            "cd '{}' && find . {prune}-type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum",
            root.display()
        ))
    };
    let (a, b) = (list(source)?, list(target)?);
    ensure(a == b, format!("trees differ:\n{}", diff(&a, &b)))?;
    let (sa, sb) = (sums(source)?, sums(target)?);
    ensure(sa == sb, format!("checksums differ:\n{}", diff(&sa, &sb)))?;
    if source.join("outside").symlink_metadata().is_ok() {
        let link = std::fs::symlink_metadata(target.join("outside"))?;
        ensure(
            link.file_type().is_symlink(),
            "the outside symlink was followed",
        )?;
    }
    Ok(a.lines().count())
}

fn diff(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let only_a: Vec<&&str> = la.iter().filter(|l| !lb.contains(l)).take(5).collect();
    let only_b: Vec<&&str> = lb.iter().filter(|l| !la.contains(l)).take(5).collect();
    format!("source only: {only_a:?}\ncopy only: {only_b:?}")
}

/// The store's copy of snapshot `name`: its manifest present and parsed, its tree equal
/// to the dataset.
fn check_store(rig: &Rig, name: &str, skip: &[&str]) -> Result<usize> {
    let dir = rig.store_dir(name);
    let manifest = std::fs::read(dir.join("manifest.json"))
        .map_err(|e| format!("{}/manifest.json: {e}", dir.display()))?;
    let _: serde_json::Value = serde_json::from_slice(&manifest)
        .map_err(|e| format!("{}/manifest.json: {e}", dir.display()))?;
    compare_trees(&rig.data, &dir.join("tree"), skip)
}

/// Every file's SHA-256 in the manifest of snapshot `name` equals sha256sum of the
/// dataset's file; the number of files.
fn check_manifest_sums(rig: &Rig, name: &str) -> Result<usize> {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rig.store_dir(name).join("manifest.json"))?)?;
    let entries = m["entries"]
        .as_array()
        .ok_or("no entries in the manifest")?;
    let mut files = 0;
    for e in entries.iter().filter(|e| e["kind"] == "file") {
        let path = e["path"].as_str().ok_or("an entry without a path")?;
        let want = e["sha256"]
            .as_str()
            .ok_or(format!("{path}: no sha256 in the manifest"))?;
        let file = rig.data.join(path);
        let got = sh(&format!(
            "sha256sum < '{}' | cut -d' ' -f1",
            file.display().to_string().replace('\'', "'\\''")
        ))?;
        ensure(
            got == want,
            format!("{path}: manifest {want}, dataset {got}"),
        )?;
        files += 1;
    }
    ensure(files > 200, format!("only {files} files in the manifest"))?;
    Ok(files)
}

/// Where the private mount of the store is, with its options, while the driver holds one.
fn store_mount() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines()
        .filter_map(|l| l.split_once(" - "))
        .find(|(_, r)| {
            r.starts_with("nfs4 ") && r.split(' ').nth(1).is_some_and(|s| s.starts_with(SERVER))
        })
        .map(|(_, r)| r.to_owned())
}

/// (a) A written NVMe volume, not staged, snapshotted to the store; the store's tree and
/// a restore into a new NVMe volume compared with the dataset file by file.
async fn restore(rig: &mut Rig) -> Result<String> {
    let a = rig.volume("src-a", 0).await?;
    rig.write_dataset(&a).await?;
    rig.source = Some(a.clone());
    let t = rig
        .snapshot_until_ready("snap-a", &a.id, Duration::from_secs(300))
        .await?;
    let stored = check_store(rig, "snap-a", &[])?;
    let again = rig.create_snapshot("snap-a", &a.id).await?;
    ensure(
        again.snapshot_id == t.snap.snapshot_id && again.ready_to_use,
        "CreateSnapshot again answered another snapshot",
    )?;
    let listed = rig.list().await?;
    ensure(
        listed
            .iter()
            .any(|s| s.snapshot_id == t.snap.snapshot_id && s.ready_to_use),
        "ListSnapshots does not list snap-a as ready",
    )?;
    let r = rig.restore("restore-a", &t.snap.snapshot_id, 0).await?;
    drop_caches()?;
    let (read0, _) = nfsd_io()?;
    let t0 = Instant::now();
    let calls = rig.stage_until_done(&r, Duration::from_secs(300)).await?;
    let secs = t0.elapsed().as_secs_f64();
    // What the server read for it: the files' data once, not the sparse file's holes
    // (read only where its manifest says it holds data).
    let served = nfsd_io()?.0 - read0;
    vm_common::publish(&mut rig.c, &r).await?;
    let n = compare_trees(&rig.data, &r.target, &[])?;
    // The store (NFS v4.1: no SEEK) reads its holes as zeros; the restore keeps them holes.
    let sparse = allocated(&r.target.join("sparse.img"))?;
    vm_common::teardown(&mut rig.c, &r).await?;
    ensure(
        sparse <= 64 << 10,
        format!("the restored 16 MiB sparse file allocates {sparse} bytes (its source 4 KiB)"),
    )?;
    ensure(
        served < rig.data_bytes + (4 << 20),
        format!(
            "the server read {served} bytes for a restore of {} data bytes ({} with the holes)",
            rig.data_bytes, rig.read_bytes
        ),
    )?;
    Ok(format!(
        "snapshot of {:.1} MiB in {:.1} s ({} calls, size_bytes {}); store tree {stored} entries equal, manifest present; \
         restored in {secs:.1} s ({calls} NodeStage call(s)), {n} entries equal (SHA-256, mode, owner, size, mtime), \
         the sparse file {sparse} bytes allocated; the server read {:.1} MiB",
        rig.data_bytes as f64 / MIB as f64,
        t.secs,
        t.calls,
        t.snap.size_bytes,
        served as f64 / MIB as f64
    ))
}

/// (b) A staged volume snapshotted while a steady writer rewrites a 1 MiB file in 64 KiB
/// O_DSYNC writes: the snapshot succeeds, the freeze time the driver logs, the writer's
/// longest stall.
async fn live(rig: &mut Rig) -> Result<String> {
    let w = rig.volume("live", LIVE).await?;
    rig.write_dataset(&w).await?;
    vm_common::stage(&mut rig.c, &w).await?;
    vm_common::publish(&mut rig.c, &w).await?;
    let times = "/run/writer.times";
    let stop = "/run/writer.stop";
    sh(&format!("rm -f {times} {stop}"))?;
    let file = w.target.join("writer.bin");
    // Its full size before the snapshot: the writer rewrites it in place, a log's worth
    // (1 MiB); the rest of the volume does not change.
    sh(&format!(
        "head -c {} /dev/urandom > '{}' && sync",
        1 << 20,
        file.display()
    ))?;
    let mut writer = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "i=0; while [ ! -e {stop} ]; do dd if=/dev/urandom of='{}' bs=64k seek=$((i % 16)) count=1 \
             conv=notrunc oflag=dsync status=none || exit 1; date +%s.%N >> {times}; i=$((i + 1)); done",
            file.display()
        ))
        .spawn()?;
    // The writer runs before the snapshot starts.
    wait_for("the writer's first writes", 20, || {
        Ok(sh(&format!("wc -l < {times} 2>/dev/null || echo 0"))?.parse()?)
    })
    .await?;
    let log_from = figures::log_len()?;
    let taken = rig
        .snapshot_until_ready("snap-live", &w.id, Duration::from_secs(300))
        .await;
    sh(&format!("touch {stop}"))?;
    let status = writer.wait()?;
    let taken = taken?;
    ensure(status.success(), "the writer failed")?;
    let logged = figures::freeze_seconds(log_from)?;
    let (stall, before, across) = figures::writer_gaps(times, log_from)?;
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(
        rig.store_dir("snap-live").join("manifest.json"),
    )?)?;
    let freeze = manifest["freeze_seconds"]
        .as_f64()
        .ok_or("no freeze_seconds in the manifest")?;
    ensure(
        (freeze - logged).abs() < 0.01,
        format!("the manifest says {freeze} s frozen, the log {logged} s"),
    )?;
    figures::record_freeze(freeze, across);
    ensure(
        freeze <= 5.0,
        format!("froze {freeze:.2} s, over the 5 s limit"),
    )?;
    let n = check_store(rig, "snap-live", &["writer.bin"])?;
    let copied = std::fs::metadata(rig.store_dir("snap-live").join("tree/writer.bin"))?.len();
    ensure(
        copied == 1 << 20,
        format!("writer.bin is {copied} bytes in the snapshot"),
    )?;
    let writes = sh(&format!("wc -l < {times}"))?;
    vm_common::teardown(&mut rig.c, &w).await?;
    Ok(format!(
        "snapshot of a staged volume under a steady writer ({writes} writes of 64 KiB, O_DSYNC) ready in {:.1} s; \
         the driver froze it {freeze:.3} s (manifest's freeze_seconds = the log's); the writer's gap across the freeze {across:.3} s, \
         its longest gap during the snapshot {stall:.3} s (before it: {before:.3} s); {n} dataset entries equal in the store",
        taken.secs
    ))
}

/// (c) The driver SIGKILLed with half of a snapshot on the store; restarted, CreateSnapshot
/// again completes, and what the source was read and the store written after the restart
/// is no second full copy.
async fn kill(rig: &mut Rig) -> Result<String> {
    let b = rig.volume("slow-src", SLOW_SOURCE).await?;
    let dev = rig.write_dataset(&b).await?;
    rig.slow = Some(b.clone());
    drop_caches()?;
    let (read0, (_, wrote0)) = (device_read_bytes(&dev)?, nfsd_io()?);
    let first = rig.spawn_snapshot("snap-kill", &b.id);
    let dir = rig.store_dir("snap-kill");
    let total = rig.data_bytes;
    wait_for("half on the store", total / 2, || Ok(du(&dir))).await?;
    let mount = store_mount().ok_or("no store mount while the copy runs")?;
    for want in ["proto=rdma", "port=20049", "vers=4.1"] {
        ensure(
            mount.contains(want),
            format!("the store mount lacks {want}: {mount}"),
        )?;
    }
    rig.helper("kill-driver")?;
    // What the killed driver left dirty in the NFS client's cache reaches the store after
    // its exit; flushed here, it counts as the killed driver's writes, not the restarted
    // one's. Its reads cached are not what a restarted node would have.
    drop_caches()?;
    let (read_k, (_, wrote_k), stored_k) = (device_read_bytes(&dev)?, nfsd_io()?, du(&dir));
    ensure(
        !dir.join("manifest.json").exists(),
        "the copy finished before the kill",
    )?;
    let first = first.await?;
    ensure(
        first.is_err(),
        format!("the first CreateSnapshot answered although the driver was killed: {first:?}"),
    )?;
    rig.helper("start-driver")?;
    rig.reconnect().await?;
    let t = rig
        .snapshot_until_ready("snap-kill", &b.id, Duration::from_secs(300))
        .await?;
    let (read1, (_, wrote1)) = (device_read_bytes(&dev)?, nfsd_io()?);
    let n = check_store(rig, "snap-kill", &[])?;
    let (read_after, wrote_after) = (read1 - read_k, wrote1 - wrote_k);
    let (rr, wr) = (
        read_after as f64 / total as f64,
        wrote_after as f64 / total as f64,
    );
    let (rall, wall) = (
        (read1 - read0) as f64 / total as f64,
        (wrote1 - wrote0) as f64 / total as f64,
    );
    figures::record_kill(wr, rr, wall);
    // No second full copy after the restart. In all it may pass 1.5 x on a dataset this
    // small: what was in flight at the kill (8 streams of 4 MiB pieces) is copied again.
    ensure(
        wr < 1.0 && rr < 1.0,
        format!("a second full copy after the restart: the store written {wr:.2} x, the source read {rr:.2} x"),
    )?;
    Ok(format!(
        "killed with {:.1} of {:.1} MiB on the store ({mount_opts}); after the restart ({} CreateSnapshot calls, {:.1} s) \
         the store was written {wr:.2} x and the source read {rr:.2} x the snapshot (nfsd io; {} read on its NVMe path devices, /sys/block/nvme0cCnN/stat), \
         in all {wall:.2} x and {rall:.2} x; {n} entries equal",
        stored_k as f64 / MIB as f64,
        total as f64 / MIB as f64,
        t.calls,
        t.secs,
        dev.trim_start_matches("/dev/"),
        mount_opts = "proto=rdma,port=20049,vers=4.1",
    ))
}

/// (d) The driver SIGKILLed mid-restore (30 % read from the store); restarted, NodeStage
/// again resumes: the store's bytes read after the kill over the snapshot's.
async fn restore_kill(rig: &mut Rig) -> Result<String> {
    let snap = rig
        .snaps
        .get("snap-a")
        .ok_or("run the restore scenario first")?
        .clone();
    let r = rig.restore("restore-kill", &snap, SLOW_TARGET).await?;
    // A full read of the snapshot's tree from the store.
    let total = rig.read_bytes;
    drop_caches()?;
    let (read0, _) = nfsd_io()?;
    let (mut c, r2) = (rig.c.clone(), r.clone());
    let first = tokio::spawn(async move { vm_common::stage(&mut c, &r2).await });
    let (copied, filled) = wait_restore_reading(rig, &r, read0, 0.3).await?;
    rig.helper("kill-driver")?;
    let _ = first.await;
    let (read_k, _) = nfsd_io()?;
    // What the killed driver's NFS client cached is not what a restarted node would have.
    drop_caches()?;
    rig.helper("start-driver")?;
    rig.reconnect().await?;
    let calls = rig.stage_until_done(&r, Duration::from_secs(300)).await?;
    let (read1, _) = nfsd_io()?;
    vm_common::publish(&mut rig.c, &r).await?;
    let n = compare_trees(&rig.data, &r.target, &[])?;
    let after = (read1 - read_k) as f64 / total as f64;
    let all = (read1 - read0) as f64 / total as f64;
    figures::record_restore_kill(after, all);
    ensure(
        after <= 1.5,
        format!("read {after:.2} x the snapshot from the store after the kill"),
    )?;
    // Not deleted: erasing a write-throttled namespace takes seconds the suite can spare.
    vm_common::unpublish(&mut rig.c, &r).await?;
    vm_common::unstage(&mut rig.c, &r).await?;
    Ok(format!(
        "killed with {:.1} of {:.1} MiB copied ({:.1} MiB read from the store); resumed in {calls} NodeStage call(s); \
         after the kill the store served {after:.2} x a full read of the snapshot ({:.1} MiB: every file's size, holes read as zeros over v4.1), \
         in all {all:.2} x (nfsd io, server side); {n} entries equal",
        copied as f64 / MIB as f64,
        filled as f64 / MIB as f64,
        (read_k - read0) as f64 / MIB as f64,
        total as f64 / MIB as f64
    ))
}

/// (f) DeleteSnapshot while a restore reads it: FailedPrecondition naming the restore;
/// after the restore, the delete removes it from the store and from ListSnapshots.
async fn delete(rig: &mut Rig) -> Result<String> {
    let snap = rig
        .snaps
        .get("snap-a")
        .ok_or("run the restore scenario first")?
        .clone();
    let r = rig.restore("restore-del", &snap, SLOW_TARGET).await?;
    drop_caches()?;
    let (read0, _) = nfsd_io()?;
    let (mut c, r2) = (rig.c.clone(), r.clone());
    let first = tokio::spawn(async move { vm_common::stage(&mut c, &r2).await });
    wait_for(
        "20 % read from the store",
        read0 + rig.read_bytes / 5,
        || Ok(nfsd_io()?.0),
    )
    .await?;
    let refused = rig
        .c
        .controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.clone(),
            ..Default::default()
        })
        .await;
    let _ = first.await;
    let e = refused
        .err()
        .ok_or("DeleteSnapshot succeeded during a restore")?;
    ensure(
        e.code() == tonic::Code::FailedPrecondition,
        format!(
            "DeleteSnapshot during a restore: {:?} {}",
            e.code(),
            e.message()
        ),
    )?;
    ensure(
        e.message().contains("restore-del") || e.message().contains(&r.id),
        format!("the refusal does not name the restore: {}", e.message()),
    )?;
    ensure(
        rig.store_dir("snap-a").join("manifest.json").exists(),
        "the refused delete removed the manifest",
    )?;
    rig.stage_until_done(&r, Duration::from_secs(300)).await?;
    vm_common::publish(&mut rig.c, &r).await?;
    let n = compare_trees(&rig.data, &r.target, &[])?;
    vm_common::unpublish(&mut rig.c, &r).await?;
    vm_common::unstage(&mut rig.c, &r).await?;
    for _ in 0..2 {
        rig.c
            .controller
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snap.clone(),
                ..Default::default()
            })
            .await?;
    }
    ensure(
        !rig.store_dir("snap-a").exists(),
        "DeleteSnapshot left the store's directory",
    )?;
    ensure(
        !rig.list().await?.iter().any(|s| s.snapshot_id == snap),
        "ListSnapshots still lists the deleted snapshot",
    )?;
    Ok(format!(
        "refused during the restore: {:?} '{}'; the restore finished, {n} entries equal; then deleted (twice), gone from the store and ListSnapshots",
        e.code(),
        e.message()
    ))
}

/// (e) The NFS server stopped with 30 % of a snapshot on the store: CreateSnapshot answers
/// Unavailable naming the store, ListSnapshots lists nothing of it as ready; after the
/// server is back the retry completes.
async fn stop(rig: &mut Rig) -> Result<String> {
    let b = match rig.slow.clone() {
        Some(b) => b,
        None => {
            let b = rig.volume("slow-src", SLOW_SOURCE).await?;
            rig.write_dataset(&b).await?;
            b
        }
    };
    drop_caches()?;
    let first = rig.spawn_snapshot("snap-stop", &b.id);
    let dir = rig.store_dir("snap-stop");
    wait_for("30 % on the store", rig.data_bytes * 3 / 10, || {
        Ok(du(&dir))
    })
    .await?;
    rig.helper("nfs-stop")?;
    let t0 = Instant::now();
    let first = first.await?;
    let id = match &first {
        Ok(s) if s.ready_to_use => return Err("the snapshot was ready before the stop".into()),
        Ok(s) => s.snapshot_id.clone(),
        Err(e) => {
            println!("  first CreateSnapshot: {:?} {}", e.code(), e.message());
            String::new()
        }
    };
    let e = loop {
        let call = tokio::time::timeout(
            Duration::from_secs(120),
            rig.create_snapshot("snap-stop", &b.id),
        );
        let answer = call
            .await
            .map_err(|_| "CreateSnapshot did not answer in 120 s with the server stopped")?;
        match answer {
            Ok(s) if s.ready_to_use => {
                return Err("the snapshot became ready with the server stopped".into())
            }
            Ok(_) => {}
            Err(e) if e.code() == tonic::Code::Unavailable && !names_store(e.message()) => {
                println!("  CreateSnapshot: {:?} {}", e.code(), e.message());
            }
            Err(e) => break e,
        }
        ensure(
            t0.elapsed() < Duration::from_secs(240),
            "no error naming the store within 240 s of the server's stop",
        )?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let failed_after = t0.elapsed().as_secs_f64();
    ensure(
        e.code() == tonic::Code::Unavailable && names_store(e.message()),
        format!("server stopped: {:?} {}", e.code(), e.message()),
    )?;
    // Listed by this node's records: the interrupted one, not ready; snap-kill (same
    // source) ready.
    let listed = rig.list().await?;
    let kill_id = rig.snaps.get("snap-kill").cloned().unwrap_or_default();
    let ready: Vec<&str> = listed
        .iter()
        .filter(|s| s.source_volume_id == b.id && s.ready_to_use && s.snapshot_id != kill_id)
        .map(|s| s.snapshot_id.as_str())
        .collect();
    ensure(
        ready.is_empty(),
        format!("ListSnapshots lists the interrupted snapshot ({id}) as ready: {ready:?}"),
    )?;
    let pending = listed
        .iter()
        .filter(|s| s.source_volume_id == b.id && !s.ready_to_use)
        .count();
    ensure(
        !dir.join("manifest.json").exists(),
        "a manifest on the store",
    )?;
    rig.helper("nfs-start")?;
    let t = rig
        .snapshot_until_ready("snap-stop", &b.id, Duration::from_secs(300))
        .await?;
    let n = check_store(rig, "snap-stop", &[])?;
    let sums = check_manifest_sums(rig, "snap-stop")?;
    Ok(format!(
        "'{:?} {}' {failed_after:.0} s after the stop; ListSnapshots: {pending} of it not ready, none ready; after nfsd restarted ready in {:.1} s ({} calls), {n} entries equal; \
         the manifest's SHA-256 (checksums: true) of all {sums} files equal to the dataset's",
        e.code(),
        e.message(),
        t.secs,
        t.calls
    ))
}

fn names_store(msg: &str) -> bool {
    msg.contains(SERVER) || msg.contains("store")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = |i: usize| PathBuf::from(&args[i]);
    let only = std::env::var("SNAPSHOT_SCENARIOS")
        .unwrap_or_else(|_| "restore live kill restore-kill figures delete stop small".into());
    let want = |s: &str| only.split_whitespace().any(|w| w == s);
    let mut rig = Rig {
        c: Clients::connect_ready(&path(1), vm_common::READY_DEADLINE).await?,
        socket: path(1),
        work: path(2),
        export: path(3),
        data: path(4),
        helper: std::env::var("GUEST_HELPER")?,
        data_bytes: 0,
        read_bytes: 0,
        snaps: HashMap::new(),
        source: None,
        slow: None,
    };
    rig.data_bytes = du(&rig.data);
    rig.read_bytes = sh(&format!(
        "find '{}' -type f -printf '%i %s\\n' | sort -u | awk '{{s += $2}} END {{print s}}'",
        rig.data.display()
    ))?
    .parse()?;
    println!(
        "dataset {:.1} MiB allocated, {:.1} MiB in its files' sizes",
        rig.data_bytes as f64 / MIB as f64,
        rig.read_bytes as f64 / MIB as f64
    );
    let mut failed = 0;
    let scenarios: [(&str, &str); 8] = [
        ("restore", "snapshot-restore-compare"),
        ("live", "snapshot-of-staged-volume-under-writer"),
        ("kill", "sigkill-mid-snapshot-resumes"),
        ("restore-kill", "sigkill-mid-restore-resumes"),
        ("figures", "figures"),
        ("delete", "delete-snapshot-during-restore"),
        ("stop", "nfs-server-stopped-mid-snapshot"),
        ("small", "small-files-figures"),
    ];
    for (key, name) in scenarios {
        if !want(key) {
            continue;
        }
        let r = match key {
            "restore" => restore(&mut rig).await,
            "live" => live(&mut rig).await,
            "kill" => kill(&mut rig).await,
            "restore-kill" => restore_kill(&mut rig).await,
            "figures" => figures::run(&mut rig).await,
            "delete" => delete(&mut rig).await,
            "small" => small_files::run(&mut rig).await,
            _ => stop(&mut rig).await,
        };
        report(name, r, &mut failed);
    }
    println!("snapshot scenarios: {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 })
}
