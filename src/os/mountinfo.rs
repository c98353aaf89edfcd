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

    /// The filesystem itself is read-only (ext4 remounts so after errors).
    pub fn fs_read_only(&self) -> bool {
        self.super_options.contains_key("ro")
    }
}

pub fn parse(text: &[u8]) -> Result<Vec<MountEntry>> {
    let infos = procfs_core::process::MountInfos::from_read(text).map_err(|e| Error::State {
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
                root: m.root,
                mount_point: m.mount_point,
                mount_options: m.mount_options,
                fs_type: m.fs_type,
                source: m.mount_source,
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
}
