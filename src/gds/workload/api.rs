//! The kubelet's device plugin API v1beta1: the code generated from the vendored
//! `proto/deviceplugin.proto` (k8s.io/kubelet v0.34.3), and the constants of its package
//! (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/constants.go).

mod generated {
    #![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    tonic::include_proto!("v1beta1");
}
pub use generated::*;

/// The API version a plugin registers with; the kubelet refuses any other
/// (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go:163-167 in Kubernetes 1.34.3).
pub const VERSION: &str = "v1beta1";
/// The kubelet's Registration socket in its device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// A device's `health`: only `Healthy` devices are allocatable (devicemanager/manager.go:293).
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
