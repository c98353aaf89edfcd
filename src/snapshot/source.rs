//! What a snapshot is taken of: the source volume's backend says how its content is read
//! now (`VolumeBackend::content_view`; see `take`) and which states are refused.

use super::Context;
use crate::error::{Error, Result, SnapshotError};
use crate::request::VolumeRef;
use crate::runtime::overlap::VolumeGuard;
use crate::volume::{ContentView, VolumeBackend};

/// What to copy from. A block volume's copy needs its guard, which the handler took
/// (`copy_needed`) and the job holds to its end; without it (a copy started since the
/// handler looked) the call is Aborted as a busy volume is, and its retry takes it.
pub(super) async fn source(
    ctx: &Context<'_>,
    volume: &VolumeRef,
    guard: Option<VolumeGuard>,
) -> Result<(ContentView, Option<VolumeGuard>)> {
    match volume {
        VolumeRef::Block(id) => {
            let guard = guard.ok_or_else(|| Error::Busy(volume.raw()))?;
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
