//! Command line and environment: one place, validated before anything starts.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The driver's name unless `--driver-name` says otherwise (the chart's `driverName`).
pub const DEFAULT_DRIVER_NAME: &str = "gds.csi.gds-csi.io";

#[derive(Parser, Debug)]
#[command(
    name = "gds-csi",
    version,
    about = "CSI driver for GPUDirect Storage volumes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the CSI gRPC services on a unix socket until SIGTERM.
    Serve(Box<ServeArgs>),
    /// Check whether this node (and, with --path, a mounted volume) can do GPUDirect Storage;
    /// with --pod, what cuFile in that pod's containers will see.
    Doctor(Box<DoctorArgs>),
    /// In a workload container: read a file on a volume into GPU memory through cuFile as the
    /// container's own cufile.json sets it, and say which path cuFile took (GDS or compat).
    WorkloadRead(WorkloadReadArgs),
    /// In the populator's pod: fill a claim's volume (mounted at --target) with a Dataset's
    /// tree (at --source), resuming from --record; prints one JSON progress line every
    /// --every and a last one saying how it ended.
    Populate(Box<PopulateArgs>),
    /// The device pool, looked at without the driver.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Wait until the driver at --endpoint answers Probe ready (for scripts); exit 1 after --timeout.
    Probe {
        #[arg(long, default_value = "unix:///csi/csi.sock")]
        endpoint: String,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        timeout: Duration,
    },
    /// The cuFile probe child (runs libcufile in its own process); used by `serve` and `doctor`.
    #[command(hide = true)]
    CufileProbe {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// List every NVMe namespace and listed device with what is on it (partitions, holders,
    /// mounts, signatures, model, NUMA node, PCI address) and whether the pool configured by
    /// these flags (`serve`'s, read from the same variables) takes it: the pool's own scan
    /// and probes; nothing is written.
    Discover(DiscoverArgs),
}

#[derive(Args, Debug, Clone)]
pub struct DiscoverArgs {
    /// The driver's state dir (read only; volumes recorded there keep their devices).
    #[arg(long, env = "GDS_CSI_STATE_DIR", default_value = "/var/lib/gds-csi")]
    pub state_dir: PathBuf,
    /// The host's sysfs, as seen here.
    #[arg(long, env = "GDS_CSI_HOST_SYS", default_value = "/sys")]
    pub host_sys: PathBuf,
    /// The host's /dev, as seen here.
    #[arg(long, env = "GDS_CSI_HOST_DEV", default_value = "/dev")]
    pub host_dev: PathBuf,
    /// As `serve --nvme-discover`: says whether clean namespaces are taken or only listed.
    #[arg(long, env = "GDS_CSI_NVME_DISCOVER")]
    pub nvme_discover: bool,
    /// As `serve --pool-device`.
    #[arg(
        long = "pool-device",
        env = "GDS_CSI_POOL_DEVICES",
        value_delimiter = ','
    )]
    pub pool_devices: Vec<PathBuf>,
    /// Deadline of each signature probe.
    #[arg(long, env = "GDS_CSI_COMMAND_TIMEOUT", value_parser = humantime::parse_duration, default_value = "300s")]
    pub command_timeout: Duration,
    /// One JSON array instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where GDS's files are and how the cuFile probe runs; shared by `serve` and `doctor`.
#[derive(Args, Debug, Clone)]
pub struct GdsArgs {
    /// cufile.json as seen by the plugin (default: $CUFILE_ENV_PATH_JSON, else /etc/cufile.json).
    #[arg(long, env = "GDS_CSI_CUFILE_JSON", default_value_os_t = gds_check::default_cufile_json())]
    pub cufile_json: PathBuf,
    /// The host's udev database (`b<major>:<minor>` files).
    #[arg(long, env = "GDS_CSI_UDEV_DATA_DIR", default_value = "/run/udev/data")]
    pub udev_data_dir: PathBuf,
    /// The host's udev rules directories, highest precedence first (repeat the flag or separate
    /// with commas): on the host `/etc/udev/rules.d,/run/udev/rules.d,/usr/lib/udev/rules.d,
    /// /lib/udev/rules.d`, in the plugin's pod where it mounts them. The md RAID check reads
    /// mdadm's rule there; unset, that check warns that it cannot see the rule.
    #[arg(
        long = "udev-rules-dir",
        env = "GDS_CSI_UDEV_RULES_DIRS",
        value_delimiter = ','
    )]
    pub udev_rules_dirs: Vec<PathBuf>,
    /// libcufile to load in the probe (default: libcufile.so.0 from the loader's search path).
    #[arg(long, env = "GDS_CSI_CUFILE_LIBRARY")]
    pub cufile_library: Option<PathBuf>,
    /// Deadline of one cuFile probe (its child process group is killed after it).
    #[arg(long, env = "GDS_CSI_PROBE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "30s")]
    pub probe_timeout: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// The storage path to check for: nvme (local NVMe namespaces, partitions and md
    /// stripes) or nfs-rdma (NFS over RDMA).
    #[arg(long, value_parser = parse_backend, default_value = "nvme")]
    pub backend: gds_check::Backend,
    /// A mounted volume (a directory on it) to check, and to probe with --probe.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also run the cuFile probe (loads libcufile in a child process, under --probe-timeout).
    #[arg(long)]
    pub probe: bool,
    /// The host's procfs.
    #[arg(long, env = "GDS_CSI_HOST_PROC", default_value = "/proc")]
    pub host_proc: PathBuf,
    /// The host's sysfs.
    #[arg(long, env = "GDS_CSI_HOST_SYS", default_value = "/sys")]
    pub host_sys: PathBuf,
    /// The host's /dev.
    #[arg(long, env = "GDS_CSI_HOST_DEV", default_value = "/dev")]
    pub host_dev: PathBuf,
    /// NAMESPACE/NAME of a pod on this node: what cuFile in its containers will see (its
    /// device nodes, udev entries, cufile.json), read from the container runtime's specs.
    #[arg(long)]
    pub pod: Option<String>,
    /// containerd's task bundles for Kubernetes (each container's OCI spec), for --pod.
    #[arg(
        long,
        env = "GDS_CSI_RUNTIME_STATE_DIR",
        default_value = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
    )]
    pub runtime_state_dir: PathBuf,
    /// The kubelet's root directory as this process sees it, for --pod.
    #[arg(long, env = "GDS_CSI_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    #[command(flatten)]
    pub driver: DriverName,
    /// The driver's state dir, for --pod: which volumes it published in compat mode.
    #[arg(long, env = "GDS_CSI_STATE_DIR", default_value = "/var/lib/gds-csi")]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub gds: GdsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct WorkloadReadArgs {
    /// A file on the volume (its first MiBs are read), or a directory on it (a scratch
    /// file is written there and removed).
    pub path: PathBuf,
    /// Print the findings and the read as JSON.
    #[arg(long)]
    pub json: bool,
    /// Exit 1 unless the read took the GDS path (compat mode counts as a failure).
    #[arg(long)]
    pub require_gds: bool,
    /// The storage path the volume is on: nvme or nfs-rdma.
    #[arg(long, value_parser = parse_backend, default_value = "nvme")]
    pub backend: gds_check::Backend,
    /// libcufile to load (default: libcufile.so.0 from the loader's search path).
    #[arg(long, env = "GDS_CSI_CUFILE_LIBRARY")]
    pub cufile_library: Option<PathBuf>,
    /// Deadline of the read (its child process group is killed after it).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub timeout: Duration,
    #[command(flatten)]
    pub driver: DriverName,
}

#[derive(Args, Debug, Clone)]
pub struct PopulateArgs {
    /// The directory the Dataset's directory is beneath (read only); or --nfs-server.
    #[arg(
        long,
        conflicts_with = "nfs_server",
        required_unless_present = "nfs_server"
    )]
    pub source: Option<PathBuf>,
    /// The Dataset's directory beneath --source; nothing on the way is followed.
    #[arg(long, default_value = ".")]
    pub path: PathBuf,
    /// An NFS Dataset: its server, share and directory, checked as a class's `dataset*`.
    #[arg(long, requires_all = ["nfs_share", "nfs_path", "work"])]
    pub nfs_server: Option<String>,
    #[arg(long)]
    pub nfs_share: Option<String>,
    #[arg(long)]
    pub nfs_path: Option<String>,
    /// Default rdma (port 20049), as a class's datasetProto.
    #[arg(long)]
    pub nfs_proto: Option<String>,
    #[arg(long)]
    pub nfs_port: Option<String>,
    /// Default 4.1.
    #[arg(long)]
    pub nfs_vers: Option<String>,
    /// A writable directory the NFS source is mounted below.
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// The claim's volume, mounted.
    #[arg(long)]
    pub target: PathBuf,
    /// Where the copy keeps how far it got (beside the volume, never in it).
    #[arg(long)]
    pub record: PathBuf,
    /// What the copy checks once done: `sizes` or `checksum` (every file read back).
    #[arg(long, value_parser = ["sizes", "checksum"], default_value = "sizes")]
    pub verify: String,
    /// How the Dataset is named in messages.
    #[arg(long, default_value = "the dataset")]
    pub label: String,
    /// Time between two progress lines.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub every: Duration,
}

/// The driver's name (the chart's `driverName`): the CSI plugin name, the prefix of the GDS
/// resources and of the registrar's socket, and whose volumes `doctor --pod` reports.
#[derive(Args, Debug, Clone)]
pub struct DriverName {
    /// The driver's name (a domain-like name of at most 63 characters).
    #[arg(
        long = "driver-name",
        env = "GDS_CSI_DRIVER_NAME",
        default_value = DEFAULT_DRIVER_NAME,
        value_parser = parse_driver_name
    )]
    pub name: String,
}

/// A CSI plugin name: domain-like, at most 63 characters (the CSI spec's GetPluginInfo).
fn parse_driver_name(name: &str) -> Result<String, String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "{name:?} must be a domain-like name of at most 63 characters"
        ))
    }
}

fn parse_backend(s: &str) -> Result<gds_check::Backend, String> {
    s.parse()
}

impl GdsArgs {
    pub fn host_paths(
        &self,
        proc_root: &std::path::Path,
        sys_root: &std::path::Path,
        dev_root: &std::path::Path,
    ) -> gds_check::HostPaths {
        gds_check::HostPaths {
            proc_root: proc_root.to_owned(),
            sys_root: sys_root.to_owned(),
            dev_root: dev_root.to_owned(),
            udev_data_dir: self.udev_data_dir.clone(),
            cufile_json: self.cufile_json.clone(),
            udev_rules_dirs: self.udev_rules_dirs.clone(),
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Controller,
    Node,
    All,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// CSI endpoint, `unix:///path/to/csi.sock`.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// Which CSI services to serve.
    #[arg(long, env = "GDS_CSI_MODE", value_enum, default_value_t = Mode::All)]
    pub mode: Mode,
    /// This node's id (the Kubernetes node name).
    #[arg(long, env = "GDS_CSI_NODE_ID")]
    pub node_id: String,
    #[command(flatten)]
    pub driver: DriverName,
    /// Where the allocation state lives; must survive restarts (a hostPath).
    #[arg(long, env = "GDS_CSI_STATE_DIR", default_value = "/var/lib/gds-csi")]
    pub state_dir: PathBuf,
    /// How long start-up waits for a previous driver on the same state dir (one killed
    /// or still draining) to exit, before refusing to start.
    #[arg(long, env = "GDS_CSI_STATE_LOCK_WAIT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub state_lock_wait: Duration,
    /// The host's sysfs, as seen by the plugin.
    #[arg(long, env = "GDS_CSI_HOST_SYS", default_value = "/sys")]
    pub host_sys: PathBuf,
    /// The host's /dev, as seen by the plugin.
    #[arg(long, env = "GDS_CSI_HOST_DEV", default_value = "/dev")]
    pub host_dev: PathBuf,
    /// The host's procfs (for /proc/driver/nvidia-fs), as seen by the plugin.
    #[arg(long, env = "GDS_CSI_HOST_PROC", default_value = "/proc")]
    pub host_proc: PathBuf,
    /// Take every clean NVMe namespace (no partitions, holders, mounts or signatures) into the pool.
    #[arg(long, env = "GDS_CSI_NVME_DISCOVER")]
    pub nvme_discover: bool,
    /// A block device for the pool, identified by this path: give a stable one (/dev/disk/by-id/...).
    #[arg(
        long = "pool-device",
        env = "GDS_CSI_POOL_DEVICES",
        value_delimiter = ','
    )]
    pub pool_devices: Vec<PathBuf>,
    /// Staging and target paths must lie under one of these roots.
    #[arg(
        long = "allowed-path-root",
        env = "GDS_CSI_ALLOWED_PATH_ROOTS",
        value_delimiter = ',',
        default_value = "/var/lib/kubelet"
    )]
    pub allowed_path_roots: Vec<PathBuf>,
    /// Serve Prometheus/OpenMetrics text on GET /metrics at HOST:PORT; off when empty.
    #[arg(long, env = "GDS_CSI_METRICS_ADDRESS", default_value = "")]
    pub metrics_address: String,
    /// Deadline for each mount and umount.
    #[arg(long, env = "GDS_CSI_MOUNT_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub mount_timeout: Duration,
    /// The longest a mounted volume's filesystem stays frozen for the last pass of a copy
    /// of it, a snapshot's or a clone's (what changed while it was copied live); past it
    /// the copy fails, thawed at once.
    #[arg(long, env = "GDS_CSI_SNAPSHOT_FREEZE_LIMIT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub snapshot_freeze_limit: Duration,
    /// How long a snapshot's copy may go without a byte moved before CreateSnapshot answers
    /// Unavailable naming its store (the copy goes on when the store answers).
    #[arg(long, env = "GDS_CSI_SNAPSHOT_STALL_LIMIT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub snapshot_stall_limit: Duration,
    /// Deadline for every other external command (mkfs, blkid, wipefs).
    #[arg(long, env = "GDS_CSI_COMMAND_TIMEOUT", value_parser = humantime::parse_duration, default_value = "300s")]
    pub command_timeout: Duration,
    /// Permissions of the CSI socket (octal).
    #[arg(long, env = "GDS_CSI_SOCKET_MODE", value_parser = parse_octal, default_value = "0660")]
    pub socket_mode: u32,
    #[arg(long, env = "GDS_CSI_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub gds: GdsArgs,
    /// How long the GDS gate reuses a volume's cuFile probe result.
    #[arg(long, env = "GDS_CSI_GDS_CACHE_TTL", value_parser = humantime::parse_duration, default_value = "60s")]
    pub gds_cache_ttl: Duration,
    /// The node-driver-registrar's registration socket as this process sees it
    /// (`<kubelet dir>/plugins_registry/<driver-name>-reg.sock`): when the node's GDS
    /// readiness changes, it is relinked so the kubelet registers the driver again and
    /// re-reads NodeGetInfo (see src/readiness). Unset: changes are only logged.
    #[arg(long, env = "GDS_CSI_REGISTRATION_SOCKET")]
    pub registration_socket: Option<PathBuf>,
    /// How often the node checks behind the readiness labels are re-read (procfs/sysfs,
    /// never the cuFile probe); 0 turns the watcher off.
    #[arg(long, env = "GDS_CSI_READINESS_INTERVAL", value_parser = humantime::parse_duration, default_value = "30s")]
    pub readiness_interval: Duration,
    /// Serve the kubelet device plugin that gives workload pods what cuFile needs without
    /// privileged mode: resources `<driver-name>/gds` (compat mode off) and
    /// `<driver-name>/gds-compat` (see src/gds/workload). Node mode only.
    #[arg(long, env = "GDS_CSI_GDS_DEVICE_PLUGIN")]
    pub gds_device_plugin: bool,
    /// The kubelet's device plugin directory (its kubelet.sock), as this process sees it.
    #[arg(
        long,
        env = "GDS_CSI_DEVICE_PLUGIN_DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    pub device_plugin_dir: PathBuf,
    /// How many containers on the node may hold each of the two resources at once.
    #[arg(long, env = "GDS_CSI_GDS_DEVICE_SHARES", default_value_t = 110, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub gds_device_shares: u32,
    /// TEST-ONLY: SIGKILL the plugin when it reaches this step (see src/runtime/faults.rs). Never deploy it.
    /// Exists only in a build with the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    #[arg(long, env = crate::runtime::faults::ENV, hide = true, value_parser = crate::runtime::faults::KillPoint::parse)]
    pub fault_kill_at: Option<crate::runtime::faults::KillPoint>,
}

impl ServeArgs {
    /// The registration socket must be this driver's, as node-driver-registrar names it
    /// (`<plugin-registration-path>/<driver-name>-reg.sock`,
    /// `cmd/csi-node-driver-registrar/node_register.go` buildSocketPath, v2.17.0): the
    /// watcher relinks it, so a wrong path must not name another driver's socket.
    fn check_registration_socket(&self) -> Result<(), String> {
        let Some(path) = &self.registration_socket else {
            return Ok(());
        };
        let want = format!("{}-reg.sock", self.driver.name);
        if !path.is_absolute() || path.file_name() != Some(want.as_ref()) {
            return Err(format!(
                "--registration-socket {} must be an absolute path ending in /{want} \
                 (the registrar's socket in the kubelet's plugins_registry directory)",
                path.display()
            ));
        }
        Ok(())
    }
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode such as 0660"))
}

impl ServeArgs {
    /// The socket path of a `unix://` endpoint.
    pub fn socket_path(&self) -> Result<PathBuf, String> {
        let path = self
            .endpoint
            .strip_prefix("unix://")
            .ok_or_else(|| format!("--endpoint {:?} must start with unix://", self.endpoint))?;
        if !path.starts_with('/') {
            return Err(format!(
                "--endpoint {:?} needs an absolute path",
                self.endpoint
            ));
        }
        Ok(PathBuf::from(path))
    }

    pub fn validate(&self) -> Result<(), String> {
        self.socket_path()?;
        crate::csi::id::check_node_id(&self.node_id).map_err(|e| format!("--node-id: {e}"))?;
        self.check_registration_socket()?;
        if self.gds_device_plugin && self.mode == Mode::Controller {
            return Err(
                "--gds-device-plugin serves the node's kubelet: it needs --mode node or all".into(),
            );
        }
        if self.gds_device_plugin && !self.device_plugin_dir.is_absolute() {
            return Err(format!(
                "--device-plugin-dir {} must be absolute",
                self.device_plugin_dir.display()
            ));
        }
        for root in &self.allowed_path_roots {
            if !root.is_absolute() {
                return Err(format!(
                    "--allowed-path-root {} must be absolute",
                    root.display()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(extra: &[&str]) -> Result<(), String> {
        let mut argv = vec![
            "gds-csi",
            "serve",
            "--node-id",
            "n1",
            "--driver-name",
            "d.example",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Serve(args) => args.validate(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_registration_socket_must_be_this_drivers() {
        serve(&[]).unwrap();
        serve(&[
            "--registration-socket",
            "/var/lib/kubelet/plugins_registry/d.example-reg.sock",
        ])
        .unwrap();
        for bad in [
            "/var/lib/kubelet/plugins_registry/other.example-reg.sock",
            "/var/lib/kubelet/plugins/d.example/csi.sock",
            "plugins_registry/d.example-reg.sock",
        ] {
            let e = serve(&["--registration-socket", bad]).unwrap_err();
            assert!(
                e.contains("--registration-socket") && e.contains("d.example-reg.sock"),
                "{e}"
            );
        }
    }

    #[test]
    fn every_command_takes_one_checked_driver_name() {
        let name = |argv: &[&str]| {
            Cli::try_parse_from(argv)
                .map(|c| match c.command {
                    Command::Serve(a) => a.driver.name,
                    Command::Doctor(a) => a.driver.name,
                    Command::WorkloadRead(a) => a.driver.name,
                    _ => unreachable!(),
                })
                .map_err(|e| e.to_string())
        };
        for argv in [
            &["gds-csi", "serve", "--node-id", "n1"][..],
            &["gds-csi", "doctor"],
            &["gds-csi", "workload-read", "/data/f"],
        ] {
            assert_eq!(name(argv).unwrap(), DEFAULT_DRIVER_NAME);
            let given = [argv, &["--driver-name", "d.example"]].concat();
            assert_eq!(name(&given).unwrap(), "d.example");
            for bad in ["", "-d.example", "d.example.", "d/example", &"d".repeat(64)] {
                let arg = format!("--driver-name={bad}");
                let given = [argv, &[arg.as_str()]].concat();
                let e = name(&given).unwrap_err();
                assert!(
                    e.contains("--driver-name") && e.contains("domain-like"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn the_device_plugin_is_off_by_default_and_needs_the_node() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["gds-csi", "serve", "--node-id", "n1"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv)
                .map_err(|e| e.to_string())?
                .command
            {
                Command::Serve(args) => args.validate().map(|()| args),
                _ => unreachable!(),
            }
        };
        let args = parse(&[]).unwrap();
        assert!(!args.gds_device_plugin);
        assert_eq!(
            args.device_plugin_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(args.gds_device_shares, 110);
        parse(&["--gds-device-plugin", "--mode", "node"]).unwrap();
        let e = parse(&["--gds-device-plugin", "--mode", "controller"]).unwrap_err();
        assert!(e.contains("--gds-device-plugin"), "{e}");
        let e = parse(&["--gds-device-plugin", "--device-plugin-dir", "dp"]).unwrap_err();
        assert!(e.contains("--device-plugin-dir"), "{e}");
        assert!(parse(&["--gds-device-shares", "0"]).is_err());
    }

    #[test]
    fn the_readiness_interval_defaults_to_30s_and_0_turns_it_off() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["gds-csi", "serve", "--node-id", "n1"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Serve(args) => args.readiness_interval,
                _ => unreachable!(),
            }
        };
        assert_eq!(parse(&[]), Duration::from_secs(30));
        assert_eq!(parse(&["--readiness-interval", "0s"]), Duration::ZERO);
    }
}
