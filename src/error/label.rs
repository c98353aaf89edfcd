//! The GPT label's failures (`disk::gpt`), by cause; `error/mod.rs` maps each to a gRPC
//! code with every other error.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
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
    NoSizeInRange(String),
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
    /// A partition asked for by number or PARTUUID is not in the label.
    #[error("no partition {0} in the gds-csi label")]
    NotInLabel(String),
    /// The kernel does not show a partition of the label (a re-read in progress, or
    /// another tool removed it from the kernel's view).
    #[error("partition {number} is not in the kernel's view of {}", device.display())]
    NotInKernel { number: u32, device: PathBuf },
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

impl LabelError {
    pub(crate) fn io(what: &'static str, device: &Path, source: std::io::Error) -> LabelError {
        LabelError::Io {
            what,
            device: device.to_owned(),
            source,
        }
    }

    pub(crate) fn foreign(device: &Path, why: impl Into<String>) -> LabelError {
        LabelError::Foreign {
            device: device.to_owned(),
            why: why.into(),
        }
    }
}
