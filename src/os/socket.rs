//! The unix socket a gRPC server listens on (the CSI service, the device plugin): a stale
//! socket of a crashed predecessor removed, anything else at the path refused, the mode set.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tracing::info;

/// Binds the socket, removing a stale one left by a crashed predecessor.
pub fn bind(socket: &Path, mode: u32) -> io::Result<UnixListener> {
    bind_after(socket, mode, Duration::ZERO)
}

/// Like [`bind`], waiting up to `wait` for a socket that still answers to go quiet.
/// Called with the state dir locked: a predecessor on the same state dir has then
/// released its lock, yet its listening socket can answer a little longer, because a
/// dying process's files are closed one by one after its memory is torn down
/// (kernel/exit.c `do_exit`: `exit_mm` before `exit_files`); the listen backlog
/// accepts a connect(2) without the process's help meanwhile.
pub fn bind_after(socket: &Path, mode: u32, wait: Duration) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to remove it",
                    socket.display()
                ),
            ));
        }
        let deadline = Instant::now() + wait;
        let mut logged = false;
        while std::os::unix::net::UnixStream::connect(socket).is_ok() {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another process is serving on {} (still after {})",
                        socket.display(),
                        humantime::format_duration(wait)
                    ),
                ));
            }
            if !logged {
                logged = true;
                info!(socket = %socket.display(), "socket still answers; waiting for the previous process to exit");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        info!(socket = %socket.display(), "removing stale socket");
        std::fs::remove_file(socket)?;
    }
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}
