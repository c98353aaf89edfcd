//! A pool device whose writes block in the kernel until thawed, as a hung drive's do: a
//! loop device over a file on a small ext4 of its own (itself on a loop device), frozen
//! with `fsfreeze`. The loop driver's writes to the backing file wait for the thaw.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use gds_csi::disk::gpt::kernel;

const MIB: u64 = 1 << 20;

pub struct FrozenDevice {
    /// Holds both images; free for the test's own files (a state directory).
    pub dir: tempfile::TempDir,
    /// The loop device the test uses (`size` bytes).
    pub dev: PathBuf,
    outer: PathBuf,
    mnt: PathBuf,
}

impl FrozenDevice {
    /// A `size`-byte device; `None` without root (the caller skips).
    pub fn new(size: u64) -> Option<FrozenDevice> {
        if !super::is_root() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gds-freeze-")
            .tempdir_in("/tmp")
            .unwrap();
        let img = dir.path().join("outer.img");
        fs::File::create(&img)
            .unwrap()
            .set_len(size + 64 * MIB)
            .unwrap();
        super::run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
        let outer = super::attach_loop(&img);
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        super::run("mount", &[outer.to_str().unwrap(), mnt.to_str().unwrap()]);
        let inner = mnt.join("dev.img");
        fs::File::create(&inner).unwrap().set_len(size).unwrap();
        let dev = super::attach_loop(&inner);
        Some(FrozenDevice {
            dir,
            dev,
            outer,
            mnt,
        })
    }

    /// Freezes (`true`) or thaws the filesystem under the device.
    pub fn freeze(&self, on: bool) {
        let flag = if on { "-f" } else { "-u" };
        super::run("fsfreeze", &[flag, self.mnt.to_str().unwrap()]);
    }
}

/// Thaws the device when dropped, even after a failed assertion: declared after the
/// rig, it goes first, so the rig's SIGKILL of a driver blocked on the frozen device can
/// take effect.
pub struct ThawOnDrop<'a>(pub &'a FrozenDevice);

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .args(["-u", self.0.mnt.to_str().unwrap()])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for FrozenDevice {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .args(["-u", self.mnt.to_str().unwrap()])
            .stderr(Stdio::null())
            .status();
        // The partitions leave the kernel before the loop device goes (a plain loop
        // device keeps them after `losetup -d`); busy while a blocked write returns.
        for p in kernel::list(&self.dev).unwrap_or_default() {
            for _ in 0..100 {
                if kernel::delete(&self.dev, p.number).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        super::detach_loop(&self.dev);
        // The inner device goes once a write that was blocked has returned: retry.
        for _ in 0..100 {
            let umount = Command::new("umount").arg(&self.mnt).status();
            if umount.is_ok_and(|s| s.success()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        super::detach_loop(&self.outer);
    }
}
