//! What cuFile needs in a workload pod, handed out by the kubelet rather than by privileged
//! mode: a device plugin (the kubelet's API v1beta1) that the node plugin serves for two
//! extended resources, one per GDS policy that uses cuFile in the pod:
//!
//! - `<driver>/gds` for `gdsPolicy: required`: cufile.json with `allow_compat_mode: false`,
//!   so a read that cannot take the GDS path is an error, not a silent slowdown;
//! - `<driver>/gds-compat` for `preferred`: compat mode allowed.
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

/// Whether the node can hand out what a container needs now; the devices' health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// Why not: the scheduler places no new pod asking for the resources meanwhile.
    Missing(String),
}

/// What the services and the kubelet loop share.
pub struct Shared {
    pub config: Config,
    /// One writer of the cufile.json files at a time.
    writing: Mutex<()>,
    /// The sockets served now, with the identity each had when bound.
    sockets: Mutex<Vec<(PathBuf, kubelet::FileId)>>,
    health: tokio::sync::watch::Sender<Health>,
}

impl Shared {
    pub fn new(config: Config) -> Shared {
        Shared {
            config,
            writing: Mutex::new(()),
            sockets: Mutex::new(Vec::new()),
            health: tokio::sync::watch::Sender::new(Health::Missing("not checked yet".into())),
        }
    }

    pub fn health(&self) -> tokio::sync::watch::Receiver<Health> {
        self.health.subscribe()
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

    /// Looks at the pieces again and publishes the health they give (both resources share
    /// it); true when it changed.
    pub fn check(&self) -> bool {
        let now = Resource::ALL
            .iter()
            .map(|r| self.prepare(*r))
            .find_map(Result::err)
            .map_or(Health::Ready, Health::Missing);
        self.health.send_if_modified(|h| {
            let changed = *h != now;
            *h = now;
            changed
        })
    }

    pub fn current_health(&self) -> Health {
        self.health.borrow().clone()
    }
}

/// The running device plugin.
pub struct Running {
    shared: std::sync::Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// Serves the device plugin until [`Running::stop`] (see [`kubelet::run`]).
pub fn spawn(config: Config) -> Running {
    let shared = std::sync::Arc::new(Shared::new(config));
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

    #[test]
    fn health_needs_the_udev_database_and_a_readable_cufile_json() {
        let t = tempfile::tempdir().unwrap();
        let udev = t.path().join("udev-data");
        let node = t.path().join("cufile.json");
        let shared = Shared::new(Config {
            driver_name: "d.example".into(),
            plugin_dir: t.path().join("plugins"),
            host_dev: t.path().join("dev"),
            udev_data_dir: udev.clone(),
            cufile_json: node.clone(),
            out_dir: t.path().join("out"),
            shares: 4,
            interval: Duration::from_secs(1),
            kubelet_timeout: Duration::from_secs(1),
        });
        assert!(shared.check());
        let Health::Missing(why) = shared.current_health() else {
            panic!("ready without a udev database")
        };
        assert!(why.contains("udev") && why.contains("udev-data"), "{why}");
        std::fs::create_dir(&udev).unwrap();
        // No cufile.json on the node: the policy alone, ready.
        assert!(shared.check());
        assert_eq!(shared.current_health(), Health::Ready);
        assert!(!shared.check(), "unchanged");
        std::fs::write(&node, "{ oops").unwrap();
        assert!(shared.check());
        let Health::Missing(why) = shared.current_health() else {
            panic!("ready with a broken cufile.json")
        };
        assert!(why.contains("cufile.json"), "{why}");
    }
}
