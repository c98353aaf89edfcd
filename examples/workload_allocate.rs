//! Prints, as JSON, what the driver's device plugin answers Allocate for one resource on
//! this machine (the functions its Allocate calls: the resource's cufile.json written from
//! the node's, the node's nvidia-fs nodes, the container's mounts, devices and variables),
//! for a script that plays the kubelet and the container runtime where there are none
//! (`scripts/gpu-workload-read.sh` on a GPU machine).
//!
//! ```text
//! workload_allocate gds|gds-compat NODE_CUFILE_JSON OUT_DIR [HOST_DEV=/dev] [UDEV_DATA=/run/udev/data]
//! ```
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::Duration;

use gds_csi::gds::workload::allocate::{container_response, nvfs_devices, Pieces};
use gds_csi::gds::workload::{Config, Resource, Shared};
use gds_csi::runtime::config::DEFAULT_DRIVER_NAME;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let resource = match args.first().map(String::as_str) {
        Some("gds") => Resource::Gds,
        Some("gds-compat") => Resource::GdsCompat,
        _ => usage(),
    };
    let (Some(node_json), Some(out_dir)) = (args.get(1), args.get(2)) else {
        usage()
    };
    let host_dev = PathBuf::from(args.get(3).map_or("/dev", String::as_str));
    let udev = PathBuf::from(args.get(4).map_or("/run/udev/data", String::as_str));
    let shared = Shared::new(
        Config {
            driver_name: DEFAULT_DRIVER_NAME.into(),
            plugin_dir: PathBuf::from("/nonexistent"),
            host_dev: host_dev.clone(),
            udev_data_dir: udev.clone(),
            cufile_json: node_json.into(),
            out_dir: out_dir.into(),
            shares: 1,
            interval: Duration::from_secs(1),
            kubelet_timeout: Duration::from_secs(1),
        },
        // Allocate's answer only: health is not asked for here.
        None,
    );
    let cufile_json = shared.prepare(resource).unwrap_or_else(|e| fail(&e));
    let devices = nvfs_devices(&host_dev).unwrap_or_else(|e| fail(&e.to_string()));
    let r = container_response(&Pieces {
        nvfs_devices: &devices,
        udev_data_dir: &udev,
        cufile_json: &cufile_json,
    });
    let answer = serde_json::json!({
        "resource": resource.name(DEFAULT_DRIVER_NAME),
        "envs": r.envs,
        "mounts": r.mounts.iter().map(|m| serde_json::json!({
            "container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "devices": r.devices.iter().map(|d| serde_json::json!({
            "container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions,
        })).collect::<Vec<_>>(),
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&answer).unwrap_or_default()
    );
}

fn usage() -> ! {
    fail("usage: workload_allocate gds|gds-compat NODE_CUFILE_JSON OUT_DIR [HOST_DEV] [UDEV_DATA]")
}

fn fail(e: &str) -> ! {
    eprintln!("workload_allocate: {e}");
    std::process::exit(2)
}
