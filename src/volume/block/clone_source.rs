//! Where a block clone is filled from: another block volume of this node, an
//! NFS volume of this driver (`volume_content_source`), or a dataset the class names
//! (`dataset*` parameters). CreateVolume sizes the clone from it; the copy job mounts it
//! read-only in the clone's private directory, one of two kinds (`SourceMount`).

use std::path::{Path, PathBuf};

use crate::csi::id::BlockVolumeId;
use crate::error::{CloneError, CopyError, Error, Result, SnapshotError};
use crate::os::{Anchored, FsType, Host};
use crate::pool::{SourceOf, VolumeRecord};
use crate::request::snapshot::{Content, SnapshotId, Store, TREE};
use crate::request::{self, nfs_options, ContentSource, CreateVolume, NfsVolumeId, VolumeRef};
use crate::volume::mounts::private;
use crate::volume::nfs::NfsBackend;

const FIELD: &str = "volume_content_source.volume.volume_id";

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
    fn nfs_volume(raw: &str, id: NfsVolumeId) -> Source {
        Source::Nfs {
            id,
            label: raw.to_owned(),
        }
    }

    fn dataset(id: &NfsVolumeId) -> Source {
        Source::Nfs {
            label: id.source(),
            id: id.clone(),
        }
    }

    pub fn label(&self) -> &str {
        match self {
            Source::Block { label, .. }
            | Source::Nfs { label, .. }
            | Source::Snapshot { label, .. }
            | Source::Empty { label }
            | Source::Image { label, .. } => label,
        }
    }

    /// Where a snapshot's content is, as its id and recorded content say.
    fn snapshot(id: &SnapshotId, text: &str, content: Content) -> Result<Source> {
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

/// The source a clone's record names (its recorded source, or the class's dataset).
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
        None => {
            let stored = rec.parameters.iter().map(|(k, v)| (k.clone(), v.clone()));
            Ok(request::dataset::parse(&stored.collect())?
                .as_ref()
                .map(Source::dataset))
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

pub fn private_options(id: &NfsVolumeId) -> Result<nfs_options::MountOptions> {
    let flags: Vec<String> = SOFT_OPTIONS.iter().map(|s| s.to_string()).collect();
    nfs_options::merge(&id.transport, &flags)
}

/// A directory store's snapshot directory, proven to be `id`'s ready snapshot.
pub fn local_snapshot(id: &SnapshotId) -> Result<crate::volume::snapshot_store::SnapshotDir> {
    let Store::Dir(root) = &id.store else {
        unreachable!("only a directory store's snapshot is opened here")
    };
    crate::volume::snapshot_store::open_ready(root, &id.dir, &id.to_string(), &id.location())
}

/// How the copy job mounts its source read-only at `<dir>/source`.
pub enum SourceMount {
    /// A block volume's device.
    Device { dev: PathBuf, fs: FsType },
    /// A snapshot's tree on a directory store, bound from the descriptor of the tree of
    /// the directory proven to be that snapshot's, opened without following a symlink.
    Tree { id: SnapshotId },
    /// A snapshot's directory on an NFS store (`dir`), proven to be snapshot `id`'s once
    /// mounted (the server resolved the path, not this node); its `tree/` is copied.
    NfsSnapshot {
        dir: NfsVolumeId,
        id: SnapshotId,
        label: String,
    },
    /// `server:/share/dir` over the transport its id records.
    Nfs { id: NfsVolumeId, label: String },
}

fn no_tree(id: &SnapshotId) -> Error {
    SnapshotError::NoTree {
        id: id.to_string(),
        path: id.location(),
    }
    .into()
}

impl SourceMount {
    pub async fn mount(&self, host: &dyn Host, at: &Anchored) -> Result<()> {
        match self {
            SourceMount::Device { dev, fs } => host.mount(dev, at, *fs, &["ro".to_owned()]).await,
            SourceMount::Tree { id } => {
                let dir = local_snapshot(id)?;
                let tree = dir.subdir(TREE)?.ok_or_else(|| no_tree(id))?;
                // The bind's source is the descriptor itself (`/proc/self/fd/N`), never a
                // path looked up again.
                let from = Anchored::unpinned(tree.path());
                host.bind_mount(&from, at, &["ro".to_owned()]).await
            }
            SourceMount::NfsSnapshot { dir: id, .. } | SourceMount::Nfs { id, .. } => {
                let opts = private_options(id)?;
                let source = id.source();
                host.mount_nfs(&source, at.path(), &opts.to_vec()).await?;
                let verified =
                    crate::volume::nfs::verify_mounted(host, at, &source, &opts.transport).await;
                if verified.is_err() && private::mounted_at(host, at.path()).is_some() {
                    let _ = private::unmount(host, at).await;
                }
                verified
            }
        }
    }

    /// Where the files to copy are once mounted at `at`, and the snapshot's manifest when
    /// the source is one (read from the directory proven to be that snapshot's: for an NFS
    /// store, on what was mounted, since the server resolved the path, not this node).
    pub fn files(
        &self,
        at: &Path,
    ) -> Result<(
        PathBuf,
        Option<crate::volume::snapshot_store::manifest::Manifest>,
    )> {
        use crate::volume::snapshot_store::{open_ready, Owner};
        let (dir, root, id) = match self {
            SourceMount::Tree { id } => (local_snapshot(id)?, at.to_owned(), id),
            SourceMount::NfsSnapshot { id, .. } => {
                let dir = open_ready(at, "", &id.to_string(), &id.location())?;
                (dir, at.join(TREE), id)
            }
            _ => return Ok((at.to_owned(), None)),
        };
        // A real directory of the proven snapshot; the copy opens it by name with
        // O_NOFOLLOW from here on.
        dir.subdir(TREE)?.ok_or_else(|| no_tree(id))?;
        match dir.owner(&id.to_string(), None)? {
            Owner::Ours(m) => Ok((root, m)),
            _ => Err(SnapshotError::NotFound { id: id.to_string() }.into()),
        }
    }

    /// A copy's failure, said clearly when the NFS server stopped answering (the soft
    /// mount's ETIMEDOUT): Unavailable, so the kubelet's retry resumes the copy.
    pub fn explain(&self, e: Error, progress: &crate::volume::copy::Progress) -> Error {
        let (SourceMount::Nfs { label, .. } | SourceMount::NfsSnapshot { label, .. }) = self else {
            return e;
        };
        if !timed_out(&e) {
            return e;
        }
        let (copied, total) = (progress.copied_bytes(), progress.total_bytes());
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        CopyError::SourceTimeout {
            label: label.clone(),
            soft_seconds: SOFT_SECONDS,
            error: e.to_string(),
            percent: (copied * 100).checked_div(total).unwrap_or(0),
            copied_gib: gib(copied),
            total_gib: gib(total),
        }
        .into()
    }
}

fn timed_out(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } => source.raw_os_error() == Some(libc::ETIMEDOUT),
        Error::Shared(inner) => timed_out(inner),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::copy::{Progress, Saved};

    fn nfs() -> SourceMount {
        let id = NfsVolumeId::parse("nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1").unwrap();
        SourceMount::Nfs {
            label: id.source(),
            id,
        }
    }

    #[test]
    fn a_read_the_server_left_unanswered_is_said_clearly_and_retried() {
        let dir = tempfile::tempdir().unwrap();
        let p = Progress::new(dir.path().join("p.json"), "x".into());
        p.set(Saved {
            total_bytes: 4 << 30,
            copied_bytes: 1 << 30,
            ..Saved::default()
        })
        .unwrap();
        let timed_out = Error::io(
            "copy",
            "/state/clone-mnt/x/source/big.bin",
            std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
        );
        let e = nfs().explain(Error::Shared(std::sync::Arc::new(timed_out)), &p);
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().starts_with(
                "reading 192.0.2.1:/export/sets/a failed: the NFS server did not answer (the source is mounted soft"
            ) && status.message().contains("resumes the copy at 25% (1.00 of 4.00 GiB)"),
            "{}",
            status.message()
        );
        // Any other failure, and any failure of a block source, is left as it is.
        let eio = || Error::io("copy", "/x", std::io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(nfs().explain(eio(), &p), Error::Io { .. }));
        let dev = SourceMount::Device {
            dev: "/dev/x".into(),
            fs: FsType::Ext4,
        };
        let t = Error::io(
            "copy",
            "/x",
            std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
        );
        assert!(matches!(dev.explain(t, &p), Error::Io { .. }));
    }

    #[test]
    fn the_private_mount_is_read_only_soft_and_keeps_the_sources_transport() {
        let SourceMount::Nfs { id, .. } = nfs() else {
            unreachable!()
        };
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
