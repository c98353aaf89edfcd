//! A fill from a snapshot: a snapshot of files restores its `tree/` (on a directory store,
//! bound from the directory proven to be the snapshot's; on an NFS store, mounted and
//! proven once mounted), a raw block snapshot its `device.img` (`raw.rs`), a snapshot of
//! a volume that held nothing restores nothing.

use super::source::{ImageAt, Source};
use crate::error::{Error, Result, SnapshotError};
use crate::request::snapshot::{Content, SnapshotId, Store};

impl Source {
    /// Where a snapshot's content is, as its id and recorded content say.
    pub(super) fn snapshot(id: &SnapshotId, text: &str, content: Content) -> Result<Source> {
        let label = text.to_owned();
        match content {
            Content::Empty => Ok(Source::Empty { label }),
            Content::Device => {
                let at = match id.nfs_dir("") {
                    Some(dir) => ImageAt::Nfs {
                        snapshot: id.clone(),
                        dir,
                    },
                    None => ImageAt::Local(id.clone()),
                };
                Ok(Source::Image { at, label })
            }
            Content::Files => Ok(Source::Snapshot {
                id: id.clone(),
                label,
            }),
        }
    }
}

/// A directory store's snapshot directory, proven to be `id`'s ready snapshot.
pub fn local_snapshot(id: &SnapshotId) -> Result<crate::volume::snapshot_store::SnapshotDir> {
    let Store::Dir(root) = &id.store else {
        unreachable!("only a directory store's snapshot is opened here")
    };
    crate::volume::snapshot_store::open_ready(root, &id.dir, &id.to_string(), &id.location())
}

pub(super) fn no_tree(id: &SnapshotId) -> Error {
    SnapshotError::NoTree {
        id: id.to_string(),
        path: id.location(),
    }
    .into()
}
