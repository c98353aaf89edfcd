//! A snapshot's directory on its store, as the driver reaches it: opened beneath the
//! store's root one component at a time without following a symlink
//! (`openat(O_NOFOLLOW | O_DIRECTORY)`, `volume::nfs::fsops`), and every file in it opened
//! the same way, by name, relative to that descriptor. Whatever a store holds may have
//! been put there by someone else (a store is shared by every node, and often by people):
//! a symlink or a device where a file or a directory of ours should be is refused, never
//! followed, and a directory is a snapshot only when its id file and its manifest both name
//! the snapshot asked for. Messages name paths, never what a file read from the store holds.
//! Here, below the backends, because a restore's fill reads a snapshot as `snapshot/` takes
//! one; `manifest`: what a snapshot holds, written last.

pub mod manifest;

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};

use crate::error::{Error, Result, SnapshotError, StoreError};
use crate::os::safepath::fd_path;
use manifest::{Manifest, FILE as MANIFEST};

/// The file in a snapshot's directory naming the snapshot it belongs to: written before
/// anything else goes in (`<id>\n<name>\n`), so only a directory this driver made for this
/// very snapshot is ever written to or removed.
pub const ID_FILE: &str = "snapshot-id";
/// The most a snapshot's id file or manifest may hold; anything larger is no file of ours.
const MAX_MANIFEST: u64 = 256 << 20;
const MAX_ID_FILE: u64 = 4096;

/// A snapshot's directory, opened: the descriptor every access goes through.
#[derive(Debug)]
pub struct SnapshotDir {
    fd: OwnedFd,
    /// The directory as the operator knows it (a local path, or `server:/share/...`).
    shown: String,
}

/// Whose a directory is, by its id file and its manifest.
#[derive(Debug)]
pub enum Owner {
    /// Ours, for the id asked for; the manifest when one is there (the snapshot is ready).
    Ours(Option<Box<Manifest>>),
    /// Ours by its id file, but its manifest is there and unreadable or names another
    /// snapshot: not restorable, listed as not ready.
    Damaged(&'static str),
    /// Nothing of it is ours: no id file, or one naming another snapshot.
    Foreign(&'static str),
}

fn flags_dir() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

impl SnapshotDir {
    /// `<root>/<rel>`, each component a real directory; `None` when one is missing.
    pub fn open(root: &Path, rel: &str, shown: &str) -> Result<Option<SnapshotDir>> {
        Self::walk(root, rel, shown, false)
    }

    /// As [`SnapshotDir::open`], the missing components created.
    pub fn create(root: &Path, rel: &str, shown: &str) -> Result<SnapshotDir> {
        Self::walk(root, rel, shown, true)?.ok_or_else(|| {
            Error::io(
                "create",
                PathBuf::from(shown),
                std::io::ErrorKind::NotFound.into(),
            )
        })
    }

    fn walk(root: &Path, rel: &str, shown: &str, create: bool) -> Result<Option<SnapshotDir>> {
        let not_plain = || StoreError::NotPlain {
            path: shown.to_owned(),
            kind: "directory",
        };
        let open_root = || nix::fcntl::open(root, flags_dir(), Mode::empty());
        let mut fd: OwnedFd = match open_root() {
            Ok(fd) => fd,
            // A directory store not made yet: made by the first snapshot taken into it.
            Err(Errno::ENOENT) if create => {
                std::fs::create_dir_all(root).map_err(|e| Error::io("create", root, e))?;
                open_root().map_err(|e| Error::io("open", root, e.into()))?
            }
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::io("open", root, e.into())),
        };
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            if c == "." || c == ".." {
                return Err(not_plain().into());
            }
            if create {
                match mkdirat(&fd, c, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(io_error("create", shown, e)),
                }
            }
            fd = match openat(&fd, c, flags_dir(), Mode::empty()) {
                Ok(next) => next,
                Err(Errno::ENOENT) => return Ok(None),
                Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(not_plain().into()),
                Err(e) => return Err(io_error("open", shown, e)),
            };
        }
        Ok(Some(SnapshotDir {
            fd,
            shown: shown.to_owned(),
        }))
    }

    /// Where the directory is, for messages.
    pub fn location(&self) -> &str {
        &self.shown
    }

    /// Where a name in the directory is, for messages.
    pub fn shown(&self, name: &str) -> String {
        format!("{}/{name}", self.shown)
    }

    /// A path that reaches this very directory (`/proc/self/fd/N`, a link the kernel
    /// resolves to the open directory, never by name) while `self` lives: for a call that
    /// takes a path and follows it, as a bind mount's source does.
    pub fn path(&self) -> PathBuf {
        fd_path(self.fd.as_fd())
    }

    /// A regular file of the directory, read whole when at most `max` bytes; `None` when
    /// it does not exist.
    fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.open_file(name)? else {
            return Ok(None);
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", self.shown(name), e))?
            .len();
        if len > max {
            return Err(StoreError::NotPlain {
                path: self.shown(name),
                kind: "file of a snapshot (it is too large)",
            }
            .into());
        }
        let mut bytes = Vec::with_capacity(len as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(&file, max + 1), &mut bytes)
            .map_err(|e| Error::io("read", self.shown(name), e))?;
        Ok(Some(bytes))
    }

    /// The manifest's bytes as they are (None: there is none), for a reader that checks
    /// them against what it wrote.
    pub fn manifest_bytes(&self) -> Result<Option<Vec<u8>>> {
        self.read_small(MANIFEST, MAX_MANIFEST)
    }

    /// A regular file of the directory opened read-only, never a symlink, a FIFO or a
    /// device; `None` when it does not exist.
    pub fn open_file(&self, name: &str) -> Result<Option<File>> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = match openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => return Err(self.not_plain_file(name)),
            Err(e) => return Err(io_error("open", &self.shown(name), e)),
        };
        self.regular(fd, name).map(Some)
    }

    /// A regular file made anew in the directory (what was there under the name is
    /// removed first, never opened), for writing.
    pub fn create_file(&self, name: &str) -> Result<File> {
        match nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io_error("remove", &self.shown(name), e)),
        }
        let flags =
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, Mode::from_bits_truncate(0o644))
            .map_err(|e| io_error("create", &self.shown(name), e))?;
        self.regular(fd, name)
    }

    fn regular(&self, fd: OwnedFd, name: &str) -> Result<File> {
        let st = fstat(&fd).map_err(|e| io_error("stat", &self.shown(name), e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(self.not_plain_file(name));
        }
        let file = File::from(fd);
        // O_NONBLOCK only kept a FIFO from blocking the open; a regular file ignores it.
        Ok(file)
    }

    fn not_plain_file(&self, name: &str) -> Error {
        StoreError::NotPlain {
            path: self.shown(name),
            kind: "regular file",
        }
        .into()
    }

    /// A subdirectory, never through a symlink; `None` when missing.
    pub fn subdir(&self, name: &str) -> Result<Option<SnapshotDir>> {
        let shown = self.shown(name);
        match openat(&self.fd, name, flags_dir(), Mode::empty()) {
            Ok(fd) => Ok(Some(SnapshotDir { fd, shown })),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => Err(StoreError::NotPlain {
                path: shown,
                kind: "directory",
            }
            .into()),
            Err(e) => Err(io_error("open", &shown, e)),
        }
    }

    /// A subdirectory made when missing, never through a symlink.
    pub fn make_subdir(&self, name: &str) -> Result<SnapshotDir> {
        let shown = self.shown(name);
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io_error("create", &shown, e)),
        }
        // Removed between the two calls: someone else works in this directory.
        self.subdir(name)?
            .ok_or_else(|| io_error("open", &shown, Errno::ENOENT))
    }

    /// `bytes` written to `name` atomically: a new temporary file (never one that was
    /// there), synced, renamed over the name, the directory synced.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let tmp = format!("{name}.tmp");
        let mut file = self.create_file(&tmp)?;
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        written.map_err(|e| store_io("write", &self.shown(&tmp), e))?;
        nix::fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name)
            .map_err(|e| io_error("rename", &self.shown(name), e))?;
        nix::unistd::fsync(&self.fd).map_err(|e| io_error("sync", &self.shown, e))
    }

    /// Removes a file of the directory (not a directory); missing is fine.
    pub fn remove_file(&self, name: &str) -> Result<()> {
        match nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(io_error("remove", &self.shown(name), e)),
        }
    }

    /// The id file's id and name lines; `None` when there is none.
    fn id_file(&self) -> Result<Option<(String, Option<String>)>> {
        let Some(bytes) = self.read_small(ID_FILE, MAX_ID_FILE)? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut lines = text.lines();
        let id = lines.next().unwrap_or_default().trim().to_owned();
        let name = lines.next().map(|l| l.trim().to_owned());
        Ok(Some((id, name)))
    }

    /// Whose the directory is: ours only when the id file names `id` (and `name`, when the
    /// id file records one and a name is given) and a manifest, if there, names `id` too.
    pub fn owner(&self, id: &str, name: Option<&str>) -> Result<Owner> {
        match self.id_file()? {
            None => return Ok(Owner::Foreign("it has no snapshot-id file")),
            Some((got, _)) if got != id => {
                return Ok(Owner::Foreign(
                    "its snapshot-id file names another snapshot",
                ))
            }
            Some((_, Some(recorded))) if name.is_some_and(|n| n != recorded) => {
                return Ok(Owner::Foreign(
                    "its snapshot-id file names another snapshot",
                ))
            }
            Some(_) => {}
        }
        let manifest = match self.read_small(MANIFEST, MAX_MANIFEST) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(Owner::Ours(None)),
            Err(Error::Store(_)) => return Ok(Owner::Damaged("its manifest is no regular file")),
            Err(e) => return Err(e),
        };
        let Ok(m) = serde_json::from_slice::<Manifest>(&manifest) else {
            return Ok(Owner::Damaged("its manifest cannot be read as one"));
        };
        if m.snapshot_id.to_string() != id || name.is_some_and(|n| n != m.name) {
            return Ok(Owner::Damaged("its manifest names another snapshot"));
        }
        if !crate::request::snapshot::names_dir(&m.name, &m.snapshot_id.dir) {
            return Ok(Owner::Damaged(
                "its manifest's name is not the one its id names",
            ));
        }
        Ok(Owner::Ours(Some(Box::new(m))))
    }

    /// Takes an empty directory for snapshot `id` named `name` (its id file written), or
    /// finds it ours already. Anything else: AlreadyExists, nothing written.
    pub fn claim(&self, id: &str, name: &str) -> Result<()> {
        match self.owner(id, Some(name))? {
            Owner::Ours(_) | Owner::Damaged(_) => return Ok(()),
            Owner::Foreign(_) if self.id_file()?.is_some() => {
                return Err(StoreError::NameTaken {
                    path: self.shown.clone(),
                    id: id.to_owned(),
                    why: "its snapshot-id file names another snapshot",
                }
                .into())
            }
            Owner::Foreign(_) => {}
        }
        if !self.is_empty()? {
            return Err(StoreError::NotOurs {
                path: self.shown.clone(),
            }
            .into());
        }
        self.write_atomic(ID_FILE, format!("{id}\n{name}\n").as_bytes())
    }

    fn is_empty(&self) -> Result<bool> {
        Ok(self.names()?.is_empty())
    }

    /// The names in the directory (not `.` and `..`).
    pub fn names(&self) -> Result<Vec<String>> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| store_io("open", &self.shown, e))?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| io_error("read", &self.shown, e))?;
        let mut out: Vec<String> = dir
            .iter()
            .filter_map(|e| e.ok())
            .map(|e| String::from_utf8_lossy(e.file_name().to_bytes()).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        out.sort();
        Ok(out)
    }

    /// The descriptor, duplicated (for a copy that reads or writes beneath it).
    pub fn dup(&self) -> Result<OwnedFd> {
        self.fd
            .try_clone()
            .map_err(|e| store_io("open", &self.shown, e))
    }
}

/// Snapshot `id`'s directory at `<root>/<rel>`, proven to be that ready snapshot's: the
/// source of a restore. NotFound, FailedPrecondition (foreign or damaged) or Unavailable
/// (not ready) otherwise.
pub fn open_ready(root: &Path, rel: &str, id: &str, shown: &str) -> Result<SnapshotDir> {
    let dir = SnapshotDir::open(root, rel, shown)?.ok_or_else(|| SnapshotError::NotInStore {
        id: id.to_owned(),
        path: shown.to_owned(),
    })?;
    match dir.owner(id, None)? {
        Owner::Ours(Some(_)) => Ok(dir),
        Owner::Ours(None) => Err(SnapshotError::NoManifest {
            id: id.to_owned(),
            path: shown.to_owned(),
        }
        .into()),
        Owner::Damaged(why) => Err(StoreError::Damaged {
            path: shown.to_owned(),
            id: id.to_owned(),
            why,
        }
        .into()),
        Owner::Foreign(why) => Err(StoreError::Foreign {
            path: shown.to_owned(),
            id: id.to_owned(),
            why,
        }
        .into()),
    }
}

fn io_error(what: &'static str, shown: &str, e: Errno) -> Error {
    store_io(what, shown, e.into())
}

/// An I/O error on the store: ENOSPC and EDQUOT are the store being full (the caller
/// says how much it needs, [`full`]); the rest as they are.
fn store_io(what: &'static str, shown: &str, e: std::io::Error) -> Error {
    Error::io(what, PathBuf::from(shown), e)
}

/// ENOSPC or EDQUOT anywhere in `e`: the store is full. Said as ResourceExhausted naming
/// the store and about how many bytes the snapshot needs more.
pub fn full(e: Error, store: &str, needed: u64) -> Error {
    fn cause(e: &Error) -> Option<(&'static str, String)> {
        match e {
            Error::Io { source, path, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) => Some(("no space left", path.display().to_string())),
                Some(libc::EDQUOT) => Some(("quota exceeded", path.display().to_string())),
                _ => None,
            },
            Error::Shared(inner) => cause(inner),
            _ => None,
        }
    }
    match cause(&e) {
        Some((cause, path)) => StoreError::Full {
            store: store.to_owned(),
            path,
            cause,
            needed,
        }
        .into(),
        None => e,
    }
}
