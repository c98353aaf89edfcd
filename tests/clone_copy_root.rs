//! The clone copy engine (`src/clone`) on real ext4 filesystems on loop devices: a
//! dataset with nested directories, owners, modes, times, odd names, symlinks pointing
//! out of the tree, hard links, a sparse file, empty and unaligned files, a FIFO; every
//! entry compared after the copy. And a copy SIGKILLed mid-way (a child process) and
//! run again: it resumes, finishes, and reads the source less than 1.5 times.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{digest_file, is_root, run, LoopDevice};
use gds_csi::volume::copy::{copy_tree, CopyRequest, Progress, Saved, Verify};

/// An ext4 filesystem on a loop device over a sparse image, mounted; torn down on drop.
struct Fs {
    mnt: PathBuf,
    dev: LoopDevice,
}

impl Fs {
    fn new(dir: &Path, name: &str, size: u64) -> Fs {
        let img = dir.join(format!("{name}.img"));
        fs::File::create(&img).unwrap().set_len(size).unwrap();
        let dev = LoopDevice::attach(&img);
        run("mkfs.ext4", &["-q", "-F", &dev.arg()]);
        let mnt = dir.join(name);
        fs::create_dir_all(&mnt).unwrap();
        run("mount", &[&dev.arg(), mnt.to_str().unwrap()]);
        Fs { mnt, dev }
    }
    fn remount_ro(&self) {
        run("mount", &["-o", "remount,ro", self.mnt.to_str().unwrap()]);
    }
    /// Sectors the kernel read from the device so far (/sys/block/<dev>/stat, field 3).
    fn bytes_read(&self) -> u64 {
        let name = self
            .dev
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let stat = fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
        stat.split_whitespace()
            .nth(2)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 512
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// Deterministic bytes, different per seed.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn set_times(p: &Path, secs: i64, nsec: i64) {
    let t = nix::sys::time::TimeSpec::new(secs, nsec);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &t,
        &nix::sys::time::TimeSpec::new(secs + 100, nsec + 7),
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

fn write(p: &Path, data: &[u8], mode: u32, owner: u32) {
    fs::write(p, data).unwrap();
    nix::unistd::chown(p, Some(owner.into()), Some((owner + 1000).into())).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// The dataset of the issue: hundreds of files in nested directories and every odd case.
fn dataset(root: &Path) {
    for d in 0..4 {
        for e in 0..5 {
            let dir = root.join(format!("d{d}/e{e}"));
            fs::create_dir_all(&dir).unwrap();
            for f in 0..12u64 {
                let seed = (d * 100 + e * 10) as u64 + f;
                let len = (seed as usize * 977) % 70_000;
                write(
                    &dir.join(format!("f{f}")),
                    &bytes(seed, len),
                    0o600 + (f as u32 % 3) * 0o11,
                    1000 + f as u32,
                );
                set_times(
                    &dir.join(format!("f{f}")),
                    1_500_000_000 + seed as i64,
                    seed as i64 * 1000,
                );
            }
        }
    }
    write(&root.join("big"), &bytes(7, (9 << 20) + 4097), 0o4755, 0);
    write(&root.join("empty"), b"", 0o644, 33);
    write(&root.join("unaligned"), &bytes(8, 4097), 0o640, 34);
    // Small files (copied whole, metadata set on the open copy) whose mode the create
    // cannot give: set-id bits, and no permission at all.
    write(&root.join("small-setuid"), &bytes(11, 3000), 0o4755, 0);
    write(&root.join("small-setgid"), &bytes(12, 5000), 0o2750, 36);
    write(&root.join("no-perms"), &bytes(13, 100), 0o000, 37);
    for name in [
        "with space",
        "new\nline",
        "ünïcode",
        "-dash",
        "back\\slash",
        &"x".repeat(255),
    ] {
        write(&root.join(name), name.as_bytes(), 0o644, 35);
    }
    // Sparse: data at 0 and at 32 MiB, size 64 MiB + 123.
    let sparse = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(root.join("sparse"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&bytes(9, 1 << 20), 0).unwrap();
    sparse.write_all_at(&bytes(10, 1 << 20), 32 << 20).unwrap();
    sparse.set_len((64 << 20) + 123).unwrap();
    drop(sparse);
    // Zeros written out in files with holes (what a source that reports no holes, NFS
    // v4.1, shows of every hole): copied as holes, in a file of several pieces and in one
    // copied whole. Zeros in a file without holes stay written.
    for (name, size, data_at) in [
        ("zeros-sparse", 12 << 20, 9 << 20),
        ("zeros-sparse-small", 3 << 20, (2 << 20) + 8192),
    ] {
        let f = fs::File::create(root.join(name)).unwrap();
        f.write_all_at(&vec![0; 2 << 20], 0).unwrap();
        f.write_all_at(&bytes(11, 5000), data_at).unwrap();
        f.set_len(size).unwrap();
    }
    fs::write(root.join("zeros-dense"), vec![0; 2 << 20]).unwrap();
    symlink("/etc/passwd", root.join("outside")).unwrap();
    symlink("/etc", root.join("outside-dir")).unwrap();
    symlink("../d0/e0/f1", root.join("d1/rel")).unwrap();
    symlink("no/such/target", root.join("dangling")).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &root.join("outside"),
        Some(5.into()),
        Some(6.into()),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    fs::hard_link(root.join("d0/e1/f3"), root.join("hard")).unwrap();
    fs::hard_link(root.join("d0/e1/f3"), root.join("d3/hard2")).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o620),
    )
    .unwrap();
    fs::set_permissions(root.join("d2"), fs::Permissions::from_mode(0o711)).unwrap();
    nix::unistd::chown(&root.join("d2"), Some(77.into()), Some(78.into())).unwrap();
    set_times(&root.join("d2/e0"), 1_400_000_000, 5);
    set_times(&root.join("d2"), 1_400_000_001, 6);
    set_times(&root.join("outside"), 1_300_000_000, 9);
    // Extended attributes: the users' own on a file and a directory, a POSIX ACL (a named
    // user with read access) and a file capability (set after the chown above, which
    // would drop it).
    xattr::set(root.join("big"), "user.dataset.sha", b"abc123").unwrap();
    xattr::set(root.join("d1"), "user.owner.team", b"vision").unwrap();
    xattr::set(
        root.join("unaligned"),
        "system.posix_acl_access",
        &posix_acl(),
    )
    .unwrap();
    xattr::set(root.join("empty"), "security.capability", &capability()).unwrap();
    // Not copied: the kernel's own users'.
    xattr::set(root.join("d0"), "trusted.internal", b"x").unwrap();
}

/// A POSIX ACL as the kernel stores it (include/uapi/linux/posix_acl_xattr.h): version 2,
/// then (tag, perm, id) entries: owner rw, user 1234 r, group r, mask r, other none.
fn posix_acl() -> Vec<u8> {
    let undefined = u32::MAX;
    let entries: [(u16, u16, u32); 5] = [
        (0x01, 6, undefined),
        (0x02, 4, 1234),
        (0x04, 4, undefined),
        (0x10, 4, undefined),
        (0x20, 0, undefined),
    ];
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend(tag.to_le_bytes());
        out.extend(perm.to_le_bytes());
        out.extend(id.to_le_bytes());
    }
    out
}

/// A file capability, version 2 (include/uapi/linux/capability.h `vfs_cap_data`):
/// CAP_NET_BIND_SERVICE (10) permitted.
fn capability() -> Vec<u8> {
    let mut out = 0x0200_0000u32.to_le_bytes().to_vec();
    for word in [1u32 << 10, 0, 0, 0] {
        out.extend(word.to_le_bytes());
    }
    out
}

#[derive(Debug, PartialEq)]
struct Meta {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    atime: (i64, i64),
    link: Option<PathBuf>,
}

/// Every entry below `root` by relative path, from lstat (nothing followed).
fn inventory(root: &Path) -> BTreeMap<PathBuf, (Meta, u64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let m = fs::symlink_metadata(root.join(&rel)).unwrap();
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "link"
        } else if ft.is_file() {
            "file"
        } else {
            "other"
        };
        if ft.is_dir() {
            for e in fs::read_dir(root.join(&rel)).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
        let link = ft
            .is_symlink()
            .then(|| fs::read_link(root.join(&rel)).unwrap());
        // Directory sizes and times (lost+found aside) differ by filesystem layout: compared for files and links only.
        let size = if ft.is_dir() { 0 } else { m.size() };
        let meta = Meta {
            kind,
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            size,
            mtime: (m.mtime(), m.mtime_nsec()),
            atime: if ft.is_dir() {
                (0, 0)
            } else {
                (m.atime(), m.atime_nsec())
            },
            link,
        };
        out.insert(rel, (meta, m.ino()));
    }
    out
}

fn request(src: &Path, dst: &Path, chunk: u64, streams: usize) -> CopyRequest {
    CopyRequest {
        source: src.to_owned(),
        target: dst.to_owned(),
        label: "source-vol".into(),
        streams,
        chunk,
        verify: Verify::Checksum,
        live: false,
        target_reused: false,
        base: None,
        extents: None,
    }
}

#[test]
fn a_tree_is_copied_with_every_attribute_link_and_hole() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (
        Fs::new(dir.path(), "src", 256 << 20),
        Fs::new(dir.path(), "dst", 256 << 20),
    );
    dataset(&src.mnt);
    src.remount_ro();
    let before = inventory(&src.mnt);
    let progress = Progress::new(dir.path().join("progress.json"), "source-vol".into());
    copy_tree(&request(&src.mnt, &dst.mnt, 4 << 20, 3), &progress).unwrap();
    assert!(Saved::load(progress.path()).unwrap().unwrap().done);
    let after = inventory(&dst.mnt);
    // Taken before any read of the copy below (reads would move atimes).
    for (rel, (meta, _)) in &before {
        if rel.starts_with("lost+found") || rel.as_os_str().is_empty() {
            continue;
        }
        let Some((got, _)) = after.get(rel) else {
            panic!("{rel:?} missing in the copy")
        };
        let mut want = meta;
        let dir_times;
        if meta.kind == "dir" {
            // A directory's atime moves when it is listed; its mtime must match.
            dir_times = Meta {
                atime: got.atime,
                ..clone_meta(meta)
            };
            want = &dir_times;
        }
        assert_eq!(got, want, "{rel:?}");
    }
    assert_eq!(before.len(), after.len(), "no extra entries");
    for (rel, (meta, _)) in &before {
        if meta.kind == "file" {
            assert_eq!(
                digest_file(&src.mnt.join(rel)),
                digest_file(&dst.mnt.join(rel)),
                "{rel:?}"
            );
        }
    }
    // Links stay links, also the ones pointing out of the tree; /etc was not walked.
    assert_eq!(
        after[Path::new("outside")].0.link.as_deref(),
        Some(Path::new("/etc/passwd"))
    );
    assert_eq!(
        after
            .keys()
            .filter(|k| k.starts_with("outside-dir"))
            .count(),
        1
    );
    assert_eq!(after[Path::new("outside-dir")].0.kind, "link");
    // Hard links: one inode with three names.
    let ino = after[Path::new("hard")].1;
    assert_eq!(after[Path::new("d3/hard2")].1, ino);
    assert_eq!(after[Path::new("d0/e1/f3")].1, ino);
    assert_eq!(fs::metadata(dst.mnt.join("hard")).unwrap().nlink(), 3);
    // Holes stay holes: 2 MiB of data allocated, not 64.
    let blocks = fs::metadata(dst.mnt.join("sparse")).unwrap().blocks() * 512;
    assert!(
        blocks <= (2 << 20) + (64 << 10),
        "sparse copy allocates {blocks} bytes"
    );
    for (name, most) in [
        ("zeros-sparse", 64 << 10),
        ("zeros-sparse-small", 64 << 10),
        ("zeros-dense", u64::MAX),
    ] {
        let (src_blocks, dst_blocks) = (
            fs::metadata(src.mnt.join(name)).unwrap().blocks() * 512,
            fs::metadata(dst.mnt.join(name)).unwrap().blocks() * 512,
        );
        match most {
            u64::MAX => assert!(
                dst_blocks >= 2 << 20,
                "{name}: {dst_blocks} bytes allocated"
            ),
            _ => assert!(
                dst_blocks <= most && src_blocks > 2 << 20,
                "{name}: the copy allocates {dst_blocks} bytes, the source {src_blocks}"
            ),
        }
    }
    // The root's own owner and mode.
    assert_eq!(after[Path::new("")].0.mode, before[Path::new("")].0.mode);
    // Extended attributes: users', the ACL and the capability kept; trusted.* not.
    for (rel, name) in [
        ("big", "user.dataset.sha"),
        ("d1", "user.owner.team"),
        ("unaligned", "system.posix_acl_access"),
        ("empty", "security.capability"),
    ] {
        let want = xattr::get(src.mnt.join(rel), name).unwrap();
        assert!(want.is_some(), "{rel} {name} in the source");
        assert_eq!(
            xattr::get(dst.mnt.join(rel), name).unwrap(),
            want,
            "{rel} {name}"
        );
    }
    assert_eq!(
        xattr::get(dst.mnt.join("d0"), "trusted.internal").unwrap(),
        None
    );
}

fn clone_meta(m: &Meta) -> Meta {
    Meta {
        link: m.link.clone(),
        ..*m
    }
}

/// Run as a child by the kill test (with its environment); otherwise does nothing.
#[test]
fn copy_child_process() {
    let (Some(src), Some(dst), Some(prog)) = (
        std::env::var_os("CLONE_CHILD_SRC"),
        std::env::var_os("CLONE_CHILD_DST"),
        std::env::var_os("CLONE_CHILD_PROGRESS"),
    ) else {
        return;
    };
    let progress = Progress::new(prog.into(), "source-vol".into());
    let req = request(Path::new(&src), Path::new(&dst), 8 << 20, 2);
    copy_tree(
        &CopyRequest {
            verify: Verify::Sizes,
            live: false,
            target_reused: false,
            base: None,
            extents: None,
            ..req
        },
        &progress,
    )
    .unwrap();
}

fn child(src: &Path, dst: &Path, prog: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "copy_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CLONE_CHILD_SRC", src)
        .env("CLONE_CHILD_DST", dst)
        .env("CLONE_CHILD_PROGRESS", prog)
        .spawn()
        .unwrap()
}

#[test]
fn a_copy_killed_midway_resumes_and_reads_the_source_less_than_one_and_a_half_times() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (
        Fs::new(dir.path(), "src", 600 << 20),
        Fs::new(dir.path(), "dst", 600 << 20),
    );
    for i in 0..8u64 {
        fs::write(src.mnt.join(format!("part{i}")), bytes(i, 56 << 20)).unwrap();
    }
    src.remount_ro();
    let dataset = 8 * (56u64 << 20);
    let prog = dir.path().join("progress.json");
    let read0 = src.bytes_read();
    let mut c = child(&src.mnt, &dst.mnt, &prog);
    let started = Instant::now();
    loop {
        let copied = Saved::load(&prog)
            .ok()
            .flatten()
            .map_or(0, |s| s.copied_bytes);
        if copied >= dataset * 3 / 10 {
            break;
        }
        assert!(
            c.try_wait().unwrap().is_none(),
            "the child finished before it could be killed"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no progress recorded"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    c.kill().unwrap();
    assert!(common::killed_by_sigkill(&c.wait().unwrap()));
    let at_kill = Saved::load(&prog).unwrap().unwrap();
    assert!(!at_kill.done && at_kill.watermark > 0, "{at_kill:?}");
    let status = child(&src.mnt, &dst.mnt, &prog).wait().unwrap();
    assert!(status.success());
    assert!(Saved::load(&prog).unwrap().unwrap().done);
    let read = src.bytes_read() - read0;
    eprintln!(
        "dataset {dataset} bytes, read {read} bytes ({:.2}x), killed at {} bytes",
        read as f64 / dataset as f64,
        at_kill.copied_bytes
    );
    assert!(
        read < dataset * 3 / 2,
        "read {read} bytes for a {dataset}-byte dataset"
    );
    for i in 0..8 {
        let p = format!("part{i}");
        assert_eq!(
            digest_file(&src.mnt.join(&p)),
            digest_file(&dst.mnt.join(&p)),
            "{p}"
        );
    }
}

/// What a copy finds in the target where it makes a file: a longer file of a run cut
/// short is cut to the source's bytes; a FIFO (someone else's, or planted) fails the copy
/// naming it, at once, and is left alone.
#[test]
fn a_copy_overwrites_its_own_leftover_and_refuses_a_fifo_in_a_files_place() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (
        Fs::new(dir.path(), "src", 64 << 20),
        Fs::new(dir.path(), "dst", 64 << 20),
    );
    write(&src.mnt.join("kept"), &bytes(1, 5000), 0o644, 40);
    write(&src.mnt.join("piped"), &bytes(2, 100), 0o644, 40);
    src.remount_ro();
    fs::write(dst.mnt.join("kept"), bytes(3, 90_000)).unwrap();
    let req = request(&src.mnt, &dst.mnt, 4 << 20, 2);
    let progress = Progress::new(dir.path().join("p.json"), "source-vol".into());
    copy_tree(&req, &progress).unwrap();
    assert_eq!(fs::read(dst.mnt.join("kept")).unwrap(), bytes(1, 5000));
    assert_eq!(fs::metadata(dst.mnt.join("kept")).unwrap().uid(), 40);

    let other = Fs::new(dir.path(), "other", 64 << 20);
    nix::unistd::mkfifo(
        &other.mnt.join("piped"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let req = request(&src.mnt, &other.mnt, 4 << 20, 2);
    let progress = Progress::new(dir.path().join("q.json"), "source-vol".into());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(copy_tree(&req, &progress).map_err(|e| e.to_string())));
    let err = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the copy blocked on the FIFO")
        .unwrap_err();
    assert!(err.contains("piped"), "{err}");
    let st = fs::symlink_metadata(other.mnt.join("piped")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()));
}

fn cpu_seconds(who: nix::sys::resource::UsageWho) -> f64 {
    let u = nix::sys::resource::getrusage(who).unwrap();
    let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    s(u.user_time()) + s(u.system_time())
}

/// The figures of the closing note, by hand: `cargo test --test clone_copy_root --
/// --ignored --nocapture throughput`. The engine against `cp -a` on the same loop
/// devices (1 GiB: 12 files of 80 MiB and 600 of 64 KiB), the source remounted before
/// each run so its page cache is cold.
#[test]
#[ignore]
fn throughput_against_cp_a() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let src = Fs::new(dir.path(), "src", 1400 << 20);
    for i in 0..12u64 {
        fs::write(src.mnt.join(format!("big{i}")), bytes(i, 80 << 20)).unwrap();
    }
    fs::create_dir_all(src.mnt.join("small")).unwrap();
    for i in 0..600u64 {
        fs::write(src.mnt.join(format!("small/{i}")), bytes(100 + i, 64 << 10)).unwrap();
    }
    let gib = (12.0 * 80.0 + 600.0 * 0.0625) / 1024.0;
    let cold = || {
        run("umount", &[src.mnt.to_str().unwrap()]);
        run(
            "mount",
            &["-o", "ro", &src.dev.arg(), src.mnt.to_str().unwrap()],
        );
    };
    for round in 0..2 {
        for tool in ["engine", "cp -a"] {
            let dst = Fs::new(
                dir.path(),
                &format!("dst-{round}-{}", tool.len()),
                1400 << 20,
            );
            cold();
            let (t0, c0, k0) = (
                Instant::now(),
                cpu_seconds(nix::sys::resource::UsageWho::RUSAGE_SELF),
                cpu_seconds(nix::sys::resource::UsageWho::RUSAGE_CHILDREN),
            );
            if tool == "engine" {
                let p = Progress::new(dir.path().join(format!("p{round}.json")), "bench".into());
                let req = CopyRequest {
                    verify: Verify::Sizes,
                    live: false,
                    target_reused: false,
                    base: None,
                    extents: None,
                    ..request(
                        &src.mnt,
                        &dst.mnt,
                        gds_csi::volume::copy::CHUNK,
                        gds_csi::volume::copy::STREAMS,
                    )
                };
                copy_tree(&req, &p).unwrap();
            } else {
                run(
                    "cp",
                    &[
                        "-a",
                        &format!("{}/.", src.mnt.display()),
                        dst.mnt.to_str().unwrap(),
                    ],
                );
                run("sync", &["-f", dst.mnt.to_str().unwrap()]);
            }
            let wall = t0.elapsed().as_secs_f64();
            let cpu = cpu_seconds(nix::sys::resource::UsageWho::RUSAGE_SELF) - c0
                + cpu_seconds(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
                - k0;
            eprintln!(
                "round {round} {tool}: {gib:.2} GiB in {wall:.2} s = {:.2} GiB/s, CPU {:.2} s/GiB",
                gib / wall,
                cpu / gib
            );
        }
    }
}
