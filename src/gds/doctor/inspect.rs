//! What cuFile in one container will see, as findings with remedies: the nvidia-fs device
//! nodes, whether more of the host's `/dev` (or every capability) came in, the udev entry of
//! each of this driver's volumes it mounts, and the cufile.json libcufile will read with its
//! compat setting.
//!
//! The facts come from one of two places, gathered elsewhere into a [`ContainerView`]: the
//! OCI runtime spec the container runtime gave runc, read on the node (`gds-csi doctor
//! --pod`, [`super::pod`]), or the container itself (`gds-csi workload-read`,
//! [`super::read`]). The findings are the same either way.

use std::path::PathBuf;

use gds_check::{Check, Status};

/// A device node the container has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// `/dev/...` inside the container.
    pub path: String,
    /// Whether the container may open it read-write: from the device cgroup rules (node side)
    /// or an open(O_RDWR) from inside; None when not known.
    pub read_write: Option<bool>,
}

/// One of this driver's volumes mounted in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeView {
    /// Where the container sees it.
    pub destination: PathBuf,
    /// The volume's name (the PV's, or the mount's device on the pod side).
    pub name: String,
    /// The block device under its filesystem (major, minor); None for NFS.
    pub block_device: Option<(u32, u32)>,
    /// The udev database entry `b<major>:<minor>` as the container reads it, or why not.
    pub udev_entry: Option<Result<String, String>>,
    /// How the driver published it, where known (on the node): Some(why) when in compat mode
    /// (a `preferred` class on a node without a GDS path), None when not.
    pub compat_mark: Option<Option<String>>,
}

/// The cufile.json libcufile will read in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CufileView {
    /// `$CUFILE_ENV_PATH_JSON`, else `/etc/cufile.json` (libcufile's default).
    pub path: PathBuf,
    pub from_env: bool,
    /// Its text, or why it cannot be read.
    pub content: Result<String, String>,
}

/// Everything the findings rest on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    /// Named in the findings: `namespace/pod/container` or `this container`.
    pub label: String,
    /// The device nodes the container has beyond the runtime's defaults.
    pub devices: Vec<DeviceNode>,
    /// Every device may be opened (a privileged container's device cgroup).
    pub all_devices_allowed: bool,
    /// The host's whole `/dev` is mounted in (a hostPath `/dev`).
    pub host_dev_mounted: bool,
    /// The container holds CAP_SYS_ADMIN, as a privileged one does.
    pub sys_admin: bool,
    /// The udev database mount: Some(read_only) when there is one.
    pub udev_mount: Option<bool>,
    pub cufile: CufileView,
    pub volumes: Vec<VolumeView>,
}

/// What the node has, from wherever the view was gathered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeNvfs {
    /// The node's `/dev/nvidia-fs*` names (empty: nvidia_fs is not loaded).
    Devices(Vec<String>),
    /// Seen from inside a container: whether nvidia_fs is loaded, not its nodes.
    Loaded(bool),
}

/// The nodes every container gets from runc whatever it asks (runc
/// libcontainer/specconv/spec_linux.go AllowedDevices), and the links and mounts beside them;
/// they give nothing of the host.
pub const RUNTIME_DEFAULT_DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/console",
];

fn is_nvfs(path: &str) -> bool {
    path.strip_prefix("/dev/")
        .is_some_and(crate::gds::workload::allocate::is_nvfs_name)
}

/// `/dev/nvidia<N>`, `/dev/nvidiactl`, `/dev/nvidia-uvm*`, `/dev/nvidia-caps/*`: what the
/// NVIDIA container runtime adds for the GPU the pod was given.
fn is_gpu_node(path: &str) -> bool {
    path.strip_prefix("/dev/nvidia").is_some() && !is_nvfs(path)
}

/// The findings for `view` on a node whose nvidia-fs is `node`; `driver` names the resources.
pub fn findings(view: &ContainerView, node: &NodeNvfs, driver: &str) -> Vec<Check> {
    vec![
        nvidia_fs(view, node, driver),
        host_devices(view),
        udev(view, driver),
        cufile(view, driver),
        compat_policy(view, driver),
        volumes(view, driver),
    ]
}

/// A volume the driver published in compat mode read by a container whose cufile.json turns
/// compat off: every read fails (CU_FILE_IO_NOT_SUPPORTED), which is what the `gds` resource
/// asks for, but not what a pod on a `preferred` class wants.
fn compat_policy(view: &ContainerView, driver: &str) -> Check {
    const ID: &str = "pod.compat_policy";
    let known: Vec<&VolumeView> = view
        .volumes
        .iter()
        .filter(|v| v.compat_mark.is_some())
        .collect();
    if known.is_empty() {
        return Check::na(
            ID,
            "how the driver published the volumes is known on the node only",
            "gds-csi doctor --pod, in the node plugin, reads the driver's compat marks",
        );
    }
    let in_compat: Vec<String> = known
        .iter()
        .filter_map(|v| {
            v.compat_mark
                .as_ref()
                .and_then(|m| m.as_ref())
                .map(|why| format!("{} ({})", v.name, first_words(why, 160)))
        })
        .collect();
    if in_compat.is_empty() {
        return Check::pass(
            ID,
            "no volume of the container was published in compat mode",
            known
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    match compat_allowed(view) {
        Some(false) => Check::fail(
            ID,
            "a volume was published in compat mode, and this container's cufile.json turns compat off: its reads fail",
            in_compat.join("; "),
            format!(
                "ask for {} instead (compat allowed, as the class's gdsPolicy preferred is), or make the node GDS-ready (gds-csi doctor) so the volume takes the GDS path",
                crate::gds::workload::Resource::GdsCompat.name(driver)
            ),
        ),
        _ => Check::warn(
            ID,
            "a volume was published in compat mode: its reads go through host memory",
            in_compat.join("; "),
            "make the node GDS-ready (gds-csi doctor names what is missing)",
        ),
    }
}

fn request_remedy(driver: &str) -> String {
    format!(
        "list {} (compat mode off) or {} (compat allowed) in the container's resources.limits: \
         the driver's device plugin then hands it the nvidia-fs nodes, the udev database and a \
         cufile.json",
        crate::gds::workload::Resource::Gds.name(driver),
        crate::gds::workload::Resource::GdsCompat.name(driver)
    )
}

const NVIDIA_FS: &str = "pod.nvidia_fs";

fn nvidia_fs(view: &ContainerView, node: &NodeNvfs, driver: &str) -> Check {
    let have: Vec<&DeviceNode> = view.devices.iter().filter(|d| is_nvfs(&d.path)).collect();
    if !node.loaded() {
        return nvidia_fs_not_loaded(view, &have);
    }
    let missing = missing_nvfs(node, &have);
    if !missing.is_empty() {
        return Check::fail(
            NVIDIA_FS,
            "the container lacks the node's nvidia-fs devices: cuFile falls back to compat or fails",
            format!("missing in {}: {}", view.label, missing.join(" ")),
            request_remedy(driver),
        );
    }
    let read_only: Vec<&DeviceNode> = have
        .iter()
        .copied()
        .filter(|d| d.read_write == Some(false))
        .collect();
    if !read_only.is_empty() {
        return Check::fail(
            NVIDIA_FS,
            "the container may not open its nvidia-fs devices read-write",
            format!("not read-write: {}", device_paths(&read_only)),
            "nvidia-fs maps its buffers shared and writable: the device cgroup must allow rw \
             (the driver's device plugin grants rw)",
        );
    }
    Check::pass(
        NVIDIA_FS,
        format!(
            "the container has the node's nvidia-fs devices ({})",
            device_paths(&have)
        ),
        "read-write",
    )
}

impl NodeNvfs {
    /// Whether nvidia_fs is loaded on the node.
    fn loaded(&self) -> bool {
        match self {
            NodeNvfs::Devices(d) => !d.is_empty(),
            NodeNvfs::Loaded(l) => *l,
        }
    }
}

fn device_paths(nodes: &[&DeviceNode]) -> String {
    nodes
        .iter()
        .map(|d| d.path.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The finding when nvidia_fs is not loaded on the node; `have`: the container's nodes.
fn nvidia_fs_not_loaded(view: &ContainerView, have: &[&DeviceNode]) -> Check {
    Check::warn(
        NVIDIA_FS,
        "the node has no nvidia-fs devices: cuFile here can only take the compat path",
        format!(
            "nvidia_fs is not loaded on the node; {} has {}",
            view.label,
            if have.is_empty() {
                "none".to_string()
            } else {
                device_paths(have)
            }
        ),
        "load nvidia_fs on the node (the GPU Operator's gds.enabled, or the nvidia-fs \
         package); until then reads go through host memory (POSIX) where compat mode is \
         allowed and fail where it is not",
    )
}

/// The node's nvidia-fs nodes the container lacks (from inside, where the node's are not
/// known: any, when it has none).
fn missing_nvfs(node: &NodeNvfs, have: &[&DeviceNode]) -> Vec<String> {
    match node {
        NodeNvfs::Devices(d) => d
            .iter()
            .map(|n| format!("/dev/{n}"))
            .filter(|p| !have.iter().any(|h| &h.path == p))
            .collect(),
        NodeNvfs::Loaded(_) if have.is_empty() => vec!["/dev/nvidia-fs*".to_string()],
        NodeNvfs::Loaded(_) => Vec::new(),
    }
}

fn host_devices(view: &ContainerView) -> Check {
    const ID: &str = "pod.host_devices";
    let extra: Vec<&str> = view
        .devices
        .iter()
        .map(|d| d.path.as_str())
        .filter(|p| !RUNTIME_DEFAULT_DEVICES.contains(p) && !is_nvfs(p) && !is_gpu_node(p))
        .collect();
    let mut why = Vec::new();
    if view.sys_admin {
        why.push("CAP_SYS_ADMIN (as a privileged container)".to_string());
    }
    if view.all_devices_allowed {
        why.push("a device cgroup that allows every device".to_string());
    }
    if view.host_dev_mounted {
        why.push("the host's /dev mounted".to_string());
    }
    if !extra.is_empty() {
        let shown: Vec<&str> = extra.iter().take(8).copied().collect();
        why.push(format!(
            "{} host device node(s): {}{}",
            extra.len(),
            shown.join(" "),
            if extra.len() > shown.len() {
                " ..."
            } else {
                ""
            }
        ));
    }
    if why.is_empty() {
        return Check::pass(
            ID,
            "no more of the host than cuFile needs: the runtime's default nodes, the GPU's and nvidia-fs's",
            "not privileged, no host /dev",
        );
    }
    Check::warn(
        ID,
        "the container holds more of the host than cuFile needs",
        format!("{} has {}", view.label, why.join("; ")),
        "drop privileged: true and any hostPath /dev; a GDS resource of the driver gives what \
         cuFile needs",
    )
}

fn udev(view: &ContainerView, driver: &str) -> Check {
    const ID: &str = "pod.udev";
    let Some(read_only) = view.udev_mount else {
        return Check::fail(
            ID,
            "no udev database in the container: cuFile cannot tell what the volume's device is",
            format!(
                "{} mounts nothing at /run/udev or /run/udev/data (libcufile logs \"udev property \
                 not found: ID_FS_USAGE\" and registration fails with 5027, or falls back to compat)",
                view.label
            ),
            request_remedy(driver),
        );
    };
    let mut bad = Vec::new();
    let mut good = Vec::new();
    for v in &view.volumes {
        let Some((major, minor)) = v.block_device else {
            continue;
        };
        let entry = format!("b{major}:{minor}");
        match &v.udev_entry {
            Some(Ok(text)) if text.lines().any(|l| l.starts_with("E:ID_FS_USAGE=")) => {
                good.push(format!("{entry} ({})", v.destination.display()))
            }
            Some(Ok(_)) => bad.push(format!("{entry} has no E:ID_FS_USAGE")),
            Some(Err(e)) => bad.push(format!("{entry}: {e}")),
            None => bad.push(format!("{entry} not looked up")),
        }
    }
    if !bad.is_empty() {
        return Check::fail(
            ID,
            "the udev database lacks the volume's entry: cuFile cannot register its files",
            bad.join("; "),
            "udevd on the node writes /run/udev/data/b<major>:<minor> when it sees the device: \
             check that udevd runs (udevadm info /dev/<device>), then `udevadm trigger` the device",
        );
    }
    if !read_only {
        return Check::warn(
            ID,
            "the udev database is mounted writable",
            format!("{}: /run/udev writable", view.label),
            "mount it read-only: the container only reads it",
        );
    }
    Check::pass(
        ID,
        "the udev database is there, read-only",
        if good.is_empty() {
            "no block volume of the driver to look up".to_string()
        } else {
            format!("entries with ID_FS_USAGE: {}", good.join(", "))
        },
    )
}

fn cufile(view: &ContainerView, driver: &str) -> Check {
    const ID: &str = "pod.cufile_json";
    let c = &view.cufile;
    let named = if c.from_env {
        format!("{} (CUFILE_ENV_PATH_JSON)", c.path.display())
    } else {
        format!("{} (libcufile's default path)", c.path.display())
    };
    let text = match &c.content {
        Ok(t) => t,
        Err(e) => {
            return Check::fail(
                ID,
                "cuFile finds no cufile.json in the container",
                format!("{named}: {e}"),
                request_remedy(driver),
            )
        }
    };
    match gds_check::parse::parse_cufile_json(text) {
        Err(e) => Check::fail(
            ID,
            "the container's cufile.json does not parse: libcufile refuses to start",
            format!("{named}: {e}"),
            "fix the node's /etc/cufile.json (the resources' copies are made from it)",
        ),
        Ok(cfg) if cfg.force_compat_mode == Some(true) => Check::warn(
            ID,
            "the container's cufile.json forces compat mode: no read takes the GDS path",
            format!("{named}: force_compat_mode true"),
            format!(
                "request {} (it turns force_compat_mode off)",
                crate::gds::workload::Resource::Gds.name(driver)
            ),
        ),
        Ok(cfg) => {
            let compat = cfg.allow_compat_mode.unwrap_or(true);
            Check::new(
                ID,
                if compat {
                    "cufile.json allows compat mode: a read without a GDS path silently goes through host memory"
                } else {
                    "cufile.json has compat mode off: a read without a GDS path fails instead of slowing down"
                },
                Status::Pass,
            )
            .evidence(format!(
                "{named}: allow_compat_mode {}",
                match cfg.allow_compat_mode {
                    Some(v) => v.to_string(),
                    None => "unset (true)".into(),
                }
            ))
        }
    }
}

fn volumes(view: &ContainerView, driver: &str) -> Check {
    const ID: &str = "pod.volume";
    if view.volumes.is_empty() {
        return Check::warn(
            ID,
            format!("the container mounts no volume of {driver}"),
            view.label.clone(),
            "mount a claim of one of the driver's classes",
        );
    }
    let list: Vec<String> = view
        .volumes
        .iter()
        .map(|v| match v.block_device {
            Some((a, b)) => format!("{} at {} (device {a}:{b})", v.name, v.destination.display()),
            None => format!("{} at {} (NFS)", v.name, v.destination.display()),
        })
        .collect();
    Check::pass(
        ID,
        "the volume(s) whose udev entries are looked up",
        list.join(", "),
    )
}

/// `text` cut at a character boundary near `max` bytes, with an ellipsis when cut.
fn first_words(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// The findings as text: the report's lines under a heading of their own (the report's
/// "GDS readiness" heading is the node's, not a container's).
pub fn findings_text(report: &gds_check::Report) -> String {
    let text = report.to_text();
    let rest = text.split_once('\n').map_or("", |(_, rest)| rest);
    format!(
        "Findings: {} checks, {} failed, {} warnings\n{rest}",
        report.checks.len(),
        report.failures().len(),
        report.warnings().len()
    )
}

/// Whether compat mode is allowed by the view's cufile.json (None: unreadable).
pub fn compat_allowed(view: &ContainerView) -> Option<bool> {
    let text = view.cufile.content.as_ref().ok()?;
    let cfg = gds_check::parse::parse_cufile_json(text).ok()?;
    Some(cfg.force_compat_mode == Some(true) || cfg.allow_compat_mode.unwrap_or(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "gds.csi.gds-csi.io";

    fn granted() -> ContainerView {
        ContainerView {
            label: "ns/app/main".into(),
            devices: vec![
                DeviceNode {
                    path: "/dev/nvidia-fs0".into(),
                    read_write: Some(true),
                },
                DeviceNode {
                    path: "/dev/nvidia0".into(),
                    read_write: Some(true),
                },
            ],
            all_devices_allowed: false,
            host_dev_mounted: false,
            sys_admin: false,
            udev_mount: Some(true),
            cufile: CufileView {
                path: "/etc/gds-csi/cufile.json".into(),
                from_env: true,
                content: Ok(r#"{"properties": {"allow_compat_mode": false}}"#.into()),
            },
            volumes: vec![VolumeView {
                destination: "/data".into(),
                name: "pvc-1".into(),
                block_device: Some((259, 3)),
                udev_entry: Some(Ok("E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n".into())),
                compat_mark: Some(None),
            }],
        }
    }

    fn status(c: &[Check], id: &str) -> Status {
        c.iter().find(|c| c.id == id).unwrap().status
    }

    #[test]
    fn a_container_with_the_resource_passes_every_finding() {
        let c = findings(
            &granted(),
            &NodeNvfs::Devices(vec!["nvidia-fs0".into()]),
            DRIVER,
        );
        for check in &c {
            assert_eq!(check.status, Status::Pass, "{check:?}");
        }
        assert!(c[3].summary.contains("compat mode off"), "{:?}", c[3]);
        assert_eq!(status(&c, "pod.compat_policy"), Status::Pass);
        assert_eq!(compat_allowed(&granted()), Some(false));
    }

    #[test]
    fn a_missing_node_device_and_udev_entry_fail_naming_the_resource() {
        let mut v = granted();
        v.devices.clear();
        v.volumes[0].udev_entry = Some(Err("No such file or directory".into()));
        let c = findings(
            &v,
            &NodeNvfs::Devices(vec!["nvidia-fs0".into(), "nvidia-fs1".into()]),
            DRIVER,
        );
        let nvfs = &c[0];
        assert_eq!(nvfs.status, Status::Fail);
        assert!(
            nvfs.evidence.contains("/dev/nvidia-fs0 /dev/nvidia-fs1"),
            "{nvfs:?}"
        );
        assert!(nvfs
            .remedy
            .as_ref()
            .unwrap()
            .contains("gds.csi.gds-csi.io/gds"));
        assert_eq!(status(&c, "pod.udev"), Status::Fail);
        assert!(c[2].evidence.contains("b259:3"), "{:?}", c[2]);
        // Inside a container only "loaded" is known: one node is enough.
        v.devices.push(DeviceNode {
            path: "/dev/nvidia-fs3".into(),
            read_write: Some(true),
        });
        assert_eq!(
            findings(&v, &NodeNvfs::Loaded(true), DRIVER)[0].status,
            Status::Pass
        );
    }

    #[test]
    fn no_nvidia_fs_on_the_node_is_a_warning_about_compat() {
        let mut v = granted();
        v.devices.clear();
        let c = findings(&v, &NodeNvfs::Devices(vec![]), DRIVER);
        assert_eq!(c[0].status, Status::Warn);
        assert!(c[0].summary.contains("compat"), "{:?}", c[0]);
        assert_eq!(
            findings(&v, &NodeNvfs::Loaded(false), DRIVER)[0].status,
            Status::Warn
        );
    }

    #[test]
    fn a_privileged_container_is_told_what_it_holds() {
        let mut v = granted();
        v.sys_admin = true;
        v.all_devices_allowed = true;
        v.devices.push(DeviceNode {
            path: "/dev/nvme0n1".into(),
            read_write: Some(true),
        });
        let c = host_devices(&v);
        assert_eq!(c.status, Status::Warn);
        for part in ["CAP_SYS_ADMIN", "every device", "/dev/nvme0n1"] {
            assert!(c.evidence.contains(part), "{part}: {c:?}");
        }
        let mut v = granted();
        v.host_dev_mounted = true;
        assert!(host_devices(&v).evidence.contains("host's /dev"));
        // The runtime's own nodes are no finding.
        let mut v = granted();
        for p in RUNTIME_DEFAULT_DEVICES {
            v.devices.push(DeviceNode {
                path: p.into(),
                read_write: Some(true),
            });
        }
        assert_eq!(host_devices(&v).status, Status::Pass);
    }

    #[test]
    fn cufile_json_missing_unparsable_compat_and_forced() {
        let mut v = granted();
        v.cufile.content = Err("No such file or directory".into());
        assert_eq!(cufile(&v, DRIVER).status, Status::Fail);
        assert_eq!(compat_allowed(&v), None);
        v.cufile.content = Ok("{ oops".into());
        assert_eq!(cufile(&v, DRIVER).status, Status::Fail);
        v.cufile.content = Ok("{}".into());
        let c = cufile(&v, DRIVER);
        assert_eq!(c.status, Status::Pass);
        assert!(c.evidence.contains("unset (true)"), "{c:?}");
        assert_eq!(compat_allowed(&v), Some(true));
        v.cufile.content = Ok(r#"{"properties": {"force_compat_mode": true}}"#.into());
        assert_eq!(cufile(&v, DRIVER).status, Status::Warn);
        assert_eq!(compat_allowed(&v), Some(true));
    }

    #[test]
    fn a_volume_in_compat_mode_fails_a_container_with_compat_off() {
        let mut v = granted();
        v.volumes[0].compat_mark = Some(Some("nvidia_fs not loaded".into()));
        let c = compat_policy(&v, DRIVER);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.evidence.contains("pvc-1 (nvidia_fs not loaded)"), "{c:?}");
        v.volumes[0].compat_mark = Some(Some("é".repeat(200)));
        let long = compat_policy(&v, DRIVER).evidence;
        assert!(long.ends_with("...)") && long.len() < 200, "{long}");
        v.volumes[0].compat_mark = Some(Some("nvidia_fs not loaded".into()));
        assert!(c.remedy.unwrap().contains("gds.csi.gds-csi.io/gds-compat"));
        v.cufile.content = Ok(r#"{"properties": {"allow_compat_mode": true}}"#.into());
        assert_eq!(compat_policy(&v, DRIVER).status, Status::Warn);
        // Inside a container the marks are not there to read.
        v.volumes[0].compat_mark = None;
        assert_eq!(compat_policy(&v, DRIVER).status, Status::NotApplicable);
    }

    #[test]
    fn the_text_heads_the_findings_as_a_containers() {
        let mut v = granted();
        v.udev_mount = None;
        let r = gds_check::Report::new(findings(&v, &NodeNvfs::Devices(vec![]), DRIVER));
        let text = findings_text(&r);
        assert!(
            text.starts_with("Findings: 6 checks, 1 failed, 1 warnings\n"),
            "{text}"
        );
        assert!(!text.contains("GDS readiness"), "{text}");
        assert!(text.contains("pod.udev"), "{text}");
    }

    #[test]
    fn no_udev_mount_fails_and_a_writable_one_warns_nfs_needs_no_entry() {
        let mut v = granted();
        v.udev_mount = None;
        assert_eq!(udev(&v, DRIVER).status, Status::Fail);
        v.udev_mount = Some(false);
        assert_eq!(udev(&v, DRIVER).status, Status::Warn);
        v.udev_mount = Some(true);
        v.volumes[0].block_device = None;
        v.volumes[0].udev_entry = None;
        assert_eq!(udev(&v, DRIVER).status, Status::Pass);
        assert!(volumes(&v, DRIVER).evidence.contains("(NFS)"));
        v.volumes.clear();
        assert_eq!(volumes(&v, DRIVER).status, Status::Warn);
    }
}
