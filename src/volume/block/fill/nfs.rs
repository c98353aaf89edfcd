//! A fill from a directory on an NFS export: an NFS volume of this driver (a class's
//! dataset is one too, `dataset.rs`). CreateVolume measures its tree through the
//! controller's export mount; the copy mounts it read-only and soft (`source.rs`).

use std::path::PathBuf;

use super::source::{Source, FIELD};
use crate::error::{CloneError, Error, Result};
use crate::request::{nfs_options, NfsVolumeId};
use crate::volume::nfs::NfsBackend;

impl Source {
    /// NFS volume `raw` of this driver.
    pub(super) fn nfs_volume(raw: &str, id: NfsVolumeId) -> Source {
        Source::Nfs {
            id,
            label: raw.to_owned(),
        }
    }
}

/// CreateVolume of a clone of an NFS directory: its tree measured through the
/// controller's export mount as a job (`copy::measure::Measures`: a call that cannot
/// wait for a large tree answers Unavailable with how far the walk got). Returns
/// the smallest volume that holds the copy (`copy::measure`); a `limit` (0: none)
/// below it is OutOfRange naming both sizes, before anything is allocated.
pub async fn check_nfs(
    nfs: Option<&NfsBackend>,
    id: &NfsVolumeId,
    label: &str,
    limit: u64,
) -> Result<u64> {
    let nfs = nfs.ok_or_else(|| CloneError::NfsSourceNoBackend {
        label: label.to_owned(),
    })?;
    let root = nfs.export_root(id).await?;
    let shown = root.join(&id.dir);
    let tree = (root, PathBuf::from(&id.dir));
    let m = nfs
        .measures
        .measure(&id.source(), label, tree, nfs.store.clone_wait)
        .await
        .map_err(|e| {
            let inner = match &e {
                Error::Shared(inner) => inner.as_ref(),
                e => e,
            };
            match inner {
                Error::Io { source, path, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    let label = label.to_owned();
                    if *path == shown {
                        CloneError::SourceAbsent {
                            field: FIELD,
                            label,
                        }
                        .into()
                    } else {
                        // An entry removed while the walk went by: measure again.
                        let why = inner.to_string();
                        CloneError::SourceChanged { label, why }.into()
                    }
                }
                _ => e,
            }
        })?;
    if limit != 0 && limit < m.needed_bytes {
        return Err(CloneError::LimitBelowFiles {
            label: label.to_owned(),
            data_bytes: m.data_bytes,
            entries: m.entries,
            needed: m.needed_bytes,
            limit,
        }
        .into());
    }
    Ok(m.needed_bytes)
}

pub fn private_options(id: &NfsVolumeId) -> Result<nfs_options::MountOptions> {
    let flags: Vec<String> = SOFT_OPTIONS.iter().map(|s| s.to_string()).collect();
    nfs_options::merge(&id.transport, &flags)
}

/// The options of the private read-only mount of an NFS source: the transport its id
/// records (checked as NFS staging checks it, `proto=rdma` verified after the mount),
/// `ro`, and a soft mount that fails a request the server leaves unanswered.
///
/// nfs(5): with `hard` (the default) a request is retried for ever, so a server that
/// stops would hang the copy's reads, and NodeStage's retries with them, for ever.
/// `softerr` fails such a request after `retrans` retransmissions with ETIMEDOUT (where
/// `soft` answers EIO, which a failing disk answers too), so the copy can say what
/// happened. Over TCP and RDMA each retransmission waits `timeo` deciseconds longer than
/// the last (linear backoff): timeo=100,retrans=2 gives up after about 10+20+30 = 60 s.
/// Soft mounts risk silently lost writes; this mount only reads, and a failed read
/// fails the copy, which the next NodeStage resumes.
pub const SOFT_OPTIONS: [&str; 4] = ["ro", "softerr", "timeo=100", "retrans=2"];
/// About how long a read waits for a silent server (above).
pub const SOFT_SECONDS: u64 = 60;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_mount_is_read_only_soft_and_keeps_the_sources_transport() {
        let id = NfsVolumeId::parse("nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1").unwrap();
        assert_eq!(
            private_options(&id).unwrap().to_vec(),
            [
                "rdma",
                "port=20049",
                "vers=4.1",
                "ro",
                "softerr",
                "timeo=100",
                "retrans=2"
            ]
        );
    }
}
