//! Node-level checks: is this node able to do true GDS for a backend at all?
//!
//! `nvfs` reads what nvidia-fs exposes and `nvfs_checks` judges it; `p2pdma` covers NVMe's
//! route without nvidia_fs; `cufile` the config keys; `platform` the IOMMU and RDMA devices.

mod cufile;
mod nvfs;
mod nvfs_checks;
mod p2pdma;
mod platform;

pub(crate) use cufile::{load_cufile, CufileState};
pub(crate) use nvfs::registered_drivers;
pub(crate) use p2pdma::{p2pdma_route, stacked_p2pdma_kernel, StackedKernel};

use crate::{Backend, Check, HostPaths, Status};
use std::fs;
use std::path::Path;

pub fn node_checks(paths: &HostPaths, backend: Backend) -> Vec<Check> {
    let cfg = load_cufile(paths);
    let p2p = (backend == Backend::Nvme).then(|| p2pdma::p2pdma_state(paths, &cfg));
    let devs = nvfs::nvfs_device_nodes(paths);
    let state = nvfs_checks::NvfsState {
        paths,
        backend,
        loaded: paths.sys("module/nvidia_fs").is_dir(),
        p2p_ready: p2p.as_ref().is_some_and(|p| p.ready),
        devs: &devs,
    };
    let mut out = vec![
        nvfs_checks::module_check(&state),
        nvfs_checks::devices_check(&state),
        nvfs_checks::storage_driver_check(&state),
    ];
    // The P2PDMA alternative (NVMe only).
    if let Some(p) = p2p {
        let nvfs_ok = out
            .iter()
            .any(|c| c.id == "nvidia_fs.storage_driver" && c.status == Status::Pass);
        out.push(p2pdma::p2pdma_check(p, nvfs_ok));
    }
    out.extend(cufile::cufile_checks(&cfg, backend));
    out.push(platform::iommu_check(paths));
    if backend == Backend::NfsRdma {
        out.push(platform::rdma_check(paths, &cfg));
    }
    out
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn list_dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
