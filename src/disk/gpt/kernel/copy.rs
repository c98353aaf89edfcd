//! Copying one extent of a device onto another extent of the same device: a partition
//! moved to a larger extent so that it can grow. Through the whole device with O_DIRECT,
//! so neither the whole device's page cache nor the partition's holds a stale copy of
//! what is read or written.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use super::erase::zero_extent;
use crate::disk::gpt::alloc::Extent;
use crate::disk::gpt::{Error, Result};

/// Bytes read and written per request; a multiple of every logical block size.
const CHUNK: usize = 8 << 20;
/// O_DIRECT wants buffers aligned to the logical block size; 4 KiB covers all of them.
const BUFFER_ALIGN: usize = 4096;
/// The deadline `per_gib` applies to each GiB copied.
const GIB: u64 = 1 << 30;

/// What a copy read and wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Copied {
    pub read: u64,
    pub written: u64,
}

/// Copies the bytes of `from` to the start of `to` (at least as long) on `device`: `to`
/// is zeroed first (offloaded where the device can), then only the chunks holding a
/// non-zero byte are written, so a volume's unused blocks (zeroed when carved) cost a read
/// but no write. Everything is on stable storage when it returns. Each GiB within
/// `per_gib`; the caller makes sure neither extent is in use.
pub fn copy_extent(device: &Path, from: Extent, to: Extent, per_gib: Duration) -> Result<Copied> {
    if to.len < from.len || overlap(from, to) {
        return Err(Error::Invalid(format!(
            "cannot copy {from:?} to {to:?}: the target must be as long and apart"
        )));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .map_err(|e| Error::io("opening (O_DIRECT)", device, e))?;
    zero_extent(&file, device, "zeroing the new extent", to, per_gib)?;
    let mut storage = vec![0u8; CHUNK + BUFFER_ALIGN];
    let skip = storage.as_ptr().align_offset(BUFFER_ALIGN);
    let buf = &mut storage[skip..skip + CHUNK];
    let mut copied = Copied::default();
    let mut began = Instant::now();
    let mut at = 0u64;
    while at < from.len {
        let len = (CHUNK as u64).min(from.len - at) as usize;
        let chunk = &mut buf[..len];
        read_exact_at(&file, chunk, from.start + at, device)?;
        copied.read += len as u64;
        if chunk.iter().any(|&b| b != 0) {
            file.write_all_at(chunk, to.start + at)
                .map_err(|e| Error::io("writing the new extent of", device, e))?;
            copied.written += len as u64;
        }
        at += len as u64;
        if at.is_multiple_of(GIB) || at == from.len {
            if began.elapsed() > per_gib {
                return Err(Error::Timeout {
                    what: "copying a partition",
                    device: device.to_owned(),
                    at: from.start + at,
                    after: per_gib,
                });
            }
            began = Instant::now();
        }
    }
    file.sync_all()
        .map_err(|e| Error::io("flushing the new extent of", device, e))?;
    Ok(copied)
}

fn overlap(a: Extent, b: Extent) -> bool {
    a.start < b.end() && b.start < a.end()
}

fn read_exact_at(file: &File, buf: &mut [u8], offset: u64, device: &Path) -> Result<()> {
    file.read_exact_at(buf, offset)
        .map_err(|e| Error::io("reading the old extent of", device, e))
}
