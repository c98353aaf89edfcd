//! Mount-table logic every backend shares: staging and target directories pinned
//! beneath the allowed roots, publish idempotency from the mount table, unmounting only
//! what is a volume's own, and removing only what its publish created. A `Mounter` is
//! the host port and the allowed roots; it knows no backend.

pub mod private;
pub mod unmount;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, MountError, Result};
use crate::os::safepath::{self, Anchored, Create};
use crate::os::{mount, Host, MountEntry};

/// What a mount entry and the mount point's current attributes say about ownership.
pub type IsOurs<'a> = &'a (dyn Fn(&MountEntry, Option<&nix::sys::stat::FileStat>) -> bool + Sync);

/// The host port and the roots below which every caller's path must lie.
pub struct Mounter {
    pub host: Arc<dyn Host>,
    pub roots: Vec<PathBuf>,
    /// The deadline of each step of a hung NFS unmount's escalation.
    pub unmount_step: Duration,
}

impl Mounter {
    pub fn new(host: Arc<dyn Host>, roots: Vec<PathBuf>) -> Self {
        Mounter {
            host,
            roots,
            unmount_step: unmount::STEP,
        }
    }

    pub fn mount_table(&self) -> Result<Vec<MountEntry>> {
        self.host.mount_table()
    }

    /// The mounts at paths this driver serves: beneath an allowed root, where every
    /// staging and target path lies. These are the only mounts that count as a volume
    /// staged or published. A mount made there is also listed wherever the kernel
    /// propagates a copy (each container root filesystem that holds the kubelet's
    /// directory with shared propagation, seen through containerd's task directory,
    /// shows one): a copy is the same mount seen from elsewhere, never another pod's
    /// publication. Whether a device is in use at all is still asked of the whole table.
    pub fn served<'a>(&self, table: &'a [MountEntry]) -> Vec<&'a MountEntry> {
        table
            .iter()
            .filter(|m| self.serves(&m.mount_point))
            .collect()
    }

    /// Whether `path` lies beneath one of the allowed roots.
    pub fn serves(&self, path: &Path) -> bool {
        self.roots.iter().any(|root| path.starts_with(root))
    }

    /// Where the filesystem of `major:minor` can be read whole: a mount of its root
    /// directory at a path this driver serves (the staging mount), never a copy of it
    /// inside another container's root filesystem, whose path that container controls.
    pub fn filesystem_root(&self, table: &[MountEntry], major: u32, minor: u32) -> Option<PathBuf> {
        self.served(table)
            .into_iter()
            .find(|m| (m.major, m.minor) == (major, minor) && m.root == "/")
            .map(|m| m.mount_point.clone())
    }

    /// `path` pinned beneath its root without creating anything; `None`: not there.
    pub fn open(&self, field: &'static str, path: &Path) -> Result<Option<Anchored>> {
        safepath::open(field, &self.roots, path, Create::Nothing, None)
    }

    /// Whether the path exists, opened beneath its root (a symlink or a mount crossed on
    /// the way is "not there": the volume is never reached that way).
    pub fn exists_beneath(&self, path: &Path) -> Result<bool> {
        match self.open("volume_path", path) {
            Ok(found) => Ok(found.is_some()),
            Err(Error::InvalidArgument { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A staging or target directory, pinned beneath its allowed root (created with its
    /// parents when missing, `mark`ed when publish creates it). It must be a directory,
    /// and an empty one unless something is mounted there already: a mount would hide
    /// what it holds.
    pub fn mount_dir(
        &self,
        field: &'static str,
        path: &Path,
        mark: Option<&str>,
    ) -> Result<Anchored> {
        let created = || Error::invalid(field, format!("{} could not be created", path.display()));
        let dir =
            safepath::open(field, &self.roots, path, Create::Dir, mark)?.ok_or_else(created)?;
        let st = dir
            .stat_now()?
            .ok_or_else(|| Error::invalid(field, format!("{} disappeared", path.display())))?;
        if safepath::kind(&st) != nix::sys::stat::SFlag::S_IFDIR {
            return Err(Error::invalid(
                field,
                format!("{} exists and is not a directory", path.display()),
            ));
        }
        let mounted = mount::at(&self.host.mount_table()?, path).is_some();
        if !mounted && !safepath::dir_is_empty(&dir)? {
            return Err(MountError::DirNotEmpty {
                field,
                path: path.to_owned(),
            }
            .into());
        }
        Ok(dir)
    }

    /// A raw-block publish target: an empty regular file pinned beneath its root
    /// (created, and `mark`ed, when missing).
    pub fn target_file(&self, target: &Path, mark: &str) -> Result<Anchored> {
        let pinned = safepath::open("target_path", &self.roots, target, Create::File, Some(mark))?
            .ok_or_else(|| {
                Error::invalid(
                    "target_path",
                    format!("{} could not be created", target.display()),
                )
            })?;
        // Only an empty regular file is mounted over: anything else would be hidden
        // (and a file with contents is not a publish target someone made for us).
        let st = pinned.stat_now()?;
        let empty_file = st.is_some_and(|st| {
            safepath::kind(&st) == nix::sys::stat::SFlag::S_IFREG && st.st_size == 0
        });
        if !empty_file {
            return Err(MountError::TargetNotEmptyFile {
                path: target.to_owned(),
            }
            .into());
        }
        Ok(pinned)
    }

    /// Unmounts every mount stacked at `path` (a retried mount that half-succeeded) as
    /// long as the topmost is this volume's (`is_ours`, given the entry and what the path
    /// holds now); another mount there is refused and left alone. Returns the pinned
    /// path, or `None` when it does not exist.
    pub async fn unmount_ours(
        &self,
        field: &'static str,
        path: &Path,
        volume: &str,
        is_ours: IsOurs<'_>,
    ) -> Result<Option<Anchored>> {
        let Some(pinned) = self.open(field, path)? else {
            return Ok(None);
        };
        // Looked up afresh from here: a descriptor of the mount's root would keep it busy.
        let pinned = pinned.without_final();
        for _ in 0..8 {
            let mounts = self.host.mount_table()?;
            let Some(m) = mount::at(&mounts, path) else {
                return Ok(Some(pinned));
            };
            // Never fstat an NFS mount's root: nfs_getattr (fs/nfs/inode.c, ~l. 857 in 6.1:
            // `do_update |= ... cache_validity & NFS_INO_INVALID_CHANGE`) asks the server
            // when the cached attributes are stale (a file created in it is enough), and
            // with the server gone that stat hung here, outside any deadline (VM rig,
            // s_unmount_dead). NFS volumes are told apart by their mount source.
            let st = if m.fs_type.starts_with("nfs") {
                None
            } else {
                pinned.stat_now()?
            };
            if !is_ours(m, st.as_ref()) {
                return Err(MountError::Foreign {
                    path: path.to_owned(),
                    fs_type: m.fs_type.clone(),
                    device: m.source.clone().unwrap_or_else(|| "?".into()),
                    volume: volume.to_owned(),
                }
                .into());
            }
            unmount::unmount(self.host.as_ref(), &pinned, self.unmount_step).await?;
        }
        Err(MountError::StillMounted {
            path: path.to_owned(),
        }
        .into())
    }

    /// NodeUnpublishVolume, for every backend: unmount this volume's mounts at `target`
    /// (`is_ours`), then remove the target only if this volume's publish created it (the
    /// `safepath::PUBLISHED_BY` mark). Anything else at the target is left as it is.
    pub async fn unpublish(&self, volume: &str, target: &Path, is_ours: IsOurs<'_>) -> Result<()> {
        let Some(pinned) = self
            .unmount_ours("target_path", target, volume, is_ours)
            .await?
        else {
            return Ok(());
        };
        if pinned.published_by()?.as_deref() != Some(volume) {
            return Ok(());
        }
        let is_dir = pinned
            .stat_now()?
            .is_some_and(|st| safepath::kind(&st) == nix::sys::stat::SFlag::S_IFDIR);
        pinned.remove(is_dir)
    }
}

/// Staging: `m` at `path` is not this volume's.
pub fn staging_taken(path: &Path, m: &MountEntry) -> Error {
    MountError::StagingTaken {
        path: path.to_owned(),
        fs_type: m.fs_type.clone(),
        device: m.source.clone().unwrap_or_else(|| "?".into()),
    }
    .into()
}

/// Publish: the volume's staging mount is missing.
pub fn not_staged(volume: &str, staging: &Path) -> Error {
    MountError::NotStaged {
        volume: volume.to_owned(),
        staging: staging.to_owned(),
    }
    .into()
}

/// SINGLE_NODE_SINGLE_WRITER: the volume is already published at `at`.
pub fn single_writer(volume: &str, at: &Path) -> Error {
    MountError::SingleWriter {
        volume: volume.to_owned(),
        at: at.to_owned(),
    }
    .into()
}

/// Publish idempotency from the mount table, for every backend: `true` when `target`
/// already carries this volume (`is_ours`) with the same read-only flag, `false` when
/// nothing is mounted there, `AlreadyExists` when something else or another flag is.
pub fn already_published(
    mounts: &[MountEntry],
    target: &Path,
    readonly: bool,
    is_ours: impl Fn(&MountEntry) -> bool,
) -> Result<bool> {
    let Some(m) = mount::at(mounts, target) else {
        return Ok(false);
    };
    if !is_ours(m) {
        return Err(MountError::TargetTaken {
            path: target.to_owned(),
            fs_type: m.fs_type.clone(),
        }
        .into());
    }
    if m.read_only() != readonly {
        return Err(MountError::ReadonlyDiffers {
            path: target.to_owned(),
            current: m.read_only(),
        }
        .into());
    }
    Ok(true)
}

/// Bytes and inodes of a filesystem, as NodeGetVolumeStats reports them.
pub fn usage_of(st: &crate::os::FsUsage) -> Vec<crate::csi::VolumeUsage> {
    use crate::csi::{volume_usage::Unit, VolumeUsage};
    vec![
        VolumeUsage {
            available: st.available_bytes as i64,
            total: st.total_bytes as i64,
            used: (st.total_bytes - st.free_bytes) as i64,
            unit: Unit::Bytes as i32,
        },
        VolumeUsage {
            available: st.available_inodes as i64,
            total: st.total_inodes as i64,
            used: st.total_inodes as i64 - st.free_inodes as i64,
            unit: Unit::Inodes as i32,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::RealHost;

    fn mounter(roots: &[&str]) -> Mounter {
        let host = RealHost {
            command_timeout: Duration::from_secs(1),
            mount_timeout: Duration::from_secs(1),
        };
        Mounter::new(Arc::new(host), roots.iter().map(PathBuf::from).collect())
    }

    fn entry(at: &str, root: &str) -> MountEntry {
        MountEntry {
            major: 259,
            minor: 3,
            root: root.into(),
            mount_point: at.into(),
            mount_options: Default::default(),
            fs_type: "ext4".into(),
            source: Some("/dev/nvme0n1p3".into()),
            super_options: Default::default(),
        }
    }

    #[test]
    fn copies_outside_the_allowed_roots_are_not_served_mounts() {
        let m = mounter(&["/var/lib/kubelet"]);
        let tasks = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1/rootfs";
        let table = vec![
            entry(
                &format!("{tasks}/var/lib/kubelet/plugins/g/globalmount"),
                "/",
            ),
            entry("/var/lib/kubelet2/pods/p/volumes/v/mount", "/"),
            entry("/var/lib/kubelet/pods/p/volumes/v/mount", "/sub"),
            entry("/var/lib/kubelet/plugins/g/globalmount", "/"),
        ];
        let served: Vec<&Path> = m
            .served(&table)
            .iter()
            .map(|e| e.mount_point.as_path())
            .collect();
        assert_eq!(
            served,
            [
                Path::new("/var/lib/kubelet/pods/p/volumes/v/mount"),
                Path::new("/var/lib/kubelet/plugins/g/globalmount"),
            ]
        );
        // The copy is listed first; the filesystem is read at the served mount of its root.
        assert_eq!(
            m.filesystem_root(&table, 259, 3).as_deref(),
            Some(Path::new("/var/lib/kubelet/plugins/g/globalmount"))
        );
        assert_eq!(m.filesystem_root(&table[..3], 259, 3), None);
    }
}
