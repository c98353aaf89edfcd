//! The ids this driver writes into CSI's `volume_id` and `snapshot_id` fields, and their
//! parsing: a leaf every layer imports, so an id read once is passed on typed. Block
//! volume ids here; NFS volume ids in `nfs`, snapshot ids in `snapshot`; `VolumeRef` says
//! which kind an id names.
//!
//! A block volume id carries everything a node needs to find its device
//! again without any other state: `blk:<device-id>:<allocation>:<node-id>`.
//! The allocation part differs each time a device is handed out, so a late retry of
//! DeleteVolume for an old volume can never touch the device's next volume.
//! A volume of the `partition` layout appends `:part` (its device id is the parent pool
//! device); ids without a fifth part are whole-device volumes, as every id issued before
//! the partition layout existed. An older driver refuses the longer id (its node part
//! would hold a ':'), so it never mistakes a partition for a whole device.

use std::fmt;

pub mod nfs;
pub mod snapshot;
pub use nfs::NfsVolumeId;
pub use snapshot::{SnapshotId, SnapshotRef};

use crate::error::{Error, Result};

/// The CSI spec's recommended maximum, which Kubernetes enforces for volume handles.
pub const MAX_VOLUME_ID_LEN: usize = 128;
const PREFIX: &str = "blk";
const PARTITION_SUFFIX: &str = "part";
/// A `stripe` volume (md RAID0): its device id is its first member's pool
/// device; the members are in its record.
const STRIPE_SUFFIX: &str = "stripe";
/// The longest layout suffix (`:stripe`), which the longest id carries.
const LONGEST_SUFFIX: usize = if STRIPE_SUFFIX.len() > PARTITION_SUFFIX.len() {
    STRIPE_SUFFIX.len()
} else {
    PARTITION_SUFFIX.len()
};
/// The longest node id: what the longest block id leaves of MAX_VOLUME_ID_LEN beside
/// `blk:`, a device id (`nvme-`/`dev-` and 16 hex digits, pool::inventory::device_id), the
/// 8-digit allocation, the separators and the longest layout suffix (`:stripe`). 86; it
/// was 90 before the partition layout and 88 before the stripe layout, whose ids of a
/// longer node would pass 128 bytes and be refused by every later call.
pub const MAX_NODE_ID_LEN: usize =
    MAX_VOLUME_ID_LEN - PREFIX.len() - 1 - 21 - 1 - 8 - 1 - 1 - LONGEST_SUFFIX;

/// Which layout owns a block volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IdLayout {
    #[default]
    Device,
    Partition,
    Stripe,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockVolumeId {
    pub device_id: String,
    pub allocation: String,
    pub node_id: String,
    pub layout: IdLayout,
}

impl fmt::Display for BlockVolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}:{}:{}:{}",
            self.device_id, self.allocation, self.node_id
        )?;
        match self.layout {
            IdLayout::Device => Ok(()),
            IdLayout::Partition => write!(f, ":{PARTITION_SUFFIX}"),
            IdLayout::Stripe => write!(f, ":{STRIPE_SUFFIX}"),
        }
    }
}

/// Refuses ids no CO would send: they name no volume and are not safe to log or use.
pub fn check_well_formed(field: &'static str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(
            field,
            "required; pass the volume_id returned by CreateVolume",
        ));
    }
    if id.len() > MAX_VOLUME_ID_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "{} bytes is longer than the {MAX_VOLUME_ID_LEN}-byte limit",
                id.len()
            ),
        ));
    }
    if id.contains("..") || id.contains('/') || id.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            "must not contain '..', '/' or control characters",
        ));
    }
    Ok(())
}

fn is_token(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

impl BlockVolumeId {
    /// `None` when the id is well formed but not one of ours: such a volume does not exist.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.splitn(5, ':');
        if parts.next()? != PREFIX {
            return None;
        }
        let device_id = parts.next()?;
        let allocation = parts.next()?;
        let node_id = parts.next()?;
        let layout = match parts.next() {
            None => IdLayout::Device,
            Some(PARTITION_SUFFIX) => IdLayout::Partition,
            Some(STRIPE_SUFFIX) => IdLayout::Stripe,
            Some(_) => return None,
        };
        if !(is_token(device_id, 40) && is_token(allocation, 16) && is_token(node_id, 100)) {
            return None;
        }
        Some(BlockVolumeId {
            device_id: device_id.into(),
            allocation: allocation.into(),
            node_id: node_id.into(),
            layout,
        })
    }
}

/// Which volume a node request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeRef {
    Block(BlockVolumeId),
    Nfs(NfsVolumeId),
    /// Well formed but not an id this driver ever issued.
    Unknown(String),
}

impl VolumeRef {
    pub fn raw(&self) -> String {
        match self {
            VolumeRef::Block(id) => id.to_string(),
            VolumeRef::Nfs(id) => id.to_string(),
            VolumeRef::Unknown(raw) => raw.clone(),
        }
    }
}

impl VolumeRef {
    /// Which kind of volume `id` names; `Unknown` for anything else, malformed included.
    pub fn of(id: &str) -> VolumeRef {
        if let Some(parsed) = BlockVolumeId::parse(id) {
            return VolumeRef::Block(parsed);
        }
        match NfsVolumeId::parse(id) {
            Some(parsed) => VolumeRef::Nfs(parsed),
            None => VolumeRef::Unknown(id.to_owned()),
        }
    }
}

/// Kept in records as the id's text, read back as what it names.
impl serde::Serialize for VolumeRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw())
    }
}

impl<'de> serde::Deserialize<'de> for VolumeRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(VolumeRef::of(&text))
    }
}

/// Node ids must fit in a volume id next to the device and allocation parts.
pub fn check_node_id(node_id: &str) -> std::result::Result<(), String> {
    if is_token(node_id, MAX_NODE_ID_LEN) {
        Ok(())
    } else {
        Err(format!(
            "node id {node_id:?} must be 1-{MAX_NODE_ID_LEN} characters of letters, digits, \
             '-', '.' or '_'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let id = BlockVolumeId {
            device_id: "dev-0123456789abcdef".into(),
            allocation: "a1b2c3d4".into(),
            node_id: "gpu-node-1.example".into(),
            layout: IdLayout::Device,
        };
        assert_eq!(BlockVolumeId::parse(&id.to_string()), Some(id.clone()));
        let part = BlockVolumeId {
            layout: IdLayout::Partition,
            ..id
        };
        assert_eq!(
            part.to_string(),
            "blk:dev-0123456789abcdef:a1b2c3d4:gpu-node-1.example:part"
        );
        assert_eq!(BlockVolumeId::parse(&part.to_string()), Some(part.clone()));
        let stripe = BlockVolumeId {
            layout: IdLayout::Stripe,
            ..part
        };
        assert!(stripe.to_string().ends_with(":gpu-node-1.example:stripe"));
        assert_eq!(BlockVolumeId::parse(&stripe.to_string()), Some(stripe));
    }

    #[test]
    fn ids_issued_before_layouts_still_mean_whole_devices() {
        let old = BlockVolumeId::parse("blk:dev-1:a1b2c3d4:node-a").unwrap();
        assert_eq!(old.layout, IdLayout::Device);
        assert_eq!(old.to_string(), "blk:dev-1:a1b2c3d4:node-a");
        assert_eq!(BlockVolumeId::parse("blk:dev-1:a1b2c3d4:node-a:raid"), None);
        assert_eq!(
            BlockVolumeId::parse("blk:dev-1:a1b2c3d4:node-a:part:x"),
            None
        );
    }

    #[test]
    fn foreign_ids_parse_to_none_and_hostile_ids_are_invalid() {
        for id in [
            "some-vol-id",
            "blk:x",
            "blk:a:b:",
            "blk:a b:c:d",
            "nfs:a:b:c",
        ] {
            assert_eq!(BlockVolumeId::parse(id), None, "{id}");
        }
        for id in ["", "blk:../x:a:n", "a/b", "a\0b", &"x".repeat(4096)] {
            assert!(check_well_formed("volume_id", id).is_err(), "{id:?}");
        }
        check_well_formed("volume_id", "blk:dev-1:a:n").unwrap();
    }

    /// A node id with a ':' would issue ids that never parse back (the volume lost to
    /// DeleteVolume), a longer one ids over the length limit: the longest allowed fits the
    /// longest block id, a stripe's.
    #[test]
    fn node_ids_must_fit_in_a_volume_id() {
        assert_eq!(MAX_NODE_ID_LEN, 86);
        for ok in ["node-a", "ip-10-0-0-1.ec2.internal", "n_1", &"n".repeat(86)] {
            check_node_id(ok).unwrap();
            for suffix in ["part", "stripe"] {
                let id = format!("blk:nvme-0123456789abcdef:01234567:{ok}:{suffix}");
                assert!(BlockVolumeId::parse(&id).is_some(), "{id}");
                check_well_formed("volume_id", &id).unwrap();
            }
        }
        for bad in ["", "a:b", "node a", "a/b", "ä", &"n".repeat(87)] {
            let err = check_node_id(bad).unwrap_err();
            assert!(err.contains("1-86 characters"), "{bad:?}: {err}");
        }
    }

    /// The limit is inclusive: an id of exactly MAX_VOLUME_ID_LEN bytes (what the NFS
    /// backend may issue) is well formed, one byte more is not.
    #[test]
    fn ids_of_the_limit_pass_one_byte_more_does_not() {
        let at = format!("blk:{}", "d".repeat(MAX_VOLUME_ID_LEN - 4));
        assert_eq!(at.len(), MAX_VOLUME_ID_LEN);
        check_well_formed("volume_id", &at).unwrap();
        let err = check_well_formed("volume_id", &format!("{at}d")).unwrap_err();
        assert!(err.to_string().contains("129 bytes"), "{err}");
    }
}
