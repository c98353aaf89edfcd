//! The objects a fill is made of, in the populator's own namespace: the prime claim (the
//! user's claim without its data source, so the external-provisioner makes the volume on
//! the node the scheduler chose) and the pod that mounts it and runs `gds-csi populate`.
//! The flow is lib-volume-populator's (populator-machinery/controller.go, syncPvc: the
//! `prime-<uid>` claim at lines 720-785, the pod on the selected node at 841-880, the
//! PV's claimRef moved to the user's claim at 927-958).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostPathVolumeSource, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::dataset::Source;

/// The scheduler's choice of node for a WaitForFirstConsumer claim (kubernetes
/// pkg/controller/volume/persistentvolume/util: AnnSelectedNode).
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a prime claim: what its fill copies (`FillPlan`), fixed when the fill starts.
pub const PLAN: &str = "gds-csi.io/fill";
/// Labels every object of a fill carries, with the user's claim's uid.
pub const CLAIM_UID: &str = "gds-csi.io/claim-uid";
const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// What every fill pod shares (the populator's flags).
#[derive(Debug, Clone)]
pub struct PodConfig {
    pub namespace: String,
    pub image: String,
    pub pull_policy: String,
    /// The node directory datasets are read from; none: node datasets are refused.
    pub node_root: Option<PathBuf>,
    /// The driver's state directory on the node; the copy's records go below it.
    pub state_dir: PathBuf,
}

pub fn prime_name(uid: &str) -> String {
    format!("prime-{uid}")
}

pub fn pod_name(uid: &str) -> String {
    format!("populate-{uid}")
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (COMPONENT_LABEL.to_owned(), "populate".to_owned()),
        (CLAIM_UID.to_owned(), uid.to_owned()),
    ])
}

/// The prime claim of `pvc`: its access modes, size, class and mode, on `node`.
pub fn prime_claim(
    pvc: &PersistentVolumeClaim,
    uid: &str,
    cfg: &PodConfig,
    node: Option<&str>,
    plan: &FillPlan,
) -> PersistentVolumeClaim {
    let spec = pvc.spec.clone().unwrap_or_default();
    let mut annotations = BTreeMap::from([(PLAN.to_owned(), plan.to_annotation())]);
    if let Some(n) = node {
        annotations.insert(SELECTED_NODE.to_owned(), n.to_owned());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(prime_name(uid)),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels(uid)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            ..Default::default()
        }),
        status: None,
    }
}

/// What a fill copies, fixed when it starts and kept on its prime claim: a Dataset
/// changed or deleted meanwhile changes nothing in a fill under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FillPlan {
    pub source: Source,
    pub verify: String,
    pub label: String,
}

impl FillPlan {
    fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The plan a prime claim records, checked again: the annotation is read back from
    /// the API, where anyone who may edit claims in this namespace could have changed it.
    pub fn of(prime: &PersistentVolumeClaim) -> Result<FillPlan, String> {
        let text = prime
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PLAN))
            .ok_or_else(|| format!("annotation {PLAN} is missing"))?;
        let plan: FillPlan =
            serde_json::from_str(text).map_err(|e| format!("annotation {PLAN}: {e}"))?;
        let plain = match &plan.source {
            Source::Node { rel } => {
                let rel = rel.to_string_lossy();
                rel == "." || crate::dataset::plain_relative(&rel)
            }
            // The fill pod checks an NFS source in full before it mounts anything.
            Source::Nfs(_) => true,
        };
        let verify = plan.verify == "sizes" || plan.verify == "checksum";
        match plain && verify {
            true => Ok(plan),
            false => Err(format!(
                "annotation {PLAN}: {text:?} is not a fill this populator made"
            )),
        }
    }
}

/// What the pod copies: the Dataset, its checks, and how the messages name it.
pub struct Fill<'a> {
    pub uid: &'a str,
    pub source: &'a Source,
    pub verify: &'a str,
    pub label: &'a str,
    pub node: Option<&'a str>,
}

/// `gds-csi populate` with the volume, the dataset root and the records' directory.
fn fill_container(cfg: &PodConfig, f: &Fill<'_>) -> Container {
    let mut args = vec![
        "populate".to_owned(),
        format!("--target={VOLUME}"),
        format!("--record={STATE}/{}.json", f.uid),
        format!("--verify={}", f.verify),
        format!("--label={}", f.label),
    ];
    args.extend(source_args(f.source));
    let (privileges, source_mount) = match f.source {
        Source::Node { .. } => (copy_privileges(), mount("datasets", DATASETS, true)),
        Source::Nfs(_) => (mount_privileges(), mount("work", WORK, false)),
    };
    Container {
        name: "populate".into(),
        image: Some(cfg.image.clone()),
        image_pull_policy: Some(cfg.pull_policy.clone()),
        command: Some(vec!["/usr/local/bin/gds-csi".into()]),
        args: Some(args),
        volume_mounts: Some(vec![
            mount("volume", VOLUME, false),
            source_mount,
            mount("state", STATE, false),
        ]),
        security_context: Some(privileges),
        ..Default::default()
    }
}

fn source_args(source: &Source) -> Vec<String> {
    match source {
        Source::Node { rel } => vec![
            format!("--source={DATASETS}"),
            format!("--path={}", rel.display()),
        ],
        Source::Nfs(n) => {
            let mut a = vec![
                format!("--nfs-server={}", n.server),
                format!("--nfs-share={}", n.share),
                format!("--nfs-path={}", n.path),
                format!("--work={WORK}"),
            ];
            a.extend(n.proto.as_ref().map(|p| format!("--nfs-proto={p}")));
            a.extend(n.port.map(|p| format!("--nfs-port={p}")));
            a.extend(n.vers.as_ref().map(|v| format!("--nfs-vers={v}")));
            a
        }
    }
}

/// An NFS fill mounts the export in its own mount namespace: mount(2) needs the
/// container privileged (CAP_SYS_ADMIN alone is refused by the runtime's default
/// AppArmor profile), as the node plugin is.
fn mount_privileges() -> SecurityContext {
    SecurityContext {
        privileged: Some(true),
        run_as_user: Some(0),
        read_only_root_filesystem: Some(true),
        ..Default::default()
    }
}

const VOLUME: &str = "/volume";
const DATASETS: &str = "/datasets";
const WORK: &str = "/work";
const STATE: &str = "/state";

/// The pod that fills the prime claim's volume. It runs as root for the copy to keep
/// every file's owner, with only the capabilities a copy of files needs; the dataset
/// root is mounted read-only and the records' directory is the only other host path.
pub fn fill_pod(cfg: &PodConfig, f: &Fill<'_>) -> Pod {
    let container = fill_container(cfg, f);
    // An NFS source is reached over the node's own network (its RDMA devices).
    let nfs = matches!(f.source, Source::Nfs(_));
    let source_volume = match f.source {
        Source::Node { .. } => {
            let root = cfg.node_root.clone().unwrap_or_default();
            host_volume("datasets", &root, "Directory")
        }
        Source::Nfs(_) => Volume {
            name: "work".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        },
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(f.uid)),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels(f.uid)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: f.node.map(str::to_owned),
            restart_policy: Some("Never".into()),
            host_network: nfs.then_some(true),
            dns_policy: nfs.then(|| "ClusterFirstWithHostNet".to_owned()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // The volume is where it is: a fill runs on its node whatever the taints.
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }]),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![container],
            volumes: Some(vec![
                claim_volume("volume", &prime_name(f.uid)),
                source_volume,
                host_volume(
                    "state",
                    &cfg.state_dir.join("populate"),
                    "DirectoryOrCreate",
                ),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

fn copy_privileges() -> SecurityContext {
    let caps = [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
    ];
    SecurityContext {
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: Some(caps.iter().map(|c| (*c).to_owned()).collect()),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, at: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: at.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn claim_volume(name: &str, claim: &str) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: Some(false),
        }),
        ..Default::default()
    }
}

fn host_volume(name: &str, path: &Path, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.display().to_string(),
            type_: Some(type_.into()),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PodConfig {
        PodConfig {
            namespace: "gds-csi".into(),
            image: "gds-csi:1".into(),
            pull_policy: "IfNotPresent".into(),
            node_root: Some("/srv/datasets".into()),
            state_dir: "/var/lib/gds-csi".into(),
        }
    }

    #[test]
    fn the_pod_reads_the_dataset_beneath_the_root_only_and_records_beside_the_volume() {
        let source = Source::Node {
            rel: "imagenet".into(),
        };
        let f = Fill {
            uid: "u1",
            source: &source,
            verify: "checksum",
            label: "ml/imagenet",
            node: Some("gpu-7"),
        };
        let pod = fill_pod(&cfg(), &f);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("gpu-7"));
        let c = &spec.containers[0];
        let args = c.args.clone().unwrap();
        assert!(args.contains(&"--path=imagenet".to_owned()));
        assert!(args.contains(&"--record=/state/u1.json".to_owned()));
        let vols = spec.volumes.unwrap();
        let host: Vec<String> = vols
            .iter()
            .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
            .collect();
        assert_eq!(host, ["/srv/datasets", "/var/lib/gds-csi/populate"]);
        let mounts = c.volume_mounts.clone().unwrap();
        let datasets = mounts.iter().find(|m| m.name == "datasets").unwrap();
        assert_eq!(datasets.read_only, Some(true));
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.privileged, None);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
    }

    #[test]
    fn an_nfs_fill_mounts_the_export_itself_on_the_node_network_and_reads_no_host_path() {
        let source = Source::Nfs(crate::dataset::Nfs {
            server: "nfs01".into(),
            share: "/export".into(),
            path: "datasets/imagenet".into(),
            port: Some(20049),
            ..Default::default()
        });
        let f = Fill {
            uid: "u2",
            source: &source,
            verify: "sizes",
            label: "ml/imagenet",
            node: Some("gpu-7"),
        };
        let spec = fill_pod(&cfg(), &f).spec.unwrap();
        assert_eq!(spec.host_network, Some(true));
        let args = spec.containers[0].args.clone().unwrap();
        for a in [
            "--nfs-server=nfs01",
            "--nfs-share=/export",
            "--nfs-path=datasets/imagenet",
            "--nfs-port=20049",
            "--work=/work",
        ] {
            assert!(args.contains(&a.to_owned()), "{a}: {args:?}");
        }
        assert!(!args.iter().any(|a| a.starts_with("--source")));
        let host: Vec<String> = spec
            .volumes
            .unwrap()
            .iter()
            .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
            .collect();
        assert_eq!(host, ["/var/lib/gds-csi/populate"]);
    }

    #[test]
    fn the_prime_claim_copies_the_claim_less_its_source_on_the_chosen_node() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOncePod"], "storageClassName": "nvme",
                     "resources": {"requests": {"storage": "1Gi"}},
                     "dataSourceRef": {"apiGroup": "gds-csi.io", "kind": "Dataset", "name": "d"}}
        }))
        .unwrap();
        let plan = FillPlan {
            source: Source::Node { rel: "d/e".into() },
            verify: "sizes".into(),
            label: "ml/d".into(),
        };
        let prime = prime_claim(&pvc, "u1", &cfg(), Some("gpu-7"), &plan);
        assert_eq!(FillPlan::of(&prime), Ok(plan));
        assert_eq!(prime.metadata.name.as_deref(), Some("prime-u1"));
        assert_eq!(prime.metadata.namespace.as_deref(), Some("gds-csi"));
        let spec = prime.spec.clone().unwrap();
        assert!(spec.data_source_ref.is_none() && spec.data_source.is_none());
        assert_eq!(spec.storage_class_name.as_deref(), Some("nvme"));
        assert_eq!(
            prime.metadata.annotations.clone().unwrap()[SELECTED_NODE],
            "gpu-7".to_owned()
        );
        let mut tampered = prime.clone();
        for bad in [
            r#"{"source":"../etc","verify":"sizes","label":"x"}"#,
            r#"{"source":"/etc","verify":"sizes","label":"x"}"#,
            r#"{"source":{"node":{"rel":"../etc"}},"verify":"sizes","label":"x"}"#,
            r#"{"source":{"node":{"rel":"/etc"}},"verify":"sizes","label":"x"}"#,
            r#"{"source":{"node":{"rel":"a"}},"verify":"sh -c","label":"x"}"#,
            "{}",
        ] {
            tampered
                .metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(PLAN.into(), bad.into());
            assert!(FillPlan::of(&tampered).is_err(), "{bad}");
        }
    }
}
