//! GPUDirect Storage readiness checks for gds-csi.
//!
//! Three layers, each usable on its own:
//! - pure parsers for the files GDS readiness hinges on ([`parse`]);
//! - node and volume checks that read those files through [`HostPaths`] ([`node_checks`],
//!   [`volume_checks`]), so tests and containers can point them at another tree;
//! - a cuFile probe that runs libcufile in a child process under a deadline ([`probe`]),
//!   because libcufile can hang or crash and must never take the plugin down with it.

// Request paths (the gate runs these per NodePublish) return outcomes, never panic.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub mod node;
pub mod parse;
pub mod probe;
pub mod volume;

pub use node::node_checks;
pub use probe::{
    probe_check, probe_check_required, probe_child_main, run_probe, GdsMode, ProbeArgs,
    ProbeOutcome, ProbeStatus,
};
pub use volume::volume_checks;

/// Where the host's pseudo-filesystems and config live. Every read goes through this, so a
/// container that mounts the host under `/host` (or a test fixture tree) works unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPaths {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
    pub dev_root: PathBuf,
    /// udev database (`b<major>:<minor>` files); cuFile reads it to identify block devices.
    pub udev_data_dir: PathBuf,
    pub cufile_json: PathBuf,
    /// The host's udev rules directories, highest precedence first (`/etc/udev/rules.d`,
    /// `/run/udev/rules.d`, `/usr/lib/udev/rules.d`, `/lib/udev/rules.d`): the md RAID check
    /// reads the rule that fills an array's udev entry. Empty: not visible here (a plugin
    /// container that does not mount them), and that check only warns.
    #[serde(default)]
    pub udev_rules_dirs: Vec<PathBuf>,
}

/// udev's rules directories on a host, highest precedence first: a file in an earlier one
/// overrides the same name in a later one (udev(7), "Rules Files").
pub const UDEV_RULES_DIRS: [&str; 5] = [
    "etc/udev/rules.d",
    "run/udev/rules.d",
    "usr/local/lib/udev/rules.d",
    "usr/lib/udev/rules.d",
    "lib/udev/rules.d",
];

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            dev_root: "/dev".into(),
            udev_data_dir: "/run/udev/data".into(),
            cufile_json: default_cufile_json(),
            udev_rules_dirs: UDEV_RULES_DIRS
                .iter()
                .map(|d| Path::new("/").join(d))
                .collect(),
        }
    }
}

/// `$CUFILE_ENV_PATH_JSON` when set (that is what libcufile reads), else `/etc/cufile.json`.
pub fn default_cufile_json() -> PathBuf {
    match std::env::var_os("CUFILE_ENV_PATH_JSON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("/etc/cufile.json"),
    }
}

impl HostPaths {
    /// The host's root mounted at `root` (e.g. `/host`): `root/proc`, `root/sys`, `root/dev`,
    /// `root/run/udev/data`, `root/etc/cufile.json`, and udev's rules directories under it.
    pub fn under(root: &Path) -> Self {
        HostPaths {
            proc_root: root.join("proc"),
            sys_root: root.join("sys"),
            dev_root: root.join("dev"),
            udev_data_dir: root.join("run/udev/data"),
            cufile_json: root.join("etc/cufile.json"),
            udev_rules_dirs: UDEV_RULES_DIRS.iter().map(|d| root.join(d)).collect(),
        }
    }

    pub fn proc(&self, rel: &str) -> PathBuf {
        self.proc_root.join(rel)
    }

    pub fn sys(&self, rel: &str) -> PathBuf {
        self.sys_root.join(rel)
    }
}

/// The storage path a volume uses; decides which kernel driver must be wired to nvidia_fs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Nvme,
    NfsRdma,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Nvme => "nvme",
            Backend::NfsRdma => "nfs-rdma",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `n thing` or `n things`.
fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "nvme" => Ok(Backend::Nvme),
            "nfs-rdma" | "nfs_rdma" | "nfsrdma" | "nfs" => Ok(Backend::NfsRdma),
            other => Err(format!(
                "unknown backend {other:?} (expected nvme or nfs-rdma)"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    Warn,
    NotApplicable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Warn => "WARN",
            Status::NotApplicable => "N/A",
        }
    }
}

/// One finding. `summary` states what was found, in the words of this outcome (a Warn or
/// Fail line that read like the pass would hide the problem); `evidence` says what was read
/// (so an operator can verify it by hand); `remedy` says what to change, and is set for every
/// Fail and most Warns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub id: &'static str,
    pub summary: String,
    pub status: Status,
    pub evidence: String,
    pub remedy: Option<String>,
}

impl Check {
    pub fn new(id: &'static str, summary: impl Into<String>, status: Status) -> Self {
        Check {
            id,
            summary: summary.into(),
            status,
            evidence: String::new(),
            remedy: None,
        }
    }
    pub fn pass(id: &'static str, summary: impl Into<String>, evidence: impl Into<String>) -> Self {
        Check::new(id, summary, Status::Pass).evidence(evidence)
    }
    pub fn fail(
        id: &'static str,
        summary: impl Into<String>,
        evidence: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Check::new(id, summary, Status::Fail)
            .evidence(evidence)
            .remedy(remedy)
    }
    pub fn warn(
        id: &'static str,
        summary: impl Into<String>,
        evidence: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Check::new(id, summary, Status::Warn)
            .evidence(evidence)
            .remedy(remedy)
    }
    pub fn na(id: &'static str, summary: impl Into<String>, evidence: impl Into<String>) -> Self {
        Check::new(id, summary, Status::NotApplicable).evidence(evidence)
    }
    pub fn evidence(mut self, e: impl Into<String>) -> Self {
        self.evidence = e.into();
        self
    }
    pub fn remedy(mut self, r: impl Into<String>) -> Self {
        self.remedy = Some(r.into());
        self
    }
}

/// A set of checks. Ready means nothing failed; warnings do not block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn new(checks: Vec<Check>) -> Self {
        Report { checks }
    }

    pub fn extend(&mut self, checks: impl IntoIterator<Item = Check>) {
        self.checks.extend(checks);
    }

    pub fn ready(&self) -> bool {
        !self.checks.iter().any(|c| c.status == Status::Fail)
    }

    pub fn failures(&self) -> Vec<&Check> {
        self.with_status(Status::Fail)
    }

    pub fn warnings(&self) -> Vec<&Check> {
        self.with_status(Status::Warn)
    }

    fn with_status(&self, s: Status) -> Vec<&Check> {
        self.checks.iter().filter(|c| c.status == s).collect()
    }

    pub fn get(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    pub fn to_json(&self) -> String {
        // Serializing plain strings and enums cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Operator-facing text: every check on one line, then each failure and warning again with
    /// its evidence and remedy, so the fix is the last thing read.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let failures = self.failures();
        let warnings = self.warnings();
        let _ = writeln!(
            out,
            "GDS readiness: {} ({} checks, {} failed, {})",
            if self.ready() { "READY" } else { "NOT READY" },
            self.checks.len(),
            failures.len(),
            plural(warnings.len(), "warning")
        );
        for c in &self.checks {
            let _ = writeln!(
                out,
                "  [{:<4}] {:<28} {}",
                c.status.as_str(),
                c.id,
                c.summary
            );
        }
        for (label, list) in [("Failed", &failures), ("Warnings", &warnings)] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{label}:");
            for (i, c) in list.iter().enumerate() {
                // One cause, one remedy: a later finding with the remedy of an earlier one
                // refers to it instead of repeating it.
                let same = list[..i]
                    .iter()
                    .find(|e| e.remedy.is_some() && e.remedy == c.remedy);
                if let Some(first) = same {
                    let _ = writeln!(
                        out,
                        "- {} ({}): the same cause as {}, the same remedy",
                        c.summary, c.id, first.id
                    );
                    continue;
                }
                let _ = writeln!(out, "- {} ({})", c.summary, c.id);
                if !c.evidence.is_empty() {
                    let _ = writeln!(out, "    evidence: {}", c.evidence);
                }
                if let Some(r) = &c.remedy {
                    let _ = writeln!(out, "    remedy:   {r}");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_ready_and_text() {
        let mut r = Report::new(vec![Check::pass("a", "A", "ok")]);
        assert!(r.ready());
        r.extend([
            Check::warn("b", "B", "hmm", "look"),
            Check::fail("c", "C", "bad", "fix it"),
        ]);
        assert!(!r.ready());
        assert_eq!(r.failures().len(), 1);
        let t = r.to_text();
        assert!(t.contains("NOT READY"));
        assert!(t.contains("remedy:   fix it"));
        let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(j["checks"][2]["status"], "fail");
        assert_eq!("nfs-rdma".parse::<Backend>().unwrap(), Backend::NfsRdma);
        assert!(t.contains("1 failed, 1 warning)"), "{t}");
    }

    #[test]
    fn one_cause_is_told_once_and_the_others_refer_to_it() {
        let r = Report::new(vec![
            Check::fail("m", "module missing", "absent", "load it"),
            Check::fail("d", "no device nodes", "none", "load it"),
            Check::fail("x", "other", "broken", "mend it"),
            Check::warn("w1", "W1", "e", "r"),
            Check::warn("w2", "W2", "e", "s"),
        ]);
        let t = r.to_text();
        assert_eq!(t.matches("load it").count(), 1, "{t}");
        assert!(
            t.contains("- no device nodes (d): the same cause as m, the same remedy"),
            "{t}"
        );
        assert!(t.contains("remedy:   mend it"), "{t}");
        assert!(t.contains("3 failed, 2 warnings)"), "{t}");
    }
}
