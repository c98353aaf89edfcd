//! StorageClass parameters: which the driver knows, each value checked, and what they
//! make of a volume (filesystem, block layout, stripe geometry, dataset).

use std::collections::{BTreeMap, HashMap};

use super::nfs::{PARAM_ON_DELETE, PARAM_SERVER, PARAM_SHARE, PARAM_SUB_DIR};
use super::{dataset, stripe, NfsVolumeId, StripeParams};
use crate::error::{Error, Result};
use crate::os::FsType;

/// StorageClass parameters the driver understands.
pub const PARAM_FS_TYPE: &str = "fsType";
pub const PARAM_GDS_POLICY: &str = "gdsPolicy";
/// What a block volume is made of: `device` (a whole pool device, the default),
/// `partition` (a GPT partition carved from a pool device) or `stripe` (md RAID0 over
/// partitions of distinct pool devices).
pub const PARAM_LAYOUT: &str = "layout";
/// How a clone is checked before it may be published: `sizes` or `checksum`.
pub const PARAM_VERIFY: &str = "verify";
// NFS volumes (a volume whose parameters carry `server` is an NFS volume).
const NFS_ONLY_PARAMETERS: &[&str] = &[PARAM_SHARE, PARAM_SUB_DIR, PARAM_ON_DELETE];
const KNOWN_PARAMETERS: &[&str] = &[
    PARAM_FS_TYPE,
    PARAM_GDS_POLICY,
    PARAM_LAYOUT,
    PARAM_SERVER,
    PARAM_SHARE,
    PARAM_SUB_DIR,
    PARAM_ON_DELETE,
    stripe::PARAM_STRIPE_COUNT,
    stripe::PARAM_STRIPE_CHUNK,
    PARAM_VERIFY,
    dataset::PARAM_SERVER,
    dataset::PARAM_SHARE,
    dataset::PARAM_PATH,
    dataset::PARAM_PROTO,
    dataset::PARAM_PORT,
    dataset::PARAM_VERS,
];
/// Parameters the Kubernetes sidecars add themselves (PVC name and namespace, ...).
const SIDECAR_PREFIX: &str = "csi.storage.k8s.io/";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeParameters {
    pub fs_type: Option<FsType>,
    pub layout: LayoutKind,
    /// The md RAID0 geometry of `layout: stripe`; None for every other layout.
    pub stripe: Option<StripeParams>,
    /// The driver's own parameters (sidecar-added ones dropped), kept with the volume.
    pub stored: BTreeMap<String, String>,
    /// The NFS directory every volume of a block class is cloned from (`dataset*`).
    pub dataset: Option<NfsVolumeId>,
}

pub fn parameters(params: &HashMap<String, String>) -> Result<VolumeParameters> {
    let stored = own_parameters(params)?;
    check_nfs_only_on_nfs(&stored)?;
    let fs_type = fs_type(&stored)?;
    check_gds_policy(&stored)?;
    check_verify(&stored)?;
    let layout = layout_kind(&stored)?;
    let stripe = stripe::stripe_params(&stored, layout == LayoutKind::Stripe)?;
    if stored.contains_key(PARAM_SERVER) && stored.contains_key(PARAM_LAYOUT) {
        return Err(Error::invalid(
            "parameters.layout",
            "applies to block volumes only; drop it from an NFS class (one with server)",
        ));
    }
    let dataset = block_dataset(&stored)?;
    Ok(VolumeParameters {
        fs_type,
        layout,
        stripe,
        stored,
        dataset,
    })
}

/// The NFS-only parameters appear only beside `server`.
fn check_nfs_only_on_nfs(stored: &BTreeMap<String, String>) -> Result<()> {
    if stored.contains_key(PARAM_SERVER) {
        return Ok(());
    }
    match NFS_ONLY_PARAMETERS
        .iter()
        .find(|k| stored.contains_key(**k))
    {
        Some(k) => Err(Error::invalid(
            "parameters",
            format!("{k} applies to NFS volumes only; add server (and share) or drop it"),
        )),
        None => Ok(()),
    }
}

/// The `fsType` parameter, parsed; None when absent.
fn fs_type(stored: &BTreeMap<String, String>) -> Result<Option<FsType>> {
    let Some(v) = stored.get(PARAM_FS_TYPE) else {
        return Ok(None);
    };
    let fs_type = FsType::parse(v).ok_or_else(|| {
        Error::invalid(
            "parameters",
            format!(
                "fsType {v:?} is not supported; use one of {}",
                FsType::SUPPORTED
            ),
        )
    })?;
    Ok(Some(fs_type))
}

fn check_gds_policy(stored: &BTreeMap<String, String>) -> Result<()> {
    match stored.get(PARAM_GDS_POLICY) {
        Some(policy) if !matches!(policy.as_str(), "required" | "preferred" | "disabled") => {
            Err(Error::invalid(
                "parameters",
                format!("gdsPolicy {policy:?} must be required, preferred or disabled"),
            ))
        }
        _ => Ok(()),
    }
}

fn check_verify(stored: &BTreeMap<String, String>) -> Result<()> {
    match stored.get(PARAM_VERIFY) {
        Some(v) if !matches!(v.as_str(), "sizes" | "checksum") => Err(Error::invalid(
            "parameters.verify",
            format!("{v:?} must be sizes or checksum"),
        )),
        _ => Ok(()),
    }
}

/// The dataset a block class fills its volumes from; an NFS class (one with `server`)
/// may name none.
fn block_dataset(stored: &BTreeMap<String, String>) -> Result<Option<NfsVolumeId>> {
    let dataset = dataset::parse(stored)?;
    if dataset.is_some() && stored.contains_key(PARAM_SERVER) {
        return Err(Error::invalid(
            "parameters.datasetServer",
            "a dataset fills block volumes; drop the dataset parameters from an NFS class \
             (one with server)",
        ));
    }
    Ok(dataset)
}

/// Which block layout a volume uses (StorageClass parameter `layout`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LayoutKind {
    /// The volume is one whole pool device (the default: it writes no partition table on
    /// any device, and an id without a layout suffix is one).
    #[default]
    Device,
    /// The volume is a GPT partition carved from a pool device.
    Partition,
    /// The volume is md RAID0 over equal partitions of distinct pool devices.
    Stripe,
}

/// The `layout` parameter; absent means `device`.
pub fn layout_kind(params: &BTreeMap<String, String>) -> Result<LayoutKind> {
    match params.get(PARAM_LAYOUT).map(String::as_str) {
        None | Some("device") => Ok(LayoutKind::Device),
        Some("partition") => Ok(LayoutKind::Partition),
        Some("stripe") => Ok(LayoutKind::Stripe),
        Some(other) => Err(Error::invalid(
            "parameters.layout",
            format!("{other:?} is not a layout; use device, partition or stripe"),
        )),
    }
}

/// The driver's own parameters: every key known (sidecar-added ones dropped), no value
/// that could smuggle a second option into a mount or mkfs.
fn own_parameters(params: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    let mut unknown: Vec<&str> = params
        .keys()
        .map(String::as_str)
        .filter(|k| !k.starts_with(SIDECAR_PREFIX) && !KNOWN_PARAMETERS.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(Error::invalid(
            "parameters",
            format!(
                "unknown parameters {unknown:?}; supported: {}",
                KNOWN_PARAMETERS.join(", ")
            ),
        ));
    }
    let mut stored = BTreeMap::new();
    for (key, value) in params
        .iter()
        .filter(|(k, _)| !k.starts_with(SIDECAR_PREFIX))
    {
        if value.contains([',', '=', '\n', '\0']) {
            return Err(Error::invalid(
                "parameters",
                format!("{key}: value {value:?} must not contain ',', '=', newlines or NUL"),
            ));
        }
        stored.insert(key.clone(), value.clone());
    }
    Ok(stored)
}

/// Whether the parameters ask for an NFS volume (they name a server).
pub fn is_nfs(params: &HashMap<String, String>) -> bool {
    params.contains_key(PARAM_SERVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_parameters_are_listed_by_name_and_injection_refused() {
        let mut p = HashMap::new();
        p.insert("fsType".to_string(), "xfs".to_string());
        p.insert("csi.storage.k8s.io/pvc/name".to_string(), "x".to_string());
        let parsed = parameters(&p).unwrap();
        assert_eq!(parsed.fs_type, Some(FsType::Xfs));
        assert_eq!(parsed.stored.len(), 1);
        p.insert("zeta".into(), "1".into());
        p.insert("alpha".into(), "1".into());
        let err = parameters(&p).unwrap_err().to_string();
        assert!(err.contains(r#"["alpha", "zeta"]"#), "{err}");
        let mut inj = HashMap::new();
        inj.insert("gdsPolicy".to_string(), "required,exec".to_string());
        assert!(parameters(&inj).is_err());
    }

    #[test]
    fn layout_parameter_is_typed_and_defaults_to_device() {
        let with = |v: Option<&str>| {
            let mut m = HashMap::new();
            if let Some(v) = v {
                m.insert(PARAM_LAYOUT.to_owned(), v.to_owned());
            }
            parameters(&m)
        };
        assert_eq!(with(None).unwrap().layout, LayoutKind::Device);
        assert_eq!(with(Some("device")).unwrap().layout, LayoutKind::Device);
        assert_eq!(
            with(Some("partition")).unwrap().layout,
            LayoutKind::Partition
        );
        let mut nfs = HashMap::new();
        nfs.insert(PARAM_LAYOUT.to_owned(), "partition".to_owned());
        nfs.insert(PARAM_SERVER.to_owned(), "10.0.0.1".to_owned());
        nfs.insert("share".to_owned(), "/export".to_owned());
        let err = parameters(&nfs).unwrap_err().to_string();
        assert!(err.contains("parameters.layout"), "{err}");
        for bad in ["Partition", "raid0", ""] {
            let err = with(Some(bad)).unwrap_err().to_string();
            assert!(err.contains("parameters.layout"), "{bad:?}: {err}");
        }
    }
}
