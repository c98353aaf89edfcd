//! Volume ids. A block volume id carries everything a node needs to find its device
//! again without any other state: `blk:<device-id>:<allocation>:<node-id>`.
//! The allocation part differs each time a device is handed out, so a late retry of
//! DeleteVolume for an old volume can never touch the device's next volume.

use std::fmt;

use crate::error::{Error, Result};

/// The CSI spec's recommended maximum, which Kubernetes enforces for volume handles.
pub const MAX_VOLUME_ID_LEN: usize = 128;
const PREFIX: &str = "blk";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockVolumeId {
    pub device_id: String,
    pub allocation: String,
    pub node_id: String,
}

impl fmt::Display for BlockVolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}:{}:{}:{}",
            self.device_id, self.allocation, self.node_id
        )
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
        let mut parts = id.splitn(4, ':');
        if parts.next()? != PREFIX {
            return None;
        }
        let device_id = parts.next()?;
        let allocation = parts.next()?;
        let node_id = parts.next()?;
        if !(is_token(device_id, 40) && is_token(allocation, 16) && is_token(node_id, 100)) {
            return None;
        }
        Some(BlockVolumeId {
            device_id: device_id.into(),
            allocation: allocation.into(),
            node_id: node_id.into(),
        })
    }
}

/// Node ids must fit in a volume id next to the device and allocation parts.
pub fn check_node_id(node_id: &str) -> std::result::Result<(), String> {
    if is_token(node_id, 90) {
        Ok(())
    } else {
        Err(format!(
            "node id {node_id:?} must be 1-90 characters of letters, digits, '-', '.' or '_'"
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
        };
        assert_eq!(BlockVolumeId::parse(&id.to_string()), Some(id));
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
}
