//! Pure parsers for the files GDS readiness depends on. They take text and return errors on
//! garbage; they never panic and never touch the filesystem (except the streaming kallsyms scan).

use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;

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
        if line.is_empty() {
            continue;
        }
        if line.starts_with("NVFS statistics") {
            st.stats_version = paren_value(line);
            recognised += 1;
            continue;
        }
        if line.starts_with("NVFS Driver") {
            st.driver_version = paren_value(line);
            recognised += 1;
            continue;
        }
        // GPU lines carry colons in the PCI address and uuid, so split on the spaced " : ".
        if let Some(rest) = line.strip_prefix("GPU ") {
            let Some((head, vals)) = rest.split_once(" : ").or_else(|| rest.rsplit_once(':'))
            else {
                continue;
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
            recognised += 1;
            continue;
        }
        let Some((label, value)) = line.split_once(':') else {
            continue;
        };
        let label = label.trim();
        let value = value.trim();
        recognised += 1;
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
    if recognised == 0 {
        return Err(malformed(1, "no `label: value` lines"));
    }
    let counters = |label: &str, mib_key: &str| -> IoCounters {
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
    };
    st.reads = counters("Reads", "readMiB");
    st.writes = counters("Writes", "writeMiB");
    Ok(st)
}

// ---------------------------------------------------------------------------------------------
// cufile.json

/// Removes `//` and `/* */` comments outside strings (paths and URLs in strings keep their
/// `//`) and trailing commas before `}` / `]`. Newlines are kept so JSON errors report the
/// operator's line numbers.
pub fn strip_json_comments(text: &str) -> Result<String, ParseError> {
    let b = text.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            let start_line = line;
            out.push(c);
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err(malformed(start_line, "unterminated string")),
                    Some(b'\\') => {
                        out.push(b'\\');
                        if let Some(&n) = b.get(i + 1) {
                            out.push(n);
                        }
                        i += 2;
                    }
                    Some(b'"') => {
                        out.push(b'"');
                        i += 1;
                        break;
                    }
                    Some(&o) => {
                        if o == b'\n' {
                            line += 1;
                        }
                        out.push(o);
                        i += 1;
                    }
                }
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start_line = line;
            i += 2;
            loop {
                match b.get(i) {
                    None => return Err(malformed(start_line, "unterminated /* comment")),
                    Some(b'*') if b.get(i + 1) == Some(&b'/') => {
                        i += 2;
                        break;
                    }
                    Some(b'\n') => {
                        line += 1;
                        out.push(b'\n');
                        i += 1;
                    }
                    Some(_) => i += 1,
                }
            }
            out.push(b' ');
        } else {
            if c == b'\n' {
                line += 1;
            }
            out.push(c);
            i += 1;
        }
    }
    // Second pass: drop commas followed only by whitespace and a closing bracket.
    let mut res: Vec<u8> = Vec::with_capacity(out.len());
    let mut in_str = false;
    let mut j = 0;
    while j < out.len() {
        let c = out[j];
        if in_str {
            res.push(c);
            if c == b'\\' {
                if let Some(&n) = out.get(j + 1) {
                    res.push(n);
                }
                j += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
        } else if c == b'"' {
            in_str = true;
            res.push(c);
        } else if c == b',' {
            let next = out[j + 1..].iter().find(|x| !x.is_ascii_whitespace());
            if !matches!(next, Some(b'}') | Some(b']')) {
                res.push(c);
            }
        } else {
            res.push(c);
        }
        j += 1;
    }
    // Only whole ASCII bytes were removed, so UTF-8 stays valid.
    String::from_utf8(res).map_err(|e| ParseError::Json(e.to_string()))
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Denylist {
    pub drivers: Vec<String>,
    pub devices: Vec<String>,
    pub mounts: Vec<String>,
    pub filesystems: Vec<String>,
}

/// The cufile.json keys that decide whether I/O gets true GDS. `None` means absent (libcufile's
/// default applies).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CufileConfig {
    pub allow_compat_mode: Option<bool>,
    pub force_compat_mode: Option<bool>,
    pub use_pci_p2pdma: Option<bool>,
    pub use_poll_mode: Option<bool>,
    pub max_direct_io_size_kb: Option<u64>,
    pub rdma_dev_addr_list: Vec<String>,
    pub nfs_rdma_dev_addr_list: Vec<String>,
    pub posix_unaligned_writes: Option<bool>,
    pub denylist: Denylist,
    /// `block.nvme.use_pci_p2pdma` in newer files.
    pub nvme_use_pci_p2pdma: Option<bool>,
    pub logging_dir: Option<String>,
    #[serde(skip)]
    pub raw: Value,
}

impl CufileConfig {
    /// libcufile allows compat mode unless told otherwise.
    pub fn compat_allowed(&self) -> bool {
        self.allow_compat_mode.unwrap_or(true) || self.force_compat_mode == Some(true)
    }

    pub fn p2pdma_enabled(&self) -> bool {
        self.use_pci_p2pdma == Some(true) || self.nvme_use_pci_p2pdma == Some(true)
    }
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn get_bool(v: &Value, path: &[&str]) -> Result<Option<bool>, ParseError> {
    match at(v, path) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ParseError::Type {
            key: path.join("."),
            expected: "true or false",
        }),
    }
}

fn get_u64(v: &Value, path: &[&str]) -> Result<Option<u64>, ParseError> {
    match at(v, path) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or(ParseError::Type {
            key: path.join("."),
            expected: "a non-negative integer",
        }),
    }
}

fn get_strings(v: &Value, path: &[&str]) -> Result<Vec<String>, ParseError> {
    let err = || ParseError::Type {
        key: path.join("."),
        expected: "an array of strings",
    };
    match at(v, path) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(err))
            .collect(),
        Some(_) => Err(err()),
    }
}

pub fn parse_cufile_json(text: &str) -> Result<CufileConfig, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let stripped = strip_json_comments(text)?;
    let raw: Value =
        serde_json::from_str(&stripped).map_err(|e| ParseError::Json(e.to_string()))?;
    if !raw.is_object() {
        return Err(ParseError::Json("top level is not an object".into()));
    }
    fn p(k: &str) -> [&str; 2] {
        ["properties", k]
    }
    Ok(CufileConfig {
        allow_compat_mode: get_bool(&raw, &p("allow_compat_mode"))?,
        force_compat_mode: get_bool(&raw, &p("force_compat_mode"))?,
        use_pci_p2pdma: get_bool(&raw, &p("use_pci_p2pdma"))?,
        use_poll_mode: get_bool(&raw, &p("use_poll_mode"))?,
        max_direct_io_size_kb: get_u64(&raw, &p("max_direct_io_size_kb"))?,
        rdma_dev_addr_list: get_strings(&raw, &p("rdma_dev_addr_list"))?,
        nfs_rdma_dev_addr_list: get_strings(&raw, &["fs", "nfs", "rdma_dev_addr_list"])?,
        posix_unaligned_writes: get_bool(&raw, &["fs", "generic", "posix_unaligned_writes"])?,
        denylist: Denylist {
            drivers: get_strings(&raw, &["denylist", "drivers"])?,
            devices: get_strings(&raw, &["denylist", "devices"])?,
            mounts: get_strings(&raw, &["denylist", "mounts"])?,
            filesystems: get_strings(&raw, &["denylist", "filesystems"])?,
        },
        nvme_use_pci_p2pdma: get_bool(&raw, &["block", "nvme", "use_pci_p2pdma"])?,
        logging_dir: at(&raw, &["logging", "dir"])
            .and_then(Value::as_str)
            .map(str::to_string),
        raw,
    })
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
    fn modules_names_and_empty_versions() {
        let m = parse_modules("nvme: 1\nnvme_rdma:\nwekafsio: 1\n\n").unwrap();
        let names: Vec<_> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["nvme", "nvme_rdma", "wekafsio"]);
        assert_eq!(m[1].version, None);
        assert_eq!(m[0].version.as_deref(), Some("1"));
        assert!(parse_modules("").unwrap().is_empty());
        assert!(parse_modules("\u{0}\u{1}garbage here: x").is_err());
        assert!(parse_modules(": 1").is_err());
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

    #[test]
    fn json_comments_respect_strings() {
        let t = r#"{
  // a comment with "quotes"
  "logging": { "dir": "/var/log//gds", /* inline */ "url": "http://x/y" },
  /* multi
     line */
  "properties": { "allow_compat_mode": false, }, // trailing comma
  "s": "a \" // not a comment",
}"#;
        let s = strip_json_comments(t).unwrap();
        let v: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["logging"]["dir"], "/var/log//gds");
        assert_eq!(v["logging"]["url"], "http://x/y");
        assert_eq!(v["s"], "a \" // not a comment");
        assert!(strip_json_comments("{ /* open").is_err());
        assert!(strip_json_comments("{ \"open").is_err());
    }

    #[test]
    fn cufile_config() {
        let t = r#"{
    "logging": { "dir": "/tmp/gds", "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb" : 16384,
        "use_poll_mode" : false,
        // allow compat mode, this will enable use of cuFile posix read/writes
        "allow_compat_mode": true,
        "rdma_dev_addr_list": [ "172.172.1.240" ],
        "use_pci_p2pdma": false
    },
    "fs": { "generic": { "posix_unaligned_writes": false },
            "nfs": { "rdma_dev_addr_list": [ "10.0.0.2" ] } },
    "denylist": {
        // specify list of vendor driver modules to deny for nvidia-fs (e.g. ["nvme" , "nvme_rdma"])
        "drivers":  [ ],
        "devices": [ "/dev/nvme9n1" ],
        "mounts": [ "/mnt/deny" ],
        "filesystems": [ "lustre" ]
    },
    "block": { "nvme": { "use_pci_p2pdma": true } }
}"#;
        let c = parse_cufile_json(t).unwrap();
        assert_eq!(c.allow_compat_mode, Some(true));
        assert_eq!(c.force_compat_mode, None);
        assert_eq!(c.max_direct_io_size_kb, Some(16384));
        assert_eq!(c.rdma_dev_addr_list, ["172.172.1.240"]);
        assert_eq!(c.nfs_rdma_dev_addr_list, ["10.0.0.2"]);
        assert_eq!(c.denylist.mounts, ["/mnt/deny"]);
        assert_eq!(c.denylist.devices, ["/dev/nvme9n1"]);
        assert_eq!(c.nvme_use_pci_p2pdma, Some(true));
        assert!(c.p2pdma_enabled());
        assert_eq!(c.logging_dir.as_deref(), Some("/tmp/gds"));
        assert!(parse_cufile_json("").is_err());
        assert!(parse_cufile_json("[1,2]").is_err());
        assert!(parse_cufile_json("{\"properties\": {\"allow_compat_mode\": \"yes\"}}").is_err());
        assert!(parse_cufile_json("{\"denylist\": {\"mounts\": \"/x\"}}").is_err());
        assert!(parse_cufile_json("{garbage").is_err());
    }

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
}
