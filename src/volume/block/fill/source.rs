//! What a block volume is filled from: another block volume of this node, an
//! NFS volume of this driver (`volume_content_source`), or a dataset the class names
//! (`dataset*` parameters), or a snapshot; each kind's file says how it is checked and
//! read (`mount.rs`: how the copy mounts it).

use crate::csi::id::BlockVolumeId;
use crate::error::{CloneError, Result};
use crate::pool::{SourceOf, VolumeRecord};
use crate::request::snapshot::SnapshotId;
use crate::request::{ContentSource, CreateVolume, NfsVolumeId, VolumeRef};

pub(super) const FIELD: &str = "volume_content_source.volume.volume_id";

/// A clone's source, as CreateVolume and NodeStage find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A block volume; `label` is its id as the CO gave it.
    Block { id: BlockVolumeId, label: String },
    /// A directory on an NFS export; `label` names it in messages and the progress
    /// record (the volume id, `server:/share/path` for a class's dataset, or the
    /// snapshot id of a snapshot's tree on an NFS store).
    Nfs { id: NfsVolumeId, label: String },
    /// A snapshot of files (its `tree/`), on a directory store or an NFS store.
    Snapshot { id: SnapshotId, label: String },
    /// A snapshot of a volume that held nothing: the volume starts empty.
    Empty { label: String },
    /// A raw block snapshot's image (`device.img`), copied onto a raw block volume.
    Image { at: ImageAt, label: String },
}

/// Where a raw block snapshot's image is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageAt {
    /// On a directory store: in the snapshot's directory there.
    Local(SnapshotId),
    /// On an NFS store: the snapshot's directory, mounted read-only by the copy.
    Nfs {
        snapshot: SnapshotId,
        dir: NfsVolumeId,
    },
}

impl Source {
    pub fn label(&self) -> &str {
        match self {
            Source::Block { label, .. }
            | Source::Nfs { label, .. }
            | Source::Snapshot { label, .. }
            | Source::Empty { label }
            | Source::Image { label, .. } => label,
        }
    }
}

/// The source a CreateVolume asks for, if any (`request` refused asking for two).
pub fn requested(req: &CreateVolume<'_>) -> Result<Option<Source>> {
    if let Some(id) = &req.params.dataset {
        return Ok(Some(Source::dataset(id)));
    }
    if let Some(r) = &req.restore {
        return Source::snapshot(&r.id, &r.text, r.content).map(Some);
    }
    match req.source.as_ref().and_then(ContentSource::volume) {
        Some((text, id)) => of_volume(text, id, || CloneError::SourceMissing {
            field: FIELD,
            origin: text.to_owned(),
        })
        .map(Some),
        None => Ok(None),
    }
}

fn of_volume(text: &str, id: &VolumeRef, unknown: impl FnOnce() -> CloneError) -> Result<Source> {
    Ok(match id {
        VolumeRef::Block(id) => Source::Block {
            id: id.clone(),
            label: text.to_owned(),
        },
        VolumeRef::Nfs(id) => Source::nfs_volume(text, id.clone()),
        VolumeRef::Unknown(_) => return Err(unknown().into()),
    })
}

/// The source a volume's record names.
pub fn of_record(rec: &VolumeRecord) -> Result<Option<Source>> {
    match rec.source.as_ref().map(|s| &s.of) {
        Some(SourceOf::Snapshot { id, content }) => {
            Source::snapshot(id, &id.to_string(), *content).map(Some)
        }
        Some(SourceOf::Volume(id)) => {
            let text = id.raw();
            of_volume(&text, id, || CloneError::NotOurVolume {
                origin: text.clone(),
            })
            .map(Some)
        }
        Some(SourceOf::Dataset(id)) => Ok(Some(Source::dataset(id))),
        None => Ok(None),
    }
}
