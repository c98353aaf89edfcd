//! Block devices: what a device is (its number now, its size and sysfs identity), where it
//! is in use on this host, what signatures are on it, and holding and zeroing it for a
//! destructive step.
//!
//! Every "is this device mounted?" decision goes through [`uses`]:
//! a published raw-block volume is a bind mount of the device node, which mountinfo
//! shows as the node's own filesystem (`devtmpfs`, root `/loop5`), never as the device.

use super::host::{DeviceHold, Host};
use super::mount::MountEntry;
use crate::error::HostError;
use crate::error::{CommandError, Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where a block device is in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceUse {
    /// A filesystem on the device is mounted here.
    Mounted(PathBuf),
    /// The device node itself is bind-mounted here (a published raw-block volume).
    NodeBound(PathBuf),
    /// Another block device is stacked on it (device-mapper, md, ...): sysfs `holders/`.
    Held(String),
}

impl DeviceUse {
    /// The mount point, for mounts of either kind.
    pub fn mount_point(&self) -> Option<&Path> {
        match self {
            DeviceUse::Mounted(p) | DeviceUse::NodeBound(p) => Some(p),
            DeviceUse::Held(_) => None,
        }
    }
}

impl fmt::Display for DeviceUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceUse::Mounted(p) => write!(f, "mounted at {}", p.display()),
            DeviceUse::NodeBound(p) => {
                write!(f, "published as a raw block device at {}", p.display())
            }
            DeviceUse::Held(h) => write!(f, "held by {h}"),
        }
    }
}

/// Filesystems whose mount points are never stat'ed: a dead server would hang the call
/// (and an autofs point would trigger a mount), and a device node on them is not one the
/// driver published.
fn remote(fs_type: &str) -> bool {
    fs_type.starts_with("nfs")
        || fs_type.starts_with("fuse")
        || matches!(
            fs_type,
            "cifs"
                | "smb3"
                | "smbfs"
                | "ceph"
                | "glusterfs"
                | "9p"
                | "afs"
                | "lustre"
                | "gpfs"
                | "autofs"
        )
}

/// `m` is a bind mount of the device node of `major:minor`. A bind of a single file has the
/// file's path as its root (never "/"); what is mounted there is then the node itself, so
/// stat'ing the mount point shows its type and `st_rdev`.
pub fn is_node_bind(m: &MountEntry, major: u32, minor: u32) -> bool {
    if m.root == "/" || remote(&m.fs_type) {
        return false;
    }
    fs::metadata(&m.mount_point).is_ok_and(|meta| {
        meta.file_type().is_block_device() && devnum(meta.rdev()) == (major, minor)
    })
}

/// `m` carries the device: its filesystem, or its node bound for a raw-block volume.
pub fn carries(m: &MountEntry, major: u32, minor: u32) -> bool {
    m.is_device(major, minor) || is_node_bind(m, major, minor)
}

/// Every mount of the device, of either kind, in mount-table order.
pub fn mounts<'a>(
    table: impl IntoIterator<Item = &'a MountEntry>,
    major: u32,
    minor: u32,
) -> Vec<DeviceUse> {
    table
        .into_iter()
        .filter_map(|m| {
            if m.is_device(major, minor) {
                Some(DeviceUse::Mounted(m.mount_point.clone()))
            } else if is_node_bind(m, major, minor) {
                Some(DeviceUse::NodeBound(m.mount_point.clone()))
            } else {
                None
            }
        })
        .collect()
}

/// Block devices stacked on this one: `<sys>/dev/block/M:m/holders/` (block/holder.c
/// links each holder there).
pub fn holders(sys: &Path, major: u32, minor: u32) -> Vec<String> {
    let dir = sys.join(format!("dev/block/{major}:{minor}/holders"));
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Where the device is in use on this host: its mounts, binds of its node, its holders.
/// Empty means nothing the mount table or sysfs shows uses it.
pub fn uses(table: &[MountEntry], sys: &Path, major: u32, minor: u32) -> Vec<DeviceUse> {
    let mut all = mounts(table, major, minor);
    all.extend(holders(sys, major, minor).into_iter().map(DeviceUse::Held));
    all
}

pub fn devnum(rdev: u64) -> (u32, u32) {
    (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    )
}

/// The device number `path` names now (following symlinks); an error when it names no
/// block device.
pub fn devnum_of(path: &Path) -> Result<(u32, u32), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.file_type().is_block_device() {
        return Err(format!("{} is not a block device", path.display()));
    }
    Ok(devnum(meta.rdev()))
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Bytes, from `<sys>/dev/block/M:m/size` (always 512-byte sectors).
pub fn size_bytes(sys: &Path, major: u32, minor: u32) -> Result<u64, String> {
    let path = sys.join(format!("dev/block/{major}:{minor}/size"));
    let sectors = read_trimmed(&path)
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| format!("cannot read {}", path.display()))?;
    Ok(sectors * 512)
}

/// What sysfs says a device is, from its directory (`<sys>/dev/block/M:m` or
/// `<sys>/block/<name>`); `None` when it says nothing. In order:
/// - a loop device's backing file, offset and size limit (drivers/block/loop.c,
///   `loop_attr_backing_file_show` and siblings; the path is as the driver's mount
///   namespace sees it, so it is compared only with what this driver recorded);
/// - `wwid` of an NVMe namespace (drivers/nvme/host, `wwid_show`) or `device/wwid` of a
///   SCSI disk (drivers/scsi/scsi_sysfs.c, `sdev_show_wwid`);
/// - `serial` of a virtio disk (drivers/block/virtio_blk.c, `serial_show`) or
///   `device/serial`;
/// - `dm/uuid` of a device-mapper device (drivers/md/dm-sysfs.c).
pub fn sysfs_identity(dir: &Path) -> Option<String> {
    if let Some(file) = read_trimmed(&dir.join("loop/backing_file")) {
        let num = |n: &str| read_trimmed(&dir.join("loop").join(n)).unwrap_or_else(|| "0".into());
        return Some(format!(
            "loop:{file}@{}+{}",
            num("offset"),
            num("sizelimit")
        ));
    }
    for (attr, kind) in [
        ("wwid", "wwid"),
        ("device/wwid", "wwid"),
        ("serial", "serial"),
        ("device/serial", "serial"),
        ("dm/uuid", "dm"),
    ] {
        if let Some(v) = read_trimmed(&dir.join(attr)) {
            return Some(format!("{kind}:{v}"));
        }
    }
    None
}

// Holding a block device for a destructive step (util-linux's lock, O_EXCL) and zeroing it
// (BLKZEROOUT in chunks under a deadline): the erase on delete.
/// How long a destructive step waits for util-linux's lock before answering Aborted.
pub const HOLD_PATIENCE: Duration = Duration::from_secs(10);

/// [`Host::hold_device`], waiting up to `patience` while another program holds
/// util-linux's lock: systemd-udevd takes it for a moment to probe the device after every
/// close-after-write (mkfs's, wipefs's). A device in use is refused at once.
pub async fn hold_when_free(
    host: &dyn Host,
    device: &Path,
    patience: Duration,
) -> Result<DeviceHold> {
    let until = Instant::now() + patience;
    loop {
        match host.hold_device(device) {
            Err(Error::Host(HostError::DeviceLocked { .. })) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
}

/// Blocks zeroed per BLKZEROOUT call: each call is uninterruptible, so the deadline is
/// checked between calls and progress is visible in the logs.
const ZERO_CHUNK: u64 = 1 << 30;

/// `BLKZEROOUT`, `_IO(0x12,127)` in linux include/uapi/linux/fs.h; its argument is
/// `u64[2] = {start, length}` in bytes, both 512-byte aligned.
const BLKZEROOUT: libc::c_ulong = 0x127f;

pub(super) fn device_in_use(device: &Path) -> Error {
    let name = device
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "<device>".into());
    HostError::DeviceInUse {
        device: device.to_owned(),
        name,
    }
    .into()
}

/// Zeroes `[0, size)` of an open device in chunks; a chunk slower than `per_chunk` fails it.
pub(super) fn zero_blocks(
    file: &File,
    device: &Path,
    size: u64,
    per_chunk: Duration,
) -> Result<()> {
    let mut start = 0u64;
    while start < size {
        let len = ZERO_CHUNK.min(size - start);
        let range = [start, len];
        let began = Instant::now();
        // SAFETY: `range` outlives the call; the kernel reads two u64 from it
        // (block/ioctl.c blk_ioctl_zeroout copies `uint64_t range[2]` from user memory).
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT as _, range.as_ptr()) };
        if rc != 0 {
            return Err(Error::io(
                "zeroing (BLKZEROOUT)",
                device,
                std::io::Error::last_os_error(),
            ));
        }
        if began.elapsed() > per_chunk {
            return Err(CommandError::Timeout {
                command: format!("BLKZEROOUT of {} at byte {start}", device.display()),
                after: per_chunk,
            }
            .into());
        }
        start += len;
    }
    Ok(())
}

// What the two signature probes print, parsed: `blkid -p -o export` and `wipefs -n -J`.
// A device is blank only when both ran and both found nothing (see `Host::probe_signatures`).

/// One on-disk signature (filesystem, partition table, RAID member, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signature {
    pub kind: String,
    pub uuid: Option<String>,
    pub offset: Option<String>,
    pub seen_by: &'static str,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(uuid) = &self.uuid {
            write!(f, " uuid={uuid}")?;
        }
        if let Some(offset) = &self.offset {
            write!(f, " at {offset}")?;
        }
        write!(f, " ({})", self.seen_by)
    }
}

/// `blkid -p -o export`: KEY=VALUE lines for every superblock and partition table.
pub(super) fn parse_blkid_export(text: &str) -> Vec<Signature> {
    // On a partition, blkid also prints (and exits 0 for) the parent's entry for it,
    // PART_ENTRY_*: that is the partition table's, not a signature on the partition.
    let own = |l: &&str| !(l.starts_with("DEVNAME=") || l.starts_with("PART_ENTRY_"));
    if !text.lines().any(|l| own(&l)) {
        return Vec::new();
    }
    let mut kind = None;
    let mut uuid = None;
    let mut offset = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("TYPE" | "PTTYPE", v)) if kind.is_none() => kind = Some(v.to_owned()),
            Some(("UUID" | "PTUUID", v)) => uuid = Some(v.to_owned()),
            Some(("SBMAGIC_OFFSET", v)) => offset = Some(v.to_owned()),
            _ => {}
        }
    }
    // blkid found something (exit 0) even when it printed no TYPE we recognise.
    vec![Signature {
        kind: kind.unwrap_or_else(|| "unknown".into()),
        uuid,
        offset,
        seen_by: "blkid -p",
    }]
}

#[derive(Deserialize)]
struct WipefsReport {
    #[serde(default)]
    signatures: Vec<WipefsSignature>,
}

#[derive(Deserialize)]
struct WipefsSignature {
    #[serde(rename = "type")]
    kind: String,
    uuid: Option<String>,
    offset: Option<String>,
}

pub(super) fn parse_wipefs_json(
    text: &str,
) -> std::result::Result<Vec<Signature>, serde_json::Error> {
    // wipefs prints nothing at all when the device carries no signature.
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let report: WipefsReport = serde_json::from_str(text)?;
    Ok(report
        .signatures
        .into_iter()
        .map(|s| Signature {
            kind: s.kind,
            uuid: s.uuid,
            offset: s.offset,
            seen_by: "wipefs -n",
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    fn entry(devno: (u32, u32), root: &str, at: &Path, fs: &str) -> MountEntry {
        MountEntry {
            major: devno.0,
            minor: devno.1,
            root: root.into(),
            mount_point: at.to_owned(),
            mount_options: HashMap::new(),
            fs_type: fs.into(),
            source: None,
            super_options: HashMap::new(),
        }
    }

    #[test]
    fn holders_and_mounts_are_uses_and_unstat_able_binds_are_not() {
        let sys = tempfile::tempdir().unwrap();
        fs::create_dir_all(sys.path().join("dev/block/7:3/holders/dm-0")).unwrap();
        let table = [
            entry((7, 3), "/", Path::new("/staging/a"), "ext4"),
            // A bind of a file that is not a device node, and one on NFS: no match.
            entry((0, 5), "/loop3", Path::new("/nonexistent/x"), "devtmpfs"),
            entry((0, 52), "/loop3", Path::new("/nonexistent/y"), "nfs4"),
        ];
        let found = uses(&table, sys.path(), 7, 3);
        assert_eq!(
            found,
            vec![
                DeviceUse::Mounted("/staging/a".into()),
                DeviceUse::Held("dm-0".into())
            ]
        );
        assert!(uses(&table, sys.path(), 7, 4).is_empty());
    }

    #[test]
    fn identity_prefers_the_loop_backing_file_then_wwid_then_serial() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(sysfs_identity(dir.path()), None);
        fs::create_dir_all(dir.path().join("device")).unwrap();
        fs::write(dir.path().join("device/serial"), "S1\n").unwrap();
        assert_eq!(sysfs_identity(dir.path()).as_deref(), Some("serial:S1"));
        fs::write(dir.path().join("wwid"), "eui.00a1\n").unwrap();
        assert_eq!(sysfs_identity(dir.path()).as_deref(), Some("wwid:eui.00a1"));
        fs::create_dir_all(dir.path().join("loop")).unwrap();
        fs::write(dir.path().join("loop/backing_file"), "/img/a\n").unwrap();
        fs::write(dir.path().join("loop/offset"), "4096\n").unwrap();
        assert_eq!(
            sysfs_identity(dir.path()).as_deref(),
            Some("loop:/img/a@4096+0")
        );
    }

    #[test]
    fn blkid_export_with_a_partition_table_is_a_signature() {
        let sigs = parse_blkid_export("DEVNAME=/dev/loop4\nPTUUID=abcd\nPTTYPE=dos\n");
        assert_eq!(sigs.len(), 1);
        assert_eq!(sigs[0].kind, "dos");
        assert_eq!(sigs[0].uuid.as_deref(), Some("abcd"));
    }

    #[test]
    fn wipefs_json_lists_every_signature_and_empty_output_means_none() {
        let text = r#"{"signatures": [
            {"device":"loop0","offset":"0x438","type":"ext4","uuid":"u-1","label":null},
            {"device":"loop0","offset":"0x1fe","type":"dos","uuid":null,"label":null}]}"#;
        let sigs = parse_wipefs_json(text).unwrap();
        assert_eq!(sigs.len(), 2);
        assert_eq!(sigs[1].kind, "dos");
        assert!(parse_wipefs_json("").unwrap().is_empty());
        assert!(parse_wipefs_json("garbage").is_err());
    }
}
