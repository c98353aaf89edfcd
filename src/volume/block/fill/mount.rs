//! How the copy job mounts its source read-only in the volume's private directory, and
//! what it says when a read of the source fails.

use std::path::{Path, PathBuf};

use super::nfs::{private_options, SOFT_SECONDS};
use super::snapshot::{local_snapshot, no_tree};
use crate::error::{CopyError, Error, Result, SnapshotError};
use crate::os::{Anchored, FsType, Host};
use crate::request::snapshot::{SnapshotId, TREE};
use crate::request::NfsVolumeId;
use crate::volume::mounts::private;

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
            Owner::Ours(m) => Ok((root, m.map(|m| *m))),
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
}
