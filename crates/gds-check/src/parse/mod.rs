//! Pure parsers for the files GDS readiness depends on. They take text and return errors on
//! garbage; they never panic and never touch the filesystem (except the streaming kallsyms scan).

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;

mod cufile;
mod json_comments;
mod nvfs;

pub use cufile::{parse_cufile_json, CufileConfig, Denylist};
pub use json_comments::strip_json_comments;
pub use nvfs::{
    parse_modules, parse_nvfs_version, parse_stats, GpuStats, IoCounters, NvfsModule, NvfsStats,
    NvfsVersion,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty input")]
    Empty,
    #[error("line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("{key}: expected {expected}")]
    Type { key: String, expected: &'static str },
}

fn malformed(line: usize, reason: impl Into<String>) -> ParseError {
    ParseError::Malformed {
        line,
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// small host files

/// `6.8.0-45-generic` -> (6, 8).
pub fn parse_kernel_version(osrelease: &str) -> Option<(u32, u32)> {
    let s = osrelease.trim();
    let mut it = s.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// The `E:KEY=VALUE` properties of a udev database file (`/run/udev/data/b259:1`).
pub fn parse_udev_db(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("E:"))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Which of `wanted` appear as symbols in a `/proc/kallsyms` stream (`addr type name [module]`).
/// Streams: kallsyms is tens of MiB on big kernels.
pub fn kallsyms_find<R: BufRead>(r: R, wanted: &[&str]) -> std::io::Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    for line in r.lines() {
        let line = line?;
        if let Some(name) = line.split_whitespace().nth(2) {
            if wanted.contains(&name) {
                found.insert(name.to_string());
                if found.len() == wanted.len() {
                    break;
                }
            }
        }
    }
    Ok(found)
}

/// Undo the octal escapes the kernel applies to mountinfo paths (`\040` for a space).
pub fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files() {
        assert_eq!(parse_kernel_version("6.8.0-45-generic\n"), Some((6, 8)));
        assert_eq!(parse_kernel_version("5.15.0"), Some((5, 15)));
        assert_eq!(parse_kernel_version("junk"), None);
        let u = parse_udev_db("S:disk/by-id/x\nE:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n");
        assert_eq!(u["ID_FS_USAGE"], "filesystem");
        let ks =
            "0000000000000000 T p2pdma_pgmap_ops\n0 t nvme_v1_register_nvfs_dma_ops\t[nvme]\nbad\n";
        let f = kallsyms_find(
            ks.as_bytes(),
            &["p2pdma_pgmap_ops", "nvme_v1_register_nvfs_dma_ops", "x"],
        )
        .unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(unescape_mount_path("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_path("/mnt/\\04"), "/mnt/\\04");
    }

    /// Every octal digit counts with its weight (`\134` = 1*64 + 3*8 + 4, a backslash;
    /// `\011` a tab): a `\040` alone has zeros where a wrong weight or sign hides.
    #[test]
    fn unescape_weighs_every_octal_digit() {
        assert_eq!(unescape_mount_path("/mnt/a\\134b"), "/mnt/a\\b");
        assert_eq!(unescape_mount_path("/mnt/a\\011b"), "/mnt/a\tb");
        // Octal digits without a backslash, past a byte, or not octal: kept as written.
        assert_eq!(unescape_mount_path("/mnt/a040"), "/mnt/a040");
        assert_eq!(unescape_mount_path("/mnt/\\400"), "/mnt/\\400");
        assert_eq!(unescape_mount_path("/mnt/\\048"), "/mnt/\\048");
    }
}
