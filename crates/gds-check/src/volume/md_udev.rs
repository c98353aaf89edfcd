//! The md RAID check: the array's udev entry must carry its members, as libcufile reads it.

use super::stack::MdArray;
use crate::parse::parse_udev_db;
use crate::{Check, HostPaths};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The udev keys mdadm exports for one member (Detail.c, `--export`): `MD_DEVICE_<sysfs name>_DEV`
/// with the sysfs name `dev-nvme0n1` made alphanumeric (`dev_nvme0n1`).
fn md_member_dev_key(member: &str) -> String {
    let sys: String = format!("dev-{member}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("MD_DEVICE_{sys}_DEV")
}

/// For a volume on md RAID: the array's udev entry must carry what libcufile reads to judge the
/// RAID group, and each member must be an NVMe device udev knows.
///
/// Grounding:
/// - NVIDIA, GDS Installation and Troubleshooting Guide, 5.15 "Adding udev Rules for RAID
///   Volumes" (docs.nvidia.com/gpudirect-storage/troubleshooting-guide, read from a stored copy
///   of the page): change the line in `/lib/udev/rules.d/63-md-raid-arrays.rules` to
///   `IMPORT{program}="/usr/sbin/mdadm --detail --export $devnode"`, then reboot or restart mdadm.
///   GDS release notes: "RHEL 8.3 or later does not have default udev rules for detecting RAID
///   members, which disables GDS on RAID volumes."
/// - mdadm (md-raid-utilities/mdadm d1447022): udev-md-raid-arrays.rules:20 ships
///   `mdadm --detail --no-devices --export` (commit 1a52f1fc, first released in mdadm 4.2);
///   Detail.c:252-322 prints MD_LEVEL, MD_DEVICES, MD_UUID always and `MD_DEVICE_<dev>_ROLE/_DEV`
///   per member only without `--no-devices`. So the stock rule gives MD_LEVEL but no members.
/// - libcufile 1.20.0.107 (PyPI wheel nvidia-cufile, `strings`): its udev helper reads
///   `MD_LEVEL`, `MD_DEVICES` and `..._DEV` keys (`UDISKS_MD_DEVICE_` too) and logs "cannot
///   verify RAID members, RAID group size empty", "RAID member not supported by cuFile in RAID
///   group", "can't create udev device for RAID member", "cuFile support has been disabled for
///   members in the RAID group". The source is closed; what it does with each key is inferred
///   from these strings, not read.
pub(super) fn md_udev_check(paths: &HostPaths, majmin: &str, md: &MdArray) -> Check {
    let id = "volume.md_udev";
    let unverifiable = format!(
        "cuFile cannot verify {}'s RAID group from udev: no GDS for it",
        md.name
    );
    let rule_remedy = rule_remedy(md);
    let p = paths.udev_data_dir.join(format!("b{majmin}"));
    let props = match fs::read_to_string(&p) {
        Ok(t) => parse_udev_db(&t),
        Err(e) => {
            return Check::fail(
                id,
                unverifiable,
                format!(
                    "{}: {e}; cuFile finds no MD_LEVEL or members for {}",
                    p.display(),
                    md.name
                ),
                rule_remedy,
            )
        }
    };
    let missing = missing_keys(&props, md);
    let (member_problems, member_ev) = member_problems(paths, md);
    if missing.is_empty() && member_problems.is_empty() {
        let ev_ok = format!(
            "{}: MD_LEVEL={} MD_DEVICES={}; members {}",
            p.display(),
            props.get("MD_LEVEL").map_or("?", |s| s.as_str()),
            props.get("MD_DEVICES").map_or("?", |s| s.as_str()),
            member_ev.join(", ")
        );
        return Check::pass(
            id,
            "udev database carries the md array's members (mdadm rule)",
            ev_ok,
        );
    }
    let mut ev = vec![format!("{}: {}", p.display(), md.name)];
    if !missing.is_empty() {
        ev.push(format!("missing {}", missing.join("; ")));
    }
    ev.extend(member_problems.iter().cloned());
    let mut remedy = Vec::new();
    if !missing.is_empty() {
        remedy.push(rule_remedy);
    }
    if member_problems.iter().any(|p| p.contains("not an NVMe")) {
        remedy.push("build the RAID0 from NVMe namespaces (or their partitions) only".into());
    }
    if member_problems.iter().any(|p| p.contains("no udev entry")) {
        remedy.push(
            "run udevd on the node and `udevadm trigger --action=change` for the members".into(),
        );
    }
    Check::fail(id, unverifiable, ev.join("; "), remedy.join("; "))
}

fn rule_remedy(md: &MdArray) -> String {
    format!(
        "make mdadm's udev rule export the members, as NVIDIA's GDS troubleshooting guide says \
         (\"Adding udev Rules for RAID Volumes\"): in 63-md-raid-arrays.rules use \
         IMPORT{{program}}=\"/usr/sbin/mdadm --detail --export $devnode\" (no --no-devices; an \
         edited copy in /etc/udev/rules.d/ overrides /lib/udev/rules.d/ and survives mdadm \
         updates), then `udevadm trigger --action=change /dev/{}` (or reboot)",
        md.name
    )
}

/// The array's keys that are absent or disagree with sysfs: MD_LEVEL, MD_DEVICES, and the
/// members' `MD_DEVICE_<member>_DEV`.
fn missing_keys(props: &BTreeMap<String, String>, md: &MdArray) -> Vec<String> {
    let mut missing = Vec::new();
    match props.get("MD_LEVEL") {
        None => missing.push("MD_LEVEL (mdadm's rule did not run for the array)".to_string()),
        Some(l) if *l != md.level => missing.push(format!(
            "MD_LEVEL={l} but sysfs says {} (stale entry)",
            md.level
        )),
        Some(_) => {}
    }
    let count = props.get("MD_DEVICES");
    match count.map(|c| c.parse::<usize>()) {
        None => missing.push("MD_DEVICES".into()),
        Some(Ok(n)) if n == md.members.len() => {}
        Some(_) => missing.push(format!(
            "MD_DEVICES={} but sysfs lists {} member(s) (stale entry)",
            count.map_or("", |s| s.as_str()),
            md.members.len()
        )),
    }
    let exported: Vec<&str> = props
        .iter()
        .filter(|(k, _)| k.starts_with("MD_DEVICE_") && k.ends_with("_DEV"))
        .map(|(_, v)| v.as_str())
        .collect();
    let mut unexported = Vec::new();
    for mb in &md.members {
        let key = md_member_dev_key(&mb.name);
        let by_value = exported.iter().any(|v| {
            Path::new(v)
                .file_name()
                .is_some_and(|n| n == mb.name.as_str())
        });
        if !props.contains_key(&key) && !by_value {
            unexported.push(key);
        }
    }
    if exported.is_empty() {
        missing.push(
            "every MD_DEVICE_<member>_DEV key: the rule runs `mdadm --detail --no-devices \
             --export` (mdadm's default since 4.2), so cuFile cannot verify the RAID members"
                .into(),
        );
    } else if !unexported.is_empty() {
        missing.push(format!("{} (stale entry)", unexported.join(", ")));
    }
    missing
}

/// Each member, as cuFile checks it: an NVMe device that udev knows. The problems, and each
/// member named with its device numbers for the evidence.
fn member_problems(paths: &HostPaths, md: &MdArray) -> (Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut ev = Vec::new();
    for mb in &md.members {
        let entry = mb
            .majmin
            .as_ref()
            .map(|mm| paths.udev_data_dir.join(format!("b{mm}")));
        let known = entry.as_ref().is_some_and(|e| e.exists());
        ev.push(format!(
            "{} ({})",
            mb.name,
            mb.majmin.as_deref().unwrap_or("no dev")
        ));
        if !mb.nvme {
            problems.push(format!(
                "member {} is not an NVMe namespace: cuFile disables GDS for the whole RAID group",
                mb.name
            ));
        }
        if !known {
            problems.push(format!(
                "member {} has no udev entry ({})",
                mb.name,
                entry.map_or("no dev file in sysfs".into(), |e| e.display().to_string())
            ));
        }
    }
    if md.members.is_empty() {
        problems.push(format!(
            "{} has no members in sysfs (md/dev-*/block, slaves/)",
            md.name
        ));
    }
    (problems, ev)
}
