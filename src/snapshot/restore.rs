//! Restoring a snapshot: a CreateVolume whose `volume_content_source.snapshot` names one
//! gets it read from the snapshot's store first (the service does it, before any
//! backend allocates), so any node that reaches the store restores it, whichever node
//! took it. A block volume is then filled at its first NodeStage as a clone of an NFS
//! directory is (`block::fill`, from the snapshot's `tree/`), an NFS volume at its
//! CreateVolume (`nfs::clone`).

use std::path::PathBuf;

use super::Context;
use crate::error::{Error, Result, SnapshotError, StoreError};
use crate::request::snapshot::{Content, Restore, SnapshotId, SnapshotRef};
use crate::runtime::state_dir::short_hash;
use crate::volume::snapshot_store::{Owner, SnapshotDir};
use crate::volume::VolumeBackend;

/// The directory of a snapshot's restore marks: one file per block volume that is being
/// restored from it and not filled yet, whichever node that volume is on.
const MARKS: &str = "restores";

/// The snapshot `raw` names, as its manifest says: NotFound when the store holds no
/// directory that is that very snapshot (`SnapshotDir::owner`), NotReady while it is being
/// taken, FailedPrecondition when its manifest is damaged.
pub async fn resolve(ctx: &Context<'_>, snapshot: &SnapshotRef) -> Result<Restore> {
    let raw = snapshot.to_string();
    let not_found = || SnapshotError::RestoreSourceNotFound { id: raw.clone() };
    let id = snapshot.ours().ok_or_else(not_found)?.clone();
    let m = match ctx.owner(&id).await? {
        Some(Owner::Ours(Some(m))) => m,
        Some(Owner::Ours(None)) => return Err(not_ready(ctx, &id)?),
        Some(Owner::Damaged(why)) => {
            return Err(StoreError::Damaged {
                path: id.location(),
                id: raw.clone(),
                why,
            }
            .into())
        }
        Some(Owner::Foreign(_)) | None => return Err(not_found().into()),
    };
    // Where its restore mark goes must be a directory of its own (or not there yet), so a
    // store that would refuse the mark refuses before anything is allocated.
    let shown = id.location();
    ctx.on_store(&id, "reading the restore marks", move |root, rel| {
        if let Some(dir) = SnapshotDir::open(root, rel, &shown)? {
            dir.subdir(MARKS)?;
        }
        Ok(())
    })
    .await?;
    // An NFS volume records no capacity: the files plus a sixteenth for a filesystem.
    let from_files = (m.data_bytes + m.data_bytes / 16).next_multiple_of(1 << 20);
    let size_bytes = match m.content {
        Content::Files => m.size_bytes.max(from_files),
        Content::Device | Content::Empty => m.size_bytes,
    };
    Ok(Restore {
        id,
        text: raw,
        content: m.content,
        size_bytes,
        digests: m.digests(),
    })
}

/// A snapshot without its manifest yet: being taken here now, or not (its copy failed, or
/// the driver restarted: the snapshotter's next CreateSnapshot takes it again), or by
/// another node.
fn not_ready(ctx: &Context<'_>, id: &SnapshotId) -> Result<Error> {
    let rec = ctx.snapshots.by_id(id)?;
    let why = match rec {
        Some(r) if ctx.snapshots.copies.jobs.is_running(&super::key(&r.name)) => {
            "it is still being taken (ready_to_use: false)"
        }
        Some(_) => {
            "its copy is not running on this node (it failed, or the driver restarted); the \
             next CreateSnapshot of it takes it again"
        }
        None => "it has no manifest yet (another node may still be taking it)",
    };
    Ok(SnapshotError::NotReady {
        id: id.to_string(),
        why: why.to_owned(),
    }
    .into())
}

/// A volume this driver made already under `name` from snapshot `raw`, as its record holds
/// the snapshot: a repeated CreateVolume answers that volume after the snapshot was deleted
/// (CSI: CreateVolume is idempotent) instead of NotFound. Only once the volume holds the
/// snapshot (a block volume filled, an NFS volume copied): one that does not yet can never
/// get it now, and its restore mark must not bring back the snapshot's directory.
pub fn made_from(ctx: &Context<'_>, name: &str, snapshot: &SnapshotRef) -> Option<Restore> {
    let (id, raw) = (snapshot.ours()?, snapshot.to_string());
    let restore = |content| Restore {
        id: id.clone(),
        text: raw.clone(),
        content,
        // The volume exists: what it holds is not asked for again.
        size_bytes: 0,
        digests: Vec::new(),
    };
    let content = ctx.block.restored_from(name, id);
    let content = content.or_else(|| ctx.nfs?.restored_from(name, id))?;
    Some(restore(content))
}

/// DeleteSnapshot of a snapshot a volume is being restored from, on this node or on
/// any other (its mark on the store): FailedPrecondition naming the volumes.
pub async fn refuse_restoring(ctx: &Context<'_>, id: &SnapshotId) -> Result<()> {
    let text = id.to_string();
    let mut restoring = ctx.block.filling_from(&text)?;
    if let Some(nfs) = ctx.nfs {
        restoring.extend(nfs.filling_from(&text)?);
    }
    let (owner, shown) = (text.clone(), id.location());
    let marked = ctx
        .on_store(id, "reading the restore marks", move |root, rel| {
            let Some(dir) = SnapshotDir::open(root, rel, &shown)? else {
                return Ok(Vec::new());
            };
            if matches!(dir.owner(&owner, None)?, Owner::Foreign(_)) {
                return Ok(Vec::new());
            }
            match dir.subdir(MARKS)? {
                Some(marks) => read_marks(&marks),
                None => Ok(Vec::new()),
            }
        })
        .await?;
    for m in marked {
        if !restoring.iter().any(|v| m.starts_with(&format!("{v} "))) {
            restoring.push(m);
        }
    }
    if restoring.is_empty() {
        return Ok(());
    }
    Err(SnapshotError::BeingRestored {
        id: text,
        into: restoring.join(", "),
    }
    .into())
}

/// The restore marks in `marks`, each as `<volume id> on node <node> (<path>)`. Only a
/// mark this driver could have written counts: a regular file named by its volume id's
/// hash holding a block volume id and a node name. Anything else is left alone and not
/// repeated (what a file on the store holds is never put in a message unless it is that).
fn read_marks(marks: &SnapshotDir) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for name in marks.names()? {
        let parsed = match marks.open_file(&name) {
            Ok(Some(file)) => parse_mark(&file, &name),
            Ok(None) => continue,
            Err(Error::Store(_)) => None,
            Err(e) => return Err(e),
        };
        match parsed {
            Some(mark) => out.push(format!("{mark} ({})", marks.shown(&name))),
            None => tracing::warn!(path = %marks.shown(&name),
                "a file in a snapshot's restore marks is no restore mark; left alone"),
        }
    }
    Ok(out)
}

fn parse_mark(file: &std::fs::File, name: &str) -> Option<String> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 512), &mut text).ok()?;
    let (volume, node) = text.trim_end_matches('\n').split_once(" on node ")?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
    };
    let ours = matches!(
        crate::request::volume_ref(volume),
        Ok(crate::request::VolumeRef::Block(_))
    );
    (ours && plain(node) && short_hash(volume) == name).then(|| format!("{volume} on node {node}"))
}

fn local_mark(ctx: &Context<'_>, volume_id: &str) -> PathBuf {
    ctx.snapshots
        .records
        .join(MARKS)
        .join(short_hash(volume_id))
}

/// A block volume created from `restore` and not filled yet: marked on the store, so
/// DeleteSnapshot on any node refuses until its first NodeStage has filled it (or it is
/// deleted), and here, so that stage takes the mark off. Only into the snapshot's own
/// directory, never through a symlink.
pub async fn mark(ctx: &Context<'_>, restore: &Restore, volume_id: &str) -> Result<()> {
    let (text, name) = (
        format!("{volume_id} on node {}\n", ctx.node_id),
        short_hash(volume_id),
    );
    let (owner, shown) = (restore.id.to_string(), restore.id.location());
    ctx.on_store(&restore.id, "marking a restore", move |root, rel| {
        let dir = SnapshotDir::open(root, rel, &shown)?;
        let Some(dir) = dir.filter(|d| matches!(d.owner(&owner, None), Ok(Owner::Ours(Some(_)))))
        else {
            return Err(SnapshotError::RestoreSourceNotFound { id: owner }.into());
        };
        let marks = dir.make_subdir(MARKS)?;
        marks.write_atomic(&name, text.as_bytes())
    })
    .await?;
    let local = local_mark(ctx, volume_id);
    if let Some(parent) = local.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
    }
    crate::runtime::state_dir::write_atomic(&local, restore.text.as_bytes())
        .map_err(|e| Error::io("write", &local, e))
}

/// A volume staged (so filled) or deleted: its restore mark, if any, taken off the
/// store. A store that cannot be reached now keeps the mark for the next stage.
pub async fn unmark(ctx: &Context<'_>, volume_id: &str) {
    let local = local_mark(ctx, volume_id);
    let Ok(text) = std::fs::read_to_string(&local) else {
        return;
    };
    let Some(id) = SnapshotId::parse(text.trim()) else {
        let _ = std::fs::remove_file(&local);
        return;
    };
    let (owner, shown, name) = (id.to_string(), id.location(), short_hash(volume_id));
    let removed = ctx
        .on_store(&id, "unmarking a restore", move |root, rel| {
            let Some(dir) = SnapshotDir::open(root, rel, &shown)? else {
                return Ok(());
            };
            if matches!(dir.owner(&owner, None)?, Owner::Foreign(_)) {
                return Ok(());
            }
            match dir.subdir(MARKS)? {
                Some(marks) => marks.remove_file(&name),
                None => Ok(()),
            }
        })
        .await;
    match removed {
        Ok(()) => {
            let _ = std::fs::remove_file(&local);
        }
        Err(e) => {
            tracing::warn!(volume_id, snapshot_id = %text.trim(), error = %e, "taking the restore mark off the snapshot store failed; the next stage tries again")
        }
    }
}
