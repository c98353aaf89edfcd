//! GDS readiness that follows the node. NodeGetInfo reports `<driver>/gds-nvme` and
//! `<driver>/gds-nfs-rdma` from the node checks, but the kubelet calls it only when the
//! driver registers. This watcher re-runs the node checks (procfs/sysfs reads, never the
//! cuFile probe) every `interval`, and when the readiness it last had the kubelet read has
//! changed, and stays changed for a second look, it makes the kubelet register the driver
//! again ([`registration::reregister`]), which reads NodeGetInfo again.
//!
//! Only a key that is true is reported (`gate::node_topology`), so a node that becomes
//! ready only *adds* labels: the kubelet refuses to change a label's value
//! (`pkg/volume/csi/nodeinfomanager/nodeinfomanager.go:340-348`) but adds new ones. A node
//! that loses readiness loses the key from its CSINode's topology keys, but the kubelet
//! never removes a label (`UninstallCSIDriver`, `:149-163`, drops only the node id): the
//! label stays `true` until an operator removes it, and the publish gate still refuses.

pub mod registration;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::gds::gate::GdsGate;
use registration::Reregistered;

/// Readiness per backend, as `GdsGate::node_readiness` gives it: `("gds-nvme", true)`, ...
pub type Readiness = Vec<(&'static str, bool)>;

/// Which readiness the kubelet last read, and a change seen once but not yet confirmed.
#[derive(Debug)]
pub struct Tracker {
    reported: Readiness,
    pending: Option<Readiness>,
}

impl Tracker {
    /// Starts from the readiness at start-up: what the kubelet reads when the registrar
    /// registers the new process. (Were it read later and found different, the next
    /// observations see a change, and one needless re-registration follows.)
    pub fn new(initial: Readiness) -> Self {
        Tracker {
            reported: initial,
            pending: None,
        }
    }

    /// One observation. Some(now) when `now` differs from what was reported and the
    /// previous observation saw the same: a module still loading (nvidia_fs registers its
    /// devices after it appears) is not chased.
    pub fn observe(&mut self, now: Readiness) -> Option<Readiness> {
        if now == self.reported {
            self.pending = None;
            return None;
        }
        if self.pending.as_ref() == Some(&now) {
            return Some(now);
        }
        self.pending = Some(now);
        None
    }

    /// The kubelet has been made to read `now` (or will read it when it registers).
    pub fn reported(&mut self, now: Readiness) {
        self.reported = now;
        self.pending = None;
    }
}

/// `gds-nvme=true gds-nfs-rdma=false`, for logs.
fn describe(r: &Readiness) -> String {
    r.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where the registrar's registration socket is and how often to look.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub interval: Duration,
    /// `<kubelet dir>/plugins_registry/<driver>-reg.sock` as this process sees it; None:
    /// changes are only logged.
    pub registration_socket: Option<PathBuf>,
}

/// Acts on a confirmed change; false when it must be tried again.
fn act(config: &WatchConfig, from: &Readiness, to: &Readiness, warned: &mut bool) -> bool {
    let (from, to) = (describe(from), describe(to));
    let Some(socket) = &config.registration_socket else {
        warn!(%from, %to, "GDS readiness changed; the node's labels stay stale: \
            set --registration-socket so the kubelet is made to read it");
        return true;
    };
    match registration::reregister(socket) {
        Ok(Reregistered::Relinked) => {
            info!(%from, %to, socket = %socket.display(),
                "GDS readiness changed; registration socket relinked, the kubelet registers the driver again");
            true
        }
        Ok(other) => {
            info!(%from, %to, socket = %socket.display(), outcome = ?other,
                "GDS readiness changed; the kubelet reads it when the registrar registers");
            true
        }
        Err(e) => {
            // Retried at every look; said loudly once per change.
            if !std::mem::replace(warned, true) {
                warn!(%from, %to, socket = %socket.display(), error = %e,
                    "GDS readiness changed but the kubelet cannot be made to re-read it; retrying");
            } else {
                debug!(socket = %socket.display(), error = %e, "re-registration failed again");
            }
            false
        }
    }
}

/// Watches the gate's node readiness until the runtime ends. Off when `interval` is zero.
pub fn spawn(gate: Arc<GdsGate>, config: WatchConfig) {
    if config.interval.is_zero() {
        info!("GDS readiness watcher off (--readiness-interval 0)");
        return;
    }
    info!(interval = %humantime::format_duration(config.interval),
        registration_socket = ?config.registration_socket, "GDS readiness watcher started");
    tokio::spawn(async move {
        let read = move || {
            let gate = Arc::clone(&gate);
            async move {
                tokio::task::spawn_blocking(move || gate.node_readiness())
                    .await
                    .unwrap_or_default()
            }
        };
        let mut tracker = Tracker::new(read().await);
        let mut warned = false;
        loop {
            tokio::time::sleep(config.interval).await;
            let now = read().await;
            if now.is_empty() {
                continue; // the blocking read panicked: nothing learned
            }
            if let Some(to) = tracker.observe(now) {
                if act(&config, &tracker.reported, &to, &mut warned) {
                    tracker.reported(to);
                    warned = false;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_READY: [(&str, bool); 2] = [("gds-nvme", false), ("gds-nfs-rdma", false)];
    const NVME_READY: [(&str, bool); 2] = [("gds-nvme", true), ("gds-nfs-rdma", false)];

    #[test]
    fn a_change_is_acted_on_at_its_second_look_only() {
        let mut t = Tracker::new(NOT_READY.to_vec());
        assert_eq!(t.observe(NOT_READY.to_vec()), None);
        assert_eq!(t.observe(NVME_READY.to_vec()), None, "first look");
        assert_eq!(t.observe(NVME_READY.to_vec()), Some(NVME_READY.to_vec()));
        // Not acted on yet (say the re-registration failed): asked again.
        assert_eq!(t.observe(NVME_READY.to_vec()), Some(NVME_READY.to_vec()));
        t.reported(NVME_READY.to_vec());
        assert_eq!(t.observe(NVME_READY.to_vec()), None);
        // And back: losing readiness is a change too (the CSINode's keys follow it).
        assert_eq!(t.observe(NOT_READY.to_vec()), None);
        assert_eq!(t.observe(NOT_READY.to_vec()), Some(NOT_READY.to_vec()));
    }

    #[test]
    fn a_flap_shorter_than_one_interval_is_ignored() {
        let mut t = Tracker::new(NOT_READY.to_vec());
        assert_eq!(t.observe(NVME_READY.to_vec()), None);
        assert_eq!(t.observe(NOT_READY.to_vec()), None);
        assert_eq!(t.observe(NVME_READY.to_vec()), None);
        assert_eq!(t.observe(NOT_READY.to_vec()), None);
    }

    #[test]
    fn without_a_socket_a_change_is_only_logged_and_not_retried() {
        let config = WatchConfig {
            interval: Duration::from_secs(1),
            registration_socket: None,
        };
        let mut warned = false;
        assert!(act(
            &config,
            &NOT_READY.to_vec(),
            &NVME_READY.to_vec(),
            &mut warned
        ));
    }

    #[test]
    fn a_failed_re_registration_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.example-reg.sock");
        std::fs::write(&path, "not a socket").unwrap();
        let config = WatchConfig {
            interval: Duration::from_secs(1),
            registration_socket: Some(path),
        };
        let mut warned = false;
        assert!(!act(
            &config,
            &NOT_READY.to_vec(),
            &NVME_READY.to_vec(),
            &mut warned
        ));
        assert!(warned);
    }
}
