//! Mount syscalls still running on a path, so that no other call acts on that path until
//! the kernel has answered.
//!
//! A `mount(2)` or `umount2(2)` made in this process cannot be killed at its deadline the
//! way a mount(8) child can: `RealHost::blocking` answers DeadlineExceeded, but the thread
//! stays in the kernel and the mount may still land (or go) later. The per-volume guard of
//! the call is released when the call answers, and the caller's future can also be dropped
//! earlier (a cancelled gRPC call). So the path is entered here before the syscall is
//! handed to its thread, and left by that thread when the syscall returns, whatever became
//! of the caller. Meanwhile `safepath::open` refuses the path with Aborted (the kubelet
//! retries): a retried stage cannot stack a second mount on it, and an unstage cannot
//! answer "nothing mounted" just before the late mount appears.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use crate::error::HostError;
use crate::error::{Error, Result};

/// Paths with a mount syscall in flight. Process-wide like the mount table it guards.
static PATHS: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(Mutex::default);

fn paths() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    PATHS.lock().unwrap_or_else(|e| e.into_inner())
}

fn busy(path: &Path) -> Error {
    HostError::MountInFlight {
        path: path.to_owned(),
    }
    .into()
}

/// Held by the thread that makes the syscall; leaves the path when dropped.
#[must_use]
pub struct InFlight(PathBuf);

impl InFlight {
    /// Enters `path`; Aborted while another syscall on it is still running.
    pub fn enter(path: &Path) -> Result<InFlight> {
        if !paths().insert(path.to_owned()) {
            return Err(busy(path));
        }
        Ok(InFlight(path.to_owned()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        paths().remove(&self.0);
    }
}

/// Aborted while a syscall on `path` is in flight.
pub fn check(path: &Path) -> Result<()> {
    if paths().contains(path) {
        return Err(busy(path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_busy_until_its_syscall_is_left() {
        let p = Path::new("/var/lib/kubelet/plugins/x/inflight-unit-test");
        let held = InFlight::enter(p).unwrap();
        let in_flight = |e: &Error| matches!(e, Error::Host(HostError::MountInFlight { .. }));
        assert!(check(p).as_ref().is_err_and(in_flight));
        assert!(InFlight::enter(p).as_ref().is_err_and(in_flight));
        assert!(
            check(&p.with_file_name("other")).is_ok(),
            "other paths are free"
        );
        drop(held);
        assert!(check(p).is_ok());
        drop(InFlight::enter(p).unwrap());
    }
}
