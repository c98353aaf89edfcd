//! NVMe P2PDMA mode, the route to true GDS on NVMe without nvidia_fs: what it needs, and the
//! check that says whether this node has it.

use super::cufile::{load_cufile, CufileState};
use super::nvfs::kallsyms;
use super::read_trim;
use crate::{Check, HostPaths};
use std::fs;

pub(super) struct P2p {
    pub(super) ready: bool,
    evidence: String,
    missing: Vec<&'static str>,
}

/// GPUs NVIDIA lists for P2PDMA (troubleshooting guide 14.2, "P2PDMA Supported GPUs").
const P2PDMA_GPUS: &[&str] = &[
    "A100", "A40", "L40S", "L4", "H100", "H200", "B100", "B200", "B300",
];

/// Evidence gathered so far, and each unmet requirement.
#[derive(Default)]
struct Findings {
    ev: Vec<String>,
    missing: Vec<&'static str>,
}

/// NVMe P2PDMA mode, as NVIDIA's troubleshooting guide section 14 ("NVMe P2PDMA
/// Troubleshooting") documents it, every item checked and each unmet one named:
/// 14.1 the kernel has PCI P2PDMA (`p2pdma_pgmap_ops` in /proc/kallsyms: "kernel newer than 6.2
/// on Ubuntu; for other distributions check the feature is compiled", so a backported kernel
/// counts and the version is evidence only); 14.2 a supported GPU; the open GPU kernel modules
/// 565 or newer ("GDS Support for NVMe Drives Using Linux PCI P2PDMA", 3.4); 14.3 the driver
/// registry `RMForceStaticBar1=1;RmForceDisableIomapWC=1` (x86 only) and
/// `nvme_core multipath=N` (not on a kernel that may carry nvme-multipath P2PDMA); and
/// `use_pci_p2pdma: true` in cufile.json.
pub(super) fn p2pdma_state(paths: &HostPaths, cfg: &CufileState) -> P2p {
    let mut f = Findings::default();
    kernel_item(paths, &mut f);
    gpu_item(paths, &mut f);
    driver_item(paths, &mut f);
    // 14.3 registry (x86 only).
    if cfg!(target_arch = "x86_64") {
        registry_item(paths, &mut f);
    }
    multipath_item(paths, &mut f);
    let enabled = matches!(cfg, CufileState::Ok(c) if c.p2pdma_enabled());
    f.ev.push(format!("use_pci_p2pdma in cufile.json: {enabled}"));
    if !enabled {
        f.missing.push("\"use_pci_p2pdma\": true in cufile.json");
    }
    P2p {
        ready: f.missing.is_empty(),
        evidence: f.ev.join("; "),
        missing: f.missing,
    }
}

/// 14.1: the kernel has PCI P2PDMA.
fn kernel_item(paths: &HostPaths, f: &mut Findings) {
    if let Some(rel) = read_trim(&paths.proc("sys/kernel/osrelease")) {
        f.ev.push(format!("kernel {rel}"));
    }
    let has_sym = kallsyms(paths, &["p2pdma_pgmap_ops"]).is_some_and(|s| !s.is_empty());
    f.ev.push(format!("p2pdma_pgmap_ops in kallsyms: {has_sym}"));
    if !has_sym {
        f.missing
            .push("p2pdma_pgmap_ops in /proc/kallsyms (a kernel built with CONFIG_PCI_P2PDMA)");
    }
}

/// 14.3 `nvme_core multipath=N`: "NVMe Multipathing is currently not enabled with PCI P2PDMA in
/// the upstream driver". A kernel that may carry nvme-multipath P2PDMA needs it no longer: there
/// a multipath head is judged per volume (`volume.p2pdma`) and the strict cuFile probe decides.
fn multipath_item(paths: &HostPaths, f: &mut Findings) {
    let mp = read_trim(&paths.sys("module/nvme_core/parameters/multipath"));
    f.ev.push(format!(
        "nvme_core multipath={}",
        mp.as_deref().unwrap_or("?")
    ));
    if mp.as_deref() == Some("N") {
        return;
    }
    let k = stacked_p2pdma_kernel(paths);
    if k.may_support {
        f.ev.push(format!(
            "{} may carry P2PDMA on nvme-multipath heads; the cuFile probe decides",
            k.describe()
        ));
    } else {
        f.missing.push(
            "nvme_core multipath=N (or a kernel 7.1 or newer, whose nvme-multipath heads may \
             carry P2PDMA)",
        );
    }
}

/// 14.2: the GPU models the guide lists.
fn gpu_item(paths: &HostPaths, f: &mut Findings) {
    let models: Vec<String> = fs::read_dir(paths.proc("driver/nvidia/gpus"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| fs::read_to_string(e.path().join("information")).ok())
                .filter_map(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("Model:"))
                        .map(|m| m.trim().to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let gpu_ok = !models.is_empty()
        && models.iter().all(|m| {
            m.split_whitespace()
                .any(|w| P2PDMA_GPUS.iter().any(|g| w.eq_ignore_ascii_case(g)))
        });
    f.ev.push(format!("GPUs [{}]", models.join(", ")));
    if !gpu_ok {
        f.missing
            .push("a P2PDMA-capable GPU (A100, A40, L4, L40S, H100, H200, B100, B200, B300)");
    }
}

/// Open kernel modules >= 565: /proc/driver/nvidia/version says "Open Kernel Module".
fn driver_item(paths: &HostPaths, f: &mut Findings) {
    let nv = read_trim(&paths.proc("driver/nvidia/version")).unwrap_or_default();
    let open = nv.contains("Open Kernel Module");
    let branch = nv.split_whitespace().find_map(|w| {
        w.split('.')
            .next()?
            .parse::<u32>()
            .ok()
            .filter(|_| w.contains('.'))
    });
    f.ev.push(format!(
        "NVIDIA driver: {}",
        nv.lines().next().unwrap_or("unreadable")
    ));
    if !(open && branch.is_some_and(|b| b >= 565)) {
        f.missing
            .push("the open GPU kernel modules, driver 565 or newer");
    }
}

/// 14.3: the nvidia module's registry keys.
fn registry_item(paths: &HostPaths, f: &mut Findings) {
    let params = fs::read_to_string(paths.proc("driver/nvidia/params")).unwrap_or_default();
    let dwords = params
        .lines()
        .find_map(|l| l.strip_prefix("RegistryDwords:"))
        .unwrap_or("")
        .to_ascii_lowercase();
    let reg_ok = ["rmforcestaticbar1=1", "rmforcedisableiomapwc=1"]
        .iter()
        .all(|k| dwords.contains(k));
    f.ev.push(format!("RegistryDwords {}", dwords.trim()));
    if !reg_ok {
        f.missing.push(
            "NVreg_RegistryDwords=\"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\" for the nvidia module",
        );
    }
}

/// The first release that may pass P2PDMA through md RAID0/1/10 and nvme-multipath heads. The
/// upstream commits "md: propagate BLK_FEAT_PCI_P2PDMA from member devices to RAID device"
/// (02666132403a) and "nvme-multipath: enable PCI P2PDMA for multipath devices" (fb0eeeed91f3)
/// were applied to axboe/linux `for-7.2/block` on 2026-05-26, so mainline carries them from
/// 7.2; NVIDIA's gds-diag passes md RAID0 P2PDMA from 7.1 (MagnumIO
/// gds-diag/checks/gds_report.py:51-52, `_raid0_p2pdma_supported_by_arch_or_kernel`). The lower
/// bound is taken: above it the strict probe decides; below it, only a backport could help, and
/// that is refused here.
pub(crate) const STACKED_P2PDMA_SINCE: (u32, u32) = (7, 1);

/// Whether the running kernel may pass P2PDMA through a stacked device. The commits expose no
/// attribute or symbol: they set `BLK_FEAT_PCI_P2PDMA` in the queue limits of raid0/1/10 and of
/// `nvme_mpath_alloc_disk()`, which `blk_stack_limits()` clears when a member or path lacks it.
/// Without it `__bio_iov_iter_get_pages()` (block/bio.c) does not ask `ITER_ALLOW_P2PDMA`, GPU
/// pages cannot be pinned for the device, and a cuFile read with compat mode off fails: that
/// strict probe, which the gate runs after these checks, is what decides. The release is only
/// what can be read before it.
pub(crate) struct StackedKernel {
    pub(crate) release: Option<String>,
    pub(crate) may_support: bool,
}

impl StackedKernel {
    pub(crate) fn describe(&self) -> String {
        match &self.release {
            Some(r) => format!("kernel {r}"),
            None => "kernel release unreadable".to_string(),
        }
    }

    /// Why `what` (md, multipath) P2PDMA is not assumed here.
    pub(crate) fn predates(&self, what: &str) -> String {
        match &self.release {
            Some(r) => format!("kernel {r} predates {what} P2PDMA (7.1)"),
            None => {
                format!("the kernel release is unreadable, so {what} P2PDMA (7.1) is not assumed")
            }
        }
    }
}

pub(crate) fn stacked_p2pdma_kernel(paths: &HostPaths) -> StackedKernel {
    let release = read_trim(&paths.proc("sys/kernel/osrelease"));
    let may_support = release
        .as_deref()
        .and_then(major_minor)
        .is_some_and(|v| v >= STACKED_P2PDMA_SINCE);
    StackedKernel {
        release,
        may_support,
    }
}

/// `7.2.0-rc1-generic` -> (7, 2).
fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split('.');
    let mut num = || -> Option<u32> {
        let p = parts.next()?;
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some((num()?, num()?))
}

/// NVMe would take the P2PDMA route on this node: no nvidia_fs, `use_pci_p2pdma` set.
pub(crate) fn p2pdma_route(paths: &HostPaths) -> bool {
    !paths.sys("module/nvidia_fs").is_dir()
        && matches!(load_cufile(paths), CufileState::Ok(c) if c.p2pdma_enabled())
}

/// The P2PDMA alternative as a check; `nvfs_ok`: the nvidia_fs path is ready instead.
pub(super) fn p2pdma_check(p: P2p, nvfs_ok: bool) -> Check {
    if p.ready {
        Check::pass(
            "nvme.p2pdma",
            "NVMe P2PDMA mode ready (no nvidia_fs needed)",
            p.evidence,
        )
    } else if nvfs_ok {
        Check::na(
            "nvme.p2pdma",
            "NVMe P2PDMA mode not used: the nvidia_fs path is ready",
            format!("not used (nvidia_fs path is ready); {}", p.evidence),
        )
    } else {
        Check::fail(
            "nvme.p2pdma",
            "NVMe P2PDMA mode not set up, and no nvidia_fs path either",
            format!("{}; missing: {}", p.evidence, p.missing.join(", ")),
            format!(
                "either fix nvidia_fs (above) or provide what P2PDMA mode needs (GDS \
                 troubleshooting guide, NVMe P2PDMA): {}",
                p.missing.join("; ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::major_minor;

    #[test]
    fn kernel_release_major_minor() {
        for (rel, want) in [
            ("7.1.0", Some((7, 1))),
            ("7.2.0-rc1-generic", Some((7, 2))),
            ("7.10", Some((7, 10))),
            ("6.8.0-45-generic", Some((6, 8))),
            ("5.14.0-427.13.1.el9_4.x86_64", Some((5, 14))),
            ("7", None),
            ("", None),
            ("x.y", None),
        ] {
            assert_eq!(major_minor(rel), want, "{rel}");
        }
        assert!(Some((7, 10)) > Some((7, 1)) && (6, 99) < (7, 1));
    }
}
