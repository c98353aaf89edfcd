//! The work dir both sides share: where cufile.log lands.

use std::path::{Path, PathBuf};

/// The last `n` non-blank lines of `p` (none when it cannot be read).
pub(super) fn tail_lines(p: &Path, n: usize) -> Vec<String> {
    let Ok(t) = std::fs::read(p) else {
        return Vec::new();
    };
    let t = String::from_utf8_lossy(&t);
    let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A fresh directory under the temp dir, unique per process and call.
pub(super) fn unique_temp_dir() -> std::io::Result<PathBuf> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let d = std::env::temp_dir().join(format!("gds-probe-{}-{n}-{nanos}", std::process::id()));
    std::fs::create_dir(&d)?;
    Ok(d)
}
