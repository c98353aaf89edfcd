//! The claim to re-create, and whether a pod still uses the old one.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Annotations that bind a claim to its old volume or node (the binder's and the
/// scheduler's: k8s.io/component-helpers storage/volume/pv_helpers.go lines 39-76, and
/// the resizer's, kubernetes pkg/volume/util/types/types.go:209). The new claim must
/// start unbound: above all without `selected-node`, which names the lost node.
const BINDING_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "pv.kubernetes.io/migrated-to",
    "volume.kubernetes.io/selected-node",
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-resizer",
];

/// Kubernetes' in-use protection of claims (kubernetes pkg/volume/util/finalizer.go:21).
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// The old claim as it should come back: same name, namespace, labels and annotations
/// less the binding ones, the same spec less `volumeName`; no status, uid, finalizers
/// or resourceVersion. Owner references to Pods are dropped: those pods ran on the lost
/// node and are being garbage-collected, and the collector would take the new claim
/// with them (a StatefulSet's own reference is kept).
pub fn template(old: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let m = &old.metadata;
    let annotations = m.annotations.as_ref().map(|a| {
        a.iter()
            .filter(|(k, _)| !BINDING_ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    });
    let owner_references = m.owner_references.as_ref().and_then(|o| {
        let kept: Vec<_> = o
            .iter()
            .filter(|r| !(r.kind == "Pod" && r.api_version == "v1"))
            .cloned()
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
    let mut spec = old.spec.clone().unwrap_or_default();
    spec.volume_name = None;
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            labels: m.labels.clone(),
            annotations,
            owner_references,
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The rule of Kubernetes' PVC protection controller (kubernetes
/// pkg/controller/volume/pvcprotection/pvc_protection_controller.go:374-388, v1.34): a
/// claim is in use while a pod scheduled to a node names it (a pod not yet scheduled
/// never started, and the kubelet will not start one whose claim is being deleted).
/// Pods bound to the deleted node count too until the pod garbage collector removes
/// them (pkg/controller/podgc/gc_controller.go:223, after a 40 s quarantine).
pub fn pod_uses_claim(pod: &Pod, claim: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    if spec.node_name.as_deref().unwrap_or("").is_empty() {
        return false;
    }
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    spec.volumes.iter().flatten().any(|v| {
        v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == claim)
            || (v.ephemeral.is_some() && !pod_is_shut_down(pod) && {
                // A generic ephemeral volume's claim is `<pod>-<volume>`.
                format!("{pod_name}-{}", v.name) == claim
            })
    })
}

/// kubelet is done with the pod, or it was force-deleted (the same controller, 392).
fn pod_is_shut_down(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_template_drops_binding_and_keeps_the_rest() {
        let old: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {
                "name": "data-web-0", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "finalizers": ["kubernetes.io/pvc-protection"],
                "labels": {"app": "web"},
                "annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/selected-node": "gpu-1",
                    "volume.kubernetes.io/storage-provisioner": "gds.csi.gds-csi.io",
                    "volume.beta.kubernetes.io/storage-provisioner": "gds.csi.gds-csi.io",
                    "team": "ml"
                },
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1"},
                    {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "p1"}
                ]
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "nvme-gds",
                "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pvc-1",
                "volumeMode": "Filesystem"
            },
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        let t = serde_json::to_value(template(&old)).unwrap();
        assert_eq!(
            t,
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": "data-web-0", "namespace": "ns",
                    "labels": {"app": "web"},
                    "annotations": {"team": "ml"},
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1"}
                    ]
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "nvme-gds",
                    "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"
                }
            })
        );
    }

    fn pod(node: Option<&str>, volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0"},
            "spec": {"nodeName": node, "containers": [], "volumes": volumes}
        }))
        .unwrap()
    }

    #[test]
    fn only_scheduled_pods_use_a_claim() {
        let vols = json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data-web-0"}}]);
        assert!(pod_uses_claim(
            &pod(Some("gpu-1"), vols.clone()),
            "data-web-0"
        ));
        assert!(!pod_uses_claim(&pod(Some("gpu-1"), vols.clone()), "other"));
        assert!(!pod_uses_claim(&pod(None, vols), "data-web-0"));
        let eph = json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]);
        assert!(pod_uses_claim(&pod(Some("gpu-1"), eph), "web-0-scratch"));
    }
}
