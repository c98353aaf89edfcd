//! CSI requests parsed into domain types whose fields are already valid. Anything
//! wrong becomes `InvalidArgument` naming the field, before the host is touched.

use std::collections::HashMap;

use crate::csi;
use crate::csi::id::{self as volume_id};
use crate::csi::volume_capability::access_mode::Mode as CsiMode;
use crate::csi::volume_capability::AccessType;
use crate::error::{Error, Result};
use crate::os::FsType;

pub mod dataset;
pub mod nfs;
pub mod nfs_id;
pub mod nfs_options;
pub mod node;
pub mod snapshot;
pub mod storage_class;
pub mod stripe;

pub use node::host_path;

pub use crate::csi::id::VolumeRef;
pub use nfs::{NfsCapability, NfsParams, OnDelete};
pub use nfs_id::NfsVolumeId;
pub use nfs_options::{MountOptions, Transport};
pub use storage_class::{
    is_nfs, layout_kind, parameters, LayoutKind, VolumeParameters, PARAM_FS_TYPE, PARAM_GDS_POLICY,
    PARAM_LAYOUT, PARAM_VERIFY,
};
pub use stripe::StripeParams;

/// CSI names are at most 128 bytes (Kubernetes enforces it on PV names).
const MAX_NAME_LEN: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Mount,
    Block,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub access: Access,
    pub fs_type: Option<FsType>,
    pub mount_flags: Vec<String>,
    pub read_only_mode: bool,
    /// SINGLE_NODE_SINGLE_WRITER: one published target at a time.
    pub single_writer: bool,
}

fn access_mode_supported(mode: CsiMode) -> Result<bool> {
    match mode {
        CsiMode::Unknown => Err(Error::invalid(
            "volume_capability.access_mode",
            "required; a local block volume supports the SINGLE_NODE_* modes",
        )),
        CsiMode::SingleNodeWriter
        | CsiMode::SingleNodeReaderOnly
        | CsiMode::SingleNodeSingleWriter
        | CsiMode::SingleNodeMultiWriter => Ok(true),
        CsiMode::MultiNodeReaderOnly
        | CsiMode::MultiNodeSingleWriter
        | CsiMode::MultiNodeMultiWriter => Ok(false),
    }
}

/// Mount flags become one `-o` list: a flag must be a single option, and may not
/// weaken what GDS or the driver relies on.
pub fn check_mount_flag(flag: &str) -> Result<()> {
    const FIELD: &str = "volume_capability.mount.mount_flags";
    if flag.is_empty()
        || flag.contains([',', '\n', '\0', ' '])
        || flag.chars().any(char::is_control)
    {
        return Err(Error::invalid(
            FIELD,
            format!("{flag:?} must be one option without commas, spaces or control characters"),
        ));
    }
    let name = flag.split('=').next().unwrap_or(flag);
    match name {
        "data" if flag != "data=ordered" => Err(Error::invalid(
            FIELD,
            format!("{flag:?}: GDS needs ext4 data=ordered (data=journal disables O_DIRECT); drop the flag"),
        )),
        "bind" | "rbind" | "remount" | "move" | "make-shared" | "make-private" | "loop" | "offset"
        | "sizelimit" | "X-mount.mkdir" => Err(Error::invalid(
            FIELD,
            format!("{flag:?} is managed by the driver and cannot be passed"),
        )),
        _ => Ok(()),
    }
}

/// A volume capability, checked. `Ok(None)` means well formed but unsupported.
pub fn capability(cap: &csi::VolumeCapability, field: &'static str) -> Result<Option<Capability>> {
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::invalid(field, "access_mode is required"))?;
    let mode = CsiMode::try_from(mode.mode)
        .map_err(|_| Error::invalid(field, format!("unknown access mode {}", mode.mode)))?;
    let supported = access_mode_supported(mode)?;
    let read_only_mode = mode == CsiMode::SingleNodeReaderOnly;
    let single_writer = mode == CsiMode::SingleNodeSingleWriter;
    let parsed = match &cap.access_type {
        None => {
            return Err(Error::invalid(
                field,
                "access_type (mount or block) is required",
            ))
        }
        Some(AccessType::Block(_)) => Capability {
            access: Access::Block,
            fs_type: None,
            mount_flags: Vec::new(),
            read_only_mode,
            single_writer,
        },
        Some(AccessType::Mount(m)) => {
            let fs_type = match m.fs_type.as_str() {
                "" => None,
                other => Some(FsType::parse(other).ok_or_else(|| {
                    Error::invalid(
                        "volume_capability.mount.fs_type",
                        format!(
                            "{other:?} is not supported; use one of {}",
                            FsType::SUPPORTED
                        ),
                    )
                })?),
            };
            for flag in &m.mount_flags {
                check_mount_flag(flag)?;
            }
            Capability {
                access: Access::Mount,
                fs_type,
                mount_flags: m.mount_flags.clone(),
                read_only_mode,
                single_writer,
            }
        }
    };
    Ok(supported.then_some(parsed))
}

/// Every capability must be supported (for CreateVolume); unsupported is InvalidArgument.
pub fn capabilities(caps: &[csi::VolumeCapability]) -> Result<Vec<Capability>> {
    if caps.is_empty() {
        return Err(Error::invalid(
            "volume_capabilities",
            "at least one capability is required",
        ));
    }
    caps.iter()
        .map(|c| {
            capability(c, "volume_capabilities")?.ok_or_else(|| {
                Error::invalid(
                    "volume_capabilities",
                    "multi-node access modes are not supported by node-local block volumes; use SINGLE_NODE_*",
                )
            })
        })
        .collect()
}

pub fn name(name: &str) -> Result<String> {
    if name.is_empty() {
        return Err(Error::invalid(
            "name",
            "required (the CO's idempotency key)",
        ));
    }
    if name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "name",
            format!("must be at most {MAX_NAME_LEN} bytes without control characters"),
        ));
    }
    Ok(name.to_owned())
}

/// CreateVolume, checked as far as it does not depend on the backend.
pub struct CreateVolume<'a> {
    pub name: String,
    pub params: VolumeParameters,
    /// Every parameter, the sidecar's included (claim name and namespace).
    pub raw_parameters: &'a HashMap<String, String>,
    pub capabilities: &'a [csi::VolumeCapability],
    pub required_bytes: u64,
    /// 0 means no limit.
    pub limit_bytes: u64,
    pub accessibility: Option<&'a csi::TopologyRequirement>,
    /// `volume_content_source`: the volume or snapshot to fill this one from.
    pub source: Option<ContentSource>,
    /// The snapshot `source` names, read from its store by the service.
    pub restore: Option<snapshot::Restore>,
}

pub fn create_volume(req: &csi::CreateVolumeRequest) -> Result<CreateVolume<'_>> {
    let name = name(&req.name)?;
    let params = parameters(&req.parameters)?;
    let source = content_source(req.volume_content_source.as_ref())?;
    if source.is_some() && params.dataset.is_some() {
        return Err(Error::invalid(
            "volume_content_source",
            "the class names a dataset (datasetServer) to fill the volume from: a volume has \
             one source; drop the claim's dataSource or use a class without a dataset",
        ));
    }
    let range = req.capacity_range.unwrap_or_default();
    if range.required_bytes < 0 || range.limit_bytes < 0 {
        return Err(Error::invalid(
            "capacity_range",
            "bytes must not be negative",
        ));
    }
    if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
        return Err(Error::invalid(
            "capacity_range",
            "required_bytes is larger than limit_bytes",
        ));
    }
    Ok(CreateVolume {
        name,
        params,
        raw_parameters: &req.parameters,
        capabilities: &req.volume_capabilities,
        required_bytes: range.required_bytes as u64,
        limit_bytes: range.limit_bytes as u64,
        accessibility: req.accessibility_requirements.as_ref(),
        source,
        restore: None,
    })
}

/// What `volume_content_source` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    /// A volume to clone: its id as given, and which kind of volume the id says it is.
    Volume { text: String, id: VolumeRef },
    /// A snapshot to restore: one not in this driver's form is NotFound, as CSI asks,
    /// once the service looks for it.
    Snapshot(snapshot::SnapshotRef),
}

impl ContentSource {
    /// The volume to clone, when the source is one.
    pub fn volume(&self) -> Option<(&str, &VolumeRef)> {
        match self {
            ContentSource::Volume { text, id } => Some((text, id)),
            ContentSource::Snapshot(_) => None,
        }
    }

    /// The id as given.
    pub fn text(&self) -> String {
        match self {
            ContentSource::Volume { text, .. } => text.clone(),
            ContentSource::Snapshot(id) => id.to_string(),
        }
    }
}

/// The volume a clone is filled from, or the snapshot a volume is restored from.
fn content_source(src: Option<&csi::VolumeContentSource>) -> Result<Option<ContentSource>> {
    use csi::volume_content_source::Type;
    let Some(src) = src else { return Ok(None) };
    match src.r#type.as_ref() {
        None => Err(Error::invalid(
            "volume_content_source",
            "names no source: set volume (a volume of this driver to clone) or snapshot",
        )),
        Some(Type::Volume(v)) if v.volume_id.is_empty() => Err(Error::invalid(
            "volume_content_source.volume.volume_id",
            "required",
        )),
        Some(Type::Volume(v)) => {
            volume_id::check_well_formed("volume_content_source.volume.volume_id", &v.volume_id)?;
            Ok(Some(ContentSource::Volume {
                text: v.volume_id.clone(),
                id: volume_ref(&v.volume_id)?,
            }))
        }
        Some(Type::Snapshot(s)) if s.snapshot_id.is_empty() => Err(Error::invalid(
            "volume_content_source.snapshot.snapshot_id",
            "required",
        )),
        Some(Type::Snapshot(s)) => {
            volume_id::check_well_formed(
                "volume_content_source.snapshot.snapshot_id",
                &s.snapshot_id,
            )?;
            let field = "volume_content_source.snapshot.snapshot_id";
            let id = snapshot::SnapshotRef::parse(field, &s.snapshot_id)?;
            Ok(Some(ContentSource::Snapshot(id)))
        }
    }
}

/// ControllerExpandVolume or NodeExpandVolume, parsed (bytes; a `limit` of 0 is none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Expand {
    pub required: u64,
    pub limit: u64,
    /// The capability given says raw block access: no filesystem to grow.
    pub block: bool,
}

/// ControllerExpandVolume's or NodeExpandVolume's capacity range and capability.
/// `range_required`: the controller call must name a range (CSI spec: REQUIRED).
pub fn expand(
    range: Option<&csi::CapacityRange>,
    range_required: bool,
    cap: Option<&csi::VolumeCapability>,
) -> Result<Expand> {
    let range = match range {
        Some(r) => *r,
        None if range_required => {
            return Err(Error::invalid(
                "capacity_range",
                "required: give required_bytes (the new size)",
            ))
        }
        None => csi::CapacityRange::default(),
    };
    if range.required_bytes < 0 || range.limit_bytes < 0 {
        return Err(Error::invalid(
            "capacity_range",
            "bytes must not be negative",
        ));
    }
    if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
        return Err(Error::invalid(
            "capacity_range",
            "required_bytes is larger than limit_bytes",
        ));
    }
    let block = matches!(
        cap.and_then(|c| c.access_type.as_ref()),
        Some(AccessType::Block(_))
    );
    Ok(Expand {
        required: range.required_bytes as u64,
        limit: range.limit_bytes as u64,
        block,
    })
}

pub fn volume_ref(id: &str) -> Result<VolumeRef> {
    volume_id::check_well_formed("volume_id", id)?;
    Ok(VolumeRef::of(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn mount_cap(mode: CsiMode, fs: &str, flags: &[&str]) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            })),
        }
    }

    #[test]
    fn capability_table() {
        use CsiMode::*;
        let ok = capability(&mount_cap(SingleNodeWriter, "xfs", &["noatime"]), "c").unwrap();
        assert_eq!(ok.unwrap().fs_type, Some(FsType::Xfs));
        assert_eq!(
            capability(&mount_cap(MultiNodeMultiWriter, "", &[]), "c").unwrap(),
            None
        );
        let block = csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: SingleNodeReaderOnly as i32,
            }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        };
        let parsed = capability(&block, "c").unwrap().unwrap();
        assert_eq!(parsed.access, Access::Block);
        assert!(parsed.read_only_mode);
        let bad: &[csi::VolumeCapability] = &[
            mount_cap(Unknown, "", &[]),
            mount_cap(SingleNodeWriter, "btrfs", &[]),
            mount_cap(SingleNodeWriter, "", &["ro,exec"]),
            mount_cap(SingleNodeWriter, "", &["data=journal"]),
            mount_cap(SingleNodeWriter, "", &["remount"]),
            mount_cap(SingleNodeWriter, "", &["a\nb"]),
            csi::VolumeCapability {
                access_mode: None,
                access_type: None,
            },
        ];
        for cap in bad {
            assert!(
                matches!(capability(cap, "c"), Err(Error::InvalidArgument { .. })),
                "{cap:?}"
            );
        }
    }

    #[test]
    fn paths_must_be_absolute_inside_roots_and_not_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let roots = vec![root.path().to_owned()];
        let inside = root.path().join("pods/x/mount");
        host_path("target_path", inside.to_str().unwrap(), &roots).unwrap();
        for bad in [
            "",
            "relative/path",
            "/etc/passwd",
            &format!("{}/../etc", root.path().display()),
        ] {
            assert!(host_path("target_path", bad, &roots).is_err(), "{bad}");
        }
        let link = root.path().join("link");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        let through = link.join("x");
        let err = host_path("target_path", through.to_str().unwrap(), &roots).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }

    #[test]
    fn the_root_itself_and_overlong_paths_are_invalid_arguments() {
        let root = tempfile::tempdir().unwrap();
        let roots = vec![root.path().to_owned()];
        let r = root.path().display().to_string();
        for (raw, says) in [
            (r.clone(), "allowed root"),
            (format!("{r}/"), "allowed root"),
            (format!("{r}/."), "allowed root"),
            (format!("{r}/{}", "n".repeat(300)), "at most 255"),
            (format!("{r}/{}", "d/".repeat(2050)), "at most 4095"),
        ] {
            match host_path("staging_target_path", &raw, &roots) {
                Err(Error::InvalidArgument { field, reason }) => {
                    assert_eq!(field, "staging_target_path");
                    assert!(reason.contains(says), "{raw}: {reason}");
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
        let ok = host_path("target_path", &format!("{r}//a/./b/"), &roots).unwrap();
        assert_eq!(ok, root.path().join("a/b"));
    }

    /// The kernel's limits are inclusive: PATH_MAX counts the NUL, so 4095 bytes of path and
    /// 255-byte names pass, one byte more is refused.
    #[test]
    fn paths_and_names_at_the_kernel_limits_pass() {
        let root = tempfile::tempdir().unwrap();
        let roots = vec![root.path().to_owned()];
        let mut at_max = root.path().display().to_string();
        while 4095 - at_max.len() > 202 {
            at_max += &format!("/{}", "a".repeat(200));
        }
        at_max += &format!("/{}", "b".repeat(4095 - at_max.len() - 1));
        assert_eq!(at_max.len(), 4095);
        assert!(host_path("target_path", &at_max, &roots).is_ok());
        let over = format!("{at_max}c");
        let err = host_path("target_path", &over, &roots).unwrap_err();
        assert!(err.to_string().contains("at most 4095"), "{err}");
        let name = root.path().join("n".repeat(255));
        assert!(host_path("target_path", name.to_str().unwrap(), &roots).is_ok());
    }
}
