//! Discarding and zeroing a partition, or a span of a whole device, in 1 GiB ranges
//! each under a deadline.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::disk::gpt::alloc::Extent;
use crate::disk::gpt::{Error, Result};

/// `BLKDISCARD`, `_IO(0x12,119)`: `u64[2] = {start, length}` in bytes.
const BLKDISCARD: libc::c_ulong = 0x1277;

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
