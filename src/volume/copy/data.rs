//! The data phase: every regular file's bytes (a hard-linked inode once), cut into units
//! of at most `chunk` bytes, copied by `streams` threads with large aligned `O_DIRECT`
//! reads and writes (buffered where a filesystem refuses `O_DIRECT` with EINVAL). Only
//! the data regions are copied (`SEEK_DATA`/`SEEK_HOLE`): holes stay holes, since the
//! target file was made at its full size by `ftruncate` and never written there, or cut
//! to it. A source that cannot report its holes (NFS before v4.2 has no SEEK, so every
//! byte is "data") still keeps them: in a file whose allocated blocks are fewer than its
//! size, blocks that read as zeros are not written (`copy_range`), and where the source's
//! data regions are known (`Extents`, a snapshot's manifest) only those are read. A file
//! of one piece is made, copied and finished by one stream (`copy_whole_file`).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, Mode};
use nix::unistd::{lseek, Whence};

use super::progress::Progress;
use super::walk::{kind_of, open_beneath, Entry, Kind};
use crate::error::{Error, Result};

/// O_DIRECT alignment: the largest logical block size of the devices met (4 KiB NVMe).
pub(crate) const ALIGN: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// Index into the walk's entries.
    pub entry: usize,
    pub offset: u64,
    pub len: u64,
    /// The file's only unit: the stream makes the file, copies it and sets its metadata
    /// in one go (`copy_whole_file`).
    pub whole: bool,
}

/// The length files are cut at for `total` bytes on `streams` streams: short enough that
/// every stream has pieces to copy (a tree of two 32 MiB files cut at 64 MiB kept two of
/// four streams idle: half the source's read rate on the VM rig), at least one buffer,
/// at most `max`.
pub fn piece_len(total: u64, streams: usize, max: u64) -> u64 {
    let buffer = super::BUFFER as u64;
    let even = (total / (streams.max(1) as u64 * 4)).next_multiple_of(buffer);
    even.clamp(buffer.min(max), max)
}

/// The units of every file in `primaries` (entry indices, in walk order). A file of at
/// most `chunk` bytes (an empty one too) is one unit, copied whole.
pub fn units(entries: &[Entry], primaries: &[usize], chunk: u64) -> Vec<Unit> {
    let mut out = Vec::new();
    for &entry in primaries {
        let size = entries[entry].size();
        let mut offset = 0;
        loop {
            let len = chunk.min(size - offset);
            let whole = len == size;
            out.push(Unit {
                entry,
                offset,
                len,
                whole,
            });
            offset += len;
            if offset >= size {
                break;
            }
        }
    }
    out
}

/// The entries of the files `units` copies whole.
pub fn whole_files(units: &[Unit]) -> std::collections::HashSet<usize> {
    units.iter().filter(|u| u.whole).map(|u| u.entry).collect()
}

/// Where each file with holes holds data, `[start, end)` ascending and apart, with the
/// file's size then, as a snapshot recorded them: a store that cannot tell its holes (NFS
/// before v4.2) would otherwise be read whole, zeros and all.
pub type Extents = std::collections::HashMap<std::path::PathBuf, (u64, Vec<(u64, u64)>)>;

pub struct Roots<'a> {
    pub src: BorrowedFd<'a>,
    pub dst: BorrowedFd<'a>,
    pub shown: &'a Path,
    /// The source may change meanwhile (`CopyRequest::live`): a file removed or cut
    /// shorter since the walk is left as far as it got; the frozen pass copies it again.
    pub live: bool,
    /// The source's filesystem has extended attributes (`meta::has_xattrs`).
    pub xattrs: bool,
    /// The source's data regions where known (`CopyRequest::extents`).
    pub extents: Option<&'a Extents>,
}

impl<'a> Roots<'a> {
    pub fn new(src: BorrowedFd<'a>, dst: BorrowedFd<'a>, shown: &'a Path, live: bool) -> Self {
        Roots {
            src,
            dst,
            shown,
            live,
            xattrs: super::meta::has_xattrs(src),
            extents: None,
        }
    }

    /// The next data region of `entry`'s source file `fd` in `[from, end)`: from its
    /// recorded extents where there are some for a file of its size, else as the
    /// source's filesystem says.
    fn next_data(
        &self,
        entry: &Entry,
        fd: BorrowedFd<'_>,
        (from, end): (u64, u64),
    ) -> nix::Result<Option<(u64, u64)>> {
        match self.extents.and_then(|x| x.get(&entry.rel)) {
            Some((size, known)) if *size == entry.size() => Ok(next_known(known, from, end)),
            _ => next_data(fd, from, end),
        }
    }
}

/// The first of `known` extents reaching past `from`, cut to `[from, end)` and aligned out
/// to `ALIGN` as [`next_data`] answers.
fn next_known(known: &[(u64, u64)], from: u64, end: u64) -> Option<(u64, u64)> {
    let &(start, stop) = known.iter().find(|&&(_, stop)| stop > from)?;
    let data = (start / ALIGN as u64 * ALIGN as u64).max(from);
    (data < end).then_some((data, stop.min(end)))
}

/// Copies `units[start..]` but those in `done` (finished by an earlier run) on `streams`
/// threads; the progress watermark moves past every unit finished with all units before
/// it, and the record keeps those finished above it. The first error stops every stream.
pub fn copy_units(
    roots: &Roots<'_>,
    entries: &[Entry],
    units: &[Unit],
    (start, done): (usize, &[usize]),
    streams: usize,
    progress: &Progress,
) -> Result<()> {
    let next = AtomicUsize::new(start);
    let stop = AtomicBool::new(false);
    let skip: BTreeSet<usize> = done.iter().copied().filter(|&i| i >= start).collect();
    let finished = Mutex::new((start, progress.saved().copied_bytes, skip.clone()));
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..streams.max(1) {
            s.spawn(|| {
                let mut buf = AlignedBuf::new(super::BUFFER);
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(unit) = units.get(i) else { break };
                    if skip.contains(&i) {
                        continue;
                    }
                    let entry = &entries[unit.entry];
                    let copied = match unit.whole {
                        true => copy_whole_file(roots, entry, &mut buf, progress),
                        false => copy_unit(roots, entry, unit, &mut buf, progress),
                    };
                    let done = copied.and_then(|()| finish(&finished, units, i, progress));
                    if let Err(e) = done {
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

type Finished = Mutex<(usize, u64, BTreeSet<usize>)>;

fn finish(finished: &Finished, units: &[Unit], i: usize, progress: &Progress) -> Result<()> {
    let mut f = finished.lock().unwrap_or_else(|p| p.into_inner());
    let (watermark, copied, done) = &mut *f;
    done.insert(i);
    while done.remove(watermark) {
        *copied += units[*watermark].len;
        *watermark += 1;
    }
    progress.advance_past(*watermark, *copied, done.iter().copied().collect())
}

/// A heap buffer whose usable part starts on an `ALIGN` boundary (found with
/// `align_offset`, no unsafe allocation).
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN);
        AlignedBuf { raw, start, len }
    }
    pub(crate) fn get(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

fn copy_unit(
    roots: &Roots<'_>,
    entry: &Entry,
    unit: &Unit,
    buf: &mut AlignedBuf,
    progress: &Progress,
) -> Result<()> {
    if unit.len == 0 {
        return Ok(());
    }
    match copy_unit_as(roots, entry, unit, buf, progress, true) {
        // A filesystem or device that takes O_DIRECT only at other alignments.
        Err(Errno::EINVAL) => copy_unit_as(roots, entry, unit, buf, progress, false),
        Err(Errno::ENOENT | Errno::ENODATA | Errno::ELOOP | Errno::ENOTDIR) if roots.live => Ok(()),
        other => other,
    }
    .map_err(|e| Error::io("copy", roots.shown.join(&entry.rel), e.into()))
}

/// `rel` beneath `root` opened with `flags`, `O_DIRECT` where the filesystem takes it.
fn open_side(root: BorrowedFd<'_>, rel: &Path, flags: OFlag, direct: bool) -> nix::Result<File> {
    let opened = match open_beneath(root, rel, flags | direct_flag(direct), Mode::empty()) {
        Err(Errno::EINVAL) if direct => open_beneath(root, rel, flags, Mode::empty()),
        other => other,
    };
    opened.map(File::from)
}

fn direct_flag(direct: bool) -> OFlag {
    match direct {
        true => OFlag::O_DIRECT,
        false => OFlag::empty(),
    }
}

fn open_pair(roots: &Roots<'_>, rel: &Path, direct: bool) -> nix::Result<(File, File)> {
    let src = open_side(roots.src, rel, OFlag::O_RDONLY, direct)?;
    let dst = open_side(roots.dst, rel, OFlag::O_WRONLY, direct)?;
    Ok((src, dst))
}

/// `O_DIRECT` set on a file opened without it; left buffered where its filesystem refuses.
fn set_direct(f: &File) -> nix::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let flags = OFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFL)?);
    match fcntl(f, FcntlArg::F_SETFL(flags | OFlag::O_DIRECT)) {
        Ok(_) | Err(Errno::EINVAL) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A file copied whole by one stream, from its making to its metadata (`Unit::whole`).
/// On an NFS target every step is a round trip: made this way a small file costs an open,
/// its writes, one attribute change (its times) and a close, where making it, copying it
/// and finishing it in three phases opened it three times. Its size is checked on the
/// open copy, which is what the verification's size check would read.
fn copy_whole_file(
    roots: &Roots<'_>,
    entry: &Entry,
    buf: &mut AlignedBuf,
    progress: &Progress,
) -> Result<()> {
    let shown = roots.shown.join(&entry.rel);
    let copied = match copy_whole_as(roots, entry, buf, progress, true) {
        // A filesystem or device that takes O_DIRECT only at other alignments.
        Err(Errno::EINVAL) => copy_whole_as(roots, entry, buf, progress, false),
        other => other,
    };
    let (copy, st, xattrs) = match copied {
        Ok(done) => done,
        Err(Errno::ENOENT | Errno::ENODATA | Errno::ELOOP | Errno::ENOTDIR) if roots.live => {
            return Ok(())
        }
        Err(e) => return Err(Error::io("copy", shown, e.into())),
    };
    if st.st_size != entry.st.st_size {
        return Err(crate::error::CopyError::Differs {
            copy: shown.display().to_string(),
            at: format!(": {} bytes instead of {}", st.st_size, entry.st.st_size),
        }
        .into());
    }
    // Read back as the verification would (nothing is verified of a live source).
    match xattrs {
        Some(want) if !roots.live => {
            super::verify::copy_has_xattrs(&want, &copy, roots.shown, entry)
        }
        _ => Ok(()),
    }
}

/// [`copy_whole_file`]'s steps, `O_DIRECT` on both sides where `direct` and the
/// filesystems take it: the copy, open, its stat once its metadata is set, and the
/// source's copied attributes where it has any (`meta::set_file_metadata`). The copy
/// is made before the source is opened: in a live copy a source file gone since the walk
/// leaves it empty, as the frozen pass expects of every name the walk found.
fn copy_whole_as(
    roots: &Roots<'_>,
    entry: &Entry,
    buf: &mut AlignedBuf,
    progress: &Progress,
    direct: bool,
) -> nix::Result<(File, FileStat, Option<super::meta::XattrMap>)> {
    let (dst, made_now) = super::meta::create_file(roots.dst, entry)?;
    let made = fstat(&dst)?;
    if kind_of(&made) != Kind::File {
        return Err(Errno::EEXIST);
    }
    let src = open_side(roots.src, &entry.rel, OFlag::O_RDONLY, direct)?;
    if direct {
        set_direct(&dst)?;
    }
    let size = entry.size();
    let (mut at, mut end) = (0, 0);
    while let Some((data, hole)) = roots.next_data(entry, src.as_fd(), (at, size))? {
        end = copy_range(&src, &dst, (data, hole), entry.has_holes(), buf, progress)?;
        at = hole;
        if at >= size {
            break;
        }
    }
    // Blocks padded past the size, holes at the end, or a longer copy of a run cut short.
    if !made_now || end != size {
        nix::unistd::ftruncate(&dst, entry.st.st_size)?;
    }
    let xattrs = super::meta::set_file_metadata(roots.src, &dst, entry, roots.xattrs, &made)?;
    let st = fstat(&dst)?;
    Ok((dst, st, xattrs))
}

fn copy_unit_as(
    roots: &Roots<'_>,
    entry: &Entry,
    unit: &Unit,
    buf: &mut AlignedBuf,
    progress: &Progress,
    direct: bool,
) -> nix::Result<()> {
    let (src, dst) = open_pair(roots, &entry.rel, direct)?;
    let end = unit.offset + unit.len;
    let mut at = unit.offset;
    while at < end {
        let Some((data, hole)) = roots.next_data(entry, src.as_fd(), (at, end))? else {
            break;
        };
        copy_range(&src, &dst, (data, hole), entry.has_holes(), buf, progress)?;
        at = hole;
    }
    if end == entry.size() {
        // The last unit cuts the whole blocks O_DIRECT wrote back to the file's size
        // (the other units never write past their own end).
        nix::unistd::ftruncate(&dst, entry.st.st_size)?;
    }
    Ok(())
}

/// The next data region in `[from, end)`, aligned out to `ALIGN` (never before `from`,
/// which is aligned); None when only a hole is left.
pub(crate) fn next_data(
    fd: BorrowedFd<'_>,
    from: u64,
    end: u64,
) -> nix::Result<Option<(u64, u64)>> {
    let data = match lseek(fd, from as i64, Whence::SeekData) {
        Ok(d) => d as u64,
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(e),
    };
    if data >= end {
        return Ok(None);
    }
    let hole = lseek(fd, data as i64, Whence::SeekHole)? as u64;
    let data = (data / ALIGN as u64 * ALIGN as u64).max(from);
    Ok(Some((data, hole.min(end))))
}

/// Copies `[from, to)`; returns the end of what was written (past `to` where the tail was
/// padded to whole blocks; `from` where nothing was). `holes`: the source file has holes by
/// its own account (`Entry::has_holes`, as `cp --sparse=auto` decides), so blocks that read
/// as zeros are left unwritten; a dense file of zeros stays allocated (a file someone
/// preallocated keeps its blocks).
fn copy_range(
    src: &File,
    dst: &File,
    (from, to): (u64, u64),
    holes: bool,
    buf: &mut AlignedBuf,
    progress: &Progress,
) -> nix::Result<u64> {
    let (mut at, mut end) = (from, from);
    while at < to {
        let want = ((to - at) as usize).min(buf.len);
        // O_DIRECT: whole aligned blocks; a file's tail reads short.
        let padded = want.div_ceil(ALIGN) * ALIGN;
        let cap = buf.len;
        let b = &mut buf.get()[..padded.min(cap)];
        let n = read_full(src, b, at)?;
        if n == 0 {
            return Err(Errno::ENODATA);
        }
        let n = n.min(want);
        let written = match holes {
            false => Some(write_tail(dst, b, n, at)?),
            true => write_nonzero(dst, b, n, at)?,
        };
        if let Some(w) = written {
            end = at + w as u64;
        }
        progress.moved(n as u64);
        at += n as u64;
    }
    Ok(end)
}

/// Writes the runs of `b[..n]` (read at `at`, a block boundary) that are not whole zero
/// blocks; returns the end of the last run written relative to `at`, None when every
/// block was zeros.
fn write_nonzero(dst: &File, b: &mut [u8], n: usize, at: u64) -> nix::Result<Option<usize>> {
    let blocks = n.div_ceil(ALIGN);
    let zero = |i: usize, b: &[u8]| {
        b[i * ALIGN..((i + 1) * ALIGN).min(n)]
            .iter()
            .all(|&x| x == 0)
    };
    let (mut i, mut last) = (0, None);
    while i < blocks {
        if zero(i, b) {
            i += 1;
            continue;
        }
        let start = i;
        while i < blocks && !zero(i, b) {
            i += 1;
        }
        let (s, e) = (start * ALIGN, (i * ALIGN).min(n));
        last = Some(s + write_tail(dst, &mut b[s..], e - s, at + s as u64)?);
    }
    Ok(last)
}

/// Writes `b[..n]` at `at`: as it is (NFS takes any length, O_DIRECT or not, and a file
/// so written needs no cut to its size), else as whole blocks where O_DIRECT wants them,
/// the bytes past `n` zeroed (cut later to the file's size). Returns the bytes written.
fn write_tail(dst: &File, b: &mut [u8], n: usize, at: u64) -> nix::Result<usize> {
    if n.is_multiple_of(ALIGN) {
        return write_full(dst, &b[..n], at).map(|()| n);
    }
    match write_full(dst, &b[..n], at) {
        Err(Errno::EINVAL) => {
            let out = (n.div_ceil(ALIGN) * ALIGN).min(b.len());
            b[n..out].fill(0);
            write_full(dst, &b[..out], at).map(|()| out)
        }
        other => other.map(|()| n),
    }
}

pub(crate) fn read_full(f: &File, buf: &mut [u8], at: u64) -> nix::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))),
        }
        // O_DIRECT returns short only at the end of the file.
        if got % ALIGN != 0 {
            break;
        }
    }
    Ok(got)
}

pub(crate) fn write_full(f: &File, buf: &[u8], at: u64) -> nix::Result<()> {
    f.write_all_at(buf, at)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_start_on_a_block() {
        let mut b = AlignedBuf::new(3 * ALIGN);
        assert_eq!(b.get().as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.get().len(), 3 * ALIGN);
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn known_extents_give_the_data_regions_within_a_range() {
        let known = [(0, 5000), (3 * MIB, 3 * MIB + 10), (8 * MIB, 9 * MIB)];
        assert_eq!(next_known(&known, 0, 4 * MIB), Some((0, 5000)));
        // Past the first: the next one, its start aligned down but never before `from`.
        assert_eq!(
            next_known(&known, 8192, 4 * MIB),
            Some((3 * MIB, 3 * MIB + 10))
        );
        assert_eq!(next_known(&known, 4096, 4 * MIB), Some((4096, 5000)));
        // A range that ends before the next extent, or after the last: nothing.
        assert_eq!(next_known(&known, 4 * MIB, 8 * MIB), None);
        assert_eq!(next_known(&known, 9 * MIB, 12 * MIB), None);
        // Cut at the range's end.
        assert_eq!(
            next_known(&known, 8 * MIB, 8 * MIB + 4096),
            Some((8 * MIB, 8 * MIB + 4096))
        );
        assert_eq!(next_known(&[], 0, MIB), None);
    }

    #[test]
    fn pieces_keep_every_stream_busy_within_one_buffer_and_the_limit() {
        let buffer = crate::volume::copy::BUFFER as u64;
        assert_eq!(buffer, 4 * MIB);
        // Two 32 MiB files and some: one buffer a piece, 22 pieces for 8 streams.
        assert_eq!(piece_len(90 * MIB, 8, 64 * MIB), buffer);
        // A large dataset: the limit.
        assert_eq!(piece_len(28 << 30, 8, 64 * MIB), 64 * MIB);
        // In between: a multiple of the buffer, four pieces a stream.
        assert_eq!(piece_len(1 << 30, 8, 64 * MIB), 32 * MIB);
        assert_eq!(piece_len(500 * MIB, 8, 64 * MIB), 16 * MIB);
        // A limit below one buffer is kept (the engine's tests cut small).
        assert_eq!(piece_len(90 * MIB, 3, 2 * MIB), 2 * MIB);
        assert_eq!(piece_len(0, 8, 64 * MIB), buffer);
    }
}
