//! The real host: util-linux, e2fsprogs and xfsprogs, and mount syscalls on pinned paths.

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{DeviceHold, FileKind, ForceUnmount, FsType, FsUsage, Host, Signature};
use crate::error::HostError;
use crate::error::{CommandError, Error, Result};
use crate::os::blockdev::{device_in_use, zero_blocks};
use crate::os::blockdev::{parse_blkid_export, parse_wipefs_json};
use crate::os::mkfs::{self, StripeGeometry};
use crate::os::mount::{self, MountEntry};
use crate::os::runner;
use crate::os::safepath::{self, Anchored};

/// The real host: util-linux, e2fsprogs and xfsprogs, each call under a deadline.
pub struct RealHost {
    pub command_timeout: Duration,
    pub mount_timeout: Duration,
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn probe_failed(device: &Path, why: impl std::fmt::Display) -> Error {
    HostError::ProbeFailed {
        device: device.to_owned(),
        why: why.to_string(),
    }
    .into()
}

#[async_trait]
impl Host for RealHost {
    fn mount_table(&self) -> Result<Vec<MountEntry>> {
        mount::read_table()
    }

    async fn probe_signatures(&self, device: &Path) -> Result<Vec<Signature>> {
        let dev = device.as_os_str();
        // Two independent low-level probes; either failing is a refusal.
        let blkid = runner::run_raw(
            "blkid",
            &[os("-p"), os("-o"), os("export"), dev],
            self.command_timeout,
        )
        .await
        .map_err(|e| probe_failed(device, e))?;
        let mut signatures = match blkid.status.code() {
            Some(0) => parse_blkid_export(&String::from_utf8_lossy(&blkid.stdout)),
            Some(2) => Vec::new(),
            _ => {
                return Err(probe_failed(
                    device,
                    format!(
                        "blkid -p exited {}: {}",
                        blkid.status,
                        String::from_utf8_lossy(&blkid.stderr).trim()
                    ),
                ))
            }
        };
        let wipefs = runner::run(
            "wipefs",
            &[os("--no-act"), os("--json"), dev],
            self.command_timeout,
        )
        .await
        .map_err(|e| probe_failed(device, e))?;
        let seen = parse_wipefs_json(&String::from_utf8_lossy(&wipefs.stdout))
            .map_err(|e| probe_failed(device, format!("unreadable wipefs output: {e}")))?;
        signatures.extend(seen);
        Ok(signatures)
    }

    fn hold_device(&self, device: &Path) -> Result<DeviceHold> {
        let file = OpenOptions::new()
            .read(true)
            .open(device)
            .map_err(|e| Error::io("opening", device, e))?;
        // util-linux's convention: flock(LOCK_EX) on the whole-disk node, which sfdisk,
        // wipefs and mkswap take with --lock or LOCK_BLOCK_DEVICE (util-linux lib/blkdev.c
        // blkdev_lock, line 379) and systemd-udevd honours before probing. Pool devices
        // are whole devices. The lock is advisory: mkfs itself does not take it.
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| match errno {
                nix::errno::Errno::EWOULDBLOCK => HostError::DeviceLocked {
                    device: device.to_owned(),
                }
                .into(),
                other => Error::io("locking", device, other.into()),
            })?;
        // An O_EXCL open of a block device fails with EBUSY while it is mounted, an md or
        // dm member, or opened O_EXCL elsewhere, which mkfs does (e2fsprogs misc/mke2fs.c
        // line 3249 EXT2_FLAG_EXCLUSIVE -> lib/ext2fs/unix_io.c line 1117 O_EXCL). It is
        // closed at once: mkfs needs that same exclusive open, so it cannot be held across
        // the child; `wipefs --no-act` and `blkid -p` do not open O_EXCL and miss all this.
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(device)
        {
            Ok(_) => Ok(DeviceHold { _lock: Some(lock) }),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(device_in_use(device)),
            Err(e) => Err(Error::io("opening (exclusively)", device, e)),
        }
    }

    async fn mdadm(&self, args: &[&OsStr]) -> Result<std::process::Output> {
        Ok(runner::run_raw("mdadm", args, self.command_timeout).await?)
    }

    async fn mkfs(
        &self,
        device: &Path,
        fs: FsType,
        uuid: &str,
        stripe: Option<StripeGeometry>,
    ) -> Result<()> {
        // mkfs still refuses a device in use (O_EXCL); see `mkfs::command` for the rest.
        let (program, args) = mkfs::command(device, fs, uuid, stripe);
        let args: Vec<&OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        runner::run(program, &args, self.command_timeout).await?;
        Ok(())
    }

    async fn grow_filesystem(&self, device: &Path, mount_point: &Path, fs: FsType) -> Result<()> {
        // resize2fs grows a mounted ext4 online through EXT4_IOC_RESIZE_FS and answers
        // "Nothing to do!" (exit 0) when it fills the device already (e2fsprogs
        // resize/main.c); xfs_growfs only works on a mounted xfs, by its mount point,
        // and leaves a filesystem that fills the device as it is (xfsprogs growfs).
        let (program, arg) = match fs {
            FsType::Ext4 => ("resize2fs", device.as_os_str()),
            FsType::Xfs => ("xfs_growfs", mount_point.as_os_str()),
        };
        let args: &[&OsStr] = match fs {
            FsType::Ext4 => &[arg],
            FsType::Xfs => &[os("-d"), arg],
        };
        match runner::run(program, args, self.command_timeout).await {
            Ok(_) => Ok(()),
            // resize2fs answers "Nothing to do!" before it asks the kernel, so only a
            // real grow needs the capability.
            Err(e) if fs == FsType::Ext4 && !has_cap_sys_resource() => {
                Err(HostError::GrowNeedsCapability { why: e.to_string() }.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn wipe_signatures(&self, device: &Path) -> Result<()> {
        runner::run(
            "wipefs",
            &[os("--all"), device.as_os_str()],
            self.command_timeout,
        )
        .await?;
        Ok(())
    }

    async fn zero_device(&self, device: &Path) -> Result<()> {
        // BLKZEROOUT: the kernel uses the device's write-zeroes offload (NVMe Write
        // Zeroes; a loop device fallocates the range in its backing file) and falls back
        // to writing zero pages; it drops the page cache of the range (linux block/ioctl.c
        // blk_ioctl_zeroout). BLKDISCARD is not used: whether discarded blocks read back
        // as zeros is not knowable (queue/discard_zeroes_data is always 0 since 4.12).
        // O_EXCL: nothing may mount the device while it is erased.
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_EXCL)
            .open(device)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => device_in_use(device),
                _ => Error::io("opening (exclusively)", device, e),
            })?;
        let device = device.to_owned();
        let per_chunk = self.command_timeout;
        tokio::task::spawn_blocking(move || {
            let mut f = &file;
            let size = f
                .seek(SeekFrom::End(0))
                .map_err(|e| Error::io("measuring", &device, e))?;
            zero_blocks(&file, &device, size, per_chunk)
        })
        .await
        .map_err(|e| Error::from(HostError::EraseInterrupted(e.to_string())))?
    }

    async fn mount(
        &self,
        device: &Path,
        target: &Anchored,
        fs: FsType,
        options: &[String],
    ) -> Result<()> {
        let mut all: Vec<String> = fs
            .required_mount_options()
            .iter()
            .map(|o| o.to_string())
            .collect();
        all.extend(options.iter().cloned());
        let what = format!("mount {}", target.path().display());
        let at = target.path().to_owned();
        let (device, target) = (device.to_owned(), target.try_clone()?);
        self.blocking(what, &at, move || {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            crate::os::mount::mount_fs(&device, &target, fs.as_str(), &all)
        })
        .await
    }

    async fn bind_mount(
        &self,
        source: &Anchored,
        target: &Anchored,
        options: &[String],
    ) -> Result<()> {
        let what = format!("bind mount {}", target.path().display());
        let (source, target, options) =
            (source.try_clone()?, target.try_clone()?, options.to_vec());
        let at = target.path().to_owned();
        self.blocking(what, &at, move || {
            let options: Vec<&str> = options.iter().map(String::as_str).collect();
            crate::os::mount::bind(&source, &target, &options)
        })
        .await
    }

    async fn mount_nfs(&self, source: &str, target: &Path, options: &[String]) -> Result<()> {
        let joined = options.join(",");
        let mut args = vec![os("-t"), os("nfs")];
        if !joined.is_empty() {
            args.extend([os("-o"), os(&joined)]);
        }
        args.extend([os(source), target.as_os_str()]);
        runner::run("mount", &args, self.mount_timeout).await?;
        Ok(())
    }

    async fn unmount_forced(&self, target: &Path, how: ForceUnmount) -> Result<()> {
        let flag = match how {
            ForceUnmount::Force => "-f",
            ForceUnmount::Lazy => "-l",
        };
        // -c (--no-canonicalize): canonicalising stats the mount point, which hangs on
        // a dead NFS server (umount(8)); the target is already an absolute, checked path.
        let args = [os(flag), os("-c"), target.as_os_str()];
        runner::run("umount", &args, self.mount_timeout).await?;
        Ok(())
    }

    async fn unmount(&self, target: &Anchored) -> Result<()> {
        if target.is_pinned() {
            let what = format!("umount {}", target.path().display());
            let pinned = target.try_clone()?.without_final();
            return self
                .blocking(what, target.path(), move || {
                    safepath::unmount(&pinned).map(drop)
                })
                .await;
        }
        // Unpinned: only the shared mount of an NFS export in the state dir (volume/nfs/mod.rs,
        // after a mount without RDMA). It stays with umount(8) in its own process group,
        // killable at the deadline like mount(8) for NFS: a dead server can hang it.
        let path = target.path();
        match runner::run("umount", &[path.as_os_str()], self.mount_timeout).await {
            Ok(_) => Ok(()),
            Err(CommandError::Failed { .. }) if !is_mount_point(self, path)? => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn create_dir_all(&self, path: &Path) -> Result<()> {
        std::fs::create_dir_all(path).map_err(|e| Error::io("creating", path, e))
    }

    fn stat(&self, path: &Path) -> Result<Option<FileKind>> {
        use nix::sys::stat::SFlag;
        match nix::sys::stat::stat(path) {
            Ok(st) => Ok(Some(
                match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
                    SFlag::S_IFDIR => FileKind::Dir,
                    SFlag::S_IFREG => FileKind::File,
                    SFlag::S_IFBLK => FileKind::BlockDevice,
                    _ => FileKind::Other,
                },
            )),
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(e) => Err(Error::io("stat", path, e.into())),
        }
    }

    fn statvfs(&self, path: &Path) -> Result<FsUsage> {
        let st =
            nix::sys::statvfs::statvfs(path).map_err(|e| Error::io("statvfs", path, e.into()))?;
        let frsize = st.fragment_size() as u64;
        Ok(FsUsage {
            total_bytes: st.blocks() as u64 * frsize,
            free_bytes: st.blocks_free() as u64 * frsize,
            available_bytes: st.blocks_available() as u64 * frsize,
            total_inodes: st.files() as u64,
            free_inodes: st.files_free() as u64,
            available_inodes: st.files_available() as u64,
        })
    }
}

impl RealHost {
    /// A mount syscall (`safepath`, through sys-mount or the new mount API) on the
    /// blocking pool under the mount deadline. A syscall cannot be killed: at the deadline
    /// the call answers DeadlineExceeded and returns, releasing its per-volume guard,
    /// while the thread stays in the kernel and the mount may still land (or go) later.
    /// So `at` is entered in `mount::InFlight` here, before the thread starts, and left by the
    /// thread when the syscall returns: until then every call on `at` answers Aborted
    /// (`safepath::open`), even when this call's future was dropped before the deadline.
    async fn blocking(
        &self,
        what: String,
        at: &Path,
        f: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let busy = mount::InFlight::enter(at)?;
        let (began, deadline, late) = (Instant::now(), self.mount_timeout, what.clone());
        let task = tokio::task::spawn_blocking(move || {
            let r = f();
            if began.elapsed() > deadline {
                let error = r.as_ref().err().map(ToString::to_string);
                tracing::warn!(call = %late, took = ?began.elapsed(), ?error, "mount syscall returned after its deadline; its path is free again");
            }
            drop(busy);
            r
        });
        match tokio::time::timeout(self.mount_timeout, task).await {
            Err(_) => Err(Error::Command(CommandError::Timeout {
                command: format!("{what} (still in the kernel; its path is refused until done)"),
                after: self.mount_timeout,
            })),
            Ok(Err(join)) => Err(HostError::TaskFailed {
                what,
                why: join.to_string(),
            }
            .into()),
            Ok(Ok(r)) => r,
        }
    }
}

/// Whether CAP_SYS_RESOURCE (bit 24) is in this process's effective set
/// (/proc/self/status CapEff, proc(5)); false when unreadable.
fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

fn is_mount_point(host: &RealHost, path: &Path) -> Result<bool> {
    Ok(mount::at(&host.mount_table()?, path).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::hold_when_free;
    use std::fs::File;

    fn host() -> RealHost {
        RealHost {
            command_timeout: Duration::from_secs(5),
            mount_timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn a_hold_waits_for_a_short_lock_and_gives_up_on_a_long_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk");
        std::fs::write(&file, b"").unwrap();
        let lock = |f: &Path| {
            nix::fcntl::Flock::lock(
                File::open(f).unwrap(),
                nix::fcntl::FlockArg::LockExclusiveNonblock,
            )
            .map_err(|(_, e)| e)
            .unwrap()
        };
        let other = lock(&file);
        let err = hold_when_free(&host(), &file, Duration::from_millis(200))
            .await
            .err()
            .expect("held elsewhere");
        assert!(
            matches!(err, Error::Host(HostError::DeviceLocked { .. })),
            "{err}"
        );
        // Released while the hold waits (udev's probe is this short).
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(other);
        });
        let hold = hold_when_free(&host(), &file, Duration::from_secs(10)).await;
        assert!(hold.is_ok(), "taken once released");
        release.await.unwrap();
        drop(hold);
        drop(lock(&file));
    }

    #[tokio::test]
    async fn a_path_whose_mount_syscall_outlives_its_deadline_is_refused_until_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let roots = vec![dir.path().to_owned()];
        let path = dir.path().join("staging");
        let host = RealHost {
            command_timeout: Duration::from_secs(5),
            mount_timeout: Duration::from_millis(50),
        };
        // A syscall that takes longer than the deadline (as a mount(2) stuck on a slow
        // device does); the thread goes on after the call has answered.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let err = host
            .blocking("mount staging".into(), &path, move || {
                let _ = rx.recv();
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Command(CommandError::Timeout { .. })),
            "{err}"
        );
        let open = || safepath::open("f", &roots, &path, safepath::Create::Dir, None);
        let refused = open().unwrap_err();
        let in_flight = |e: &Error| matches!(e, Error::Host(HostError::MountInFlight { .. }));
        assert!(in_flight(&refused), "{refused}");
        assert!(refused.to_string().contains("still running"), "{refused}");
        let again = host.blocking("again".into(), &path, || Ok(())).await;
        assert!(
            again.as_ref().is_err_and(in_flight),
            "no second syscall meanwhile"
        );
        tx.send(()).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while open().is_err() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(open().unwrap().is_some(), "free once the syscall returned");
    }
}
