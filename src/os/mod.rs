//! The narrow port to the host: external commands with deadlines, the mount table,
//! block-device signatures, mkfs and mounts. `Host` is injected into the services so
//! tests can substitute a recording double; `RealHost` is chosen in `main`.

pub mod host;
pub mod mountinfo;
pub mod runner;

pub use host::{hold_when_free, DeviceHold, FsType, Host, RealHost, Signature, HOLD_PATIENCE};
pub use mountinfo::MountEntry;
