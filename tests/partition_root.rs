//! `partition` on real loop devices: carved partitions reach the kernel through
//! BLKPG, survive being dropped from it (re-sync), grow in place, are wiped on delete, and
//! a device holding anything foreign is refused and left byte-identical. Root only;
//! `GDS_CSI_NO_SKIP=1` turns a skip into a failure.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gds_csi::disk::gpt::label::{self, Blank, OnDisk};
use gds_csi::disk::gpt::{kernel, Error, Held, Label, ALIGN};
use gds_csi::os::{Host, RealHost};

const MIB: u64 = ALIGN;
const SIZE: u64 = 128 << 20;

/// A loop device on a sparse file; on drop its partitions leave the kernel before the
/// device is detached (without partscan, a detach leaves them behind on this kernel).
struct Loop {
    _dir: tempfile::TempDir,
    dev: PathBuf,
}

impl Loop {
    fn new() -> Option<Loop> {
        if !common::is_root() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-part-")
            .tempdir_in("/tmp")
            .unwrap();
        let img = dir.path().join("dev.img");
        fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let dev = common::attach_loop(&img);
        Some(Loop { _dir: dir, dev })
    }

    fn name(&self) -> String {
        self.dev.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// The device's SHA-256 (sha256sum: the debug build's own hashing is slow).
    fn sha(&self) -> String {
        common::run("sha256sum", &[self.dev.to_str().unwrap()])
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        // Another program (a probe of every block device) may hold one for a moment.
        for p in kernel::list(&self.dev).unwrap_or_default() {
            let mut tries = 0;
            while let Err(e) = kernel::delete(&self.dev, p.number) {
                tries += 1;
                if tries == 50 {
                    eprintln!("cleanup of {}: {e}", self.dev.display());
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        common::detach_loop(&self.dev);
    }
}

fn host() -> RealHost {
    RealHost {
        command_timeout: Duration::from_secs(30),
        mount_timeout: Duration::from_secs(30),
    }
}

/// The proof from the real signature probe (blkid and wipefs), or `None`.
async fn probe(dev: &Path) -> Option<Blank> {
    let found = host().probe_signatures(dev).await.unwrap();
    Blank::from_signature_probe(dev, &found)
}

/// What sysfs shows for partition `n` of `l`: (start, size) in bytes.
fn sysfs(l: &Loop, n: u32) -> Option<(u64, u64)> {
    let dir = Path::new("/sys/class/block")
        .join(l.name())
        .join(format!("{}p{n}", l.name()));
    let read = |f: &str| {
        fs::read_to_string(dir.join(f))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    Some((read("start")? * 512, read("size")? * 512))
}

fn dd(args: &[&str]) -> Vec<u8> {
    let out = Command::new("dd")
        .args(args)
        .arg("status=none")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// One MiB of bytes particular to `seed`.
fn pattern(seed: u8) -> Vec<u8> {
    (0..MIB as usize)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Writes `data` at MiB `mib` of `node`, bypassing the page cache.
fn write_mib(node: &Path, mib: u64, data: &[u8]) {
    let f = tempfile::NamedTempFile::new().unwrap();
    fs::write(f.path(), data).unwrap();
    dd(&[
        &format!("if={}", f.path().display()),
        &format!("of={}", node.display()),
        "bs=1M",
        &format!("seek={mib}"),
        "oflag=direct",
        "conv=fsync,notrunc",
    ]);
}

fn read_mib(node: &Path, mib: u64) -> Vec<u8> {
    dd(&[
        &format!("if={}", node.display()),
        "bs=1M",
        "count=1",
        &format!("skip={mib}"),
        "iflag=direct",
    ])
}

/// Carves `sizes` (MiB) on blank `l`: label written first, then the kernel told.
async fn carve(l: &Loop, sizes: &[u64]) -> Label {
    let proof = probe(&l.dev).await.expect("a blank loop device");
    let mut label = label::create(&l.dev, proof).unwrap();
    for (i, mib) in sizes.iter().enumerate() {
        label.allocate(&format!("alloc{i}"), mib * MIB).unwrap();
    }
    label::write(&l.dev, &label).unwrap();
    for (n, _) in label.partitions() {
        kernel::add(&l.dev, n, label.extent(n).unwrap()).unwrap();
    }
    label
}

#[tokio::test]
async fn carved_partitions_come_back_with_their_data_after_the_kernel_drops_them() {
    let Some(l) = Loop::new() else { return };
    let label = carve(&l, &[8, 16, 24]).await;
    let mut nodes = Vec::new();
    for (n, _) in label.partitions() {
        let span = label.extent(n).unwrap();
        assert_eq!(
            sysfs(&l, n),
            Some((span.start, span.len)),
            "the kernel shows partition {n}"
        );
        let node = kernel::node(&l.dev, n).unwrap();
        assert_eq!(node, Path::new("/dev").join(format!("{}p{n}", l.name())));
        let data = pattern(n as u8);
        write_mib(&node, span.len / MIB - 1, &data);
        // The kernel maps the partition where the label says: read it via the parent.
        assert_eq!(
            read_mib(&l.dev, span.end() / MIB - 1),
            data,
            "partition {n} offset"
        );
        nodes.push((n, node, span));
    }
    let run = Command::new("partx")
        .arg("-d")
        .arg(&l.dev)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        kernel::list(&l.dev).unwrap().is_empty(),
        "partx -d dropped them"
    );

    let OnDisk::Ours {
        label: read,
        repair: None,
    } = label::read(&l.dev).unwrap()
    else {
        panic!("our label")
    };
    assert_eq!(read, label);
    let done = kernel::resync(&l.dev).unwrap();
    assert_eq!(done.added, vec![1, 2, 3]);
    for (n, node, span) in &nodes {
        assert_eq!(sysfs(&l, *n), Some((span.start, span.len)));
        assert_eq!(
            read_mib(node, span.len / MIB - 1),
            pattern(*n as u8),
            "data of {n} intact"
        );
        let (_, e) = read.partitions().find(|(m, _)| m == n).unwrap();
        let found = kernel::find_by_partuuid(std::slice::from_ref(&l.dev), &e.guid)
            .unwrap()
            .unwrap();
        assert_eq!((found.number, found.span), (*n, *span));
    }
    assert_eq!(
        kernel::resync(&l.dev).unwrap(),
        kernel::Resync::default(),
        "idempotent"
    );
}

#[tokio::test]
async fn a_foreign_gpt_is_refused_and_left_byte_identical() {
    let Some(l) = Loop::new() else { return };
    common::run(
        "sgdisk",
        &["-o", "-n", "1:2048:+8M", l.dev.to_str().unwrap()],
    );
    let before = l.sha();
    assert!(
        probe(&l.dev).await.is_none(),
        "the probe sees the partition table"
    );
    assert!(matches!(label::read(&l.dev).unwrap(), OnDisk::Foreign(_)));
    // Even with a proof made wrongly, nothing is written.
    let forged = Blank::from_signature_probe::<()>(&l.dev, &[]).unwrap();
    let err = label::create(&l.dev, forged).unwrap_err();
    assert!(matches!(err, Error::NotBlank { .. }), "{err}");
    let mut ours =
        Label::new(512, SIZE / 512, gds_csi::disk::gpt::format::new_disk_guid()).unwrap();
    ours.allocate("x", MIB).unwrap();
    assert!(matches!(
        label::write(&l.dev, &ours),
        Err(Error::Foreign { .. })
    ));
    assert_eq!(l.sha(), before, "not one byte changed");
}

#[tokio::test]
async fn a_foreign_filesystem_is_refused_and_left_byte_identical() {
    let Some(l) = Loop::new() else { return };
    common::run("mkfs.ext4", &["-q", "-F", l.dev.to_str().unwrap()]);
    let before = l.sha();
    assert!(probe(&l.dev).await.is_none(), "the probe sees ext4");
    // No partition table at all (ext4 leaves LBA 0 zero) yet the label area holds its
    // superblock: refused on that alone.
    let forged = Blank::from_signature_probe::<()>(&l.dev, &[]).unwrap();
    let err = label::create(&l.dev, forged).unwrap_err();
    assert!(
        matches!(&err, Error::NotBlank { why, .. } if why.contains("would overwrite")),
        "{err}"
    );
    assert_eq!(l.sha(), before, "not one byte changed");
}

#[tokio::test]
async fn grow_in_place_keeps_the_data_and_names_the_neighbour() {
    let Some(l) = Loop::new() else { return };
    let mut label = carve(&l, &[8, 4, 8]).await;
    let a = kernel::node(&l.dev, 1).unwrap();
    write_mib(&a, 0, &pattern(7));
    // Delete 2: kernel first, then the label.
    kernel::delete(&l.dev, 2).unwrap();
    label.remove(2);
    label::write(&l.dev, &label).unwrap();
    // Grow 1 into the freed space while it is open; the label first, then the kernel.
    let held = fs::File::open(&a).unwrap();
    assert!(label.grow(1, 12 * MIB).unwrap());
    label::write(&l.dev, &label).unwrap();
    // A crash here leaves the kernel short; re-sync resizes it.
    let done = kernel::resync(&l.dev).unwrap();
    assert_eq!(done.resized, vec![1]);
    assert_eq!(sysfs(&l, 1).unwrap().1, 12 * MIB);
    let mut f = &held;
    use std::io::Seek;
    assert_eq!(
        f.seek(std::io::SeekFrom::End(0)).unwrap(),
        12 * MIB,
        "the open node sees it"
    );
    assert_eq!(read_mib(&a, 0), pattern(7), "data kept");
    // 3 starts past 2's growth room (2 MiB), at 19 MiB.
    let err = label.grow(1, 19 * MIB).unwrap_err();
    assert!(
        err.to_string().contains("partition 3 (\"alloc2\")"),
        "{err}"
    );
}

#[tokio::test]
async fn delete_discards_and_zeroes_only_that_partition() {
    let Some(l) = Loop::new() else { return };
    let mut label = carve(&l, &[4, 4]).await;
    let (one, two) = (
        kernel::node(&l.dev, 1).unwrap(),
        kernel::node(&l.dev, 2).unwrap(),
    );
    for mib in 0..4 {
        write_mib(&one, mib, &pattern(1));
        write_mib(&two, mib, &pattern(2));
    }
    // In use: neither discarded nor removed from the kernel.
    let held = fs::OpenOptions::new().read(true).custom_flags_excl(&one);
    assert!(
        kernel::discard(&one, Duration::from_secs(30)).is_err(),
        "O_EXCL refuses"
    );
    let err = kernel::delete(&l.dev, 1).unwrap_err();
    assert!(err.to_string().contains("it is open"), "{err}");
    drop(held);

    // The erase: the offloaded zero-out (a loop device on ext4 punches its backing file),
    // else written zeros through the host port's BLKZEROOUT on the partition node.
    let t = Duration::from_secs(30);
    match kernel::zero_offloaded(&one, t).unwrap() {
        kernel::Erased::Done => {}
        kernel::Erased::Unsupported => host().zero_device(&one).await.unwrap(),
    }
    for mib in 0..4 {
        assert!(
            read_mib(&one, mib).iter().all(|&b| b == 0),
            "MiB {mib} of 1 reads zeros"
        );
        assert_eq!(read_mib(&two, mib), pattern(2), "partition 2 untouched");
    }
    // The host port's zero-out and a discard work on a partition node too.
    write_mib(&one, 1, &pattern(5));
    host().zero_device(&one).await.unwrap();
    assert!(read_mib(&one, 1).iter().all(|&b| b == 0));
    assert_eq!(kernel::discard(&one, t).unwrap(), kernel::Erased::Done);
    assert_eq!(read_mib(&two, 0), pattern(2), "partition 2 untouched");
    kernel::delete(&l.dev, 1).unwrap();
    kernel::delete(&l.dev, 1).unwrap(); // done already: still fine
    label.remove(1);
    label::write(&l.dev, &label).unwrap();
    assert_eq!(
        kernel::list(&l.dev)
            .unwrap()
            .iter()
            .map(|p| p.number)
            .collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(kernel::resync(&l.dev).unwrap(), kernel::Resync::default());
}

#[tokio::test]
async fn resync_leaves_a_partition_it_does_not_know() {
    let Some(l) = Loop::new() else { return };
    carve(&l, &[4]).await;
    let tail = gds_csi::disk::gpt::Extent {
        start: 100 * MIB,
        len: 4 * MIB,
    };
    kernel::add(&l.dev, 9, tail).unwrap();
    kernel::delete(&l.dev, 1).unwrap();
    let done = kernel::resync(&l.dev).unwrap();
    assert_eq!(done.added, vec![1]);
    assert_eq!(
        done.unknown.iter().map(|p| p.number).collect::<Vec<_>>(),
        vec![9]
    );
    assert_eq!(sysfs(&l, 9), Some((100 * MIB, 4 * MIB)), "left alone");
}

trait OpenExcl {
    fn custom_flags_excl(&mut self, path: &Path) -> fs::File;
}

impl OpenExcl for fs::OpenOptions {
    fn custom_flags_excl(&mut self, path: &Path) -> fs::File {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_EXCL).open(path).unwrap()
    }
}

#[tokio::test]
async fn a_label_write_waits_for_another_programs_lock() {
    let Some(l) = Loop::new() else { return };
    let mut label = carve(&l, &[4]).await;
    label.allocate("second", 4 * MIB).unwrap();
    let other = fs::File::open(&l.dev).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&other), libc::LOCK_EX) };
    assert_eq!(rc, 0);
    let err = label::write(&l.dev, &label).unwrap_err();
    assert!(
        err.to_string().contains("another program holds its lock"),
        "{err}"
    );
    drop(other);
    label::write(&l.dev, &label).unwrap();
    let OnDisk::Ours { label: read, .. } = label::read(&l.dev).unwrap() else {
        panic!()
    };
    assert_eq!(read, label);
}

#[tokio::test]
async fn a_filesystem_made_over_a_carved_device_is_never_repaired_away() {
    let Some(l) = Loop::new() else { return };
    let label = carve(&l, &[4, 4]).await;
    for (n, _) in label.partitions() {
        kernel::delete(&l.dev, n).unwrap();
    }
    common::run("mkfs.ext4", &["-q", "-F", l.dev.to_str().unwrap()]);
    let before = l.sha();
    let got = label::read(&l.dev).unwrap();
    assert!(!matches!(got, OnDisk::Ours { .. }), "{got:?}");
    assert!(label::write(&l.dev, &label).is_err());
    assert!(matches!(kernel::resync(&l.dev), Err(Error::Foreign { .. })));
    assert!(
        kernel::list(&l.dev).unwrap().is_empty(),
        "the kernel was told of nothing"
    );
    assert_eq!(l.sha(), before, "the new filesystem is intact");
}

#[tokio::test]
async fn the_layout_steps_are_idempotent_and_find_partitions_by_partuuid() {
    use gds_csi::disk::gpt::volume;
    let Some(l) = Loop::new() else { return };
    carve(&l, &[]).await;
    let a = volume::carve(&l.dev, "aaaa1111", 8 * MIB, &Held::default()).unwrap();
    // A retry (the state write never happened) finds the same partition.
    assert_eq!(
        volume::carve(&l.dev, "aaaa1111", 8 * MIB, &Held::default()).unwrap(),
        a
    );
    assert!(matches!(
        volume::carve(&l.dev, "aaaa1111", 9 * MIB, &Held::default()),
        Err(Error::NameTaken { len, .. }) if len == 8 * MIB
    ));
    let b = volume::carve(&l.dev, "bbbb2222", 4 * MIB, &Held::default()).unwrap();
    write_mib(&a.node, 7, &pattern(3));
    // Dropped from the kernel (a reboot on a kernel without a GPT parser): found again.
    kernel::delete(&l.dev, a.number).unwrap();
    let again = volume::locate(&l.dev, &a.partuuid).unwrap();
    assert_eq!(again, a);
    assert_eq!(read_mib(&again.node, 7), pattern(3));
    // Grow is blocked by b (past a's 4 MiB of growth room); after b is removed it grows,
    // and a retry is a no-op.
    let err = volume::grow(&l.dev, &a.partuuid, 16 * MIB, &Held::default()).unwrap_err();
    assert!(err.to_string().contains("\"bbbb2222\""), "{err}");
    volume::remove(&l.dev, &b.partuuid).unwrap();
    volume::remove(&l.dev, &b.partuuid).unwrap();
    let grown = volume::grow(&l.dev, &a.partuuid, 16 * MIB, &Held::default()).unwrap();
    assert_eq!(grown.span.len, 16 * MIB);
    assert_eq!(
        volume::grow(&l.dev, &a.partuuid, 16 * MIB, &Held::default()).unwrap(),
        grown
    );
    assert_eq!(sysfs(&l, a.number), Some((a.span.start, 16 * MIB)));
    assert_eq!(read_mib(&grown.node, 7), pattern(3), "data kept");
    // Remove refuses while open and leaves label and kernel as they were.
    let held = fs::File::open(&grown.node).unwrap();
    assert!(volume::remove(&l.dev, &a.partuuid).is_err());
    assert!(volume::locate(&l.dev, &a.partuuid).is_ok());
    drop(held);
    volume::remove(&l.dev, &a.partuuid).unwrap();
    assert!(kernel::list(&l.dev).unwrap().is_empty());
    assert_eq!(volume::ours(&l.dev).unwrap().partitions().count(), 0);
}

#[tokio::test]
async fn a_4k_sector_device_is_carved_in_4k_sectors() {
    use gds_csi::disk::gpt::volume;
    if !common::is_root() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gds-part-")
        .tempdir_in("/tmp")
        .unwrap();
    let img = dir.path().join("dev.img");
    fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
    let dev = PathBuf::from(common::run(
        "losetup",
        &[
            "--find",
            "--show",
            "--sector-size",
            "4096",
            img.to_str().unwrap(),
        ],
    ));
    let l = Loop { _dir: dir, dev };
    let label = carve(&l, &[]).await;
    // LBA 0, the header in LBA 1, then 256 entries of 128 bytes: 8 sectors of 4096.
    assert_eq!((label.sector, label.first_usable), (4096, 10));
    let a = volume::carve(&l.dev, "fourk-a", 8 * MIB, &Held::default()).unwrap();
    let b = volume::carve(&l.dev, "fourk-b", 8 * MIB, &Held::default()).unwrap();
    assert_eq!(sysfs(&l, b.number), Some((b.span.start, 8 * MIB)));
    write_mib(&b.node, 0, &pattern(4));
    assert_eq!(read_mib(&l.dev, b.span.start / MIB), pattern(4));
    let out = Command::new("sgdisk")
        .arg("-v")
        .arg(&l.dev)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("No problems found"), "sgdisk -v: {text}");
    let info = common::run(
        "sgdisk",
        &["-i", &a.number.to_string(), l.dev.to_str().unwrap()],
    );
    assert!(
        info.to_lowercase().contains(&a.partuuid.to_string()),
        "{info}"
    );
    assert!(
        info.contains("First sector: 256 "),
        "1 MiB in 4 KiB sectors: {info}"
    );
}

#[tokio::test]
async fn the_host_probe_sees_a_new_partition_as_blank_and_a_filesystem_on_it() {
    use gds_csi::disk::gpt::volume;
    let Some(l) = Loop::new() else { return };
    carve(&l, &[]).await;
    let a = volume::carve(&l.dev, "probe-me", 8 * MIB, &Held::default()).unwrap();
    // blkid -p prints the parent's PART_ENTRY_* for it and exits 0: not a signature.
    let found = host().probe_signatures(&a.node).await.unwrap();
    assert!(found.is_empty(), "{found:?}");
    common::run("mkfs.ext4", &["-q", a.node.to_str().unwrap()]);
    let found = host().probe_signatures(&a.node).await.unwrap();
    assert!(found.iter().any(|s| s.kind == "ext4"), "{found:?}");
}

#[tokio::test]
async fn a_partition_the_kernel_shows_but_the_label_lacks_is_never_carved_over() {
    use gds_csi::disk::gpt::volume;
    let Some(l) = Loop::new() else { return };
    carve(&l, &[]).await;
    let a = volume::carve(&l.dev, "aaaa1111", 8 * MIB, &Held::default()).unwrap();
    let b = volume::carve(&l.dev, "bbbb2222", 8 * MIB, &Held::default()).unwrap();
    // Another tool takes b out of the label only; the kernel still shows it.
    let mut label = volume::ours(&l.dev).unwrap();
    label.remove(b.number);
    label::write(&l.dev, &label).unwrap();
    assert_eq!(kernel::numbers(&l.dev).unwrap(), vec![a.number, b.number]);
    let c = volume::carve(&l.dev, "cccc3333", 8 * MIB, &Held::default()).unwrap();
    assert_ne!(c.number, b.number, "b's number is not reused");
    let (c_end, b_end) = (c.span.start + c.span.len, b.span.start + b.span.len);
    assert!(
        c_end <= b.span.start || b_end <= c.span.start,
        "b's blocks are not carved over: {c:?} {b:?}"
    );
    // Nor does a grow reach into them (past a's growth room).
    assert!(volume::grow(&l.dev, &a.partuuid, 16 * MIB, &Held::default()).is_err());
}
