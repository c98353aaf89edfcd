//! The GPT codec of `partition` against independent tools: labels we write
//! pass `sgdisk -v` and read back in `sfdisk --json` exactly as written; labels other
//! tools write are foreign; a write interrupted at any step leaves the old or the new
//! label, never a foreign or blank one. Regular image files, no root needed.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use gds_csi::disk::gpt::format::{self as gpt, Label, TYPE_GUID};
use gds_csi::disk::gpt::label::{read_image, write_image, OnDisk};
use gds_csi::disk::gpt::ALIGN;

const SIZE: u64 = 64 << 20;

fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("--version").output().is_ok();
    if !ok {
        common::skip(&format!("needs {tool} (scripts/lib.sh install_host_tools)"));
    }
    ok
}

fn image(dir: &Path) -> (File, std::path::PathBuf) {
    let path = dir.join("disk.img");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(SIZE).unwrap();
    (f, path)
}

fn read(f: &File) -> OnDisk {
    read_image(f, 512, SIZE).unwrap()
}

fn ours(f: &File) -> Label {
    match read(f) {
        OnDisk::Ours {
            label,
            repair: None,
        } => label,
        other => panic!("expected our label, clean: {other:?}"),
    }
}

/// A label with three partitions of 8, 4 and 16 MiB.
fn three() -> Label {
    let mut l = Label::new(512, SIZE / 512, gpt::new_disk_guid()).unwrap();
    for (name, mib) in [("a1b2c3d4", 8), ("e5f60718", 4), ("vol-three", 16)] {
        l.allocate(name, mib * ALIGN).unwrap();
    }
    l
}

fn out(cmd: &str, args: &[&str]) -> (bool, String) {
    let o = Command::new(cmd).args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), text)
}

#[test]
fn sgdisk_verifies_our_label_and_sfdisk_reads_it_back() {
    if !have("sgdisk") || !have("sfdisk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (f, path) = image(dir.path());
    let label = three();
    write_image(&f, &label).unwrap();
    let p = path.to_str().unwrap();
    let (ok, text) = out("sgdisk", &["-v", p]);
    assert!(
        ok && text.contains("No problems found"),
        "sgdisk -v: {text}"
    );

    let (ok, json) = out("sfdisk", &["--json", p]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let table = &v["partitiontable"];
    assert_eq!(table["label"], "gpt");
    assert_eq!(
        table["id"].as_str().unwrap().to_lowercase(),
        label.disk_guid.to_string()
    );
    assert_eq!(table["sectorsize"], 512);
    let parts = table["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 3);
    for (sf, (n, e)) in parts.iter().zip(label.partitions()) {
        assert_eq!(sf["node"], format!("{p}{n}"));
        assert_eq!(sf["start"], e.first_lba);
        assert_eq!(sf["size"], e.last_lba - e.first_lba + 1);
        assert_eq!(
            sf["type"].as_str().unwrap().to_lowercase(),
            TYPE_GUID.to_string()
        );
        assert_eq!(
            sf["uuid"].as_str().unwrap().to_lowercase(),
            e.guid.to_string()
        );
        assert_eq!(sf["name"], e.name.as_str());
        assert_eq!(e.first_lba * 512 % ALIGN, 0, "1 MiB aligned");
    }
    assert_eq!(ours(&f), label, "reads back as written");
}

/// A new label holds 255 partitions (the kernel's limit a disk), which sgdisk verifies;
/// a label of the earlier 128-entry format still reads as ours with its 128 entries.
#[test]
fn a_label_of_255_partitions_verifies_and_a_128_entry_label_still_reads() {
    if !have("sgdisk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (f, path) = image(dir.path());
    f.set_len(320 << 20).unwrap();
    let size = 320 << 20;
    let mut label = Label::new(512, size / 512, gpt::new_disk_guid()).unwrap();
    assert_eq!(label.slots.len(), gpt::ENTRIES);
    for i in 0..gpt::MAX_PARTITION_NUMBER {
        label.allocate(&format!("v{i}"), ALIGN).unwrap();
    }
    assert!(
        label.allocate("v255", ALIGN).is_err(),
        "no entry the kernel shows"
    );
    write_image(&f, &label).unwrap();
    let p = path.to_str().unwrap();
    let (ok, text) = out("sgdisk", &["-v", p]);
    assert!(
        ok && text.contains("No problems found"),
        "sgdisk -v: {text}"
    );
    let (_, printed) = out("sgdisk", &["-p", p]);
    assert!(printed.contains("holds up to 256 entries"), "{printed}");
    assert_eq!(printed.matches(" 1024.0 KiB ").count(), 255, "{printed}");
    match read_image(&f, 512, size).unwrap() {
        OnDisk::Ours {
            label: back,
            repair: None,
        } => assert_eq!(back, label),
        other => panic!("{other:?}"),
    }

    let mut before =
        Label::with_entries(512, size / 512, gpt::new_disk_guid(), gpt::ENTRIES_BEFORE).unwrap();
    before.allocate("old", ALIGN).unwrap();
    write_image(&f, &before).unwrap();
    let (_, printed) = out("sgdisk", &["-p", p]);
    assert!(printed.contains("holds up to 128 entries"), "{printed}");
    match read_image(&f, 512, size).unwrap() {
        OnDisk::Ours {
            label: back,
            repair: None,
        } => {
            assert_eq!(back.slots.len(), 128);
            assert_eq!(back, before);
        }
        other => panic!("{other:?}"),
    }
}

/// A reader that counts the reads it answers.
struct Counted<'a> {
    file: &'a File,
    reads: std::cell::Cell<usize>,
}

impl gds_csi::disk::gpt::label::ReadAt for Counted<'_> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.set(self.reads.get() + 1);
        FileExt::read_exact_at(self.file, buf, offset)
    }
}

/// GetCapacity and every create read each pool device's label, and a block device's
/// page cache is dropped at each last close, so each read goes to the device: a label
/// of ours, full or not, and a blank device cost two reads (the two ends), not five.
#[test]
fn a_label_is_read_in_two_device_reads_whatever_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = image(dir.path());
    let size = 320 << 20;
    f.set_len(size).unwrap();
    let reads = |sector: u64| {
        let counted = Counted {
            file: &f,
            reads: std::cell::Cell::new(0),
        };
        let on = read_image(&counted, sector, size).unwrap();
        (on, counted.reads.get())
    };
    assert_eq!(reads(512), (OnDisk::Blank, 2));
    for (sector, entries, count) in [
        (512, gpt::ENTRIES, 1),
        (512, gpt::ENTRIES, gpt::MAX_PARTITION_NUMBER),
        (512, gpt::ENTRIES_BEFORE, 3),
        (4096, gpt::ENTRIES, 200),
    ] {
        let mut label =
            Label::with_entries(sector, size / sector, gpt::new_disk_guid(), entries).unwrap();
        for i in 0..count {
            label.allocate(&format!("v{i}"), ALIGN).unwrap();
        }
        write_image(&f, &label).unwrap();
        let (on, n) = reads(sector);
        assert_eq!(n, 2, "{count} partitions, {sector}-byte sectors");
        assert_eq!(
            on,
            OnDisk::Ours {
                label,
                repair: None
            }
        );
        // Zero the image for the next label.
        f.set_len(0).unwrap();
        f.set_len(size).unwrap();
    }
}

#[test]
fn a_label_sgdisk_wrote_is_foreign_even_with_our_type() {
    if !have("sgdisk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (f, path) = image(dir.path());
    let p = path.to_str().unwrap();
    let (ok, text) = out("sgdisk", &["-o", p]);
    assert!(ok, "{text}");
    let empty = read(&f);
    assert!(
        matches!(&empty, OnDisk::Foreign(why) if why.contains("another tool")),
        "{empty:?}"
    );
    let code = format!("1:{TYPE_GUID}");
    let (ok, text) = out("sgdisk", &["-n", "1:2048:+8M", "-t", &code, p]);
    assert!(ok, "{text}");
    assert!(
        matches!(read(&f), OnDisk::Foreign(_)),
        "our type GUID alone is no proof"
    );
}

#[test]
fn a_foreign_partition_in_our_label_makes_it_foreign() {
    if !have("sgdisk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (f, path) = image(dir.path());
    write_image(&f, &three()).unwrap();
    // sgdisk keeps the disk GUID (our mark) and adds a Linux filesystem partition.
    let (ok, text) = out(
        "sgdisk",
        &["-n", "4:0:+2M", "-t", "4:8300", path.to_str().unwrap()],
    );
    assert!(ok, "{text}");
    let got = read(&f);
    assert!(
        matches!(&got, OnDisk::Foreign(why) if why.contains("partition 4")),
        "{got:?}"
    );
}

#[test]
fn an_mbr_partition_table_is_foreign() {
    if !have("sfdisk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (f, path) = image(dir.path());
    let mut child = Command::new("sfdisk")
        .args(["--label", "dos", path.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b",8M,83\n").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(matches!(read(&f), OnDisk::Foreign(why) if why.contains("MBR")));
}

#[test]
fn blank_image_is_blank_and_a_damaged_primary_is_repaired_from_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = image(dir.path());
    assert_eq!(read(&f), OnDisk::Blank);
    let label = three();
    write_image(&f, &label).unwrap();
    // One flipped byte in the primary entry array: its CRC fails, the backup is read.
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 2 * 512 + 60).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], 2 * 512 + 60).unwrap();
    match read(&f) {
        OnDisk::Ours {
            label: got,
            repair: Some(why),
        } => {
            assert_eq!(got, label);
            assert!(why.contains("CRC32"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // Both copies damaged: foreign (damaged), never carved.
    let last = SIZE - 512;
    f.read_exact_at(&mut b, last + 20).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], last + 20).unwrap();
    assert!(matches!(read(&f), OnDisk::Foreign(why) if why.contains("damaged")));
}

/// Writes the first `k` regions of `label`, as a crash after them would leave.
fn write_prefix(f: &File, label: &Label, k: usize) {
    for (offset, bytes) in label.regions().into_iter().take(k) {
        f.write_all_at(&bytes, offset).unwrap();
    }
}

#[test]
fn an_interrupted_write_leaves_the_old_or_the_new_label() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = image(dir.path());
    let new = three();
    let steps = new.regions().len();
    // A first label: blank or the new one (to repair), never foreign.
    for k in 0..=steps {
        f.set_len(0).unwrap();
        f.set_len(SIZE).unwrap();
        write_prefix(&f, &new, k);
        match read(&f) {
            OnDisk::Blank => assert!(k < 2, "blank after {k} regions"),
            OnDisk::Ours { label, .. } => assert_eq!(label, new, "after {k} regions"),
            other => panic!("after {k} regions: {other:?}"),
        }
    }
    // A change: the old label until the primary array is written (from then on its
    // header's CRC fails and the new backup is read), also with that array half written.
    let mut changed = new.clone();
    changed.remove(2);
    changed.allocate("grown", 20 * ALIGN).unwrap();
    for k in 0..=steps {
        write_image(&f, &new).unwrap();
        write_prefix(&f, &changed, k);
        let got = match read(&f) {
            OnDisk::Ours { label, .. } => label,
            other => panic!("after {k} regions: {other:?}"),
        };
        assert_eq!(
            got,
            if k >= 3 { changed.clone() } else { new.clone() },
            "after {k} regions"
        );
    }
    write_image(&f, &new).unwrap();
    write_prefix(&f, &changed, 2);
    let (offset, bytes) = &changed.regions()[2];
    f.write_all_at(&bytes[..bytes.len() / 2], *offset).unwrap();
    match read(&f) {
        OnDisk::Ours {
            label,
            repair: Some(_),
        } => assert_eq!(label, changed),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_4k_sector_label_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = image(dir.path());
    let mut l = Label::new(4096, SIZE / 4096, gpt::new_disk_guid()).unwrap();
    l.allocate("four-k", 3 * ALIGN).unwrap();
    write_image(&f, &l).unwrap();
    assert_eq!(
        l.first_usable, 10,
        "array of 8 sectors (256 entries) after LBA 1"
    );
    match read_image(&f, 4096, SIZE).unwrap() {
        OnDisk::Ours {
            label,
            repair: None,
        } => assert_eq!(label, l),
        other => panic!("{other:?}"),
    }
    // Read as 512-byte sectors, it is not a label for this geometry.
    assert!(!matches!(read(&f), OnDisk::Ours { .. }));
}

#[test]
fn a_backup_is_not_trusted_over_something_else_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = image(dir.path());
    write_image(&f, &three()).unwrap();
    // As a filesystem made on the whole disk later: LBA 0 and 1 zeroed, a superblock at
    // byte 1024 (inside the primary array), the backup GPT left at the end.
    f.write_all_at(&[0u8; 1024], 0).unwrap();
    f.write_all_at(&[0x53, 0xef, 1, 2, 3, 4], 1024 + 0x38)
        .unwrap();
    let got = read(&f);
    assert!(
        matches!(&got, OnDisk::Foreign(why) if why.contains("overwritten")),
        "{got:?}"
    );
}

/// The fuzz target's property on a fixed budget (scripts/fuzz.sh runs it unbounded):
/// labels corrupted at random bytes are judged without a panic, and whatever is still
/// judged ours is sound.
#[test]
fn randomly_corrupted_labels_are_judged_soundly() {
    const IMG: u64 = 8 << 20;
    let mut img = vec![0u8; IMG as usize];
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut ours, mut foreign) = (0, 0);
    for _ in 0..1500 {
        let mut label = Label::new(512, IMG / 512, gpt::new_disk_guid()).unwrap();
        for i in 0..next() % 6 {
            let _ = label.allocate(&format!("p{i}"), (1 + next() % 2) * ALIGN);
        }
        let regions = label.regions();
        for (at, bytes) in &regions {
            img[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        for _ in 0..1 + next() % 3 {
            let (at, bytes) = &regions[next() as usize % regions.len()];
            img[(*at + next() % bytes.len() as u64) as usize] ^= 1 + (next() % 255) as u8;
        }
        match read_image(img.as_slice(), 512, IMG).unwrap() {
            OnDisk::Ours { label: got, .. } => {
                ours += 1;
                assert!(got.partitions().all(|(_, e)| e.type_guid == TYPE_GUID));
                let (free, largest) = got.capacity();
                assert!(largest <= free && free <= got.usable().len);
            }
            OnDisk::Foreign(_) => foreign += 1,
            OnDisk::Blank => panic!("a corrupted label read as blank"),
        }
        for (at, bytes) in &regions {
            img[*at as usize..*at as usize + bytes.len()].fill(0);
        }
    }
    // Most flips hit one copy (repaired from the other); some hit both or the MBR.
    assert!(ours > 1000 && foreign > 0, "ours {ours}, foreign {foreign}");
}
