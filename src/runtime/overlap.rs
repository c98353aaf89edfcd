//! Calls that overlap on one volume. A second call on a busy volume gets `Aborted` at
//! once instead of queueing (per-volume try-locks, taken by the gRPC handlers), and
//! different volumes never wait on each other. A call that gives up while long work runs
//! does not lose it: long work on a volume (mkfs, the erase on delete, a copy) runs as a
//! job keyed by volume, not inside the gRPC call. The kubelet gives up on a call after 2
//! minutes and retries, and a dropped call must neither kill an mkfs halfway nor make the
//! retry start it over: the retry joins the job still running (or collects the outcome of
//! one that finished while nobody waited). Start and end are logged with the duration.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::error::{Error, Result};

/// What a guard is held on.
#[derive(Debug, Clone, Copy)]
pub enum LockKey<'a> {
    /// A volume, by its id: its stage, publish, expand and delete, a clone's CreateVolume
    /// of it, a snapshot's copy of it.
    Volume(&'a str),
    /// A CreateVolume's name: one allocation per name at a time.
    VolumeName(&'a str),
    /// A snapshot's name: its CreateSnapshot and DeleteSnapshot.
    SnapshotName(&'a str),
}

/// A key as the set of held guards keeps it: a volume id never collides with a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Held {
    Volume(String),
    VolumeName(String),
    SnapshotName(String),
}

impl From<LockKey<'_>> for Held {
    fn from(key: LockKey<'_>) -> Held {
        match key {
            LockKey::Volume(id) => Held::Volume(id.to_owned()),
            LockKey::VolumeName(n) => Held::VolumeName(n.to_owned()),
            LockKey::SnapshotName(n) => Held::SnapshotName(n.to_owned()),
        }
    }
}

impl fmt::Display for LockKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKey::Volume(id) => write!(f, "{id}"),
            LockKey::VolumeName(n) => write!(f, "volume name {n}"),
            LockKey::SnapshotName(n) => write!(f, "snapshot {n}"),
        }
    }
}

#[derive(Clone, Default)]
pub struct VolumeLocks {
    held: Arc<Mutex<HashSet<Held>>>,
}

/// Releases the key when dropped, on every return path.
#[must_use]
pub struct VolumeGuard {
    held: Arc<Mutex<HashSet<Held>>>,
    key: Held,
}

impl VolumeLocks {
    pub fn try_lock(&self, key: LockKey<'_>) -> Result<VolumeGuard> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.insert(key.into()) {
            return Err(Error::Busy(key.to_string()));
        }
        Ok(VolumeGuard {
            held: Arc::clone(&self.held),
            key: key.into(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

type Outcome = std::result::Result<(), Arc<Error>>;
type Slot = watch::Receiver<Option<Outcome>>;

/// Jobs by key: running ones, and finished ones whose outcome nobody collected yet.
#[derive(Clone, Default)]
pub struct Jobs {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

impl Jobs {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the job under `key` if there is one (running, or finished uncollected).
    pub async fn join(&self, key: &str) -> Option<Result<()>> {
        let slot = self.slots().get(key).cloned()?;
        Some(self.collect(key, slot).await)
    }

    /// Starts `work` as the job `key`, or joins the one already there (then `work` is
    /// dropped unstarted), and waits for its outcome. Dropping the returned future leaves
    /// the job running.
    pub async fn run<F>(&self, key: &str, what: &'static str, work: F) -> Result<()>
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let slot = {
            let mut slots = self.slots();
            match slots.get(key) {
                Some(slot) => slot.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    slots.insert(key.to_owned(), rx.clone());
                    tokio::spawn(run_job(key.to_owned(), what, work, tx));
                    rx
                }
            }
        };
        self.collect(key, slot).await
    }

    /// Whether a job under `key` is running now (not finished).
    pub fn is_running(&self, key: &str) -> bool {
        self.slots().get(key).is_some_and(|s| s.borrow().is_none())
    }

    async fn collect(&self, key: &str, mut slot: Slot) -> Result<()> {
        let outcome = match slot.wait_for(Option::is_some).await {
            Ok(done) => done.clone().unwrap_or(Ok(())),
            Err(_) => Err(Arc::new(Error::JobLost {
                key: key.to_owned(),
            })),
        };
        // Collected: the next call decides afresh from the device.
        let mut slots = self.slots();
        if slots.get(key).is_some_and(|s| s.same_channel(&slot)) {
            slots.remove(key);
        }
        outcome.map_err(Error::Shared)
    }
}

async fn run_job<F>(key: String, what: &'static str, work: F, tx: watch::Sender<Option<Outcome>>)
where
    F: Future<Output = Result<()>>,
{
    let started = Instant::now();
    info!(job = what, key = %key, "long job started");
    let outcome = work.await;
    let seconds = started.elapsed().as_secs_f64();
    match &outcome {
        Ok(()) => info!(job = what, key = %key, seconds, "long job finished"),
        Err(e) => warn!(job = what, key = %key, seconds, error = %e, "long job failed"),
    }
    tx.send_replace(Some(outcome.map_err(Arc::new)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    #[test]
    fn second_lock_on_same_volume_is_busy_until_released() {
        let locks = VolumeLocks::default();
        let guard = locks.try_lock(LockKey::Volume("a")).unwrap();
        assert!(matches!(
            locks.try_lock(LockKey::Volume("a")),
            Err(Error::Busy(_))
        ));
        let _other = locks
            .try_lock(LockKey::Volume("b"))
            .expect("other volumes are independent");
        // A name is not a volume id, whatever its text.
        let _name = locks
            .try_lock(LockKey::VolumeName("a"))
            .expect("a name never waits for a volume");
        let _snap = locks
            .try_lock(LockKey::SnapshotName("a"))
            .expect("nor a snapshot's name");
        drop(guard);
        let _again = locks
            .try_lock(LockKey::Volume("a"))
            .expect("released on drop");
    }

    #[tokio::test]
    async fn a_dropped_caller_leaves_the_job_running_and_the_retry_joins_it() {
        let jobs = Jobs::default();
        let starts = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::oneshot::channel::<()>();
        let work = |starts: Arc<AtomicUsize>, gate: Option<tokio::sync::oneshot::Receiver<()>>| async move {
            starts.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = gate {
                gate.await.ok();
            }
            Ok(())
        };
        // The first caller gives up before the work is done.
        let first = jobs.run("format:v", "mkfs", work(starts.clone(), Some(gate)));
        assert!(tokio::time::timeout(Duration::from_millis(50), first)
            .await
            .is_err());
        // The retry brings its own work, which must not start: it joins.
        let retry = tokio::spawn({
            let jobs = jobs.clone();
            let w = work(starts.clone(), None);
            async move { jobs.run("format:v", "mkfs", w).await }
        });
        release.send(()).unwrap();
        retry.await.unwrap().unwrap();
        assert_eq!(starts.load(Ordering::SeqCst), 1, "the work ran once");
        assert!(jobs.join("format:v").await.is_none(), "collected");
    }

    #[tokio::test]
    async fn an_outcome_nobody_waited_for_is_kept_for_the_next_caller() {
        let jobs = Jobs::default();
        let (release, gate) = tokio::sync::oneshot::channel::<()>();
        let failing = jobs.run("erase:v", "erase", async move {
            gate.await.ok();
            Err(crate::error::HostError::DeviceInUse {
                device: "/dev/x".into(),
                name: "x".into(),
            }
            .into())
        });
        // Given up while the job runs; the job still runs to its end.
        assert!(tokio::time::timeout(Duration::from_millis(50), failing)
            .await
            .is_err());
        release.send(()).unwrap();
        let finished = |jobs: &Jobs| jobs.slots()["erase:v"].borrow().is_some();
        while !finished(&jobs) {
            tokio::task::yield_now().await;
        }
        let err = jobs.join("erase:v").await.expect("kept").unwrap_err();
        assert_eq!(
            tonic::Status::from(err).code(),
            tonic::Code::FailedPrecondition
        );
        assert!(jobs.join("erase:v").await.is_none(), "collected once");
    }
}
