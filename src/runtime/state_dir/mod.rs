//! The state dir's process-level rules: one driver process per state dir (an
//! `flock` held for the process's lifetime), and its files read only when they are
//! regular files and replaced atomically.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tracing::info;

use crate::error::{Error, Result};

pub mod records;

/// `<state-dir>/gds-csi.lock`: locked by the serving process, holding its pid as text.
pub const LOCK_FILE: &str = "gds-csi.lock";

/// Held for as long as the process serves; the kernel releases it when the process's
/// files are closed, a SIGKILL included. Two locks: the lock file names the holder for
/// messages, and the state directory itself, which cannot be unlinked and made again
/// under a running driver as a lock file can (`rm gds-csi.lock` would let a second driver
/// lock a new file of that name and allocate the same devices).
#[derive(Debug)]
pub struct StateDirLock {
    _file: Flock<File>,
    _dir: Flock<File>,
    pub path: PathBuf,
}

/// Takes the state dir's lock before anything reads its files. A predecessor that is
/// still exiting (SIGKILLed, or draining after SIGTERM) is waited for up to `wait`;
/// after that the error names the state dir and the pid written by the holder.
pub fn lock(dir: &Path, wait: Duration) -> std::result::Result<StateDirLock, String> {
    let shown = dir.display();
    fs::create_dir_all(dir).map_err(|e| format!("--state-dir {shown}: cannot create it: {e}"))?;
    let path = dir.join(LOCK_FILE);
    let deadline = Instant::now() + wait;
    let mut waiting = false;
    loop {
        if let Some(locked) = try_lock(dir, &path)? {
            if waiting {
                info!(lock = %path.display(), "state dir released by the previous process");
            }
            return Ok(locked);
        }
        if Instant::now() >= deadline {
            return Err(held_message(dir, &path, wait));
        }
        if !waiting {
            waiting = true;
            info!(lock = %path.display(), ?wait, "state dir is locked by another process; waiting for it to exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Both locks, or None while another process holds either.
fn try_lock(dir: &Path, path: &Path) -> std::result::Result<Option<StateDirLock>, String> {
    let failed = |what: &Path, errno: Errno| {
        format!(
            "--state-dir {}: locking {}: {errno}",
            dir.display(),
            what.display()
        )
    };
    let file = match Flock::lock(open_lock_file(path)?, FlockArg::LockExclusiveNonblock) {
        Ok(file) => file,
        Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, errno)) => return Err(failed(path, errno)),
    };
    let dir_lock = match Flock::lock(open_dir(dir)?, FlockArg::LockExclusiveNonblock) {
        Ok(d) => d,
        Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, errno)) => return Err(failed(dir, errno)),
    };
    // Only informative (pids are per namespace): the locks are what protect.
    let _ = file.set_len(0);
    let _ = file.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0);
    Ok(Some(StateDirLock {
        _file: file,
        _dir: dir_lock,
        path: path.to_owned(),
    }))
}

fn held_message(dir: &Path, path: &Path, wait: Duration) -> String {
    let holder = fs::read_to_string(path).unwrap_or_default();
    let holder = match holder.trim() {
        "" => String::new(),
        pid => format!(" (pid {pid}, as that process sees it)"),
    };
    format!(
        "--state-dir {} is in use by another gds-csi process{holder}: the directory or {} \
         stayed locked for {}. Two drivers on one state dir would overwrite each other's \
         allocations; give each driver (each Helm release, each driver name) its own \
         --state-dir, or stop the other process",
        dir.display(),
        path.display(),
        humantime::format_duration(wait)
    )
}

fn open_dir(dir: &Path) -> std::result::Result<File, String> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| format!("--state-dir {}: opening it: {e}", dir.display()))
}

fn open_lock_file(path: &Path) -> std::result::Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        // A FIFO or a symlink in its place is refused rather than followed or blocked on.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|f| {
            if f.metadata()?.file_type().is_file() {
                Ok(f)
            } else {
                Err(std::io::Error::other("not a regular file"))
            }
        })
        .map_err(|e| format!("--state-dir: opening {}: {e}", path.display()))
}

fn kind(t: fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    }
}

fn not_regular(path: &Path, what: &str) -> Error {
    Error::State {
        path: path.to_owned(),
        reason: format!(
            "is {what}, not a regular file; refusing to read it (move it away and restore \
             the state file from a backup)"
        ),
    }
}

/// The content of a state file, `None` when it does not exist. Anything but a regular
/// file is an error: a FIFO would block start-up forever (hence `O_NONBLOCK` on the
/// open, which does not affect regular files) and a symlink could point anywhere
/// (`O_NOFOLLOW` makes the open fail with ELOOP); the type comes from `fstat` of the
/// opened file, so nothing can be swapped in between the check and the read.
pub fn read_regular(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_regular(path, "a symbolic link"))
        }
        Err(e) => return Err(Error::io("opening", path, e)),
    };
    let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, kind(meta.file_type())));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&file)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("reading", path, e))?;
    Ok(Some(bytes))
}

/// Replaces `path` with `bytes`: write a fresh temporary file, fsync, rename, fsync
/// the directory, so a crash leaves the old or the new version, never a torn one.
/// The temporary file is created anew (`O_EXCL`): a FIFO or symlink left at its name
/// is removed rather than opened.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_file_synced(path, bytes)?;
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// [`write_atomic`] less the directory's fsync, for a caller that syncs the directory
/// once after several files.
pub fn write_file_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    let tmp = PathBuf::from(name);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

/// A short stable name for `text` (the first 8 bytes of its SHA-256, in hex): names of
/// state-dir files and mount points keyed by a volume or export, and generated device ids.
pub fn short_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_dir_fails_naming_the_dir_and_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock(dir.path(), Duration::ZERO).unwrap();
        let err = lock(dir.path(), Duration::from_millis(120)).unwrap_err();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        lock(dir.path(), Duration::ZERO).unwrap();
    }

    #[test]
    fn removing_the_lock_file_lets_no_second_driver_in() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock(dir.path(), Duration::ZERO).unwrap();
        fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
        let err = lock(dir.path(), Duration::from_millis(120)).unwrap_err();
        assert!(err.contains("in use by another gds-csi process"), "{err}");
        drop(first);
        lock(dir.path(), Duration::ZERO).unwrap();
    }

    #[test]
    fn special_files_are_refused_and_missing_ones_are_none() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = read_regular(&fifo).unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link")).unwrap();
        let err = read_regular(&dir.path().join("link"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(read_regular(&dir.path().join("none")).unwrap().is_none());
        write_atomic(&dir.path().join("f.json"), b"{}").unwrap();
        assert_eq!(
            read_regular(&dir.path().join("f.json")).unwrap().unwrap(),
            b"{}"
        );
    }
}
