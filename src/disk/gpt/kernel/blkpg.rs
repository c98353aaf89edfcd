//! Changes to the kernel's view of a device's partitions through the BLKPG ioctl.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::disk::gpt::alloc::Extent;
use crate::disk::gpt::{Error, Result};

/// `BLKPG`, `_IO(0x12,105)` in include/uapi/linux/fs.h.
const BLKPG: libc::c_ulong = 0x1269;
/// Operations of include/uapi/linux/blkpg.h.
const BLKPG_ADD_PARTITION: libc::c_int = 1;
const BLKPG_DEL_PARTITION: libc::c_int = 2;
const BLKPG_RESIZE_PARTITION: libc::c_int = 3;

/// `struct blkpg_ioctl_arg` of include/uapi/linux/blkpg.h.
#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

/// `struct blkpg_partition` of include/uapi/linux/blkpg.h: byte offsets; the names are
/// unused by the kernel.
#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [libc::c_char; 64],
    volname: [libc::c_char; 64],
}

fn blkpg(file: &File, op: libc::c_int, number: u32, span: Extent) -> std::io::Result<()> {
    let mut part = BlkpgPartition {
        start: span.start as libc::c_longlong,
        length: span.len as libc::c_longlong,
        pno: number as libc::c_int,
        devname: [0; 64],
        volname: [0; 64],
    };
    let arg = BlkpgIoctlArg {
        op,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut part as *mut BlkpgPartition).cast(),
    };
    // SAFETY: `arg` and the `part` it points to outlive the call; the kernel copies the
    // argument and then `datalen` bytes from `data` (block/ioctl.c blkpg_ioctl and
    // blkpg_do_ioctl copy_from_user a struct blkpg_partition) and writes nothing back.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKPG as _, &arg) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn open_whole(device: &Path) -> Result<File> {
    File::open(device).map_err(|e| Error::io("opening", device, e))
}

fn refused(op: &'static str, number: u32, device: &Path, e: std::io::Error) -> Error {
    let hint = match (op, e.raw_os_error()) {
        ("delete", Some(libc::EBUSY)) => " (it is open: mounted, published or held)",
        (_, Some(libc::EBUSY)) => {
            " (the number is taken or the span overlaps a partition the kernel shows)"
        }
        (_, Some(libc::EINVAL)) => " (a span not aligned to the logical block size?)",
        (_, Some(libc::EACCES)) => " (needs CAP_SYS_ADMIN)",
        _ => "",
    };
    Error::Kernel {
        op,
        number,
        device: device.to_owned(),
        hint,
        source: e,
    }
}

/// Tells the kernel of partition `number` at `span` (bytes).
pub fn add(device: &Path, number: u32, span: Extent) -> Result<()> {
    let file = open_whole(device)?;
    blkpg(&file, BLKPG_ADD_PARTITION, number, span).map_err(|e| refused("add", number, device, e))
}

/// Changes the length of partition `number` (its start stays: bdev_resize_partition
/// refuses another start with EINVAL, block/partitions/core.c).
pub fn resize(device: &Path, number: u32, span: Extent) -> Result<()> {
    let file = open_whole(device)?;
    blkpg(&file, BLKPG_RESIZE_PARTITION, number, span)
        .map_err(|e| refused("resize", number, device, e))
}

/// Removes partition `number` from the kernel's view (the label is untouched); done
/// already when the kernel has no such partition (ENXIO). EBUSY while it is open.
pub fn delete(device: &Path, number: u32) -> Result<()> {
    let file = open_whole(device)?;
    let none = Extent { start: 0, len: 0 };
    match blkpg(&file, BLKPG_DEL_PARTITION, number, none) {
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(()),
        other => other.map_err(|e| refused("delete", number, device, e)),
    }
}
