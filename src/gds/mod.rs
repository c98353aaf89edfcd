//! GPUDirect Storage: whether it works here, proven rather than assumed. `gate` decides
//! NodePublishVolume from the node's and the volume's checks (crates/gds-check); `readiness`
//! keeps the node's GDS topology labels current; `doctor` prints the same checks for an
//! operator; `doctor_pod` runs them inside a workload-shaped pod.

pub mod doctor;
pub mod doctor_pod;
pub mod gate;
pub mod readiness;
pub mod workload;
