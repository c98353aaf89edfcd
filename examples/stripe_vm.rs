//! The stripe layout's scenarios on the VM rig, run inside the guest against
//! a driver serving SOCKET, with mdadm and Debian's md driver present. Prints
//! `PASS name: detail` / `FAIL name: error` per scenario and the fio table; exits 1 on
//! any failure.
//! Usage: stripe_vm SOCKET WORK_DIR DETACH_CMD FOREIGN_UUID
//! DETACH_CMD is a shell command that detaches one pool drive (run last).
//! Env: GUEST_HELPER (tests/vm/stripe_guest.sh: restart-driver, kill-driver-tree),
//! FIO_RUNS (runs per figure, default 3), FIO_SECONDS (each run's length, default 2).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::access_mode::Mode;
use gds_csi::csi::Clients;

#[allow(dead_code)] // each example uses part of it
mod vm_common;
use vm_common::{ensure, mount_cap, mountinfo, report, sh, CsiResult, Result, Vol, MIB};

#[path = "stripe_vm_parts/fio.rs"]
mod fio;

pub struct Rig {
    pub c: Clients,
    socket: PathBuf,
    pub work: PathBuf,
    helper: String,
}

impl Rig {
    /// CreateVolume of a stripe of `count` members (512 KiB chunk), or of a partition
    /// volume on one drive for a count of 1.
    pub async fn create(
        &mut self,
        name: &str,
        count: &str,
        fs: &str,
        bytes: i64,
    ) -> CsiResult<Vol> {
        self.create_chunked(name, count, "512K", fs, bytes).await
    }

    /// [`Rig::create`] with the stripe's chunk.
    pub async fn create_chunked(
        &mut self,
        name: &str,
        count: &str,
        chunk: &str,
        fs: &str,
        bytes: i64,
    ) -> CsiResult<Vol> {
        let mut params = vec![("gdsPolicy", "disabled")];
        if count == "1" {
            params.push(("layout", "partition"));
        } else {
            params.extend([
                ("layout", "stripe"),
                ("stripeCount", count),
                ("stripeChunk", chunk),
            ]);
        }
        let cap = mount_cap(Mode::SingleNodeWriter, fs);
        vm_common::create(&mut self.c, &self.work, name, &params, (bytes, 0), cap).await
    }

    /// SIGKILLs the driver (and, with `tree`, every process it started, as a container's
    /// death would), starts it again and reconnects.
    async fn restart(&mut self, tree: bool) -> Result<()> {
        vm_common::helper(
            &self.helper,
            if tree {
                "kill-driver-tree"
            } else {
                "kill-driver"
            },
        )?;
        vm_common::helper(&self.helper, "start-driver")?;
        self.c = Clients::connect_ready(&self.socket, vm_common::READY_DEADLINE).await?;
        Ok(())
    }
}

fn md_count() -> usize {
    sh("ls -d /sys/block/md* 2>/dev/null | wc -l")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The md device a staging path is mounted from (`/dev/mdN`).
pub fn md_of(staging: &Path) -> Result<String> {
    let (_, src, _) = mountinfo(staging).ok_or("staging path not mounted")?;
    ensure(
        src.starts_with("/dev/md"),
        format!("staged from {src}, not an md array"),
    )?;
    Ok(src)
}

/// One array member: its partition, the drive holding it, and where it lies (bytes).
struct Member {
    part: String,
    disk: String,
    start: u64,
    size: u64,
}

/// The members of a running array, from sysfs.
fn members(md: &str) -> Result<Vec<Member>> {
    let name = sh(&format!("basename $(realpath {md})"))?;
    let mut out = Vec::new();
    for part in sh(&format!("ls /sys/block/{name}/slaves"))?.split_whitespace() {
        let sys = format!("/sys/class/block/{part}");
        let disk = sh(&format!("basename $(dirname $(realpath {sys}))"))?;
        let sectors =
            |f: &str| -> Result<u64> { Ok(sh(&format!("cat {sys}/{f}"))?.parse::<u64>()? * 512) };
        out.push(Member {
            part: part.to_owned(),
            disk: format!("/dev/{disk}"),
            start: sectors("start")?,
            size: sectors("size")?,
        });
    }
    ensure(!out.is_empty(), format!("{md} has no members in sysfs"))?;
    Ok(out)
}

/// sha256 of every file under DIR, after dropping the page cache so they are read
/// from the drives.
fn checksums(dir: &Path) -> Result<String> {
    sh(&format!(
        "sync; echo 3 > /proc/sys/vm/drop_caches; cd {} && sha256sum $(ls | grep '^f[0-9]') ",
        dir.display()
    ))
}

/// Three files of random data under DIR; their checksums.
fn write_files(dir: &Path) -> Result<String> {
    for i in 0..3 {
        sh(&format!(
            "dd if=/dev/urandom of={}/f{i} bs=1M count=1 status=none",
            dir.display()
        ))?;
    }
    checksums(dir)
}

/// Create, stage, write, unstage (array stopped), restage, data intact; stop by hand
/// (as after a reboot), restage, data intact. Returns the volume, its members and the
/// filesystem's stripe geometry.
async fn s_lifecycle(r: &mut Rig, count: &str, fs: &str) -> Result<(Vol, Vec<Member>, String)> {
    let v = r
        .create(&format!("stripe-{count}-{fs}"), count, fs, 48 * MIB)
        .await?;
    let before = md_count();
    vm_common::stage(&mut r.c, &v).await?;
    let src = md_of(&v.staging)?;
    let size = sh(&format!("blockdev --getsize64 {src}"))?;
    ensure(
        size == v.capacity.to_string(),
        format!("array {size} bytes, volume {}", v.capacity),
    )?;
    let m = members(&src)?;
    ensure(
        m.len().to_string() == count,
        format!("{} members, want {count}", m.len()),
    )?;
    let geometry = match fs {
        "ext4" => sh(&format!(
            "dumpe2fs -h {src} 2>/dev/null | grep -E 'RAID (stride|stripe width)'"
        ))?,
        _ => sh(&format!(
            "xfs_info {} | grep -o 'sunit=[0-9]* *swidth=[0-9]* blks'",
            v.staging.display()
        ))?,
    };
    let sums = write_files(&v.staging)?;
    vm_common::unstage(&mut r.c, &v).await?;
    ensure(
        md_count() == before,
        "the array still runs after NodeUnstage",
    )?;
    vm_common::stage(&mut r.c, &v).await?;
    ensure(checksums(&v.staging)? == sums, "data changed after restage")?;
    // By hand, as a reboot would: unmount and stop the array.
    let node = md_of(&v.staging)?;
    sh(&format!(
        "umount {} && mdadm --stop {node}",
        v.staging.display()
    ))?;
    ensure(
        md_count() == before,
        "the array still runs after mdadm --stop",
    )?;
    vm_common::stage(&mut r.c, &v).await?;
    ensure(
        checksums(&v.staging)? == sums,
        "data changed after reassembly",
    )?;
    vm_common::unstage(&mut r.c, &v).await?;
    Ok((v, m, geometry.replace('\n', "; ")))
}

/// SIGKILL while a stripe volume is staged and published, restart: the mounts outlived
/// the driver; stage/publish again are no-ops; unstage stops the array and a restage
/// reassembles it, the files byte for byte the same each time.
async fn s_kill_staged(r: &mut Rig) -> Result<(Vol, Vec<Member>, String)> {
    let v = r.create("stripe-kill", "2", "ext4", 32 * MIB).await?;
    vm_common::stage(&mut r.c, &v).await?;
    vm_common::publish(&mut r.c, &v).await?;
    let m = members(&md_of(&v.staging)?)?;
    let sums = write_files(&v.target)?;
    r.restart(false).await?;
    ensure(
        mountinfo(&v.target).is_some(),
        "the published mount is gone after the restart",
    )?;
    ensure(
        checksums(&v.target)? == sums,
        "files differ after the restart",
    )?;
    for _ in 0..2 {
        vm_common::stage(&mut r.c, &v).await?;
        vm_common::publish(&mut r.c, &v).await?;
    }
    vm_common::unpublish(&mut r.c, &v).await?;
    vm_common::unstage(&mut r.c, &v).await?;
    ensure(
        mountinfo(&v.staging).is_none(),
        "still mounted after unstage",
    )?;
    vm_common::stage(&mut r.c, &v).await?;
    vm_common::publish(&mut r.c, &v).await?;
    ensure(
        checksums(&v.target)? == sums,
        "files differ after unstage and restage",
    )?;
    vm_common::unpublish(&mut r.c, &v).await?;
    vm_common::unstage(&mut r.c, &v).await?;
    Ok((v, m, "3 files of 1 MiB: sha256 equal after SIGKILL + restart, stage/publish 2x, unstage (array stopped) and restage".into()))
}

/// SIGKILL of the driver and its children (mdadm, mkfs) in the middle of the first
/// NodeStage of a fresh stripe; the restarted driver's NodeStage must finish the job.
async fn s_kill_mid_stage(r: &mut Rig, after: Duration) -> Result<(Vol, Vec<Member>, String)> {
    let v = r.create("stripe-kill-stage", "2", "ext4", 32 * MIB).await?;
    let mut c = r.c.clone();
    let first_call = v.clone();
    let call = tokio::spawn(async move { vm_common::stage(&mut c, &first_call).await });
    tokio::time::sleep(after).await;
    let finished = call.is_finished();
    r.restart(true).await?;
    let first = call.await?;
    let m = stage_after_kill(r, &v).await?;
    let when = if finished {
        "after it had finished".to_owned()
    } else {
        format!(
            "{} ms in ({:?})",
            after.as_millis(),
            first.err().map(|e| e.code())
        )
    };
    Ok((
        v,
        m,
        format!("killed {when}; restaged ext4 on the array, files intact across a restage"),
    ))
}

/// The restarted driver's NodeStage of a volume whose first one was killed: ext4 on the
/// array, files the same across an unstage and restage; the array's members.
async fn stage_after_kill(r: &mut Rig, v: &Vol) -> Result<Vec<Member>> {
    vm_common::stage(&mut r.c, v).await?;
    let m = members(&md_of(&v.staging)?)?;
    let fs = sh(&format!("findmnt -n -o FSTYPE {}", v.staging.display()))?;
    ensure(fs == "ext4", format!("staged as {fs}"))?;
    let sums = write_files(&v.staging)?;
    vm_common::unstage(&mut r.c, v).await?;
    vm_common::stage(&mut r.c, v).await?;
    ensure(checksums(&v.staging)? == sums, "files differ after restage")?;
    vm_common::unstage(&mut r.c, v).await?;
    Ok(m)
}

/// The same kill landing inside `mdadm --create`, made certain: the rig's mdadm
/// (stripe_guest.sh cut-create-on) leaves the first member with our superblock and the
/// last blank, and waits there to be killed. The restarted driver clears what the cut
/// create left and creates the array; the delete scenario erases both members.
async fn s_cut_create(r: &mut Rig) -> Result<(Vol, Vec<Member>, String)> {
    let v = r.create("stripe-cut-create", "2", "ext4", 32 * MIB).await?;
    vm_common::helper(&r.helper, "cut-create-on")?;
    let mut c = r.c.clone();
    let first_call = v.clone();
    let call = tokio::spawn(async move { vm_common::stage(&mut c, &first_call).await });
    let cut = Path::new("/run/gds-rig/create-cut");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cut.exists() && Instant::now() < deadline && !call.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let was_cut = cut.exists();
    r.restart(true).await?;
    vm_common::helper(&r.helper, "cut-create-off")?;
    ensure(was_cut, "the rig's mdadm never cut a create short")?;
    let first = call.await?;
    ensure(
        first.is_err(),
        "the first NodeStage succeeded through a cut create",
    )?;
    let refused = refused_when_tampered(r, &v, &std::fs::read_to_string(cut)?).await?;
    let m = stage_after_kill(r, &v).await?;
    Ok((
        v,
        m,
        format!(
            "killed inside mdadm --create (member 0 with our superblock, member 1 blank); \
             with an ext4 made on member 1 NodeStage refused ({refused}) and member 0's \
             superblock was kept; that ext4 wiped, restaged ext4 on a new array, files intact \
             across a restage"
        ),
    ))
}

/// A cut create whose blank member got something else meanwhile is not ours to clear:
/// NodeStage refuses and leaves our superblock on the other member; with the intruder
/// wiped by hand, the volume is back to a cut create.
async fn refused_when_tampered(r: &mut Rig, v: &Vol, members: &str) -> Result<String> {
    let members: Vec<&str> = members.lines().collect();
    let [first, last] = members[..] else {
        return Err(format!("the rig's mdadm listed members {members:?}").into());
    };
    sh(&format!("mkfs.ext4 -q -F {last}"))?;
    let err = match vm_common::stage(&mut r.c, v).await {
        Ok(()) => return Err("NodeStage over a member holding ext4 succeeded".into()),
        Err(e) => e,
    };
    ensure(
        err.code() == tonic::Code::FailedPrecondition
            && err.message().contains(&format!("({last},"))
            && err.message().contains("ext4"),
        format!("over a member holding ext4: {err:?}"),
    )?;
    let kept = sh(&format!(
        "mdadm --examine --export {first} | grep MD_NAME=gds-csi"
    ))?;
    ensure(
        !kept.is_empty(),
        "our superblock on the first member was cleared",
    )?;
    sh(&format!("wipefs -q -a {last}"))?;
    Ok(format!("{:?}", err.code()))
}

/// `mdadm --examine` of the bytes a member occupied, through a read-only loop device
/// over its drive (the partition itself is gone). The drive's page cache is dropped
/// first: the driver writes through the partition's node, whose cache is not the
/// drive's, so an earlier read through the drive could otherwise be answered again.
fn examine_where(m: &Member) -> Result<String> {
    sh(&format!("blockdev --flushbufs {}", m.disk))?;
    let lo = sh(&format!(
        "losetup -f --show -r -o {} --sizelimit {} {}",
        m.start, m.size, m.disk
    ))?;
    let out = sh(&format!("mdadm --examine {lo} 2>&1; true"));
    sh(&format!("losetup -d {lo}"))?;
    out
}

async fn s_delete(r: &mut Rig, vols: &[(Vol, Vec<Member>)]) -> Result<String> {
    let parts = || sh("grep -c 'nvme.*p[0-9]' /proc/partitions || true");
    let parts_before = parts()?;
    let mut n = 0;
    for (v, ms) in vols {
        for m in ms {
            // Present before: the check below can see a superblock where there is one.
            let uuid = sh(&format!(
                "mdadm --examine --export /dev/{} | grep MD_UUID=",
                m.part
            ))?;
            ensure(
                examine_where(m)?.contains("Magic"),
                format!("{}: no superblock seen through the loop device", m.part),
            )?;
            ensure(
                !uuid.is_empty(),
                format!("{}: no md superblock before delete", m.part),
            )?;
        }
        vm_common::delete(&mut r.c, v).await?;
        vm_common::delete(&mut r.c, v).await?; // idempotent
        for m in ms {
            let e = examine_where(m)?;
            ensure(
                e.contains("No md superblock detected"),
                format!("{} ({} at {}): {e}", m.part, m.disk, m.start),
            )?;
            n += 1;
        }
    }
    let left = parts()?;
    ensure(left == "0", format!("partitions left: {left}"))?;
    let sb = sh("for d in /dev/nvme*n*; do mdadm --examine --export $d 2>/dev/null | grep MD_NAME=gds-csi; done || true")?;
    ensure(sb.is_empty(), format!("md superblocks of ours left: {sb}"))?;
    Ok(format!("partitions {parts_before} -> 0; the {n} members' former extents: `mdadm --examine` finds no md superblock (it found ours before)"))
}

async fn s_foreign(r: &mut Rig, foreign_uuid: &str) -> Result<String> {
    let v = r
        .create("stripe-near-foreign", "2", "ext4", 16 * MIB)
        .await?;
    vm_common::stage(&mut r.c, &v).await?;
    vm_common::unstage(&mut r.c, &v).await?;
    vm_common::delete(&mut r.c, &v).await?;
    let still = sh(&format!(
        "cat /sys/block/md*/md/uuid | grep -c {foreign_uuid} || true"
    ))?;
    ensure(still == "1", "the foreign array is no longer running")?;
    Ok(format!(
        "foreign array {foreign_uuid} still running, untouched"
    ))
}

async fn s_detached(r: &mut Rig, detach: &str) -> Result<String> {
    let v = r.create("stripe-detach", "4", "ext4", 32 * MIB).await?;
    vm_common::stage(&mut r.c, &v).await?;
    vm_common::unstage(&mut r.c, &v).await?;
    sh(detach)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = md_count();
    let err = match vm_common::stage(&mut r.c, &v).await {
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

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: stripe_vm SOCKET WORK_DIR DETACH FOREIGN_UUID";
    let socket = PathBuf::from(args.next().ok_or(usage)?);
    let work = PathBuf::from(args.next().ok_or(usage)?);
    let detach = args.next().ok_or(usage)?;
    let foreign = args.next().ok_or(usage)?;
    let helper = std::env::var("GUEST_HELPER").map_err(|_| "GUEST_HELPER is not set")?;
    let c = Clients::connect_ready(&socket, vm_common::READY_DEADLINE).await?;
    let mut r = Rig {
        c,
        socket,
        work,
        helper,
    };
    let started = Instant::now();
    let mut failed = 0;
    report(
        "fio: O_DIRECT sequential read on 1, 2 and 4 drives",
        fio::bench(&mut r).await,
        &mut failed,
    );
    if let Some(chunks) = std::env::var("FIO_CHUNKS")
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        let chunks: Vec<String> = chunks.split_whitespace().map(str::to_owned).collect();
        report(
            "fio: 4-drive stripes by chunk",
            fio::chunks(&mut r, &chunks).await,
            &mut failed,
        );
    }
    let mut vols = Vec::new();
    for (count, fs) in [("2", "ext4"), ("4", "xfs")] {
        let res = s_lifecycle(&mut r, count, fs).await.map(|(v, m, geo)| {
            vols.push((v, m));
            format!("staged, unstaged (array stopped), restaged, stopped by hand (mdadm --stop), reassembled: sha256 equal; {geo}")
        });
        report(&format!("stripe-{count}-{fs}"), res, &mut failed);
    }
    let res = s_kill_staged(&mut r).await.map(|(v, m, d)| {
        vols.push((v, m));
        d
    });
    report("SIGKILL while staged, restart, restage", res, &mut failed);
    let res = s_kill_mid_stage(&mut r, Duration::from_millis(1500))
        .await
        .map(|(v, m, d)| {
            vols.push((v, m));
            d
        });
    report(
        "SIGKILL (driver and children) during the first NodeStage",
        res,
        &mut failed,
    );
    let res = s_cut_create(&mut r).await.map(|(v, m, d)| {
        vols.push((v, m));
        d
    });
    report(
        "SIGKILL inside mdadm --create during the first NodeStage",
        res,
        &mut failed,
    );
    report("delete", s_delete(&mut r, &vols).await, &mut failed);
    report(
        "foreign-array",
        s_foreign(&mut r, &foreign).await,
        &mut failed,
    );
    report(
        "member-detached",
        s_detached(&mut r, &detach).await,
        &mut failed,
    );
    println!(
        "stripe scenarios: {failed} failed, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
