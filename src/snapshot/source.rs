//! What a snapshot is taken of: the source volume's state decides how its content is read
//! (see `take`), and which states are refused.

use std::path::PathBuf;

use super::Context;
use crate::error::{Error, Result, SnapshotError};
use crate::os::FsType;
use crate::pool::VolumeRecord;
use crate::request::{self, VolumeRef};
use crate::runtime::locks::LockKey;
use crate::runtime::locks::VolumeGuard;
use crate::volume::block::{clone, BlockBackend};
use crate::volume::id::{BlockVolumeId, IdLayout};

/// Where the copy reads from.
pub(super) enum From {
    /// A filesystem volume's device, nothing using it: mounted read-only privately.
    Unmounted { dev: PathBuf, fs: FsType },
    /// A filesystem volume mounted at `at` (staged): copied live, then frozen.
    Mounted {
        at: PathBuf,
        dev: (u32, u32),
        fs: FsType,
    },
    /// A volume without a filesystem: its device's first `bytes`.
    Device {
        path: PathBuf,
        dev: (u32, u32),
        bytes: u64,
    },
    /// An NFS volume's directory `rel` below the export mounted at `root`.
    Tree { root: PathBuf, rel: String },
}

/// What to copy from, and the source volume's lock (a block volume's).
pub(super) async fn source(ctx: &Context<'_>, raw: &str) -> Result<(From, Option<VolumeGuard>)> {
    let vid = match request::volume_ref(raw) {
        Ok(VolumeRef::Block(vid)) => vid,
        Ok(VolumeRef::Nfs(nid)) => {
            let root = ctx.nfs()?.export_root(&nid).await?;
            return Ok((From::Tree { root, rel: nid.dir }, None));
        }
        _ => return Err(not_found(raw)),
    };
    let guard = ctx.locks.try_lock(LockKey::Volume(raw))?;
    let rec = snapshottable_record(ctx.block, raw)?;
    Ok((block_source(ctx.block, raw, &vid, &rec)?, Some(guard)))
}

fn not_found(raw: &str) -> Error {
    SnapshotError::SourceNotFound {
        volume: raw.to_owned(),
    }
    .into()
}

/// The block volume's record, when its content is there to be copied: not being deleted,
/// and filled when it is a clone or restore.
fn snapshottable_record(b: &BlockBackend, raw: &str) -> Result<VolumeRecord> {
    let rec = b
        .pool
        .state
        .snapshot()
        .get(raw)
        .cloned()
        .ok_or_else(|| not_found(raw))?;
    if rec.deleting {
        return Err(SnapshotError::SourceDeleting {
            volume: raw.to_owned(),
        }
        .into());
    }
    if crate::volume::block::clone_source::of_record(&rec)?.is_some() && !clone::done(b, raw)? {
        return Err(SnapshotError::SourceNotFilled {
            volume: raw.to_owned(),
        }
        .into());
    }
    Ok(rec)
}

/// How a block volume is read: at its staged mount, mounted privately, or as bytes; a
/// volume in use where its content cannot be read consistently is refused.
fn block_source(
    b: &BlockBackend,
    raw: &str,
    vid: &BlockVolumeId,
    rec: &VolumeRecord,
) -> Result<From> {
    let mut vol = b.locate(vid).map_err(|e| {
        if vid.layout == IdLayout::Stripe {
            SnapshotError::StripeNotStaged {
                volume: raw.to_owned(),
                cause: e.to_string(),
            }
            .into()
        } else {
            e
        }
    })?;
    b.verify_located(&mut vol)?;
    let dev = (vol.device.major, vol.device.minor);
    let mounts = b.mounter.mount_table()?;
    let staged = b.mounter.filesystem_root(&mounts, dev.0, dev.1);
    Ok(match (rec.formatted, staged) {
        (true, Some(at)) => From::Mounted {
            at,
            dev,
            fs: rec.fs_type,
        },
        (true, None) => match clone::in_use(b, vid) {
            Some(uses) => {
                return Err(SnapshotError::InUseUnmounted {
                    volume: raw.to_owned(),
                    uses,
                }
                .into())
            }
            None => From::Unmounted {
                dev: vol.device.path.clone(),
                fs: rec.fs_type,
            },
        },
        (false, _) => {
            if let Some(uses) = clone::in_use(b, vid) {
                return Err(SnapshotError::RawInUse {
                    volume: raw.to_owned(),
                    uses,
                }
                .into());
            }
            From::Device {
                path: vol.device.path.clone(),
                dev,
                bytes: rec.capacity_bytes,
            }
        }
    })
}
