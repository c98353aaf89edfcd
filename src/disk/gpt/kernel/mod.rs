//! The kernel's view of a carved device's partitions. Changes go through the BLKPG ioctl
//! (what `partx` does), so they work on kernels without a GPT parser and on loop devices
//! that never scan (6.x: loop devices without partscan still accept BLKPG, commit
//! b9684a71fca7 "block, loop: support partitions without scanning"). What the kernel
//! shows is read from sysfs, never from a rescan.
//!
//! - `sysfs`: what the kernel shows, read from sysfs.
//! - `blkpg`: adding, resizing and removing partitions in the kernel's view.
//! - `erase`: discarding and zeroing partitions and spans of a device.

mod blkpg;
mod copy;
mod erase;
pub(super) mod sysfs;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::alloc::Extent;
use super::format::Label;
use super::label::{self, OnDisk};
use super::{Error, Result};

pub use blkpg::{add, delete, resize};
pub use copy::{copy_extent, Copied};
pub use erase::{
    discard, open_exclusive, zero_extent, zero_file, zero_offloaded, zero_span, Erased,
};
pub use sysfs::{list, numbers, partition, KernelPartition};

/// What [`resync`] changed, by partition number, and what it left alone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resync {
    pub added: Vec<u32>,
    pub resized: Vec<u32>,
    /// Shown at another start: removed and added again (only when not open).
    pub moved: Vec<u32>,
    /// Shown by the kernel but not in our label: never removed, for the caller to report.
    pub unknown: Vec<KernelPartition>,
}

/// Makes the kernel's view of `device` show every partition of the gds-csi label on
/// it, read now (never a label from memory): adds the missing, resizes those shorter,
/// re-adds those at another start or longer (only when not open). A partition the
/// kernel shows that the label lacks is left alone and reported. A device whose label
/// is not ours is an error and nothing is changed.
pub fn resync(device: &Path) -> Result<Resync> {
    match label::read(device)? {
        OnDisk::Ours { label, .. } => resync_to(device, &label),
        OnDisk::Blank => Err(Error::foreign(device, "it holds no label")),
        OnDisk::Foreign(why) => Err(Error::foreign(device, why)),
    }
}

fn resync_to(device: &Path, label: &Label) -> Result<Resync> {
    let shown = list(device)?;
    let mut done = Resync::default();
    for (n, _) in label.partitions() {
        let Some(want) = label.extent(n) else {
            continue;
        };
        match ensure(device, &shown, n, want)? {
            Change::Added => done.added.push(n),
            Change::Resized => done.resized.push(n),
            Change::Moved => done.moved.push(n),
            Change::None => {}
        }
    }
    done.unknown = shown
        .into_iter()
        .filter(|k| label.extent(k.number).is_none())
        .collect();
    Ok(done)
}

/// What [`ensure`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Added,
    Resized,
    Moved,
}

/// Makes the kernel show partition `number` at `want`, given what it shows now.
pub fn ensure(
    device: &Path,
    shown: &[KernelPartition],
    number: u32,
    want: Extent,
) -> Result<Change> {
    match shown.iter().find(|k| k.number == number) {
        None => add(device, number, want).map(|()| Change::Added),
        Some(k) if k.start == want.start && k.len == want.len => Ok(Change::None),
        Some(k) if k.start == want.start && k.len < want.len => {
            resize(device, number, want).map(|()| Change::Resized)
        }
        // Shrinking or moving a partition in use would cut a filesystem short: only
        // done once nothing has it open (BLKPG_DEL_PARTITION refuses then, EBUSY).
        Some(_) => {
            delete(device, number)?;
            add(device, number, want).map(|()| Change::Moved)
        }
    }
}

/// The device node of partition `number` of `device` (`/dev/loop3p2`), checked to be
/// the block device of the kernel's partition; NotFound when the kernel does not show it.
pub fn node(device: &Path, number: u32) -> Result<PathBuf> {
    let part = partition(device, number)?.ok_or_else(|| Error::NotInKernel {
        number,
        device: device.to_owned(),
    })?;
    let path = Path::new("/dev").join(&part.name);
    let meta = fs::metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
    let rdev = meta.rdev();
    if !meta.file_type().is_block_device() || (libc::major(rdev), libc::minor(rdev)) != part.dev {
        return Err(Error::Invalid(format!(
            "{} is not the node of partition {number} ({}:{}); /dev must be the host's devtmpfs",
            path.display(),
            part.dev.0,
            part.dev.1
        )));
    }
    Ok(path)
}

/// Where a PARTUUID was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub parent: PathBuf,
    pub number: u32,
    pub span: Extent,
}

/// Finds the partition with PARTUUID `guid` in the gds-csi labels of `parents` (the pool
/// devices, found by their wwid). Read from the labels, not udev's by-partuuid links,
/// which need a kernel GPT parser or blkid. Unreadable devices are skipped unless the
/// partition is found nowhere, then the first such error is returned.
pub fn find_by_partuuid(parents: &[PathBuf], guid: &uuid::Uuid) -> Result<Option<Located>> {
    let mut first_err = None;
    for parent in parents {
        match label::read(parent) {
            Ok(OnDisk::Ours { label, .. }) => {
                if let Some((number, _)) = label.by_guid(guid) {
                    let span = label
                        .extent(number)
                        .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
                    return Ok(Some(Located {
                        parent: parent.clone(),
                        number,
                        span,
                    }));
                }
            }
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(None), Err)
}
