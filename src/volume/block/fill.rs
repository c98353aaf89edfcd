//! The fill step of a block NodeStage (and of a raw block NodePublish, which a CO may
//! call on a volume staged before a clone of it existed): a volume with a content source
//! not filled yet is filled and verified here, before anything mounts or binds it. A
//! filesystem fill formats the volume first, through the one format step of staging.
//! Every fill path plugs in here: clones of block volumes and of NFS directories
//! (`block::clone`).

use super::{clone, format, BlockBackend, Located};
use crate::csi::id::BlockVolumeId;
use crate::error::Result;
use crate::request::{Access, Capability};

/// Fills `vol` when it has a content source it does not hold yet; Ok at once otherwise.
pub async fn fill(b: &BlockBackend, vol: &mut Located, cap: &Capability) -> Result<()> {
    let Some(pending) = clone::pending(b, vol, cap).await? else {
        return Ok(());
    };
    let fs = cap.fs_type.unwrap_or(vol.record.fs_type);
    if pending.needs_filesystem() {
        format::format_if_blank(b, vol, fs).await?;
    }
    clone::run(b, vol, fs, pending).await
}

/// NodeStage of a clone's source: its clones not filled yet take their copy first, so
/// each holds the source as it was at the clone's CreateVolume (which refuses a source in
/// use; nothing could write the source since). A source in use already is a repeated
/// NodeStage: its clones are left to their own NodeStage.
pub async fn fill_clones_of(b: &BlockBackend, source: &BlockVolumeId) -> Result<()> {
    let raw = source.to_string();
    let clones = clone::unfilled_clones_of(b, &raw)?;
    if clones.is_empty() || clone::in_use(b, source).is_some() {
        return Ok(());
    }
    for clone in clones {
        let mut vol = b.locate(&clone)?;
        let access = if clone::is_raw_clone(&vol.record) {
            Access::Block
        } else {
            Access::Mount
        };
        let cap = Capability {
            access,
            fs_type: Some(vol.record.fs_type),
            mount_flags: Vec::new(),
            read_only_mode: false,
            single_writer: false,
        };
        tracing::info!(volume_id = %raw, clone = %clone, "filling a clone of this volume before it is staged");
        fill(b, &mut vol, &cap).await?;
    }
    Ok(())
}
