//! A fill from the dataset a class names (`dataset*` parameters): a directory on an NFS
//! export, copied as an NFS volume's tree is (`nfs.rs`).

use super::source::Source;
use crate::error::Result;
use crate::pool::VolumeRecord;
use crate::request::{self, NfsVolumeId};

impl Source {
    pub(super) fn dataset(id: &NfsVolumeId) -> Source {
        Source::Nfs {
            label: id.source(),
            id: id.clone(),
        }
    }

    /// The dataset a volume's class names, as its recorded parameters keep it.
    pub(super) fn dataset_of(rec: &VolumeRecord) -> Result<Option<Source>> {
        let stored = rec.parameters.iter().map(|(k, v)| (k.clone(), v.clone()));
        Ok(request::dataset::parse(&stored.collect())?
            .as_ref()
            .map(Source::dataset))
    }
}
