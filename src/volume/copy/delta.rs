//! What changed in a source since a copy walked it, copied again: the last pass of a
//! snapshot of a mounted volume, made while its filesystem is frozen, so the copy is the
//! volume as it was at the freeze although pods wrote to it during the first pass.
//!
//! An entry is unchanged when its kind, inode, size, mode, owner, link count and both
//! its modification and change times are what the first walk saw: a write to a file
//! moves its mtime and ctime, a chmod, chown, link or rename its ctime, and nothing but
//! the kernel sets a ctime (utimensat(2) can set mtime back, not ctime). Everything else
//! is copied again whole: new and changed entries are removed from the copy and made
//! anew, removed ones removed, then each changed entry's owner, mode and times set
//! (a directory whose entries changed has a new mtime itself, so it is among them).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::base::SourceStat;
use super::walk::{self, kind_of, open_dir, Entry, Kind};
use super::{data, meta, verify, Progress, Verify};
use crate::error::{Error, Result};

/// What the pass found and copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    /// New or changed entries, copied again.
    pub copied: usize,
    /// Entries gone from the source, removed from the copy.
    pub removed: usize,
    /// Data bytes of the copied files.
    pub bytes: u64,
}

fn same(a: &Entry, b: &Entry) -> bool {
    a.kind == b.kind && SourceStat::of(&a.st) == SourceStat::of(&b.st)
}

/// Walks `src` again and brings `dst` (a copy of `src` as `before` lists it) up to it.
/// Returns the new walk and what was copied.
pub fn copy_changes(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    before: &[Entry],
    verify_how: Verify,
    streams: usize,
    progress: &Progress,
) -> Result<(Vec<Entry>, Changes)> {
    let now = walk::walk(src, shown)?;
    let Difference {
        out,
        removed,
        subset,
    } = Difference::between(before, &now);
    remove_deepest_first(dst, shown, out)?;
    let changes = Changes {
        copied: subset.len() - 1,
        removed,
        bytes: 0,
    };
    if changes.copied == 0 && changes.removed == 0 && same(&before[0], &now[0]) {
        return Ok((now, changes));
    }
    let bytes = copy_again(src, dst, shown, &subset, verify_how, streams, progress)?;
    Ok((now, Changes { bytes, ..changes }))
}

/// How the copy differs from the source's new walk.
struct Difference<'a> {
    /// Out of the copy first: what is gone, and the old copy of each changed entry that
    /// is not a directory kept as one (it is made anew).
    out: Vec<&'a Path>,
    /// How many of `out` are gone from the source.
    removed: usize,
    /// The root, then every new or changed entry: what is copied again.
    subset: Vec<Entry>,
}

impl<'a> Difference<'a> {
    fn between(before: &'a [Entry], now: &'a [Entry]) -> Difference<'a> {
        let old: HashMap<&Path, &Entry> = before.iter().map(|e| (e.rel.as_path(), e)).collect();
        let current: HashSet<&Path> = now.iter().map(|e| e.rel.as_path()).collect();
        let mut out: Vec<&Path> = before
            .iter()
            .skip(1)
            .filter(|e| !current.contains(e.rel.as_path()))
            .map(|e| e.rel.as_path())
            .collect();
        let removed = out.len();
        let mut subset: Vec<Entry> = vec![now[0].clone()];
        for e in now.iter().skip(1) {
            match old.get(e.rel.as_path()) {
                Some(o) if same(o, e) => continue,
                Some(o) if o.kind == Kind::Dir && e.kind == Kind::Dir => {}
                Some(_) => out.push(e.rel.as_path()),
                None => {}
            }
            subset.push(e.clone());
        }
        Difference {
            out,
            removed,
            subset,
        }
    }
}

/// Removes each of `out` from the copy, a directory's entries before it.
fn remove_deepest_first(dst: BorrowedFd<'_>, shown: &Path, mut out: Vec<&Path>) -> Result<()> {
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for rel in out {
        remove_beneath(dst, rel).map_err(|e| Error::io("remove", shown.join(rel), e.into()))?;
    }
    Ok(())
}

/// Copies `subset` (the root first) into the copy as the first pass copies a tree:
/// structure, data, links, verification, metadata, sync. Returns its data bytes.
fn copy_again(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    subset: &[Entry],
    verify_how: Verify,
    streams: usize,
    progress: &Progress,
) -> Result<u64> {
    let streams = super::Streams {
        count: streams,
        progress: Some(progress),
    };
    let mut links = meta::links(subset);
    let bytes: u64 = links.primaries.iter().map(|&i| subset[i].size()).sum();
    let piece = data::piece_len(bytes, streams.count, super::CHUNK);
    let units = data::units(subset, &links.primaries, piece);
    links.whole = data::whole_files(&units);
    meta::create_structure(src, dst, shown, subset, &links, streams, false)?;
    let roots = data::Roots::new(src, dst, shown, false);
    data::copy_units(&roots, subset, &units, (0, &[]), streams.count, progress)?;
    meta::link_all(dst, shown, subset, &links)?;
    verify::verify(src, dst, shown, subset, &links, verify_how, streams)?;
    meta::finish_metadata(src, dst, shown, subset, &links, streams, false)?;
    if meta::has_xattrs(src) {
        verify::xattrs(src, dst, shown, subset, &links, streams)?;
    }
    nix::unistd::syncfs(dst).map_err(|e| Error::io("syncfs", shown, e.into()))?;
    Ok(bytes)
}

/// Removes everything in the directory `root` (never following a symlink).
pub fn empty(root: BorrowedFd<'_>, shown: &Path) -> Result<()> {
    let top = walk::walk(root, shown)?;
    for e in top
        .iter()
        .skip(1)
        .filter(|e| e.rel.components().count() == 1)
    {
        remove_beneath(root, &e.rel)
            .map_err(|x| Error::io("remove", shown.join(&e.rel), x.into()))?;
    }
    Ok(())
}

/// Removes `rel` beneath `root`: a file, link or node, or a directory with everything in
/// it; never following a symlink. Gone already is success.
fn remove_beneath(root: BorrowedFd<'_>, rel: &Path) -> nix::Result<()> {
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().ok_or(Errno::EINVAL)?;
    let dir = open_dir(root, parent)?;
    let st = match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if kind_of(&st) != Kind::Dir {
        return unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir);
    }
    let inner = open_dir(root, rel)?;
    let entries = walk::walk(inner.as_fd(), rel).map_err(|_| Errno::EIO)?;
    let mut below: Vec<&Entry> = entries.iter().skip(1).collect();
    below.sort_by_key(|e| std::cmp::Reverse(e.rel.components().count()));
    for e in below {
        let (d, n) = (
            open_dir(inner.as_fd(), e.rel.parent().unwrap_or(Path::new("")))?,
            e.rel.file_name().ok_or(Errno::EINVAL)?,
        );
        let how = if e.kind == Kind::Dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        unlinkat(d.as_fd(), n, how)?;
    }
    unlinkat(dir.as_fd(), name, UnlinkatFlags::RemoveDir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::copy::{copy_tree_at, CopyRequest, Saved};
    use std::os::fd::OwnedFd;

    fn open(p: &Path) -> OwnedFd {
        nix::fcntl::open(
            p,
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap()
    }

    fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for e in walk::walk(open(root).as_fd(), root).unwrap().iter().skip(1) {
            let path = root.join(&e.rel);
            let data = match e.kind {
                Kind::File => std::fs::read(&path).unwrap(),
                Kind::Symlink => std::fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
                _ => Vec::new(),
            };
            out.push((e.rel.display().to_string(), data));
        }
        out
    }

    /// A snapshot's first pass: `src` copied live into `dst`, its record in `records`.
    fn first_live_pass(src: &Path, dst: &Path, records: &Path) -> Vec<Entry> {
        let req = CopyRequest {
            source: src.to_owned(),
            target: dst.to_owned(),
            label: "t".into(),
            streams: 2,
            chunk: crate::volume::copy::CHUNK,
            verify: Verify::Sizes,
            live: true,
            target_reused: true,
            base: None,
            extents: None,
        };
        let progress = Progress::new(records.join("p.json"), "t".into());
        copy_tree_at(open(src).as_fd(), open(dst).as_fd(), &req, &progress).unwrap()
    }

    #[test]
    fn the_copy_becomes_the_source_again_after_writes_renames_and_removals() {
        let (s, d, p) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let src = s.path();
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/keep"), b"same").unwrap();
        std::fs::write(src.join("a/grows"), b"short").unwrap();
        std::fs::write(src.join("a/b/goes"), b"x").unwrap();
        std::fs::create_dir(src.join("dir-to-file")).unwrap();
        std::fs::write(src.join("dir-to-file/inner"), b"y").unwrap();
        let before = first_live_pass(src, d.path(), p.path());
        assert_eq!(tree(src), tree(d.path()));
        // The world changes after the first pass.
        std::fs::write(src.join("a/grows"), b"much longer now").unwrap();
        std::fs::remove_file(src.join("a/b/goes")).unwrap();
        std::fs::rename(src.join("a/keep"), src.join("a/kept")).unwrap();
        std::fs::remove_dir_all(src.join("dir-to-file")).unwrap();
        std::fs::write(src.join("dir-to-file"), b"now a file").unwrap();
        std::fs::hard_link(src.join("a/grows"), src.join("a/b/link")).unwrap();
        std::os::unix::fs::symlink("../kept", src.join("a/b/sym")).unwrap();
        let delta_progress = Progress::new(p.path().join("d.json"), "t".into());
        let (_, changes) = copy_changes(
            open(src).as_fd(),
            open(d.path()).as_fd(),
            src,
            &before,
            Verify::Checksum,
            2,
            &delta_progress,
        )
        .unwrap();
        assert_eq!(tree(src), tree(d.path()));
        assert!(changes.removed >= 3, "{changes:?}");
        use std::os::unix::fs::MetadataExt;
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(&d.path().join("a/grows")),
            ino(&d.path().join("a/b/link"))
        );
        // Nothing changed since: nothing is copied.
        let (again, none) = copy_changes(
            open(src).as_fd(),
            open(d.path()).as_fd(),
            src,
            &walk::walk(open(src).as_fd(), src).unwrap(),
            Verify::Sizes,
            2,
            &delta_progress,
        )
        .unwrap();
        assert_eq!(none, Changes::default());
        assert_eq!(
            again.len(),
            walk::walk(open(src).as_fd(), src).unwrap().len()
        );
    }

    #[test]
    fn a_reused_target_that_starts_over_keeps_nothing_the_source_lacks() {
        let (s, d, p) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        std::fs::write(s.path().join("kept"), b"k").unwrap();
        // An earlier attempt's files: one the source lost since, one now a directory.
        std::fs::write(d.path().join("stale"), b"old").unwrap();
        std::fs::create_dir_all(d.path().join("dir/deep")).unwrap();
        std::fs::write(d.path().join("dir/deep/x"), b"old").unwrap();
        let req = |reused| CopyRequest {
            source: s.path().to_owned(),
            target: d.path().to_owned(),
            label: "t".into(),
            streams: 2,
            chunk: crate::volume::copy::CHUNK,
            verify: Verify::Sizes,
            live: false,
            target_reused: reused,
            base: None,
            extents: None,
        };
        let progress = Progress::new(p.path().join("p.json"), "t".into());
        copy_tree_at(
            open(s.path()).as_fd(),
            open(d.path()).as_fd(),
            &req(true),
            &progress,
        )
        .unwrap();
        assert_eq!(tree(s.path()), tree(d.path()));
        // A resume over the same walk keeps the target (nothing copied again is lost).
        std::fs::write(d.path().join("marker"), b"m").unwrap();
        copy_tree_at(
            open(s.path()).as_fd(),
            open(d.path()).as_fd(),
            &req(true),
            &progress,
        )
        .unwrap();
        assert!(
            d.path().join("marker").exists(),
            "a finished copy over the same walk is left"
        );
    }

    #[test]
    fn a_resumed_copy_skips_the_units_an_earlier_run_finished_above_its_watermark() {
        let (s, d, p) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        for name in ["a", "b", "c"] {
            std::fs::write(s.path().join(name), name.repeat(4096)).unwrap();
        }
        let req = CopyRequest {
            source: s.path().to_owned(),
            target: d.path().to_owned(),
            label: "t".into(),
            streams: 1,
            chunk: crate::volume::copy::CHUNK,
            verify: Verify::Sizes,
            live: false,
            target_reused: false,
            base: None,
            extents: None,
        };
        // A first run's record: the structure made, unit 2 (file c) done, unit 0 not.
        let path = p.path().join("p.json");
        let first = Progress::new(path.clone(), "t".into());
        let entries =
            copy_tree_at(open(s.path()).as_fd(), open(d.path()).as_fd(), &req, &first).unwrap();
        assert_eq!(entries.len(), 4);
        let mut saved = Saved::load(&path).unwrap().unwrap();
        (
            saved.done,
            saved.watermark,
            saved.copied_bytes,
            saved.done_above,
        ) = (false, 0, 0, vec![2]);
        saved.store(&path).unwrap();
        std::fs::write(d.path().join("c"), "x".repeat(4096)).unwrap();
        std::fs::write(d.path().join("a"), "y".repeat(4096)).unwrap();
        let again = Progress::new(path.clone(), "t".into());
        copy_tree_at(open(s.path()).as_fd(), open(d.path()).as_fd(), &req, &again).unwrap();
        assert_eq!(
            std::fs::read(d.path().join("a")).unwrap(),
            "a".repeat(4096).into_bytes(),
            "copied again"
        );
        assert_eq!(
            std::fs::read(d.path().join("c")).unwrap(),
            "x".repeat(4096).into_bytes(),
            "skipped: done before"
        );
        assert!(Saved::load(&path).unwrap().unwrap().done);
    }
}
