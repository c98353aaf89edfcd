//! `gds-csi populate`: a claim's volume filled with a Dataset's tree, run by the populator's
//! pod on the node the claim's volume was made on (the volume mounted at `target`, the
//! dataset at `source`). The copy is the engine every fill uses (resume from its record,
//! verification, progress); its progress goes to stdout as one JSON line every
//! `--every`, the last line saying how it ended, which the populator reads from the pod's
//! log to fill the Dataset's status and the claim's events.
//!
//! The record lives beside the volume, not in it (a file of ours in the tree would be
//! copied into the user's data): a pod killed mid-copy is replaced by one that resumes
//! from it; a finished copy removes it.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{CloneError, Error, Result};
use crate::volume::copy::measure::{measure, Measured};
use crate::volume::copy::{
    copy_tree_at, open_root, walk, CopyRequest, Progress, Saved, Verify, CHUNK, STREAMS,
};

/// What `populate` is asked to do.
#[derive(Debug, Clone)]
pub struct Populate {
    /// The directory the Dataset's path is beneath (the node's dataset root).
    pub source: PathBuf,
    /// The Dataset's directory beneath `source`: nothing on the way is followed, so a
    /// symlink planted there cannot send the copy elsewhere on the host.
    pub path: PathBuf,
    pub target: PathBuf,
    pub record: PathBuf,
    pub verify: Verify,
    /// How the source is named in messages (`<namespace>/<dataset>`).
    pub label: String,
    pub every: Duration,
}

/// One progress line. `phase` is `Measuring`, `Copying`, `Done` or `Failed`; a failure
/// says what to do in `message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub phase: String,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    pub entries: usize,
    pub bytes_per_second: u64,
    pub message: String,
}

/// Runs the copy, printing a [`Report`] line every `every` and a last one (Done or
/// Failed). The outcome is also the exit status.
pub fn run(p: &Populate) -> Result<()> {
    emit(&report(
        "Measuring",
        0,
        0,
        0,
        0,
        "measuring the dataset".into(),
    ));
    let outcome = measure_and_check(p).and_then(|m| copy(p, &m));
    match &outcome {
        Ok(m) => emit(&report(
            "Done",
            m.data_bytes,
            m.data_bytes,
            m.entries,
            0,
            format!("filled with {} and verified", p.label),
        )),
        Err(e) => emit(&report("Failed", 0, 0, 0, 0, e.to_string())),
    }
    outcome.map(drop)
}

fn report(phase: &str, copied: u64, total: u64, entries: usize, rate: u64, m: String) -> Report {
    Report {
        phase: phase.into(),
        copied_bytes: copied,
        total_bytes: total,
        entries,
        bytes_per_second: rate,
        message: m,
    }
}

fn emit(r: &Report) {
    if let Ok(line) = serde_json::to_string(r) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// The dataset measured and compared with the room the volume has: a dataset larger
/// than the volume can hold is refused before a byte is written, naming the size to ask
/// for. What an earlier run recorded as copied counts as room (it is rewritten in place).
fn measure_and_check(p: &Populate) -> Result<Measured> {
    let m = measure(&p.source, &p.path)?;
    let st = nix::sys::statvfs::statvfs(&p.target)
        .map_err(|e| Error::io("statvfs", &p.target, e.into()))?;
    let frsize = st.fragment_size() as u64;
    let copied = Saved::load(&p.record)?.map_or(0, |s| s.copied_bytes);
    let room = (st.blocks_available() as u64 * frsize).saturating_add(copied);
    // `needed_bytes` is a volume size: the files' blocks and a sixteenth for the
    // filesystem's own metadata, which a mounted filesystem's free space already left out.
    let blocks = m.needed_bytes / 16 * 15;
    if blocks > room {
        return Err(CloneError::DatasetTooLarge {
            label: p.label.clone(),
            data_bytes: m.data_bytes,
            entries: m.entries,
            needed: m.needed_bytes,
            free: room,
        }
        .into());
    }
    Ok(m)
}

fn copy(p: &Populate, m: &Measured) -> Result<Measured> {
    let shown = p.source.join(&p.path);
    let root = open_root(&p.source)?;
    let src = walk::open_dir(root.as_fd(), &p.path)
        .map_err(|e| Error::io("open directory", &shown, e.into()))?;
    let dst = open_root(&p.target)?;
    let req = CopyRequest {
        source: shown,
        target: p.target.clone(),
        label: p.label.clone(),
        streams: STREAMS,
        chunk: CHUNK,
        verify: p.verify,
        live: false,
        target_reused: true,
        base: None,
    };
    let progress = Progress::new(p.record.clone(), p.label.clone());
    let done = AtomicBool::new(false);
    let copied = std::thread::scope(|s| {
        s.spawn(|| report_every(p.every, &progress, m, &done));
        let copied = copy_tree_at(src.as_fd(), dst.as_fd(), &req, &progress);
        done.store(true, Ordering::Relaxed);
        copied
    });
    copied?;
    match std::fs::remove_file(&p.record) {
        Ok(()) => Ok(*m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(*m),
        Err(e) => Err(Error::io("remove", &p.record, e)),
    }
}

/// A `Copying` line every `every` until `done`, checked every 100 ms.
fn report_every(every: Duration, progress: &Progress, m: &Measured, done: &AtomicBool) {
    let tick = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        waited += tick;
        if waited < every {
            continue;
        }
        waited = Duration::ZERO;
        let secs = progress.elapsed().max(0.001);
        let rate = (progress.written.load(Ordering::Relaxed) as f64 / secs) as u64;
        let total = progress.total_bytes().max(m.data_bytes);
        emit(&report(
            "Copying",
            progress.copied_bytes(),
            total,
            m.entries,
            rate,
            progress.message(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn request(root: &std::path::Path, path: &str, target: &std::path::Path) -> Populate {
        Populate {
            source: root.to_owned(),
            path: path.into(),
            target: target.to_owned(),
            record: root.join("record.json"),
            verify: Verify::Checksum,
            label: "ml/ds".into(),
            every: Duration::from_millis(50),
        }
    }

    #[test]
    fn the_tree_beneath_the_root_is_copied_verified_and_its_record_removed() {
        let (root, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ds = root.path().join("ds/train");
        std::fs::create_dir_all(&ds).unwrap();
        std::fs::write(ds.join("a"), vec![7u8; 300_000]).unwrap();
        std::os::unix::fs::symlink("a", ds.join("l")).unwrap();
        let p = request(root.path(), "ds", target.path());
        run(&p).unwrap();
        assert_eq!(
            std::fs::read(target.path().join("train/a")).unwrap(),
            vec![7u8; 300_000]
        );
        assert_eq!(
            std::fs::read_link(target.path().join("train/l")).unwrap(),
            PathBuf::from("a")
        );
        assert!(!p.record.exists());
    }

    #[test]
    fn a_symlink_on_the_way_to_the_dataset_is_not_followed() {
        let (root, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"host file").unwrap();
        std::os::unix::fs::symlink(host.path(), root.path().join("planted")).unwrap();
        for path in ["planted", "planted/."] {
            let e = run(&request(root.path(), path, target.path())).unwrap_err();
            assert!(matches!(e, Error::Io { .. }), "{path}: {e}");
        }
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_dataset_larger_than_the_volume_is_refused_before_a_byte_is_written() {
        use nix::mount::{mount, umount, MsFlags};
        let (root, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // A 1 MiB filesystem as the claim's volume (root only, as the fill pod runs).
        let small = mount(
            Some("tmpfs"),
            target.path(),
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1m"),
        );
        if small.is_err() {
            panic!("mounting a tmpfs needs root: {small:?}");
        }
        std::fs::write(root.path().join("big"), vec![1u8; 3 << 20]).unwrap();
        let outcome = run(&request(root.path(), ".", target.path()));
        let listed = std::fs::read_dir(target.path()).unwrap().count();
        umount(target.path()).unwrap();
        let e = outcome.unwrap_err().to_string();
        assert!(e.contains("ask for at least") && e.contains("ml/ds"), "{e}");
        assert_eq!(listed, 0);
    }
}
