//! How big a volume must be to hold a copy of a source tree, measured before anything is
//! allocated (CreateVolume of a clone of an NFS directory).
//!
//! The rule: the data is what the copy writes (every regular file's size, hard-linked
//! files once), each file rounded up to a 4 KiB block, plus one 4 KiB block for every
//! other entry (directory, symlink, node); the filesystem's own metadata then gets a
//! sixteenth of the volume: the volume must be at least `blocks × 16 / 15`. ext4 as the
//! driver makes it (`-m 0`, no reserved blocks) spends 1/64 on inode tables and up to
//! 1/16 on its journal on volumes under 1 GiB (mke2fs's journal size table), less above;
//! xfs's log and inode chunks take less. A sparse file's holes are counted as data: the
//! copy keeps them, but the measure does not rely on the target filesystem's holes.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::walk::{self, Kind};
use crate::error::{CloneError, Error, Result};
use crate::runtime::overlap::Jobs;

/// The block size every entry is rounded to.
const BLOCK: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// What the copy writes: the sum of the files' sizes.
    pub data_bytes: u64,
    pub entries: usize,
    /// The smallest volume that holds the copy (the rule above).
    pub needed_bytes: u64,
}

/// Measures the tree at `rel` beneath `root` (blocking: on NFS every entry is a request).
/// Nothing is followed on the way to `rel` or inside it.
pub fn measure(root: &Path, rel: &Path) -> Result<Measured> {
    measure_counting(root, rel, &AtomicUsize::new(0))
}

/// [`measure`], counting the entries walked in `seen` as it goes.
pub fn measure_counting(root: &Path, rel: &Path, seen: &AtomicUsize) -> Result<Measured> {
    let shown = root.join(rel);
    let root_fd = super::open_root(root)?;
    let dir = walk::open_dir(root_fd.as_fd(), rel)
        .map_err(|e| Error::io("open directory", &shown, e.into()))?;
    let entries = walk::walk_counting(dir.as_fd(), &shown, seen)?;
    let links = super::meta::links(&entries);
    let mut data_bytes = 0u64;
    let mut blocks = 0u64;
    for &i in &links.primaries {
        let size = entries[i].size();
        data_bytes += size;
        blocks += size.div_ceil(BLOCK) * BLOCK;
    }
    let others = entries.iter().filter(|e| e.kind != Kind::File).count() as u64;
    blocks += others * BLOCK;
    Ok(Measured {
        data_bytes,
        entries: entries.len(),
        needed_bytes: needed(blocks),
    })
}

/// Measurements running as jobs, by source. A tree of millions of entries takes longer to
/// walk over NFS than a CreateVolume may wait (external-provisioner's `--timeout`, 10 s
/// by default, cancels the call and retries it): the call answers Unavailable with how
/// far the walk got, the walk goes on, and the retry joins it or takes its result.
#[derive(Default)]
pub struct Measures {
    jobs: Jobs,
    walks: Mutex<HashMap<String, Arc<Walk>>>,
    /// Results by source, with when each walk ended, for every call that joined the walk
    /// (many claims of one class naming a dataset) or collects its outcome later; a call
    /// that finds no walk measures again (the tree may have changed).
    results: Mutex<HashMap<String, (Instant, Measured)>>,
}

/// Results older than this are dropped when the next walk ends (a retry collects its
/// walk's outcome at once, so a result is read only soon after its walk, or never).
const RESULT_KEPT: Duration = Duration::from_secs(60);

/// A walk under way: when it started and how many entries it has seen.
struct Walk {
    started: Instant,
    seen: AtomicUsize,
}

impl Measures {
    /// Measures `rel` beneath `root` as the job `key` (or joins the one under way) and
    /// waits at most `wait`; `what` names the source in the progress message. Blocking
    /// work runs off the async runtime.
    pub async fn measure(
        self: &Arc<Self>,
        key: &str,
        what: &str,
        (root, rel): (PathBuf, PathBuf),
        wait: Duration,
    ) -> Result<Measured> {
        let walk = Arc::clone(lock(&self.walks).entry(key.to_owned()).or_insert_with(|| {
            Arc::new(Walk {
                started: Instant::now(),
                seen: AtomicUsize::new(0),
            })
        }));
        let (me, k, w) = (Arc::clone(self), key.to_owned(), Arc::clone(&walk));
        let work = async move {
            let measured =
                tokio::task::spawn_blocking(move || measure_counting(&root, &rel, &w.seen)).await;
            lock(&me.walks).remove(&k);
            let measured = measured.map_err(|e| CloneError::MeasureStopped(e.to_string()))??;
            let mut results = lock(&me.results);
            results.retain(|_, (ended, _)| ended.elapsed() < RESULT_KEPT);
            results.insert(k, (Instant::now(), measured));
            Ok(())
        };
        match tokio::time::timeout(wait, self.jobs.run(key, "measure", work)).await {
            Err(_) => Err(Error::NotReady(format!(
                "measuring the clone's source {what}: {} entries walked in {} s; the walk goes \
                 on and the next CreateVolume takes its result",
                walk.seen.load(Ordering::Relaxed),
                walk.started.elapsed().as_secs()
            ))),
            Ok(outcome) => {
                outcome?;
                // The outcome of this key's walk was just collected, so its result is
                // the one stored when it ended (gone only if it was pruned meanwhile).
                match lock(&self.results).get(key) {
                    Some((_, m)) => Ok(*m),
                    None => Err(CloneError::MeasureDropped {
                        what: what.to_owned(),
                    }
                    .into()),
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `blocks × 16 / 15`, rounded up to a block.
fn needed(blocks: u64) -> u64 {
    (blocks.saturating_mul(16).div_ceil(15)).div_ceil(BLOCK) * BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_to_blocks_links_count_once_and_metadata_gets_a_sixteenth() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("tree");
        std::fs::create_dir_all(t.join("sub")).unwrap();
        std::fs::write(t.join("sub/a"), vec![1u8; 5000]).unwrap();
        std::fs::write(t.join("empty"), b"").unwrap();
        std::fs::hard_link(t.join("sub/a"), t.join("a.link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.join("out")).unwrap();
        let m = measure(dir.path(), Path::new("tree")).unwrap();
        assert_eq!(m.data_bytes, 5000);
        assert_eq!(m.entries, 6);
        // 8 KiB of file blocks, root + sub + symlink one block each: 20 KiB, × 16/15.
        assert_eq!(m.needed_bytes, needed(20 << 10));
        assert_eq!(m.needed_bytes, 24 << 10);
        assert!(m.needed_bytes * 15 >= (20 << 10) * 16);
    }

    #[tokio::test]
    async fn a_call_that_cannot_wait_answers_how_far_the_walk_got_and_the_retry_takes_its_result() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("tree");
        for d in 0..20 {
            let sub = t.join(format!("d{d}"));
            std::fs::create_dir_all(&sub).unwrap();
            for f in 0..50 {
                std::fs::write(sub.join(format!("f{f}")), vec![7u8; f * 100]).unwrap();
            }
        }
        let tree = || (dir.path().to_owned(), PathBuf::from("tree"));
        let measures = Arc::new(Measures::default());
        let err = measures
            .measure("src", "nfs:tree", tree(), Duration::ZERO)
            .await
            .unwrap_err();
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status
                .message()
                .starts_with("measuring the clone's source nfs:tree: "),
            "{}",
            status.message()
        );
        let m = measures
            .measure("src", "nfs:tree", tree(), Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(m, measure(dir.path(), Path::new("tree")).unwrap());
        assert_eq!(m.entries, 1 + 20 + 20 * 50);
    }

    #[test]
    fn a_path_through_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("via")).unwrap();
        assert!(measure(dir.path(), Path::new("via")).is_err());
        assert!(measure(dir.path(), Path::new("../")).is_err());
    }
}
