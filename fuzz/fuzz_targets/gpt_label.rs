//! GPT labels: every pool device's first and last sectors are read and judged at start-up
//! and before each carve; they may hold anything. A label built from the input, then
//! corrupted at input-chosen bytes, must be judged without a panic, and whatever is
//! judged ours must be sound; an uncorrupted label must read back exactly.
#![no_main]

use arbitrary::Arbitrary;
use gds_csi::disk::gpt::format::{self as gpt, Label};
use gds_csi::disk::gpt::label::{read_image, OnDisk, ReadAt};
use gds_csi::disk::gpt::ALIGN;
use libfuzzer_sys::fuzz_target;

const SIZE: u64 = 16 << 20;

#[derive(Arbitrary, Debug)]
struct Input {
    sector_4k: bool,
    /// Partition sizes in MiB (mod 8, plus 1); 0 as a size removes the oldest instead.
    sizes: Vec<u8>,
    /// (region, offset in it, xor) applied to the written regions.
    flips: Vec<(u8, u16, u8)>,
}

/// A sparse image: zeros except the regions written.
struct Image(Vec<(u64, Vec<u8>)>);

impl ReadAt for Image {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        buf.fill(0);
        let end = offset + buf.len() as u64;
        for (at, bytes) in &self.0 {
            let (lo, hi) = (offset.max(*at), end.min(at + bytes.len() as u64));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
            }
        }
        Ok(())
    }
}

fuzz_target!(|input: Input| {
    let sector = if input.sector_4k { 4096 } else { 512 };
    let mut label = Label::new(sector, SIZE / sector, gpt::new_disk_guid()).unwrap();
    for (i, s) in input.sizes.iter().take(140).enumerate() {
        if *s == 0 {
            let first = label.partitions().next().map(|(n, _)| n);
            if let Some(n) = first {
                label.remove(n);
            }
        } else {
            let _ = label.allocate(&format!("p{i}"), u64::from(s % 8 + 1) * ALIGN);
        }
    }
    let mut image = Image(label.regions());
    let clean = input.flips.is_empty();
    for (region, offset, xor) in input.flips {
        let n = image.0.len();
        let bytes = &mut image.0[region as usize % n].1;
        let i = offset as usize % bytes.len();
        bytes[i] ^= xor;
    }
    match read_image(&image, sector, SIZE).unwrap() {
        OnDisk::Ours { label: got, repair } => {
            if clean {
                assert_eq!((&got, repair), (&label, None));
            }
            // Sound: allocation on what was judged ours never overlaps or leaves the span.
            let usable = got.usable();
            let (free, largest) = got.capacity();
            assert!(free <= usable.len && largest <= free);
            for (n, e) in got.partitions() {
                assert_eq!(e.type_guid, gpt::TYPE_GUID);
                let span = got.extent(n).unwrap();
                assert!(span.start >= got.first_usable * sector);
                assert!(span.end() <= (got.last_usable + 1) * sector);
            }
        }
        other => assert!(!clean, "a clean label read as {other:?}"),
    }
});
