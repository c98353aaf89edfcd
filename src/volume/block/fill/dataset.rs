//! A fill from the dataset a class names (`dataset*` parameters): a directory on an NFS
//! export, copied as an NFS volume's tree is (`nfs.rs`), recorded as the volume's source.

use super::source::Source;
use crate::error::{Error, Result};
use crate::pool::{RecordedSource, SourceOf};
use crate::request::{self, NfsVolumeId};
use crate::volume::block::BlockBackend;

impl Source {
    pub(super) fn dataset(id: &NfsVolumeId) -> Source {
        Source::Nfs {
            label: id.source(),
            id: id.clone(),
        }
    }
}

/// Start-up: records of volumes of a dataset class written before the dataset was a
/// recorded source (only their class's parameters, kept in the record, named it) get it
/// recorded, so the fill reads one source field for every kind. A record whose parameters
/// no longer describe a dataset (edited by hand) stops the start, naming it.
pub fn record_class_datasets(b: &BlockBackend) -> Result<()> {
    let mut found = Vec::new();
    for (id, rec) in b.pool.state.snapshot().entries() {
        if rec.source.is_some() {
            continue;
        }
        let dataset = request::dataset::parse(&rec.parameters).map_err(|e| Error::State {
            path: b.pool.state_dir().to_owned(),
            reason: format!("the record of volume {id} names a dataset that does not read: {e}"),
        })?;
        if let Some(dataset) = dataset {
            found.push((id.to_string(), dataset));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    b.pool.state.update(|state| {
        for (id, dataset) in found {
            if let Some(rec) = state.get_mut(&id) {
                rec.source = Some(RecordedSource {
                    of: SourceOf::Dataset(dataset),
                    raw_block: false,
                });
            }
        }
        Ok(())
    })
}
