//! Node requests parsed before any backend is called: the volume id, the paths checked
//! against the allowed roots, and the capability by the rules of the volume's backend
//! (a block volume is single-node; an NFS one is a filesystem). Backends take only these.
//! Paths (staging, target and volume paths) are checked as text against the allowed roots
//! before anything on the host is touched.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use super::{nfs, volume_ref, Capability, Expand, NfsCapability, NfsVolumeId, VolumeRef};
use crate::csi;
use crate::csi::id::BlockVolumeId;
use crate::error::{Error, MountError, Result};

/// A node request about a volume of one backend, or about an id this driver never issued.
#[derive(Debug)]
pub enum ForVolume<B, N> {
    Block(BlockVolumeId, B),
    Nfs(NfsVolumeId, N),
    Unknown(String),
}

impl<B, N> ForVolume<B, N> {
    /// The volume id as the CO sent it: the key of the per-volume guard.
    pub fn raw(&self) -> String {
        match self {
            ForVolume::Block(id, _) => id.to_string(),
            ForVolume::Nfs(id, _) => id.to_string(),
            ForVolume::Unknown(raw) => raw.clone(),
        }
    }
}

/// NodeStageVolume, parsed; `C` is the backend's capability.
#[derive(Debug)]
pub struct Stage<C> {
    pub staging: PathBuf,
    pub capability: C,
}

/// NodePublishVolume, parsed; `C` is the backend's capability.
#[derive(Debug)]
pub struct Publish<C> {
    pub staging: PathBuf,
    pub target: PathBuf,
    pub readonly: bool,
    pub capability: C,
    pub volume_context: HashMap<String, String>,
}

pub type NodeStage = ForVolume<Stage<Capability>, Stage<NfsCapability>>;
pub type NodePublish = ForVolume<Publish<Capability>, Publish<NfsCapability>>;

/// The capability of a node call on a block volume: required, and single-node.
pub fn block_capability(cap: Option<&csi::VolumeCapability>) -> Result<Capability> {
    let cap = cap.ok_or_else(|| Error::invalid("volume_capability", "required"))?;
    super::capability(cap, "volume_capability")?.ok_or_else(|| {
        Error::invalid(
            "volume_capability",
            "multi-node access modes are not supported by node-local block volumes",
        )
    })
}

/// The capability of a node call on an NFS volume: required, and a filesystem.
pub fn nfs_capability(cap: Option<&csi::VolumeCapability>) -> Result<NfsCapability> {
    let cap = cap.ok_or_else(|| Error::invalid("volume_capability", "required"))?;
    nfs::required(cap, "volume_capability")
}

/// The id split by backend, with the capability parsed by its backend's rules; an
/// unknown id's capability is checked as a block volume's would be before it is found
/// missing.
fn for_volume(
    volume: VolumeRef,
    cap: Option<&csi::VolumeCapability>,
) -> Result<ForVolume<Capability, NfsCapability>> {
    Ok(match volume {
        VolumeRef::Block(id) => ForVolume::Block(id, block_capability(cap)?),
        VolumeRef::Nfs(id) => ForVolume::Nfs(id, nfs_capability(cap)?),
        VolumeRef::Unknown(raw) => {
            block_capability(cap)?;
            ForVolume::Unknown(raw)
        }
    })
}

/// Gives the request `base` the capability of its volume's backend.
fn split<T, B, N>(
    parsed: ForVolume<Capability, NfsCapability>,
    base: T,
    block: fn(T, Capability) -> B,
    nfs: fn(T, NfsCapability) -> N,
) -> ForVolume<B, N> {
    match parsed {
        ForVolume::Block(id, c) => ForVolume::Block(id, block(base, c)),
        ForVolume::Nfs(id, c) => ForVolume::Nfs(id, nfs(base, c)),
        ForVolume::Unknown(raw) => ForVolume::Unknown(raw),
    }
}

impl Stage<()> {
    fn with<C>(self, capability: C) -> Stage<C> {
        Stage {
            staging: self.staging,
            capability,
        }
    }
}

impl Publish<()> {
    fn with<C>(self, capability: C) -> Publish<C> {
        Publish {
            staging: self.staging,
            target: self.target,
            readonly: self.readonly,
            capability,
            volume_context: self.volume_context,
        }
    }
}

pub fn node_stage(req: &csi::NodeStageVolumeRequest, roots: &[PathBuf]) -> Result<NodeStage> {
    let volume = volume_ref(&req.volume_id)?;
    let staging = host_path("staging_target_path", &req.staging_target_path, roots)?;
    let parsed = for_volume(volume, req.volume_capability.as_ref())?;
    let stage = Stage {
        staging,
        capability: (),
    };
    Ok(split(parsed, stage, Stage::with, Stage::with))
}

pub fn node_publish(req: &csi::NodePublishVolumeRequest, roots: &[PathBuf]) -> Result<NodePublish> {
    let volume = volume_ref(&req.volume_id)?;
    let staging = host_path("staging_target_path", &req.staging_target_path, roots)?;
    let target = host_path("target_path", &req.target_path, roots)?;
    let parsed = for_volume(volume, req.volume_capability.as_ref())?;
    let publish = Publish {
        staging,
        target,
        readonly: req.readonly,
        capability: (),
        volume_context: req.volume_context.clone(),
    };
    Ok(split(parsed, publish, Publish::with, Publish::with))
}

/// NodeUnstageVolume or NodeUnpublishVolume: the volume and the path to take down.
#[derive(Debug)]
pub struct TakeDown {
    pub volume: VolumeRef,
    pub path: PathBuf,
}

pub fn node_unstage(req: &csi::NodeUnstageVolumeRequest, roots: &[PathBuf]) -> Result<TakeDown> {
    let volume = volume_ref(&req.volume_id)?;
    let path = host_path("staging_target_path", &req.staging_target_path, roots)?;
    Ok(TakeDown { volume, path })
}

pub fn node_unpublish(
    req: &csi::NodeUnpublishVolumeRequest,
    roots: &[PathBuf],
) -> Result<TakeDown> {
    let volume = volume_ref(&req.volume_id)?;
    let path = host_path("target_path", &req.target_path, roots)?;
    Ok(TakeDown { volume, path })
}

/// NodeGetVolumeStats, parsed.
#[derive(Debug)]
pub struct Stats {
    pub volume: VolumeRef,
    pub path: PathBuf,
    pub staging: Option<PathBuf>,
}

/// NodeGetVolumeStats' and NodeExpandVolume's `volume_path` is a staging or target path
/// like the others: checked against the allowed roots before anything about it is
/// answered. A volume is never at a path that fails the checks, so that is `NotFound`
/// (what csi-sanity's "volume does not exist on the specified path" expects), the same
/// answer whether or not such a host path exists; only a missing path is
/// `InvalidArgument`.
fn volume_path(volume: &str, raw: &str, roots: &[PathBuf]) -> Result<PathBuf> {
    if raw.is_empty() {
        return Err(Error::invalid("volume_path", "required"));
    }
    host_path("volume_path", raw, roots).map_err(|e| match e {
        Error::InvalidArgument { field, reason } => MountError::PathRefused {
            volume: volume.to_owned(),
            path: raw.to_owned(),
            field,
            reason,
        }
        .into(),
        other => other,
    })
}

pub fn node_stats(req: &csi::NodeGetVolumeStatsRequest, roots: &[PathBuf]) -> Result<Stats> {
    let volume = volume_ref(&req.volume_id)?;
    // The path first: a bad one is refused before the host is looked at.
    let path = volume_path(&req.volume_id, &req.volume_path, roots)?;
    let staging = match req.staging_target_path.as_str() {
        "" => None,
        raw => Some(host_path("staging_target_path", raw, roots)?),
    };
    Ok(Stats {
        volume,
        path,
        staging,
    })
}

/// NodeExpandVolume, parsed.
#[derive(Debug)]
pub struct NodeExpand {
    pub volume: VolumeRef,
    pub path: PathBuf,
    pub expand: Expand,
}

pub fn node_expand(req: &csi::NodeExpandVolumeRequest, roots: &[PathBuf]) -> Result<NodeExpand> {
    let volume = volume_ref(&req.volume_id)?;
    let path = volume_path(&req.volume_id, &req.volume_path, roots)?;
    let expand = super::expand(
        req.capacity_range.as_ref(),
        false,
        req.volume_capability.as_ref(),
    )?;
    Ok(NodeExpand {
        volume,
        path,
        expand,
    })
}

/// Longest path the kernel takes (PATH_MAX, include/uapi/linux/limits.h, counts the NUL).
const PATH_MAX: usize = 4095;
/// Longest file name (NAME_MAX, include/uapi/linux/limits.h).
const NAME_MAX: usize = 255;

/// lstat's "is it a symlink", from the attributes the kernel has cached: a plain lstat of an
/// NFS mount whose server is gone asks the server and hangs (nfs_getattr, fs/nfs/inode.c;
/// kernel stack seen in the VM rig's s_unmount_dead). A type never changes, so the cached one
/// is exact. Errors count as "not a symlink", as the lstat's did.
fn is_symlink_cached(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `libc::statx` is plain old data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx writes only into `stx`, which lives for the call; `c` is NUL-terminated.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut stx,
        )
    };
    rc == 0 && (u32::from(stx.stx_mode) & libc::S_IFMT) == libc::S_IFLNK
}

/// A staging, target or volume path, checked as text: absolute, no `..`, no longer than the
/// kernel takes, strictly below an allowed root (the root itself would put the volume over
/// the whole kubelet directory), and no existing component a symlink. Returned normalised
/// (no `.`, no doubled or trailing `/`). This is the early, clear refusal; what is mounted
/// is resolved again without a window by `os::safepath`.
pub fn host_path(field: &'static str, raw: &str, roots: &[PathBuf]) -> Result<PathBuf> {
    check_text(field, raw)?;
    let path: PathBuf = Path::new(raw).components().collect();
    check_below_roots(field, raw, &path, roots)?;
    // Every existing ancestor below the root must be a real directory, not a link.
    let mut walked = PathBuf::new();
    for component in path.components() {
        walked.push(component);
        if is_symlink_cached(&walked) {
            return Err(Error::invalid(
                field,
                format!("{} is a symlink; pass the real path", walked.display()),
            ));
        }
    }
    Ok(path)
}

/// The path as text: present, printable, absolute, no `..`, within the kernel's limits.
fn check_text(field: &'static str, raw: &str) -> Result<()> {
    if raw.is_empty() {
        return Err(Error::invalid(field, "required"));
    }
    if raw.contains('\0') || raw.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    if raw.len() > PATH_MAX {
        return Err(Error::invalid(
            field,
            format!(
                "{} bytes long; a path is at most {PATH_MAX} bytes",
                raw.len()
            ),
        ));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(Error::invalid(
            field,
            format!("{raw:?} must be an absolute path"),
        ));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Error::invalid(
            field,
            format!("{raw:?} must not contain '..'"),
        ));
    }
    match path.iter().find(|c| c.len() > NAME_MAX) {
        Some(long) => Err(Error::invalid(
            field,
            format!(
                "a component of {raw:?} is {} bytes long; a name is at most {NAME_MAX} bytes",
                long.len()
            ),
        )),
        None => Ok(()),
    }
}

/// Strictly below one of the allowed roots (the root itself would put the volume over
/// the whole kubelet directory).
fn check_below_roots(field: &'static str, raw: &str, path: &Path, roots: &[PathBuf]) -> Result<()> {
    if let Some(root) = roots.iter().find(|root| path == root.as_path()) {
        return Err(Error::invalid(
            field,
            format!(
                "{raw:?} is the allowed root {} itself; pass a directory below it",
                root.display()
            ),
        ));
    }
    if !roots.iter().any(|root| path.starts_with(root)) {
        let roots: Vec<_> = roots.iter().map(|r| r.display().to_string()).collect();
        return Err(Error::invalid(
            field,
            format!(
                "{raw:?} is outside the allowed roots [{}] (--allowed-path-root)",
                roots.join(", ")
            ),
        ));
    }
    Ok(())
}
