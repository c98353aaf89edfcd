//! What a snapshot is taken of: the source volume's backend says how its content is read
//! now (`VolumeBackend::content_view`; see `take`) and which states are refused.

use super::Context;
use crate::error::{Error, Result, SnapshotError};
use crate::request::VolumeRef;
use crate::runtime::locks::{LockKey, VolumeGuard};
use crate::volume::{ContentView, VolumeBackend};

/// What to copy from, and the source volume's guard (a block volume's), held by the copy
/// job to its end: a job outlives the call that started it, so its handler cannot hold it.
pub(super) async fn source(
    ctx: &Context<'_>,
    volume: &VolumeRef,
) -> Result<(ContentView, Option<VolumeGuard>)> {
    match volume {
        VolumeRef::Block(id) => {
            let raw = volume.raw();
            let guard = ctx.locks.try_lock(LockKey::Volume(&raw))?;
            Ok((ctx.block.content_view(id).await?, Some(guard)))
        }
        VolumeRef::Nfs(id) => Ok((ctx.nfs()?.content_view(id).await?, None)),
        VolumeRef::Unknown(raw) => Err(not_found(raw)),
    }
}

/// The capacity of the volume a snapshot is taken of (the smallest volume it restores
/// into); NotFound when it is no volume here.
pub(super) fn size(ctx: &Context<'_>, volume: &VolumeRef) -> Result<u64> {
    let size = match volume {
        VolumeRef::Block(id) => ctx.block.capacity_of(id),
        VolumeRef::Nfs(id) => ctx.nfs()?.capacity_of(id),
        VolumeRef::Unknown(_) => None,
    };
    size.ok_or_else(|| not_found(&volume.raw()))
}

fn not_found(raw: &str) -> Error {
    SnapshotError::SourceNotFound {
        volume: raw.to_owned(),
    }
    .into()
}
