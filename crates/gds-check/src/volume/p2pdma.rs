//! Which volumes NVMe P2PDMA mode (no nvidia_fs) serves: a namespace over PCIe as it is; an md
//! RAID0 array or an nvme-multipath head only where the kernel may pass P2PDMA through it and
//! cufile.json asks for that route, and then the strict cuFile probe decides.

use super::stack::{Layer, MdArray};
use crate::node::{load_cufile, stacked_p2pdma_kernel, CufileState, StackedKernel};
use crate::{Check, HostPaths};

const ID: &str = "volume.p2pdma";
const KERNEL_FIX: &str = "run a kernel 7.1 or newer, which may pass P2PDMA through md RAID0 \
                          and nvme-multipath heads";
const RAID_KEY_FIX: &str =
    "set \"block\": { \"raid\": { \"use_pci_p2pdma\": true } } in cufile.json";
const RAID0_FIX: &str = "use md RAID0: other md levels get no GDS path";
const MEMBERS_FIX: &str = "build the array from NVMe namespaces over PCIe";
const TRANSPORT_FIX: &str = "put the filesystem on NVMe over PCIe";
const NVFS_FIX: &str = "or load nvidia_fs with a GDS-enabled nvme driver, the route NVIDIA \
                        documents for RAID0 and NVMe-oF";

/// What this node offers a stacked device on the P2PDMA route.
struct Node {
    kernel: StackedKernel,
    raid_key: bool,
}

/// How the route treats one layer of the stack.
enum Route {
    Direct,
    /// It may serve it; the strict cuFile probe decides.
    Probe(String),
    /// It cannot: what was found, and what would change it.
    No {
        found: String,
        fixes: Vec<&'static str>,
    },
}

/// NVIDIA's P2PDMA guide (1 Intro) and the GDS release notes (Known Limitations) still say
/// "RAID0 over NVMe and NVMEoF are not supported" and "not supported with RAID0 and multipath
/// NVMe"; NVIDIA's gds-diag since passes md RAID0 with `block.raid.use_pci_p2pdma` on a kernel
/// that carries md P2PDMA, pending "runtime confirmation" (MagnumIO gds-diag/checks/
/// fs_matrix.py, `raid0` `p2pdma_note`). So such a stack passes here only pending the probe:
/// the gate runs the probe with compat mode off (`ProbeArgs::new`: `strict: true`,
/// probe/args.rs; `write_strict_config`, probe/strict_config.rs) and requires true GDS of it.
pub(super) fn p2pdma_check(paths: &HostPaths, layers: &[Layer], stack: &str) -> Check {
    let node = Node {
        kernel: stacked_p2pdma_kernel(paths),
        raid_key: matches!(load_cufile(paths), CufileState::Ok(c) if c.raid_p2pdma_enabled()),
    };
    let (mut probe, mut found, mut fixes) = (Vec::new(), Vec::new(), Vec::new());
    for l in layers {
        match route(l, &node) {
            Route::Direct => {}
            Route::Probe(s) => probe.push(s),
            Route::No { found: f, fixes: x } => {
                if !found.contains(&f) {
                    found.push(f);
                }
                for x in x {
                    if !fixes.contains(&x) {
                        fixes.push(x);
                    }
                }
            }
        }
    }
    if !found.is_empty() {
        fixes.push(NVFS_FIX);
        return Check::fail(
            ID,
            format!(
                "volume not supported in NVMe P2PDMA mode: {}",
                found.join("; ")
            ),
            format!("{stack}: {}; this node has no nvidia_fs", found.join("; ")),
            fixes.join("; "),
        );
    }
    if probe.is_empty() {
        return Check::pass(
            ID,
            "volume supported in NVMe P2PDMA mode",
            format!("{stack}: NVMe over PCIe"),
        );
    }
    Check::pass(
        ID,
        "volume may take NVMe P2PDMA mode through md RAID0 or nvme-multipath: the strict cuFile \
         probe decides",
        format!(
            "{stack}: {}; only a cuFile read with compat mode off (the gate's probe) shows \
             whether the kernel passes P2PDMA through",
            probe.join("; ")
        ),
    )
}

fn route(l: &Layer, node: &Node) -> Route {
    match l {
        Layer::Md(md) => md_route(md, node),
        Layer::Nvme {
            name,
            transport,
            multipath,
        } => nvme_route(name, transport.as_deref(), *multipath, node),
        _ => Route::Direct,
    }
}

/// A namespace over PCIe is served; NVMe-oF is not; a multipath head needs a kernel that may
/// carry nvme-multipath P2PDMA. Its cufile.json key, `block.nvme.use_pci_p2pdma` or
/// `use_pci_p2pdma`, is what put the node on this route.
fn nvme_route(name: &str, transport: Option<&str>, multipath: bool, node: &Node) -> Route {
    if transport != Some("pcie") {
        return Route::No {
            found: format!(
                "{name} is NVMe over {}",
                transport.unwrap_or("an unknown transport")
            ),
            fixes: vec![TRANSPORT_FIX],
        };
    }
    if !multipath {
        return Route::Direct;
    }
    if node.kernel.may_support {
        Route::Probe(format!(
            "{name} is an nvme-multipath head over pcie and {} may carry multipath P2PDMA",
            node.kernel.describe()
        ))
    } else {
        Route::No {
            found: format!(
                "{name} is an nvme-multipath head and {}",
                node.kernel.predates("multipath")
            ),
            fixes: vec![KERNEL_FIX, "or set nvme_core multipath=N"],
        }
    }
}

/// md RAID0 whose members are all NVMe, on a kernel that may carry md P2PDMA, with
/// `block.raid.use_pci_p2pdma`. The members' transports are judged as their own layers.
fn md_route(md: &MdArray, node: &Node) -> Route {
    if md.level != "raid0" {
        let level = if md.level.is_empty() {
            "of unknown level"
        } else {
            &md.level
        };
        return Route::No {
            found: format!("{} is md {level}", md.name),
            fixes: vec![RAID0_FIX],
        };
    }
    let mut missing = Vec::new();
    let mut fixes = Vec::new();
    let not_nvme: Vec<&str> = md
        .members
        .iter()
        .filter(|m| !m.nvme)
        .map(|m| m.name.as_str())
        .collect();
    if !not_nvme.is_empty() {
        missing.push(format!("its members {} are not NVMe", not_nvme.join(", ")));
        fixes.push(MEMBERS_FIX);
    }
    if !node.kernel.may_support {
        missing.push(node.kernel.predates("md"));
        fixes.push(KERNEL_FIX);
    }
    if !node.raid_key {
        missing.push("cufile.json lacks block.raid.use_pci_p2pdma: true".to_string());
        fixes.push(RAID_KEY_FIX);
    }
    if missing.is_empty() {
        return Route::Probe(format!(
            "{} is md raid0 over NVMe, {} may carry md P2PDMA and \
             block.raid.use_pci_p2pdma is true",
            md.name,
            node.kernel.describe()
        ));
    }
    Route::No {
        found: format!("{} is md raid0 but {}", md.name, missing.join(" and ")),
        fixes,
    }
}
