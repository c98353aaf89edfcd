//! The smallest device each filesystem's installed mkfs accepts, so that CreateVolume never
//! makes a volume that NodeStage cannot format. Read from the mkfs itself, not a constant
//! that drifts between versions: dry runs on a sparse file of the command the real mkfs
//! runs, stripe geometry included (`os::mkfs::dry_run_command`),
//! a binary search once per filesystem at first use, cached for the process's life.
//! xfsprogs 5.19+ refuses data sections under 300 MiB (mkfs/xfs_mkfs.c: `sb_dblocks <
//! MEGABYTES(300, ...)` -> "Filesystem must be larger than 300MB", skipped when fstests'
//! TEST_DIR, TEST_DEV and QA_CHECK_FS are all set: the dry run sees the driver's environment,
//! as the real mkfs does); e2fsprogs formats from some 60 KiB but gives no journal under
//! 2048 blocks, and an ext4 volume is only a size that gets one (`no_journal`).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::memfd::{memfd_create, MFdFlags};
use tokio::sync::OnceCell;

use crate::error::{AllocationError, Error, Result};
use crate::os::{mkfs, runner, FsType, StripeGeometry};

/// Search step and floor: mkfs sizes are in 4 KiB blocks at most.
const STEP: u64 = 4096;
/// Above this every mkfs is expected to succeed; a refusal here means mkfs is broken.
const CEILING: u64 = 64 << 30;
/// Deadline of one dry run (they take milliseconds).
const DRY_RUN_TIMEOUT: Duration = Duration::from_secs(20);

/// One search per filesystem and stripe geometry: a stripe unit changes the floor
/// (mkfs.xfs 6.1 caps the log's stripe unit at 256 KiB and then wants a 64 MiB log, so a
/// 512 KiB-chunk xfs needs some 560 MiB where a plain one needs 300 MiB).
type Key = (FsType, Option<StripeGeometry>);
static FOUND: Mutex<Option<HashMap<Key, Arc<OnceCell<u64>>>>> = Mutex::new(None);

/// The smallest size in bytes that the installed mkfs of `fs` accepts with `stripe`'s
/// geometry (a multiple of 4 KiB).
pub async fn min_bytes(fs: FsType, stripe: Option<StripeGeometry>) -> Result<u64> {
    let cell = {
        let mut found = FOUND
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        found
            .get_or_insert_with(HashMap::new)
            .entry((fs, stripe))
            .or_default()
            .clone()
    };
    cell.get_or_try_init(|| search(fs, stripe)).await.copied()
}

async fn search(fs: FsType, stripe: Option<StripeGeometry>) -> Result<u64> {
    let scratch = Scratch::new().map_err(|e| AllocationError::NoScratchFile {
        fs: fs.as_str(),
        why: e.to_string(),
    })?;
    if !accepts(fs, stripe, &scratch, CEILING).await? {
        return Err(AllocationError::MkfsRefusesAll {
            fs: fs.as_str(),
            gib: CEILING >> 30,
        }
        .into());
    }
    // Invariant: `hi` accepted, `lo` refused (or the floor).
    let (mut lo, mut hi) = (0u64, CEILING / STEP);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if accepts(fs, stripe, &scratch, mid * STEP).await? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let min = hi * STEP;
    tracing::info!(
        fs = fs.as_str(),
        stripe = ?stripe,
        min_bytes = min,
        "smallest filesystem read from mkfs"
    );
    Ok(min)
}

/// The dry runs' sparse device: a memory file with no name in any directory, so that no
/// scratch file outlives the driver however it ends (a SIGKILL mid-search included); the
/// kernel frees it with its last descriptor. mkfs opens it through the driver's
/// descriptor in /proc, which both mkfs.ext4 and mkfs.xfs take as a regular file. Dry runs
/// only read, so its up to 64 GiB stay holes and take no memory.
struct Scratch {
    file: std::fs::File,
    /// `/proc/<driver pid>/fd/<n>`: the child's own `/proc/self` would name the child.
    path: PathBuf,
}

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        let fd = memfd_create(c"gds-csi-fs-min", MFdFlags::MFD_CLOEXEC)?;
        let file = std::fs::File::from(fd);
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            file.as_raw_fd()
        ));
        Ok(Scratch { file, path })
    }
}

/// One dry run on a sparse file of `bytes`, with the arguments the real mkfs gets.
async fn accepts(
    fs: FsType,
    stripe: Option<StripeGeometry>,
    scratch: &Scratch,
    bytes: u64,
) -> Result<bool> {
    scratch.file.set_len(bytes).map_err(|e| Error::Io {
        context: "sizing the mkfs dry-run file",
        path: scratch.path.clone(),
        source: e,
    })?;
    let (program, args) = mkfs::dry_run_command(&scratch.path, fs, stripe);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let out = runner::run_raw(program, &args, DRY_RUN_TIMEOUT)
        .await
        .map_err(|e| AllocationError::DryRunFailed {
            fs: fs.as_str(),
            program: program.to_string(),
            why: e.to_string(),
        })?;
    Ok(out.status.success() && !(fs == FsType::Ext4 && no_journal(&out.stderr)))
}

/// Whether mke2fs said the filesystem gets no journal. The driver mounts ext4 with
/// `data=ordered` (GDS needs it), which the kernel refuses without a journal
/// (fs/ext4/super.c `__ext4_fill_super`: "can't mount with data=, fs mounted w/o
/// journal"), so such a size formats but never stages. e2fsprogs gives no journal to a
/// filesystem under 2048 blocks (lib/ext2fs/mkjournal.c `ext2fs_default_journal_size`)
/// and says so on stderr, `-q` or not, dry run included (misc/util.c
/// `figure_journal_size`, called by misc/mke2fs.c before its `noaction` exit).
fn no_journal(stderr: &[u8]) -> bool {
    String::from_utf8_lossy(stderr).contains("too small for a journal")
}

/// The capacity range with `required_bytes` raised to the filesystem's minimum, or
/// OutOfRange when `limit_bytes` forbids a device that mkfs would accept.
pub fn fit(fs: FsType, min: u64, required: u64, limit: u64) -> Result<u64> {
    if limit > 0 && limit < min {
        return Err(AllocationError::LimitBelowFsMinimum {
            limit,
            fs: fs.as_str(),
            min,
        }
        .into());
    }
    Ok(required.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_rounds_up_or_refuses_with_the_limit() {
        let min = 300 << 20;
        assert_eq!(fit(FsType::Xfs, min, 100 << 20, 0).unwrap(), min);
        assert_eq!(fit(FsType::Xfs, min, 400 << 20, 0).unwrap(), 400 << 20);
        assert_eq!(fit(FsType::Xfs, min, 0, 1 << 30).unwrap(), min);
        let e = fit(FsType::Xfs, min, 100 << 20, 200 << 20).unwrap_err();
        assert!(matches!(
            e,
            Error::Allocation(AllocationError::LimitBelowFsMinimum { .. })
        ));
        assert!(e.to_string().contains("limit_bytes") && e.to_string().contains("xfs"));
    }
}
