//! Removing a tree from an export or a snapshot store: a volume or snapshot of many
//! files takes one round trip per entry, longer than any one call's deadline, so the
//! removal runs as a job a retried call joins (`runtime/overlap.rs`), and the caller tells
//! a long removal from a server that stopped answering by whether entries are still being
//! removed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{fs_error, fsops};
use crate::error::{CommandError, Error, Result, VolumeError};
use crate::runtime::overlap::Jobs;

/// How often a waiting call looks at the count of entries removed.
const TICK: Duration = Duration::from_millis(250);

#[derive(Default)]
pub struct Removals {
    jobs: Jobs,
    /// Entries removed so far, by job key (what a call that joins a removal reads).
    removed: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

impl Removals {
    /// Removes `rel` below `root` (never following a symlink, `fsops::remove_tree`) as
    /// the job `key`, or joins the one running. Waits at most `wait`: a removal still
    /// going then answers Unavailable with how far it got (the job goes on; a retry joins
    /// it), and one that removed nothing for `wait` answers a deadline error naming
    /// `what` (the server is not answering).
    pub async fn remove_tree(
        &self,
        key: &str,
        what: &str,
        (root, rel): (PathBuf, String),
        wait: Duration,
    ) -> Result<()> {
        let removed = self.counter(key);
        let work = {
            let (removed, context) = (Arc::clone(&removed), what.to_owned());
            async move {
                let run = move || fsops::remove_tree(&root, &rel, &removed);
                match tokio::task::spawn_blocking(run).await {
                    Ok(done) => done.map_err(|e| fs_error(context, e)),
                    Err(join) => Err(VolumeError::TaskFailed {
                        what: context,
                        why: join.to_string(),
                    }
                    .into()),
                }
            }
        };
        let job = self.jobs.run(key, "remove", work);
        tokio::pin!(job);
        let started = Instant::now();
        let mut last = (removed.load(Ordering::Relaxed), Instant::now());
        let outcome = loop {
            tokio::select! {
                done = &mut job => break done,
                () = tokio::time::sleep(TICK) => {}
            }
            let n = removed.load(Ordering::Relaxed);
            if n != last.0 {
                last = (n, Instant::now());
            }
            if last.1.elapsed() >= wait {
                return Err(CommandError::Timeout {
                    command: what.to_owned(),
                    after: wait,
                }
                .into());
            }
            if started.elapsed() >= wait {
                return Err(Error::NotReady(format!(
                    "{what}: {n} entries removed so far; the removal goes on, and a retry \
                     of this call waits for it"
                )));
            }
        };
        self.removed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        outcome
    }

    fn counter(&self, key: &str) -> Arc<AtomicU64> {
        let mut removed = self.removed.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(removed.entry(key.to_owned()).or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &std::path::Path, dirs: usize, files: usize) {
        for d in 0..dirs {
            let dir = root.join(format!("vol/d{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..files {
                std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
            }
        }
    }

    #[tokio::test]
    async fn a_tree_is_removed_entry_by_entry_and_a_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path(), 3, 40);
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("vol/d0/link")).unwrap();
        let removals = Removals::default();
        let at = (dir.path().to_owned(), "vol".to_owned());
        removals
            .remove_tree("k", "removing vol", at, Duration::from_secs(20))
            .await
            .unwrap();
        assert!(!dir.path().join("vol").exists());
        assert!(
            outside.join("keep").exists(),
            "the symlink's target is kept"
        );
        assert!(removals.removed.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_removal_longer_than_the_wait_answers_unavailable_and_the_retry_joins_it() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path(), 40, 200);
        let removals = Removals::default();
        let at = || (dir.path().to_owned(), "vol".to_owned());
        // A wait shorter than one tick: the first look finds the removal going on
        // (entries removed since: Unavailable with the count; none yet: the deadline).
        let first = removals
            .remove_tree("k", "removing vol", at(), Duration::from_millis(1))
            .await;
        match first {
            Err(Error::NotReady(m)) => assert!(m.contains("entries removed so far"), "{m}"),
            Err(Error::Command(CommandError::Timeout { .. })) => {}
            Ok(()) => eprintln!("the removal finished within one tick on this machine"),
            Err(e) => panic!("{e}"),
        }
        if !removals.jobs.is_running("k") {
            assert!(
                !dir.path().join("vol").exists(),
                "a removal ended unfinished"
            );
        }
        removals
            .remove_tree("k", "removing vol", at(), Duration::from_secs(60))
            .await
            .unwrap();
        assert!(!dir.path().join("vol").exists());
    }
}
