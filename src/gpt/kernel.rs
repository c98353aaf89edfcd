//! The kernel's view of a carved device's partitions. Changes go through the BLKPG ioctl
//! (what `partx` does), so they work on kernels without a GPT parser and on loop devices
//! that never scan (6.x: loop devices without partscan still accept BLKPG, commit
//! b9684a71fca7 "block, loop: support partitions without scanning"). What the kernel
//! shows is read from sysfs, never from a rescan.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::alloc::Extent;
use super::format::Label;
use super::label::{self, OnDisk};
use super::{Error, Result};

/// `BLKPG`, `_IO(0x12,105)` in include/uapi/linux/fs.h.
const BLKPG: libc::c_ulong = 0x1269;
/// `BLKDISCARD`, `_IO(0x12,119)`: `u64[2] = {start, length}` in bytes.
const BLKDISCARD: libc::c_ulong = 0x1277;
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
    let part = partition(device, number)?.ok_or_else(|| {
        Error::NotFound(format!(
            "{number} in the kernel's view of {}",
            device.display()
        ))
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
                        .ok_or_else(|| Error::NotFound(number.to_string()))?;
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

/// Whether [`discard`] or [`zero_offloaded`] did the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Erased {
    Done,
    /// The device cannot (EOPNOTSUPP): zero it out with writes instead.
    Unsupported,
}

const ERASE_CHUNK: u64 = 1 << 30;

/// Discards every block of `node` (BLKDISCARD). Discarded blocks need not read back as
/// zeros (queue/discard_zeroes_data is 0 since 4.12): use it only to release blocks
/// before a zero-out, or use [`zero_offloaded`], which does both.
pub fn discard(node: &Path, per_chunk: Duration) -> Result<Erased> {
    chunked(node, "BLKDISCARD", per_chunk, |file, range| {
        // SAFETY: `range` outlives the call; the kernel reads two u64 from it
        // (block/ioctl.c blk_ioctl_discard copies `uint64_t range[2]` from user memory).
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    })
}

/// Makes every block of `node` read back as zeros through the device's offload only
/// (NVMe Write Zeroes or Deallocate with zeroed reads; a loop device punches its backing
/// file), releasing the blocks where it can: fallocate(PUNCH_HOLE | KEEP_SIZE) on a block
/// device is blkdev_issue_zeroout(BLKDEV_ZERO_NOFALLBACK) (block/fops.c
/// blkdev_fallocate). `Unsupported` when there is no offload: then write zeros (the
/// host port's `zero_device`, BLKZEROOUT, works on a partition node).
pub fn zero_offloaded(node: &Path, per_chunk: Duration) -> Result<Erased> {
    chunked(node, "fallocate(PUNCH_HOLE)", per_chunk, punch_hole)
}

/// `BLKZEROOUT`, `_IO(0x12,127)`: `u64[2] = {start, length}` in bytes.
const BLKZEROOUT: libc::c_ulong = 0x127f;

fn punch_hole(file: &File, range: [u64; 2]) -> std::io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let (start, len) = (range[0] as libc::off_t, range[1] as libc::off_t);
    // SAFETY: fallocate on a descriptor the caller owns; no memory is passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, start, len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn zeroout(file: &File, range: [u64; 2]) -> std::io::Result<()> {
    // SAFETY: `range` outlives the call; the kernel reads two u64 from it
    // (block/ioctl.c blk_ioctl_zeroout copies `uint64_t range[2]` from user memory).
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT as _, range.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Opens partition node `node` for writing, exclusively (EBUSY while anything mounts or
/// holds it; and while it is open the kernel refuses a re-read of the disk's table, so
/// udevd cannot take it away meanwhile: block/partitions/core.c `bdev_disk_changed`).
pub fn open_exclusive(node: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(node)
        .map_err(|e| Error::io("opening (exclusively)", node, e))
}

/// Makes every block of the open partition `file` (`node`) read back as zeros: the
/// device's offload where it has one ([`zero_offloaded`]'s), else BLKZEROOUT, which
/// writes zero pages where it has none (block/ioctl.c blk_ioctl_zeroout,
/// blkdev_issue_zeroout without NOFALLBACK), each 1 GiB within `per_chunk`.
pub fn zero_file(file: &File, node: &Path, per_chunk: Duration) -> Result<()> {
    let mut f = file;
    let len = f
        .seek(SeekFrom::End(0))
        .map_err(|e| Error::io("measuring", node, e))?;
    let whole = Extent { start: 0, len };
    let offload = in_chunks(
        file,
        node,
        "fallocate(PUNCH_HOLE)",
        whole,
        per_chunk,
        punch_hole,
    )?;
    if offload == Erased::Done {
        return Ok(());
    }
    in_chunks(file, node, "BLKZEROOUT", whole, per_chunk, zeroout).map(drop)
}

/// Zeroes bytes `span` of whole device `device` (free space of our label that a
/// partition is about to grow into), offloaded where the device can, else written. Not
/// opened O_EXCL: the device's partitions are open; the span is none of theirs.
pub fn zero_span(device: &Path, span: Extent, per_chunk: Duration) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(device)
        .map_err(|e| Error::io("opening", device, e))?;
    zero_extent(&file, device, "zeroing free space", span, per_chunk)
}

/// Makes bytes `span` of the open device `file` (`node`) read back as zeros, offloaded
/// where the device can, else written; each 1 GiB within `per_chunk`.
pub fn zero_extent(
    file: &File,
    node: &Path,
    what: &'static str,
    span: Extent,
    per_chunk: Duration,
) -> Result<()> {
    match in_chunks(file, node, what, span, per_chunk, punch_hole)? {
        Erased::Done => Ok(()),
        Erased::Unsupported => in_chunks(file, node, what, span, per_chunk, zeroout).map(drop),
    }
}

/// Runs `op` over `node` in 1 GiB ranges, each within `per_chunk`. Opened O_EXCL, so
/// nothing mounts it meanwhile (EBUSY if in use).
fn chunked(
    node: &Path,
    what: &'static str,
    per_chunk: Duration,
    op: impl Fn(&File, [u64; 2]) -> std::io::Result<()>,
) -> Result<Erased> {
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(node)
        .map_err(|e| Error::io("opening (exclusively)", node, e))?;
    let mut f = &file;
    let size = f
        .seek(SeekFrom::End(0))
        .map_err(|e| Error::io("measuring", node, e))?;
    let whole = Extent {
        start: 0,
        len: size,
    };
    in_chunks(&file, node, what, whole, per_chunk, op)
}

/// Runs `op` over `span` of `file` in 1 GiB ranges, each within `per_chunk`;
/// `Unsupported` when the first range answers EOPNOTSUPP.
fn in_chunks(
    file: &File,
    node: &Path,
    what: &'static str,
    span: Extent,
    per_chunk: Duration,
    op: impl Fn(&File, [u64; 2]) -> std::io::Result<()>,
) -> Result<Erased> {
    let mut start = span.start;
    while start < span.end() {
        let range = [start, ERASE_CHUNK.min(span.end() - start)];
        let began = Instant::now();
        if let Err(e) = op(file, range) {
            if start == span.start && e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Ok(Erased::Unsupported);
            }
            return Err(Error::io(what, node, e));
        }
        if began.elapsed() > per_chunk {
            return Err(Error::Timeout {
                what,
                device: node.to_owned(),
                at: start,
                after: per_chunk,
            });
        }
        start += range[1];
    }
    Ok(Erased::Done)
}
