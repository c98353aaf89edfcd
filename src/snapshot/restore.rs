//! Restoring a snapshot: a CreateVolume whose `volume_content_source.snapshot` names one
//! gets it read from the snapshot's store first (the service does it, before any
//! backend allocates), so any node that reaches the store restores it, whichever node
//! took it. A block volume is then filled at its first NodeStage as a clone of an NFS
//! directory is (`block::clone`, from the snapshot's `tree/`), an NFS volume at its
//! CreateVolume (`nfs::clone`).

use super::Context;
use crate::error::{Error, Result};
use crate::request::snapshot::{Content, Restore, SnapshotId};

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

/// DeleteSnapshot of a snapshot a volume of this node is being restored from (its
/// copy reads the snapshot's files): FailedPrecondition naming the volumes.
pub async fn refuse_restoring(ctx: &Context<'_>, id: &SnapshotId) -> Result<()> {
    let text = id.to_string();
    let mut restoring = crate::volume::block::clone::unfilled_clones_of(ctx.block, &text)?;
    if let Some(nfs) = ctx.nfs {
        restoring.extend(crate::volume::nfs::clone::filling_from(nfs, &text));
    }
    if restoring.is_empty() {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "snapshot {text} is being restored into {}: delete it after those volumes are filled \
         (their first NodeStage), or delete them first",
        restoring.join(", ")
    )))
}
