//! The mount table, read from `/proc/self/mountinfo` (parsed by procfs-core). All
//! idempotency decisions are taken from it, never from in-memory state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use procfs_core::FromRead;

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub major: u32,
    pub minor: u32,
    /// The path inside the source filesystem that is mounted ("/" unless a sub-tree bind).
    pub root: String,
    pub mount_point: PathBuf,
    pub mount_options: HashMap<String, Option<String>>,
    pub fs_type: String,
    pub source: Option<String>,
    pub super_options: HashMap<String, Option<String>>,
}

impl MountEntry {
    pub fn is_device(&self, major: u32, minor: u32) -> bool {
        self.major == major && self.minor == minor
    }

    pub fn read_only(&self) -> bool {
        self.mount_options.contains_key("ro")
    }

    /// The filesystem itself is read-only: remounted so, or ext4 after errors. Since Linux
    /// 6.10 ext4's errors=remount-ro no longer sets SB_RDONLY (the super options stay
    /// `rw`): it shows `emergency_ro`, or `shutdown` after a forced shutdown
    /// (fs/ext4/super.c _ext4_show_options: `if (ext4_emergency_ro(sb))
    /// SEQ_OPTS_PUTS("emergency_ro")`, `if (ext4_forced_shutdown(sb)) ... "shutdown"`).
    pub fn fs_read_only(&self) -> bool {
        ["ro", "emergency_ro", "shutdown"]
            .iter()
            .any(|o| self.super_options.contains_key(*o))
    }
}

/// Undoes the kernel's escaping of mountinfo fields: space, tab, newline and backslash
/// are written as `\ooo` octal (fs/proc_namespace.c show_mountinfo: `seq_path_root(...,
/// " \t\n\\")`, `mangle()`; fs/seq_file.c seq_escape_mem). procfs-core 0.17 leaves
/// them as they are, so a path with a space would never match its own mount.
pub fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn unescape_string(field: &str) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

fn unescape_path(field: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let field = field.to_string_lossy();
    PathBuf::from(std::ffi::OsString::from_vec(unescape(&field)))
}

pub fn parse(text: &[u8]) -> Result<Vec<MountEntry>> {
    // procfs-core reads lines as UTF-8: one mount with another encoding elsewhere on the
    // host must not make the whole table unreadable.
    let text = String::from_utf8_lossy(text);
    let infos =
        procfs_core::process::MountInfos::from_read(text.as_bytes()).map_err(|e| Error::State {
            path: PathBuf::from("/proc/self/mountinfo"),
            reason: e.to_string(),
        })?;
    infos
        .0
        .into_iter()
        .map(|m| {
            let (major, minor) = m
                .majmin
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .unwrap_or((0, 0));
            Ok(MountEntry {
                major,
                minor,
                root: unescape_string(&m.root),
                mount_point: unescape_path(&m.mount_point),
                mount_options: m.mount_options,
                fs_type: m.fs_type,
                source: m.mount_source.as_deref().map(unescape_string),
                super_options: m.super_options,
            })
        })
        .collect()
}

pub fn read() -> Result<Vec<MountEntry>> {
    let path = Path::new("/proc/self/mountinfo");
    let text = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
    parse(&text)
}

/// The topmost mount at `path` (later lines shadow earlier ones).
pub fn at<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    table.iter().rev().find(|m| m.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 7:3 / /var/lib/kubelet/staging/pv1 rw,relatime shared:1 - ext4 /dev/loop3 rw,data=ordered
23 1 7:3 / /var/lib/kubelet/pods/x/mount ro,relatime shared:1 - ext4 /dev/loop3 rw,data=ordered
24 1 0:52 / /mnt/nfs rw,relatime - nfs4 192.0.2.1:/ rw,vers=4.1,proto=rdma,port=20049
";

    #[test]
    fn parses_device_options_and_super_options() {
        let table = parse(SAMPLE.as_bytes()).unwrap();
        let staged = at(&table, Path::new("/var/lib/kubelet/staging/pv1")).unwrap();
        assert!(staged.is_device(7, 3));
        assert_eq!(
            staged.super_options.get("data"),
            Some(&Some("ordered".into()))
        );
        assert!(!staged.read_only());
        let published = at(&table, Path::new("/var/lib/kubelet/pods/x/mount")).unwrap();
        assert!(published.read_only());
        let nfs = at(&table, Path::new("/mnt/nfs")).unwrap();
        assert_eq!(nfs.super_options.get("proto"), Some(&Some("rdma".into())));
        assert!(at(&table, Path::new("/nowhere")).is_none());
    }

    /// Lines as Linux 6.18 writes them (seen on this machine's loop devices): ext4 after
    /// an error under errors=remount-ro keeps `rw` and adds `emergency_ro`.
    #[test]
    fn a_filesystem_read_only_by_remount_or_by_errors_is_read_only() {
        let lines = "\
40 1 7:2 / /a rw,relatime - ext4 /dev/loop2 rw,errors=remount-ro
41 1 7:3 / /b rw,relatime - ext4 /dev/loop3 rw,errors=remount-ro,emergency_ro
42 1 7:4 / /c ro,relatime - ext4 /dev/loop4 ro
43 1 7:5 / /d rw,relatime - ext4 /dev/loop5 rw,shutdown
";
        let table = parse(lines.as_bytes()).unwrap();
        let ro = |p: &str| at(&table, Path::new(p)).unwrap().fs_read_only();
        assert!(!ro("/a"));
        assert!(ro("/b") && ro("/c") && ro("/d"));
    }

    #[test]
    fn escaped_paths_roots_and_sources_are_decoded() {
        let line = "30 1 7:4 /sub\\040dir /var/lib/kubelet/a\\040b\\011c\\012d\\134e rw - ext4 \
                    /dev/odd\\040name rw\n";
        let table = parse(line.as_bytes()).unwrap();
        let m = at(&table, Path::new("/var/lib/kubelet/a b\tc\nd\\e")).expect("decoded");
        assert_eq!(m.root, "/sub dir");
        assert_eq!(m.source.as_deref(), Some("/dev/odd name"));
        // A backslash not followed by three octal digits is kept as it is.
        assert_eq!(unescape("a\\9b\\04"), b"a\\9b\\04");
        // Another encoding elsewhere in the table does not hide the rest.
        let mut bytes = b"31 1 0:5 / /mnt/\xff rw - tmpfs tmpfs rw\n".to_vec();
        bytes.extend_from_slice(line.as_bytes());
        assert_eq!(parse(&bytes).unwrap().len(), 2);
    }
}
