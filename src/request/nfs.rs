//! NFS StorageClass parameters and capabilities (the volume ids: `nfs_id.rs`).

use super::nfs_options::{self, Transport};
pub use crate::csi::id::nfs::{check_dir, check_server, check_share, path_component_ok, OnDelete};
use crate::csi::volume_capability::access_mode::Mode;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};

pub const PARAM_SERVER: &str = "server";
pub const PARAM_SHARE: &str = "share";
pub const PARAM_SUB_DIR: &str = "subDir";
pub const PARAM_ON_DELETE: &str = "onDelete";

/// The default directory of a volume: its CSI name (the PV name in Kubernetes).
pub const DEFAULT_SUB_DIR: &str = "${pv.metadata.name}";
const VAR_PV_NAME: &str = "${pv.metadata.name}";
const VAR_PVC_NAME: &str = "${pvc.metadata.name}";
const VAR_PVC_NAMESPACE: &str = "${pvc.metadata.namespace}";
/// Added by external-provisioner --extra-create-metadata.
const SIDECAR_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const SIDECAR_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// The NFS parameters of a StorageClass, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsParams {
    pub server: String,
    pub share: String,
    pub sub_dir: String,
    pub on_delete: OnDelete,
}

pub(super) fn invalid(reason: String) -> Error {
    Error::invalid("parameters", reason)
}

impl NfsParams {
    /// From the driver's own parameters (already free of `,` `=` newlines and NULs).
    pub fn parse(stored: &BTreeMap<String, String>) -> Result<Self> {
        let server = stored
            .get(PARAM_SERVER)
            .ok_or_else(|| invalid("server is required for NFS volumes".into()))?;
        check_server(server).map_err(invalid)?;
        let share = stored
            .get(PARAM_SHARE)
            .ok_or_else(|| invalid("share (the exported path) is required with server".into()))?;
        let share = check_share(share).map_err(invalid)?;
        let sub_dir = stored
            .get(PARAM_SUB_DIR)
            .cloned()
            .unwrap_or_else(|| DEFAULT_SUB_DIR.into());
        check_pattern(&sub_dir)?;
        let on_delete = match stored.get(PARAM_ON_DELETE) {
            None => OnDelete::Delete,
            Some(v) => OnDelete::parse(v).ok_or_else(|| {
                invalid(format!("onDelete {v:?} must be delete, retain or archive"))
            })?,
        };
        if let Some(fs) = stored.get(crate::request::PARAM_FS_TYPE) {
            return Err(invalid(format!(
                "fsType {fs:?} does not apply to NFS volumes; drop it"
            )));
        }
        Ok(NfsParams {
            server: server.clone(),
            share,
            sub_dir,
            on_delete,
        })
    }
}

/// A pattern must name each volume uniquely: `${pv.metadata.name}`, or the claim's
/// namespace and name together.
fn check_pattern(pattern: &str) -> Result<()> {
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        let end = rest[start..]
            .find('}')
            .ok_or_else(|| invalid(format!("subDir {pattern:?}: unterminated ${{...}}")))?;
        let var = &rest[start..start + end + 1];
        if ![VAR_PV_NAME, VAR_PVC_NAME, VAR_PVC_NAMESPACE].contains(&var) {
            return Err(invalid(format!(
                "subDir {pattern:?}: unknown variable {var}; use {VAR_PV_NAME}, {VAR_PVC_NAMESPACE} or {VAR_PVC_NAME}"
            )));
        }
        rest = &rest[start + end + 1..];
    }
    let unique = pattern.contains(VAR_PV_NAME)
        || (pattern.contains(VAR_PVC_NAME) && pattern.contains(VAR_PVC_NAMESPACE));
    if !unique {
        return Err(invalid(format!(
            "subDir {pattern:?} must contain {VAR_PV_NAME}, or {VAR_PVC_NAMESPACE} and {VAR_PVC_NAME}, \
             so that two volumes never share a directory"
        )));
    }
    Ok(())
}

/// The volume's directory below the share: the pattern with its variables filled in.
pub fn expand(pattern: &str, name: &str, raw: &HashMap<String, String>) -> Result<String> {
    let lookup = |key: &str, var: &str| {
        raw.get(key).cloned().ok_or_else(|| {
            invalid(format!(
                "subDir uses {var} but the request has no {key} parameter; run \
                 external-provisioner with --extra-create-metadata"
            ))
        })
    };
    // A value is one path component: a name with '/' cannot nest directories.
    if name.contains('/') {
        return Err(Error::invalid(
            "name",
            format!("{name:?} names the volume's directory and must not contain '/'"),
        ));
    }
    let lookup = |key: &str, var: &str| {
        let v = lookup(key, var)?;
        if v.contains('/') {
            return Err(invalid(format!("{key} {v:?} must not contain '/'")));
        }
        Ok(v)
    };
    let mut dir = pattern.replace(VAR_PV_NAME, name);
    if dir.contains(VAR_PVC_NAME) {
        dir = dir.replace(VAR_PVC_NAME, &lookup(SIDECAR_PVC_NAME, VAR_PVC_NAME)?);
    }
    if dir.contains(VAR_PVC_NAMESPACE) {
        dir = dir.replace(
            VAR_PVC_NAMESPACE,
            &lookup(SIDECAR_PVC_NAMESPACE, VAR_PVC_NAMESPACE)?,
        );
    }
    let dir = dir.trim_matches('/').to_owned();
    check_dir(&dir).map_err(invalid)?;
    Ok(dir)
}

/// A capability of an NFS volume: a mount (any access mode, multi-node included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsCapability {
    pub mount_flags: Vec<String>,
    pub read_only_mode: bool,
    pub single_writer: bool,
}

/// `Ok(Err(why))`: well formed but not something an NFS volume can be.
pub fn capability(
    cap: &crate::csi::VolumeCapability,
    field: &'static str,
) -> Result<std::result::Result<NfsCapability, String>> {
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::invalid(field, "access_mode is required"))?;
    let mode = Mode::try_from(mode.mode)
        .map_err(|_| Error::invalid(field, format!("unknown access mode {}", mode.mode)))?;
    if mode == Mode::Unknown {
        return Err(Error::invalid(field, "access_mode is required"));
    }
    let m = match &cap.access_type {
        None => {
            return Err(Error::invalid(
                field,
                "access_type (mount or block) is required",
            ))
        }
        Some(crate::csi::volume_capability::AccessType::Block(_)) => {
            return Ok(Err(
                "NFS volumes are directories: raw block access is not supported".into(),
            ))
        }
        Some(crate::csi::volume_capability::AccessType::Mount(m)) => m,
    };
    if !matches!(m.fs_type.as_str(), "" | "nfs" | "nfs4") {
        return Ok(Err(format!(
            "fs_type {:?} does not apply to an NFS volume (leave it empty, or nfs)",
            m.fs_type
        )));
    }
    // Checked now so that a bad flag fails CreateVolume, not every later mount.
    nfs_options::merge(&Transport::default(), &m.mount_flags)?;
    Ok(Ok(NfsCapability {
        mount_flags: m.mount_flags.clone(),
        read_only_mode: matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly),
        single_writer: mode == Mode::SingleNodeSingleWriter,
    }))
}

pub fn required(cap: &crate::csi::VolumeCapability, field: &'static str) -> Result<NfsCapability> {
    capability(cap, field)?.map_err(|why| Error::invalid(field, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parameters_are_checked() {
        let p = NfsParams::parse(&stored(&[
            ("server", "192.0.2.1"),
            ("share", "/export/gds/"),
        ]))
        .unwrap();
        assert_eq!(p.share, "/export/gds");
        assert_eq!(p.sub_dir, DEFAULT_SUB_DIR);
        assert_eq!(p.on_delete, OnDelete::Delete);
        let p = NfsParams::parse(&stored(&[
            ("server", "[fd00::1]"),
            ("share", "/"),
            ("onDelete", "archive"),
            ("subDir", "${pvc.metadata.namespace}/${pvc.metadata.name}"),
        ]))
        .unwrap();
        assert_eq!(p.on_delete, OnDelete::Archive);
        for bad in [
            &[("server", "-oexec"), ("share", "/x")][..],
            &[("server", "a b"), ("share", "/x")],
            &[("server", "[zz::1]"), ("share", "/x")],
            &[("server", "h"), ("share", "relative")],
            &[("server", "h"), ("share", "/a/../etc")],
            &[("server", "h"), ("share", "/a/~b")],
            &[("server", "h"), ("share", "/a:b")],
            &[("server", "h")],
            &[("server", "h"), ("share", "/x"), ("onDelete", "shred")],
            &[("server", "h"), ("share", "/x"), ("subDir", "static")],
            &[
                ("server", "h"),
                ("share", "/x"),
                ("subDir", "${pvc.metadata.name}"),
            ],
            &[
                ("server", "h"),
                ("share", "/x"),
                ("subDir", "${env.HOME}/${pv.metadata.name}"),
            ],
            &[("server", "h"), ("share", "/x"), ("fsType", "ext4")],
        ] {
            assert!(
                matches!(
                    NfsParams::parse(&stored(bad)),
                    Err(Error::InvalidArgument { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn patterns_expand_to_safe_relative_paths() {
        let mut raw = HashMap::new();
        raw.insert(SIDECAR_PVC_NAME.to_string(), "data".to_string());
        raw.insert(SIDECAR_PVC_NAMESPACE.to_string(), "team-a".to_string());
        assert_eq!(expand(DEFAULT_SUB_DIR, "pvc-1", &raw).unwrap(), "pvc-1");
        assert_eq!(
            expand(
                "${pvc.metadata.namespace}/${pvc.metadata.name}",
                "pvc-1",
                &raw
            )
            .unwrap(),
            "team-a/data"
        );
        for name in ["..", "a/../b", "a/b", "a b", "x\ny", ".", "a~b"] {
            assert!(expand(DEFAULT_SUB_DIR, name, &raw).is_err(), "{name:?}");
        }
        assert!(expand(
            "${pvc.metadata.namespace}/${pvc.metadata.name}",
            "p",
            &HashMap::new()
        )
        .is_err());
    }
}
