//! The file the probe registers with cuFile: one the caller named, or a scratch file of known
//! bytes in the volume's directory (a file already there on a read-only volume).

use std::ffi::{c_int, c_uint, CString};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How much the read check reads: a few MiB, enough for several DMA segments.
pub const READ_BYTES: u64 = 4 << 20;

/// An O_DIRECT fd for registration, the file it is on, and the scratch file to remove
/// afterwards (if one was made). Dropping it closes the fd and removes the scratch file.
pub(super) struct DirectFile {
    pub(super) fd: c_int,
    pub(super) path: PathBuf,
    scratch: Option<PathBuf>,
}

impl DirectFile {
    pub(super) fn open(p: &Path) -> Result<DirectFile, String> {
        let (path, scratch) = if p.is_dir() {
            target_in_dir(p)?
        } else {
            (p.to_path_buf(), None)
        };
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        let flags = libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC;
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600 as c_uint) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("open {} with O_DIRECT: {e}", path.display()));
        }
        Ok(DirectFile { fd, path, scratch })
    }

    /// Bytes of the file the read check covers: up to READ_BYTES, whole 4 KiB pages (O_DIRECT).
    pub(super) fn read_len(&self) -> u64 {
        // SAFETY: `libc::stat` is plain old data; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes at most one `stat` into `st`, which lives across the call; a bad
        // fd only makes it return -1.
        if unsafe { libc::fstat(self.fd, &mut st) } != 0 {
            return 0;
        }
        (st.st_size as u64).min(READ_BYTES) & !4095
    }
}

impl Drop for DirectFile {
    fn drop(&mut self) {
        // SAFETY: the fd came from open() above and is closed only here.
        unsafe { libc::close(self.fd) };
        if let Some(s) = &self.scratch {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// The file to probe in directory `dir`, and the scratch file to remove (when one was made).
fn target_in_dir(dir: &Path) -> Result<(PathBuf, Option<PathBuf>), String> {
    let target = dir.join(format!(".gds-probe-{}", std::process::id()));
    // Known bytes for the read check, written (and synced) through the page cache first.
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&target);
    match created {
        Ok(mut f) => {
            write_scratch(&mut f, &target)?;
            Ok((target.clone(), Some(target)))
        }
        // A read-only volume is probed on a file already there, read-only.
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => match existing_file(dir) {
            Some(existing) => Ok((existing, None)),
            None => Err(format!(
                "create {}: {e}, and no file of 4 KiB or more to probe instead",
                target.display()
            )),
        },
        Err(e) => Err(format!("create {}: {e}", target.display())),
    }
}

/// Fills the scratch file with [`pattern`] bytes, or leaves it sparse on a full volume.
fn write_scratch(f: &mut std::fs::File, target: &Path) -> Result<(), String> {
    let written = f
        .write_all(&pattern(READ_BYTES as usize))
        .and_then(|_| f.sync_all());
    match written {
        Ok(()) => Ok(()),
        // A full volume must not be refused for the probe's sake: a sparse file needs no
        // space, reads as zeros, and the check compares with what POSIX reads anyway.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => f
            .set_len(0)
            .and_then(|_| f.set_len(READ_BYTES))
            .map_err(|e| format!("truncate {}: {e}", target.display())),
        Err(e) => {
            let _ = std::fs::remove_file(target);
            Err(format!("write {}: {e}", target.display()))
        }
    }
}

/// A regular file of at least one page in `dir` or one level below, for a volume the probe
/// cannot write to.
fn existing_file(dir: &Path) -> Option<PathBuf> {
    let mut dirs = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = dirs.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d).ok()?.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            seen += 1;
            if seen > 1000 {
                return None;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_file() && e.metadata().is_ok_and(|m| m.len() >= 4096) {
                return Some(e.path());
            }
            if ft.is_dir() && d == dir {
                dirs.push(e.path());
            }
        }
    }
    None
}

/// Non-repeating bytes (xorshift), so a shifted or partial read cannot match by chance.
fn pattern(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}
