//! The interface every volume kind implements. A handler parses the request, takes the
//! per-volume guard, picks the backend from the parsed volume id (or, for CreateVolume
//! and GetCapacity, from the parameters) and calls one of these. Backends own what they
//! need (the host port, their state, the GDS gate), never the whole driver.

use std::collections::HashMap;
use std::path::Path;

use async_trait::async_trait;

use crate::csi;
use crate::error::Result;
use crate::request::CreateVolume;

/// NodePublishVolume, parsed.
pub struct Publish<'a> {
    pub staging: &'a Path,
    pub target: &'a Path,
    pub readonly: bool,
    pub capability: Option<&'a csi::VolumeCapability>,
    pub volume_context: &'a HashMap<String, String>,
}

pub use crate::request::Expand;

/// ControllerExpandVolume's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expanded {
    pub capacity: u64,
    pub node_expansion_required: bool,
}

#[async_trait]
pub trait VolumeBackend: Send + Sync {
    /// This backend's parsed volume id.
    type Id: Send + Sync + std::fmt::Display;

    async fn create(&self, req: &CreateVolume<'_>) -> Result<csi::Volume>;
    async fn delete(&self, id: &Self::Id) -> Result<()>;
    /// ControllerExpandVolume: grows the volume's storage; idempotent.
    async fn expand(&self, id: &Self::Id, req: &Expand) -> Result<Expanded>;
    /// NodeExpandVolume at `path` (checked against the allowed roots): grows the mounted
    /// filesystem to its device; idempotent. The capacity in bytes.
    async fn node_expand(&self, id: &Self::Id, path: &Path, req: &Expand) -> Result<u64>;
    /// GetCapacity for a request whose parameters chose this backend.
    fn capacity(&self, req: &csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse>;
    /// ListVolumes entries in volume id order: those whose ids sort after `after`, at most
    /// `limit` of them (0: all). Only those are built, so a page costs the same however
    /// many volumes there are.
    fn list(&self, after: Option<&str>, limit: usize) -> Vec<(String, csi::Volume)>;
    /// ValidateVolumeCapabilities: `Ok(None)` confirms, `Ok(Some(why))` does not.
    async fn validate(
        &self,
        id: &Self::Id,
        caps: &[csi::VolumeCapability],
    ) -> Result<Option<String>>;
    async fn stage(
        &self,
        id: &Self::Id,
        staging: &Path,
        cap: Option<&csi::VolumeCapability>,
    ) -> Result<()>;
    async fn unstage(&self, id: &Self::Id, staging: &Path) -> Result<()>;
    async fn publish(&self, id: &Self::Id, req: &Publish<'_>) -> Result<()>;
    async fn unpublish(&self, id: &Self::Id, target: &Path) -> Result<()>;
    /// NodeGetVolumeStats at `path`, with the staging path when the caller gave one; both
    /// already checked against the allowed roots.
    async fn stats(
        &self,
        id: &Self::Id,
        path: &Path,
        staging: Option<&Path>,
    ) -> Result<csi::NodeGetVolumeStatsResponse>;
}

/// NodeGetVolumeStats: a healthy-looking volume that the GDS gate published in compat
/// mode is reported abnormal, with the reason (the gate's marks decide).
pub use crate::gds_gate::volume_condition as compat_condition;
