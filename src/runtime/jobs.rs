//! Long work on a volume (mkfs, the erase on delete) runs as a job keyed by volume, not
//! inside the gRPC call: the kubelet gives up on a call after 2 minutes and retries, and
//! a dropped call must neither kill an mkfs halfway nor make the retry start it over.
//! The retry joins the job still running (or collects the outcome of one that finished
//! while nobody waited). Start and end are logged with the duration.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::error::{Error, Result};

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
