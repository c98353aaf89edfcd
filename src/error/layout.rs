//! Errors of the partition and stripe layouts (src/volume/block/partition/, stripe/) and
//! of the partition label (`super::LabelError`), each answered with the code its cause calls for.

use std::path::PathBuf;
use std::time::Duration;

use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Nothing the pool holds now can take the volume (partitions or stripe members).
    #[error("{why}")]
    NoRoom { why: String },
    #[error("required_bytes {required} is too large")]
    TooLarge { required: u64 },
    #[error(
        "capacity_range: {members} members of a multiple of {unit} bytes (the stripeChunk and \
         1 MiB) give {capacity} bytes for required_bytes {required}, beyond limit_bytes \
         {limit}; ask for a multiple of {} bytes or raise limit_bytes",
        unit * members
    )]
    StripeBeyondLimit {
        members: u64,
        unit: u64,
        capacity: u64,
        required: u64,
        limit: u64,
    },
    #[error(
        "pool device {device_id} ({device_key}) holding {holding} is not in the pool; \
         reattach it and retry"
    )]
    DeviceNotInPool {
        device_id: String,
        device_key: String,
        /// "the volume's partition" or "a stripe member".
        holding: &'static str,
    },
    #[error(
        "stripe member {index} of volume {volume} is on pool device {device_id} \
         ({device_key}), which is not attached; reattach it and retry"
    )]
    MemberDetached {
        index: usize,
        volume: String,
        device_id: String,
        device_key: String,
    },
    #[error(
        "stripe member {index} of volume {volume} (partition {partition}) on drive \
         {device_id} ({device_key}) is missing; reattach the drive; the array is never \
         re-created over the remaining members"
    )]
    MemberMissing {
        index: usize,
        volume: String,
        partition: String,
        device_id: String,
        device_key: String,
    },
    #[error(
        "stripe member {index} ({}, drive {}) of volume {volume} is not blank ({found}); the \
         array is not created over it",
        node.display(),
        drive.display()
    )]
    MemberNotBlank {
        index: usize,
        node: PathBuf,
        drive: PathBuf,
        volume: String,
        found: String,
    },
    #[error(
        "stripe member {index} ({}, drive {}) of volume {volume} does not carry the md \
         superblock of its array {uuid}; nothing was assembled or re-created",
        node.display(),
        drive.display()
    )]
    MemberNotOfArray {
        index: usize,
        node: PathBuf,
        drive: PathBuf,
        volume: String,
        uuid: String,
    },
    #[error("stripe member {} of volume {volume} is in use: {uses}; {fix}", member.display())]
    MemberInUse {
        member: PathBuf,
        volume: String,
        uses: String,
        fix: &'static str,
    },
    #[error(
        "the md array {} of volume {volume} is in use: {uses}; unpublish and unstage the \
         volume first",
        array.display()
    )]
    ArrayInUse {
        array: PathBuf,
        volume: String,
        uses: String,
    },
    #[error("mdadm --create for volume {volume} left no superblock on {}", member.display())]
    NoSuperblockAfterCreate { volume: String, member: PathBuf },
    #[error("the md array {uuid} of volume {volume} is not running after mdadm said so")]
    ArrayNotRunning { uuid: String, volume: String },
    #[error(
        "volume {volume} was formatted but has no recorded md array; its members are left as \
         they are: inspect them by hand"
    )]
    FormattedWithoutArray { volume: String },
    /// The device numbers of a member or an array could not be read.
    #[error("{what} {why}")]
    NoDeviceNumber { what: &'static str, why: String },
    #[error("{} is gone", node.display())]
    PartitionGone { node: PathBuf },
    #[error("volume {volume} is still in use: {uses}; unpublish and unstage it first")]
    PartitionInUse { volume: String, uses: String },
    /// ControllerExpandVolume is moving the volume to a larger extent of its drive.
    #[error(
        "volume {volume} is being moved to a larger extent of its drive to grow \
         (ControllerExpandVolume); retry once that finishes"
    )]
    Moving { volume: String },
    /// What a partition to be erased carries is not the volume's own: left as it is.
    #[error("{why}")]
    NotOurs { why: String },
    #[error("zero-out task failed: {why}")]
    ZeroTaskFailed { why: String },
    /// An earlier label call on the device is still blocked in the kernel.
    #[error(
        "{what} on {}: an earlier label write or partition-table ioctl on this device \
         outlived its deadline and is still blocked in the kernel; the device is refused \
         until it returns (retry later; check dmesg and the drive's health if it never does)",
        device.display()
    )]
    DeviceStuck { what: String, device: PathBuf },
    /// This label call outlived its deadline; it may yet land.
    #[error(
        "{what} on {} did not finish within {after:?} and is still blocked in the kernel; the \
         device is refused until it returns (retry later; check dmesg and the drive)",
        device.display()
    )]
    Overran {
        what: String,
        device: PathBuf,
        after: Duration,
    },
    #[error(
        "mdadm is not installed where the driver runs; stripe volumes need it (Debian package \
         mdadm in the driver image)"
    )]
    MdadmMissing,
    #[error("mdadm {what} failed ({status}): {stderr}")]
    MdadmFailed {
        what: String,
        status: String,
        stderr: String,
    },
    #[error("mdadm --examine --export printed no {key}: {text:?}")]
    MdadmExportLacks { key: String, text: String },
    #[error("mdadm MD_DEVICES {devices:?} is no number")]
    MdadmBadDevices { devices: String },
    #[error("{what}: its thread died")]
    ThreadDied { what: &'static str },
    #[error("{what}: no thread: {why}")]
    NoThread { what: String, why: String },
}

impl LayoutError {
    pub(super) fn code(&self) -> Code {
        match self {
            LayoutError::NoRoom { .. } => Code::ResourceExhausted,
            LayoutError::TooLarge { .. } | LayoutError::StripeBeyondLimit { .. } => {
                Code::OutOfRange
            }
            LayoutError::DeviceStuck { .. }
            | LayoutError::Overran { .. }
            | LayoutError::Moving { .. } => Code::Aborted,
            _ => Code::FailedPrecondition,
        }
    }

    /// A label call still blocked in the kernel: it may yet land, so what it changes is
    /// kept as pending rather than undone.
    pub fn is_pending(&self) -> bool {
        matches!(
            self,
            LayoutError::DeviceStuck { .. } | LayoutError::Overran { .. }
        )
    }
}

/// A partition label's error by the code its cause calls for.
pub(super) fn label_code(e: &super::LabelError) -> Code {
    match e {
        super::LabelError::NoSizeInRange(_) => Code::OutOfRange,
        super::LabelError::NoSpace { .. }
        | super::LabelError::NoEntry { .. }
        | super::LabelError::Blocked { .. } => Code::ResourceExhausted,
        super::LabelError::NotInLabel(_) | super::LabelError::NotInKernel { .. } => Code::NotFound,
        super::LabelError::NameTaken { .. } => Code::AlreadyExists,
        _ => Code::FailedPrecondition,
    }
}
