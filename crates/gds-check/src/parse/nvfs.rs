//! nvidia-fs's own files: the registered storage drivers (`/proc/driver/nvidia-fs/modules`),
//! its version, and its statistics (`/proc/driver/nvidia-fs/stats`).

use super::{malformed, ParseError};
use serde::Serialize;
use std::collections::BTreeMap;

// ---------------------------------------------------------------------------------------------
// /proc/driver/nvidia-fs/modules

/// A storage driver that registered its DMA hooks with nvidia_fs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvfsModule {
    pub name: String,
    /// Newer modules leave it empty.
    pub version: Option<String>,
}

/// `name: version` per line. Only the name before the first colon matters; an empty file means
/// nothing registered (which is itself the interesting finding).
pub fn parse_modules(text: &str) -> Result<Vec<NvfsModule>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let (name, version) = match line.split_once(':') {
            Some((n, v)) => (n.trim(), v.trim()),
            None => (line, ""),
        };
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(malformed(i + 1, format!("not a module name: {name:?}")));
        }
        out.push(NvfsModule {
            name: name.to_string(),
            version: (!version.is_empty()).then(|| version.to_string()),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// /proc/driver/nvidia-fs/version, /sys/module/nvidia_fs/version

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvfsVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
    pub raw: String,
}

/// Accepts `version: 2.20`, `2.20.5` or `version: 2.20.5`.
pub fn parse_nvfs_version(text: &str) -> Result<NvfsVersion, ParseError> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or(ParseError::Empty)?;
    let v = match line.split_once(':') {
        Some((_, v)) => v.trim(),
        None => line,
    };
    let mut parts = v.split('.');
    let num = |p: Option<&str>| p.and_then(|s| s.trim().parse::<u32>().ok());
    let major = num(parts.next()).ok_or_else(|| malformed(1, format!("no version in {line:?}")))?;
    let minor = num(parts.next()).ok_or_else(|| malformed(1, format!("no minor in {line:?}")))?;
    let patch = num(parts.next());
    Ok(NvfsVersion {
        major,
        minor,
        patch,
        raw: v.to_string(),
    })
}

// ---------------------------------------------------------------------------------------------
// /proc/driver/nvidia-fs/stats

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IoCounters {
    pub n: Option<u64>,
    pub ok: Option<u64>,
    pub err: Option<u64>,
    pub mib: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuStats {
    pub pci: String,
    pub uuid: Option<String>,
    pub fields: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NvfsStats {
    pub gds_version: Option<String>,
    pub stats_version: Option<String>,
    pub driver_version: Option<String>,
    pub peerdirect_supported: Option<bool>,
    pub active_processes: Option<u64>,
    pub reads: IoCounters,
    pub writes: IoCounters,
    pub gpus: Vec<GpuStats>,
    /// Every `label: k=v ...` line; repeated labels (the file has several `Reads` lines) merge.
    pub sections: BTreeMap<String, BTreeMap<String, String>>,
}

fn kv_pairs(s: &str) -> BTreeMap<String, String> {
    s.split_whitespace()
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn paren_value(line: &str) -> Option<String> {
    // `NVFS statistics(ver: 4.0)` / `NVFS Driver(version: 2.20.5)`
    let inner = line.split_once('(')?.1.rsplit_once(')')?.0;
    Some(
        inner
            .split_once(':')
            .map_or(inner, |(_, v)| v)
            .trim()
            .to_string(),
    )
}

pub fn parse_stats(text: &str) -> Result<NvfsStats, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let mut st = NvfsStats::default();
    let mut recognised = 0usize;
    for raw in text.lines() {
        let line = raw.trim();
        if !line.is_empty() && stats_line(&mut st, line) {
            recognised += 1;
        }
    }
    if recognised == 0 {
        return Err(malformed(1, "no `label: value` lines"));
    }
    st.reads = counters(&st, "Reads", "readMiB");
    st.writes = counters(&st, "Writes", "writeMiB");
    Ok(st)
}

/// Reads one non-empty line into `st`; whether it was a line of a known shape.
fn stats_line(st: &mut NvfsStats, line: &str) -> bool {
    if line.starts_with("NVFS statistics") {
        st.stats_version = paren_value(line);
        return true;
    }
    if line.starts_with("NVFS Driver") {
        st.driver_version = paren_value(line);
        return true;
    }
    // GPU lines carry colons in the PCI address and uuid, so split on the spaced " : ".
    if let Some(rest) = line.strip_prefix("GPU ") {
        let Some((head, vals)) = rest.split_once(" : ").or_else(|| rest.rsplit_once(':')) else {
            return false;
        };
        let mut toks = head.split_whitespace();
        let pci = toks.next().unwrap_or_default().to_string();
        let uuid = toks
            .find_map(|t| t.strip_prefix("uuid:"))
            .map(|u| u.to_string());
        st.gpus.push(GpuStats {
            pci,
            uuid,
            fields: kv_pairs(vals),
        });
        return true;
    }
    let Some((label, value)) = line.split_once(':') else {
        return false;
    };
    label_line(st, label.trim(), value.trim());
    true
}

/// A `label: value` line: the few scalar labels, and every `k=v` pair under its label.
fn label_line(st: &mut NvfsStats, label: &str, value: &str) {
    match label {
        "GDS Version" => st.gds_version = Some(value.to_string()),
        "Mellanox PeerDirect Supported" => {
            st.peerdirect_supported = match value.to_ascii_lowercase().as_str() {
                "true" | "yes" => Some(true),
                "false" | "no" => Some(false),
                _ => None,
            }
        }
        "Active Process" => st.active_processes = value.parse().ok(),
        _ => {}
    }
    let kv = kv_pairs(value);
    if !kv.is_empty() {
        st.sections.entry(label.to_string()).or_default().extend(kv);
    }
}

fn counters(st: &NvfsStats, label: &str, mib_key: &str) -> IoCounters {
    let Some(s) = st.sections.get(label) else {
        return IoCounters::default();
    };
    let g = |k: &str| s.get(k).and_then(|v| v.parse().ok());
    IoCounters {
        n: g("n"),
        ok: g("ok"),
        err: g("err"),
        mib: g(mib_key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_names_and_empty_versions() {
        let m = parse_modules("nvme: 1\nnvme_rdma:\nwekafsio: 1\n\n").unwrap();
        let names: Vec<_> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["nvme", "nvme_rdma", "wekafsio"]);
        assert_eq!(m[1].version, None);
        assert_eq!(m[0].version.as_deref(), Some("1"));
        assert!(parse_modules("").unwrap().is_empty());
        assert!(parse_modules("\u{0}\u{1}garbage here: x").is_err());
        assert!(parse_modules(": 1").is_err());
        // The error names the line, counted from 1.
        match parse_modules("nvme: 1\nnvme_rdma: 1\nbad name: 1\n") {
            Err(ParseError::Malformed { line, .. }) => assert_eq!(line, 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nvfs_version() {
        let v = parse_nvfs_version("version: 2.20\n").unwrap();
        assert_eq!((v.major, v.minor, v.patch), (2, 20, None));
        let v = parse_nvfs_version("2.20.5").unwrap();
        assert_eq!(v.patch, Some(5));
        assert!(parse_nvfs_version("").is_err());
        assert!(parse_nvfs_version("version: banana").is_err());
        assert!(parse_nvfs_version("99999999999999.1").is_err());
    }

    const STATS: &str = "GDS Version: 1.10.0.4 \n\
NVFS statistics(ver: 4.0)\n\
NVFS Driver(version: 2.20.5)\n\
Mellanox PeerDirect Supported: True\n\
IO stats: Enabled, peer IO stats: Disabled\n\
Logging level: info\n\
\n\
Active Shadow-Buffer (MiB): 0\n\
Active Process: 1\n\
Reads\t\t\t\t: n=120 ok=118 err=2 readMiB=1024 io_state_err=0\n\
Reads\t\t\t\t: Bandwidth(MiB/s)=512 Avg-Latency(usec)=900\n\
Sparse Reads\t\t\t: n=0 io=0 holes=0 pages=0\n\
Writes\t\t\t\t: n=7 ok=7 err=0 writeMiB=28 io_state_err=0 pg-cache=0\n\
Mmap\t\t\t\t: n=3 ok=3 err=0 munmap=3\n\
Ops\t\t\t\t: Read=0 Write=0 BatchIO=0\n\
GPU 0000:18:00.0  uuid:7f6e9a3c-1111-2222-3333-444455556666 : Registered_MiB=256 Cache_MiB=0 max_pinned_MiB=256 cross_root_port(%)=0\n\
GPU 0000:3b:00.0  uuid:00000000-aaaa-bbbb-cccc-dddddddddddd : Registered_MiB=0 Cache_MiB=0 max_pinned_MiB=0\n";

    #[test]
    fn stats() {
        let s = parse_stats(STATS).unwrap();
        assert_eq!(s.gds_version.as_deref(), Some("1.10.0.4"));
        assert_eq!(s.stats_version.as_deref(), Some("4.0"));
        assert_eq!(s.driver_version.as_deref(), Some("2.20.5"));
        assert_eq!(s.peerdirect_supported, Some(true));
        assert_eq!(s.active_processes, Some(1));
        assert_eq!(
            s.reads,
            IoCounters {
                n: Some(120),
                ok: Some(118),
                err: Some(2),
                mib: Some(1024)
            }
        );
        assert_eq!(s.writes.mib, Some(28));
        assert_eq!(s.sections["Reads"]["Bandwidth(MiB/s)"], "512");
        assert_eq!(s.sections["Ops"]["BatchIO"], "0");
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].pci, "0000:18:00.0");
        assert_eq!(
            s.gpus[0].uuid.as_deref(),
            Some("7f6e9a3c-1111-2222-3333-444455556666")
        );
        assert_eq!(s.gpus[0].fields["Registered_MiB"], "256");
        assert!(parse_stats("").is_err());
        assert!(parse_stats("no colons at all\n\u{ff}").is_err());
        // Garbage with colons parses to empty counters rather than panicking.
        let g = parse_stats("Reads: n=abc ok=\nGPU :\nGPU\n:::").unwrap();
        assert_eq!(g.reads.n, None);
    }
}
