//! The interface every volume kind implements: what a handler calls once the request is
//! parsed (`request::node` for node calls), the per-volume guard is taken and the volume
//! id has picked the backend (`service::Driver::route`). CreateVolume and GetCapacity are
//! not here: their parameters, not an id, pick the backend. Backends own what they need
//! (the host port, their state, the GDS gate), never the whole driver.

pub mod block;
pub mod copy;
pub mod mounts;
pub mod nfs;
pub mod populate;
pub mod snapshot_store;

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::csi;
use crate::error::Result;
use crate::os::FsType;
use crate::pool::Content;

pub use crate::request::node::{Publish, Stage};
pub use crate::request::Expand;

/// How a volume's content is read for a copy of it taken now (a snapshot's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentView {
    /// A filesystem volume's device, nothing using it: mounted read-only privately.
    Unmounted { dev: PathBuf, fs: FsType },
    /// A filesystem volume mounted at `at` (staged): copied live, then frozen.
    Mounted {
        at: PathBuf,
        dev: (u32, u32),
        fs: FsType,
    },
    /// A volume without a filesystem: its device's first `bytes`.
    Device {
        path: PathBuf,
        dev: (u32, u32),
        bytes: u64,
    },
    /// A directory `rel` below the export mounted at `root` (an NFS volume's).
    Tree { root: PathBuf, rel: String },
}

/// ControllerExpandVolume's answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expanded {
    pub capacity: u64,
    pub node_expansion_required: bool,
}

/// What a NodeStage leaves the handler to finish: the snapshot a volume was restored
/// from, now filled, whose restore mark can come off the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Staged {
    pub restored_from: Option<crate::csi::id::SnapshotId>,
}

#[async_trait]
pub trait VolumeBackend: Send + Sync {
    /// This backend's parsed volume id.
    type Id: Send + Sync + std::fmt::Display;
    /// A node call's volume capability, parsed by this backend's rules.
    type Capability: Send + Sync;

    async fn delete(&self, id: &Self::Id) -> Result<()>;
    /// ControllerExpandVolume: grows the volume's storage; idempotent.
    async fn expand(&self, id: &Self::Id, req: &Expand) -> Result<Expanded>;
    /// NodeExpandVolume at `path` (checked against the allowed roots): grows the mounted
    /// filesystem to its device; idempotent. The capacity in bytes.
    async fn node_expand(&self, id: &Self::Id, path: &Path, req: &Expand) -> Result<u64>;
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
    async fn stage(&self, id: &Self::Id, req: &Stage<Self::Capability>) -> Result<Staged>;
    async fn unstage(&self, id: &Self::Id, staging: &Path) -> Result<()>;
    async fn publish(&self, id: &Self::Id, req: &Publish<Self::Capability>) -> Result<()>;
    async fn unpublish(&self, id: &Self::Id, target: &Path) -> Result<()>;
    /// NodeGetVolumeStats at `path`, with the staging path when the caller gave one; both
    /// already checked against the allowed roots.
    async fn stats(
        &self,
        id: &Self::Id,
        path: &Path,
        staging: Option<&Path>,
    ) -> Result<csi::NodeGetVolumeStatsResponse>;

    /// The volume's capacity in bytes, the smallest volume a copy of it fills; None when
    /// it is no volume here.
    fn capacity_of(&self, id: &Self::Id) -> Option<u64>;
    /// How the volume's content can be read now for a copy of it; a volume whose content
    /// cannot be read consistently now (being deleted, not filled yet, in use where no
    /// freeze can help) is refused, saying why.
    async fn content_view(&self, id: &Self::Id) -> Result<ContentView>;
    /// This backend's volumes being filled from `source` (a volume or snapshot id) now.
    fn filling_from(&self, source: &str) -> Result<Vec<String>>;
    /// What snapshot `snapshot` holds, when the volume named `name` was restored from it
    /// and holds it whole already (a repeated CreateVolume answers that volume even after
    /// the snapshot was deleted); None otherwise.
    fn restored_from(&self, name: &str, snapshot: &crate::csi::id::SnapshotId) -> Option<Content>;
}

/// NodeGetVolumeStats: a healthy-looking volume that the GDS gate published in compat
/// mode is reported abnormal, with the reason (the gate's marks decide).
pub use crate::gds::gate::volume_condition as compat_condition;
