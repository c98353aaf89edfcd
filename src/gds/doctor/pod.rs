//! `gds-csi doctor --pod NAMESPACE/NAME`, run on the pod's node (in the node plugin):
//! what cuFile in each of the pod's containers will see, from the OCI runtime spec the
//! container runtime handed runc for it (`<bundle>/config.json`: its mounts, device nodes,
//! device cgroup rules, environment and capabilities), which runc applies as written.
//!
//! The bundles are containerd's: `<state>/io.containerd.runtime.v2.task/<namespace>/<id>/`,
//! with the pod named by the annotations its CRI plugin writes into every spec
//! (containerd pkg/cri/annotations/annotations.go: `io.kubernetes.cri.sandbox-namespace`,
//! `-sandbox-name`, `-sandbox-uid`, `-container-name`, `-container-type` "container" or
//! "sandbox"; DefaultCRIAnnotations sets all of them). A mount's source is a host path; the
//! ones the findings read (the udev database, the resource's cufile.json, the kubelet's
//! volume directories) are mounted in the node plugin at the host's paths.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use gds_check::Report;

use super::inspect::{findings, ContainerView, CufileView, DeviceNode, NodeNvfs, VolumeView};
use crate::runtime::config::DoctorArgs;

const NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const NAME: &str = "io.kubernetes.cri.sandbox-name";
const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// Where to look, on the node.
pub struct Sources<'a> {
    /// containerd's task bundles for Kubernetes (`.../io.containerd.runtime.v2.task/k8s.io`).
    pub bundles: &'a Path,
    /// The kubelet's root directory (its `pods/<uid>/volumes/kubernetes.io~csi/...`).
    pub kubelet_dir: &'a Path,
    pub driver_name: &'a str,
    /// The driver's compat marks (volume id -> why it was published in compat mode); None
    /// when the state dir could not be read.
    pub compat_marks: Option<&'a BTreeMap<String, String>>,
}

/// `namespace/name`, checked.
pub fn parse_pod(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!(
            "--pod {arg:?}: expected NAMESPACE/NAME, e.g. --pod default/trainer"
        )),
    }
}

/// The views of the pod's running containers (not its sandbox), by container name.
pub fn container_views(
    src: &Sources,
    namespace: &str,
    name: &str,
) -> Result<Vec<ContainerView>, String> {
    let entries = std::fs::read_dir(src.bundles).map_err(|e| {
        format!(
            "cannot list containerd's bundles at {}: {e} (with the chart, run it in the node \
             plugin's doctor container, `kubectl exec -c doctor`, which mounts the directory \
             the chart value workload.runtimeStateDir names)",
            src.bundles.display()
        )
    })?;
    let mut views = Vec::new();
    for entry in entries.flatten() {
        let config = entry.path().join("config.json");
        // A bundle being made or removed meanwhile is no container of the pod.
        let Ok(text) = std::fs::read_to_string(&config) else {
            continue;
        };
        let Ok(spec) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let ann = |k: &str| {
            spec["annotations"][k]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        if ann(NAMESPACE) == namespace && ann(NAME) == name && ann(CONTAINER_TYPE) == "container" {
            let label = format!("{namespace}/{name}/{}", ann(CONTAINER_NAME));
            views.push(view_of(&spec, label, src));
        }
    }
    if views.is_empty() {
        return Err(format!(
            "no running container of pod {namespace}/{name} on this node (looked at the \
             containers in {}): run the doctor in the node plugin of the pod's node \
             (kubectl get pod -n {namespace} {name} -o wide)",
            src.bundles.display()
        ));
    }
    views.sort_by(|a, b| a.label.cmp(&b.label));
    Ok(views)
}

/// One device cgroup rule of the spec (`linux.resources.devices`).
struct Rule {
    allow: bool,
    kind: Option<String>,
    major: Option<i64>,
    minor: Option<i64>,
    access: String,
}

impl Rule {
    fn matches(&self, kind: &str, major: i64, minor: i64) -> bool {
        self.kind.as_deref().is_none_or(|k| k == "a" || k == kind)
            && self.major.is_none_or(|m| m == major)
            && self.minor.is_none_or(|m| m == minor)
    }
}

fn rules(spec: &Value) -> Vec<Rule> {
    spec["linux"]["resources"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Rule {
            allow: r["allow"].as_bool().unwrap_or(false),
            kind: r["type"].as_str().map(str::to_string),
            major: r["major"].as_i64(),
            minor: r["minor"].as_i64(),
            access: r["access"].as_str().unwrap_or("rwm").to_string(),
        })
        .collect()
}

/// Whether `access` (r, w) is granted: the last matching rule that names it decides, as
/// runc's device filter applies the rules in order.
fn granted(rules: &[Rule], kind: &str, major: i64, minor: i64, access: char) -> bool {
    rules
        .iter()
        .rev()
        .find(|r| r.matches(kind, major, minor) && r.access.contains(access))
        .is_some_and(|r| r.allow)
}

/// A mount of the spec: where the container sees it, its host source, whether read-only.
struct Mount {
    destination: PathBuf,
    source: PathBuf,
    read_only: bool,
}

fn view_of(spec: &Value, label: String, src: &Sources) -> ContainerView {
    let rules = rules(spec);
    let mounts = mounts(spec);
    let udev = udev_data(&mounts);
    ContainerView {
        label,
        devices: device_nodes(spec, &rules),
        all_devices_allowed: allows_every_device(&rules),
        host_dev_mounted: mounts
            .iter()
            .any(|m| m.destination == Path::new("/dev") && m.source == Path::new("/dev")),
        sys_admin: has_sys_admin(spec),
        udev_mount: udev.as_ref().map(|(_, read_only)| *read_only),
        cufile: cufile_view(&env_of(spec), &mounts),
        volumes: csi_volumes(&mounts, udev.as_ref().map(|(dir, _)| dir.as_path()), src),
    }
}

/// The spec's device nodes, each with whether the device cgroup rules grant it read-write.
fn device_nodes(spec: &Value, rules: &[Rule]) -> Vec<DeviceNode> {
    spec["linux"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let path = d["path"].as_str()?.to_string();
            let kind = d["type"].as_str().unwrap_or("c");
            let (major, minor) = (d["major"].as_i64()?, d["minor"].as_i64()?);
            Some(DeviceNode {
                path,
                read_write: Some(
                    granted(rules, kind, major, minor, 'r')
                        && granted(rules, kind, major, minor, 'w'),
                ),
            })
        })
        .collect()
}

/// Whether a rule allows every device, as a privileged container's device cgroup does.
fn allows_every_device(rules: &[Rule]) -> bool {
    rules
        .iter()
        .any(|r| r.allow && r.kind.as_deref().is_none_or(|k| k == "a") && r.major.is_none())
}

/// The spec's mounts that name a destination.
fn mounts(spec: &Value) -> Vec<Mount> {
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some(Mount {
                destination: PathBuf::from(m["destination"].as_str()?),
                source: PathBuf::from(m["source"].as_str().unwrap_or_default()),
                read_only: m["options"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|x| x.as_str() == Some("ro"))),
            })
        })
        .collect()
}

/// The first mount at `destination`.
fn mount_at<'m>(mounts: &'m [Mount], destination: &Path) -> Option<&'m Mount> {
    mounts.iter().find(|m| m.destination == destination)
}

/// The udev database's directory on the host and whether it is mounted read-only: a bind of
/// `/run/udev/data`, else of the whole `/run/udev`.
fn udev_data(mounts: &[Mount]) -> Option<(PathBuf, bool)> {
    mount_at(mounts, Path::new("/run/udev/data"))
        .map(|m| (m.source.clone(), m.read_only))
        .or_else(|| {
            mount_at(mounts, Path::new("/run/udev")).map(|m| (m.source.join("data"), m.read_only))
        })
}

/// The process's environment, `KEY=value` entries by key.
fn env_of(spec: &Value) -> BTreeMap<String, String> {
    spec["process"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            e.as_str()?
                .split_once('=')
                .map(|(k, v)| (k.into(), v.into()))
        })
        .collect()
}

fn has_sys_admin(spec: &Value) -> bool {
    spec["process"]["capabilities"]["effective"]
        .as_array()
        .is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")))
}

/// The cufile.json libcufile will read, with the text of the node's file mounted there.
fn cufile_view(env: &BTreeMap<String, String>, mounts: &[Mount]) -> CufileView {
    let (path, from_env) = match env.get(crate::gds::workload::allocate::CUFILE_ENV) {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from("/etc/cufile.json"), false),
    };
    let content = match mount_at(mounts, &path) {
        Some(m) => std::fs::read_to_string(&m.source)
            .map_err(|e| format!("its source {} on the node: {e}", m.source.display())),
        None => Err(
            "not mounted into the container (the image's own file, if any, is not \
                     the node's)"
                .to_string(),
        ),
    };
    CufileView {
        path,
        from_env,
        content,
    }
}

/// This driver's volumes among the mounts, with their devices' udev entries as read from
/// `udev_dir` (the host's udev database the container sees).
fn csi_volumes(mounts: &[Mount], udev_dir: Option<&Path>, src: &Sources) -> Vec<VolumeView> {
    let csi_root = src.kubelet_dir.join("pods");
    mounts
        .iter()
        .filter_map(|m| {
            let (pv, handle) = csi_volume(&m.source, &csi_root, src.driver_name)?;
            let block_device = block_device_of(&m.source);
            Some(VolumeView {
                destination: m.destination.clone(),
                name: pv,
                block_device,
                udev_entry: block_device.map(|device| udev_entry(udev_dir, device)),
                compat_mark: src.compat_marks.map(|marks| marks.get(&handle).cloned()),
            })
        })
        .collect()
}

/// The block device (major, minor) under `path`'s filesystem; None when unreadable or not
/// a block device's (major 0: NFS, tmpfs).
fn block_device_of(path: &Path) -> Option<(u32, u32)> {
    let md = std::fs::metadata(path).ok()?;
    let device = (
        nix::sys::stat::major(md.dev()) as u32,
        nix::sys::stat::minor(md.dev()) as u32,
    );
    (device.0 != 0).then_some(device)
}

/// The udev database entry of block device `major:minor`, or why it cannot be read.
fn udev_entry(udev_dir: Option<&Path>, (major, minor): (u32, u32)) -> Result<String, String> {
    let Some(dir) = udev_dir else {
        return Err("no udev database mounted".into());
    };
    let entry = dir.join(format!("b{major}:{minor}"));
    std::fs::read_to_string(&entry).map_err(|e| format!("{}: {e}", entry.display()))
}

/// The PV name and volume id when `source` is a kubelet CSI mount of this driver's
/// (`<kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`, its `vol_data.json` naming
/// the driver and the volume handle: kubernetes pkg/volume/csi/csi_util.go saveVolumeData).
fn csi_volume(source: &Path, pods: &Path, driver: &str) -> Option<(String, String)> {
    let rest = source.strip_prefix(pods).ok()?;
    let parts: Vec<&str> = rest.iter().filter_map(|c| c.to_str()).collect();
    let [_uid, "volumes", "kubernetes.io~csi", pv, "mount"] = parts.as_slice() else {
        return None;
    };
    let data = std::fs::read_to_string(source.parent()?.join("vol_data.json")).ok()?;
    let data: Value = serde_json::from_str(&data).ok()?;
    let handle = data["volumeHandle"].as_str()?.to_string();
    (data["driverName"].as_str() == Some(driver)).then(|| (pv.to_string(), handle))
}

/// `gds-csi doctor --pod`: the findings of each of the pod's containers; 0 when none
/// failed, 1 when one did, 2 when the pod cannot be looked at.
pub fn doctor(args: &DoctorArgs, pod: &str) -> i32 {
    let marks = crate::gds::gate::read_compat_marks(&args.state_dir);
    if let Err(e) = &marks {
        eprintln!("gds-csi doctor --pod: the driver's compat marks: {e}");
    }
    let views = pod_views(args, pod, marks.as_ref().ok());
    let nvfs = node_nvfs_devices(&args.host_dev);
    let (views, nvfs) = match (views, nvfs) {
        (Ok(v), Ok(n)) => (v, NodeNvfs::Devices(n)),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("gds-csi doctor --pod: {e}");
            return 2;
        }
    };
    let reports: Vec<(String, Report)> = views
        .iter()
        .map(|v| {
            (
                v.label.clone(),
                Report::new(findings(v, &nvfs, &args.driver.name)),
            )
        })
        .collect();
    let ready = reports.iter().all(|(_, r)| r.ready());
    if args.json {
        write_stdout(&reports_json(pod, ready, &reports));
    } else {
        for (label, r) in &reports {
            write_stdout(&format!(
                "{label}: what cuFile in this container will see\n{}\n",
                super::inspect::findings_text(r)
            ));
        }
    }
    i32::from(!ready)
}

/// The views of the containers of `pod` (`namespace/name`), on this node.
fn pod_views(
    args: &DoctorArgs,
    pod: &str,
    compat_marks: Option<&BTreeMap<String, String>>,
) -> Result<Vec<ContainerView>, String> {
    let (namespace, name) = parse_pod(pod)?;
    let src = Sources {
        bundles: &args.runtime_state_dir,
        kubelet_dir: &args.kubelet_dir,
        driver_name: &args.driver.name,
        compat_marks,
    };
    container_views(&src, &namespace, &name)
}

/// The node's nvidia-fs device names, from the host's `/dev`.
fn node_nvfs_devices(host_dev: &Path) -> Result<Vec<String>, String> {
    crate::gds::workload::allocate::nvfs_devices(host_dev).map_err(|e| {
        format!(
            "listing the node's nvidia-fs devices in {}: {e}",
            host_dev.display()
        )
    })
}

/// The pod's reports as one JSON document, newline-terminated.
fn reports_json(pod: &str, ready: bool, reports: &[(String, Report)]) -> String {
    let list: Vec<Value> = reports
        .iter()
        .map(|(label, r)| {
            serde_json::json!({"container": label, "ready": r.ready(), "findings": r.checks})
        })
        .collect();
    serde_json::to_string_pretty(
        &serde_json::json!({"pod": pod, "ready": ready, "containers": list}),
    )
    .unwrap_or_default()
        + "\n"
}

fn write_stdout(text: &str) {
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_argument_is_namespace_slash_name() {
        assert_eq!(
            parse_pod("ml/trainer-0").unwrap(),
            ("ml".to_string(), "trainer-0".to_string())
        );
        for bad in ["trainer", "/x", "ns/", "a/b/c", ""] {
            let e = parse_pod(bad).unwrap_err();
            assert!(e.contains("NAMESPACE/NAME"), "{bad}: {e}");
        }
    }

    /// Device cgroup rules as containerd writes them for a pod: deny all first, then one
    /// allow per device; a privileged container's single allow-all.
    #[test]
    fn device_rules_apply_in_order() {
        let spec: Value = serde_json::from_str(
            r#"{"linux": {"resources": {"devices": [
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 245, "minor": 0, "access": "rw"},
                {"allow": true, "type": "c", "major": 245, "minor": 1, "access": "r"}]}}}"#,
        )
        .unwrap();
        let r = rules(&spec);
        assert!(granted(&r, "c", 245, 0, 'r') && granted(&r, "c", 245, 0, 'w'));
        assert!(granted(&r, "c", 245, 1, 'r') && !granted(&r, "c", 245, 1, 'w'));
        assert!(!granted(&r, "b", 259, 0, 'r'));
        let privileged: Value = serde_json::from_str(
            r#"{"linux": {"resources": {"devices": [{"allow": true, "access": "rwm"}]}}}"#,
        )
        .unwrap();
        assert!(granted(&rules(&privileged), "b", 259, 0, 'w'));
    }

    #[test]
    fn only_this_drivers_csi_mounts_are_volumes() {
        let t = tempfile::tempdir().unwrap();
        let pods = t.path().join("pods");
        let vol = |uid: &str, pv: &str, driver: &str| {
            let d = pods.join(uid).join("volumes/kubernetes.io~csi").join(pv);
            std::fs::create_dir_all(d.join("mount")).unwrap();
            std::fs::write(
                d.join("vol_data.json"),
                format!(r#"{{"driverName": "{driver}", "volumeHandle": "h"}}"#),
            )
            .unwrap();
            d.join("mount")
        };
        let ours = vol("u1", "pvc-a", "gds.example");
        let theirs = vol("u1", "pvc-b", "other.example");
        assert_eq!(
            csi_volume(&ours, &pods, "gds.example"),
            Some(("pvc-a".to_string(), "h".to_string()))
        );
        assert_eq!(csi_volume(&theirs, &pods, "gds.example"), None);
        assert_eq!(
            csi_volume(
                &pods.join("u1/volumes/kubernetes.io~empty-dir/x"),
                &pods,
                "gds.example"
            ),
            None
        );
    }

    #[test]
    fn a_bundle_becomes_a_view() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        std::fs::create_dir_all(state.join("workload")).unwrap();
        let cufile = state.join("workload/cufile-gds.json");
        std::fs::write(&cufile, r#"{"properties": {"allow_compat_mode": false}}"#).unwrap();
        let bundles = t.path().join("bundles");
        let write_bundle = |id: &str, ctype: &str, name: &str| {
            let b = bundles.join(id);
            std::fs::create_dir_all(&b).unwrap();
            let spec = serde_json::json!({
                "annotations": {NAMESPACE: "ml", NAME: name, CONTAINER_TYPE: ctype, CONTAINER_NAME: "main"},
                "process": {"env": ["PATH=/bin", "CUFILE_ENV_PATH_JSON=/etc/gds-csi/cufile.json"],
                            "capabilities": {"effective": ["CAP_CHOWN"]}},
                "mounts": [
                    {"destination": "/run/udev/data", "source": "/run/udev/data", "options": ["rbind", "ro"]},
                    {"destination": "/etc/gds-csi/cufile.json", "source": cufile, "options": ["rbind", "ro"]}],
                "linux": {"devices": [{"path": "/dev/nvidia-fs0", "type": "c", "major": 245, "minor": 0}],
                          "resources": {"devices": [{"allow": false, "access": "rwm"},
                              {"allow": true, "type": "c", "major": 245, "minor": 0, "access": "rw"}]}}
            });
            std::fs::write(b.join("config.json"), spec.to_string()).unwrap();
        };
        write_bundle("a1", "container", "trainer");
        write_bundle("a0", "sandbox", "trainer");
        write_bundle("b1", "container", "other");
        std::fs::create_dir_all(bundles.join("half-made")).unwrap();
        let src = Sources {
            bundles: &bundles,
            kubelet_dir: &t.path().join("kubelet"),
            driver_name: "gds.example",
            compat_marks: None,
        };
        let views = container_views(&src, "ml", "trainer").unwrap();
        assert_eq!(views.len(), 1, "the sandbox and the other pod are not it");
        let v = &views[0];
        assert_eq!(v.label, "ml/trainer/main");
        assert_eq!(
            v.devices,
            [DeviceNode {
                path: "/dev/nvidia-fs0".into(),
                read_write: Some(true)
            }]
        );
        assert!(!v.all_devices_allowed && !v.sys_admin && !v.host_dev_mounted);
        assert_eq!(v.udev_mount, Some(true));
        assert!(v.cufile.from_env);
        assert!(v.cufile.content.as_ref().unwrap().contains("false"));
        let e = container_views(&src, "ml", "gone").unwrap_err();
        assert!(e.contains("no running container of pod ml/gone"), "{e}");
    }
}
