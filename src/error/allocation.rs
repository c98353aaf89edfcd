//! Errors of CreateVolume's allocation: a name taken, nothing that fits, the smallest
//! filesystem, each answered with the code its cause calls for.

use tonic::Code;

use super::Error;

/// CreateVolume's allocation that cannot be made, by cause.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error(
        "volume {name:?} exists with capacity {bytes} bytes, outside the requested range; use \
         another name or the same capacity_range"
    )]
    NameTakenOtherSize { name: String, bytes: u64 },
    #[error("volume {name:?} exists with other parameters or fsType; use another name")]
    NameTakenOtherParameters { name: String },
    /// An NFS volume's name or directory taken by a request unlike this one.
    #[error(
        "volume {name:?} exists with other parameters, mount options or content source; use \
         another name"
    )]
    NameTakenOtherSource { name: String },
    #[error("directory {dir} already belongs to volume {owner:?}")]
    DirectoryTaken { dir: String, owner: String },
    #[error(
        "volume {name:?} exists with another layout, capacity, fsType or parameters; use \
         another name or the same request"
    )]
    NameTakenOtherLayout { name: String },
    #[error(
        "capacity_range: limit_bytes {limit} is below the smallest {fs} the node's mkfs makes \
         ({min} bytes, {} MiB); raise the limit to at least that, or ask for ext4",
        min.div_ceil(1 << 20)
    )]
    LimitBelowFsMinimum {
        limit: u64,
        fs: &'static str,
        min: u64,
    },
    /// The smallest filesystem the node's mkfs makes could not be read (a dry run).
    #[error("cannot make a scratch file to read the smallest {fs} from its mkfs: {why}")]
    NoScratchFile { fs: &'static str, why: String },
    #[error("cannot read the smallest {fs} from {program}: {why}")]
    DryRunFailed {
        fs: &'static str,
        program: String,
        why: String,
    },
    #[error(
        "the installed mkfs for {fs} refuses even a {gib} GiB device in a dry run; check the \
         node image"
    )]
    MkfsRefusesAll { fs: &'static str, gib: u64 },
    /// CreateVolume whose topology requires another node than this controller's.
    #[error("accessibility_requirements: this controller allocates on node {node} only")]
    NotThisNode { node: String },
    /// No device of the pool could ever hold the range.
    #[error(
        "capacity_range: no device in node {node}'s pool has {range} (volumes are whole \
         devices; device sizes: [{sizes}])"
    )]
    NoDeviceFits {
        node: String,
        range: String,
        sizes: String,
    },
    /// The node's pool holds no device at all: its configuration, not the request, is at
    /// fault. Said so the claim's event tells the operator what to set.
    #[error(
        "node {node}'s device pool is empty{}: no block volume can be made there; list drives \
         with node.poolDevices (--pool-device) or set node.nvmeDiscover (--nvme-discover); \
         `gds-csi pool discover` on the node shows what each drive holds",
        if excluded.is_empty() { String::new() } else { format!(" (left out: {})", excluded.join("; ")) }
    )]
    EmptyPool { node: String, excluded: Vec<String> },
    /// Devices fit, but none is free and clean now.
    #[error(
        "no free clean device with {range} on node {node}; free one by deleting a volume or \
         add devices{}",
        if refused.is_empty() { String::new() } else { format!("; not allocatable: {}", refused.join("; ")) }
    )]
    NoneFree {
        node: String,
        range: String,
        refused: Vec<String>,
    },
    /// Nothing fits once the request was raised to the smallest filesystem mkfs makes.
    #[error(
        "{inner}; the request was raised to {min} bytes, the smallest {fs} the node's mkfs makes"
    )]
    RaisedToFsMinimum {
        inner: Box<Error>,
        min: u64,
        fs: &'static str,
    },
}

impl AllocationError {
    pub(super) fn code(&self) -> Code {
        match self {
            AllocationError::RaisedToFsMinimum { .. }
            | AllocationError::LimitBelowFsMinimum { .. } => Code::OutOfRange,
            AllocationError::NoScratchFile { .. }
            | AllocationError::DryRunFailed { .. }
            | AllocationError::MkfsRefusesAll { .. } => Code::FailedPrecondition,
            AllocationError::NameTakenOtherSize { .. }
            | AllocationError::NameTakenOtherParameters { .. }
            | AllocationError::NameTakenOtherSource { .. }
            | AllocationError::NameTakenOtherLayout { .. }
            | AllocationError::DirectoryTaken { .. } => Code::AlreadyExists,
            AllocationError::NoDeviceFits { .. } => Code::OutOfRange,
            AllocationError::NoneFree { .. }
            | AllocationError::NotThisNode { .. }
            | AllocationError::EmptyPool { .. } => Code::ResourceExhausted,
        }
    }
}
