//! A filesystem clone filled at its NodeStage: its source mounted read-only in the
//! copy's private directory, the tree copied into the clone mounted beside it.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{count_outcome, on_blocking_pool, record_not_filled};
use crate::error::{Error, Result};
use crate::metrics::clone::Cause;
use crate::os::{FsType, Host};
use crate::volume::block::fill::mount::SourceMount;
use crate::volume::copy::{copy_tree, CopyRequest, Progress, Saved};
use crate::volume::mounts::private::{clean_copy_dir, pin, unmount_retrying};

/// The job: the source mounted read-only and the clone read-write in `dir`, the tree
/// copied and verified, both unmounted whatever the outcome.
pub(super) async fn fill(
    host: Arc<dyn Host>,
    dir: PathBuf,
    from: SourceMount,
    (dst_dev, dst_fs): (PathBuf, FsType),
    mut req: CopyRequest,
    progress: Arc<Progress>,
    volume: String,
) -> Result<()> {
    clean_copy_dir(host.as_ref(), &dir).await?;
    let (src_at, dst_at) = (pin(&dir, "source")?, pin(&dir, "target")?);
    from.mount(host.as_ref(), &src_at)
        .await
        .inspect_err(|_| crate::metrics::clone::failed_because(Cause::Mount))?;
    let copied = async {
        let (files, manifest) = from.files(src_at.path())?;
        host.mount(&dst_dev, &dst_at, dst_fs, &[]).await?;
        (req.source, req.target) = (files, dst_at.path().to_owned());
        // A snapshot's files with holes are read only where they hold data.
        req.extents = manifest
            .as_ref()
            .map(|m| Arc::new(m.extents()))
            .filter(|x| !x.is_empty());
        let p = Arc::clone(&progress);
        let copied = on_blocking_pool(move || {
            copy_tree(&req, &p)?;
            match manifest {
                Some(m) => verify_recorded(&req.target, &m, &p),
                None => Ok(()),
            }
        })
        .await
        .map_err(|e| from.explain(e, &progress));
        let unmounted = unmount_retrying(host.as_ref(), &dst_at).await;
        copied.and(unmounted)
    }
    .await;
    let unmounted = unmount_retrying(host.as_ref(), &src_at).await;
    let outcome = copied.and(unmounted);
    if outcome.is_err() {
        let _ = record_not_filled(&progress).inspect_err(
            |e| tracing::warn!(volume_id = %volume, error = %e, "recording the clone not filled"),
        );
    }
    count_outcome(&volume, &progress, &outcome);
    outcome
}

/// Directory `p` opened read-only, never through a symlink.
pub(super) fn open_dir(p: &Path) -> Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    nix::fcntl::open(p, flags, nix::sys::stat::Mode::empty())
        .map_err(|e| Error::io("open", p, e.into()))
}

/// A restore from a snapshot that recorded checksums: every file of the copy at `target`
/// read back and compared with its manifest's SHA-256, so bytes changed on the store after
/// the snapshot was taken are refused, not restored. On a mismatch the volume is emptied
/// and its copy forgotten, so a retry after the store is repaired copies it all again.
fn verify_recorded(
    target: &Path,
    m: &crate::volume::snapshot_store::manifest::Manifest,
    progress: &Progress,
) -> Result<()> {
    let root = open_dir(target)?;
    let digests = m.digests();
    let id = m.snapshot_id.to_string();
    let shown = Path::new(&id);
    if let Some((path, recorded, found)) =
        crate::volume::copy::verify::first_mismatch(root.as_fd(), shown, &digests)?
    {
        crate::volume::copy::delta::empty(root.as_fd(), target)?;
        progress.set(Saved::default())?;
        return Err(crate::error::StoreError::Corrupt {
            id,
            path,
            recorded,
            found,
        }
        .into());
    }
    Ok(())
}
