//! Volumes that arrive filled: a directory tree copied from a read-only source
//! directory into a new volume's filesystem before the volume can be published.
//!
//! The engine (`copy_tree`) knows only two directories: the source, a read-only
//! directory some backend mounted (a block volume's filesystem today, an NFS export
//! later), and the target. It copies with large aligned `O_DIRECT` I/O on several
//! streams, keeps modes, owners, times, symlinks (never followed), hard links and
//! holes, records its progress in the state dir so a restarted driver resumes, and runs
//! as a job (`src/runtime/overlap.rs`) so a NodeStage that gives up leaves it running and the
//! retry joins it (`Cloner`). `block/fill/` is the block backend's hook: the source volume
//! mounted read-only in a private directory, the target after mkfs. A raw block clone is
//! copied device to device instead (`raw`), with the same record, jobs and progress.

pub mod base;
pub mod data;
pub mod delta;
pub mod measure;
pub mod meta;
pub mod progress;
pub mod raw;
pub mod verify;
pub mod walk;

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;

pub use progress::{Progress, Saved};
pub use verify::Verify;

use crate::error::{Error, Result};
use crate::runtime::overlap::Jobs;

/// One read or write of the copy (each stream holds one such buffer: 32 MiB per copy).
pub const BUFFER: usize = 4 << 20;
/// The largest piece of a file one stream copies at a time; also what a restart redoes
/// at most per stream.
pub const CHUNK: u64 = 64 << 20;
/// Streams copying at once. NVMe and NFS over RDMA both want several I/Os in flight, and
/// a small file costs a stream an open and a close on the server besides its read: with 4
/// streams the copy's data phase reached 0.87 of fio's read of the same tree (4 reads in
/// flight) on the VM rig.
pub const STREAMS: usize = 8;

#[derive(Debug, Clone)]
pub struct CopyRequest {
    pub source: PathBuf,
    pub target: PathBuf,
    /// How the source is named in the progress record and message.
    pub label: String,
    pub streams: usize,
    /// The largest piece of a file one stream copies at a time (`data::piece_len`).
    pub chunk: u64,
    pub verify: Verify,
    /// The source may change while it is copied (a snapshot's pass over a mounted
    /// volume): nothing is verified here; the caller copies what changed with the source
    /// frozen (`delta`) and verifies that.
    pub live: bool,
    /// The target may hold an earlier attempt's files (a snapshot's tree): a copy resumes
    /// only over the same walk (a digest of every entry), and one that starts over
    /// empties the target first, so nothing the source no longer has is kept.
    pub target_reused: bool,
    /// An earlier copy of the same source on the target's filesystem: files unchanged
    /// since it are linked from it, not copied (`base`).
    pub base: Option<Arc<base::Base>>,
    /// The source's data regions of its files with holes, as a snapshot recorded them:
    /// only those are read (`data::Extents`).
    pub extents: Option<Arc<data::Extents>>,
}

impl CopyRequest {
    fn streams_with<'a>(&self, progress: &'a Progress) -> Streams<'a> {
        Streams {
            count: self.streams,
            progress: Some(progress),
        }
    }
}

/// Directory `path` opened read-only; its last component is never a symlink.
pub fn open_root(path: &Path) -> Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    open(path, flags, Mode::empty()).map_err(|e| Error::io("open", path, e.into()))
}

/// Copies `req.source` into `req.target` (blocking), resuming from what `progress`'s
/// record says was done, and verifies the result. Done already: returns at once.
pub fn copy_tree(req: &CopyRequest, progress: &Progress) -> Result<()> {
    let (src, dst) = (open_root(&req.source)?, open_root(&req.target)?);
    copy_tree_at(src.as_fd(), dst.as_fd(), req, progress).map(drop)
}

/// `copy_tree` between directories the caller opened (the NFS backend walks to them from
/// the export's root with `openat`, never following a symlink); `req.source` and
/// `req.target` only name them in messages. Returns the source's entries as the walk
/// found them (what a later `delta::copy_changes` compares with).
pub fn copy_tree_at(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    req: &CopyRequest,
    progress: &Progress,
) -> Result<Vec<walk::Entry>> {
    let mut phases = Phases::start();
    let plan = TreePlan::walk(src, req)?;
    phases.end("walk");
    let mut saved = resume_or_start(dst, req, &plan, progress)?;
    if saved.done {
        return Ok(plan.entries);
    }
    if !saved.structure_done {
        let streams = req.streams_with(progress);
        let (copied, links) = (&plan.copied, &plan.links);
        meta::create_structure(src, dst, &req.target, copied, links, streams, req.live)?;
        link_from_base(src, dst, req, &plan, progress)?;
        saved.structure_done = true;
        progress.set(saved.clone())?;
    }
    phases.end("structure");
    copy_data(src, dst, req, &plan, &saved, progress)?;
    phases.end("data");
    saved = record_data_copied(&plan, progress)?;
    link_and_verify(src, dst, req, &plan, progress)?;
    phases.end("verify");
    finish_metadata_and_sync(src, dst, req, &plan, progress)?;
    phases.end("metadata and sync");
    saved.done = true;
    progress.set(saved)?;
    tracing::info!(
        source = %req.label,
        entries = plan.entries.len(),
        linked = plan.linked.len(),
        bytes = plan.total,
        piece = plan.piece,
        streams = req.streams,
        phases = %phases,
        "copy finished"
    );
    Ok(plan.entries)
}

/// What the walk found, and its data cut in units for the streams.
struct TreePlan {
    entries: Vec<walk::Entry>,
    /// Files linked from the base, unchanged since it.
    linked: Vec<walk::Entry>,
    /// The root and every entry not linked: what is made, copied, verified and finished.
    copied: Vec<walk::Entry>,
    /// Of `copied`.
    links: meta::Links,
    /// Data bytes of the files that carry data (one name per inode).
    total: u64,
    piece: u64,
    units: Vec<data::Unit>,
}

impl TreePlan {
    fn walk(src: BorrowedFd<'_>, req: &CopyRequest) -> Result<TreePlan> {
        let entries = if req.live {
            walk::walk_live(src, &req.source)?
        } else {
            walk::walk(src, &req.source)?
        };
        let unchanged = match &req.base {
            Some(base) => base.unchanged(&entries),
            None => Default::default(),
        };
        let (mut linked, mut copied) = (Vec::new(), Vec::new());
        for (i, e) in entries.iter().enumerate() {
            match unchanged.contains(&i) {
                true => linked.push(e.clone()),
                false => copied.push(e.clone()),
            }
        }
        let mut links = meta::links(&copied);
        let total: u64 = links.primaries.iter().map(|&i| copied[i].size()).sum();
        let piece = data::piece_len(total, req.streams, req.chunk);
        let units = data::units(&copied, &links.primaries, piece);
        links.whole = data::whole_files(&units);
        Ok(TreePlan {
            entries,
            linked,
            copied,
            links,
            total,
            piece,
            units,
        })
    }
}

/// The record to go on from, stored before anything is copied: the saved one when it
/// describes this same copy, else a fresh one (over an emptied target when it is reused).
fn resume_or_start(
    dst: BorrowedFd<'_>,
    req: &CopyRequest,
    plan: &TreePlan,
    progress: &Progress,
) -> Result<Saved> {
    let (total, piece) = (plan.total, plan.piece);
    let fresh = Saved {
        source: req.label.clone(),
        entries: plan.entries.len(),
        total_bytes: total,
        piece,
        walk: if req.live || req.target_reused {
            walk_digest(plan, req.base.as_deref())
        } else {
            String::new()
        },
        ..Saved::default()
    };
    let same = |s: &Saved| {
        (&s.source, s.entries, s.total_bytes, s.piece, &s.walk)
            == (&fresh.source, fresh.entries, total, piece, &fresh.walk)
    };
    let resumed = Saved::load(progress.path())?.filter(same);
    if resumed.is_none() && req.target_reused {
        delta::empty(dst, &req.target)?;
    }
    let saved = resumed.unwrap_or(fresh);
    progress.set(saved.clone())?;
    Ok(saved)
}

/// The files unchanged since the base linked from it (their directories exist).
fn link_from_base(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    req: &CopyRequest,
    plan: &TreePlan,
    progress: &Progress,
) -> Result<()> {
    let Some(base) = &req.base else {
        return Ok(());
    };
    let streams = req.streams_with(progress);
    let copied = base.link_into(src, dst, &req.target, &plan.linked, req.verify, streams)?;
    crate::runtime::faults::reached(crate::runtime::faults::KillPoint::SnapshotAfterLinks);
    if copied > 0 {
        tracing::warn!(source = %req.label, base = %base.label, copied,
            "files unchanged since the base snapshot copied: the base's copy could not be linked");
    }
    Ok(())
}

/// The files' data, from the units `saved` says are not done yet.
fn copy_data(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    req: &CopyRequest,
    plan: &TreePlan,
    saved: &Saved,
    progress: &Progress,
) -> Result<()> {
    let roots = data::Roots {
        extents: req.extents.as_deref(),
        ..data::Roots::new(src, dst, &req.source, req.live)
    };
    data::copy_units(
        &roots,
        &plan.copied,
        &plan.units,
        (saved.watermark, &saved.done_above),
        req.streams,
        progress,
    )
}

/// Records every unit copied; returns the record.
fn record_data_copied(plan: &TreePlan, progress: &Progress) -> Result<Saved> {
    let mut saved = progress.saved();
    (saved.watermark, saved.copied_bytes) = (plan.units.len(), plan.total);
    saved.done_above.clear();
    progress.set(saved.clone())?;
    Ok(saved)
}

/// Hard links made, then the copy verified (nothing verified of a live source).
fn link_and_verify(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    req: &CopyRequest,
    plan: &TreePlan,
    progress: &Progress,
) -> Result<()> {
    let entries = &plan.copied;
    meta::link_all(dst, &req.target, entries, &plan.links)?;
    // Verified before times are set: reading a symlink or file moves its atime.
    if !req.live {
        let (how, streams) = (req.verify, req.streams_with(progress));
        verify::verify(src, dst, &req.target, entries, &plan.links, how, streams)?;
    }
    Ok(())
}

/// Owners, modes, times and xattrs set (xattrs verified unless the source is live), then
/// the target's filesystem synced.
fn finish_metadata_and_sync(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    req: &CopyRequest,
    plan: &TreePlan,
    progress: &Progress,
) -> Result<()> {
    let (entries, links, streams) = (&plan.copied, &plan.links, req.streams_with(progress));
    meta::finish_metadata(src, dst, &req.target, entries, links, streams, req.live)?;
    if !req.live && meta::has_xattrs(src) {
        verify::xattrs(src, dst, &req.target, entries, links, streams)?;
    }
    nix::unistd::syncfs(dst).map_err(|e| Error::io("syncfs", &req.target, e.into()))
}

/// SHA-256 over every entry's name, kind, inode, size and times, and the base with the
/// names linked from it (`Saved::walk`): a copy resumes only over the same plan, so no
/// name linked from one base is ever taken for a file of its own.
fn walk_digest(plan: &TreePlan, base: Option<&base::Base>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    if let Some(b) = base {
        h.update(format!("base {}\0", b.label).as_bytes());
        for e in &plan.linked {
            h.update(e.rel.as_os_str().as_encoded_bytes());
            h.update(b"\0");
        }
    }
    for e in &plan.entries {
        let st = &e.st;
        h.update(e.rel.as_os_str().as_encoded_bytes());
        h.update(
            format!(
                "\0{:?} {} {} {}.{} {}.{} {:o}\n",
                e.kind,
                st.st_ino,
                st.st_size,
                st.st_mtime,
                st.st_mtime_nsec,
                st.st_ctime,
                st.st_ctime_nsec,
                st.st_mode
            )
            .as_bytes(),
        );
    }
    format!("{:x}", h.finalize())
}

/// The threads a per-entry phase runs on, and the copy's progress each finished entry
/// keeps alive: on an NFS side every entry is a round trip, so a phase of many entries
/// that moves no bytes (metadata, verification, links, the manifest) is no stalled store.
#[derive(Clone, Copy)]
pub struct Streams<'a> {
    pub count: usize,
    pub progress: Option<&'a Progress>,
}

impl Streams<'_> {
    /// `f` on every item on `count` threads (`runtime::parallel`).
    pub fn each<T: Sync>(&self, items: &[T], f: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
        crate::runtime::parallel::each_in_parallel(items, self.count, |item| {
            f(item)?;
            if let Some(p) = self.progress {
                p.answered();
            }
            Ok(())
        })
    }
}

/// Seconds per phase of one copy, for the log line that says where its time went.
struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, f64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    fn end(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        self.done
            .push((phase, now.duration_since(self.last).as_secs_f64()));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .done
            .iter()
            .map(|(phase, s)| format!("{phase} {s:.2} s"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// Copies running as jobs, and their live progress by key, for the message a waiting
/// NodeStage answers.
#[derive(Default)]
pub struct Cloner {
    pub jobs: Jobs,
    live: Mutex<HashMap<String, Arc<Progress>>>,
}

impl Cloner {
    /// The live progress of `key`, made from its record file when first asked.
    pub fn progress(&self, key: &str, volume: &str, path: PathBuf, label: &str) -> Arc<Progress> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            live.entry(key.to_owned()).or_insert_with(|| {
                Arc::new(Progress::new(path, label.to_owned()).for_volume(volume))
            }),
        )
    }

    pub fn forget(&self, key: &str) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Runs `work` as the job `key` (or joins it) and waits at most `wait`: past that the
    /// answer is Unavailable with the progress as its message, and the job goes on.
    pub async fn run<F>(
        &self,
        key: &str,
        progress: &Progress,
        wait: Duration,
        work: F,
    ) -> Result<()>
    where
        F: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        match tokio::time::timeout(wait, self.jobs.run(key, "clone", work)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Error::NotReady(progress.message())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_finished_without_bytes_keep_a_copy_from_looking_stalled() {
        let dir = tempfile::tempdir().unwrap();
        let p = Progress::new(dir.path().join("p.json"), "src".into());
        std::thread::sleep(Duration::from_millis(1100));
        assert!(p.stalled_secs() >= 1, "nothing moved for a second");
        let items: Vec<usize> = (0..16).collect();
        let quiet = Streams {
            count: 4,
            progress: None,
        };
        quiet.each(&items, |_| Ok(())).unwrap();
        assert!(p.stalled_secs() >= 1, "entries of another copy");
        let streams = Streams {
            count: 4,
            progress: Some(&p),
        };
        streams.each(&items, |_| Ok(())).unwrap();
        assert_eq!(p.stalled_secs(), 0, "each entry finished is an answer");
    }

    #[test]
    fn recorded_extents_decide_what_is_read_of_a_file_of_the_recorded_size() {
        let (src, dst, records) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let bytes: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8 + 1).collect();
        std::fs::write(src.path().join("recorded"), &bytes).unwrap();
        std::fs::write(src.path().join("resized"), &bytes).unwrap();
        let known = vec![(0, 4096), (2 << 20, (2 << 20) + 100)];
        let extents: data::Extents = [
            ("recorded".into(), (3 << 20, known.clone())),
            // Recorded for another size: the file is no longer what was recorded.
            ("resized".into(), (1 << 20, known.clone())),
        ]
        .into_iter()
        .collect();
        let req = CopyRequest {
            source: src.path().to_owned(),
            target: dst.path().to_owned(),
            label: "snap".into(),
            streams: 2,
            chunk: 1 << 20,
            verify: Verify::Sizes,
            live: false,
            target_reused: false,
            base: None,
            extents: Some(Arc::new(extents)),
        };
        let progress = Progress::new(records.path().join("p.json"), "snap".into());
        copy_tree(&req, &progress).unwrap();
        let copy = std::fs::read(dst.path().join("recorded")).unwrap();
        assert_eq!(copy.len(), bytes.len());
        for (at, (a, b)) in copy.iter().zip(&bytes).enumerate() {
            let read = known.iter().any(|&(s, e)| (s..e).contains(&(at as u64)));
            assert_eq!(*a, if read { *b } else { 0 }, "byte {at}");
        }
        assert_eq!(std::fs::read(dst.path().join("resized")).unwrap(), bytes);
    }

    #[tokio::test]
    async fn a_stage_that_cannot_wait_answers_the_progress_and_the_retry_joins_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let cloner = Cloner::default();
        let p = cloner.progress("clone:v", "v", dir.path().join("p.json"), "blk:src");
        p.set(Saved {
            total_bytes: 4 << 30,
            copied_bytes: 1 << 30,
            ..Saved::default()
        })
        .unwrap();
        let (release, gate) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            gate.await.ok();
            Ok(())
        };
        let wait = Duration::from_millis(50);
        let err = cloner.run("clone:v", &p, wait, work).await.unwrap_err();
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status
                .message()
                .starts_with("pre-staging from blk:src: 25% (1.0 of 4.0 GiB), "),
            "{}",
            status.message()
        );
        // The retry brings work that must not start: it joins the running copy.
        release.send(()).unwrap();
        let never = async {
            Err(Error::JobLost {
                key: "started twice".into(),
            })
        };
        cloner
            .run("clone:v", &p, Duration::from_secs(5), never)
            .await
            .unwrap();
    }
}
