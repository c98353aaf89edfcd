//! How far a copy got: kept in the state dir (replaced atomically, at most about once a
//! second) so a restarted driver resumes where the last one stopped, and live counters
//! for the progress message NodeStage answers while the copy runs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Seconds without a byte moved after which the message says the copy is stalled.
const STALLED: u64 = 60;
/// Bytes copied between two stores of the record.
const STORE_EVERY: u64 = 32 << 20;

/// What survives a restart. Units are the copy's pieces in a fixed order (a file, or a
/// `piece` of a large one): every unit below `watermark` is done; those above it are redone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// The source as the caller names it; a different source starts over.
    pub source: String,
    /// Entries and bytes the walk found; a source that changed starts over.
    pub entries: usize,
    pub total_bytes: u64,
    /// The length units were cut at; the watermark counts units of this length only
    /// (a record without it, or with another, starts over).
    #[serde(default)]
    pub piece: u64,
    /// A live copy's digest of every entry's name, inode, size and times as its walk saw
    /// them: a source written to since resumes nothing (a unit below the watermark may
    /// hold what a file was before a write that moved no size).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub walk: String,
    /// Directories, files (at their size), symlinks and nodes exist in the target.
    pub structure_done: bool,
    pub watermark: usize,
    /// Units above the watermark done already: with several streams one slow unit holds
    /// the watermark while the others finish later ones, which a restart then skips.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done_above: Vec<usize>,
    /// Bytes of the units below the watermark.
    pub copied_bytes: u64,
    /// Copied, linked, owners/modes/times set and verified.
    pub done: bool,
}

impl Saved {
    pub fn load(path: &Path) -> Result<Option<Saved>> {
        let Some(bytes) = crate::runtime::state_dir::read_regular(path)? else {
            return Ok(None);
        };
        match serde_json::from_slice(&bytes) {
            Ok(saved) => Ok(Some(saved)),
            // A torn or foreign file costs a copy from the start, never a wrong resume.
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "copy progress unreadable; starting over");
                Ok(None)
            }
        }
    }

    pub fn store(&self, path: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        }
        crate::runtime::state_dir::write_atomic(path, &bytes)
            .map_err(|e| Error::io("write", path, e))
    }
}

/// One copy's live state: the persisted record and the counters behind the message.
pub struct Progress {
    path: PathBuf,
    label: String,
    saved: Mutex<Saved>,
    last_store: Mutex<(Instant, u64)>,
    started: Instant,
    /// Bytes written to the target in this process's run (for the rate).
    pub written: AtomicU64,
    /// Bytes read from the source in this process's run.
    pub read: AtomicU64,
    copied: AtomicU64,
    total: AtomicU64,
    /// Milliseconds after `started` when bytes last moved (a stalled source shows).
    last_moved_ms: AtomicU64,
    /// The volume the metrics name (none in the engine's own tests).
    volume: Option<String>,
}

impl Progress {
    pub fn new(path: PathBuf, label: String) -> Progress {
        Progress {
            path,
            label,
            saved: Mutex::new(Saved::default()),
            last_store: Mutex::new((Instant::now(), 0)),
            started: Instant::now(),
            written: AtomicU64::new(0),
            read: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            total: AtomicU64::new(0),
            last_moved_ms: AtomicU64::new(0),
            volume: None,
        }
    }

    /// Reports this copy's bytes in the metrics under `volume`.
    pub fn for_volume(mut self, volume: &str) -> Progress {
        self.volume = Some(volume.to_owned());
        self
    }

    fn report(&self) {
        if let Some(v) = &self.volume {
            crate::metrics::clone::progress(v, self.copied_bytes(), self.total_bytes());
        }
    }

    /// Seconds since this process started following the copy.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn saved(&self) -> Saved {
        self.saved.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the record and stores it now.
    pub fn set(&self, saved: Saved) -> Result<()> {
        // A phase ended (walk, structure, copy): the copy is not stalled.
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_moved_ms.store(ms, Ordering::Relaxed);
        self.copied.store(saved.copied_bytes, Ordering::Relaxed);
        self.total.store(saved.total_bytes, Ordering::Relaxed);
        saved.store(&self.path)?;
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = saved;
        self.report();
        Ok(())
    }

    /// Moves the watermark; stored once `STORE_EVERY` bytes or a second have passed
    /// since the last store, so a restart redoes at most that much (plus the units in
    /// flight) without a store per small file.
    pub fn advance(&self, watermark: usize, copied_bytes: u64) -> Result<()> {
        self.advance_past(watermark, copied_bytes, Vec::new())
    }

    /// [`Progress::advance`], with the units above the watermark done already.
    pub fn advance_past(
        &self,
        watermark: usize,
        copied_bytes: u64,
        done_above: Vec<usize>,
    ) -> Result<()> {
        let saved = {
            let mut s = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            s.watermark = watermark;
            s.copied_bytes = copied_bytes;
            s.done_above = done_above;
            s.clone()
        };
        self.copied.store(copied_bytes, Ordering::Relaxed);
        self.report();
        let mut last = self.last_store.lock().unwrap_or_else(|e| e.into_inner());
        let (when, bytes) = *last;
        if when.elapsed() >= Duration::from_secs(1) || copied_bytes >= bytes + STORE_EVERY {
            *last = (Instant::now(), copied_bytes);
            saved.store(&self.path)?;
        }
        Ok(())
    }

    /// `n` bytes read from the source and written to the target.
    pub fn moved(&self, n: u64) {
        self.read.fetch_add(n, Ordering::Relaxed);
        self.written.fetch_add(n, Ordering::Relaxed);
        self.answered();
    }

    /// An entry of a phase that moves no bytes (metadata, verification, links) finished:
    /// its filesystems answer, so the copy is not stalled.
    pub fn answered(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_moved_ms.store(ms, Ordering::Relaxed);
    }

    /// Seconds since bytes last moved or an entry was last finished (since this process
    /// began following the copy, if neither has).
    pub fn stalled_secs(&self) -> u64 {
        let now = self.started.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_moved_ms.load(Ordering::Relaxed)) / 1000
    }

    pub fn copied_bytes(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    pub fn total_bytes(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// `pre-staging from <source>: 43% (12.1 of 28.0 GiB), 1.9 GiB/s`
    pub fn message(&self) -> String {
        let (copied, total) = (self.copied_bytes(), self.total_bytes());
        let pct = (copied * 100).checked_div(total).unwrap_or(0);
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = self.written.load(Ordering::Relaxed) as f64 / secs;
        let g = |b: f64| b / (1u64 << 30) as f64;
        let mut m = format!(
            "pre-staging from {}: {pct}% ({:.1} of {:.1} GiB), {:.1} GiB/s",
            self.label,
            g(copied as f64),
            g(total as f64),
            g(rate)
        );
        // An NFS server that stops answering can hold a read for longer than the soft
        // mount's timeout (the NFSv4.1 client's session recovery waits for the server):
        // the copy then goes on when it answers, and the message says why it waits.
        let stalled = self.stalled_secs();
        if stalled >= STALLED && copied < total {
            m.push_str(&format!(
                "; stalled: nothing read from {} for {stalled} s (is its server answering?); \
                 the copy goes on when it answers, nothing is published before",
                self.label
            ));
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_source_percent_sizes_and_rate() {
        let dir = tempfile::tempdir().unwrap();
        let p = Progress::new(dir.path().join("p.json"), "vol-a".into());
        p.set(Saved {
            source: "vol-a".into(),
            total_bytes: 28 << 30,
            copied_bytes: 12 << 30,
            ..Saved::default()
        })
        .unwrap();
        let m = p.message();
        assert!(
            m.starts_with("pre-staging from vol-a: 42% (12.0 of 28.0 GiB), "),
            "{m}"
        );
        assert!(m.ends_with(" GiB/s"), "{m}");
        let back = Saved::load(&dir.path().join("p.json")).unwrap().unwrap();
        assert_eq!(back.copied_bytes, 12 << 30);
    }

    #[test]
    fn a_copy_without_a_byte_moved_for_a_minute_says_it_is_stalled() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Progress::new(dir.path().join("p.json"), "nfs:x".into());
        p.set(Saved {
            total_bytes: 4 << 30,
            copied_bytes: 1 << 30,
            ..Saved::default()
        })
        .unwrap();
        p.started = Instant::now() - Duration::from_secs(90);
        assert!(
            p.message()
                .contains("; stalled: nothing read from nfs:x for 90 s"),
            "{}",
            p.message()
        );
        p.moved(4096);
        assert!(!p.message().contains("stalled"), "{}", p.message());
    }

    #[test]
    fn a_torn_record_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.json"), b"{\"source\": ").unwrap();
        assert_eq!(Saved::load(&dir.path().join("p.json")).unwrap(), None);
    }
}
