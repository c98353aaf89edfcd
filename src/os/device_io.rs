//! Holding a block device for a destructive step (util-linux's lock, O_EXCL) and zeroing it
//! (BLKZEROOUT in chunks under a deadline): the erase on delete.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::host::{DeviceHold, Host};
use crate::error::HostError;
use crate::error::{CommandError, Error, Result};

/// How long a destructive step waits for util-linux's lock before answering Aborted.
pub const HOLD_PATIENCE: Duration = Duration::from_secs(10);

/// [`Host::hold_device`], waiting up to `patience` while another program holds
/// util-linux's lock: systemd-udevd takes it for a moment to probe the device after every
/// close-after-write (mkfs's, wipefs's). A device in use is refused at once.
pub async fn hold_when_free(
    host: &dyn Host,
    device: &Path,
    patience: Duration,
) -> Result<DeviceHold> {
    let until = Instant::now() + patience;
    loop {
        match host.hold_device(device) {
            Err(Error::Host(HostError::DeviceLocked { .. })) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
}

/// Blocks zeroed per BLKZEROOUT call: each call is uninterruptible, so the deadline is
/// checked between calls and progress is visible in the logs.
const ZERO_CHUNK: u64 = 1 << 30;

/// `BLKZEROOUT`, `_IO(0x12,127)` in linux include/uapi/linux/fs.h; its argument is
/// `u64[2] = {start, length}` in bytes, both 512-byte aligned.
const BLKZEROOUT: libc::c_ulong = 0x127f;

pub(super) fn device_in_use(device: &Path) -> Error {
    let name = device
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "<device>".into());
    HostError::DeviceInUse {
        device: device.to_owned(),
        name,
    }
    .into()
}

/// Zeroes `[0, size)` of an open device in chunks; a chunk slower than `per_chunk` fails it.
pub(super) fn zero_blocks(
    file: &File,
    device: &Path,
    size: u64,
    per_chunk: Duration,
) -> Result<()> {
    let mut start = 0u64;
    while start < size {
        let len = ZERO_CHUNK.min(size - start);
        let range = [start, len];
        let began = Instant::now();
        // SAFETY: `range` outlives the call; the kernel reads two u64 from it
        // (block/ioctl.c blk_ioctl_zeroout copies `uint64_t range[2]` from user memory).
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT as _, range.as_ptr()) };
        if rc != 0 {
            return Err(Error::io(
                "zeroing (BLKZEROOUT)",
                device,
                std::io::Error::last_os_error(),
            ));
        }
        if began.elapsed() > per_chunk {
            return Err(CommandError::Timeout {
                command: format!("BLKZEROOUT of {} at byte {start}", device.display()),
                after: per_chunk,
            }
            .into());
        }
        start += len;
    }
    Ok(())
}
