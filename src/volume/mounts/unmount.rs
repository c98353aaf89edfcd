//! Unmounting an NFS mount whose server is gone. A plain umount(8) then hangs (its
//! path canonicalisation stats the mount point, the kernel waits on the server), the
//! call fails at its deadline, the kubelet retries the same, and the pod stays in
//! Terminating for good (kubernetes#31272, csi-driver-nfs#601). As mount-utils does
//! since kubernetes#96844 (ported in csi-driver-nfs#394): after a deadline, force it
//! (`umount -f`, MNT_FORCE: the NFS client aborts its pending RPCs); where that fails
//! too, detach it lazily (`umount -l`, MNT_DETACH: gone from the tree now, released by
//! the kernel once nothing uses it). Each step has a deadline and is logged.

use std::path::Path;
use std::time::Duration;

use tracing::{info, warn};

use crate::error::{CommandError, Error, Result};
use crate::os::{mount, Anchored, ForceUnmount, Host};

/// The most one step may take: three steps fit in the kubelet's two-minute CSI deadline.
pub const STEP: Duration = Duration::from_secs(30);

fn timed_out(what: &str, after: Duration) -> Error {
    Error::Command(CommandError::Timeout {
        command: what.to_owned(),
        after,
    })
}

fn is_timeout(e: &Error) -> bool {
    matches!(e, Error::Command(CommandError::Timeout { .. }))
}

/// Unmounts the topmost mount at `target`: an NFS one with the escalation above (each
/// step bounded by `step`), any other with a plain unmount.
pub async fn unmount(host: &dyn Host, target: &Anchored, step: Duration) -> Result<()> {
    let mounts = host.mount_table()?;
    let nfs = mount::at(&mounts, target.path()).is_some_and(|m| m.fs_type.starts_with("nfs"));
    if !nfs {
        return host.unmount(target).await;
    }
    unmount_nfs(host, target, step).await
}

async fn unmount_nfs(host: &dyn Host, anchored: &Anchored, step: Duration) -> Result<()> {
    let first = match tokio::time::timeout(step, host.unmount(anchored)).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) if !is_timeout(&e) => return Err(e),
        Ok(Err(e)) => e,
        Err(_) => timed_out(&format!("umount {}", anchored.path().display()), step),
    };
    // The forced steps go through umount(8) by name: the name was resolved safely above,
    // and what matters now is that a dead server cannot hang the pod's teardown.
    let target: &Path = anchored.path();
    warn!(target = %target.display(), error = %first, "NFS unmount did not finish; forcing it (umount -f), the server may be gone");
    let forced =
        match tokio::time::timeout(step, host.unmount_forced(target, ForceUnmount::Force)).await {
            Ok(r) => r,
            Err(_) => Err(timed_out(&format!("umount -f {}", target.display()), step)),
        };
    let still_mounted =
        || -> Result<bool> { Ok(mount::at(&host.mount_table()?, target).is_some()) };
    match forced {
        Ok(()) if !still_mounted()? => {
            info!(target = %target.display(), "NFS mount force-unmounted");
            return Ok(());
        }
        Ok(()) => {
            warn!(target = %target.display(), "still mounted after umount -f; detaching it lazily (umount -l)")
        }
        Err(e) => {
            warn!(target = %target.display(), error = %e, "umount -f failed; detaching it lazily (umount -l)")
        }
    }
    match tokio::time::timeout(step, host.unmount_forced(target, ForceUnmount::Lazy)).await {
        Ok(Ok(())) => {
            warn!(target = %target.display(), "NFS mount detached lazily; the kernel releases it once nothing uses it");
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(timed_out(&format!("umount -l {}", target.display()), step)),
    }
}
