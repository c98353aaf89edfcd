//! The NFS-over-RDMA backend. A volume is a directory on an NFS export:
//! CreateVolume mounts the export under `<state-dir>/nfs-exports/<hash>` (once, kept
//! mounted) and creates the directory there with `openat`-style walks that never
//! leave the export; DeleteVolume removes, retains or archives it (`onDelete`).
//! NodeStageVolume mounts `server:/share/dir` with the merged options under the mount
//! deadline and checks in mountinfo that the kernel really negotiated RDMA on the
//! requested port; publish, unpublish and unstage work like those of block volumes.
//! Capacity is recorded, never enforced. Ids and parameters are parsed in
//! `request::nfs`; this module only acts on them.

pub mod clone;
pub mod controller;
pub mod fsops;
pub mod node;
pub mod registry;
pub mod removal;
pub mod stats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use crate::csi;
use crate::error::{CommandError, Error, MountError, Result, VolumeError};
use crate::gds::gate::GdsGate;
use crate::os::{mount, Anchored, Host, MountEntry};
use crate::pool::{Content, SourceOf};
use crate::request::{nfs_options, CreateVolume, NfsCapability};
use crate::volume::mounts::Mounter;
use crate::volume::{ContentView, Expand, Expanded, Publish, Stage, Staged, VolumeBackend};

pub use crate::request::{MountOptions, NfsParams, NfsVolumeId, OnDelete, Transport};
pub use registry::{NfsRecord, Registry};

/// The NFS state of a driver instance: where exports are mounted, the registry, and the
/// deadline of operations inside an export.
pub struct NfsStore {
    exports_dir: PathBuf,
    /// Progress records of NFS → NFS clone copies (`clone.rs`).
    clones_dir: PathBuf,
    pub registry: Registry,
    pub(crate) op_timeout: Duration,
    /// How long a clone's CreateVolume waits for its copy (`clone::CREATE_WAIT`).
    pub(crate) clone_wait: Duration,
    export_locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl NfsStore {
    /// `op_timeout` bounds each mount and each directory operation on the share.
    pub fn open(state_dir: &Path, op_timeout: Duration) -> Result<Self> {
        let exports_dir = state_dir.join("nfs-exports");
        std::fs::create_dir_all(&exports_dir)
            .map_err(|e| Error::io("creating", &exports_dir, e))?;
        Ok(NfsStore {
            exports_dir,
            clones_dir: state_dir.join("nfs-clones"),
            registry: Registry::open(state_dir)?,
            op_timeout,
            clone_wait: clone::CREATE_WAIT,
            export_locks: Mutex::default(),
        })
    }

    /// Another wait of a clone's CreateVolume for its copy (tests: 0, to see the answer
    /// of a copy that outlasts the wait without a copy that long).
    pub fn with_clone_wait(mut self, wait: Duration) -> Self {
        self.clone_wait = wait;
        self
    }
}

/// The NFS backend: its store, the host port with the allowed roots, the GDS gate.
pub struct NfsBackend {
    pub(crate) store: NfsStore,
    pub(crate) mounter: Mounter,
    pub(crate) gate: Option<Arc<GdsGate>>,
    /// The CSI driver name, the prefix of the topology keys of gated volumes.
    pub(crate) driver_name: String,
    /// NFS → NFS clone copies running as jobs (`clone.rs`).
    pub(crate) clones: Arc<crate::volume::copy::Cloner>,
    /// Clone sources' trees being measured (a block clone of an NFS directory).
    pub(crate) measures: Arc<crate::volume::copy::measure::Measures>,
    /// Volume directories being removed (DeleteVolume, a half clone's delete).
    pub(crate) removals: Arc<removal::Removals>,
}

impl NfsBackend {
    /// CreateVolume of a class whose parameters name a server.
    pub async fn create(&self, req: &CreateVolume<'_>) -> Result<csi::Volume> {
        controller::create(self, req).await
    }

    pub fn new(store: NfsStore, mut mounter: Mounter, driver_name: String) -> Self {
        mounter.unmount_step = store.op_timeout.min(mounter.unmount_step);
        NfsBackend {
            store,
            mounter,
            gate: None,
            driver_name,
            clones: Arc::default(),
            removals: Arc::default(),
            measures: Arc::default(),
        }
    }

    pub fn set_gate(&mut self, gate: Option<Arc<GdsGate>>) {
        self.gate = gate;
    }

    fn host(&self) -> &dyn Host {
        self.mounter.host.as_ref()
    }

    fn export_path(&self, id: &NfsVolumeId) -> PathBuf {
        let key = format!(
            "{}|{}",
            id.export_source(),
            id.transport.options().join(",")
        );
        self.store
            .exports_dir
            .join(crate::runtime::state_dir::short_hash(&key))
    }

    /// The export mounted (once) under the controller's working dir.
    pub(crate) async fn export_root(&self, id: &NfsVolumeId) -> Result<PathBuf> {
        let path = self.export_path(id);
        let lock = Arc::clone(
            self.store
                .export_locks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(path.clone())
                .or_default(),
        );
        let _guard = tokio::time::timeout(self.store.op_timeout, lock.lock())
            .await
            .map_err(|_| {
                Error::Command(CommandError::Timeout {
                    command: format!("waiting for the mount of {}", id.export_source()),
                    after: self.store.op_timeout,
                })
            })?;
        let host = self.host();
        let mounts = host.mount_table()?;
        if let Some(m) = mount::at(&mounts, &path) {
            if is_nfs_from(m, &id.export_source()) {
                return Ok(path);
            }
            return Err(VolumeError::ExportTaken {
                path,
                fs_type: m.fs_type.clone(),
                device: m.source.clone().unwrap_or_else(|| "?".into()),
                export: id.export_source(),
            }
            .into());
        }
        host.create_dir_all(&path)?;
        info!(export = %id.export_source(), at = %path.display(), "mounting NFS export");
        host.mount_nfs(&id.export_source(), &path, &id.transport.options())
            .await?;
        verify_mounted(
            host,
            &Anchored::unpinned(&path),
            &id.export_source(),
            &id.transport,
        )
        .await?;
        Ok(path)
    }

    /// Runs a blocking operation on the share on the blocking pool, under the deadline
    /// (a dead server stalls it; the call then answers DeadlineExceeded).
    pub(crate) async fn with_deadline<T: Send + 'static>(
        &self,
        what: String,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let timeout = self.store.op_timeout;
        match tokio::time::timeout(timeout, tokio::task::spawn_blocking(f)).await {
            Err(_) => Err(Error::Command(CommandError::Timeout {
                command: what,
                after: timeout,
            })),
            Ok(Err(join)) => Err(VolumeError::TaskFailed {
                what,
                why: join.to_string(),
            }
            .into()),
            Ok(Ok(r)) => r,
        }
    }

    /// A directory operation inside the export (`fsops`), under the deadline.
    async fn blocking<T: Send + 'static>(
        &self,
        what: String,
        f: impl FnOnce() -> std::result::Result<T, fsops::FsError> + Send + 'static,
    ) -> Result<T> {
        let context = what.clone();
        self.with_deadline(what, move || f().map_err(|e| fs_error(context, e)))
            .await
    }

    pub async fn dir_exists(&self, id: &NfsVolumeId) -> Result<bool> {
        let root = self.export_root(id).await?;
        let dir = id.dir.clone();
        self.blocking(format!("looking up {}", id.source()), move || {
            fsops::dir_exists(&root, &dir)
        })
        .await
    }
}

#[async_trait]
impl VolumeBackend for NfsBackend {
    type Id = NfsVolumeId;
    type Capability = NfsCapability;

    async fn delete(&self, id: &NfsVolumeId) -> Result<()> {
        controller::delete(self, id).await
    }

    async fn expand(&self, id: &NfsVolumeId, req: &Expand) -> Result<Expanded> {
        controller::expand(self, id, req).await
    }

    /// Never asked for by the controller (no node step); nothing to grow on the node.
    async fn node_expand(&self, id: &NfsVolumeId, _: &Path, req: &Expand) -> Result<u64> {
        if self.store.registry.get(&id.to_string()).is_none() && !self.dir_exists(id).await? {
            return Err(Error::VolumeNotFound(id.to_string()));
        }
        Ok(req.required)
    }

    fn list(&self, after: Option<&str>, limit: usize) -> Vec<(String, csi::Volume)> {
        controller::list(self, after, limit)
    }

    async fn validate(
        &self,
        id: &NfsVolumeId,
        caps: &[csi::VolumeCapability],
    ) -> Result<Option<String>> {
        controller::validate(self, id, caps).await
    }

    async fn stage(&self, id: &NfsVolumeId, req: &Stage<NfsCapability>) -> Result<Staged> {
        node::stage(self, id, req).await.map(|()| Staged::default())
    }

    async fn unstage(&self, id: &NfsVolumeId, staging: &Path) -> Result<()> {
        node::unstage(&self.mounter, id, staging).await?;
        // The gate's compat mark belongs to the staged volume; the next stage publishes anew.
        match &self.gate {
            Some(gate) => gate.forget(&id.to_string()),
            None => Ok(()),
        }
    }

    async fn publish(&self, id: &NfsVolumeId, req: &Publish<NfsCapability>) -> Result<()> {
        node::publish(self, id, req).await
    }

    async fn unpublish(&self, id: &NfsVolumeId, target: &Path) -> Result<()> {
        node::unpublish(&self.mounter, id, target).await
    }

    async fn stats(
        &self,
        id: &NfsVolumeId,
        path: &Path,
        _staging: Option<&Path>,
    ) -> Result<csi::NodeGetVolumeStatsResponse> {
        stats::stats(self, id, path).await
    }

    /// The capacity CreateVolume recorded; 0 when the record is gone (the registry is
    /// scratch: the id alone finds the directory).
    fn capacity_of(&self, id: &NfsVolumeId) -> Option<u64> {
        let rec = self.store.registry.get(&id.to_string());
        Some(rec.map_or(0, |r| r.capacity_bytes))
    }

    async fn content_view(&self, id: &NfsVolumeId) -> Result<ContentView> {
        let root = self.export_root(id).await?;
        Ok(ContentView::Tree {
            root,
            rel: id.dir.clone(),
        })
    }

    fn filling_from(&self, source: &str) -> Result<Vec<String>> {
        Ok(clone::filling_from(self, source))
    }

    fn restored_from(&self, name: &str, snapshot: &crate::csi::id::SnapshotId) -> Option<Content> {
        let (_, rec) = self.store.registry.by_name(name)?;
        match rec.source {
            Some(SourceOf::Snapshot { id, content }) if id == *snapshot && !rec.filling => {
                Some(content)
            }
            _ => None,
        }
    }
}

/// A directory operation's failure as the driver's error; `context` says what was done.
pub(crate) fn fs_error(context: String, e: fsops::FsError) -> Error {
    match e {
        fsops::FsError::NotADirectory(path) => VolumeError::UnsafeExportPath {
            what: context,
            path,
        }
        .into(),
        fsops::FsError::BadPath(path) => VolumeError::UnsafeExportPath {
            what: "refusing a path".into(),
            path,
        }
        .into(),
        fsops::FsError::Sys {
            what: op,
            path,
            errno,
        } => Error::io(op, path, std::io::Error::from_raw_os_error(errno as i32)),
    }
}

fn same_source(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        let s = s.trim_end_matches('/');
        if s.ends_with(':') {
            format!("{s}/")
        } else {
            s.to_owned()
        }
    };
    norm(a) == norm(b)
}

/// An NFS mount of exactly `source`.
pub fn is_nfs_from(m: &MountEntry, source: &str) -> bool {
    m.fs_type.starts_with("nfs") && m.source.as_deref().is_some_and(|s| same_source(s, source))
}

/// What the kernel negotiated, when RDMA was asked for and not obtained.
pub fn transport_mismatch(m: &MountEntry, t: &Transport) -> Option<String> {
    if !t.is_rdma() {
        return None;
    }
    let get = |k: &str| m.super_options.get(k).cloned().flatten();
    let proto = get("proto");
    let port = get("port");
    let want_port = t.effective_port().map(|p| p.to_string());
    let proto_ok = proto.as_deref().is_some_and(|p| p.starts_with("rdma"));
    if proto_ok && port == want_port {
        return None;
    }
    Some(format!(
        "RDMA was requested (proto={}, port={}) but the kernel negotiated proto={}, port={}",
        t.proto,
        want_port.as_deref().unwrap_or("?"),
        proto.as_deref().unwrap_or("?"),
        port.as_deref().unwrap_or("?")
    ))
}

/// After a mount: it must be there, from `source`, over RDMA when asked. Otherwise it
/// is unmounted again and the call fails with FailedPrecondition.
pub(crate) async fn verify_mounted(
    host: &dyn Host,
    pinned: &Anchored,
    source: &str,
    t: &Transport,
) -> Result<()> {
    let at = pinned.path();
    let mounts = host.mount_table()?;
    let Some(m) = mount::at(&mounts, at).filter(|m| is_nfs_from(m, source)) else {
        return Err(MountError::MissingAfterMount {
            path: at.to_owned(),
            from: format!("from {source} "),
        }
        .into());
    };
    if let Some(why) = transport_mismatch(m, t) {
        warn!(at = %at.display(), %why, "NFS mount without RDMA; unmounting");
        host.unmount(pinned).await?;
        return Err(VolumeError::NoRdma {
            why,
            source_path: source.to_owned(),
            at: at.to_owned(),
            port: t.effective_port().unwrap_or(nfs_options::RDMA_PORT),
        }
        .into());
    }
    Ok(())
}
