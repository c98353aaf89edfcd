//! The kernel's partitions of a whole device, read from sysfs.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::disk::gpt::{Error, Result};

/// A partition as the kernel shows it (sysfs), in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPartition {
    pub number: u32,
    pub start: u64,
    pub len: u64,
    /// Its kernel name: `loop3p2`, `nvme0n1p2`, `sda2`.
    pub name: String,
    /// Its device number (major, minor).
    pub dev: (u32, u32),
}

/// The sysfs directory of a whole block device, found by its device number.
fn sysfs_dir(device: &Path) -> Result<PathBuf> {
    let meta = fs::metadata(device).map_err(|e| Error::io("stat", device, e))?;
    if !meta.file_type().is_block_device() {
        return Err(Error::Invalid(format!(
            "{} is not a block device",
            device.display()
        )));
    }
    let rdev = meta.rdev();
    let link = format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev));
    let dir = fs::canonicalize(&link).map_err(|e| Error::io("resolving", Path::new(&link), e))?;
    if dir.join("partition").exists() {
        return Err(Error::Invalid(format!(
            "{} is a partition, not a whole device",
            device.display()
        )));
    }
    Ok(dir)
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The partitions the kernel shows for whole device `device`, by number.
pub fn list(device: &Path) -> Result<Vec<KernelPartition>> {
    let dir = sysfs_dir(device)?;
    let mut parts = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| Error::io("listing", &dir, e))? {
        let path = entry.map_err(|e| Error::io("listing", &dir, e))?.path();
        parts.extend(read_partition(&path));
    }
    parts.sort_by_key(|p| p.number);
    Ok(parts)
}

/// The numbers of the partitions the kernel shows for whole device `device`, from the
/// names of their sysfs entries alone (see [`partition`] for the naming).
pub fn numbers(device: &Path) -> Result<Vec<u32>> {
    let dir = sysfs_dir(device)?;
    let disk = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| Error::io("listing", &dir, e))? {
        let name = entry
            .map_err(|e| Error::io("listing", &dir, e))?
            .file_name();
        let name = name.to_string_lossy();
        let Some(rest) = name.strip_prefix(disk.as_str()) else {
            continue;
        };
        let digits = rest.strip_prefix('p').unwrap_or(rest);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            out.extend(digits.parse::<u32>().ok());
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Partition `number` of whole device `device` as the kernel shows it, read from its own
/// sysfs entry alone, so finding one partition costs the same on a disk with hundreds.
/// The kernel names partition N of disk D `D<N>`, or `Dp<N>` when D ends in a digit
/// (block/partitions/core.c `add_partition`: `dev_set_name(pdev, "%sp%d", ...)` when
/// `isdigit(dname[strlen(dname) - 1])`, else `"%s%d"`).
pub fn partition(device: &Path, number: u32) -> Result<Option<KernelPartition>> {
    let dir = sysfs_dir(device)?;
    let disk = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let p = if disk.ends_with(|c: char| c.is_ascii_digit()) {
        "p"
    } else {
        ""
    };
    let found = read_partition(&dir.join(format!("{disk}{p}{number}")));
    Ok(found.filter(|k| k.number == number))
}

/// The partition whose sysfs directory is `path`; None when it is none (or gone).
fn read_partition(path: &Path) -> Option<KernelPartition> {
    let number = read_u64(&path.join("partition"))?;
    // sysfs `start` and `size` count 512-byte sectors whatever the block size.
    let start = read_u64(&path.join("start"))?;
    let size = read_u64(&path.join("size"))?;
    let dev = fs::read_to_string(path.join("dev")).unwrap_or_default();
    let (maj, min) = dev.trim().split_once(':').unwrap_or(("0", "0"));
    Some(KernelPartition {
        number: number as u32,
        start: start * 512,
        len: size * 512,
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        dev: (maj.parse().unwrap_or(0), min.parse().unwrap_or(0)),
    })
}
