//! NFS → NFS clones: a CreateVolume whose `volume_content_source.volume` is
//! another NFS volume of this driver copies the source's directory into the new one, on
//! the export(s), before the volume is answered.
//!
//! Both directories are reached through the controller's export mounts
//! (`NfsBackend::export_root`), each from its own id, so the source and the clone may be
//! on different exports or servers. They are opened with `openat` walks that never
//! follow a symlink (`fsops`), and the tree is copied by the engine in `src/volume/copy/`
//! (symlinks copied as links, hard links, owners, modes, times, holes; verified by
//! sizes, or by checksums with the class's `verify: checksum`), with its progress in
//! `<state-dir>/nfs-clones/` so a restarted driver resumes.
//!
//! The copy is a job: a CreateVolume that cannot see it end within `CREATE_WAIT`
//! answers Unavailable with the progress as its message, which the external-provisioner
//! retries with the same name (external-provisioner v6.4.0 pkg/controller/controller.go
//! `checkError`: Unavailable, DeadlineExceeded, Aborted and Canceled are
//! `ProvisioningInBackground`, retried until a final answer even when the claim is
//! deleted meanwhile, so no volume leaks); the retry joins the running copy. The volume
//! is recorded `filling` before its directory is made and until the copy completed and
//! was verified: a filling volume is never answered as a volume, and DeleteVolume
//! removes its directory whatever `onDelete` says.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::{fs_error, fsops, NfsBackend, NfsRecord, NfsVolumeId};
use crate::csi;
use crate::error::{CloneError, Error, Result};
use crate::pool::SourceOf;
use crate::request::snapshot::{Content, Restore};
use crate::request::{self, CreateVolume, VolumeRef};
use crate::volume::copy::{copy_tree_at, CopyRequest, Progress, Verify};

/// How long CreateVolume waits for the copy before answering Unavailable with the
/// progress: under the external-provisioner's default `--timeout` of 10 s
/// (cmd/csi-provisioner/csi-provisioner.go `operationTimeout`), so the answer arrives
/// before the sidecar gives up on the call.
pub const CREATE_WAIT: Duration = Duration::from_secs(8);

const FIELD: &str = "volume_content_source.volume.volume_id";

fn key(id: &str) -> String {
    format!("nfs-clone:{id}")
}

fn progress_path(b: &NfsBackend, id: &str) -> PathBuf {
    let hex = crate::runtime::state_dir::short_hash(id);
    b.store.clones_dir.join(format!("{hex}.json"))
}

/// The source of a clone, checked: an NFS volume of this driver that exists, is not a
/// clone still filling and is not the clone's own directory or one nested with it.
/// Returns it with its recorded capacity (0 when no record says).
pub async fn check_source(
    b: &NfsBackend,
    volume: &VolumeRef,
    target: &NfsVolumeId,
) -> Result<(NfsVolumeId, u64)> {
    let source = &volume.raw();
    let not_found = || CloneError::SourceMissing {
        field: FIELD,
        origin: source.to_owned(),
    };
    let VolumeRef::Nfs(src) = volume else {
        return Err(not_found().into());
    };
    let src = src.clone();
    if src.export_source() == target.export_source() && nested(&src.dir, &target.dir) {
        return Err(Error::invalid(
            FIELD,
            format!(
                "the clone's directory {} and its source {} are the same or nested; \
                 change the class's subDir so that each volume has its own directory",
                target.source(),
                src.source()
            ),
        ));
    }
    let capacity = match b.store.registry.get(source) {
        Some(rec) if rec.filling => {
            return Err(CloneError::SourceCopying {
                field: FIELD,
                origin: source.to_owned(),
            }
            .into())
        }
        Some(rec) => rec.capacity_bytes,
        None if b.dir_exists(&src).await? => 0,
        None => return Err(not_found().into()),
    };
    Ok((src, capacity))
}

fn nested(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_matches('/'), b.trim_matches('/'));
    let under = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
    under(a, b) || under(b, a)
}

/// The clone's smallest size: the source's recorded capacity, which must fit `limit`.
pub fn capacity(req: &CreateVolume<'_>, source: &str, source_bytes: u64) -> Result<u64> {
    if req.limit_bytes != 0 && req.limit_bytes < source_bytes {
        return Err(CloneError::LimitBelowSource {
            origin: source.to_owned(),
            bytes: source_bytes,
            limit: req.limit_bytes,
        }
        .into());
    }
    Ok(req.required_bytes.max(source_bytes))
}

/// CreateVolume of a clone after the generic checks: records it `filling`, runs (or
/// joins) the copy, and records it complete once the copy is verified.
pub async fn create(
    b: &NfsBackend,
    req: &CreateVolume<'_>,
    id: &NfsVolumeId,
    source: &VolumeRef,
) -> Result<NfsRecord> {
    if let Some(rec) = copied_already(b, id) {
        return Ok(rec);
    }
    let (src, source_bytes) = check_source(b, source, id).await?;
    let of = SourceOf::Volume(source.clone());
    fill(b, req, id, of, Some(src), source_bytes, Vec::new()).await
}

/// Copied already (check_existing compared name, parameters and source): the same
/// answer, even if the source has gone since.
fn copied_already(b: &NfsBackend, id: &NfsVolumeId) -> Option<NfsRecord> {
    b.store.registry.get(&id.to_string()).filter(|r| !r.filling)
}

/// CreateVolume restoring a snapshot: its file tree on an NFS store copied as a clone's
/// source is; an empty snapshot gives an empty directory. A snapshot on a directory store
/// (one node's) and a raw block snapshot restore into block classes only.
pub async fn restore(
    b: &NfsBackend,
    req: &CreateVolume<'_>,
    id: &NfsVolumeId,
    restore: &Restore,
) -> Result<NfsRecord> {
    if let Some(rec) = copied_already(b, id) {
        return Ok(rec);
    }
    let field = "volume_content_source.snapshot.snapshot_id";
    let src = match (restore.content, restore.nfs_tree()) {
        (Content::Device, _) => {
            return Err(Error::invalid(
                field,
                format!(
                    "snapshot {} holds a raw block volume's bytes: restore it into a block class with block access (Kubernetes: volumeMode: Block)",
                    restore.text
                ),
            ))
        }
        (_, None) => {
            return Err(Error::invalid(
                field,
                format!(
                    "snapshot {} is kept in a directory of a node ({}), which NFS volumes cannot read: restore it into a block class, or take snapshots for NFS volumes with a class whose store is an NFS export (storeServer)",
                    restore.text,
                    restore.id.store_location()
                ),
            ))
        }
        (Content::Empty, Some(_)) => None,
        (Content::Files, Some(tree)) => Some(tree),
    };
    let digests = restore.digests.clone();
    let of = SourceOf::Snapshot {
        id: restore.id.clone(),
        content: restore.content,
    };
    fill(b, req, id, of, src, restore.size_bytes, digests).await
}

/// Records the volume `filling`, copies `src` (None: nothing to copy) into its
/// directory as a job, and records it complete once the copy is verified.
async fn fill(
    b: &NfsBackend,
    req: &CreateVolume<'_>,
    id: &NfsVolumeId,
    source: SourceOf,
    src: Option<NfsVolumeId>,
    source_bytes: u64,
    digests: Vec<(String, String)>,
) -> Result<NfsRecord> {
    let id_text = id.to_string();
    let existing = b.store.registry.get(&id_text);
    let origin = source.id().to_owned();
    let capacity = capacity(req, &origin, source_bytes)?;
    let target_root = b.export_root(id).await?;
    if existing.is_none() {
        refuse_foreign_content(b, &target_root, id).await?;
    }
    let rec = NfsRecord {
        name: req.name.clone(),
        capacity_bytes: existing.map_or(capacity, |r| r.capacity_bytes.max(capacity)),
        parameters: req.params.stored.clone(),
        source: Some(source),
        filling: true,
    };
    // Recorded before the directory exists: a crash from here on leaves a record that a
    // retry resumes and DeleteVolume cleans up.
    b.store.registry.put(&id_text, &rec)?;
    let Some(src) = src else {
        let rel = id.dir.clone();
        b.blocking(format!("creating {}", id.source()), move || {
            fsops::ensure_dir(&target_root, &rel)
        })
        .await?;
        return record_done(b, &id_text, rec);
    };
    let source_root = b.export_root(&src).await?;
    let label = src.source();
    let progress = b
        .clones
        .progress(&key(&id_text), &id_text, progress_path(b, &id_text), &label);
    let copy = Copy {
        target: (target_root, id.dir.clone()),
        source: (source_root, src.dir.clone()),
        req: copy_request(req, id, label),
        digests,
        origin,
    };
    let job = copy.run(Arc::clone(&progress), id_text.clone());
    b.clones
        .run(&key(&id_text), &progress, b.store.clone_wait, job)
        .await?;
    record_done(b, &id_text, rec)
}

/// The copy of source `label` into clone `id`'s directory, as its progress shows them.
fn copy_request(req: &CreateVolume<'_>, id: &NfsVolumeId, label: String) -> CopyRequest {
    CopyRequest {
        source: PathBuf::from(&label),
        target: PathBuf::from(id.source()),
        label,
        streams: crate::volume::copy::STREAMS,
        chunk: crate::volume::copy::CHUNK,
        verify: verify_of(req),
        live: false,
        target_reused: false,
        base: None,
        extents: None,
    }
}

/// The copy completed and was verified: the record stops saying `filling`.
fn record_done(b: &NfsBackend, id_text: &str, rec: NfsRecord) -> Result<NfsRecord> {
    let done = NfsRecord {
        filling: false,
        ..rec
    };
    let recorded = b.store.registry.modify(id_text, |r| *r = done.clone())?;
    forget_progress(b, id_text);
    if !recorded {
        return Err(CloneError::DeletedWhileCopying {
            volume: id_text.to_owned(),
        }
        .into());
    }
    info!(volume_id = %id_text, source = ?done.source, "NFS clone copied and verified");
    Ok(done)
}

/// A new clone fills only a new (or empty) directory: one with content and no record
/// (kept by `onDelete: retain`, or a lost state dir's half copy) is never merged into.
async fn refuse_foreign_content(
    b: &NfsBackend,
    root: &std::path::Path,
    id: &NfsVolumeId,
) -> Result<()> {
    let (root, rel) = (root.to_owned(), id.dir.clone());
    let empty = b
        .blocking(format!("looking into {}", id.source()), move || {
            fsops::is_empty_or_missing(&root, &rel)
        })
        .await?;
    if empty {
        return Ok(());
    }
    Err(CloneError::TargetDirTaken { dir: id.source() }.into())
}

fn verify_of(req: &CreateVolume<'_>) -> Verify {
    match req
        .params
        .stored
        .get(request::PARAM_VERIFY)
        .map(String::as_str)
    {
        Some("checksum") => Verify::Checksum,
        _ => Verify::Sizes,
    }
}

/// The copy job's inputs: (export root, directory) of the target and of the source.
struct Copy {
    target: (PathBuf, String),
    source: (PathBuf, String),
    req: CopyRequest,
    /// A restore of a snapshot taken with checksums: each file's recorded SHA-256.
    digests: Vec<(String, String)>,
    /// What the volume is filled from, as asked (a volume id or a snapshot id).
    origin: String,
}

impl Copy {
    /// The job: the target directory made, both opened beneath their export roots, the
    /// tree copied and verified (blocking, on the blocking pool; no deadline: a copy
    /// takes as long as the data needs, and callers wait at most `CREATE_WAIT`).
    async fn run(self, progress: Arc<Progress>, volume: String) -> Result<()> {
        let p = Arc::clone(&progress);
        let outcome = tokio::task::spawn_blocking(move || self.copy(&p))
            .await
            .map_err(|e| Error::from(CloneError::CopyStopped(e.to_string())))
            .and_then(|r| r);
        match &outcome {
            Ok(()) => crate::metrics::clone::finished(&volume, progress.elapsed()),
            Err(e) => crate::metrics::clone::failed(e),
        }
        outcome
    }

    fn copy(&self, progress: &Progress) -> Result<()> {
        let (troot, trel) = &self.target;
        let (sroot, srel) = &self.source;
        let shown = |p: &PathBuf| p.display().to_string();
        fsops::ensure_dir(troot, trel).map_err(|e| fs_error(shown(&self.req.target), e))?;
        let dst = fsops::open_dir(troot, trel)
            .map_err(|e| fs_error(shown(&self.req.target), e))?
            .ok_or_else(|| CloneError::TargetVanished {
                target: shown(&self.req.target),
            })?;
        let src = fsops::open_dir(sroot, srel)
            .map_err(|e| fs_error(shown(&self.req.source), e))?
            .ok_or_else(|| CloneError::SourceDirGone {
                field: FIELD,
                label: self.req.label.clone(),
            })?;
        copy_tree_at(src.as_fd(), dst.as_fd(), &self.req, progress)?;
        // Bytes changed on the store after the snapshot was taken are refused: the
        // directory emptied and the copy forgotten, so a retry copies it all again.
        let target = &self.req.target;
        if let Some((path, recorded, found)) =
            crate::volume::copy::verify::first_mismatch(dst.as_fd(), target, &self.digests)?
        {
            crate::volume::copy::delta::empty(dst.as_fd(), target)?;
            progress.set(crate::volume::copy::Saved::default())?;
            return Err(crate::error::StoreError::Corrupt {
                id: self.origin.clone(),
                path,
                recorded,
                found,
            }
            .into());
        }
        Ok(())
    }
}

fn forget_progress(b: &NfsBackend, id: &str) {
    let _ = std::fs::remove_file(progress_path(b, id));
    b.clones.forget(&key(id));
}

/// DeleteVolume of a clone still filling: refused while its copy runs in this process;
/// otherwise (a driver killed mid-copy, or a copy that failed) the half copy is removed.
/// Returns whether the volume was filling (then its directory is gone).
pub async fn delete_filling(b: &NfsBackend, id: &NfsVolumeId) -> Result<bool> {
    let id_text = id.to_string();
    if !b.store.registry.get(&id_text).is_some_and(|r| r.filling) {
        return Ok(false);
    }
    let k = key(&id_text);
    // A finished job's outcome is collected here (nobody will ask for it any more).
    if tokio::time::timeout(Duration::ZERO, b.clones.jobs.join(&k))
        .await
        .is_err()
    {
        return Err(CloneError::CopyRunning {
            volume: id_text.to_owned(),
        }
        .into());
    }
    let root = b.export_root(id).await?;
    let rel = id.dir.clone();
    let what = format!("removing the half copy {}", id.source());
    let key = format!("remove:{id_text}");
    (b.removals)
        .remove_tree(&key, &what, (root, rel), b.store.op_timeout)
        .await?;
    forget_progress(b, &id_text);
    crate::metrics::clone::forget(&id_text);
    info!(volume_id = %id_text, "half-copied clone removed");
    Ok(true)
}

/// The content source a clone's (or restored volume's) Volume answers with.
pub fn content_source(rec: &NfsRecord) -> Option<csi::VolumeContentSource> {
    rec.source
        .as_ref()
        .and_then(request::snapshot::content_source)
}

/// NFS volumes of this driver being filled from `source` now.
pub fn filling_from(b: &NfsBackend, source: &str) -> Vec<String> {
    b.store
        .registry
        .ids_where(|r| r.filling && r.source.as_ref().is_some_and(|s| s.id() == source))
}

#[cfg(test)]
mod tests {
    use super::nested;

    #[test]
    fn nested_directories_are_caught() {
        assert!(nested("ns/a", "ns/a"));
        assert!(nested("ns/a", "ns/a/b"));
        assert!(nested("ns/a/b/", "ns/a"));
        assert!(!nested("ns/a", "ns/ab"));
        assert!(!nested("ns/a", "ns/b"));
    }
}
