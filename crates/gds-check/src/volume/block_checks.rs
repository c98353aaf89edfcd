//! Checks on the block device stack: supported layers, the NVMe transport, P2PDMA's limits,
//! and the udev entry cuFile identifies the device by.

use super::stack::{describe, Layer};
use crate::node::{p2pdma_route, registered_drivers};
use crate::parse::parse_udev_db;
use crate::{Backend, Check, HostPaths};
use std::fs;

pub(super) fn block_checks(paths: &HostPaths, backend: Backend, layers: &[Layer]) -> Vec<Check> {
    let stack = describe(layers);
    let mut out = vec![
        stack_check(layers, &stack),
        transport_check(paths, layers, &stack),
    ];
    if backend == Backend::Nvme && p2pdma_route(paths) {
        out.push(super::p2pdma::p2pdma_check(paths, layers, &stack));
    }
    out
}

fn stack_check(layers: &[Layer], stack: &str) -> Check {
    let dm = layers.iter().any(|l| matches!(l, Layer::Dm(_)));
    // md RAID0 only. NVIDIA documents RAID0 over NVMe as the nvidia-fs route (gds-diag
    // checks/fs_matrix.py `raid0`: "RAID0 over supported NVMe devices. The nvidia-fs/nvfs
    // direct path is supported."; GDS troubleshooting guide, "Adding udev Rules for RAID
    // Volumes"); libcufile 1.20 also names raid1/raid10, but only as P2PDMA config keys
    // (`block.raid1.use_pci_p2pdma`, `strings`), undocumented. The level is the kernel's
    // `md/level` (drivers/md/md.c `level_show`: the personality name, `raid0`).
    let bad_md = layers.iter().find_map(|l| match l {
        Layer::Md(md) if md.level.is_empty() => Some((
            format!("{}: md/level unreadable", md.name),
            format!(
                "md level of {} unknown: GDS supports md RAID0 only",
                md.name
            ),
        )),
        Layer::Md(md) if md.level != "raid0" => Some((
            format!("{} is {} (md/level)", md.name, md.level),
            format!("{} is md {}: GDS supports md RAID0 only", md.name, md.level),
        )),
        _ => None,
    });
    if dm {
        Check::fail(
            "volume.block_stack",
            "device-mapper in the block stack: not supported by GDS",
            format!("{stack}: device-mapper (LVM, dm-crypt, multipath) is not supported by GDS"),
            "put the filesystem directly on the NVMe namespace (or md RAID0 over namespaces)",
        )
    } else if let Some((md, summary)) = bad_md {
        Check::fail(
            "volume.block_stack",
            summary,
            format!("{stack}: {md}; GDS supports md RAID0 (level 0) only"),
            "put the volume on md RAID0 over NVMe (the stripe layout) or on a single NVMe \
             namespace or partition; other md levels get no GDS path",
        )
    } else {
        Check::pass(
            "volume.block_stack",
            "block device stack supported",
            stack.to_string(),
        )
    }
}

fn transport_check(paths: &HostPaths, layers: &[Layer], stack: &str) -> Check {
    let nvme: Vec<(&str, Option<&str>)> = layers
        .iter()
        .filter_map(|l| match l {
            Layer::Nvme {
                name, transport, ..
            } => Some((name.as_str(), transport.as_deref())),
            _ => None,
        })
        .collect();
    let others: Vec<&str> = layers
        .iter()
        .filter_map(|l| match l {
            Layer::Other(n) => Some(n.as_str()),
            _ => None,
        })
        .collect();
    if nvme.is_empty() {
        return not_nvme_check(&others);
    }
    let (mut problems, fail) = transport_problems(paths, &nvme);
    if !others.is_empty() {
        problems.push(format!("non-NVMe members: {}", others.join(" ")));
    }
    let ev = if problems.is_empty() {
        stack.to_string()
    } else {
        format!("{stack}: {}", problems.join("; "))
    };
    if fail {
        Check::fail(
            "volume.nvme_transport",
            "NVMe-oF over RDMA without nvme_rdma registered with nvidia_fs: no GDS path",
            ev,
            "load nvme_rdma after nvidia_fs (GDS-enabled MOFED driver)",
        )
    } else if problems.is_empty() {
        Check::pass("volume.nvme_transport", "NVMe transport supports GDS", ev)
    } else {
        Check::warn(
            "volume.nvme_transport",
            format!("no GDS path for part of the stack: {}", problems.join("; ")),
            ev,
            "use NVMe over PCIe or NVMe-oF over RDMA for true GDS",
        )
    }
}

/// No NVMe namespace in the stack: compat mode, with what each device is instead.
fn not_nvme_check(others: &[&str]) -> Check {
    let kind = |n: &str| {
        if n.starts_with("loop") {
            "loop device"
        } else if n.starts_with("sd") {
            "SCSI/SATA disk"
        } else if n.starts_with("vd") {
            "virtio disk"
        } else {
            "non-NVMe device"
        }
    };
    let what = others
        .iter()
        .map(|n| format!("{n} is not an NVMe namespace ({})", kind(n)))
        .collect::<Vec<_>>()
        .join("; ");
    let devices = others
        .iter()
        .map(|n| format!("/dev/{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let summary = match others.len() {
        0 => "no NVMe namespace under the volume: no GDS path".to_string(),
        1 => format!("{devices} is not an NVMe namespace: no GDS path"),
        _ => format!("{devices} are not NVMe namespaces: no GDS path"),
    };
    Check::warn(
        "volume.nvme_transport",
        summary,
        format!("{what}; cuFile uses compat mode for it"),
        "back the volume with an NVMe namespace for true GDS",
    )
}

/// What is wrong with each namespace's transport, and whether any of it is a failure.
fn transport_problems(paths: &HostPaths, nvme: &[(&str, Option<&str>)]) -> (Vec<String>, bool) {
    // Read as a cuFile process sees it: the idle listing never shows nvme_rdma.
    let modules = registered_drivers(paths);
    let mut problems = Vec::new();
    let mut fail = false;
    for (n, t) in nvme {
        match *t {
            Some("pcie") => {}
            Some("rdma") => {
                if let Some(m) = &modules {
                    if !m.iter().any(|m| m.name == "nvme_rdma") {
                        fail = true;
                        problems.push(format!(
                            "{n} is NVMe-oF/RDMA but nvme_rdma is not registered with nvidia_fs"
                        ));
                    }
                }
            }
            Some(other) => problems.push(format!("{n}: transport {other} has no GDS DMA path")),
            None => problems.push(format!("{n}: transport unknown")),
        }
    }
    (problems, fail)
}

pub(super) fn udev_check(paths: &HostPaths, majmin: &str) -> Check {
    let id = "volume.udev";
    let p = paths.udev_data_dir.join(format!("b{majmin}"));
    let remedy = "run udevd on the node (or `udevadm trigger --action=change` for the device) and \
                  give workload pods /run/udev read-only (CDI device nvidia.com/gds=all does)";
    match fs::read_to_string(&p) {
        Err(e) => Check::fail(
            id,
            "no udev database entry for the block device: cuFile cannot register it",
            format!(
                "{}: {e}; without it cuFileHandleRegister fails with 5027 \
                 HANDLE_NOT_REGISTERED, even in compat mode",
                p.display()
            ),
            remedy,
        ),
        Ok(t) => {
            let props = parse_udev_db(&t);
            match props.get("ID_FS_USAGE").map(String::as_str) {
                Some("filesystem") => Check::pass(
                    id,
                    "udev database identifies the block device",
                    format!(
                        "{}: ID_FS_USAGE=filesystem ID_FS_TYPE={}",
                        p.display(),
                        props.get("ID_FS_TYPE").map_or("?", |s| s.as_str())
                    ),
                ),
                other => Check::fail(
                    id,
                    "udev entry lacks ID_FS_USAGE=filesystem: cuFile cannot register the device",
                    format!(
                        "{}: ID_FS_USAGE is {}; cuFileHandleRegister fails with 5027",
                        p.display(),
                        other.unwrap_or("missing")
                    ),
                    remedy,
                ),
            }
        }
    }
}
