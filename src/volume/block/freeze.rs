//! A mounted filesystem frozen (FIFREEZE) for the last pass of a copy of it (a clone's or
//! a snapshot's) over what changed while it was copied live, so the copy is one point in
//! time while a pod keeps it mounted: its writers wait only for that pass, bounded by
//! `--snapshot-freeze-limit`, its readers and the copy read on. A freeze is always paired with a thaw: the guard thaws when dropped
//! (the copy's end, its error, a panic, a dropped job), and the freeze is recorded in the
//! state dir before it is made, so a driver killed meanwhile thaws it at start-up rather
//! than leaving the pod's writers hung.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::os::MountEntry;
use crate::volume::copy::delta::Changes;
use crate::volume::copy::walk::Entry;
use crate::volume::copy::{Progress, Verify};

/// The longest a mounted volume's filesystem stays frozen for a copy's last pass, unless
/// `--snapshot-freeze-limit` says otherwise.
pub const LIMIT: Duration = Duration::from_secs(5);

/// A last pass that did not end within the freeze limit: the filesystem was thawed at the
/// limit, and the copy is no point in time.
#[derive(Debug)]
pub struct Overran;

/// What the last pass did: the new walk, what changed, and the seconds it stayed frozen.
pub type LastPass = (Vec<Entry>, Changes, f64);

/// Where the last pass runs: the filesystem mounted at `at` (device `dev`, its root open
/// as `root`), copied live into `dst` as `before` lists it; the freeze is recorded in
/// `state_dir` as `name`.
pub struct Pass<'a> {
    pub state_dir: &'a Path,
    pub name: &'a str,
    pub root: &'a OwnedFd,
    pub at: &'a Path,
    pub dev: (u32, u32),
    pub dst: BorrowedFd<'a>,
    pub verify: Verify,
    pub limit: Duration,
}

impl Pass<'_> {
    /// Freezes the filesystem while what changed since `before` is copied, and thaws it
    /// when that is done or at the limit, whichever comes first.
    pub fn run(
        &self,
        before: &[Entry],
        progress: &Progress,
    ) -> Result<std::result::Result<LastPass, Overran>> {
        let freeze_root = self
            .root
            .try_clone()
            .map_err(|e| Error::io("open", self.at, e))?;
        let frozen_at = Instant::now();
        let frozen = Frozen::freeze(self.state_dir, self.name, freeze_root, self.dev, self.at)?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let (src, dst, at, how) = (self.root.as_fd(), self.dst, self.at, self.verify);
            s.spawn(move || {
                let streams = crate::volume::copy::STREAMS;
                let changes = crate::volume::copy::delta::copy_changes(
                    src, dst, at, before, how, streams, progress,
                );
                let _ = tx.send(changes);
            });
            let got = rx.recv_timeout(self.limit);
            // Thawed now, before waiting for a pass that overran to stop.
            drop(frozen);
            let seconds = frozen_at.elapsed().as_secs_f64();
            match got {
                Ok(done) => done.map(|(entries, changes)| Ok((entries, changes, seconds))),
                Err(_) => Ok(Err(Overran)),
            }
        })
    }
}

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` (linux/fs.h).
const FIFREEZE: u32 = 0xC004_5877;
const FITHAW: u32 = 0xC004_5878;

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("freezes")
}

/// A frozen filesystem, by a descriptor of its root; thawed when dropped.
pub struct Frozen {
    root: OwnedFd,
    record: PathBuf,
    shown: PathBuf,
}

impl Frozen {
    /// Freezes the filesystem whose root `root` is (device `major:minor`, shown as
    /// `shown`), recording it under `state_dir` as `name` first.
    pub fn freeze(
        state_dir: &Path,
        name: &str,
        root: OwnedFd,
        (major, minor): (u32, u32),
        shown: &Path,
    ) -> Result<Frozen> {
        let d = dir(state_dir);
        std::fs::create_dir_all(&d).map_err(|e| Error::io("create", &d, e))?;
        let record = d.join(name);
        write_synced(&record, &format!("{major}:{minor}\n"))?;
        if let Err(e) = ioctl(&root, FIFREEZE) {
            let _ = std::fs::remove_file(&record);
            return Err(Error::io("freezing", shown, e));
        }
        tracing::info!(at = %shown.display(), "froze the source filesystem for a copy (a clone's, or a snapshot's last pass)");
        Ok(Frozen {
            root,
            record,
            shown: shown.to_owned(),
        })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        match ioctl(&self.root, FITHAW) {
            Ok(()) => {
                tracing::info!(at = %self.shown.display(), "thawed the source filesystem");
                let _ = std::fs::remove_file(&self.record);
            }
            // The record stays: the next start-up thaws it.
            Err(e) => {
                tracing::error!(at = %self.shown.display(), error = %e, "thawing the source filesystem failed")
            }
        }
    }
}

fn ioctl(fd: &OwnedFd, request: u32) -> std::io::Result<()> {
    // SAFETY: FIFREEZE and FITHAW take an int argument the kernel does not read.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn write_synced(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::io("create", path, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("write", path, e))
}

/// Start-up: every freeze a killed driver recorded is thawed through a mount of its
/// device (EINVAL: not frozen any more), and its record removed.
pub fn thaw_recorded(state_dir: &Path, mounts: &[MountEntry]) {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let dev = std::fs::read_to_string(&path).ok().and_then(|t| {
            let (a, b) = t.trim().split_once(':')?;
            Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?))
        });
        let Some(at) = dev.and_then(|(major, minor)| {
            mounts
                .iter()
                .find(|m| (m.major, m.minor) == (major, minor) && m.root == "/")
        }) else {
            // Unmounted everywhere: nothing left frozen to reach.
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let opened = nix::fcntl::open(
            &at.mount_point,
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        );
        let thawed = match opened {
            Ok(fd) => match ioctl(&fd, FITHAW) {
                Err(e) if e.raw_os_error() != Some(libc::EINVAL) => Err(e),
                _ => Ok(()),
            },
            Err(e) => Err(e.into()),
        };
        match thawed {
            Ok(()) => {
                tracing::warn!(at = %at.mount_point.display(), "thawed a filesystem a killed driver left frozen for a clone's copy");
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => {
                tracing::error!(at = %at.mount_point.display(), error = %e, "thawing a filesystem left frozen failed")
            }
        }
    }
}
