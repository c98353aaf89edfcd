//! Raw block clones: the source device's bytes `[0, bytes)` copied onto the clone's
//! device with large aligned `O_DIRECT` reads and writes on several streams (buffered
//! where a device refuses an I/O's alignment with EINVAL), the clone's bytes past them
//! zeroed where its layout may have left an earlier tenant's, synced, and verified before
//! the clone may be published.
//!
//! The progress record is the file copy's (`Saved`): the device cut in pieces, every
//! piece below the watermark copied, so a restarted driver resumes. Both devices are
//! opened `O_EXCL` (a mount, mkfs or another exclusive open of either fails meanwhile)
//! and each descriptor must be the device number its caller verified as the volume's,
//! so a node renamed between the check and the open is never written.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::stat::{fstat, makedev, SFlag};

use super::data::{read_full, write_full, AlignedBuf};
use super::{Progress, Saved, Verify};
use crate::disk::gpt::{kernel, Extent};
use crate::error::{CopyError, Error, Result};

/// Each 1 GiB of the zero-out past the source's bytes must finish within this.
const ZERO_CHUNK_DEADLINE: Duration = Duration::from_secs(120);

/// A volume's block device as its caller verified it: the node and its number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAt {
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// A snapshot's image of a device: a regular file stands for the source device
    /// (no device number to check, no exclusive open).
    pub image: bool,
}

impl DeviceAt {
    /// A snapshot's image file as a copy's source.
    pub fn image(path: PathBuf) -> DeviceAt {
        DeviceAt {
            path,
            major: 0,
            minor: 0,
            image: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RawCopyRequest {
    pub source: DeviceAt,
    pub target: DeviceAt,
    /// Bytes copied from the start of the source: its volume's capacity.
    pub bytes: u64,
    /// The target's bytes past `bytes` are zeroed here: its layout does not zero a new
    /// volume, so they may hold an earlier tenant's data.
    pub zero_tail: bool,
    /// How the source is named in the progress record and message.
    pub label: String,
    pub streams: usize,
    /// The longest piece one stream copies at a time (`copy::piece_len`).
    pub chunk: u64,
    pub verify: Verify,
}

/// One device, opened for the copy.
struct Opened {
    /// `O_DIRECT | O_EXCL`: the copy's own I/O, and the hold that keeps others out.
    direct: File,
    /// The same node without `O_DIRECT`, for an I/O the device refuses to take direct.
    buffered: File,
    size: u64,
    path: PathBuf,
}

impl Opened {
    fn open(dev: &DeviceAt, write: bool, what: &str) -> Result<Opened> {
        let direct = OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_DIRECT | libc::O_EXCL)
            .open(&dev.path);
        // A filesystem that takes no O_DIRECT (tmpfs before 6.6) serves an image buffered.
        let direct = match direct {
            Err(e) if dev.image && e.raw_os_error() == Some(libc::EINVAL) => {
                OpenOptions::new().read(true).write(write).open(&dev.path)
            }
            other => other,
        }
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => CopyError::InUse {
                what: format!("the {what} device {}", dev.path.display()),
                uses: "mounted, or opened exclusively by mkfs or another copy".into(),
                fix: "a raw clone is copied only between devices nothing uses: stop what \
                          uses it; the kubelet's retry then copies",
            }
            .into(),
            _ => Error::io("opening", &dev.path, e),
        })?;
        let buffered = OpenOptions::new()
            .read(true)
            .write(write)
            .open(&dev.path)
            .map_err(|e| Error::io("opening", &dev.path, e))?;
        for file in [&direct, &buffered] {
            is_the_device(file, dev, what)?;
        }
        let size = (&direct)
            .seek(SeekFrom::End(0))
            .map_err(|e| Error::io("measuring", &dev.path, e))?;
        Ok(Opened {
            direct,
            buffered,
            size,
            path: dev.path.clone(),
        })
    }

    /// `op` on the direct descriptor; on the buffered one where the device answers
    /// EINVAL (an offset or length off its logical block size).
    fn io<T>(
        &self,
        mut op: impl FnMut(&File) -> nix::Result<T>,
        context: &'static str,
    ) -> Result<T> {
        match op(&self.direct) {
            Err(Errno::EINVAL) => op(&self.buffered),
            other => other,
        }
        .map_err(|e| Error::io(context, &self.path, e.into()))
    }
}

/// The open descriptor is the block device the caller verified, not whatever the path
/// names after a rename.
fn is_the_device(file: &File, dev: &DeviceAt, what: &str) -> Result<()> {
    let st = fstat(file).map_err(|e| Error::io("stat", &dev.path, e.into()))?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if dev.image && kind == SFlag::S_IFREG {
        return Ok(());
    }
    let block = kind == SFlag::S_IFBLK;
    if block && st.st_rdev == makedev(dev.major.into(), dev.minor.into()) {
        return Ok(());
    }
    Err(CopyError::DeviceMoved {
        path: dev.path.clone(),
        what: what.to_owned(),
        major: dev.major,
        minor: dev.minor,
    }
    .into())
}

/// Copies `req.source`'s first `req.bytes` onto `req.target` (blocking), resuming from
/// what `progress`'s record says was done, zeroes the target past them when asked, syncs
/// and verifies. Done already: returns at once.
pub fn copy_device(req: &RawCopyRequest, progress: &Progress) -> Result<()> {
    let started = Instant::now();
    let src = Opened::open(&req.source, false, "source")?;
    let dst = Opened::open(&req.target, true, "clone")?;
    check_both_hold(req, &src, &dst)?;
    let pieces = Pieces::of(req);
    let mut saved = resume_or_start(req, &pieces, progress)?;
    if saved.done {
        return Ok(());
    }
    copy_pieces(&src, &dst, &pieces, req.streams, &saved, progress)?;
    let copied_secs = started.elapsed().as_secs_f64();
    saved = progress.saved();
    (saved.watermark, saved.copied_bytes) = (pieces.count, req.bytes);
    progress.set(saved.clone())?;
    if req.zero_tail && dst.size > req.bytes {
        zero_past_source(&dst, req.bytes)?;
    }
    // One page cache serves every descriptor of a device: this flushes the buffered
    // writes too, and the device's own write cache.
    dst.direct
        .sync_data()
        .map_err(|e| Error::io("syncing", &dst.path, e))?;
    if req.verify == Verify::Checksum {
        in_parallel(0, pieces.count, req.streams, 2, |i, bufs| {
            compare_span(&src, &dst, pieces.span(i), bufs, &req.label)
        })?;
    }
    saved.done = true;
    progress.set(saved)?;
    let secs = started.elapsed().as_secs_f64();
    log_finished(req, &dst, pieces.len, copied_secs, secs);
    Ok(())
}

/// Both devices hold at least the bytes to copy.
fn check_both_hold(req: &RawCopyRequest, src: &Opened, dst: &Opened) -> Result<()> {
    for (dev, what) in [(src, "source"), (dst, "clone")] {
        if dev.size < req.bytes {
            return Err(CopyError::DeviceTooSmall {
                what,
                path: dev.path.clone(),
                size: dev.size,
                bytes: req.bytes,
            }
            .into());
        }
    }
    Ok(())
}

/// The bytes to copy cut in `count` pieces of `len` (the last one maybe shorter).
struct Pieces {
    len: u64,
    count: usize,
    bytes: u64,
}

impl Pieces {
    fn of(req: &RawCopyRequest) -> Pieces {
        let len = super::data::piece_len(req.bytes, req.streams, req.chunk);
        Pieces {
            len,
            count: req.bytes.div_ceil(len) as usize,
            bytes: req.bytes,
        }
    }

    /// Piece `i`'s bytes, `[from, to)`.
    fn span(&self, i: usize) -> (u64, u64) {
        let from = i as u64 * self.len;
        (from, (from + self.len).min(self.bytes))
    }
}

/// The record to go on from, stored before anything is copied: the saved one when it
/// describes this same copy, else a fresh one.
fn resume_or_start(req: &RawCopyRequest, pieces: &Pieces, progress: &Progress) -> Result<Saved> {
    let fresh = Saved {
        source: req.label.clone(),
        total_bytes: req.bytes,
        piece: pieces.len,
        structure_done: true,
        ..Saved::default()
    };
    let same = |s: &Saved| {
        (&s.source, s.total_bytes, s.piece, s.entries) == (&req.label, req.bytes, pieces.len, 0)
    };
    let saved = Saved::load(progress.path())?.filter(same).unwrap_or(fresh);
    progress.set(saved.clone())?;
    Ok(saved)
}

/// Copies the pieces from the record's watermark on. The watermark moves past a piece
/// only once every piece below it is done too, so a restart never skips one unfinished.
fn copy_pieces(
    src: &Opened,
    dst: &Opened,
    pieces: &Pieces,
    streams: usize,
    saved: &Saved,
    progress: &Progress,
) -> Result<()> {
    let finished = Mutex::new((saved.watermark, saved.copied_bytes, BTreeSet::new()));
    in_parallel(saved.watermark, pieces.count, streams, 1, |i, bufs| {
        copy_span(src, dst, pieces.span(i), &mut bufs[0], progress)?;
        let mut f = finished.lock().unwrap_or_else(|p| p.into_inner());
        let (watermark, copied, done) = &mut *f;
        done.insert(i);
        while done.remove(watermark) {
            let (from, to) = pieces.span(*watermark);
            *copied += to - from;
            *watermark += 1;
        }
        progress.advance(*watermark, *copied)
    })
}

/// Zeroes the clone past the source's `bytes`: its layout may have left an earlier
/// tenant's data there.
fn zero_past_source(dst: &Opened, bytes: u64) -> Result<()> {
    let tail = Extent {
        start: bytes,
        len: dst.size - bytes,
    };
    let what = "zeroing the clone past its source's bytes";
    kernel::zero_extent(&dst.direct, &dst.path, what, tail, ZERO_CHUNK_DEADLINE).map_err(
        |e| match e {
            crate::disk::gpt::Error::Io { source, .. } => Error::io(what, &dst.path, source),
            e => Error::Label(e),
        },
    )
}

fn log_finished(req: &RawCopyRequest, dst: &Opened, piece: u64, copied_secs: f64, secs: f64) {
    tracing::info!(
        source = %req.label,
        target = %dst.path.display(),
        bytes = req.bytes,
        zeroed_past_source = if req.zero_tail { dst.size - req.bytes } else { 0 },
        piece,
        streams = req.streams,
        copy_seconds = format!("{copied_secs:.2}"),
        seconds = format!("{secs:.2}"),
        verify = ?req.verify,
        "raw copy finished"
    );
}

/// `f` on pieces `first..count`, on `streams` threads, each with `buffers` buffers of
/// its own; the first error stops every stream and is the answer.
fn in_parallel(
    first: usize,
    count: usize,
    streams: usize,
    buffers: usize,
    f: impl Fn(usize, &mut [AlignedBuf]) -> Result<()> + Sync,
) -> Result<()> {
    let next = AtomicUsize::new(first);
    let stop = AtomicBool::new(false);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..streams.max(1).min(count.saturating_sub(first).max(1)) {
            s.spawn(|| {
                let mut bufs: Vec<AlignedBuf> = (0..buffers)
                    .map(|_| AlignedBuf::new(super::BUFFER))
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    if let Err(e) = f(i, &mut bufs) {
                        stop.store(true, Ordering::Relaxed);
                        first_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `buf.len()` bytes of `dev` at `at`; a short read is an error (the device was measured
/// to hold them).
fn read_span(dev: &Opened, buf: &mut [u8], at: u64) -> Result<()> {
    let n = dev.io(|f| read_full(f, buf, at), "copy")?;
    if n < buf.len() {
        return Err(Error::io(
            "copy",
            &dev.path,
            std::io::Error::from(Errno::ENODATA),
        ));
    }
    Ok(())
}

fn copy_span(
    src: &Opened,
    dst: &Opened,
    (from, to): (u64, u64),
    buf: &mut AlignedBuf,
    progress: &Progress,
) -> Result<()> {
    let mut at = from;
    while at < to {
        let len = ((to - at) as usize).min(super::BUFFER);
        let b = &mut buf.get()[..len];
        read_span(src, b, at)?;
        dst.io(|f| write_full(f, b, at), "copy")?;
        progress.moved(len as u64);
        at += len as u64;
    }
    Ok(())
}

/// Both devices read again over `[from, to)` and compared byte for byte.
fn compare_span(
    src: &Opened,
    dst: &Opened,
    (from, to): (u64, u64),
    bufs: &mut [AlignedBuf],
    label: &str,
) -> Result<()> {
    let [a, b] = bufs else {
        unreachable!("two buffers per stream")
    };
    let mut at = from;
    while at < to {
        let len = ((to - at) as usize).min(super::BUFFER);
        let (x, y) = (&mut a.get()[..len], &mut b.get()[..len]);
        read_span(src, x, at)?;
        read_span(dst, y, at)?;
        if let Some(off) = x.iter().zip(y.iter()).position(|(p, q)| p != q) {
            return Err(CopyError::Differs {
                copy: format!("{label} on {}", dst.path.display()),
                at: format!(" at byte {}", at + off as u64),
            }
            .into());
        }
        at += len as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_verified_block_device_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("image");
        std::fs::write(&file, b"not a device").unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let st = fstat(&null).unwrap();
        let number = |n: u64| u32::try_from(n).unwrap();
        let (major, minor) = (
            number(nix::sys::stat::major(st.st_rdev)),
            number(nix::sys::stat::minor(st.st_rdev)),
        );
        for (path, opened) in [
            (file.clone(), std::fs::File::open(&file).unwrap()),
            ("/dev/null".into(), null),
        ] {
            let dev = DeviceAt {
                path,
                major,
                minor,
                image: false,
            };
            let err = is_the_device(&opened, &dev, "source").unwrap_err();
            assert!(
                err.to_string().contains(&format!(
                    "is no longer the source volume's device {major}:{minor}; nothing was copied"
                )),
                "{err}"
            );
        }
    }
}
