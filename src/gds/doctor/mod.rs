//! `gds-csi doctor`: the gate's checks, run by hand on a node, with remedies for an operator
//! (text) or a machine (`--json`). Exit status 0 only when what was asked about is GDS-ready:
//! the mounted volume with `--path`, else the node. The same doctor for a workload:
//! `inspect` (what cuFile in one container will see, as findings), `pod` (`doctor --pod`:
//! those findings from containerd's OCI specs on the node), `read` (`workload-read`: from
//! inside the container, then a cuFile read naming the path); `environment`: what the
//! probe needs from the doctor's own process.

pub mod environment;
pub mod inspect;
pub mod pod;
pub mod read;

use std::path::Path;

use gds_check::{
    probe_check_required, run_probe, volume_checks, GdsMode, ProbeOutcome, ProbeStatus, Report,
    Status,
};
use serde_json::json;

use crate::gds::gate::{failure_line, node_report};
use crate::runtime::config::DoctorArgs;

pub struct Diagnosis {
    pub backend: gds_check::Backend,
    pub path: Option<std::path::PathBuf>,
    pub report: Report,
    pub probe: Option<ProbeOutcome>,
    /// Plain sentences: the headline facts an operator needs first.
    pub notes: Vec<String>,
}

impl Diagnosis {
    pub fn ready(&self) -> bool {
        self.report.ready()
    }

    pub fn to_json(&self) -> String {
        let v = json!({
            "ready": self.ready(),
            "backend": self.backend,
            "path": self.path,
            "notes": self.notes,
            "failed": self.report.failures().iter().map(|c| failure_line(c)).collect::<Vec<_>>(),
            "checks": self.report.checks,
            "probe": self.probe,
        });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        let what = match &self.path {
            Some(p) => format!("{} ({} backend)", p.display(), self.backend),
            None => format!("this node ({} backend)", self.backend),
        };
        let mut out = format!(
            "{what}: {}\n",
            if self.ready() {
                "GDS-ready"
            } else {
                "NOT GDS-ready"
            }
        );
        for n in &self.notes {
            out += &format!("* {n}\n");
        }
        out += "\n";
        out += &self.report.to_text();
        if let Some(p) = &self.probe {
            out += &format!("\ncuFile probe: {}\n", p.summary());
            for l in p.log_tail.iter().rev().take(5).rev() {
                out += &format!("    cufile.log: {}\n", l.trim());
            }
        }
        out
    }
}

fn status_of(report: &Report, id: &str) -> Option<Status> {
    report.get(id).map(|c| c.status)
}

/// No GPU or GPU driver here: the cause of every other GDS failure, and no probe can run.
fn no_gpu(report: &Report) -> bool {
    status_of(report, "gpu.driver") == Some(Status::Fail)
}

/// What the node's failed checks mean for GDS, the cause first, then what the probe's
/// environment lacks.
fn pod_and_node_notes(
    paths: &gds_check::HostPaths,
    args: &DoctorArgs,
    report: &Report,
) -> Vec<String> {
    let mut notes = Vec::new();
    let no_gpu = no_gpu(report);
    if no_gpu {
        notes.push(
            "No NVIDIA GPU or GPU driver is visible on this node: GPUDirect Storage cannot \
             work here, and the cuFile probe cannot run."
                .into(),
        );
    }
    if status_of(report, "nvidia_fs.module") == Some(Status::Fail) {
        notes.push(
            "nvidia_fs is not loaded (and NVMe P2PDMA mode is not set up): at best cuFile runs in \
             compat mode, reading through POSIX bounce buffers."
                .into(),
        );
    }
    // In a pod the missing pieces may be the chart's doing (runtime class, device mounts),
    // so they follow the cause; on a host without a GPU they would only repeat it.
    let place = environment::Place::here();
    if !no_gpu || place == environment::Place::Pod {
        let lib_dirs = environment::loader_dirs();
        let env = environment::Env {
            dev: Path::new("/dev"),
            udev_data_dir: &paths.udev_data_dir,
            cufile_json: &paths.cufile_json,
            cufile_library: args.gds.cufile_library.as_deref(),
            lib_dirs: &lib_dirs,
        };
        let pieces = environment::pieces(&env);
        notes.extend(environment::missing_note(&pieces, place));
    }
    notes
}

/// For a volume on md RAID: the array and each member as the checks read them (level, state,
/// partition, transport, driver registration), which the check list shows only on failure.
fn md_note(report: &Report) -> Option<String> {
    report
        .get("volume.md_members")
        .map(|c| format!("md RAID volume: {}", c.evidence))
}

/// What the cuFile probe said, in a sentence for the operator.
fn probe_note(probe: Option<&ProbeOutcome>, timeout: std::time::Duration) -> String {
    match probe {
        Some(o)
            if matches!(
                o.status,
                ProbeStatus::LibraryMissing | ProbeStatus::SymbolMissing
            ) =>
        {
            format!(
                "libcufile is not installed here or not on the loader path ({}): install the GDS \
             packages or pass --cufile-library.",
                o.detail
            )
        }
        Some(o) if o.status == ProbeStatus::TimedOut => format!(
            "The cuFile probe hung and was killed after {timeout:?} ({}).",
            o.detail
        ),
        Some(o) => format!(
            "cuFile says: {} ({}).",
            match o.mode {
                GdsMode::TrueGds => "true GDS",
                GdsMode::Compat => "compat mode only (no DMA to GPU memory)",
                GdsMode::Unavailable => "cuFile does not work on this path",
                GdsMode::Unknown => "unknown",
            },
            o.detail
        ),
        None => "The cuFile probe was not run (add --probe).".into(),
    }
}

/// Runs the checks (and the probe, with `--probe`) the way the gate would.
pub fn diagnose(args: &DoctorArgs, probe_exe: &Path, probe_prefix: &[String]) -> Diagnosis {
    let paths = args
        .gds
        .host_paths(&args.host_proc, &args.host_sys, &args.host_dev);
    let backend = args.backend;
    let mut report = node_report(&paths, backend);
    if let Some(p) = &args.path {
        report.extend(volume_checks(&paths, backend, p));
    }
    let probe = args.probe.then(|| {
        let mut a = gds_check::ProbeArgs::new(backend);
        a.library = args.gds.cufile_library.clone();
        a.path = args.path.clone();
        a.cufile_json = Some(paths.cufile_json.clone());
        run_probe(probe_exe, probe_prefix, &a, args.gds.probe_timeout)
    });
    if let Some(o) = &probe {
        report.extend([probe_check_required(o)]);
    }

    let mut notes = pod_and_node_notes(&paths, args, &report);
    notes.extend(md_note(&report));
    // "Add --probe" only where the probe could run.
    if probe.is_some() || !no_gpu(&report) {
        notes.push(probe_note(probe.as_ref(), args.gds.probe_timeout));
    }
    Diagnosis {
        backend,
        path: args.path.clone(),
        report,
        probe,
        notes,
    }
}

/// `gds-csi doctor`: prints the diagnosis; 0 when ready, 1 when not.
pub fn main(args: &DoctorArgs) -> i32 {
    let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    let d = diagnose(args, &exe, &probe_prefix());
    let text = if args.json {
        d.to_json() + "\n"
    } else {
        d.to_text()
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
    i32::from(!d.ready())
}

/// The arguments before the probe's own when this binary runs itself as the probe child.
pub fn probe_prefix() -> Vec<String> {
    vec!["cufile-probe".into(), "--".into()]
}

/// `gds-csi cufile-probe <probe args>`: the child side. Never returns to the caller's runtime.
pub fn probe_child(args: &[String]) -> i32 {
    let args = args.iter().skip_while(|a| a.as_str() == "--").cloned();
    match gds_check::ProbeArgs::parse(args) {
        Ok(a) => gds_check::probe_child_main(a),
        Err(e) => {
            eprintln!("gds-csi cufile-probe: {e}");
            2
        }
    }
}
