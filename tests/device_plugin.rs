//! The GDS device plugin against a fake kubelet on a temporary directory: a Registration
//! server at `kubelet.sock` that, as the kubelet's device manager does before it answers
//! Register, dials the plugin's socket named in the request and asks for its options and
//! its devices. Then the kubelet's Allocate on each resource's socket, the health that
//! follows the node's pieces, and a restarted kubelet (every socket in the directory
//! removed, a new Registration server) that gets both resources registered again; stopped,
//! the plugin takes its sockets away. `gds` also follows GDS on the node: the real gate's
//! node checks over a fixture host tree (no nvidia_fs or GPU on this machine).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use gds_csi::gds::gate::{GateConfig, GdsGate};
use gds_csi::gds::workload::api::device_plugin_client::DevicePluginClient;
use gds_csi::gds::workload::api::registration_server::{Registration, RegistrationServer};
use gds_csi::gds::workload::api::{
    AllocateRequest, ContainerAllocateRequest, DevicePluginOptions, Empty, ListAndWatchResponse,
    RegisterRequest,
};
use gds_csi::gds::workload::{self, Config, NodeGds};

mod common;
use common::gds_fixture::Tree;

const DRIVER: &str = "d.example";
const SHARES: u32 = 8;
const WAIT: Duration = Duration::from_secs(20);

/// What the fake kubelet saw of one registration.
#[derive(Debug)]
struct Registered {
    request: RegisterRequest,
    options: DevicePluginOptions,
    devices: ListAndWatchResponse,
}

struct FakeKubelet {
    dir: PathBuf,
    seen: mpsc::UnboundedSender<Registered>,
}

async fn dial(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != "v1beta1" {
            return Err(Status::unknown(format!(
                "unsupported version {}",
                request.version
            )));
        }
        // plugin/v1beta1/server.go:175: the endpoint is a name in the kubelet's directory.
        let socket = self.dir.join(&request.endpoint);
        let channel = dial(&socket)
            .await
            .map_err(|e| Status::unknown(format!("dialing {}: {e}", socket.display())))?;
        let mut plugin = DevicePluginClient::new(channel);
        let options = plugin
            .get_device_plugin_options(Empty {})
            .await?
            .into_inner();
        let mut stream = plugin.list_and_watch(Empty {}).await?.into_inner();
        let devices = stream
            .message()
            .await?
            .ok_or_else(|| Status::unknown("ListAndWatch ended at once"))?;
        let _ = self.seen.send(Registered {
            request,
            options,
            devices,
        });
        Ok(Response::new(Empty {}))
    }
}

fn start_kubelet(
    dir: &Path,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<Registered>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = UnixListener::bind(dir.join("kubelet.sock")).unwrap();
    let fake = FakeKubelet {
        dir: dir.to_owned(),
        seen: tx,
    };
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    (task, rx)
}

/// The two registrations, in whatever order they came.
async fn both_registered(rx: &mut mpsc::UnboundedReceiver<Registered>) -> Vec<Registered> {
    let mut got = Vec::new();
    while got.len() < 2 {
        let r = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("no registration within the wait")
            .expect("fake kubelet gone");
        got.push(r);
    }
    got.sort_by(|a, b| a.request.resource_name.cmp(&b.request.resource_name));
    got
}

async fn allocate(
    dir: &Path,
    resource: &str,
    containers: &[&[&str]],
) -> Result<gds_csi::gds::workload::api::AllocateResponse, Status> {
    let socket = dir.join(format!("{DRIVER}-{resource}.sock"));
    let mut plugin = DevicePluginClient::new(dial(&socket).await.unwrap());
    plugin
        .allocate(AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        })
        .await
        .map(Response::into_inner)
}

const NODE_CUFILE: &str = r#"{
    // the node's own settings
    "logging": { "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb": 16384,
        "allow_compat_mode": true, // NVIDIA's default
    }
}"#;

#[tokio::test]
async fn registers_allocates_follows_health_and_registers_again_after_a_kubelet_restart() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("device-plugins");
    let udev = t.path().join("udev-data");
    let host_dev = t.path().join("dev");
    for d in [&udev, &host_dev] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(udev.join("b259:1"), "E:ID_FS_USAGE=filesystem\n").unwrap();
    let node_cufile = t.path().join("cufile.json");
    std::fs::write(&node_cufile, NODE_CUFILE).unwrap();
    let out = t.path().join("state/workload");
    // The gate's view of the host: a GPU node with nvidia_fs and the NVMe driver registered.
    let host = Tree::new(&t.path().join("host"));
    host.gpu_node().nvidia_fs("nvme: 1\n");
    let gate = GdsGate::new(GateConfig {
        paths: host.paths.clone(),
        probe_exe: PathBuf::from("/nonexistent"),
        probe_prefix: Vec::new(),
        cufile_library: None,
        probe_timeout: Duration::from_secs(1),
        cache_ttl: Duration::from_secs(1),
    });
    let node_gds: NodeGds = std::sync::Arc::new(move || gate.node_not_ready());

    let running = workload::spawn(
        Config {
            driver_name: DRIVER.into(),
            plugin_dir: dir.clone(),
            host_dev,
            udev_data_dir: udev.clone(),
            cufile_json: node_cufile.clone(),
            out_dir: out.clone(),
            shares: SHARES,
            interval: Duration::from_millis(100),
            kubelet_timeout: Duration::from_secs(10),
        },
        Some(node_gds),
    );
    // No kubelet yet: its directory is the kubelet's to make, and nothing is served.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!dir.exists(), "the plugin made the kubelet's directory");
    std::fs::create_dir(&dir).unwrap();
    let (kubelet, mut seen) = start_kubelet(&dir);

    // Registered, each on its own socket, after serving it (the fake dialed it back).
    let regs = both_registered(&mut seen).await;
    let names: Vec<_> = regs
        .iter()
        .map(|r| r.request.resource_name.as_str())
        .collect();
    assert_eq!(names, ["d.example/gds", "d.example/gds-compat"]);
    for (r, suffix) in regs.iter().zip(["gds", "gds-compat"]) {
        assert_eq!(r.request.version, "v1beta1");
        assert_eq!(r.request.endpoint, format!("d.example-{suffix}.sock"));
        assert_eq!(r.options, DevicePluginOptions::default());
        assert_eq!(r.request.options, Some(DevicePluginOptions::default()));
        let ids: Vec<_> = r.devices.devices.iter().map(|d| d.id.as_str()).collect();
        let want: Vec<String> = (0..SHARES).map(|n| format!("{suffix}-{n}")).collect();
        assert_eq!(ids, want);
        assert!(
            r.devices.devices.iter().all(|d| d.health == "Healthy"),
            "{:?}",
            r.devices
        );
    }

    // Allocate: one answer per container, the host's pieces and nothing else.
    let answer = allocate(&dir, "gds", &[&["gds-0"], &["gds-1", "gds-2"]])
        .await
        .unwrap();
    assert_eq!(answer.container_responses.len(), 2);
    for c in &answer.container_responses {
        assert_eq!(
            c.envs.get("CUFILE_ENV_PATH_JSON").map(String::as_str),
            Some("/etc/gds-csi/cufile.json")
        );
        assert_eq!(c.envs.len(), 1);
        assert!(
            c.devices.is_empty(),
            "no nvidia-fs on this fixture host: {:?}",
            c.devices
        );
        let mounts: Vec<_> = c
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m.host_path.clone(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/run/udev/data", udev.display().to_string(), true),
                (
                    "/etc/gds-csi/cufile.json",
                    out.join("cufile-gds.json").display().to_string(),
                    true
                ),
            ]
        );
    }
    for (resource, allowed) in [("gds", false), ("gds-compat", true)] {
        let answer = allocate(&dir, resource, &[&[&format!("{resource}-3")]])
            .await
            .unwrap();
        let file = &answer.container_responses[0].mounts[1].host_path;
        let c =
            gds_check::parse::parse_cufile_json(&std::fs::read_to_string(file).unwrap()).unwrap();
        assert_eq!(c.allow_compat_mode, Some(allowed), "{resource}: {file}");
        assert_eq!(
            c.max_direct_io_size_kb,
            Some(16384),
            "the node's keys are kept"
        );
    }
    let refused = allocate(&dir, "gds", &[&["gds-compat-0"]])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // Health follows the node: the udev database gone makes every id unhealthy and
    // Allocate refuse with the reason; back, healthy again.
    let mut plugin = DevicePluginClient::new(dial(&dir.join("d.example-gds.sock")).await.unwrap());
    let mut list = plugin.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = list.message().await.unwrap().unwrap();
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    std::fs::rename(&udev, t.path().join("udev-away")).unwrap();
    let next = tokio::time::timeout(WAIT, list.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.devices.len(), SHARES as usize);
    assert!(
        next.devices.iter().all(|d| d.health == "Unhealthy"),
        "{next:?}"
    );
    let refused = allocate(&dir, "gds", &[&["gds-0"]]).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("udev"), "{}", refused.message());
    std::fs::rename(t.path().join("udev-away"), &udev).unwrap();
    let back = tokio::time::timeout(WAIT, list.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        back.devices.iter().all(|d| d.health == "Healthy"),
        "{back:?}"
    );

    // nvidia_fs unloaded: GDS no longer works on the node, so `gds` (compat mode off) turns
    // unhealthy while `gds-compat` stays healthy; loaded again, healthy again.
    let mut compat =
        DevicePluginClient::new(dial(&dir.join("d.example-gds-compat.sock")).await.unwrap());
    let mut compat_list = compat.list_and_watch(Empty {}).await.unwrap().into_inner();
    let compat_first = compat_list.message().await.unwrap().unwrap();
    assert!(compat_first.devices.iter().all(|d| d.health == "Healthy"));
    host.remove("sys/module/nvidia_fs")
        .remove("proc/driver/nvidia-fs")
        .remove("dev/nvidia-fs0");
    let unloaded = tokio::time::timeout(WAIT, list.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        unloaded.devices.iter().all(|d| d.health == "Unhealthy"),
        "{unloaded:?}"
    );
    let quiet = tokio::time::timeout(Duration::from_millis(500), compat_list.message()).await;
    assert!(quiet.is_err(), "gds-compat changed: {quiet:?}");
    host.nvidia_fs("nvme: 1\n");
    let loaded = tokio::time::timeout(WAIT, list.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        loaded.devices.iter().all(|d| d.health == "Healthy"),
        "{loaded:?}"
    );

    // The kubelet restarts: it removes every socket in its directory (devicemanager
    // manager.go CleanupPluginDirectory) and serves Registration anew.
    kubelet.abort();
    let _ = kubelet.await;
    drop(seen);
    for entry in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let (_kubelet, mut seen) = start_kubelet(&dir);
    let again = both_registered(&mut seen).await;
    let names: Vec<_> = again
        .iter()
        .map(|r| r.request.resource_name.as_str())
        .collect();
    assert_eq!(names, ["d.example/gds", "d.example/gds-compat"]);
    for suffix in ["gds", "gds-compat"] {
        assert!(
            dir.join(format!("d.example-{suffix}.sock")).exists(),
            "{suffix} served again"
        );
    }
    allocate(&dir, "gds-compat", &[&["gds-compat-0"]])
        .await
        .unwrap();
    // Registered once per kubelet: nothing more while it stays.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        seen.try_recv().is_err(),
        "registered again with the same kubelet"
    );

    // Stopped (the driver's SIGTERM): its sockets go, so the kubelet marks the resources
    // unhealthy at once; the kubelet's own stays.
    running.stop();
    for suffix in ["gds", "gds-compat"] {
        assert!(
            !dir.join(format!("d.example-{suffix}.sock")).exists(),
            "{suffix} left behind"
        );
    }
    assert!(dir.join("kubelet.sock").exists());
}
