//! The narrow port to the host: external commands with deadlines, block devices (what
//! they are, what is on them, holding and zeroing them), mkfs, mounts and the mount
//! table. `Host` is injected into the services so tests can substitute a recording
//! double; `RealHost` is chosen in `main`, wrapped in `TimedHost` for the metrics.

pub mod blockdev;
pub mod host;
pub mod mkfs;
pub mod mount;
pub mod runner;
pub mod safepath;
pub mod socket;

pub use crate::error::HostError;
pub use blockdev::{hold_when_free, DeviceUse, Signature, HOLD_PATIENCE};
pub use host::{DeviceHold, FileKind, ForceUnmount, FsUsage, Host, RealHost, TimedHost};
pub use mkfs::{FsType, StripeGeometry};
pub use mount::MountEntry;
pub use safepath::Anchored;
