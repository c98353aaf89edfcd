//! Platform checks outside nvidia_fs: the IOMMU, and the RDMA devices NFS over RDMA needs.

use super::cufile::CufileState;
use super::{list_dir_names, read_trim};
use crate::{Check, HostPaths};

pub(super) fn iommu_check(paths: &HostPaths) -> Check {
    let cmdline = read_trim(&paths.proc("cmdline")).unwrap_or_default();
    let args: Vec<&str> = cmdline.split_whitespace().collect();
    let units = list_dir_names(&paths.sys("class/iommu"));
    let pt = args.contains(&"iommu=pt")
        || args.contains(&"iommu.passthrough=1")
        || args.contains(&"intel_iommu=off")
        || args.contains(&"amd_iommu=off");
    if units.is_empty() {
        Check::pass("iommu", "no IOMMU", "no IOMMU units under /sys/class/iommu")
    } else if pt {
        Check::pass(
            "iommu",
            "IOMMU off or in passthrough",
            format!(
                "IOMMU units {}; kernel cmdline has passthrough/off",
                units.join(" ")
            ),
        )
    } else {
        Check::warn(
            "iommu",
            "IOMMU translating (no iommu=pt): GDS P2P DMA may fail or be slow",
            format!(
                "IOMMU active ({}) and no iommu=pt on the kernel command line",
                units.join(" ")
            ),
            "boot with iommu=pt (or disable the IOMMU): GDS P2P DMA through a translating \
             IOMMU fails or is slow",
        )
    }
}

pub(super) fn rdma_check(paths: &HostPaths, cfg: &CufileState) -> Check {
    let ib = paths.sys("class/infiniband");
    let devs = list_dir_names(&ib);
    if devs.is_empty() {
        return Check::fail(
            "rdma.devices",
            "no RDMA device: no NFS over RDMA",
            format!("no devices under {}", ib.display()),
            "install an RDMA NIC driver (MOFED / mlx5_ib) or, for tests, Soft-RoCE \
             (`rdma link add rxe0 type rxe netdev <if>`)",
        );
    }
    let mut ev = format!("{}: {}", ib.display(), devs.join(" "));
    if let CufileState::Ok(c) = cfg {
        if !c.nfs_rdma_dev_addr_list.is_empty() {
            ev += &format!(
                "; fs.nfs.rdma_dev_addr_list: {}",
                c.nfs_rdma_dev_addr_list.join(" ")
            );
        }
    }
    Check::pass("rdma.devices", "RDMA device present", ev)
}
