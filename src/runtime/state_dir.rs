//! The state dir's process-level rules: one driver process per state dir (an
//! `flock` held for the process's lifetime), and its files read only when they are
//! regular files and replaced atomically; and `RecordFiles`, a map of records kept as
//! one file per record under a directory, so a change costs one small file whatever the number of records: `<dir>/<hash of the id>.json` holding
//! the id and the record, replaced atomically (write, fsync, rename, fsync the
//! directory). A change of several records at once goes through `<dir>/batch.json`
//! first, which a restart finishes, so a crash leaves all of them changed or none.

use crate::error::{Error, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracing::info;

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

const BATCH: &str = "batch.json";
const SUFFIX: &str = ".json";
const TMP_SUFFIX: &str = ".json.tmp";

/// One record as it lies in its file.
#[derive(Serialize, Deserialize)]
struct Stored<V> {
    id: String,
    record: V,
}

/// Changes to apply together: `None` removes the record.
#[derive(Serialize, Deserialize)]
struct Batch<V> {
    changes: Vec<Stored<Option<V>>>,
}

#[derive(Debug)]
pub struct RecordFiles {
    dir: PathBuf,
}

impl RecordFiles {
    /// Opens (creating) `dir`, finishes a batch a crash left, and reads every record.
    /// A file that is not a record of this map (unreadable, or named for another id) is
    /// an error naming it: records are never skipped.
    pub fn open<V: DeserializeOwned + Serialize>(
        dir: &Path,
    ) -> Result<(RecordFiles, BTreeMap<String, V>)> {
        fs::create_dir_all(dir).map_err(|e| Error::io("creating state dir", dir, e))?;
        let files = RecordFiles {
            dir: dir.to_owned(),
        };
        let batch = dir.join(BATCH);
        if let Some(bytes) = read_regular(&batch)? {
            let pending: Batch<V> = files.parse(&batch, &bytes)?;
            files.apply(&pending.changes)?;
            fs::remove_file(&batch).map_err(|e| Error::io("removing", &batch, e))?;
            files.sync_dir()?;
        }
        let mut records = BTreeMap::new();
        let entries = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let path = entry.path();
            if name.ends_with(TMP_SUFFIX) {
                // A write a crash cut short: its rename never happened.
                fs::remove_file(&path).map_err(|e| Error::io("removing", &path, e))?;
                continue;
            }
            let Some(stem) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            if name == BATCH {
                continue;
            }
            let Some(bytes) = read_regular(&path)? else {
                continue;
            };
            let stored: Stored<V> = files.parse(&path, &bytes)?;
            if file_stem(&stored.id) != stem {
                return Err(Error::State {
                    path,
                    reason: format!(
                        "holds the record of {:?}, whose file is {}{SUFFIX}; move it back",
                        stored.id,
                        file_stem(&stored.id)
                    ),
                });
            }
            records.insert(stored.id, stored.record);
        }
        Ok((files, records))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `id`'s record.
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{}{SUFFIX}", file_stem(id)))
    }

    /// Persists `changes` (`None` removes the record): one change replaces one file;
    /// several are written to the batch file first, so they land together.
    pub fn write<V: Serialize>(&self, changes: &[(&str, Option<&V>)]) -> Result<()> {
        match changes {
            [] => Ok(()),
            [(id, record)] => {
                self.apply_one(id, *record)?;
                self.sync_dir()
            }
            _ => {
                let batch = self.dir.join(BATCH);
                let stored: Vec<Stored<Option<&V>>> = changes
                    .iter()
                    .map(|(id, record)| Stored {
                        id: (*id).to_owned(),
                        record: *record,
                    })
                    .collect();
                let bytes = self.encode(&batch, &Batch { changes: stored })?;
                write_atomic(&batch, &bytes).map_err(|e| Error::io("writing", &batch, e))?;
                for (id, record) in changes {
                    self.apply_one(id, *record)?;
                }
                self.sync_dir()?;
                fs::remove_file(&batch).map_err(|e| Error::io("removing", &batch, e))?;
                self.sync_dir()
            }
        }
    }

    /// Persists every record of `records` together (a whole-file state moved here).
    pub fn write_all<V: Serialize>(&self, records: &BTreeMap<String, V>) -> Result<()> {
        let changes: Vec<(&str, Option<&V>)> = records
            .iter()
            .map(|(id, r)| (id.as_str(), Some(r)))
            .collect();
        self.write(&changes)
    }

    fn apply<V: Serialize>(&self, changes: &[Stored<Option<V>>]) -> Result<()> {
        for c in changes {
            self.apply_one(&c.id, c.record.as_ref())?;
        }
        Ok(())
    }

    /// Writes or removes one record's file; the directory is synced by the caller.
    fn apply_one<V: Serialize>(&self, id: &str, record: Option<&V>) -> Result<()> {
        let path = self.path_of(id);
        match record {
            Some(record) => {
                let stored = Stored {
                    id: id.to_owned(),
                    record,
                };
                let bytes = self.encode(&path, &stored)?;
                write_file_synced(&path, &bytes).map_err(|e| Error::io("writing", &path, e))
            }
            None => match fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io("removing", &path, e)),
            },
        }
    }

    fn sync_dir(&self) -> Result<()> {
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io("syncing", &self.dir, e))
    }

    fn encode<T: Serialize>(&self, path: &Path, value: &T) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(value).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: format!("cannot be serialised: {e}"),
        })
    }

    fn parse<T: DeserializeOwned>(&self, path: &Path, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: format!("unreadable ({e}); restore it from a backup, never delete it"),
        })
    }
}

/// A record's file name without the suffix: ids hold ':' and '/' and reach 128 bytes,
/// so the name is a hash (128 bits) and the id is inside the file.
fn file_stem(id: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(id.as_bytes())[..16]
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

    fn open(dir: &Path) -> (RecordFiles, BTreeMap<String, u32>) {
        RecordFiles::open(dir).unwrap()
    }

    #[test]
    fn one_change_writes_one_file_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (files, none) = open(dir.path());
        assert!(none.is_empty());
        for i in 0..50u32 {
            files.write(&[(&format!("nfs:a/b:{i}"), Some(&i))]).unwrap();
        }
        let before: BTreeMap<_, _> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().modified().unwrap())
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        files.write(&[("nfs:a/b:7", Some(&700u32))]).unwrap();
        let changed: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                before.get(&e.file_name()) != Some(&e.metadata().unwrap().modified().unwrap())
            })
            .map(|e| e.path())
            .collect();
        assert_eq!(changed, vec![files.path_of("nfs:a/b:7")]);
        files.write::<u32>(&[("nfs:a/b:3", None)]).unwrap();
        let (_, back) = open(dir.path());
        assert_eq!(back.len(), 49);
        assert_eq!(back["nfs:a/b:7"], 700);
        assert!(!back.contains_key("nfs:a/b:3"));
    }

    #[test]
    fn a_batch_left_by_a_crash_is_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = open(dir.path());
        files.write(&[("gone", Some(&1u32))]).unwrap();
        // What a crash after the batch's rename and before its changes leaves.
        let batch = Batch {
            changes: vec![
                Stored {
                    id: "a".to_owned(),
                    record: Some(1u32),
                },
                Stored {
                    id: "gone".to_owned(),
                    record: None,
                },
            ],
        };
        fs::write(dir.path().join(BATCH), serde_json::to_vec(&batch).unwrap()).unwrap();
        fs::write(dir.path().join(format!("x{TMP_SUFFIX}")), b"{torn").unwrap();
        let (_, back) = open(dir.path());
        assert_eq!(back, BTreeMap::from([("a".to_owned(), 1u32)]));
        assert!(!dir.path().join(BATCH).exists());
        assert!(!dir.path().join(format!("x{TMP_SUFFIX}")).exists());
    }

    #[test]
    fn several_changes_land_together() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = open(dir.path());
        files
            .write(&[("a", Some(&1u32)), ("b", Some(&2u32))])
            .unwrap();
        files
            .write::<u32>(&[("a", None), ("b", Some(&3u32))])
            .unwrap();
        assert!(!dir.path().join(BATCH).exists());
        let (_, back) = open(dir.path());
        assert_eq!(back, BTreeMap::from([("b".to_owned(), 3u32)]));
    }

    #[test]
    fn a_misplaced_or_corrupt_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = open(dir.path());
        files.write(&[("a", Some(&1u32))]).unwrap();
        let wrong = dir.path().join(format!("{}{SUFFIX}", file_stem("b")));
        fs::rename(files.path_of("a"), &wrong).unwrap();
        let err = RecordFiles::open::<u32>(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&wrong.display().to_string()) && err.contains("\"a\""),
            "{err}"
        );
        fs::write(&wrong, b"{not json").unwrap();
        let err = RecordFiles::open::<u32>(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unreadable"), "{err}");
    }
}
