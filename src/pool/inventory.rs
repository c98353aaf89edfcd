//! Finding the node's pool devices: NVMe namespaces through sysfs, identified by
//! their `wwid`, and devices listed by the operator, keyed by the given path (the key
//! volume ids were derived from since the first release, so it stays). What a device
//! *is* is its number at scan time and its sysfs identity ([`Observed`]): two paths to
//! one device are one pool device, and a path that names something else is noticed.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::os::{blockdev, MountEntry};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDevice {
    /// Short stable id derived from `key`; part of the volume id.
    pub id: String,
    /// `wwid:<wwid>` or `path:<path as given>`.
    pub key: String,
    /// Where the device node is now (an NVMe name can change across reboots).
    pub path: PathBuf,
    pub size_bytes: u64,
    pub major: u32,
    pub minor: u32,
    /// What sysfs said the device is at scan time (`blockdev::sysfs_identity`).
    pub identity: Option<String>,
    pub source: Source,
}

/// How the device was found, and so how to look at it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--pool-device`: the path names the device (stat it).
    Listed,
    /// NVMe discovery: the kernel name under `<sys>/block` names it.
    Discovered { name: String },
}

/// What a pool device's path or name shows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub major: u32,
    pub minor: u32,
    pub size_bytes: u64,
    pub identity: Option<String>,
}

impl std::fmt::Display for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {}:{}, {} bytes, {}",
            self.major,
            self.minor,
            self.size_bytes,
            self.identity.as_deref().unwrap_or("no sysfs identity")
        )
    }
}

impl PoolDevice {
    pub fn observed_at_scan(&self) -> Observed {
        Observed {
            major: self.major,
            minor: self.minor,
            size_bytes: self.size_bytes,
            identity: self.identity.clone(),
        }
    }
}

/// Looks at the device again: sysfs and `stat` only, no I/O to the device.
pub fn observe(sys: &Path, dev: &PoolDevice) -> Result<Observed, String> {
    let (major, minor, dir) = match &dev.source {
        Source::Listed => {
            let (major, minor) = blockdev::devnum_of(&dev.path)?;
            (major, minor, sys.join(format!("dev/block/{major}:{minor}")))
        }
        Source::Discovered { name } => {
            let dir = sys.join("block").join(name);
            let (major, minor) = read_devnum(&dir)
                .ok_or_else(|| format!("{} is gone from sysfs", dev.path.display()))?;
            (major, minor, dir)
        }
    };
    Ok(Observed {
        major,
        minor,
        size_bytes: blockdev::size_bytes(sys, major, minor)?,
        identity: blockdev::sysfs_identity(&dir),
    })
}

fn read_devnum(dir: &Path) -> Option<(u32, u32)> {
    read_trimmed(&dir.join("dev")).and_then(|d| {
        let (a, b) = d.split_once(':')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    })
}

/// A device that is not in the pool, and why.
#[derive(Debug, Clone)]
pub struct Excluded {
    pub device: String,
    pub reason: String,
}

pub fn device_id(prefix: &str, key: &str) -> String {
    format!("{prefix}-{}", crate::runtime::state_dir::short_hash(key))
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn size_from_sysfs(sys: &Path, major: u32, minor: u32) -> Result<u64, String> {
    blockdev::size_bytes(sys, major, minor)
}

/// A device listed with `--pool-device`.
pub fn listed_device(sys: &Path, path: &Path) -> Result<PoolDevice, String> {
    let (major, minor) = blockdev::devnum_of(path)?;
    let size_bytes = size_from_sysfs(sys, major, minor)?;
    if size_bytes == 0 {
        return Err(format!(
            "{} has size 0 (a detached loop device?)",
            path.display()
        ));
    }
    let key = format!("path:{}", path.display());
    Ok(PoolDevice {
        id: device_id("dev", &key),
        key,
        path: path.to_owned(),
        size_bytes,
        major,
        minor,
        identity: blockdev::sysfs_identity(&sys.join(format!("dev/block/{major}:{minor}"))),
        source: Source::Listed,
    })
}

/// `nvme<ctrl>n<ns>`: a namespace block device. The hidden per-path devices of native
/// multipath (`nvme<subsys>c<ctrl>n<ns>`) are not usable on their own and are skipped.
fn is_namespace_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let Some((ctrl, ns)) = rest.split_once('n') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(ctrl) && digits(ns)
}

/// Every NVMe namespace under `<sys>/block`, minus those visibly in use.
pub fn nvme_namespaces(
    sys: &Path,
    dev: &Path,
    mounts: &[MountEntry],
    allocated_keys: &HashSet<String>,
) -> (Vec<PoolDevice>, Vec<Excluded>) {
    let mut found = Vec::new();
    let mut excluded = Vec::new();
    let Ok(entries) = fs::read_dir(sys.join("block")) else {
        return (found, excluded);
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| is_namespace_name(n))
        .collect();
    names.sort();
    for name in names {
        match namespace(sys, dev, mounts, allocated_keys, &name) {
            Ok(device) => found.push(device),
            Err(reason) => excluded.push(Excluded {
                device: name,
                reason,
            }),
        }
    }
    (found, excluded)
}

/// The namespace `name` as a pool device, or why it is left out: no wwid, partitioned,
/// held or mounted (unless it is one of ours, `allocated_keys`), or no size.
fn namespace(
    sys: &Path,
    dev: &Path,
    mounts: &[MountEntry],
    allocated_keys: &HashSet<String>,
    name: &str,
) -> Result<PoolDevice, String> {
    let dir = sys.join("block").join(name);
    let wwid = read_trimmed(&dir.join("wwid"))
        .filter(|w| !w.is_empty())
        .ok_or("no wwid in sysfs; namespaces are only identified by wwid")?;
    let (major, minor) = read_devnum(&dir).ok_or("unreadable dev number")?;
    let key = format!("wwid:{wwid}");
    // A namespace carved by the partition layout shows partitions, all of them volumes
    // recorded under its key (the record is written before the partition is carved and
    // dropped after it is removed), so it stays in the pool while any is left; carved
    // empty, it shows none. Partitions with no record of ours (a foreign table, or a
    // lost state dir) keep it out. A partition is never a pool device itself: its name
    // is no namespace name, and `<sys>/block` lists whole disks only.
    if !allocated_keys.contains(&key) {
        let has_partitions = fs::read_dir(&dir)
            .map(|it| {
                it.filter_map(|e| e.ok())
                    .any(|e| e.path().join("partition").exists())
            })
            .unwrap_or(true);
        if has_partitions {
            return Err("has partitions".into());
        }
        let has_holders = fs::read_dir(dir.join("holders"))
            .map(|mut it| it.next().is_some())
            .unwrap_or(false);
        if has_holders {
            return Err("held by another device (device-mapper, md, ...)".into());
        }
        if let Some(u) = blockdev::mounts(mounts, major, minor).first() {
            return Err(format!("in use outside the driver: {u}"));
        }
    }
    let size_bytes = match size_from_sysfs(sys, major, minor)? {
        0 => return Err("size 0".into()),
        size => size,
    };
    Ok(PoolDevice {
        id: device_id("nvme", &key),
        key,
        path: dev.join(name),
        size_bytes,
        major,
        minor,
        identity: blockdev::sysfs_identity(&dir),
        source: Source::Discovered {
            name: name.to_owned(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespace(sys: &Path, name: &str, wwid: &str, devno: &str, sectors: u64) {
        let dir = sys.join("block").join(name);
        fs::create_dir_all(dir.join("holders")).unwrap();
        fs::write(dir.join("wwid"), format!("{wwid}\n")).unwrap();
        fs::write(dir.join("dev"), format!("{devno}\n")).unwrap();
        let by_dev = sys.join("dev/block").join(devno);
        fs::create_dir_all(&by_dev).unwrap();
        fs::write(by_dev.join("size"), format!("{sectors}\n")).unwrap();
    }

    #[test]
    fn namespaces_are_identified_by_wwid_not_by_name() {
        let sys = tempfile::tempdir().unwrap();
        namespace(sys.path(), "nvme0n1", "nvme.1b36-aa-01", "259:0", 2048);
        namespace(sys.path(), "nvme1n1", "nvme.1b36-bb-01", "259:1", 4096);
        let (found, _) = nvme_namespaces(sys.path(), Path::new("/dev"), &[], &HashSet::new());
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].size_bytes, 2048 * 512);
        assert_eq!(found[0].path, Path::new("/dev/nvme0n1"));

        // After a "reboot" the names swap; the ids follow the wwids.
        let swapped = tempfile::tempdir().unwrap();
        namespace(swapped.path(), "nvme0n1", "nvme.1b36-bb-01", "259:0", 4096);
        namespace(swapped.path(), "nvme1n1", "nvme.1b36-aa-01", "259:1", 2048);
        let (again, _) = nvme_namespaces(swapped.path(), Path::new("/dev"), &[], &HashSet::new());
        let aa_before = found.iter().find(|d| d.key.ends_with("aa-01")).unwrap();
        let aa_after = again.iter().find(|d| d.key.ends_with("aa-01")).unwrap();
        assert_eq!(aa_before.id, aa_after.id);
        assert_ne!(aa_before.path, aa_after.path);
    }

    #[test]
    fn only_namespace_names_are_namespaces() {
        for name in ["nvme0n1", "nvme12n3"] {
            assert!(is_namespace_name(name), "{name}");
        }
        for name in ["nvme0c0n1", "nvme0", "nvme0n1p1", "nvmen1", "loop0"] {
            assert!(!is_namespace_name(name), "{name}");
        }
    }

    /// A namespace carved by the partition layout (its partitions are volumes recorded
    /// under its key) stays in the pool, whole; without such records its partitions keep
    /// it out; a partition is never listed itself, even where discovery looks.
    #[test]
    fn a_carved_namespace_stays_and_its_partitions_are_never_pool_devices() {
        let sys = tempfile::tempdir().unwrap();
        namespace(sys.path(), "nvme0n1", "w-carved", "259:0", 2048);
        for (p, devno) in [("nvme0n1p1", "259:1"), ("nvme0n1p2", "259:2")] {
            let dir = sys.path().join("block/nvme0n1").join(p);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("partition"), "1\n").unwrap();
            fs::write(dir.join("dev"), format!("{devno}\n")).unwrap();
        }
        // A partition where discovery looks (as /sys/class/block would list it).
        namespace(sys.path(), "nvme0n1p1", "w-carved", "259:1", 1024);
        let ours = HashSet::from(["wwid:w-carved".to_owned()]);
        let (found, excluded) = nvme_namespaces(sys.path(), Path::new("/dev"), &[], &ours);
        assert_eq!(found.len(), 1, "{found:?} {excluded:?}");
        assert_eq!(found[0].path, Path::new("/dev/nvme0n1"));
        assert_eq!(found[0].size_bytes, 2048 * 512, "the whole namespace");
        assert!(excluded.is_empty(), "{excluded:?}");
        // The same namespace with no volume recorded on it: its partitions are not ours.
        let (found, excluded) =
            nvme_namespaces(sys.path(), Path::new("/dev"), &[], &HashSet::new());
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(excluded.len(), 1, "{excluded:?}");
        assert_eq!(excluded[0].device, "nvme0n1");
        assert!(excluded[0].reason.contains("partitions"));
    }

    #[test]
    fn namespaces_in_use_are_excluded_with_a_reason() {
        let sys = tempfile::tempdir().unwrap();
        namespace(sys.path(), "nvme0n1", "w-part", "259:0", 2048);
        fs::create_dir_all(sys.path().join("block/nvme0n1/nvme0n1p1")).unwrap();
        fs::write(sys.path().join("block/nvme0n1/nvme0n1p1/partition"), "1").unwrap();
        namespace(sys.path(), "nvme1n1", "w-held", "259:1", 2048);
        fs::create_dir_all(sys.path().join("block/nvme1n1/holders/dm-0")).unwrap();
        namespace(sys.path(), "nvme2n1", "", "259:2", 2048);
        let (found, excluded) =
            nvme_namespaces(sys.path(), Path::new("/dev"), &[], &HashSet::new());
        assert!(found.is_empty());
        let reasons: Vec<_> = excluded.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[0].contains("partitions"));
        assert!(reasons[1].contains("held"));
        assert!(reasons[2].contains("wwid"));
    }
}
