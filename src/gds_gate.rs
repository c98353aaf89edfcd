//! The GDS gate: before NodePublishVolume bind-mounts a volume, check that a workload will get
//! GPUDirect Storage on it, as the StorageClass parameter `gdsPolicy` asks.
//!
//! - `disabled`: nothing is checked (csi-sanity, test rigs and GPU-less clusters say so).
//! - `required`, also when the parameter is absent: the node checks, the volume checks and the cuFile probe must all pass with true
//!   GDS; compat mode is a failure. Otherwise publish fails with FAILED_PRECONDITION, naming
//!   every failed check as `check-id: evidence -> remedy`, one per line.
//! - `preferred`: the same checks, but a failure only logs a warning and marks the volume as
//!   compat, so NodeGetVolumeStats reports an abnormal volume condition saying why.
//!
//! The node and volume checks only read procfs/sysfs/udev files, so they run on every publish.
//! The probe loads libcufile in a child process of this binary (`gds-csi cufile-probe`) under a
//! deadline, and its outcome is cached per volume for `cache_ttl`.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gds_check::{
    node_checks, probe_check_required, run_probe, volume_checks, Backend, Check, HostPaths,
    ProbeArgs, ProbeOutcome, Report,
};
use tracing::{debug, info, warn};

use crate::error::{Error, Result};

/// The StorageClass parameter that selects the policy.
pub const PARAM: &str = crate::request::PARAM_GDS_POLICY;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Required,
    Preferred,
    Disabled,
}

impl Policy {
    /// The policy of a volume from its stored parameters. Absent means `required`: a volume is
    /// published only once the nvidia_fs and cuFile checks pass unless its class turns the gate
    /// off (`gdsPolicy: disabled`, as csi-sanity and the test rigs do).
    pub fn from_parameters<'a, I>(params: I) -> Result<Policy>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        match params.into_iter().find(|(k, _)| k.as_str() == PARAM) {
            None => Ok(Policy::Required),
            Some((_, v)) => v.parse(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Required => "required",
            Policy::Preferred => "preferred",
            Policy::Disabled => "disabled",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Policy> {
        match s {
            "required" => Ok(Policy::Required),
            "preferred" => Ok(Policy::Preferred),
            "disabled" => Ok(Policy::Disabled),
            // The same refusal as a bad value in CreateVolume's parameters.
            other => Err(Error::invalid(
                "parameters",
                format!("{PARAM} {other:?} must be required, preferred or disabled"),
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the gate decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `disabled`: nothing was checked.
    Skipped,
    /// Every check passed: true GDS.
    Ready,
    /// `preferred` and something failed: published, cuFile will run in compat mode (or not at
    /// all); the string says why.
    Compat(String),
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

/// What the gate needs from the configuration.
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

struct CachedProbe {
    at: Instant,
    path: Option<PathBuf>,
    outcome: ProbeOutcome,
}

pub struct GdsGate {
    config: GateConfig,
    probes: Mutex<HashMap<String, CachedProbe>>,
    compat: Mutex<HashMap<String, String>>,
}

/// Is there an NVIDIA GPU driver at all? Without one cuFile cannot work, and the probe would
/// only hang until its deadline; doctor uses this to say so plainly.
pub fn gpu_check(paths: &HostPaths) -> Check {
    let id = "gpu.driver";
    let title = "NVIDIA GPU driver present";
    let gpus_dir = paths.proc("driver/nvidia/gpus");
    let mut gpus: Vec<String> = std::fs::read_dir(&gpus_dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    gpus.sort();
    if !gpus.is_empty() {
        return Check::pass(
            id,
            title,
            format!("{}: {}", gpus_dir.display(), gpus.join(" ")),
        );
    }
    let mut nodes: Vec<String> = std::fs::read_dir(&paths.dev_root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.strip_prefix("nvidia")
                        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
                })
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    if !nodes.is_empty() {
        return Check::pass(
            id,
            title,
            format!(
                "{} absent, but {} in {}",
                gpus_dir.display(),
                nodes.join(" "),
                paths.dev_root.display()
            ),
        );
    }
    Check::fail(
        id,
        title,
        format!(
            "no {} and no nvidia<N> device node in {}: this node has no GPU or no NVIDIA driver",
            gpus_dir.display(),
            paths.dev_root.display()
        ),
        "GDS needs an NVIDIA GPU with its driver loaded (GPU Operator or the host's driver); \
         schedule GDS workloads on GPU nodes (nvidia.com/gpu.present=true)",
    )
}

/// The node-level checks the gate, NodeGetInfo and doctor share.
pub fn node_report(paths: &HostPaths, backend: Backend) -> Report {
    let mut r = Report::new(vec![gpu_check(paths)]);
    r.extend(node_checks(paths, backend));
    r
}

/// `check-id: evidence -> remedy`, one line.
pub fn failure_line(c: &Check) -> String {
    let evidence = if c.evidence.is_empty() {
        c.title.as_str()
    } else {
        c.evidence.as_str()
    };
    let evidence = evidence.replace('\n', " ");
    match &c.remedy {
        Some(r) => format!("{}: {evidence} -> {r}", c.id),
        None => format!("{}: {evidence}", c.id),
    }
}

fn failure_lines(report: &Report) -> String {
    report
        .failures()
        .iter()
        .map(|c| failure_line(c))
        .collect::<Vec<_>>()
        .join("\n")
}

impl GdsGate {
    pub fn new(config: GateConfig) -> Self {
        GdsGate {
            config,
            probes: Mutex::default(),
            compat: Mutex::default(),
        }
    }

    pub fn paths(&self) -> &HostPaths {
        &self.config.paths
    }

    pub fn config(&self) -> &GateConfig {
        &self.config
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
        match tokio::time::timeout(timeout + Duration::from_secs(5), task).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => failed_outcome(backend, path, format!("the probe task failed: {e}")),
            Err(_) => failed_outcome(
                backend,
                path,
                format!(
                    "no probe answer within {:?}",
                    timeout + Duration::from_secs(5)
                ),
            ),
        }
    }

    /// The probe outcome for a volume, from the cache while it is fresh.
    async fn probe_cached(
        &self,
        volume_id: &str,
        backend: Backend,
        path: Option<&Path>,
    ) -> (ProbeOutcome, bool) {
        {
            let cache = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = cache.get(volume_id) {
                if c.at.elapsed() < self.config.cache_ttl && c.path.as_deref() == path {
                    return (c.outcome.clone(), true);
                }
            }
        }
        let outcome = self.run_probe(backend, path).await;
        debug!(volume_id, summary = %outcome.summary(), "cuFile probe");
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                volume_id.to_owned(),
                CachedProbe {
                    at: Instant::now(),
                    path: path.map(Path::to_path_buf),
                    outcome: outcome.clone(),
                },
            );
        (outcome, false)
    }

    /// The gate. `mounted_path` is the volume's staged filesystem, or None for a raw block
    /// volume (then the filesystem checks are skipped and the probe only opens the driver).
    pub async fn check_publish(
        &self,
        volume_id: &str,
        backend: Backend,
        policy: Policy,
        mounted_path: Option<&Path>,
    ) -> Result<GateOutcome> {
        if policy == Policy::Disabled {
            self.forget(volume_id);
            return Ok(GateOutcome {
                policy,
                verdict: Verdict::Skipped,
                report: Report::default(),
                probe_cached: false,
            });
        }
        let paths = &self.config.paths;
        let mut report = node_report(paths, backend);
        if let Some(p) = mounted_path {
            report.extend(volume_checks(paths, backend, p));
        }
        let (outcome, probe_cached) = self.probe_cached(volume_id, backend, mounted_path).await;
        report.extend([probe_check_required(&outcome)]);

        if report.ready() {
            self.compat
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(volume_id);
            info!(volume_id, %policy, probe_cached, "GDS gate: true GDS");
            return Ok(GateOutcome {
                policy,
                verdict: Verdict::Ready,
                report,
                probe_cached,
            });
        }
        let failed = report.failures().len();
        let lines = failure_lines(&report);
        match policy {
            Policy::Required => Err(Error::FailedPrecondition(format!(
                "GDS is not available for volume {volume_id} ({PARAM}=required; use preferred to \
                 publish anyway in compat mode); {failed} check(s) failed:\n{lines}"
            ))),
            _ => {
                let why = format!(
                    "GDS in compat mode ({PARAM}=preferred): {failed} check(s) failed: {}",
                    lines.replace('\n', "; ")
                );
                warn!(
                    volume_id,
                    failed,
                    "publishing without true GDS: {}",
                    lines.replace('\n', "; ")
                );
                self.compat
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(volume_id.to_owned(), why.clone());
                Ok(GateOutcome {
                    policy,
                    verdict: Verdict::Compat(why),
                    report,
                    probe_cached,
                })
            }
        }
    }

    /// Why the volume was published in compat mode, if it was.
    pub fn compat_reason(&self, volume_id: &str) -> Option<String> {
        self.compat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(volume_id)
            .cloned()
    }

    /// Drops what the gate remembers about a volume (its compat mark and cached probe).
    pub fn forget(&self, volume_id: &str) {
        self.compat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(volume_id);
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(volume_id);
    }

    /// Readiness per backend, for NodeGetInfo's topology: `("gds-nvme", true)`, ...
    pub fn node_readiness(&self) -> Vec<(&'static str, bool)> {
        [(Backend::Nvme, "gds-nvme"), (Backend::NfsRdma, "gds-nfs-rdma")]
            .into_iter()
            .map(|(b, key)| {
                let r = node_report(&self.config.paths, b);
                let ready = r.ready();
                if !ready {
                    debug!(backend = %b, failed = %failure_lines(&r).replace('\n', "; "), "node not GDS-ready");
                }
                (key, ready)
            })
            .collect()
    }
}

fn failed_outcome(backend: Backend, path: Option<&Path>, detail: String) -> ProbeOutcome {
    // Built through serde so this crate needs no constructor from gds-check.
    let v = serde_json::json!({
        "status": "timed_out",
        "mode": "unknown",
        "detail": detail,
        "backend": backend,
        "strict": true,
        "library": null,
        "library_version": null,
        "driver_open": null,
        "props": null,
        "file": path.map(|p| p.to_string_lossy().into_owned()),
        "registration": null,
        "stage": null,
        "elapsed_ms": 0,
        "exit_code": null,
        "signal": null,
        "log_tail": [],
        "stderr_tail": null,
    });
    serde_json::from_value(v).expect("ProbeOutcome fields")
}

// ---------------------------------------------------------------------------------------------

/// An NFS volume's accessible topology: none with `gdsPolicy` disabled or preferred (any node
/// that reaches the server); with required (also the default) only nodes whose node checks pass for NFS over RDMA
/// (`<driver>/gds-nfs-rdma=true`, from [`node_topology`]), so a gated claim's pod is not
/// scheduled where publish would refuse it. A bad stored policy is left to the publish gate.
pub fn nfs_topology<'a, I>(driver_name: &str, params: I) -> Vec<crate::csi::Topology>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    match Policy::from_parameters(params) {
        Ok(Policy::Required) => vec![crate::csi::Topology {
            segments: HashMap::from([(format!("{driver_name}/gds-nfs-rdma"), "true".into())]),
        }],
        // preferred publishes anywhere (in compat mode); disabled checks nothing.
        _ => vec![],
    }
}

/// Fixture host trees for tests and benches: the files the checks read, laid out as on a real
/// node, under a directory the caller owns, and a stand-in probe child.
#[doc(hidden)]
pub mod fixture {
    use std::fs;
    use std::path::{Path, PathBuf};

    use gds_check::HostPaths;

    pub const CUFILE_STRICT: &str = r#"{
        // as NVIDIA ships it, with compat mode off
        "logging": { "level": "ERROR" },
        "properties": { "allow_compat_mode": false, "max_direct_io_size_kb": 16384 },
        "denylist": { "drivers": [], "devices": [], "mounts": [], "filesystems": [] }
    }"#;

    pub struct Tree {
        pub root: PathBuf,
        pub paths: HostPaths,
    }

    impl Tree {
        pub fn new(root: &Path) -> Tree {
            for d in ["proc/self", "sys/module", "dev", "run/udev/data", "etc"] {
                fs::create_dir_all(root.join(d)).expect("fixture dir");
            }
            Tree {
                root: root.to_path_buf(),
                paths: HostPaths::under(root),
            }
        }

        pub fn write(&self, rel: &str, text: &str) -> &Self {
            let p = self.root.join(rel);
            fs::create_dir_all(p.parent().expect("parent")).expect("fixture dir");
            fs::write(p, text).expect("fixture file");
            self
        }

        pub fn link(&self, rel: &str, target: &str) -> &Self {
            let p = self.root.join(rel);
            fs::create_dir_all(p.parent().expect("parent")).expect("fixture dir");
            let _ = fs::remove_file(&p);
            std::os::unix::fs::symlink(target, p).expect("fixture link");
            self
        }

        pub fn remove(&self, rel: &str) -> &Self {
            let p = self.root.join(rel);
            let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
            self
        }

        /// A GPU node with cufile.json (compat off), IOMMU passthrough, kernel 5.15, and no
        /// nvidia_fs yet.
        pub fn gpu_node(&self) -> &Self {
            self.write(
                "proc/driver/nvidia/gpus/0000:18:00.0/information",
                "Model: NVIDIA H200\n",
            )
            .write("dev/nvidia0", "")
            .write("etc/cufile.json", CUFILE_STRICT)
            .write("proc/sys/kernel/osrelease", "5.15.0-100-generic\n")
            .write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro iommu=pt\n")
        }

        /// nvidia_fs loaded, with these storage drivers registered (`nvme: 1\n`, ...).
        pub fn nvidia_fs(&self, modules: &str) -> &Self {
            self.write("sys/module/nvidia_fs/version", "2.20.5\n")
                .write("proc/driver/nvidia-fs/version", "version: 2.20\n")
                .write("proc/driver/nvidia-fs/modules", modules)
                .write("dev/nvidia-fs0", "")
        }

        /// An NVMe namespace `nvme0n1` (dev 259:0, PCIe) holding an ext4 filesystem mounted at
        /// `mount_point` with `data=ordered`; `udev`: whether the udev database knows it.
        pub fn nvme_volume(&self, mount_point: &Path, udev: bool) -> &Self {
            let ctrl = "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0";
            self.write(&format!("{ctrl}/transport"), "pcie\n")
                .write(&format!("{ctrl}/nvme0n1/dev"), "259:0\n")
                .write(&format!("{ctrl}/nvme0n1/size"), "2097152\n")
                .link(&format!("{ctrl}/nvme0n1/device"), "..")
                .link(
                    "sys/dev/block/259:0",
                    "../../devices/pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1",
                )
                .mountinfo(&format!(
                    "100 29 259:0 / {} rw,relatime shared:50 - ext4 /dev/nvme0n1 rw,data=ordered",
                    mount_point.display()
                ));
            if udev {
                self.write(
                    "run/udev/data/b259:0",
                    "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:ID_FS_UUID=5e1f1a4c-0000-4000-8000-000000000001\n",
                );
            } else {
                self.remove("run/udev/data/b259:0");
            }
            self
        }

        /// md RAID0 `md0` (dev 9:0) over the PCIe namespaces `nvme0n1` (259:0) and `nvme1n1`
        /// (259:2), ext4 mounted at `mount_point` with `data=ordered`; every device has its udev
        /// entry. `rule`: the array's entry carries the members as NVIDIA's udev rule for RAID
        /// volumes exports them (`mdadm --detail --export`); else what mdadm's stock rule gives
        /// (`--no-devices`: level and count, no members).
        pub fn md_volume(&self, mount_point: &Path, rule: bool) -> &Self {
            let pci = "sys/devices/pci0000:00/0000:00:01.0/nvme";
            for (ctrl, ns, dev) in [("nvme0", "nvme0n1", "259:0"), ("nvme1", "nvme1n1", "259:2")] {
                self.write(&format!("{pci}/{ctrl}/transport"), "pcie\n")
                    .write(&format!("{pci}/{ctrl}/{ns}/dev"), &format!("{dev}\n"))
                    .link(&format!("{pci}/{ctrl}/{ns}/device"), "..")
                    .link(
                        &format!("sys/dev/block/{dev}"),
                        &format!("../../devices/pci0000:00/0000:00:01.0/nvme/{ctrl}/{ns}"),
                    )
                    .link(
                        &format!("sys/devices/virtual/block/md0/slaves/{ns}"),
                        &format!("../../../../pci0000:00/0000:00:01.0/nvme/{ctrl}/{ns}"),
                    )
                    .write(
                        &format!("run/udev/data/b{dev}"),
                        "E:ID_FS_TYPE=linux_raid_member\nE:ID_FS_USAGE=raid\n",
                    );
            }
            let mut entry = String::from(
                "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:MD_LEVEL=raid0\nE:MD_DEVICES=2\n\
                 E:MD_METADATA=1.2\nE:MD_UUID=4d8bea96:08136ba8:75029197:fe2e2a4b\n",
            );
            if rule {
                entry += "E:MD_DEVICE_dev_nvme0n1_ROLE=0\nE:MD_DEVICE_dev_nvme0n1_DEV=/dev/nvme0n1\n\
                          E:MD_DEVICE_dev_nvme1n1_ROLE=1\nE:MD_DEVICE_dev_nvme1n1_DEV=/dev/nvme1n1\n";
            }
            self.write("sys/devices/virtual/block/md0/md/level", "raid0\n")
                .write("sys/devices/virtual/block/md0/dev", "9:0\n")
                .link("sys/dev/block/9:0", "../../devices/virtual/block/md0")
                .write("run/udev/data/b9:0", &entry)
                .mountinfo(&format!(
                    "100 29 9:0 / {} rw,relatime shared:50 - ext4 /dev/md0 rw,data=ordered",
                    mount_point.display()
                ))
        }

        pub fn mountinfo(&self, line: &str) -> &Self {
            self.write(
                "proc/self/mountinfo",
                &format!("21 1 0:20 / /proc rw,nosuid - proc proc rw\n{line}\n"),
            )
        }

        /// A stand-in for `gds-csi cufile-probe`: `/bin/sh <script>` that counts its runs and
        /// answers with a completed probe in `mode` (`true_gds` or `compat`).
        pub fn probe_stub(&self, mode: &str) -> (PathBuf, Vec<String>) {
            let supported: &[&str] = if mode == "true_gds" { &["nvme"] } else { &[] };
            let outcome = serde_json::json!({
                "status": "completed", "mode": mode,
                "detail": if mode == "true_gds" { "registered; driver has a NVMe GDS path" }
                          else { "registered, but the driver reports no NVMe GDS path: compat mode" },
                "backend": "nvme", "strict": false, "library": "libcufile.so.0",
                "library_version": 1150,
                "driver_open": { "code": 0, "name": "SUCCESS", "cu_err": 0 },
                "props": {
                    "nvfs_major": 2, "nvfs_minor": 20, "poll_thresh_size": 4, "max_direct_io_size": 16384,
                    "dstatusflags": if mode == "true_gds" { 16 } else { 0 }, "dcontrolflags": 0, "fflags": 15,
                    "max_device_cache_size": 0, "per_buffer_cache_size": 0, "max_device_pinned_mem_size": 0,
                    "max_batch_io_size": 128, "max_batch_io_timeout_msecs": 5,
                    "supported": supported, "compat_allowed": mode != "true_gds", "poll_mode": false, "p2pdma": false
                },
                "file": null, "registration": { "code": 0, "name": "SUCCESS", "cu_err": 0 },
                "stage": "done", "elapsed_ms": 1, "exit_code": null, "signal": null,
                "log_tail": [], "stderr_tail": null
            });
            let answer = self.root.join(format!("probe-{mode}.json"));
            fs::write(&answer, outcome.to_string()).expect("probe answer");
            let runs = self.root.join("probe-runs");
            let script = self.root.join(format!("probe-{mode}.sh"));
            fs::write(
                &script,
                format!(
                    "echo run >> '{}'\ncat '{}'\n",
                    runs.display(),
                    answer.display()
                ),
            )
            .expect("probe script");
            (
                "/bin/sh".into(),
                vec![script.to_string_lossy().into_owned()],
            )
        }

        /// How often the stand-in probe ran.
        pub fn probe_runs(&self) -> usize {
            fs::read_to_string(self.root.join("probe-runs")).map_or(0, |t| t.lines().count())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::Tree;
    use super::*;
    use std::collections::BTreeMap;

    const MP: &str = "/var/lib/kubelet/plugins/gds/staging/vol";

    fn gate(tree: &Tree, mode: &str, ttl: Duration) -> GdsGate {
        let (exe, prefix) = tree.probe_stub(mode);
        GdsGate::new(GateConfig {
            paths: tree.paths.clone(),
            probe_exe: exe,
            probe_prefix: prefix,
            cufile_library: None,
            probe_timeout: Duration::from_secs(10),
            cache_ttl: ttl,
        })
    }

    #[test]
    fn policy_defaults_to_required() {
        let mut p = BTreeMap::new();
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Required);
        p.insert("fsType".to_string(), "ext4".to_string());
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Required);
        p.insert(PARAM.to_string(), "disabled".to_string());
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Disabled);
        p.insert(PARAM.to_string(), "preferred".to_string());
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Preferred);
        p.insert(PARAM.to_string(), "maybe".to_string());
        assert!(Policy::from_parameters(&p).is_err());
    }

    #[test]
    fn nfs_volumes_carry_readiness_topology_only_when_required() {
        let key = "gds.example/gds-nfs-rdma".to_string();
        let mut p = BTreeMap::new();
        p.insert("server".to_string(), "10.0.0.1".to_string());
        // Absent is required.
        let t = nfs_topology("gds.example", &p);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].segments.get(&key).map(String::as_str), Some("true"));
        for off in ["disabled", "preferred"] {
            p.insert(PARAM.to_string(), off.to_string());
            assert!(nfs_topology("gds.example", &p).is_empty(), "{off}");
        }
    }

    #[tokio::test]
    async fn required_refuses_and_names_every_failed_check() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        // The field failure: nvidia_fs loaded but only wekafsio registered; no udev entry.
        t.gpu_node()
            .nvidia_fs("wekafsio: 1\n")
            .nvme_volume(Path::new(MP), false);
        let g = gate(&t, "compat", Duration::from_secs(60));
        let err = g
            .check_publish(
                "vol-1",
                Backend::Nvme,
                Policy::Required,
                Some(Path::new(MP)),
            )
            .await
            .unwrap_err();
        let Error::FailedPrecondition(msg) = &err else {
            panic!("{err:?}")
        };
        let lines: Vec<&str> = msg.lines().skip(1).collect();
        for id in [
            "nvidia_fs.storage_driver",
            "nvme.p2pdma",
            "volume.udev",
            "cufile.probe",
        ] {
            let line = lines
                .iter()
                .find(|l| l.starts_with(&format!("{id}: ")))
                .unwrap_or_else(|| panic!("{id} not named in:\n{msg}"));
            assert!(line.contains(" -> "), "no remedy on {line}");
        }
        assert!(msg.contains("wekafsio"), "{msg}");
        assert!(msg.contains("5027"), "{msg}");
        // nvme.p2pdma is the fourth: neither route to true GDS on NVMe is there.
        assert!(msg.contains("4 check(s) failed"), "{msg}");
        assert_eq!(lines.len(), 4, "{msg}");
        // Nothing is remembered as compat for a refused volume.
        assert_eq!(g.compat_reason("vol-1"), None);
        assert_eq!(
            tonic::Status::from(err).code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[tokio::test]
    async fn nvidia_fs_absent_fails_module_devices_and_driver() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        t.gpu_node().nvme_volume(Path::new(MP), true);
        let g = gate(&t, "compat", Duration::from_secs(60));
        let Err(Error::FailedPrecondition(msg)) = g
            .check_publish(
                "vol-1",
                Backend::Nvme,
                Policy::Required,
                Some(Path::new(MP)),
            )
            .await
        else {
            panic!("required must refuse without nvidia_fs")
        };
        for id in [
            "nvidia_fs.module",
            "nvidia_fs.devices",
            "nvidia_fs.storage_driver",
            "nvme.p2pdma",
            "cufile.probe",
        ] {
            assert!(msg.contains(&format!("\n{id}: ")), "{id} missing:\n{msg}");
        }
        assert!(!msg.contains("volume.udev"), "{msg}");
    }

    #[tokio::test]
    async fn preferred_publishes_and_remembers_compat() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        t.gpu_node()
            .nvidia_fs("wekafsio: 1\n")
            .nvme_volume(Path::new(MP), false);
        let g = gate(&t, "compat", Duration::from_secs(60));
        let o = g
            .check_publish(
                "vol-2",
                Backend::Nvme,
                Policy::Preferred,
                Some(Path::new(MP)),
            )
            .await
            .unwrap();
        let Verdict::Compat(why) = &o.verdict else {
            panic!("{:?}", o.verdict)
        };
        assert!(why.contains("compat mode"), "{why}");
        assert!(why.contains("volume.udev"), "{why}");
        assert_eq!(g.compat_reason("vol-2").as_deref(), Some(why.as_str()));
        // Fixed (udev entry and nvme registration): the next publish clears the mark.
        t.nvidia_fs("nvme: 1\n").nvme_volume(Path::new(MP), true);
        let g2 = gate(&t, "true_gds", Duration::from_secs(60));
        g2.compat
            .lock()
            .unwrap()
            .insert("vol-2".into(), why.clone());
        let o = g2
            .check_publish(
                "vol-2",
                Backend::Nvme,
                Policy::Preferred,
                Some(Path::new(MP)),
            )
            .await
            .unwrap();
        assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
        assert_eq!(g2.compat_reason("vol-2"), None);
    }

    #[tokio::test]
    async fn disabled_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        // Nothing GDS-related on this node at all.
        let g = gate(&t, "compat", Duration::from_secs(60));
        let o = g
            .check_publish(
                "vol-3",
                Backend::Nvme,
                Policy::Disabled,
                Some(Path::new(MP)),
            )
            .await
            .unwrap();
        assert_eq!(o.verdict, Verdict::Skipped);
        assert!(o.report.checks.is_empty());
        assert_eq!(t.probe_runs(), 0);
    }

    #[tokio::test]
    async fn ready_node_passes_and_probe_is_cached_per_volume() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        t.gpu_node()
            .nvidia_fs("nvme: 1\n")
            .nvme_volume(Path::new(MP), true);
        let g = gate(&t, "true_gds", Duration::from_secs(60));
        let mp = Some(Path::new(MP));
        let o = g
            .check_publish("vol-4", Backend::Nvme, Policy::Required, mp)
            .await
            .unwrap();
        assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
        assert!(!o.probe_cached);
        let o = g
            .check_publish("vol-4", Backend::Nvme, Policy::Required, mp)
            .await
            .unwrap();
        assert!(o.probe_cached);
        assert_eq!(t.probe_runs(), 1);
        // Another volume gets its own probe.
        g.check_publish("vol-5", Backend::Nvme, Policy::Required, mp)
            .await
            .unwrap();
        assert_eq!(t.probe_runs(), 2);
        // The cheap checks are re-read every time: losing the udev entry refuses at once,
        // although the probe answer is still cached.
        t.nvme_volume(Path::new(MP), false);
        let err = g
            .check_publish("vol-4", Backend::Nvme, Policy::Required, mp)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("volume.udev: "), "{err}");
        assert_eq!(t.probe_runs(), 2);
        // A zero TTL probes every time.
        let g0 = gate(&t, "true_gds", Duration::ZERO);
        t.nvme_volume(Path::new(MP), true);
        g0.check_publish("vol-4", Backend::Nvme, Policy::Required, mp)
            .await
            .unwrap();
        g0.check_publish("vol-4", Backend::Nvme, Policy::Required, mp)
            .await
            .unwrap();
        assert_eq!(t.probe_runs(), 4);
    }

    #[tokio::test]
    async fn block_volume_skips_filesystem_checks() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        // No mount, no udev entry: irrelevant for a raw block volume.
        t.gpu_node().nvidia_fs("nvme: 1\n");
        let g = gate(&t, "true_gds", Duration::from_secs(60));
        let o = g
            .check_publish("vol-6", Backend::Nvme, Policy::Required, None)
            .await
            .unwrap();
        assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
        assert!(o.report.checks.iter().all(|c| !c.id.starts_with("volume.")));
    }

    #[test]
    fn readiness_per_backend() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path());
        t.gpu_node().nvidia_fs("nvme: 1\n");
        let g = gate(&t, "true_gds", Duration::from_secs(60));
        assert_eq!(
            g.node_readiness(),
            vec![("gds-nvme", true), ("gds-nfs-rdma", false)]
        );
        t.nvidia_fs("wekafsio: 1\n");
        assert_eq!(
            g.node_readiness(),
            vec![("gds-nvme", false), ("gds-nfs-rdma", false)]
        );
        // No GPU at all: the GPU check says so.
        let empty = tempfile::tempdir().unwrap();
        let e = Tree::new(empty.path());
        let c = gpu_check(&e.paths);
        assert_eq!(c.status, gds_check::Status::Fail);
        assert!(c.evidence.contains("no GPU"), "{}", c.evidence);
    }
}
