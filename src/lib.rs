//! gds-csi: a CSI driver whose volumes are readable with NVIDIA GPUDirect Storage.
//!
//! Layout: `service` holds the thin gRPC handlers, `request` turns CSI requests into
//! validated domain types, `backend` is the interface that `block` and `nfs` implement,
//! `mounts` the mount-table logic they share, `pool` owns the node's devices and the allocation state,
//! `os` is the narrow port to the host (commands, mounts, signatures).

pub mod backend;
pub mod block;
pub mod clone;
pub mod config;
pub mod csi;
pub mod doctor;
pub mod doctor_pod;
pub mod error;
pub mod faults;
pub mod gds_gate;
pub mod host_timing;
pub mod jobs;
pub mod locks;
pub mod md;
pub mod metrics;
pub mod mounts;
pub mod nfs;
pub mod os;
pub mod partition;
pub mod pool;
pub mod readiness;
pub mod request;
pub mod server;
pub mod service;
pub mod state_dir;
pub mod volume_id;
