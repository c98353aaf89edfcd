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
    #[serde(with = "node_rel")]
    pub source: Source,
    pub verify: String,
    pub label: String,
}

/// A node source as its path beneath the root.
mod node_rel {
    use super::Source;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Source, ser: S) -> Result<S::Ok, S::Error> {
        let Source::Node { rel } = s;
        ser.serialize_str(&rel.display().to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Source, D::Error> {
        let rel = String::deserialize(de)?;
        Ok(Source::Node { rel: rel.into() })
    }
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
        let Source::Node { rel } = &plan.source;
        let rel = rel.to_string_lossy();
        let plain = rel == "." || rel.split('/').all(|s| !matches!(s, "" | "." | ".."));
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
    let Source::Node { rel } = f.source;
    let args = vec![
        "populate".to_owned(),
        format!("--source={DATASETS}"),
        format!("--path={}", rel.display()),
        format!("--target={VOLUME}"),
        format!("--record={STATE}/{}.json", f.uid),
        format!("--verify={}", f.verify),
        format!("--label={}", f.label),
    ];
    Container {
        name: "populate".into(),
        image: Some(cfg.image.clone()),
        image_pull_policy: Some(cfg.pull_policy.clone()),
        command: Some(vec!["/usr/local/bin/gds-csi".into()]),
        args: Some(args),
        volume_mounts: Some(vec![
            mount("volume", VOLUME, false),
            mount("datasets", DATASETS, true),
            mount("state", STATE, false),
        ]),
        security_context: Some(copy_privileges()),
        ..Default::default()
    }
}

const VOLUME: &str = "/volume";
const DATASETS: &str = "/datasets";
const STATE: &str = "/state";

/// The pod that fills the prime claim's volume. It runs as root for the copy to keep
/// every file's owner, with only the capabilities a copy of files needs; the dataset
/// root is mounted read-only and the records' directory is the only other host path.
pub fn fill_pod(cfg: &PodConfig, f: &Fill<'_>) -> Pod {
    let root = cfg.node_root.clone().unwrap_or_default();
    let container = fill_container(cfg, f);
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
                host_volume("datasets", &root, "Directory"),
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
