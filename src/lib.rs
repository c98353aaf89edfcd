//! gds-csi: a CSI driver whose volumes are readable with NVIDIA GPUDirect Storage.
//!
//! Dependencies point one way, down this page: the handlers, the domain they call (each
//! module above the ones it uses), the narrow port to the host; the leaves at the end are
//! used by every layer. docs/design.md ("Shape") names the imports that still run up.

// Handlers: the Controller, Node and Identity services and the socket server. Each
// parses its request once, takes the guard of what it touches and calls the domain.
pub mod service;

// Domain: CSI snapshots kept on a store any node reaches (NFS or a directory), taken as
// jobs, restored through the clone fill.
pub mod snapshot;

// Domain: the `VolumeBackend` seam, volume ids, `block` (node-local volumes on NVMe:
// whole device, GPT partition, md stripe) and `nfs` (a directory per volume over RDMA),
// and the parts both share: `copy` (the verified, resumable copy engine that fills
// clones) and `mounts` (the mount-table logic).
pub mod volume;

// Domain: every CSI request and StorageClass parameter parsed and checked into the
// domain types the backends take.
pub mod request;

// Domain: the GPUDirect Storage gate, readiness labels, `doctor`, and `workload`: the
// kubelet device plugin that gives workload pods what cuFile needs, and the checks of a
// workload container.
pub mod gds;

// Domain: the node's devices, their identity, the allocation state, and where a volume
// gets its data (`pool::source`).
pub mod pool;

// Domain: how the block layouts lay out a drive: the GPT label codec and the kernel's
// partition table (`disk::gpt`), mdadm's arrays (`disk::md`).
pub mod disk;

// Host port: commands with deadlines, mounts, probes, mkfs, paths opened beneath a root,
// the unix socket.
pub mod os;

// Leaves: the CSI API generated from `proto/csi.proto`; errors by cause and the one map
// to gRPC codes; the Prometheus endpoint; configuration, long jobs a retry joins, the
// handlers' guards, the state directory and test-only kill points (`runtime`).
pub mod csi;
pub mod error;
pub mod metrics;
pub mod runtime;
