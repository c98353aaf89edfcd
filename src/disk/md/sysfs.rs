//! Running md arrays as the kernel shows them in sysfs: `/sys/block/mdN/md/uuid`
//! (dashed UUID), `md/level`, `md/chunk_size` (bytes), `size` (512-byte sectors) and
//! `slaves/` (the member block devices). Layout seen on the VM rig (kernel 6.1).

use std::fs;
use std::path::{Path, PathBuf};

/// A running array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// Kernel name, `md127`.
    pub name: String,
    /// `/dev/md127`.
    pub node: PathBuf,
    pub uuid: String,
    pub level: String,
    pub chunk_bytes: u64,
    pub size_bytes: u64,
    /// Kernel names of the members (`nvme0n1p2`), sorted.
    pub members: Vec<String>,
}

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Every running md array under `sys` (the host's `/sys`).
pub fn running(sys: &Path) -> Vec<Running> {
    let Ok(dir) = fs::read_dir(sys.join("block")) else {
        return Vec::new();
    };
    let mut out: Vec<Running> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            if !name.starts_with("md") {
                return None;
            }
            let base = sys.join("block").join(&name);
            let mut members: Vec<String> = fs::read_dir(base.join("slaves"))
                .ok()?
                .flatten()
                .filter_map(|m| m.file_name().to_str().map(str::to_owned))
                .collect();
            members.sort();
            Some(Running {
                node: PathBuf::from("/dev").join(&name),
                uuid: read(&base.join("md/uuid"))?,
                level: read(&base.join("md/level")).unwrap_or_default(),
                chunk_bytes: read(&base.join("md/chunk_size"))?.parse().ok()?,
                size_bytes: read(&base.join("size"))?.parse::<u64>().ok()? * 512,
                members,
                name,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The running array with this UUID (any separator style).
pub fn find(sys: &Path, uuid: &str) -> Option<Running> {
    running(sys)
        .into_iter()
        .find(|r| crate::disk::md::same_uuid(&r.uuid, uuid))
}

/// The running array, if any, that holds the block device `member` (kernel name).
pub fn holding(sys: &Path, member: &str) -> Option<Running> {
    running(sys)
        .into_iter()
        .find(|r| r.members.iter().any(|m| m == member))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files the VM rig's kernel showed for md127 (two 64 MiB NVMe members).
    fn fake_sys() -> tempfile::TempDir {
        let sys = tempfile::tempdir().unwrap();
        let md = sys.path().join("block/md127");
        fs::create_dir_all(md.join("md")).unwrap();
        fs::create_dir_all(md.join("slaves/nvme0n1")).unwrap();
        fs::create_dir_all(md.join("slaves/nvme1n1")).unwrap();
        fs::write(md.join("size"), "258048\n").unwrap();
        fs::write(md.join("md/uuid"), "002cd3f1-01eb-3f8d-ef68-842e73da9813\n").unwrap();
        fs::write(md.join("md/level"), "raid0\n").unwrap();
        fs::write(md.join("md/chunk_size"), "524288\n").unwrap();
        fs::create_dir_all(sys.path().join("block/nvme0n1")).unwrap();
        sys
    }

    #[test]
    fn arrays_are_found_by_uuid_and_by_member() {
        let sys = fake_sys();
        let r = find(sys.path(), "002cd3f1:01eb3f8d:ef68842e:73da9813").unwrap();
        assert_eq!(r.node, PathBuf::from("/dev/md127"));
        assert_eq!(r.size_bytes, 2 * 63 * (1 << 20));
        assert_eq!((r.level.as_str(), r.chunk_bytes), ("raid0", 512 * 1024));
        assert_eq!(r.members, vec!["nvme0n1", "nvme1n1"]);
        assert_eq!(
            find(sys.path(), "00000000:01eb3f8d:ef68842e:73da9813"),
            None
        );
        assert_eq!(
            holding(sys.path(), "nvme1n1").map(|r| r.name),
            Some("md127".into())
        );
        assert_eq!(holding(sys.path(), "nvme2n1"), None);
        assert!(running(Path::new("/nonexistent")).is_empty());
    }
}
