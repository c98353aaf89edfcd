//! Which PersistentVolumes are ours, local, and pinned to which node.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolume;

/// Block volume handles start with this (`blk:<device>:<allocation>:<node>[:layout]`);
/// NFS handles start with `nfs:` and are never local to a node.
const BLOCK_HANDLE_PREFIX: &str = "blk:";

/// A PV of our driver that lives on one node's drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalVolume {
    pub pv_name: String,
    pub pv_uid: String,
    pub node: String,
    /// `namespace/name` and uid of the claim the PV is bound to, if any.
    pub claim: Option<ClaimRef>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Why a PV of our driver is passed over; logged once so an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Another driver's, or not CSI at all: silently ignored.
    NotOurs,
    /// Ours but NFS (or any handle that is not a block volume's).
    NotBlock,
    /// Outside the `--storage-class` list.
    OtherClass,
    /// A block volume whose node affinity does not name exactly one node through the
    /// topology key, or whose handle names another node: nothing here can be sure
    /// which node holds it, so it is left alone.
    Ambiguous(String),
}

pub struct Selector {
    pub driver: String,
    pub topology_key: String,
    /// Empty: every class of the driver.
    pub classes: BTreeSet<String>,
}

impl Selector {
    pub fn select(&self, pv: &PersistentVolume) -> Result<LocalVolume, Skip> {
        let spec = pv.spec.as_ref().ok_or(Skip::NotOurs)?;
        let csi = spec.csi.as_ref().ok_or(Skip::NotOurs)?;
        if csi.driver != self.driver {
            return Err(Skip::NotOurs);
        }
        if !csi.volume_handle.starts_with(BLOCK_HANDLE_PREFIX) {
            return Err(Skip::NotBlock);
        }
        if !self.classes.is_empty() {
            let class = spec.storage_class_name.as_deref().unwrap_or("");
            if !self.classes.contains(class) {
                return Err(Skip::OtherClass);
            }
        }
        let node = self.pinned_node(pv)?;
        // The handle's fourth field is the node id the driver gave the volume; the chart
        // makes it the Node's name. A mismatch means a layout this controller does not know.
        let handle_node = csi.volume_handle.split(':').nth(3).unwrap_or("");
        if handle_node != node {
            return Err(Skip::Ambiguous(format!(
                "volume handle names node {handle_node:?}, node affinity {node:?}"
            )));
        }
        let meta = &pv.metadata;
        let claim = spec.claim_ref.as_ref().and_then(|c| {
            Some(ClaimRef {
                namespace: c.namespace.clone()?,
                name: c.name.clone()?,
                uid: c.uid.clone().unwrap_or_default(),
            })
        });
        Ok(LocalVolume {
            pv_name: meta.name.clone().unwrap_or_default(),
            pv_uid: meta.uid.clone().unwrap_or_default(),
            node,
            claim,
        })
    }

    /// The one node every required term pins the PV to through the topology key
    /// (`key In [node]`), as the driver's CreateVolume topology makes the external
    /// provisioner write it.
    fn pinned_node(&self, pv: &PersistentVolume) -> Result<String, Skip> {
        let terms = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        let mut nodes = BTreeSet::new();
        for term in terms {
            let mut in_term = BTreeSet::new();
            for e in term.match_expressions.iter().flatten() {
                if e.key == self.topology_key && e.operator == "In" {
                    in_term.extend(e.values.iter().flatten().cloned());
                }
            }
            if in_term.is_empty() {
                // A term that does not pin the node lets the PV be used elsewhere.
                return Err(Skip::Ambiguous(
                    "a node affinity term without the topology key".into(),
                ));
            }
            nodes.extend(in_term);
        }
        let mut it = nodes.into_iter();
        match (it.next(), it.next()) {
            (Some(n), None) => Ok(n),
            (None, _) => Err(Skip::Ambiguous(format!(
                "no node affinity on {}",
                self.topology_key
            ))),
            (Some(a), Some(b)) => Err(Skip::Ambiguous(format!(
                "node affinity names more than one node ({a}, {b}, ...)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "gds.csi.gds-csi.io";

    fn selector(classes: &[&str]) -> Selector {
        Selector {
            driver: DRIVER.into(),
            topology_key: format!("{DRIVER}/node"),
            classes: classes.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn pv(driver: &str, handle: &str, affinity: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "uid": "u-pv"},
            "spec": {
                "storageClassName": "nvme-gds",
                "csi": {"driver": driver, "volumeHandle": handle},
                "claimRef": {"namespace": "ns", "name": "data-0", "uid": "u-pvc"},
                "nodeAffinity": affinity,
            }
        }))
        .unwrap()
    }

    fn pinned(key: &str, nodes: &[&str]) -> serde_json::Value {
        json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "In", "values": nodes}]}
        ]}})
    }

    #[test]
    fn a_block_volume_of_ours_is_pinned_to_its_node() {
        let key = format!("{DRIVER}/node");
        let v = selector(&[])
            .select(&pv(
                DRIVER,
                "blk:dev-1:ab:gpu-1:part",
                pinned(&key, &["gpu-1"]),
            ))
            .unwrap();
        assert_eq!(v.node, "gpu-1");
        assert_eq!(v.pv_name, "pv-1");
        assert_eq!(
            v.claim,
            Some(ClaimRef {
                namespace: "ns".into(),
                name: "data-0".into(),
                uid: "u-pvc".into()
            })
        );
    }

    #[test]
    fn nfs_and_other_drivers_are_never_selected() {
        let key = format!("{DRIVER}/node");
        let s = selector(&[]);
        let nfs = pv(
            DRIVER,
            "nfs:d-rdma-20049-4.1:~export:pvc-1:10.0.0.1",
            json!(null),
        );
        assert_eq!(s.select(&nfs), Err(Skip::NotBlock));
        // Even an NFS handle with a node affinity is not ours to touch.
        let nfs = pv(DRIVER, "nfs:d-rdma:~e:d:s", pinned(&key, &["gpu-1"]));
        assert_eq!(s.select(&nfs), Err(Skip::NotBlock));
        let other = pv(
            "other.csi.io",
            "blk:dev-1:ab:gpu-1",
            pinned(&key, &["gpu-1"]),
        );
        assert_eq!(s.select(&other), Err(Skip::NotOurs));
    }

    #[test]
    fn class_filter_and_ambiguous_affinity_skip() {
        let key = format!("{DRIVER}/node");
        let v = pv(DRIVER, "blk:dev-1:ab:gpu-1", pinned(&key, &["gpu-1"]));
        assert_eq!(selector(&["other"]).select(&v), Err(Skip::OtherClass));
        assert!(selector(&["nvme-gds"]).select(&v).is_ok());
        let two = pv(
            DRIVER,
            "blk:dev-1:ab:gpu-1",
            pinned(&key, &["gpu-1", "gpu-2"]),
        );
        assert!(matches!(
            selector(&[]).select(&two),
            Err(Skip::Ambiguous(_))
        ));
        let host = pv(
            DRIVER,
            "blk:dev-1:ab:gpu-1",
            pinned("kubernetes.io/hostname", &["gpu-1"]),
        );
        assert!(matches!(
            selector(&[]).select(&host),
            Err(Skip::Ambiguous(_))
        ));
        let mismatch = pv(DRIVER, "blk:dev-1:ab:gpu-2", pinned(&key, &["gpu-1"]));
        assert!(matches!(
            selector(&[]).select(&mismatch),
            Err(Skip::Ambiguous(_))
        ));
    }
}
