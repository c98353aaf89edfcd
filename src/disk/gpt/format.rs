//! The GPT on-disk format (UEFI spec 2.10 §5.3): a protective MBR in LBA 0, the primary
//! header in LBA 1 and its entry array from LBA 2, the backup entry array and header at
//! the device's end, each header and array guarded by a CRC32 (IEEE, as zlib's).
//! Pure encoding and decoding on byte buffers; reading and writing devices is `label`'s.

use uuid::Uuid;

/// The partition type GUID of every gds-csi partition (generated for this project;
/// `sgdisk -p` shows it as an unknown type, blkid as `PART_ENTRY_TYPE`).
pub const TYPE_GUID: Uuid = Uuid::from_u128(0xb9c5aad4_bb0d_4593_a367_bf6d8fb72244);

/// The first six bytes of every disk GUID gds-csi writes (the rest random, UUID version
/// 8): the mark that tells a label we wrote, empty or not, from one another tool wrote.
const MARK: [u8; 6] = [0x04, 0x1a, 0x7c, 0x17, 0x9f, 0xf4];

pub const SIGNATURE: &[u8; 8] = b"EFI PART";
const REVISION: u32 = 0x0001_0000;
const HEADER_SIZE: usize = 92;
/// Entries in the array of a label gds-csi writes: as many partitions as the kernel
/// registers on one disk. `add_partition` refuses `partno >= DISK_MAX_PARTS`
/// (block/partitions/core.c) and `DISK_MAX_PARTS` is 256 (include/linux/blkdev.h), so
/// numbers 1..=255 are usable; the array is 32 KiB, whole sectors of 512 or 4096 bytes.
pub const ENTRIES: usize = 256;
/// Entries in the labels written before: the minimum the spec allows (16 KiB). Still
/// read, with their 128 partitions.
pub const ENTRIES_BEFORE: usize = 128;
/// The highest partition number the kernel registers (see [`ENTRIES`]).
pub const MAX_PARTITION_NUMBER: u32 = 255;
pub const ENTRY_SIZE: usize = 128;
/// UTF-16 code units of a partition name.
pub const NAME_UNITS: usize = 36;
/// The most entry-array bytes a foreign header may claim before it is judged damaged.
const MAX_ARRAY_BYTES: u64 = 1 << 20;

/// A fresh disk GUID carrying gds-csi's mark.
pub fn new_disk_guid() -> Uuid {
    let mut b = *Uuid::new_v4().as_bytes();
    b[..6].copy_from_slice(&MARK);
    b[6] = 0x80 | (b[6] & 0x0f);
    b[8] = 0x80 | (b[8] & 0x3f);
    Uuid::from_bytes(b)
}

/// Whether a disk GUID is one [`new_disk_guid`] made.
pub fn is_ours(disk_guid: &Uuid) -> bool {
    let b = disk_guid.as_bytes();
    b[..6] == MARK && b[6] >> 4 == 8
}

/// One used partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub type_guid: Uuid,
    /// The PARTUUID.
    pub guid: Uuid,
    pub first_lba: u64,
    /// Inclusive, as on disk.
    pub last_lba: u64,
    pub attributes: u64,
    pub name: String,
}

impl Entry {
    fn encode(&self, out: &mut [u8]) {
        out[0..16].copy_from_slice(&self.type_guid.to_bytes_le());
        out[16..32].copy_from_slice(&self.guid.to_bytes_le());
        out[32..40].copy_from_slice(&self.first_lba.to_le_bytes());
        out[40..48].copy_from_slice(&self.last_lba.to_le_bytes());
        out[48..56].copy_from_slice(&self.attributes.to_le_bytes());
        for (i, unit) in self.name.encode_utf16().take(NAME_UNITS).enumerate() {
            out[56 + 2 * i..58 + 2 * i].copy_from_slice(&unit.to_le_bytes());
        }
    }

    /// `None` for an unused entry (type GUID all zeros).
    fn decode(b: &[u8]) -> Option<Entry> {
        let type_guid = Uuid::from_bytes_le(b[0..16].try_into().ok()?);
        if type_guid.is_nil() {
            return None;
        }
        let units: Vec<u16> = b[56..128]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&u| u != 0)
            .collect();
        Some(Entry {
            type_guid,
            guid: Uuid::from_bytes_le(b[16..32].try_into().ok()?),
            first_lba: le64(b, 32),
            last_lba: le64(b, 40),
            attributes: le64(b, 48),
            name: String::from_utf16_lossy(&units),
        })
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A decoded, CRC-checked header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub revision: u32,
    pub my_lba: u64,
    pub alternate_lba: u64,
    pub first_usable: u64,
    pub last_usable: u64,
    pub disk_guid: Uuid,
    pub entries_lba: u64,
    pub entry_count: u32,
    pub entry_size: u32,
    pub entries_crc: u32,
}

impl Header {
    /// Bytes of its entry array.
    pub fn array_bytes(&self) -> u64 {
        u64::from(self.entry_count) * u64::from(self.entry_size)
    }
}

/// Decodes the header in `sector` (read from LBA `at`), checking its signature, size,
/// CRC, own position and array bounds. The error says what is wrong, for the logs.
pub fn decode_header(sector: &[u8], at: u64) -> Result<Header, String> {
    if sector.len() < HEADER_SIZE || &sector[0..8] != SIGNATURE {
        return Err(format!("no GPT header at LBA {at}"));
    }
    let size = le32(sector, 12) as usize;
    if !(HEADER_SIZE..=sector.len()).contains(&size) {
        return Err(format!("GPT header at LBA {at} has size {size}"));
    }
    let mut copy = sector[..size].to_vec();
    copy[16..20].fill(0);
    if crc32fast::hash(&copy) != le32(sector, 16) {
        return Err(format!("GPT header at LBA {at} fails its CRC32"));
    }
    let h = Header {
        revision: le32(sector, 8),
        my_lba: le64(sector, 24),
        alternate_lba: le64(sector, 32),
        first_usable: le64(sector, 40),
        last_usable: le64(sector, 48),
        disk_guid: Uuid::from_bytes_le(sector[56..72].try_into().map_err(|_| "short")?),
        entries_lba: le64(sector, 72),
        entry_count: le32(sector, 80),
        entry_size: le32(sector, 84),
        entries_crc: le32(sector, 88),
    };
    if h.my_lba != at {
        return Err(format!("GPT header at LBA {at} says it is at {}", h.my_lba));
    }
    if h.entry_size < 128 || !h.entry_size.is_multiple_of(128) || h.array_bytes() > MAX_ARRAY_BYTES
    {
        return Err(format!(
            "GPT header at LBA {at} has {} entries of {} bytes",
            h.entry_count, h.entry_size
        ));
    }
    Ok(h)
}

/// Decodes an entry array whose CRC the caller checked: slot `i` is partition `i + 1`.
pub fn decode_entries(array: &[u8], entry_size: usize) -> Vec<Option<Entry>> {
    array.chunks_exact(entry_size).map(Entry::decode).collect()
}

/// What LBA 0 holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mbr {
    /// No boot signature: no MBR.
    Absent,
    /// One 0xEE entry from LBA 1 and three empty ones.
    Protective,
    /// A boot signature with anything else: an MBR partition table, a hybrid MBR, a boot
    /// sector.
    Other,
}

pub fn mbr_kind(sector0: &[u8]) -> Mbr {
    if sector0.len() < 512 || sector0[510..512] != [0x55, 0xaa] {
        return Mbr::Absent;
    }
    let entry = |i: usize| &sector0[446 + 16 * i..462 + 16 * i];
    let first = entry(0);
    let rest_empty = (1..4).all(|i| entry(i).iter().all(|&b| b == 0));
    if first[4] == 0xee && le32(first, 8) == 1 && rest_empty {
        Mbr::Protective
    } else {
        Mbr::Other
    }
}

/// A GPT label: geometry, disk GUID and all its slots ([`ENTRIES`] in a new label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// Logical sector size in bytes (512 or 4096).
    pub sector: u64,
    /// The device's size in sectors.
    pub sectors: u64,
    pub disk_guid: Uuid,
    pub first_usable: u64,
    pub last_usable: u64,
    /// Slot `i` is partition number `i + 1`.
    pub slots: Vec<Option<Entry>>,
}

impl Label {
    /// An empty label for a device of `sectors` sectors of `sector` bytes.
    pub fn new(sector: u64, sectors: u64, disk_guid: Uuid) -> Result<Label, String> {
        Label::with_entries(sector, sectors, disk_guid, ENTRIES)
    }

    /// An empty label whose array holds `entries` entries.
    pub fn with_entries(
        sector: u64,
        sectors: u64,
        disk_guid: Uuid,
        entries: usize,
    ) -> Result<Label, String> {
        if !matches!(sector, 512 | 4096) {
            return Err(format!("logical sector size {sector} is not 512 or 4096"));
        }
        let array = array_sectors(sector, entries);
        // Room for both labels and at least one aligned MiB between them.
        if sectors * sector < 4 << 20 {
            return Err(format!("{} bytes is too small to carve", sectors * sector));
        }
        Ok(Label {
            sector,
            sectors,
            disk_guid,
            first_usable: 2 + array,
            last_usable: sectors - 2 - array,
            slots: vec![None; entries],
        })
    }

    /// Used entries with their partition numbers.
    pub fn partitions(&self) -> impl Iterator<Item = (u32, &Entry)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32 + 1, e)))
    }

    pub fn backup_header_lba(&self) -> u64 {
        self.sectors - 1
    }

    pub fn backup_entries_lba(&self) -> u64 {
        self.sectors - 1 - array_sectors(self.sector, self.slots.len())
    }

    pub fn encode_entries(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.slots.len() * ENTRY_SIZE];
        for (slot, chunk) in self.slots.iter().zip(out.chunks_exact_mut(ENTRY_SIZE)) {
            if let Some(e) = slot {
                e.encode(chunk);
            }
        }
        out
    }

    /// The primary (LBA 1) or backup (last LBA) header, one sector long.
    pub fn encode_header(&self, primary: bool, entries_crc: u32) -> Vec<u8> {
        let (me, other, entries) = if primary {
            (1, self.backup_header_lba(), 2)
        } else {
            (self.backup_header_lba(), 1, self.backup_entries_lba())
        };
        let mut h = vec![0u8; self.sector as usize];
        h[0..8].copy_from_slice(SIGNATURE);
        h[8..12].copy_from_slice(&REVISION.to_le_bytes());
        h[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        h[24..32].copy_from_slice(&me.to_le_bytes());
        h[32..40].copy_from_slice(&other.to_le_bytes());
        h[40..48].copy_from_slice(&self.first_usable.to_le_bytes());
        h[48..56].copy_from_slice(&self.last_usable.to_le_bytes());
        h[56..72].copy_from_slice(&self.disk_guid.to_bytes_le());
        h[72..80].copy_from_slice(&entries.to_le_bytes());
        h[80..84].copy_from_slice(&(self.slots.len() as u32).to_le_bytes());
        h[84..88].copy_from_slice(&(ENTRY_SIZE as u32).to_le_bytes());
        h[88..92].copy_from_slice(&entries_crc.to_le_bytes());
        let crc = crc32fast::hash(&h[..HEADER_SIZE]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// LBA 0: a protective MBR covering the device (capped at 2^32 - 1 sectors).
    pub fn protective_mbr(&self) -> Vec<u8> {
        let mut s = vec![0u8; self.sector as usize];
        let e = &mut s[446..462];
        e[1..4].copy_from_slice(&[0x00, 0x02, 0x00]); // CHS of LBA 1
        e[4] = 0xee;
        e[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        e[8..12].copy_from_slice(&1u32.to_le_bytes());
        let len = u32::try_from(self.sectors - 1).unwrap_or(u32::MAX);
        e[12..16].copy_from_slice(&len.to_le_bytes());
        s[510] = 0x55;
        s[511] = 0xaa;
        s
    }

    /// Every region to write, as (byte offset, bytes), in write order: the backup array
    /// and header, the primary array, the primary header (the commit point), and the
    /// protective MBR last. A crash before the primary header leaves the old primary
    /// valid (or, if its array was half written, its CRC fails and the complete new
    /// backup is read); a crash while writing a first label leaves no MBR, so the device
    /// reads as blank or as ours to repair, never as foreign.
    pub fn regions(&self) -> Vec<(u64, Vec<u8>)> {
        let entries = self.encode_entries();
        let crc = crc32fast::hash(&entries);
        let at = |lba: u64| lba * self.sector;
        vec![
            (at(self.backup_entries_lba()), entries.clone()),
            (at(self.backup_header_lba()), self.encode_header(false, crc)),
            (at(2), entries),
            (at(1), self.encode_header(true, crc)),
            (0, self.protective_mbr()),
        ]
    }
}

/// Sectors of an array of `entries` entries.
pub fn array_sectors(sector: u64, entries: usize) -> u64 {
    ((entries * ENTRY_SIZE) as u64).div_ceil(sector)
}
