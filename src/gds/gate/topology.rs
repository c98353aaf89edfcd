//! The gate's part of topology: NodeGetInfo advertises per-backend readiness from the node
//! checks, and gated NFS volumes are accessible only from nodes that advertise it.

use std::collections::HashMap;

use gds_check::{Backend, HostPaths};
use tracing::debug;

use super::checks::node_report;
use super::policy::{failure_lines, Policy};
use super::GdsGate;

const BACKENDS: [(Backend, &str); 2] = [
    (Backend::Nvme, "gds-nvme"),
    (Backend::NfsRdma, "gds-nfs-rdma"),
];

/// Readiness per backend from the node checks: `("gds-nvme", true)`, ...
pub fn node_readiness(paths: &HostPaths) -> Vec<(&'static str, bool)> {
    BACKENDS
        .into_iter()
        .map(|(b, key)| {
            let r = node_report(paths, b);
            let ready = r.ready();
            if !ready {
                debug!(backend = %b, failed = %failure_lines(&r).replace('\n', "; "), "node not GDS-ready");
            }
            (key, ready)
        })
        .collect()
}

/// None when some backend passes the node checks; otherwise what fails, per backend: what
/// a container that reads with compat mode off would run into on this node.
pub fn node_not_ready(paths: &HostPaths) -> Option<String> {
    let mut why = Vec::new();
    for (b, key) in BACKENDS {
        let r = node_report(paths, b);
        if r.ready() {
            return None;
        }
        why.push(format!("{key}: {}", failure_lines(&r).replace('\n', "; ")));
    }
    Some(why.join(" | "))
}

/// NodeGetInfo's topology: the node's own `segments`, plus `<driver>/gds-nvme` and
/// `<driver>/gds-nfs-rdma` = "true" for each backend whose node checks pass at call time, when
/// there is a gate. A backend that is not ready has no key at all, never "false": the kubelet
/// turns these keys into node labels and refuses to change an existing label's value
/// ("detected topology value collision", Kubernetes 1.34
/// `pkg/volume/csi/nodeinfomanager/nodeinfomanager.go:340-348`), while it adds a new one.
/// So a node that becomes ready gains its label when the kubelet next registers the driver,
/// which the readiness watcher (`crate::gds::readiness`) brings about.
pub fn node_topology(
    gate: Option<&GdsGate>,
    driver_name: &str,
    mut segments: HashMap<String, String>,
) -> HashMap<String, String> {
    if let Some(gate) = gate {
        for (key, ready) in gate.node_readiness() {
            if ready {
                segments.insert(format!("{driver_name}/{key}"), "true".into());
            }
        }
    }
    segments
}

/// An NFS volume's accessible topology: none with `gdsPolicy` disabled or preferred (any node
/// that reaches the server); with required (also the default) only nodes whose node checks
/// pass for NFS over RDMA (`<driver>/gds-nfs-rdma=true`, from [`node_topology`]), so a gated
/// claim's pod is not scheduled where publish would refuse it. A bad stored policy is left to
/// the publish gate.
pub fn nfs_topology<'a, I>(driver_name: &str, params: I) -> Vec<crate::csi::Topology>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    match Policy::from_parameters(params) {
        Ok(Policy::Required) => vec![crate::csi::Topology {
            segments: HashMap::from([(format!("{driver_name}/gds-nfs-rdma"), "true".into())]),
        }],
        // preferred publishes anywhere (in compat mode); disabled checks nothing.
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use super::super::PARAM;

    #[test]
    fn nfs_volumes_carry_readiness_topology_only_when_required() {
        let key = "gds.example/gds-nfs-rdma".to_string();
        let mut p = BTreeMap::new();
        p.insert("server".to_string(), "10.0.0.1".to_string());
        // Absent is required.
        let t = nfs_topology("gds.example", &p);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].segments.get(&key).map(String::as_str), Some("true"));
        for off in ["disabled", "preferred"] {
            p.insert(PARAM.to_string(), off.to_string());
            assert!(nfs_topology("gds.example", &p).is_empty(), "{off}");
        }
    }

    #[test]
    fn without_a_gate_only_the_node_key_is_advertised() {
        let own = HashMap::from([("gds.example/node".to_string(), "node-a".to_string())]);
        assert_eq!(node_topology(None, "gds.example", own.clone()), own);
    }
}
