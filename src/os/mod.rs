//! The narrow port to the host: external commands with deadlines, the mount table,
//! block-device signatures, mkfs and mounts. `Host` is injected into the services so
//! tests can substitute a recording double; `RealHost` is chosen in `main`.

pub mod blockdev;
mod device_io;
mod fd_mount;
pub mod host;
pub mod inflight;
pub mod mkfs;
pub mod mountinfo;
pub mod runner;
pub mod safepath;
mod signatures;
pub mod socket;
pub mod timed;

pub use crate::error::HostError;
pub use blockdev::DeviceUse;
pub use device_io::{hold_when_free, HOLD_PATIENCE};
pub use host::{DeviceHold, FileKind, ForceUnmount, FsUsage, Host, RealHost};
pub use mkfs::{FsType, StripeGeometry};
pub use mountinfo::MountEntry;
pub use safepath::Anchored;
pub use signatures::Signature;
