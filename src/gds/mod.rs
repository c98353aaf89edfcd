//! GPUDirect Storage: whether it works here, proven rather than assumed. `gate` decides
//! NodePublishVolume from the node's and the volume's checks (crates/gds-check); `readiness`
//! keeps the node's GDS topology labels current; `doctor` prints the same checks for an
//! operator, for the node, a volume, a workload pod and from inside a workload container;
//! `workload` is the device plugin that gives workload pods what cuFile needs.

pub mod doctor;
pub mod gate;
pub mod readiness;
pub mod workload;
