//! Errors of volume expansion (ControllerExpandVolume, NodeExpandVolume), each answered
//! with the code its cause calls for: OutOfRange is the CSI code for a capacity the
//! volume cannot have.

use std::path::PathBuf;

use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    /// Another node's volume: its own driver answers (a code the resizer treats as
    /// neither final nor infeasible; src/volume/block/expand.rs says why).
    #[error(
        "volume {volume} lives on node {node}, not on this node ({this}); that node's driver \
         expands it"
    )]
    OtherNode {
        volume: String,
        node: String,
        this: String,
    },
    #[error(
        "capacity_range: volume {volume} is the whole device {} of {size} bytes and cannot \
         grow to {required} bytes; whole-device volumes have the size of their device: use a \
         StorageClass with `layout: partition` for volumes that can grow",
        device.display()
    )]
    WholeDevice {
        volume: String,
        device: PathBuf,
        size: u64,
        required: u64,
    },
    #[error(
        "capacity_range: volume {volume} is a stripe (layout: stripe) of {size} bytes and \
         cannot change size to {required} bytes (limit {limit}); stripe volumes do not grow \
         yet: create a larger volume and copy the data, or use a StorageClass with \
         `layout: partition` for volumes that can grow"
    )]
    StripeFixed {
        volume: String,
        size: u64,
        required: u64,
        limit: u64,
    },
    #[error(
        "capacity_range: volume {volume} has {size} bytes, more than limit_bytes {limit}; \
         volumes never shrink"
    )]
    WouldShrink {
        volume: String,
        size: u64,
        limit: u64,
    },
    #[error(
        "capacity_range: volume {volume} cannot grow to {wanted} bytes in place ({blocked}) \
         while it is in use ({uses}); it grows once no pod uses it (offline expansion: the \
         driver then moves it to a larger extent of its drive, {free} bytes free there, the \
         largest free extent {largest} bytes)"
    )]
    InUse {
        volume: String,
        wanted: u64,
        blocked: String,
        uses: String,
        free: u64,
        largest: u64,
    },
    #[error(
        "capacity_range: volume {volume} cannot grow to {wanted} bytes: {blocked}, and {} has \
         no free extent that large to move it to ({free} bytes free, the largest extent \
         {largest} bytes); ask for less, or free space on that drive",
        device.display()
    )]
    NoRoomToMove {
        volume: String,
        blocked: String,
        device: PathBuf,
        wanted: u64,
        free: u64,
        largest: u64,
    },
    #[error(
        "capacity_range: the device of volume {volume} has {size} bytes, less than \
         required_bytes {required}; ControllerExpandVolume grows it first"
    )]
    DeviceSmaller {
        volume: String,
        size: u64,
        required: u64,
    },
    #[error(
        "pool device {device_id} of volume {volume} is not in the pool; reattach it and retry"
    )]
    DeviceNotInPool { device_id: String, volume: String },
    #[error("volume {volume} has no partition recorded yet; retry CreateVolume first")]
    NoPartitionRecorded { volume: String },
    #[error("volume {volume}: bad PARTUUID: {why}")]
    BadPartuuid { volume: String, why: String },
}

impl ExpandError {
    pub(super) fn code(&self) -> Code {
        match self {
            ExpandError::OtherNode { .. } => Code::Aborted,
            ExpandError::DeviceNotInPool { .. }
            | ExpandError::InUse { .. }
            | ExpandError::NoPartitionRecorded { .. }
            | ExpandError::BadPartuuid { .. } => Code::FailedPrecondition,
            _ => Code::OutOfRange,
        }
    }
}
