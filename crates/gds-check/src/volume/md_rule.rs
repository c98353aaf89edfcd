//! The udev rule NVIDIA documents for RAID volumes: is it installed on the host?
//!
//! Grounding:
//! - NVIDIA, GDS Installation and Troubleshooting Guide, "Adding udev Rules for RAID Volumes"
//!   (5.15 in the guide's contents, docs.nvidia.com/gpudirect-storage/troubleshooting-guide):
//!   in `/lib/udev/rules.d/63-md-raid-arrays.rules` change the mdadm line to
//!   `IMPORT{program}="/usr/sbin/mdadm --detail --export $devnode"`, then reboot or restart
//!   mdadm. GDS release notes: "RHEL 8.3 or later does not have default udev rules for
//!   detecting RAID members, which disables GDS on RAID volumes."
//! - mdadm (md-raid-utilities/mdadm d1447022) udev-md-raid-arrays.rules:20 ships
//!   `IMPORT{program}="BINDIR/mdadm --detail --no-devices --export $devnode"`; Detail.c:297-321
//!   prints the members' `MD_DEVICE_<dev>_ROLE/_DEV` only without `--no-devices`. So the stock
//!   rule leaves out exactly what cuFile needs (see `md_udev`).
//! - udev(7), "Rules Files": files in /etc/udev/rules.d override files of the same name in
//!   /run/udev/rules.d and the system directories (/usr/lib/udev/rules.d, /lib/udev/rules.d);
//!   a link to /dev/null disables a rule file. `HostPaths::udev_rules_dirs` is in that order.

use super::stack::MdArray;
use crate::{Check, HostPaths};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const ID: &str = "volume.md_udev_rule";
const RULE_FILE: &str = "63-md-raid-arrays.rules";

/// An mdadm `--detail --export` import found in a rule file.
struct MdImport {
    file: PathBuf,
    line: usize,
    /// `--no-devices`: mdadm's stock rule, which exports no members.
    no_devices: bool,
}

pub(super) fn md_rule_check(paths: &HostPaths, md: &MdArray) -> Check {
    let visible: Vec<&PathBuf> = paths
        .udev_rules_dirs
        .iter()
        .filter(|d| d.is_dir())
        .collect();
    let fix = remedy(md);
    if visible.is_empty() {
        let looked = if paths.udev_rules_dirs.is_empty() {
            "no udev rules directory given (--udev-rules-dir)".to_string()
        } else {
            format!("none of {} is visible here", join(&paths.udev_rules_dirs))
        };
        return Check::warn(
            ID,
            "md udev rule not checked: no udev rules directory visible",
            format!("not checked: {looked}; the udev database check decides"),
            format!(
                "give the host's rules directories (read-only mounts, `--udev-rules-dir`) to \
                 check the rule; it must be: {fix}"
            ),
        );
    }
    let imports: Vec<MdImport> = effective_files(&visible)
        .into_iter()
        .flat_map(|f| md_imports(&f))
        .collect();
    if let Some(ok) = imports.iter().find(|i| !i.no_devices) {
        return Check::pass(
            ID,
            "udev rule exports md members (NVIDIA's rule for RAID volumes)",
            format!(
                "{}:{}: mdadm --detail --export (members exported)",
                ok.file.display(),
                ok.line
            ),
        );
    }
    let summary = match imports.first() {
        Some(_) => "mdadm's stock udev rule (--no-devices) exports no md members",
        None => "no udev rule exports md members",
    };
    let evidence = match imports.first() {
        Some(stock) => format!(
            "{}:{}: mdadm --detail --no-devices --export, mdadm's stock rule: {}'s udev entry \
             gets MD_LEVEL but no member, and cuFile cannot verify the RAID group",
            stock.file.display(),
            stock.line,
            md.name
        ),
        None => format!(
            "no rule in {} runs `mdadm --detail --export` for md arrays (mdadm's {RULE_FILE} \
             is not installed or is masked)",
            join(&visible)
        ),
    };
    Check::fail(ID, summary, evidence, fix)
}

fn remedy(md: &MdArray) -> String {
    format!(
        "install mdadm and, as NVIDIA's GDS troubleshooting guide says (\"Adding udev Rules for \
         RAID Volumes\"), make {RULE_FILE} run IMPORT{{program}}=\"/usr/sbin/mdadm --detail \
         --export $devnode\" (no --no-devices): copy it to /etc/udev/rules.d/{RULE_FILE} (kept \
         across mdadm updates) and edit that line, then `udevadm control --reload && udevadm \
         trigger --action=change /dev/{}`",
        md.name
    )
}

fn join(dirs: &[impl AsRef<Path>]) -> String {
    dirs.iter()
        .map(|d| d.as_ref().display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rule files udev would read: each `*.rules` name from the first directory that has it.
fn effective_files(dirs: &[&PathBuf]) -> Vec<PathBuf> {
    let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
    for dir in dirs {
        let Ok(rd) = fs::read_dir(dir) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".rules") {
                by_name.entry(name).or_insert_with(|| e.path());
            }
        }
    }
    by_name.into_values().collect()
}

/// The `IMPORT{program}` lines of `file` that run `mdadm --detail ... --export` (continuation
/// lines joined, comments skipped). A file linked to /dev/null reads empty: masked.
fn md_imports(file: &Path) -> Vec<MdImport> {
    let Ok(text) = fs::read_to_string(file) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut joined = String::new();
    let mut first_line = 0;
    for (i, raw) in text.lines().enumerate() {
        if joined.is_empty() {
            first_line = i + 1;
        }
        match raw.strip_suffix('\\') {
            Some(head) => {
                joined += head;
                continue;
            }
            None => joined += raw,
        }
        let line = std::mem::take(&mut joined);
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if let Some(prog) = import_program(line) {
            let words: Vec<&str> = prog.split_whitespace().collect();
            let runs_mdadm = words.first().is_some_and(|w| w.ends_with("mdadm"));
            if runs_mdadm && words.contains(&"--detail") && words.contains(&"--export") {
                out.push(MdImport {
                    file: file.to_path_buf(),
                    line: first_line,
                    no_devices: words.contains(&"--no-devices"),
                });
            }
        }
    }
    out
}

/// The quoted program of an `IMPORT{program}="..."` assignment in a rule line.
fn import_program(line: &str) -> Option<&str> {
    let at = line.find("IMPORT{program}")?;
    let rest = line[at + "IMPORT{program}".len()..].trim_start();
    let rest = rest.strip_prefix('=')?.trim_start().strip_prefix('"')?;
    rest.find('"').map(|end| &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_program_reads_the_quoted_command() {
        let l = r#"IMPORT{program}="BINDIR/mdadm --detail --no-devices --export $devnode""#;
        assert_eq!(
            import_program(l),
            Some("BINDIR/mdadm --detail --no-devices --export $devnode")
        );
        assert_eq!(import_program(r#"IMPORT{builtin}="blkid""#), None);
        let l = r#"KERNEL=="md*", IMPORT{program}= "/sbin/mdadm --detail --export $devnode""#;
        assert_eq!(
            import_program(l),
            Some("/sbin/mdadm --detail --export $devnode")
        );
    }
}
