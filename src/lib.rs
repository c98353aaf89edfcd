//! gds-csi: a CSI driver whose volumes are readable with NVIDIA GPUDirect Storage.
//!
//! Dependencies point one way: `service` (gRPC handlers) → `request` (CSI requests parsed
//! into domain types) → `volume` (the backend seam and its two backends) → the parts the
//! backends compose → `os` (the narrow port to the host).
//!
//! - `service`: the Controller, Node and Identity handlers, the socket server.
//! - `request`: every CSI request and StorageClass parameter parsed and checked.
//! - `volume`: the `VolumeBackend` seam, volume ids, `block` (node-local volumes on NVMe:
//!   whole device, GPT partition, md stripe) and `nfs` (a directory per volume over RDMA).
//! - `pool`: the node's devices, their identity and the allocation state.
//! - `gpt`: the GPT codec and the kernel's partition table; `md`: mdadm's arrays.
//! - `copy`: the verified, resumable, parallel copy engine that fills clones.
//! - `snapshot`: CSI snapshots kept on a store any node reaches (NFS or a directory),
//!   taken as jobs, restored through the clone fill.
//! - `mounts`: the mount-table logic both backends share.
//! - `gds`: the GPUDirect Storage gate, readiness labels and `doctor`.
//! - `workload`: the kubelet device plugin that gives workload pods what cuFile needs
//!   (the nvidia-fs devices, the udev database, a cufile.json per GDS policy).
//! - `metrics`: the Prometheus endpoint; `config`: flags; `error`: errors by cause and
//!   the one map to gRPC codes; `jobs`, `locks`, `state_dir`, `faults`: long jobs a retry
//!   joins, per-volume guards, the state directory, test-only kill points.

pub mod config;
pub mod copy;
pub mod csi;
pub mod error;
pub mod faults;
pub mod gds;
pub mod gpt;
pub mod jobs;
pub mod locks;
pub mod md;
pub mod metrics;
pub mod mounts;
pub mod os;
pub mod pool;
pub mod request;
pub mod service;
pub mod snapshot;
pub mod state_dir;
pub mod volume;
pub mod workload;
