//! The partition layout's scenario on the VM rig: volumes carved from real NVMe
//! namespaces are staged and written, their partitions dropped from the kernel with
//! `partx -d`, the driver SIGKILLed and started again (it re-syncs partitions from its
//! labels at start-up), and the volumes staged again: every file reads back with the
//! checksum it was written with, and mkfs never ran twice (the filesystem UUID holds).

use std::path::{Path, PathBuf};

use sha2::Digest;

use super::{cap, ensure, mountinfo, sh, Mode, Rig, Vol, READY_DEADLINE};
use super::{Clients, ListVolumesRequest, Result, MIB};

/// What one volume held before the partitions were dropped.
struct Written {
    vol: Vol,
    /// The partition node the volume was staged from (`/dev/nvme0n2p1`).
    node: PathBuf,
    /// Its whole disk (`/dev/nvme0n2`).
    parent: PathBuf,
    fs_uuid: String,
    sha256: String,
    len: usize,
}

const FILE: &str = "payload.bin";

/// `len` bytes that differ per volume (xorshift from `seed`): a mixed-up or stale
/// block reads back with another checksum.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The whole disk of partition node `node`, from sysfs (`/sys/class/block/<p>/..`).
fn parent_of(node: &Path) -> Result<PathBuf> {
    let name = node.file_name().ok_or("no node name")?.to_string_lossy();
    let sys = std::fs::canonicalize(format!("/sys/class/block/{name}/.."))?;
    let disk = sys.file_name().ok_or("no parent in sysfs")?;
    Ok(Path::new("/dev").join(disk))
}

/// The partition numbers the kernel shows for whole disk `disk` (sysfs).
fn shown(disk: &Path) -> Result<Vec<u32>> {
    let name = disk.file_name().ok_or("no disk name")?.to_string_lossy();
    let mut found = Vec::new();
    for e in std::fs::read_dir(format!("/sys/block/{name}"))? {
        let p = e?.path();
        if let Ok(n) = std::fs::read_to_string(p.join("partition")) {
            found.push(n.trim().parse()?);
        }
    }
    found.sort();
    Ok(found)
}

fn number_of(node: &Path) -> Result<u32> {
    let name = node.file_name().ok_or("no node name")?.to_string_lossy();
    let n = std::fs::read_to_string(format!("/sys/class/block/{name}/partition"))?;
    Ok(n.trim().parse()?)
}

/// Creates, stages, publishes and writes one carved volume.
async fn write_one(r: &mut Rig, name: &str, mib: i64, seed: u64) -> Result<Written> {
    let params = [("layout", "partition")];
    let vol = r
        .create(
            name,
            &params,
            mib * MIB,
            mib * MIB,
            cap(Mode::SingleNodeWriter),
        )
        .await?;
    r.stage(&vol).await?;
    r.publish(&vol).await?;
    let (_, src, _) = mountinfo(&vol.staging).ok_or("staging path not mounted")?;
    let node = PathBuf::from(src);
    let parent = parent_of(&node)?;
    let bytes = payload(seed, (mib as usize / 4) << 20);
    let file = vol.target.join(FILE);
    std::fs::write(&file, &bytes)?;
    sh(&format!("sync -f {}", file.display()))?;
    let fs_uuid = sh(&format!("blkid -p -o value -s UUID {}", node.display()))?;
    Ok(Written {
        vol,
        node,
        parent,
        fs_uuid,
        sha256: sha256(&bytes),
        len: bytes.len(),
    })
}

/// Drops every partition of `disks` from the kernel (`partx -d`), checked in sysfs.
fn drop_partitions(disks: &[PathBuf]) -> Result<()> {
    for d in disks {
        sh(&format!("partx -d {}", d.display()))?;
        let left = shown(d)?;
        ensure(
            left.is_empty(),
            format!("{} still shows {left:?}", d.display()),
        )?;
    }
    Ok(())
}

/// The scenario; returns its detail line.
pub async fn s_partx_restart(r: &mut Rig) -> Result<String> {
    let mut vols = Vec::new();
    for (i, (name, mib)) in [("vm-part-a", 24), ("vm-part-b", 16), ("vm-part-c", 40)]
        .into_iter()
        .enumerate()
    {
        vols.push(write_one(r, name, mib, i as u64 + 1).await?);
    }
    for w in &vols {
        r.unpublish(&w.vol).await?;
        r.unstage(&w.vol).await?;
    }
    let mut disks: Vec<PathBuf> = vols.iter().map(|w| w.parent.clone()).collect();
    disks.sort();
    disks.dedup();
    drop_partitions(&disks)?;
    r.helper("restart-driver")?;
    r.c = Clients::connect_ready(&r.socket, READY_DEADLINE).await?;
    // Before any call: the start-up re-sync alone brought them back.
    for w in &vols {
        let n = number_of_dropped(w)?;
        ensure(
            shown(&w.parent)?.contains(&n),
            format!("partition {n} of {} not re-synced", w.parent.display()),
        )?;
    }
    for w in &vols {
        check_back(r, w).await?;
    }
    for w in &vols {
        r.teardown(&w.vol).await?;
    }
    let listed =
        r.c.controller
            .list_volumes(ListVolumesRequest::default())
            .await?
            .into_inner()
            .entries;
    let ours: Vec<&Vol> = vols
        .iter()
        .map(|w| &w.vol)
        .filter(|v| {
            listed
                .iter()
                .any(|e| e.volume.as_ref().is_some_and(|x| x.volume_id == v.id))
        })
        .collect();
    ensure(ours.is_empty(), format!("{} still listed", ours.len()))?;
    let bytes: usize = vols.iter().map(|w| w.len).sum();
    Ok(format!(
        "{} carved volumes on {} namespace(s), {bytes} bytes written; partx -d left the \
         kernel none of their partitions; after SIGKILL + restart the start-up re-sync \
         showed all {} again; restaged, every file's SHA-256 matched, fs UUIDs unchanged; \
         torn down (each call twice)",
        vols.len(),
        disks.len(),
        vols.len()
    ))
}

/// The partition number of `w`'s node, from its name (its sysfs entry is gone after
/// `partx -d`): the digits after the parent's name and an optional `p`.
fn number_of_dropped(w: &Written) -> Result<u32> {
    let node = w.node.display().to_string();
    let parent = w.parent.display().to_string();
    let tail = node
        .strip_prefix(&parent)
        .ok_or("node not under its parent")?;
    Ok(tail.trim_start_matches('p').parse()?)
}

/// Stages and publishes `w` again; its file must read back with the same checksum.
async fn check_back(r: &mut Rig, w: &Written) -> Result<()> {
    r.stage(&w.vol).await?;
    r.publish(&w.vol).await?;
    let (_, src, _) = mountinfo(&w.vol.staging).ok_or("staging path not mounted")?;
    ensure(
        Path::new(&src) == w.node,
        format!("staged from {src}, was {}", w.node.display()),
    )?;
    ensure(number_of(&w.node)? == number_of_dropped(w)?, "renumbered")?;
    let back = std::fs::read(w.vol.target.join(FILE))?;
    let got = sha256(&back);
    ensure(
        back.len() == w.len && got == w.sha256,
        format!(
            "{}: {} bytes sha256 {got}, wrote {} bytes sha256 {}",
            w.vol.id,
            back.len(),
            w.len,
            w.sha256
        ),
    )?;
    let uuid = sh(&format!("blkid -p -o value -s UUID {}", w.node.display()))?;
    ensure(
        uuid == w.fs_uuid,
        format!("fs UUID {uuid}, was {} (formatted again?)", w.fs_uuid),
    )
}
