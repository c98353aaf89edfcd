//! The GDS gate: before NodePublishVolume bind-mounts a volume, check that a workload will get
//! GPUDirect Storage on it, as the StorageClass parameter `gdsPolicy` asks.
//!
//! - `disabled`: nothing is checked (csi-sanity, test rigs and GPU-less clusters say so).
//! - `required`, also when the parameter is absent: the node checks, the volume checks and the
//!   cuFile probe must all pass with true GDS; compat mode is a failure. Otherwise publish
//!   fails with FAILED_PRECONDITION, naming every failed check as `check-id: evidence ->
//!   remedy`, one per line.
//! - `preferred`: the same checks, but a failure only logs a warning and marks the volume as
//!   compat, so NodeGetVolumeStats reports an abnormal volume condition saying why.
//!
//! The gate knows nothing of the driver: a backend hands it a located, mounted volume
//! ([`MountedVolume`]) and the volume's policy. `policy` says what a verdict means, `checks`
//! runs the checks and the probe, `marks` keeps the compat marks under the state dir, and
//! `topology` turns node readiness into topology segments.

mod checks;
mod marks;
mod policy;
mod topology;

use std::path::{Path, PathBuf};

use gds_check::{Backend, Report};
use tracing::{info, warn};

use crate::error::Result;

pub use checks::{gpu_check, node_report, GateConfig};
pub use marks::{read as read_compat_marks, CompatMarks, FILE_NAME as MARKS_FILE};
pub use policy::{failure_line, failure_lines, judge, Policy, Verdict, PARAM};
pub use topology::{nfs_topology, node_readiness, node_topology};

/// A located, mounted volume: all the gate needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The volume id: the key of its cached probe and its compat mark.
    pub id: String,
    /// Which GDS path cuFile takes for it.
    pub backend: Backend,
    /// Its staged filesystem; None for a raw block volume (then the filesystem checks are
    /// skipped and the probe only opens the driver).
    pub mount_path: Option<PathBuf>,
    /// The block device (major, minor) it lives on; None for NFS. A probe answer cached for
    /// another device is not reused.
    pub device: Option<(u32, u32)>,
}

impl MountedVolume {
    /// A volume of the block pool (NVMe namespaces, or operator-listed block devices), staged
    /// at `mount_path` (None: published as a raw block device).
    pub fn block(id: String, mount_path: Option<&Path>, major: u32, minor: u32) -> Self {
        MountedVolume {
            id,
            backend: Backend::Nvme,
            mount_path: mount_path.map(Path::to_path_buf),
            device: Some((major, minor)),
        }
    }

    /// An NFS volume staged at `mount_path`.
    pub fn nfs(id: String, mount_path: &Path) -> Self {
        MountedVolume {
            id,
            backend: Backend::NfsRdma,
            mount_path: Some(mount_path.to_path_buf()),
            device: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GateOutcome {
    pub policy: Policy,
    pub verdict: Verdict,
    /// Every check that ran (empty when skipped).
    pub report: Report,
    /// The probe's answer came from the cache.
    pub probe_cached: bool,
}

pub struct GdsGate {
    checks: checks::Checks,
    marks: CompatMarks,
}

impl GdsGate {
    /// A gate whose compat marks live in memory only: for tests and benches. The plugin
    /// uses [`GdsGate::open`].
    pub fn new(config: GateConfig) -> Self {
        GdsGate {
            checks: checks::Checks::new(config),
            marks: CompatMarks::in_memory(),
        }
    }

    /// A gate whose compat marks are kept in `state_dir` (and loaded from it).
    pub fn open(config: GateConfig, state_dir: &Path) -> Result<Self> {
        Ok(GdsGate {
            checks: checks::Checks::new(config),
            marks: CompatMarks::open(state_dir)?,
        })
    }

    /// The gate for publishing `vol` under `policy`: Ok with the verdict (and the compat mark
    /// set or cleared to match), or FAILED_PRECONDITION under `required`.
    pub async fn check_publish(&self, vol: &MountedVolume, policy: Policy) -> Result<GateOutcome> {
        if policy == Policy::Disabled {
            self.forget(&vol.id)?;
            return Ok(GateOutcome {
                policy,
                verdict: Verdict::Skipped,
                report: Report::default(),
                probe_cached: false,
            });
        }
        let (report, probe_cached) = self.checks.run(vol).await;
        let verdict = judge(policy, &vol.id, &report)?;
        let volume_id = vol.id.as_str();
        match &verdict {
            Verdict::Compat(why) => {
                let lines = failure_lines(&report).replace('\n', "; ");
                let failed = report.failures().len();
                warn!(volume_id, failed, "publishing without true GDS: {lines}");
                self.marks.set(volume_id, why)?;
            }
            _ => {
                self.marks.clear(volume_id)?;
                info!(volume_id, %policy, probe_cached, "GDS gate: true GDS");
            }
        }
        Ok(GateOutcome {
            policy,
            verdict,
            report,
            probe_cached,
        })
    }

    /// Why the volume was published in compat mode, if it was.
    pub fn compat_reason(&self, volume_id: &str) -> Option<String> {
        self.marks.get(volume_id)
    }

    /// How many volumes are published in compat mode now.
    pub fn compat_volumes(&self) -> usize {
        self.marks.len()
    }

    /// Drops what the gate remembers about a volume (its compat mark and cached probe).
    pub fn forget(&self, volume_id: &str) -> Result<()> {
        self.checks.forget(volume_id);
        self.marks.clear(volume_id)
    }

    /// Readiness per backend, for NodeGetInfo's topology: `("gds-nvme", true)`, ...
    pub fn node_readiness(&self) -> Vec<(&'static str, bool)> {
        node_readiness(self.checks.paths())
    }

    /// None when some backend is GDS-ready on this node, else why none is.
    pub fn node_not_ready(&self) -> Option<String> {
        topology::node_not_ready(self.checks.paths())
    }
}

/// NodeGetVolumeStats: a healthy-looking volume that was published in compat mode is reported
/// abnormal, with the reason.
pub fn volume_condition(
    gate: Option<&GdsGate>,
    volume_id: &str,
    condition: crate::csi::VolumeCondition,
) -> crate::csi::VolumeCondition {
    if condition.abnormal {
        return condition;
    }
    match gate.and_then(|g| g.compat_reason(volume_id)) {
        Some(why) => crate::csi::VolumeCondition {
            abnormal: true,
            message: format!("mounted; {why}"),
        },
        None => condition,
    }
}
