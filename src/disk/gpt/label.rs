//! A device's label as read from disk: blank, ours (carvable) or foreign (never
//! touched), and the writes that change it. Writes go through the page cache and are
//! flushed with fsync; partitions may be mounted meanwhile (their data lies in other
//! blocks, 1 MiB aligned, and the whole-disk cache never holds them).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::format::{
    self as gpt, Entry, Header, Label, Mbr, ENTRIES, ENTRIES_BEFORE, ENTRY_SIZE, TYPE_GUID,
};
use super::{wholedisk, Error, Result};

/// Proof that the full signature probe of a device found nothing on it. The only way to
/// get a new label written: the caller probes (the host port's `probe_signatures`) and
/// hands its result here; [`create`] checks again for a partition table itself.
#[derive(Debug, Clone)]
pub struct Blank {
    device: PathBuf,
}

impl Blank {
    /// `Some` when the probe of `device` found no signature at all.
    pub fn from_signature_probe<S>(device: &Path, found: &[S]) -> Option<Blank> {
        found.is_empty().then(|| Blank {
            device: device.to_owned(),
        })
    }
}

/// What a device holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDisk {
    /// No MBR boot signature and no GPT header at either end.
    Blank,
    /// A label gds-csi wrote; `repair` says why one copy is stale or damaged (the next
    /// write rewrites both).
    Ours {
        label: Label,
        repair: Option<String>,
    },
    /// Anything else, with the reason; never changed.
    Foreign(String),
}

/// A device's logical sector size and size in bytes.
pub fn geometry(file: &File, device: &Path) -> Result<(u64, u64)> {
    let mut sector: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int (block/ioctl.c: put_int(argp,
    // bdev_logical_block_size(bdev))); `sector` is a live, writable int.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut sector) };
    if rc != 0 {
        return Err(Error::io(
            "reading the sector size (BLKSSZGET) of",
            device,
            std::io::Error::last_os_error(),
        ));
    }
    let mut f = file;
    let size = f
        .seek(SeekFrom::End(0))
        .map_err(|e| Error::io("measuring", device, e))?;
    Ok((sector as u64, size))
}

/// How long a write waits for another program's lock on the device.
const LOCK_PATIENCE: Duration = Duration::from_secs(5);

/// Opens `device`; for a write, takes the BSD lock that partitioning tools and udev
/// honour (LOCK_EX on the whole disk, `wholedisk`), unless this thread holds it already
/// (a step under `wholedisk::settled`: then this descriptor is closed, and udevd told
/// of the write, while the step's lock still holds). The lock goes with the descriptor.
fn open(device: &Path, write: bool) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .open(device)
        .map_err(|e| Error::io("opening", device, e))?;
    if write && !wholedisk::held_here(&file) {
        wholedisk::flock_patiently(&file, device, LOCK_PATIENCE)?;
    }
    Ok(file)
}

/// Reads and classifies the label of a block device.
pub fn read(device: &Path) -> Result<OnDisk> {
    let file = open(device, false)?;
    // Only the two ends are read: readahead would fetch (and the last close drop again)
    // pages no one reads. Advice only, so its failure changes nothing.
    let _ = nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
    );
    let (sector, size) = geometry(&file, device)?;
    read_image(&file, sector, size).map_err(|e| Error::io("reading the label of", device, e))
}

/// Positioned reads from a device, a regular file, or bytes in memory (the fuzz target).
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// Reads and classifies the label of an image (a device, a regular file, bytes) of
/// `size` bytes in sectors of `sector` bytes.
pub fn read_image<R>(file: &R, sector: u64, size: u64) -> std::io::Result<OnDisk>
where
    R: ReadAt + ?Sized,
{
    let sectors = size / sector;
    if sectors < 3 {
        return Ok(OnDisk::Foreign(format!(
            "{size} bytes is too small for GPT"
        )));
    }
    let file = &Ends::read(file, sector, sectors)?;
    let at = |lba: u64, len: u64| read_at(file, lba * sector, len);
    let mbr = gpt::mbr_kind(&at(0, sector)?);
    let last = sectors - 1;
    let (s1, sl) = (at(1, sector)?, at(last, sector)?);
    let signed = |s: &[u8]| &s[0..8] == gpt::SIGNATURE;
    if mbr == Mbr::Absent && !signed(&s1) && !signed(&sl) {
        return Ok(OnDisk::Blank);
    }
    if mbr == Mbr::Other {
        return Ok(OnDisk::Foreign(
            "LBA 0 holds an MBR partition table or boot code, not a protective MBR".into(),
        ));
    }
    let primary = read_copy(file, &s1, 1, sector, sectors)?;
    let backup = read_copy(file, &sl, last, sector, sectors)?;
    if let (Err(_), Ok(b)) = (&primary, &backup) {
        let entries = b.slots.len();
        let area = at(
            2,
            gpt::array_sectors(sector, entries).min(sectors - 3) * sector,
        )?;
        if let Err(why) = primary_area_ours(&s1, &area, b, sector as usize) {
            return Ok(OnDisk::Foreign(why));
        }
    }
    Ok(judge(primary, backup, mbr, sector, sectors))
}

/// A device's two ends read in one request each: the protective MBR, primary header and
/// a full-size entry array at the front, a full-size array and the backup header at the
/// back. A label of ours lies wholly inside them, so reading one costs two reads of the
/// device instead of five. Each goes to the device: the kernel drops a whole disk's page
/// cache at its last close (block/bdev.c: blkdev_put_whole -> blkdev_flush_mapping ->
/// kill_bdev), and nothing else keeps a pool device open. Anything outside the ends (a
/// foreign label's array placed elsewhere) is read from the device itself.
struct Ends<'a, R: ?Sized> {
    file: &'a R,
    head: Vec<u8>,
    tail_at: u64,
    tail: Vec<u8>,
}

impl<'a, R: ReadAt + ?Sized> Ends<'a, R> {
    fn read(file: &'a R, sector: u64, sectors: u64) -> std::io::Result<Self> {
        let array = gpt::array_sectors(sector, ENTRIES);
        let head = read_at(file, 0, (2 + array).min(sectors) * sector)?;
        let tail_sectors = (1 + array).min(sectors);
        let tail_at = (sectors - tail_sectors) * sector;
        let tail = read_at(file, tail_at, tail_sectors * sector)?;
        Ok(Ends {
            file,
            head,
            tail_at,
            tail,
        })
    }
}

impl<R: ReadAt + ?Sized> ReadAt for Ends<'_, R> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let len = buf.len();
        let held = within(&self.head, 0, offset, len)
            .or_else(|| within(&self.tail, self.tail_at, offset, len));
        match held {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => self.file.read_exact_at(buf, offset),
        }
    }
}

/// The `len` bytes at device offset `offset` of `part` (read from offset `at`), if it
/// holds them all.
fn within(part: &[u8], at: u64, offset: u64, len: usize) -> Option<&[u8]> {
    let start = usize::try_from(offset.checked_sub(at)?).ok()?;
    part.get(start..start.checked_add(len)?)
}

fn read_at<R: ReadAt + ?Sized>(file: &R, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// The copy whose header sits in `s` (read from LBA `lba`), with its entry array; the
/// inner error says why it is not valid.
fn read_copy<R: ReadAt + ?Sized>(
    file: &R,
    s: &[u8],
    lba: u64,
    sector: u64,
    sectors: u64,
) -> std::io::Result<std::result::Result<Copy, String>> {
    let h = match gpt::decode_header(s, lba) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    let array_sectors = h.array_bytes().div_ceil(sector);
    if h.entries_lba >= sectors || array_sectors > sectors - h.entries_lba {
        let why = format!("the entry array of LBA {lba} lies beyond the end");
        return Ok(Err(why));
    }
    let array = read_at(file, h.entries_lba * sector, h.array_bytes())?;
    if crc32fast::hash(&array) != h.entries_crc {
        return Ok(Err(format!("the entry array of LBA {lba} fails its CRC32")));
    }
    let slots = gpt::decode_entries(&array, h.entry_size as usize);
    Ok(Ok(Copy {
        header: h,
        slots,
        array,
    }))
}

/// With the primary copy invalid, the backup is trusted only if where the primary
/// belongs holds ours or nothing: a header of ours (its array torn by a crash), or a
/// zero header over an array area each sector of which is zero or the backup's (a first
/// label cut short). Anything else there, such as a filesystem made on the whole disk
/// later, makes the device foreign, so a repair never overwrites it.
fn primary_area_ours(
    s1: &[u8],
    area: &[u8],
    backup: &Copy,
    sector: usize,
) -> std::result::Result<(), String> {
    let foreign =
        || Err("the primary GPT is overwritten by something else (the backup is gds-csi's)".into());
    if let Ok(h) = gpt::decode_header(s1, 1) {
        return if h.disk_guid == backup.header.disk_guid {
            Ok(())
        } else {
            foreign()
        };
    }
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    if !zero(s1) {
        return foreign();
    }
    let mut theirs = backup.array.chunks(sector);
    for mine in area.chunks(sector) {
        let expected = theirs.next().unwrap_or(&[]);
        if !zero(mine) && mine != expected {
            return foreign();
        }
    }
    Ok(())
}

/// One decoded header with its CRC-checked entry array.
struct Copy {
    header: Header,
    slots: Vec<Option<Entry>>,
    array: Vec<u8>,
}

/// Picks the copy to trust (the primary when valid) and decides whether it is ours.
fn judge(
    primary: std::result::Result<Copy, String>,
    backup: std::result::Result<Copy, String>,
    mbr: Mbr,
    sector: u64,
    sectors: u64,
) -> OnDisk {
    let (chosen, mut repair) = match (primary, backup) {
        (Ok(p), Ok(b)) => {
            let same = p.header.disk_guid == b.header.disk_guid
                && p.header.entries_crc == b.header.entries_crc;
            let why = (!same).then(|| "the backup GPT differs from the primary".to_owned());
            (p, why)
        }
        (Ok(p), Err(e)) | (Err(e), Ok(p)) => (p, Some(e)),
        (Err(a), Err(b)) => return OnDisk::Foreign(format!("damaged GPT: {a}; {b}")),
    };
    if mbr == Mbr::Absent {
        repair.get_or_insert_with(|| "the protective MBR is missing".into());
    }
    match ours(chosen, sector, sectors) {
        Ok(label) => OnDisk::Ours { label, repair },
        Err(why) => OnDisk::Foreign(why),
    }
}

/// The label, if `c` is one gds-csi wrote for a device of this geometry.
fn ours(c: Copy, sector: u64, sectors: u64) -> std::result::Result<Label, String> {
    let h = &c.header;
    if !gpt::is_ours(&h.disk_guid) {
        return Err(format!(
            "a GPT written by another tool (disk GUID {})",
            h.disk_guid
        ));
    }
    let entries = h.entry_count as usize;
    if entries != ENTRIES && entries != ENTRIES_BEFORE {
        return Err(format!(
            "a gds-csi GPT of {entries} entries (this driver writes {ENTRIES} and reads \
             {ENTRIES_BEFORE} too)"
        ));
    }
    let fresh = Label::with_entries(sector, sectors, h.disk_guid, entries)?;
    if h.entry_size as usize != ENTRY_SIZE
        || h.first_usable != fresh.first_usable
        || h.last_usable != fresh.last_usable
    {
        return Err(format!(
            "a gds-csi GPT for a device of another size or format (usable LBAs {}..={}, \
             expected {}..={}); was the device resized?",
            h.first_usable, h.last_usable, fresh.first_usable, fresh.last_usable
        ));
    }
    let label = Label {
        slots: c.slots,
        ..fresh
    };
    check_entries(&label)?;
    Ok(label)
}

/// Every entry ours, inside the usable range, none overlapping.
fn check_entries(label: &Label) -> std::result::Result<(), String> {
    let mut spans: Vec<(u64, u64, u32)> = Vec::new();
    for (n, e) in label.partitions() {
        if e.type_guid != TYPE_GUID {
            return Err(format!(
                "partition {n} ({:?}) has type GUID {}, not gds-csi's",
                e.name, e.type_guid
            ));
        }
        if e.first_lba < label.first_usable
            || e.last_lba > label.last_usable
            || e.first_lba > e.last_lba
        {
            return Err(format!("partition {n} lies outside the usable range"));
        }
        spans.push((e.first_lba, e.last_lba, n));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 <= w[0].1 {
            return Err(format!("partitions {} and {} overlap", w[0].2, w[1].2));
        }
    }
    Ok(())
}

/// Writes `label` to an image (a device or a regular file) in [`Label::regions`] order,
/// each region flushed before the next, so every crash leaves one valid copy.
pub fn write_image(file: &File, label: &Label) -> std::io::Result<()> {
    for (offset, bytes) in label.regions() {
        file.write_all_at(&bytes, offset)?;
        file.sync_data()?;
    }
    Ok(())
}

/// Writes `label` to `device` after checking that the device holds our label of the same
/// disk GUID, so a device swapped under the path is never overwritten.
pub fn write(device: &Path, label: &Label) -> Result<()> {
    let file = open(device, true)?;
    let (sector, size) = geometry(&file, device)?;
    if (label.sector, label.sectors) != (sector, size / sector) {
        return Err(Error::Invalid(format!(
            "the label is for {} sectors of {} bytes; {} has {} of {sector}",
            label.sectors,
            label.sector,
            device.display(),
            size / sector
        )));
    }
    match read_image(&file, sector, size).map_err(|e| Error::io("reading", device, e))? {
        OnDisk::Ours { label: on_disk, .. } if on_disk.disk_guid == label.disk_guid => {}
        OnDisk::Ours { label: other, .. } => {
            return Err(Error::foreign(
                device,
                format!(
                    "it holds another gds-csi label (disk GUID {})",
                    other.disk_guid
                ),
            ))
        }
        OnDisk::Blank => return Err(Error::foreign(device, "it holds no label")),
        OnDisk::Foreign(why) => return Err(Error::foreign(device, why)),
    }
    write_image(&file, label).map_err(|e| Error::io("writing the label of", device, e))
}

/// Writes a new, empty label on a device proven blank, after checking again that it
/// holds no partition table, that the bytes the label overwrites are zero and that the
/// kernel shows no partitions of it. A create cut short by a crash leaves the device
/// blank or holding our label (to repair): read first, create only on [`OnDisk::Blank`].
pub fn create(device: &Path, proof: Blank) -> Result<Label> {
    if proof.device != device {
        return Err(Error::Invalid(format!(
            "the blank proof is for {}, not {}",
            proof.device.display(),
            device.display()
        )));
    }
    let file = open(device, true)?;
    let (sector, size) = geometry(&file, device)?;
    let not_blank = |why: String| Error::NotBlank {
        device: device.to_owned(),
        why,
    };
    match read_image(&file, sector, size).map_err(|e| Error::io("reading", device, e))? {
        OnDisk::Blank => {}
        OnDisk::Ours { .. } => return Err(not_blank("it already holds a gds-csi label".into())),
        OnDisk::Foreign(why) => return Err(not_blank(why)),
    }
    // What the label overwrites at the start must be zeros: every common signature
    // the caller's probe might have missed sits there (MBR, ext4 at 1024, xfs, LVM,
    // LUKS, swap, md 1.1/1.2), so a wrong proof still destroys nothing.
    let head = gpt::array_sectors(sector, ENTRIES) + 2;
    let mut bytes = vec![0u8; (head * sector) as usize];
    FileExt::read_exact_at(&file, &mut bytes, 0).map_err(|e| Error::io("reading", device, e))?;
    if let Some(at) = bytes.iter().position(|&b| b != 0) {
        return Err(not_blank(format!(
            "byte {at} of the first {} bytes, which the label would overwrite, is not zero \
             (zero them, e.g. `blkdiscard -z -l 1MiB`, if the old contents are not needed)",
            bytes.len()
        )));
    }
    let shown = super::kernel::sysfs::list(device)?;
    if let Some(p) = shown.first() {
        return Err(not_blank(format!("the kernel shows partition {}", p.name)));
    }
    let label = Label::new(sector, size / sector, gpt::new_disk_guid()).map_err(not_blank)?;
    write_image(&file, &label).map_err(|e| Error::io("writing the label of", device, e))?;
    Ok(label)
}
