//! What cuFile needs in a workload pod, handed out by the kubelet rather than by privileged
//! mode: a device plugin (the kubelet's API v1beta1) that the node plugin serves for two
//! extended resources, one per GDS policy that uses cuFile in the pod:
//!
//! - `<driver>/gds` for `gdsPolicy: required`: cufile.json with `allow_compat_mode: false`,
//!   so a read that cannot take the GDS path is an error, not a silent slowdown;
//! - `<driver>/gds-compat` for `preferred`: compat mode allowed.
//!
//! Each resource's ids are healthy while the node can hand out its pieces; `gds`'s also
//! only while GDS works on the node (the gate's node checks, as for the readiness labels).
//! The kubelet counts only healthy ids as allocatable, so a pod asking for `gds` is
//! scheduled only to a node where its reads can take the GDS path, and a node that stops
//! being one stops getting such pods (the readiness label cannot do that: the kubelet
//! never removes a label).
//!
//! A container that lists one in `resources.limits` gets every `/dev/nvidia-fs*` of the host
//! (read-write), the host's udev database read-only, and that cufile.json read-only with
//! `CUFILE_ENV_PATH_JSON` naming it; nothing else of the host. The resources are shares,
//! not devices: each lists `shares` interchangeable ids, one per container that may hold it.
//!
//! `api`: the generated API; `cufile`: the file each resource gets; `allocate`: the answer
//! to Allocate; `plugin`: the DevicePlugin service; `kubelet`: serving, registering, and
//! registering again after the kubelet restarts. What a container then holds is checked by
//! the doctor (`gds::doctor`: `inspect`, `pod`, `read`). Of the rest it uses the state
//! dir's atomic write, the server's socket binding, the mount table reader and gds-check's
//! cufile.json reader; only `main` and the doctor use it.

pub mod allocate;
pub mod api;
pub mod cufile;
pub mod kubelet;
pub mod plugin;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The two resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `gdsPolicy: required`: compat mode off.
    Gds,
    /// `gdsPolicy: preferred`: compat mode allowed.
    GdsCompat,
}

impl Resource {
    pub const ALL: [Resource; 2] = [Resource::Gds, Resource::GdsCompat];

    fn suffix(self) -> &'static str {
        match self {
            Resource::Gds => "gds",
            Resource::GdsCompat => "gds-compat",
        }
    }

    pub fn compat_allowed(self) -> bool {
        self == Resource::GdsCompat
    }

    /// Its place in [`Resource::ALL`].
    fn index(self) -> usize {
        match self {
            Resource::Gds => 0,
            Resource::GdsCompat => 1,
        }
    }

    /// The extended resource name, under the driver's name as the topology keys are, so two
    /// releases (driver names) on one node never take each other's resource.
    pub fn name(self, driver: &str) -> String {
        format!("{driver}/{}", self.suffix())
    }

    /// The plugin's socket in the kubelet's device plugin directory.
    pub fn socket_name(self, driver: &str) -> String {
        format!("{driver}-{}.sock", self.suffix())
    }

    pub fn cufile_file_name(self) -> String {
        format!("cufile-{}.json", self.suffix())
    }

    /// The ids ListAndWatch lists: `gds-0` .. `gds-<shares - 1>`.
    pub fn device_id(self, n: u32) -> String {
        format!("{}-{n}", self.suffix())
    }

    pub fn owns_device_id(self, id: &str) -> bool {
        id.strip_prefix(self.suffix())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }
}

/// How the device plugin runs. Paths the kubelet is handed (`udev_data_dir`, `out_dir`)
/// must be the host's own: the chart mounts both at the host's paths.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver_name: String,
    /// The kubelet's device plugin directory (its `kubelet.sock` and the plugins' sockets).
    pub plugin_dir: PathBuf,
    /// The host's /dev as this process sees it, where `/dev/nvidia-fs*` are looked up.
    pub host_dev: PathBuf,
    /// The host's udev database.
    pub udev_data_dir: PathBuf,
    /// The node's cufile.json, re-read at every check and every Allocate.
    pub cufile_json: PathBuf,
    /// Where each resource's cufile.json is written (`<state-dir>/workload`).
    pub out_dir: PathBuf,
    /// Containers that may hold each resource at once.
    pub shares: u32,
    /// How often the sockets, the kubelet's socket and the pieces are looked at again.
    pub interval: Duration,
    /// Deadline of each call to the kubelet (connect, Register).
    pub kubelet_timeout: Duration,
}

/// Whether the node can hand out what a container of a resource needs now; its devices'
/// health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// Why not: the scheduler places no new pod asking for the resource meanwhile.
    Missing(String),
}

/// Whether GDS works on the node: None when it does, else why not (`GdsGate::node_not_ready`).
pub type NodeGds = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What the services and the kubelet loop share.
pub struct Shared {
    pub config: Config,
    /// What `gds` needs of the node besides its pieces; None: nothing is checked.
    node_gds: Option<NodeGds>,
    /// One writer of the cufile.json files at a time.
    writing: Mutex<()>,
    /// The sockets served now, with the identity each had when bound.
    sockets: Mutex<Vec<(PathBuf, kubelet::FileId)>>,
    /// Per resource, in [`Resource::ALL`]'s order.
    health: [tokio::sync::watch::Sender<Health>; 2],
}

impl Shared {
    pub fn new(config: Config, node_gds: Option<NodeGds>) -> Shared {
        let unchecked =
            || tokio::sync::watch::Sender::new(Health::Missing("not checked yet".into()));
        Shared {
            config,
            node_gds,
            writing: Mutex::new(()),
            sockets: Mutex::new(Vec::new()),
            health: [unchecked(), unchecked()],
        }
    }

    pub fn health(&self, resource: Resource) -> tokio::sync::watch::Receiver<Health> {
        self.health[resource.index()].subscribe()
    }

    /// Writes `resource`'s cufile.json from the node's current one and checks the udev
    /// database is there: the pieces a container of it gets besides the device nodes.
    pub fn prepare(&self, resource: Resource) -> Result<PathBuf, String> {
        let c = &self.config;
        if !c.udev_data_dir.is_dir() {
            return Err(format!(
                "no udev database at {} (cuFile reads ID_FS_USAGE there and fails without it): \
                 the host must run udev",
                c.udev_data_dir.display()
            ));
        }
        let _one = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        cufile::write(&c.out_dir, &c.cufile_json, resource)
    }

    /// Looks at the pieces (and, for `gds`, at GDS on the node) again and publishes each
    /// resource's health; the resources whose health changed.
    pub fn check(&self) -> Vec<Resource> {
        Resource::ALL
            .into_iter()
            .filter(|&r| {
                let now = self.health_now(r);
                self.health[r.index()].send_if_modified(|h| {
                    let changed = *h != now;
                    *h = now;
                    changed
                })
            })
            .collect()
    }

    fn health_now(&self, resource: Resource) -> Health {
        if let Err(why) = self.prepare(resource) {
            return Health::Missing(why);
        }
        if !resource.compat_allowed() {
            if let Some(why) = self.node_gds.as_ref().and_then(|not_ready| not_ready()) {
                return Health::Missing(format!(
                    "GDS does not work on this node, and a container of {} reads with compat \
                     mode off: {why}",
                    resource.name(&self.config.driver_name)
                ));
            }
        }
        Health::Ready
    }

    pub fn current_health(&self, resource: Resource) -> Health {
        self.health[resource.index()].borrow().clone()
    }
}

/// The running device plugin.
pub struct Running {
    shared: std::sync::Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// Serves the device plugin until [`Running::stop`] (see [`kubelet::run`]).
pub fn spawn(config: Config, node_gds: Option<NodeGds>) -> Running {
    let shared = std::sync::Arc::new(Shared::new(config, node_gds));
    let task = tokio::spawn(kubelet::run(std::sync::Arc::clone(&shared)));
    Running { shared, task }
}

impl Running {
    /// Stops serving and removes the sockets this process made (not one a successor
    /// bound at the same path meanwhile): the kubelet then marks the resources unhealthy
    /// at once instead of dialing a dead socket.
    pub fn stop(self) {
        self.task.abort();
        let served = std::mem::take(
            &mut *self
                .shared
                .sockets
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (socket, id) in served {
            if kubelet::file_id(&socket) == Some(id) {
                let _ = std::fs::remove_file(&socket);
            }
        }
    }
}

/// `<state-dir>/workload`: where the files handed to the kubelet live.
pub fn out_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("workload")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_driver() {
        let d = "gds.csi.gds-csi.io";
        assert_eq!(Resource::Gds.name(d), "gds.csi.gds-csi.io/gds");
        assert_eq!(Resource::GdsCompat.name(d), "gds.csi.gds-csi.io/gds-compat");
        assert_eq!(Resource::Gds.socket_name(d), "gds.csi.gds-csi.io-gds.sock");
        assert_eq!(
            Resource::GdsCompat.cufile_file_name(),
            "cufile-gds-compat.json"
        );
        assert_eq!(Resource::GdsCompat.device_id(7), "gds-compat-7");
    }

    #[test]
    fn each_resource_owns_only_its_ids() {
        assert!(Resource::Gds.owns_device_id("gds-0"));
        assert!(Resource::GdsCompat.owns_device_id("gds-compat-109"));
        for id in ["gds-compat-1", "gds-", "gds-x", "gds", "nvidia-fs0"] {
            assert!(!Resource::Gds.owns_device_id(id), "{id}");
        }
        assert!(!Resource::GdsCompat.owns_device_id("gds-1"));
    }

    fn config(dir: &Path) -> Config {
        Config {
            driver_name: "d.example".into(),
            plugin_dir: dir.join("plugins"),
            host_dev: dir.join("dev"),
            udev_data_dir: dir.join("udev-data"),
            cufile_json: dir.join("cufile.json"),
            out_dir: dir.join("out"),
            shares: 4,
            interval: Duration::from_secs(1),
            kubelet_timeout: Duration::from_secs(1),
        }
    }

    fn missing(shared: &Shared, r: Resource) -> String {
        match shared.current_health(r) {
            Health::Missing(why) => why,
            Health::Ready => panic!("{r:?} ready"),
        }
    }

    #[test]
    fn health_needs_the_udev_database_and_a_readable_cufile_json() {
        let t = tempfile::tempdir().unwrap();
        let c = config(t.path());
        let (udev, node) = (c.udev_data_dir.clone(), c.cufile_json.clone());
        let shared = Shared::new(c, None);
        assert_eq!(shared.check(), Resource::ALL);
        for r in Resource::ALL {
            let why = missing(&shared, r);
            assert!(why.contains("udev") && why.contains("udev-data"), "{why}");
        }
        std::fs::create_dir(&udev).unwrap();
        // No cufile.json on the node: the policy alone, ready.
        assert_eq!(shared.check(), Resource::ALL);
        for r in Resource::ALL {
            assert_eq!(shared.current_health(r), Health::Ready);
        }
        assert!(shared.check().is_empty(), "unchanged");
        std::fs::write(&node, "{ oops").unwrap();
        assert_eq!(shared.check(), Resource::ALL);
        assert!(missing(&shared, Resource::GdsCompat).contains("cufile.json"));
    }

    #[test]
    fn gds_is_healthy_only_while_gds_works_on_the_node_and_gds_compat_regardless() {
        let t = tempfile::tempdir().unwrap();
        let c = config(t.path());
        std::fs::create_dir(&c.udev_data_dir).unwrap();
        let broken = std::sync::Arc::new(Mutex::new(Some("nvidia_fs is not loaded".to_string())));
        let source = std::sync::Arc::clone(&broken);
        let node_gds: NodeGds = std::sync::Arc::new(move || source.lock().unwrap().clone());
        let shared = Shared::new(c, Some(node_gds));
        assert_eq!(shared.check(), Resource::ALL);
        let why = missing(&shared, Resource::Gds);
        assert!(
            why.contains("d.example/gds") && why.contains("nvidia_fs is not loaded"),
            "{why}"
        );
        assert_eq!(shared.current_health(Resource::GdsCompat), Health::Ready);
        *broken.lock().unwrap() = None;
        assert_eq!(shared.check(), [Resource::Gds], "only gds changed");
        assert_eq!(shared.current_health(Resource::Gds), Health::Ready);
        *broken.lock().unwrap() = Some("no GPU".into());
        assert_eq!(shared.check(), [Resource::Gds]);
        assert!(missing(&shared, Resource::Gds).contains("no GPU"));
    }
}
