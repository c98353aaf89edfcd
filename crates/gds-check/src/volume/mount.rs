//! Finding the volume's mount in mountinfo, and reading its options.

use crate::parse::unescape_mount_path;
use crate::HostPaths;
use procfs_core::process::{MountInfo, MountInfos};
use procfs_core::FromRead;
use std::fs;
use std::path::{Path, PathBuf};

/// Parses mountinfo with procfs-core; if one line is malformed, keeps the others rather than
/// losing the whole table.
pub(super) fn read_mountinfo(paths: &HostPaths) -> Result<Vec<MountInfo>, String> {
    let p = paths.proc("self/mountinfo");
    let text = fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    match MountInfos::from_read(text.as_bytes()) {
        Ok(m) => Ok(m.0),
        Err(_) => Ok(text
            .lines()
            .filter_map(|l| MountInfo::from_line(l).ok())
            .collect()),
    }
}

pub(super) fn normalize(p: &Path) -> PathBuf {
    // Lexical only: the mount point may not exist in this mount namespace.
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The mount whose mount point is `target` (last one wins: it is on top), or else the one with
/// the longest mount point that contains `target`.
pub(super) fn find_mount<'a>(
    mounts: &'a [MountInfo],
    target: &Path,
) -> Option<(&'a MountInfo, bool)> {
    let target = normalize(target);
    let mp = |m: &MountInfo| PathBuf::from(unescape_mount_path(&m.mount_point.to_string_lossy()));
    if let Some(m) = mounts.iter().rev().find(|m| mp(m) == target) {
        return Some((m, true));
    }
    mounts
        .iter()
        .rev()
        .filter(|m| target.starts_with(mp(m)))
        .max_by_key(|m| mp(m).components().count())
        .map(|m| (m, false))
}

pub(super) fn super_opt<'a>(m: &'a MountInfo, key: &str) -> Option<Option<&'a str>> {
    m.super_options.get(key).map(|v| v.as_deref())
}

pub(super) fn opts_string(m: &MountInfo) -> String {
    let mut v: Vec<String> = m
        .super_options
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => k.clone(),
        })
        .collect();
    v.sort();
    v.join(",")
}

pub(super) fn parse_majmin(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}
