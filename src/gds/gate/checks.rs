//! Running the checks: gds-check's node and volume checks (procfs/sysfs/udev reads, cheap, so
//! they run on every publish), the GPU driver check, and the cuFile probe, which loads
//! libcufile in a child process of this binary (`gds-csi cufile-probe`) under a deadline and
//! whose outcome is cached per volume for `cache_ttl`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gds_check::{
    node_checks, probe_check_required, run_probe, volume_checks, Backend, Check, GdsMode,
    HostPaths, ProbeArgs, ProbeOutcome, ProbeStatus, Report, Status,
};
use tracing::debug;

use super::MountedVolume;

/// What the checks need from the configuration.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub paths: HostPaths,
    /// The program that runs the probe child, and the arguments before the probe's own
    /// (`current_exe()` and `["cufile-probe"]` in the plugin).
    pub probe_exe: PathBuf,
    pub probe_prefix: Vec<String>,
    /// libcufile to load; None: `libcufile.so.0` from the loader's search path.
    pub cufile_library: Option<PathBuf>,
    pub probe_timeout: Duration,
    pub cache_ttl: Duration,
}

/// Is there an NVIDIA GPU driver at all? Without one cuFile cannot work, and the probe would
/// only hang until its deadline; doctor uses this to say so plainly.
pub fn gpu_check(paths: &HostPaths) -> Check {
    let id = "gpu.driver";
    let present = "NVIDIA GPU driver present";
    let gpus_dir = paths.proc("driver/nvidia/gpus");
    let gpus = dir_names(&gpus_dir, |_| true);
    if !gpus.is_empty() {
        let evidence = format!("{}: {}", gpus_dir.display(), gpus.join(" "));
        return Check::pass(id, present, evidence);
    }
    let nodes = dir_names(&paths.dev_root, |n| {
        n.strip_prefix("nvidia")
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
    });
    if !nodes.is_empty() {
        let evidence = format!(
            "{} absent, but {} in {}",
            gpus_dir.display(),
            nodes.join(" "),
            paths.dev_root.display()
        );
        return Check::pass(id, present, evidence);
    }
    Check::fail(
        id,
        "no NVIDIA GPU driver: no GPU visible on this node",
        format!(
            "no {} and no nvidia<N> device node in {}: this node has no GPU or no NVIDIA driver",
            gpus_dir.display(),
            paths.dev_root.display()
        ),
        "GDS needs an NVIDIA GPU with its driver loaded (GPU Operator or the host's driver); \
         schedule GDS workloads on GPU nodes (nvidia.com/gpu.present=true)",
    )
}

/// The names in `dir` that `keep` accepts, sorted; none when it cannot be read.
fn dir_names(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The node-level checks the gate, NodeGetInfo and doctor share.
pub fn node_report(paths: &HostPaths, backend: Backend) -> Report {
    let mut r = Report::new(vec![gpu_check(paths)]);
    r.extend(node_checks(paths, backend));
    r
}

struct CachedProbe {
    at: Instant,
    path: Option<PathBuf>,
    device: Option<(u32, u32)>,
    outcome: ProbeOutcome,
}

/// The checks of one gate: its configuration and the per-volume probe cache.
pub struct Checks {
    config: GateConfig,
    probes: Mutex<HashMap<String, CachedProbe>>,
}

impl Checks {
    pub fn new(config: GateConfig) -> Self {
        Checks {
            config,
            probes: Mutex::default(),
        }
    }

    pub fn paths(&self) -> &HostPaths {
        &self.config.paths
    }

    /// Every check for `vol`: node, volume (when it has a filesystem) and the probe.
    /// Returns the report and whether the probe's answer came from the cache.
    /// Without a GPU driver the probe is not run: cuFile cannot work there, and its
    /// cuFileDriverOpen would only hang until the deadline on every publish.
    pub async fn run(&self, vol: &MountedVolume) -> (Report, bool) {
        let paths = &self.config.paths;
        let mut report = node_report(paths, vol.backend);
        let gpu_missing = report
            .checks
            .iter()
            .any(|c| c.id == "gpu.driver" && c.status == Status::Fail);
        if let Some(p) = &vol.mount_path {
            report.extend(volume_checks(paths, vol.backend, p));
        }
        if gpu_missing {
            report.extend([probe_not_run_without_gpu()]);
            return (report, false);
        }
        let (outcome, cached) = self.probe_cached(vol).await;
        report.extend([probe_check_required(&outcome)]);
        (report, cached)
    }

    /// Drops the cached probe of a volume.
    pub fn forget(&self, volume_id: &str) {
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(volume_id);
    }

    /// The probe arguments for a path on a volume (None: driver-level probe only).
    pub fn probe_args(&self, backend: Backend, path: Option<&Path>) -> ProbeArgs {
        let mut a = ProbeArgs::new(backend);
        a.library = self.config.cufile_library.clone();
        a.path = path.map(Path::to_path_buf);
        a.cufile_json = Some(self.config.paths.cufile_json.clone());
        a
    }

    /// Runs the probe in a child process on a blocking thread, under the deadline.
    pub async fn run_probe(&self, backend: Backend, path: Option<&Path>) -> ProbeOutcome {
        let args = self.probe_args(backend, path);
        let exe = self.config.probe_exe.clone();
        let prefix = self.config.probe_prefix.clone();
        let timeout = self.config.probe_timeout;
        let task = tokio::task::spawn_blocking(move || run_probe(&exe, &prefix, &args, timeout));
        // run_probe enforces the deadline itself; this outer one only guards against a stuck
        // blocking pool, and the margin covers its pipe draining.
        let outer = timeout + Duration::from_secs(5);
        match tokio::time::timeout(outer, task).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => failed_outcome(backend, path, format!("the probe task failed: {e}")),
            Err(_) => failed_outcome(backend, path, format!("no probe answer within {outer:?}")),
        }
    }

    /// The probe outcome for a volume, from the cache while it is fresh and was taken on the
    /// same mount path and device.
    async fn probe_cached(&self, vol: &MountedVolume) -> (ProbeOutcome, bool) {
        let path = vol.mount_path.as_deref();
        {
            let cache = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = cache.get(&vol.id) {
                let fresh = c.at.elapsed() < self.config.cache_ttl;
                if fresh && c.path.as_deref() == path && c.device == vol.device {
                    return (c.outcome.clone(), true);
                }
            }
        }
        let outcome = self.run_probe(vol.backend, path).await;
        debug!(volume_id = %vol.id, summary = %outcome.summary(), "cuFile probe");
        let entry = CachedProbe {
            at: Instant::now(),
            path: path.map(Path::to_path_buf),
            device: vol.device,
            outcome: outcome.clone(),
        };
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(vol.id.clone(), entry);
        (outcome, false)
    }
}

/// The probe's line when there is no GPU driver to probe through.
fn probe_not_run_without_gpu() -> Check {
    Check::fail(
        "cufile.probe",
        "the cuFile probe was not run: no NVIDIA GPU driver",
        "not run: gpu.driver failed, and cuFile needs an NVIDIA GPU driver",
        "load the NVIDIA driver (GPU Operator or the host's), then publish again",
    )
}

/// The outcome of a probe that gave no answer (its task died, or it outlived the deadline).
fn failed_outcome(backend: Backend, path: Option<&Path>, detail: String) -> ProbeOutcome {
    ProbeOutcome {
        status: ProbeStatus::TimedOut,
        mode: GdsMode::Unknown,
        detail,
        backend,
        strict: true,
        library: None,
        library_version: None,
        driver_open: None,
        props: None,
        file: path.map(|p| p.to_string_lossy().into_owned()),
        registration: None,
        stage: None,
        elapsed_ms: 0,
        exit_code: None,
        signal: None,
        log_tail: Vec::new(),
        stderr_tail: None,
        read: None,
        strict_pass: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_without_an_answer_fails_the_probe_check() {
        let o = failed_outcome(Backend::Nvme, Some(Path::new("/mnt/v")), "gone".into());
        let c = probe_check_required(&o);
        assert_eq!(c.status, gds_check::Status::Fail);
        assert!(c.evidence.contains("gone"), "{}", c.evidence);
        assert_eq!(o.file.as_deref(), Some("/mnt/v"));
    }

    #[test]
    fn no_gpu_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = gpu_check(&HostPaths::under(dir.path()));
        assert_eq!(missing.status, gds_check::Status::Fail);
        assert!(missing.evidence.contains("no GPU"), "{}", missing.evidence);
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/nvidia0"), "").unwrap();
        std::fs::write(dir.path().join("dev/nvidiactl"), "").unwrap();
        let c = gpu_check(&HostPaths::under(dir.path()));
        assert_eq!(c.status, gds_check::Status::Pass);
        assert!(c.evidence.contains("but nvidia0 in"), "{}", c.evidence);
        // The failed line says what was found, not what passing means.
        assert!(
            missing.summary.starts_with("no NVIDIA GPU driver") && missing.summary != c.summary,
            "{missing:?}"
        );
        let not_run = probe_not_run_without_gpu();
        assert!(not_run.summary.contains("not run"), "{not_run:?}");
    }
}
