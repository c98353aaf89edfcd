//! Pool devices carved into GPT partitions (the `partition` and `stripe` block layouts).
//!
//! A partition is the allocation unit: 1 MiB aligned, typed with [`TYPE_GUID`], named
//! with the allocation id, found again by its PARTUUID. Only a label this driver wrote
//! (its disk GUID carries [`gpt::is_ours`]'s mark and every entry has our type) is ever
//! changed; a new label goes only on a device the caller proved blank ([`Blank`]).
//!
//! - [`format`]: the on-disk label (protective MBR, both headers and entry arrays, CRC32s).
//! - [`label`]: reading a device's label and telling ours from foreign; writing it.
//! - [`alloc`]: free extents, the size a CSI CapacityRange asks for, best fit, growth.
//! - [`kernel`]: the kernel's partition table (BLKPG, sysfs), re-sync, nodes, discard.
//! - [`volume`]: the layout's idempotent steps: choose, carve, grow, locate, remove.
//! - [`wholedisk`]: the whole-disk lock udevd honours, and the retries around each step.
//!
//! This module depends only on std, libc, uuid and crc32fast: the layout composes it
//! with the host port (signature probe, wipe, zero-out) and the state store.
//!
//! Ordering that keeps a crash harmless (the layout's job; each step is idempotent):
//! create = label write, then kernel add; grow = label write, then kernel resize;
//! delete = kernel delete, then label write. So the kernel never shows a partition our
//! label lacks, and a start-up [`kernel::resync`] brings back anything it misses.

//!
//! Kernel facts this relies on (6.18 on the dev machine, no CONFIG_EFI_PARTITION; Debian's
//! kernel in the VM rig has it):
//! - BLKPG works on every loop device; partscan (`losetup -P`) is not needed. Loop
//!   partitions get minors of the extended major 259 (loop's max_part is 0 and, built
//!   in, cannot change without a reboot).
//! - Without a GPT parser a re-read (BLKRRPART) drops every partition: on a partscan
//!   loop device at once, on a plain one it fails (EINVAL) and they stay. A plain loop
//!   device keeps its partitions after `losetup -d`; delete them first.
//! - systemd-udevd watches disks and, after a writer closes one, re-reads its table:
//!   `flock(LOCK_EX|LOCK_NB)` then BLKRRPART (systemd src/udev/udevd.c
//!   synthesize_change), which the kernel refuses while a partition is open
//!   (block/partitions/core.c bdev_disk_changed, `open_partitions`). With a GPT parser
//!   that rebuilds our partitions; without one it drops the unused ones, so the layout
//!   locates (and so re-adds) a partition before each use. Every label write and
//!   BLKPG call holds the disk's BSD lock ([`wholedisk`]), so udevd neither probes nor
//!   re-reads meanwhile, and what it does after is waited out.

pub mod alloc;
pub mod format;
pub mod kernel;
pub mod label;
pub mod volume;
pub mod wholedisk;

use std::path::{Path, PathBuf};

pub use alloc::{Extent, Held, SizeRange, ALIGN};
pub use format::{Entry, Label, TYPE_GUID};
pub use kernel::{Erased, KernelPartition, Located, Resync};
pub use label::{Blank, OnDisk};
pub use volume::{Carved, Recorded};

/// What went wrong, by cause; the service maps each to a gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O call on a device failed.
    #[error("{what} {}: {source}", device.display())]
    Io {
        what: &'static str,
        device: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The device holds something not written by this driver; nothing was changed.
    #[error("{} is not carved by gds-csi: {why}; it is never partitioned or changed (give the driver a blank device, or wipe this one yourself if its data is not needed)", device.display())]
    Foreign { device: PathBuf, why: String },
    /// A new label was asked for, but the device is not blank.
    #[error("{} is not blank: {why}; a new partition table is written only on a device with no signature", device.display())]
    NotBlank { device: PathBuf, why: String },
    /// No 1 MiB-aligned size lies within the requested range (CSI OutOfRange).
    #[error("capacity_range: {0}")]
    OutOfRange(String),
    /// No free extent is large enough (CSI ResourceExhausted).
    #[error("no free extent of {wanted} bytes: the largest is {largest} bytes")]
    NoSpace { wanted: u64, largest: u64 },
    /// Every partition entry of the label is used (CSI ResourceExhausted).
    #[error(
        "all {entries} partition entries of the label are used: the device holds no more \
         volumes (the kernel registers at most 255 partitions a disk)"
    )]
    NoEntry { entries: usize },
    /// Growing in place is blocked by the partition that follows.
    #[error("partition {number} cannot grow to {wanted} bytes in place: {blocker}")]
    Blocked {
        number: u32,
        wanted: u64,
        blocker: String,
    },
    /// A volume's label or entry was changed by another tool: what changed and how to
    /// undo it (CSI FAILED_PRECONDITION; nothing was changed).
    #[error("{0}")]
    Changed(String),
    /// A partition asked for by number or name is not in the label.
    #[error("no partition {0} in the gds-csi label")]
    NotFound(String),
    /// The name is already carved with another size (CSI ALREADY_EXISTS).
    #[error("partition {number} is already named {name:?}, with {len} bytes")]
    NameTaken { name: String, number: u32, len: u64 },
    /// A bad argument from the caller (a name too long, a size not aligned).
    #[error("{0}")]
    Invalid(String),
    /// The kernel refused a BLKPG change.
    #[error("the kernel refused to {op} partition {number} of {}: {source}{hint}", device.display())]
    Kernel {
        op: &'static str,
        number: u32,
        device: PathBuf,
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A chunk of a discard took longer than its deadline.
    #[error("{what} of {} timed out after {after:?} at byte {at}", device.display())]
    Timeout {
        what: &'static str,
        device: PathBuf,
        at: u64,
        after: std::time::Duration,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(what: &'static str, device: &Path, source: std::io::Error) -> Error {
        Error::Io {
            what,
            device: device.to_owned(),
            source,
        }
    }

    pub(crate) fn foreign(device: &Path, why: impl Into<String>) -> Error {
        Error::Foreign {
            device: device.to_owned(),
            why: why.into(),
        }
    }
}
