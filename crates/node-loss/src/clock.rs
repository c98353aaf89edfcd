//! How long each node has been seen absent.
//!
//! The clock lives in this process's memory and runs on the monotonic clock: a
//! restarted controller starts every clock again at its first pass, and a wall-clock
//! jump changes nothing. A restart can so only lengthen a grace period, never shorten
//! it. (A first-missing time persisted on the PV would survive a restart, but could not
//! tell a node that came back and went again while the controller was down.)
//! local-static-provisioner's node cleanup does the same: its delay is an in-memory
//! queue timer started again at start-up (pkg/node-cleanup/controller/controller.go:
//! `Run` calls `startCleanupTimersIfNeeded` at line 142, which `AddAfter`s each PV at 276).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Present,
    /// Absent for less than the grace period; how long so far.
    InGrace(Duration),
    /// Absent for at least the grace period.
    Lost(Duration),
}

#[derive(Debug, Default)]
pub struct Clock {
    missing_since: BTreeMap<String, Instant>,
}

impl Clock {
    /// One pass: `present` is every Node from a complete, successful list; `wanted`
    /// the nodes our volumes are pinned to. A node seen present forgets its clock,
    /// so a node that comes back loses nothing and starts from zero if it goes again.
    pub fn observe(
        &mut self,
        present: &BTreeSet<String>,
        wanted: &BTreeSet<String>,
        now: Instant,
        grace: Duration,
    ) -> BTreeMap<String, NodeState> {
        self.missing_since
            .retain(|n, _| wanted.contains(n) && !present.contains(n));
        wanted
            .iter()
            .map(|n| {
                if present.contains(n) {
                    return (n.clone(), NodeState::Present);
                }
                let since = *self.missing_since.entry(n.clone()).or_insert(now);
                let gone = now.saturating_duration_since(since);
                let state = if gone >= grace {
                    NodeState::Lost(gone)
                } else {
                    NodeState::InGrace(gone)
                };
                (n.clone(), state)
            })
            .collect()
    }

    /// A pass that could not list the Nodes cannot show that a node stayed away
    /// without a gap: every clock starts again.
    pub fn reset(&mut self) {
        self.missing_since.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_node_is_lost_only_after_the_grace_period_of_continuous_absence() {
        let mut c = Clock::default();
        let t0 = Instant::now();
        let wanted = set(&["a", "b"]);
        let s = c.observe(&set(&["a", "b"]), &wanted, t0, GRACE);
        assert_eq!(s["a"], NodeState::Present);
        let s = c.observe(&set(&["a"]), &wanted, t0 + Duration::from_secs(10), GRACE);
        assert_eq!(s["b"], NodeState::InGrace(Duration::ZERO));
        let s = c.observe(&set(&["a"]), &wanted, t0 + Duration::from_secs(69), GRACE);
        assert_eq!(s["b"], NodeState::InGrace(Duration::from_secs(59)));
        let s = c.observe(&set(&["a"]), &wanted, t0 + Duration::from_secs(70), GRACE);
        assert_eq!(s["b"], NodeState::Lost(Duration::from_secs(60)));
    }

    #[test]
    fn a_node_that_comes_back_starts_from_zero() {
        let mut c = Clock::default();
        let t0 = Instant::now();
        let wanted = set(&["b"]);
        c.observe(&set(&[]), &wanted, t0, GRACE);
        c.observe(&set(&["b"]), &wanted, t0 + Duration::from_secs(50), GRACE);
        let s = c.observe(&set(&[]), &wanted, t0 + Duration::from_secs(70), GRACE);
        assert_eq!(s["b"], NodeState::InGrace(Duration::ZERO));
    }

    #[test]
    fn a_restart_or_a_failed_list_starts_the_clock_again() {
        let t0 = Instant::now();
        let wanted = set(&["b"]);
        let mut c = Clock::default();
        c.observe(&set(&[]), &wanted, t0, GRACE);
        c.reset();
        let s = c.observe(&set(&[]), &wanted, t0 + Duration::from_secs(70), GRACE);
        assert_eq!(s["b"], NodeState::InGrace(Duration::ZERO));
        // A new process is a new Clock: the same.
        let s = Clock::default().observe(&set(&[]), &wanted, t0 + Duration::from_secs(70), GRACE);
        assert_eq!(s["b"], NodeState::InGrace(Duration::ZERO));
    }
}
