//! CSI snapshots that leave the node: a volume's files (or a raw block volume's bytes)
//! copied into a directory on a snapshot store, an NFS export or a directory every node
//! sees, with a manifest written last. The snapshot's id names the store and the
//! directory (`request::snapshot`), so any node that reaches the store restores from it
//! (`restore`) and the node that held the volume may be gone.
//!
//! Taking one is long work: a job (`take`) a repeated CreateSnapshot joins; the call
//! answers `ready_to_use: false` while it copies (the external-snapshotter polls), and
//! a driver killed meanwhile resumes the copy at the next CreateSnapshot of it. A snapshot
//! is ready exactly when its manifest exists; this node's records (`<state-dir>/snapshots/`, one file per snapshot) hold what the
//! snapshots it took are, for the calls that list them.

mod context;
pub mod restore;
mod source;
mod take;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::csi;
use crate::error::{Error, Result, SnapshotError, StoreError};
use crate::request::snapshot::{CreateSnapshot, SnapshotId, SnapshotRef};
use crate::request::VolumeRef;
use crate::runtime::overlap::VolumeGuard;
use crate::runtime::state_dir::short_hash;
use crate::volume::copy::Cloner;
use take::progress_of;

use crate::volume::snapshot_store as store;
pub use crate::volume::snapshot_store::manifest::{Content, Manifest};
pub use crate::volume::snapshot_store::SnapshotDir;
pub use context::Context;

/// How long a CreateSnapshot waits for the copy before answering `ready_to_use: false`:
/// under the csi-snapshotter's default `--timeout` of 1 minute.
pub const CREATE_WAIT: Duration = Duration::from_secs(20);
/// The longest a mounted volume's filesystem stays frozen for the last pass, unless
/// `--snapshot-freeze-limit` says otherwise.
pub const FREEZE_LIMIT: Duration = crate::volume::block::freeze::LIMIT;
/// How long a copy may go without a byte moved before CreateSnapshot answers Unavailable
/// naming the store (an NFS store's server that stopped answering), unless
/// `--snapshot-stall-limit` says otherwise.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// What this node knows of a snapshot it took (or is taking).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub id: SnapshotId,
    pub name: String,
    pub source_volume_id: VolumeRef,
    pub created_secs: i64,
    pub created_nanos: i32,
    pub size_bytes: u64,
    #[serde(default)]
    pub checksums: bool,
    /// The manifest is written: the snapshot can be restored.
    #[serde(default)]
    pub ready: bool,
    /// The SHA-256 of the manifest this node wrote: a later snapshot of the same volume
    /// takes this one as its base only while the store still holds that very manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
}

impl Record {
    fn answer(&self) -> csi::Snapshot {
        let r = self;
        let created = (r.created_secs, r.created_nanos);
        let (id, source) = (r.id.to_string(), r.source_volume_id.raw());
        answer(&id, &source, created, r.size_bytes, r.ready)
    }
}

fn answer_of(m: &Manifest) -> csi::Snapshot {
    let created = (m.created_secs, m.created_nanos);
    answer(
        &m.snapshot_id.to_string(),
        &m.source_volume_id,
        created,
        m.size_bytes,
        true,
    )
}

fn answer(
    id: &str,
    source: &str,
    (seconds, nanos): (i64, i32),
    size_bytes: u64,
    ready_to_use: bool,
) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: size_bytes as i64,
        snapshot_id: id.to_owned(),
        source_volume_id: source.to_owned(),
        creation_time: Some(prost_types::Timestamp { seconds, nanos }),
        ready_to_use,
        group_snapshot_id: String::new(),
    }
}

/// The snapshots of this node: their records, the copies running, the freeze bound.
pub struct Snapshots {
    pub(crate) records: PathBuf,
    /// Private mounts of the volumes being copied.
    work: PathBuf,
    state_dir: PathBuf,
    pub copies: Cloner,
    /// Snapshot trees being removed from their stores (DeleteSnapshot).
    pub removals: crate::volume::nfs::removal::Removals,
    pub freeze_limit: Duration,
    pub stall_limit: Duration,
    pub create_wait: Duration,
}

impl Snapshots {
    pub fn open(state_dir: &Path) -> Result<Snapshots> {
        let records = state_dir.join("snapshots");
        std::fs::create_dir_all(&records).map_err(|e| Error::io("create", &records, e))?;
        Ok(Snapshots {
            records,
            work: state_dir.join("snapshot-mnt"),
            state_dir: state_dir.to_owned(),
            copies: Cloner::default(),
            removals: Default::default(),
            freeze_limit: FREEZE_LIMIT,
            stall_limit: STALL_LIMIT,
            create_wait: CREATE_WAIT,
        })
    }

    pub fn with_freeze_limit(mut self, limit: Duration) -> Snapshots {
        self.freeze_limit = limit;
        self
    }

    pub fn with_stall_limit(mut self, limit: Duration) -> Snapshots {
        self.stall_limit = limit;
        self
    }

    pub fn with_create_wait(mut self, wait: Duration) -> Snapshots {
        self.create_wait = wait;
        self
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.records.join(format!("{}.json", short_hash(name)))
    }

    fn progress_path(&self, name: &str) -> PathBuf {
        self.records.join(format!("{}.progress", short_hash(name)))
    }

    pub fn record(&self, name: &str) -> Result<Option<Record>> {
        read_record(&self.record_path(name))
    }

    fn store(&self, rec: &Record) -> Result<()> {
        store_record(&self.record_path(&rec.name), rec)
    }

    fn forget(&self, name: &str) -> Result<()> {
        for path in [self.record_path(name), self.progress_path(name)] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io("remove", &path, e))
                }
                _ => {}
            }
        }
        self.copies.forget(&key(name));
        Ok(())
    }

    /// Start-up: the private mounts of copies a killed driver left, taken down (the next
    /// CreateSnapshot of each copies again).
    pub async fn take_down_leftovers(&self, host: &dyn crate::os::Host) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(&self.work) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            crate::volume::mounts::private::take_down(host, &dir, "source").await?;
            let _ = std::fs::remove_dir(dir.join("source"));
            let _ = std::fs::remove_dir(&dir);
        }
        Ok(())
    }

    /// Every record, by id.
    /// This node's record of the snapshot `id`, when this node took it.
    pub fn by_id(&self, id: &SnapshotId) -> Result<Option<Record>> {
        Ok(self.records()?.into_iter().find(|r| &r.id == id))
    }

    pub fn records(&self) -> Result<Vec<Record>> {
        let entries =
            std::fs::read_dir(&self.records).map_err(|e| Error::io("read", &self.records, e))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|x| x == "json") {
                if let Some(rec) = read_record(&path)? {
                    out.push(rec);
                }
            }
        }
        out.sort_by_cached_key(|r| r.id.to_string());
        Ok(out)
    }
}

fn read_record(path: &Path) -> Result<Option<Record>> {
    let Some(bytes) = crate::runtime::state_dir::read_regular(path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::State {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

fn store_record(path: &Path, rec: &Record) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(rec).map_err(|e| Error::State {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    crate::runtime::state_dir::write_atomic(path, &bytes).map_err(|e| Error::io("write", path, e))
}

fn key(name: &str) -> String {
    format!("snapshot:{name}")
}

fn now() -> (i64, i32) {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs() as i64, t.subsec_nanos() as i32)
}

/// CreateSnapshot, under the guard of its name: the record made once (same name: same
/// source and store, else AlreadyExists), then the copy started or joined.
pub async fn create(
    ctx: &Context<'_>,
    req: &CreateSnapshot,
    source_guard: Option<VolumeGuard>,
) -> Result<csi::Snapshot> {
    let rec = match ctx.snapshots.record(&req.name)? {
        Some(r) if r.source_volume_id != req.source => {
            return Err(SnapshotError::NameOfAnotherVolume {
                name: req.name.clone(),
                source_volume: r.source_volume_id.raw(),
                asked: req.source.raw(),
            }
            .into())
        }
        Some(r) if r.id != req.id => {
            return Err(SnapshotError::NameOnAnotherStore {
                name: req.name.clone(),
                id: r.id.to_string(),
            }
            .into())
        }
        Some(r) => r,
        None => {
            let size_bytes = source::size(ctx, &req.source)?;
            let (created_secs, created_nanos) = now();
            let rec = Record {
                id: req.id.clone(),
                name: req.name.clone(),
                source_volume_id: req.source.clone(),
                created_secs,
                created_nanos,
                size_bytes,
                checksums: req.checksums,
                ready: false,
                manifest_sha256: None,
            };
            ctx.snapshots.store(&rec)?;
            rec
        }
    };
    progress(ctx, rec, source_guard).await
}

/// Whether CreateSnapshot of `name` would start a copy: no ready snapshot of that name is
/// on its store and no copy of it runs. The handler then takes the source volume's guard,
/// which the copy job holds to its end (a job outlives the call that starts it).
pub async fn copy_needed(ctx: &Context<'_>, name: &str) -> Result<bool> {
    if ctx.snapshots.copies.jobs.is_running(&key(name)) {
        return Ok(false);
    }
    Ok(match ctx.snapshots.record(name)? {
        Some(rec) if rec.ready => restorable(ctx, &rec).await? != Some(true),
        _ => true,
    })
}

/// A record's snapshot as it stands: ready, or its copy started (or joined) and waited
/// for a while; a copy that moved no byte for a minute is Unavailable naming the store.
async fn progress(
    ctx: &Context<'_>,
    mut rec: Record,
    source_guard: Option<VolumeGuard>,
) -> Result<csi::Snapshot> {
    if rec.ready {
        if restorable(ctx, &rec).await? == Some(true) {
            return Ok(rec.answer());
        }
        // Its manifest went missing or bad on the store: taken again.
        tracing::warn!(snapshot = %rec.name, snapshot_id = %rec.id,
            "a ready snapshot's manifest is gone or unreadable on its store; taking it again");
        rec.ready = false;
        ctx.snapshots.store(&rec)?;
    }
    if !take::run(ctx, &rec, source_guard).await? {
        let p = progress_of(ctx, &rec);
        let stalled = p.stalled_secs();
        if stalled >= ctx.snapshots.stall_limit.as_secs() {
            let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
            return Err(SnapshotError::Stalled {
                name: rec.name,
                stalled_secs: stalled,
                store: rec.id.store_location(),
                copied_mib: mib(p.copied_bytes()),
                total_mib: mib(p.total_bytes()),
            }
            .into());
        }
        return Ok(rec.answer());
    }
    let done = ctx.snapshots.record(&rec.name)?.unwrap_or(rec);
    Ok(done.answer())
}

/// ListSnapshots: this node's snapshots (ready or still copying), or the one
/// `snapshot_id` names, from its store when this node did not take it. A snapshot is
/// ready when its store holds its manifest now; one on a store that does not answer is
/// listed not ready. A copy a killed driver left resumes at the snapshot's next
/// CreateSnapshot, which the external-snapshotter repeats until the snapshot is ready (v8.7.0
/// pkg/sidecar-controller/snapshot_controller.go `checkandUpdateContentStatusOperation`:
/// a dynamically created content is created again; only a pre-provisioned one is listed).
pub async fn list(
    ctx: &Context<'_>,
    snapshot: Option<&SnapshotRef>,
    source_volume_id: &str,
) -> Result<Vec<csi::Snapshot>> {
    let mut out = Vec::new();
    let mut unreachable = HashSet::new();
    let records = ctx.snapshots.records()?;
    for mut rec in records {
        if snapshot.is_some_and(|s| s.ours() != Some(&rec.id))
            || (!source_volume_id.is_empty() && rec.source_volume_id.raw() != source_volume_id)
        {
            continue;
        }
        if rec.ready {
            let store = Some(rec.id.store_location());
            let known_down = store.as_ref().is_some_and(|s| unreachable.contains(s));
            let answer = if known_down {
                Ok(Some(false))
            } else {
                restorable(ctx, &rec).await
            };
            match answer {
                // Removed from the store: no snapshot to list.
                Ok(None) => continue,
                Ok(Some(ready)) => rec.ready = ready,
                // A store that does not answer fails none of the others' entries, and its
                // snapshots cannot be restored until it does: listed, not ready. One
                // deadline per store and call, however many snapshots it holds.
                Err(Error::Snapshot(why @ SnapshotError::StoreUnreachable { .. })) => {
                    tracing::warn!(snapshot = %rec.name, snapshot_id = %rec.id, %why,
                        "listed as not ready: its store does not answer");
                    unreachable.extend(store);
                    rec.ready = false;
                }
                Err(e) => return Err(e),
            }
        }
        out.push(rec.answer());
    }
    if out.is_empty() && source_volume_id.is_empty() {
        if let Some(id) = snapshot.and_then(SnapshotRef::ours) {
            if let Some(m) = ctx.manifest(id).await? {
                out.push(answer_of(&m));
            }
        }
    }
    Ok(out)
}

/// Whether a record's snapshot can be restored now: its directory on the store is its own
/// and holds a manifest naming it. None: its directory is gone from the store. A store that
/// cannot be reached is an error, never an answer either way.
async fn restorable(ctx: &Context<'_>, rec: &Record) -> Result<Option<bool>> {
    Ok(ctx
        .owner(&rec.id)
        .await?
        .map(|o| matches!(o, store::Owner::Ours(Some(_)))))
}

/// GetSnapshot: as ListSnapshots of one id; NotFound when there is none.
pub async fn get(ctx: &Context<'_>, snapshot: &SnapshotRef) -> Result<csi::Snapshot> {
    list(ctx, Some(snapshot), "")
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            SnapshotError::NotFound {
                id: snapshot.to_string(),
            }
            .into()
        })
}

/// DeleteSnapshot, under the guard of its name when this node took it: refused while it
/// is being taken or a volume restores from it; its
/// directory removed from the store, then this node's record. An id this driver never
/// issued, or a snapshot gone already, is success.
pub async fn delete(ctx: &Context<'_>, snapshot: &SnapshotRef) -> Result<()> {
    let SnapshotRef::Ours(id) = snapshot else {
        return Ok(());
    };
    let rec = ctx.snapshots.by_id(id)?;
    if let Some(r) = &rec {
        if ctx.snapshots.copies.jobs.is_running(&key(&r.name)) {
            return Err(SnapshotError::BeingTaken {
                name: r.name.clone(),
            }
            .into());
        }
    }
    match ctx.owner(id).await? {
        None => restore::refuse_restoring(ctx, id).await?,
        Some(store::Owner::Foreign(why)) => {
            return Err(StoreError::Foreign {
                path: id.location(),
                id: snapshot.to_string(),
                why,
            }
            .into())
        }
        Some(_) => {
            restore::refuse_restoring(ctx, id).await?;
            take::remove_snapshot_dir(ctx, id).await?;
        }
    }
    if let Some(r) = rec {
        take::take_down_leftovers(ctx, &r).await?;
        ctx.snapshots.forget(&r.name)?;
    }
    tracing::info!(snapshot_id = %snapshot, "snapshot deleted");
    Ok(())
}
