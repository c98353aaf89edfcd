//! The NFS-over-RDMA backend. A volume is a directory on an NFS export:
//! CreateVolume mounts the export under `<state-dir>/nfs-exports/<hash>` (once, kept
//! mounted) and creates the directory there with `openat`-style walks that never
//! leave the export; DeleteVolume removes, retains or archives it (`onDelete`).
//! NodeStageVolume mounts `server:/share/dir` with the merged options under the mount
//! deadline and checks in mountinfo that the kernel really negotiated RDMA on the
//! requested port; publish, unpublish and unstage work like those of block volumes.
//! Capacity is recorded, never enforced.

pub mod fsops;
pub mod options;
pub mod registry;
pub mod unmount;
pub mod volume;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::csi;
use crate::csi::volume_capability::access_mode::Mode as CsiMode;
use crate::csi::volume_capability::AccessType;
use crate::error::{CommandError, Error, Result};
use crate::gds_gate::Policy;
use crate::os::{mountinfo, Anchored, Host, MountEntry};
use crate::service::Driver;

pub use options::{MountOptions, Transport};
pub use registry::{NfsRecord, Registry};
pub use volume::{is_nfs, NfsParams, NfsVolumeId, OnDelete};

/// A capability of an NFS volume: a mount (any access mode, multi-node included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsCapability {
    pub mount_flags: Vec<String>,
    pub read_only_mode: bool,
    pub single_writer: bool,
}

/// `Ok(Err(why))`: well formed but not something an NFS volume can be.
pub fn capability(
    cap: &csi::VolumeCapability,
    field: &'static str,
) -> Result<std::result::Result<NfsCapability, String>> {
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::invalid(field, "access_mode is required"))?;
    let mode = CsiMode::try_from(mode.mode)
        .map_err(|_| Error::invalid(field, format!("unknown access mode {}", mode.mode)))?;
    if mode == CsiMode::Unknown {
        return Err(Error::invalid(field, "access_mode is required"));
    }
    let m = match &cap.access_type {
        None => {
            return Err(Error::invalid(
                field,
                "access_type (mount or block) is required",
            ))
        }
        Some(AccessType::Block(_)) => {
            return Ok(Err(
                "NFS volumes are directories: raw block access is not supported".into(),
            ))
        }
        Some(AccessType::Mount(m)) => m,
    };
    if !matches!(m.fs_type.as_str(), "" | "nfs" | "nfs4") {
        return Ok(Err(format!(
            "fs_type {:?} does not apply to an NFS volume (leave it empty, or nfs)",
            m.fs_type
        )));
    }
    // Checked now so that a bad flag fails CreateVolume, not every later mount.
    options::merge(&Transport::default(), &m.mount_flags)?;
    Ok(Ok(NfsCapability {
        mount_flags: m.mount_flags.clone(),
        read_only_mode: matches!(
            mode,
            CsiMode::SingleNodeReaderOnly | CsiMode::MultiNodeReaderOnly
        ),
        single_writer: mode == CsiMode::SingleNodeSingleWriter,
    }))
}

fn required(cap: &csi::VolumeCapability, field: &'static str) -> Result<NfsCapability> {
    capability(cap, field)?.map_err(|why| Error::invalid(field, why))
}

/// The node's and the controller's NFS state: where exports are mounted, the registry,
/// and the deadline of operations inside an export.
pub struct NfsBackend {
    exports_dir: PathBuf,
    pub registry: Registry,
    pub(crate) op_timeout: Duration,
    export_locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl NfsBackend {
    /// `op_timeout` bounds each mount and each directory operation on the share.
    pub fn open(state_dir: &Path, op_timeout: Duration) -> Result<Self> {
        let exports_dir = state_dir.join("nfs-exports");
        std::fs::create_dir_all(&exports_dir)
            .map_err(|e| Error::io("creating", &exports_dir, e))?;
        Ok(NfsBackend {
            exports_dir,
            registry: Registry::open(state_dir)?,
            op_timeout,
            export_locks: Mutex::default(),
        })
    }

    fn export_path(&self, id: &NfsVolumeId) -> PathBuf {
        let key = format!(
            "{}|{}",
            id.export_source(),
            id.transport.options().join(",")
        );
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        self.exports_dir.join(hex)
    }

    /// The export mounted (once) under the controller's working dir.
    async fn export_root(&self, host: &dyn Host, id: &NfsVolumeId) -> Result<PathBuf> {
        let path = self.export_path(id);
        let lock = Arc::clone(
            self.export_locks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(path.clone())
                .or_default(),
        );
        let _guard = tokio::time::timeout(self.op_timeout, lock.lock())
            .await
            .map_err(|_| {
                Error::Command(CommandError::Timeout {
                    command: format!("waiting for the mount of {}", id.export_source()),
                    after: self.op_timeout,
                })
            })?;
        let mounts = host.mount_table()?;
        if let Some(m) = mountinfo::at(&mounts, &path) {
            if is_nfs_from(m, &id.export_source()) {
                return Ok(path);
            }
            return Err(Error::FailedPrecondition(format!(
                "{} holds {} {}, not the export {}; unmount it",
                path.display(),
                m.fs_type,
                m.source.as_deref().unwrap_or("?"),
                id.export_source()
            )));
        }
        std::fs::create_dir_all(&path).map_err(|e| Error::io("creating", &path, e))?;
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

    /// Runs a directory operation on the share on the blocking pool, under the deadline
    /// (a dead server stalls it; the call then answers DeadlineExceeded).
    async fn blocking<T: Send + 'static>(
        &self,
        what: String,
        f: impl FnOnce() -> std::result::Result<T, fsops::FsError> + Send + 'static,
    ) -> Result<T> {
        match tokio::time::timeout(self.op_timeout, tokio::task::spawn_blocking(f)).await {
            Err(_) => Err(Error::Command(CommandError::Timeout {
                command: what,
                after: self.op_timeout,
            })),
            Ok(Err(join)) => Err(Error::FailedPrecondition(format!("{what}: {join}"))),
            Ok(Ok(Err(fsops::FsError::NotADirectory(p)))) => Err(Error::FailedPrecondition(
                format!("{what}: {p} in the export is a symlink or not a directory; refusing to follow it"),
            )),
            Ok(Ok(Err(fsops::FsError::Sys { what: op, path, errno }))) => Err(Error::io(
                op,
                path,
                std::io::Error::from_raw_os_error(errno as i32),
            )),
            Ok(Ok(Ok(v))) => Ok(v),
        }
    }

    pub async fn dir_exists(&self, host: &dyn Host, id: &NfsVolumeId) -> Result<bool> {
        let root = self.export_root(host, id).await?;
        let dir = id.dir.clone();
        self.blocking(format!("looking up {}", id.source()), move || {
            fsops::dir_exists(&root, &dir)
        })
        .await
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
async fn verify_mounted(
    host: &dyn Host,
    pinned: &Anchored,
    source: &str,
    t: &Transport,
) -> Result<()> {
    let at = pinned.path();
    let mounts = host.mount_table()?;
    let Some(m) = mountinfo::at(&mounts, at).filter(|m| is_nfs_from(m, source)) else {
        return Err(Error::FailedPrecondition(format!(
            "{} is not mounted from {source} after mount succeeded",
            at.display()
        )));
    };
    if let Some(why) = transport_mismatch(m, t) {
        warn!(at = %at.display(), %why, "NFS mount without RDMA; unmounting");
        host.unmount(pinned).await?;
        return Err(Error::FailedPrecondition(format!(
            "{why} for {source} at {}; unmounted. Check that the server exports over RDMA \
             (rpcrdma loaded, `rdma {}` in /proc/fs/nfsd/portlist) and that this node has an \
             RDMA device on the server's network (rdma link show)",
            at.display(),
            t.effective_port().unwrap_or(options::RDMA_PORT)
        )));
    }
    Ok(())
}

fn backend(driver: &Driver) -> Result<&NfsBackend> {
    driver.nfs.as_deref().ok_or_else(|| {
        Error::FailedPrecondition("the NFS backend is not enabled in this driver instance".into())
    })
}

// ------------------------------------------------------------------------------------
// Controller

fn fits(capacity: u64, required: u64, limit: u64) -> bool {
    capacity >= required && (limit == 0 || capacity <= limit)
}

fn volume_of(
    driver: &Driver,
    id: &str,
    rec: &NfsRecord,
    parsed: Option<&NfsVolumeId>,
) -> csi::Volume {
    let mut ctx: HashMap<String, String> = rec.parameters.clone().into_iter().collect();
    if let Some(p) = parsed {
        ctx.insert("dir".into(), p.dir.clone());
    }
    csi::Volume {
        capacity_bytes: rec.capacity_bytes as i64,
        volume_id: id.to_owned(),
        volume_context: ctx,
        content_source: None,
        // Reachable from every node that can reach the server; gated volumes only where the
        // node advertises NFS-over-RDMA GDS readiness.
        accessible_topology: crate::gds_gate::nfs_topology(&driver.name, &rec.parameters),
    }
}

/// CreateVolume of an NFS volume. `stored` are the driver's own parameters (checked by
/// `request::parameters`), `raw` all of them (for the claim's name and namespace).
pub async fn create(
    driver: &Driver,
    name: String,
    caps: &[csi::VolumeCapability],
    stored: BTreeMap<String, String>,
    raw: &HashMap<String, String>,
    required_bytes: u64,
    limit_bytes: u64,
) -> Result<csi::Volume> {
    let nfs = backend(driver)?;
    let params = NfsParams::parse(&stored)?;
    if caps.is_empty() {
        return Err(Error::invalid(
            "volume_capabilities",
            "at least one capability is required",
        ));
    }
    let mut flags = Vec::new();
    for cap in caps {
        flags.extend(required(cap, "volume_capabilities")?.mount_flags);
    }
    let merged = options::merge(&Transport::default(), &flags)?;
    let dir = volume::expand(&params.sub_dir, &name, raw)?;
    let id = NfsVolumeId::fitted(&params, dir, merged.transport)?;
    let id_text = id.to_string();
    let _guard = driver.locks.try_lock(&format!("name:{name}"))?;
    if let Some((existing, rec)) = nfs.registry.by_name(&name) {
        if existing != id_text || rec.parameters != stored {
            return Err(Error::AlreadyExists(format!(
                "volume {name:?} exists with other parameters or mount options; use another name"
            )));
        }
        if !fits(rec.capacity_bytes, required_bytes, limit_bytes) {
            return Err(Error::AlreadyExists(format!(
                "volume {name:?} exists with capacity {} bytes, outside the requested range",
                rec.capacity_bytes
            )));
        }
    }
    if let Some(other) = nfs.registry.get(&id_text).filter(|r| r.name != name) {
        return Err(Error::AlreadyExists(format!(
            "directory {} already belongs to volume {:?}",
            id.source(),
            other.name
        )));
    }
    let root = nfs.export_root(driver.host.as_ref(), &id).await?;
    let rel = id.dir.clone();
    nfs.blocking(format!("creating {}", id.source()), move || {
        fsops::ensure_dir(&root, &rel)
    })
    .await?;
    let capacity = nfs
        .registry
        .get(&id_text)
        .map(|r| r.capacity_bytes)
        .unwrap_or(required_bytes);
    let rec = NfsRecord {
        name,
        capacity_bytes: capacity,
        parameters: stored,
    };
    nfs.registry.update(|m| {
        m.insert(id_text.clone(), rec.clone());
    })?;
    info!(volume_id = %id_text, source = %id.source(), "NFS volume ready");
    Ok(volume_of(driver, &id_text, &rec, Some(&id)))
}

/// DeleteVolume: remove, retain or archive the directory per `onDelete`. Idempotent.
pub async fn delete(driver: &Driver, id: &NfsVolumeId) -> Result<()> {
    let nfs = backend(driver)?;
    let id_text = id.to_string();
    let _guard = driver.locks.try_lock(&id_text)?;
    let root = nfs.export_root(driver.host.as_ref(), id).await?;
    let rel = id.dir.clone();
    match id.on_delete {
        OnDelete::Retain => info!(volume_id = %id_text, "onDelete=retain: directory kept"),
        OnDelete::Delete => {
            nfs.blocking(format!("removing {}", id.source()), move || {
                fsops::remove_tree(&root, &rel)
            })
            .await?;
            info!(volume_id = %id_text, "directory removed");
        }
        OnDelete::Archive => {
            let suffix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
                .to_string();
            let moved = nfs
                .blocking(format!("archiving {}", id.source()), move || {
                    fsops::archive(&root, &rel, &suffix)
                })
                .await?;
            info!(volume_id = %id_text, archived_as = ?moved, "directory archived");
        }
    }
    nfs.registry.update(|m| {
        m.remove(&id_text);
    })
}

/// ValidateVolumeCapabilities: `Ok(None)` confirms, `Ok(Some(why))` does not.
pub async fn validate(
    driver: &Driver,
    id: &NfsVolumeId,
    caps: &[csi::VolumeCapability],
) -> Result<Option<String>> {
    let nfs = backend(driver)?;
    let known = nfs.registry.get(&id.to_string()).is_some();
    if !known && !nfs.dir_exists(driver.host.as_ref(), id).await? {
        return Err(Error::VolumeNotFound(id.to_string()));
    }
    for cap in caps {
        if let Err(why) = capability(cap, "volume_capabilities")? {
            return Ok(Some(why));
        }
    }
    Ok(None)
}

/// ListVolumes entries of NFS volumes, by id.
pub fn list(driver: &Driver) -> Vec<(String, csi::Volume)> {
    let Some(nfs) = driver.nfs.as_deref() else {
        return Vec::new();
    };
    nfs.registry
        .snapshot()
        .into_iter()
        .map(|(id, rec)| {
            let parsed = NfsVolumeId::parse(&id);
            let v = volume_of(driver, &id, &rec, parsed.as_ref());
            (id, v)
        })
        .collect()
}

// ------------------------------------------------------------------------------------
// Node

/// NodeStageVolume: mount `server:/share/dir` at the staging path.
pub async fn stage(
    driver: &Driver,
    id: &NfsVolumeId,
    staging: &Path,
    cap: &csi::VolumeCapability,
) -> Result<()> {
    backend(driver)?;
    let cap = required(cap, "volume_capability")?;
    let opts = options::merge(&id.transport, &cap.mount_flags)?;
    let source = id.source();
    let mounts = driver.host.mount_table()?;
    if let Some(m) = mountinfo::at(&mounts, staging) {
        if !is_nfs_from(m, &source) {
            return Err(Error::FailedPrecondition(format!(
                "staging path {} already has another filesystem mounted ({} {}); unmount it first",
                staging.display(),
                m.fs_type,
                m.source.as_deref().unwrap_or("?")
            )));
        }
        if let Some(why) = transport_mismatch(m, &opts.transport) {
            return Err(Error::FailedPrecondition(format!(
                "{} is staged but {why}; unstage it",
                staging.display()
            )));
        }
        return Ok(());
    }
    // Created and checked beneath the root like a block staging path; mount.nfs then
    // resolves the path once more by name (the window docs/design.md describes).
    let pinned = crate::block::mount_dir(driver, "staging_target_path", staging, None)?;
    info!(volume_id = %id, %source, options = %opts.to_vec().join(","), "mounting NFS volume");
    driver
        .host
        .mount_nfs(&source, staging, &opts.to_vec())
        .await?;
    let verified = verify_mounted(driver.host.as_ref(), &pinned, &source, &opts.transport).await;
    if verified.is_err() {
        // Never leave a mount behind on a failed call.
        if let Err(e) = driver.host.unmount(&pinned).await {
            warn!(staging = %staging.display(), error = %e, "unmounting after a failed stage");
        }
    }
    verified
}

/// NodeUnstageVolume: unmount the staging path if it holds this volume.
pub async fn unstage(driver: &Driver, id: &NfsVolumeId, staging: &Path) -> Result<()> {
    let source = id.source();
    crate::block::unmount_ours(
        driver,
        "staging_target_path",
        staging,
        &id.to_string(),
        |m, _| is_nfs_from(m, &source),
    )
    .await
    .map(drop)
}

/// NodeUnpublishVolume: unmount this volume's bind at the target, remove what publish
/// created.
pub async fn unpublish(driver: &Driver, id: &NfsVolumeId, target: &Path) -> Result<()> {
    let source = id.source();
    crate::block::unpublish(driver, &id.to_string(), target, |m, _| {
        is_nfs_from(m, &source)
    })
    .await
}

/// NodePublishVolume: bind the staged mount to the target.
pub async fn publish(
    driver: &Driver,
    id: &NfsVolumeId,
    staging: &Path,
    target: &Path,
    readonly: bool,
    cap: &csi::VolumeCapability,
    volume_context: &HashMap<String, String>,
) -> Result<()> {
    backend(driver)?;
    let cap = required(cap, "volume_capability")?;
    let readonly = readonly || cap.read_only_mode;
    let source = id.source();
    let mounts = driver.host.mount_table()?;
    let staged = mountinfo::at(&mounts, staging)
        .filter(|m| is_nfs_from(m, &source))
        .cloned();
    // A bind mount of this volume shows the volume's own source.
    if crate::block::already_published(&mounts, target, readonly, |m| is_nfs_from(m, &source))? {
        return Ok(());
    }
    let Some(staged) = staged else {
        return Err(Error::FailedPrecondition(format!(
            "volume {id} is not staged at {}; call NodeStageVolume first",
            staging.display()
        )));
    };
    if cap.single_writer {
        if let Some(other) = mounts.iter().find(|m| {
            // NFS superblocks (and mountinfo roots) are shared between mounts of one
            // server, the controller's export mount included: the source tells this
            // volume's mounts apart (a bind mount shows its origin's source).
            m.major == staged.major
                && m.minor == staged.minor
                && is_nfs_from(m, &source)
                && m.mount_point != staging
        }) {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is SINGLE_NODE_SINGLE_WRITER and already published at {}",
                other.mount_point.display()
            )));
        }
    }
    if let Some(gate) = &driver.gds_gate {
        let policy = Policy::from_parameters(volume_context.iter())?;
        let mounted = crate::gds_gate::MountedVolume::nfs(id.to_string(), staging);
        gate.check_publish(&mounted, policy).await?;
    }
    // Both ends pinned beneath the root: the source must still be this volume's mount.
    let pinned_staging = crate::os::safepath::open(
        "staging_target_path",
        &driver.allowed_roots,
        staging,
        crate::os::safepath::Create::Nothing,
        None,
    )?
    .ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "volume {id} is not staged at {}; call NodeStageVolume first",
            staging.display()
        ))
    })?;
    let pinned_target =
        crate::block::mount_dir(driver, "target_path", target, Some(&id.to_string()))?;
    let opts: Vec<String> = if readonly { vec!["ro".into()] } else { vec![] };
    driver
        .host
        .bind_mount(&pinned_staging, &pinned_target, &opts)
        .await
}

/// NodeGetVolumeStats of an NFS volume (statvfs under the deadline: a dead server
/// would stall it).
pub async fn stats(
    driver: &Driver,
    id: &NfsVolumeId,
    volume_path: &Path,
) -> Result<csi::NodeGetVolumeStatsResponse> {
    let nfs = backend(driver)?;
    if !volume_path.is_absolute() || !volume_path.exists() {
        return Err(Error::NotFound(format!(
            "volume {id} is not published or staged at {}",
            volume_path.display()
        )));
    }
    let mounts = driver.host.mount_table()?;
    let Some(entry) = mountinfo::at(&mounts, volume_path)
        .filter(|m| m.fs_type.starts_with("nfs"))
        .cloned()
    else {
        return Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![],
            volume_condition: Some(csi::VolumeCondition {
                abnormal: true,
                message: format!(
                    "{} exists but the volume is no longer mounted there",
                    volume_path.display()
                ),
            }),
        });
    };
    let path = volume_path.to_owned();
    let st = nfs
        .blocking(format!("statvfs {}", path.display()), move || {
            nix::sys::statvfs::statvfs(&path).map_err(|errno| fsops::FsError::Sys {
                what: "statvfs",
                path: path.display().to_string(),
                errno,
            })
        })
        .await;
    let st = match st {
        Ok(st) => st,
        Err(e) => {
            return Ok(csi::NodeGetVolumeStatsResponse {
                usage: vec![],
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: true,
                    message: format!("the NFS server does not answer: {e}"),
                }),
            })
        }
    };
    let frsize = st.fragment_size() as i64;
    let usage = vec![
        csi::VolumeUsage {
            available: st.blocks_available() as i64 * frsize,
            total: st.blocks() as i64 * frsize,
            used: (st.blocks() - st.blocks_free()) as i64 * frsize,
            unit: csi::volume_usage::Unit::Bytes as i32,
        },
        csi::VolumeUsage {
            available: st.files_available() as i64,
            total: st.files() as i64,
            used: st.files() as i64 - st.files_free() as i64,
            unit: csi::volume_usage::Unit::Inodes as i32,
        },
    ];
    let condition = if transport_mismatch(&entry, &id.transport).is_some() {
        csi::VolumeCondition {
            abnormal: true,
            message: "mounted without RDMA".into(),
        }
    } else {
        csi::VolumeCondition {
            abnormal: false,
            message: "mounted".into(),
        }
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(crate::gds_gate::volume_condition(
            driver.gds_gate.as_deref(),
            &id.to_string(),
            condition,
        )),
    })
}
