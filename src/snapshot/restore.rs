//! Restoring a snapshot: a CreateVolume whose `volume_content_source.snapshot` names one
//! gets it read from the snapshot's store first (the service does it, before any
//! backend allocates), so any node that reaches the store restores it, whichever node
//! took it. A block volume is then filled at its first NodeStage as a clone of an NFS
//! directory is (`block::clone`, from the snapshot's `tree/`), an NFS volume at its
//! CreateVolume (`nfs::clone`).

use std::path::{Path, PathBuf};

use super::Context;
use crate::error::{Error, Result};
use crate::request::snapshot::{Content, Restore, SnapshotId, Store};
use crate::state_dir::short_hash;

/// The directory of a snapshot's restore marks: one file per block volume that is being
/// restored from it and not filled yet, whichever node that volume is on.
const MARKS: &str = "restores";

/// The snapshot `raw` names, as its manifest says: NotFound when there is none, NotReady
/// while this node is still taking it.
pub async fn resolve(ctx: &Context<'_>, raw: &str) -> Result<Restore> {
    let not_found = || {
        Error::NotFound(format!(
            "volume_content_source.snapshot.snapshot_id: snapshot {raw} does not exist"
        ))
    };
    let id = SnapshotId::parse(raw).ok_or_else(not_found)?;
    let Some(m) = ctx.manifest(&id).await? else {
        if ctx.snapshots.records()?.iter().any(|r| r.id == raw) {
            return Err(Error::NotReady(format!(
                "snapshot {raw} is still being taken (ready_to_use: false); retry when it is \
                 ready"
            )));
        }
        return Err(not_found());
    };
    // An NFS volume records no capacity: the files plus a sixteenth for a filesystem.
    let from_files = (m.data_bytes + m.data_bytes / 16).next_multiple_of(1 << 20);
    let size_bytes = match m.content {
        Content::Files => m.size_bytes.max(from_files),
        Content::Device | Content::Empty => m.size_bytes,
    };
    Ok(Restore {
        id,
        text: raw.to_owned(),
        content: m.content,
        size_bytes,
    })
}

/// A volume this driver made already under `name` from snapshot `raw`, as its record holds
/// the snapshot: a repeated CreateVolume answers that volume after the snapshot was deleted
/// (CSI: CreateVolume is idempotent) instead of NotFound. Only once the volume holds the
/// snapshot (a block volume filled, an NFS volume copied): one that does not yet can never
/// get it now, and its restore mark must not bring back the snapshot's directory.
pub fn made_from(ctx: &Context<'_>, name: &str, raw: &str) -> Option<Restore> {
    let id = SnapshotId::parse(raw)?;
    let restore = |content| Restore {
        id: id.clone(),
        text: raw.to_owned(),
        content,
        // The volume exists: what it holds is not asked for again.
        size_bytes: 0,
    };
    let state = ctx.block.pool.state.snapshot();
    if let Some((volume_id, rec)) = state.by_name(name) {
        let params = &rec.parameters;
        let from = params.get(crate::volume::block::clone::SOURCE_KEY);
        if from.map(String::as_str) != Some(raw)
            || !crate::volume::block::clone::done(ctx.block, volume_id).ok()?
        {
            return None;
        }
        let content = params.get(crate::volume::block::clone_source::SNAPSHOT_CONTENT_KEY)?;
        return Content::parse(content).map(restore);
    }
    let (_, rec) = ctx.nfs?.store.registry.by_name(name)?;
    (rec.clone_source.as_deref() == Some(raw) && !rec.filling).then(|| restore(Content::Files))
}

/// DeleteSnapshot of a snapshot a volume is being restored from, on this node or on
/// any other (its mark on the store): FailedPrecondition naming the volumes.
pub async fn refuse_restoring(ctx: &Context<'_>, id: &SnapshotId) -> Result<()> {
    let text = id.to_string();
    let mut restoring = crate::volume::block::clone::unfilled_clones_of(ctx.block, &text)?;
    if let Some(nfs) = ctx.nfs {
        restoring.extend(crate::volume::nfs::clone::filling_from(nfs, &text));
    }
    let marks = ctx.snapshot_dir(id).await?.join(MARKS);
    let read = move || -> Result<Vec<String>> {
        let Ok(entries) = std::fs::read_dir(&marks) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
            out.push(format!("{} ({})", text.trim(), path.display()));
        }
        Ok(out)
    };
    let marked = match &id.store {
        Store::Dir(_) => read()?,
        Store::Nfs(_) => {
            let what = format!("reading the restore marks of {}", id.location());
            ctx.nfs()?
                .with_deadline(what, read)
                .await
                .map_err(|e| super::store_unreachable(id, &e))?
        }
    };
    for m in marked {
        if !restoring.iter().any(|v| m.starts_with(&format!("{v} "))) {
            restoring.push(m);
        }
    }
    if restoring.is_empty() {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "snapshot {text} is being restored into {}: delete it after those volumes are filled \
         (their first NodeStage) or deleted; a mark whose volume went with its node can be \
         removed by hand",
        restoring.join(", ")
    )))
}

fn local_mark(ctx: &Context<'_>, volume_id: &str) -> PathBuf {
    ctx.snapshots
        .records
        .join(MARKS)
        .join(short_hash(volume_id))
}

/// Writes `text` to `path` (a new file replacing any) on the snapshot's store, under the
/// NFS backend's deadline for an NFS store.
async fn on_store(
    ctx: &Context<'_>,
    id: &SnapshotId,
    what: String,
    f: impl FnOnce() -> std::io::Result<()> + Send + 'static,
) -> Result<()> {
    let run = move || f().map_err(|e| Error::io("writing a restore mark", Path::new(""), e));
    match &id.store {
        Store::Dir(_) => run(),
        Store::Nfs(_) => ctx
            .nfs()?
            .with_deadline(what, run)
            .await
            .map_err(|e| super::store_unreachable(id, &e)),
    }
}

/// A block volume created from `restore` and not filled yet: marked on the store, so
/// DeleteSnapshot on any node refuses until its first NodeStage has filled it (or it is
/// deleted), and here, so that stage takes the mark off.
pub async fn mark(ctx: &Context<'_>, restore: &Restore, volume_id: &str) -> Result<()> {
    let dir = ctx.snapshot_dir(&restore.id).await?.join(MARKS);
    let (text, name) = (
        format!("{volume_id} on node {}\n", ctx.node_id),
        short_hash(volume_id),
    );
    on_store(
        ctx,
        &restore.id,
        format!("marking {}", restore.id.location()),
        move || {
            std::fs::create_dir_all(&dir)?;
            crate::state_dir::write_atomic(&dir.join(name), text.as_bytes())
        },
    )
    .await?;
    let local = local_mark(ctx, volume_id);
    if let Some(parent) = local.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
    }
    crate::state_dir::write_atomic(&local, restore.text.as_bytes())
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
    let removed = async {
        let mark = ctx
            .snapshot_dir(&id)
            .await?
            .join(MARKS)
            .join(short_hash(volume_id));
        on_store(
            ctx,
            &id,
            format!("unmarking {}", id.location()),
            move || match std::fs::remove_file(&mark) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        )
        .await
    }
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
