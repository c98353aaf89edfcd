//! Node-level checks: is this node able to do true GDS for a backend at all?

use crate::parse::{self, CufileConfig, NvfsModule};
use crate::{Backend, Check, HostPaths, Status};
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::BufReader;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// What reading cufile.json gave. Shared with the volume checks.
#[derive(Debug, Clone)]
pub(crate) enum CufileState {
    Missing(String),
    Invalid(String),
    Ok(Box<CufileConfig>),
}

pub(crate) fn load_cufile(paths: &HostPaths) -> CufileState {
    let p = &paths.cufile_json;
    match fs::read_to_string(p) {
        Err(e) => CufileState::Missing(format!("{}: {e}", p.display())),
        Ok(t) => match parse::parse_cufile_json(&t) {
            Ok(c) => CufileState::Ok(Box::new(c)),
            Err(e) => CufileState::Invalid(format!("{}: {e}", p.display())),
        },
    }
}

/// Names nvidia_fs must list in `modules` for the backend to get true GDS.
pub(crate) fn required_drivers(backend: Backend) -> &'static [&'static str] {
    match backend {
        // The pool's volumes are NVMe over PCIe: only the `nvme` entry registers their DMA
        // hooks; `nvme_rdma` (src/nvfs-dma.c:87-97) serves NVMe-oF namespaces only.
        Backend::Nvme => &["nvme"],
        Backend::NfsRdma => &["rpcrdma"],
    }
}

fn registration_symbols(backend: Backend) -> &'static [&'static str] {
    match backend {
        Backend::Nvme => &[
            "nvme_v1_register_nvfs_dma_ops",
            "nvme_v2_register_nvfs_dma_ops",
        ],
        Backend::NfsRdma => &["rpcrdma_register_nvfs_dma_ops"],
    }
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The modules nvidia_fs lists, or why they could not be read.
pub(crate) fn read_modules(paths: &HostPaths) -> Result<Vec<NvfsModule>, String> {
    let p = paths.proc("driver/nvidia-fs/modules");
    let t = fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    parse::parse_modules(&t).map_err(|e| format!("{}: {e}", p.display()))
}

/// The listing as a cuFile process sees it: read while holding `dev` open. nvidia-fs registers
/// the storage drivers' DMA hooks only in `nvfs_open` (gds-nvidia-fs 2.28.4 src/nvfs-core.c:1072
/// -> nvfs_blk_register_dma_ops, src/nvfs-dma.c:1430 -> probe_module_list, src/nvfs-mod.c:40)
/// and unregisters them at the last close (src/nvfs-core.c:1093-1101); the proc file prints only
/// entries marked found (src/nvfs-proc.c:47-52) and `wekafsio: 1` is a static, always-found
/// entry (src/nvfs-dma.c:146-157). So the idle listing proves nothing: an idle, correctly
/// configured node shows `wekafsio: 1` only.
pub(crate) fn read_modules_held(paths: &HostPaths, dev: &Path) -> Result<Vec<NvfsModule>, String> {
    // O_RDONLY is enough: nvfs_open ignores the flags; the node is mode 0666.
    let held = fs::File::open(dev).map_err(|e| {
        format!(
            "cannot open {} to make nvidia-fs register the storage drivers: {e}",
            dev.display()
        )
    })?;
    let r = read_modules(paths);
    drop(held);
    r
}

type SymbolCache = HashMap<(std::path::PathBuf, Vec<String>), (String, BTreeSet<String>)>;

/// Which of `wanted` the kernel exports. Scanning kallsyms (tens of MiB) on every publish
/// would dominate the gate's latency; the answer only changes when a module is loaded or
/// unloaded, so it is kept until `/proc/modules` (a few KiB) reads differently.
fn kallsyms(paths: &HostPaths, wanted: &[&str]) -> Option<BTreeSet<String>> {
    static CACHE: OnceLock<Mutex<SymbolCache>> = OnceLock::new();
    let modules = fs::read_to_string(paths.proc("modules")).unwrap_or_default();
    let key = (
        paths.proc("kallsyms"),
        wanted.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
    );
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some((seen, found)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        if *seen == modules {
            return Some(found.clone());
        }
    }
    let f = fs::File::open(&key.0).ok()?;
    let found = parse::kallsyms_find(BufReader::new(f), wanted).ok()?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (modules, found.clone()));
    Some(found)
}

struct P2p {
    ready: bool,
    evidence: String,
    missing: Vec<&'static str>,
}

/// GPUs NVIDIA lists for P2PDMA (troubleshooting guide 14.2, "P2PDMA Supported GPUs").
const P2PDMA_GPUS: &[&str] = &[
    "A100", "A40", "L40S", "L4", "H100", "H200", "B100", "B200", "B300",
];

/// NVMe P2PDMA mode, as NVIDIA's troubleshooting guide section 14 ("NVMe P2PDMA
/// Troubleshooting") documents it, every item checked and each unmet one named:
/// 14.1 the kernel has PCI P2PDMA (`p2pdma_pgmap_ops` in /proc/kallsyms: "kernel newer than 6.2
/// on Ubuntu; for other distributions check the feature is compiled", so a backported kernel
/// counts and the version is evidence only); 14.2 a supported GPU; the open GPU kernel modules
/// 565 or newer ("GDS Support for NVMe Drives Using Linux PCI P2PDMA", 3.4); 14.3 the driver
/// registry `RMForceStaticBar1=1;RmForceDisableIomapWC=1` (x86 only) and
/// `nvme_core multipath=N`; and `use_pci_p2pdma: true` in cufile.json.
fn p2pdma_state(paths: &HostPaths, cfg: &CufileState) -> P2p {
    let mut missing = Vec::new();
    let mut ev = Vec::new();
    if let Some(rel) = read_trim(&paths.proc("sys/kernel/osrelease")) {
        ev.push(format!("kernel {rel}"));
    }
    let has_sym = kallsyms(paths, &["p2pdma_pgmap_ops"]).is_some_and(|s| !s.is_empty());
    ev.push(format!("p2pdma_pgmap_ops in kallsyms: {has_sym}"));
    if !has_sym {
        missing.push("p2pdma_pgmap_ops in /proc/kallsyms (a kernel built with CONFIG_PCI_P2PDMA)");
    }
    // 14.2: the GPU models the guide lists.
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
    ev.push(format!("GPUs [{}]", models.join(", ")));
    if !gpu_ok {
        missing.push("a P2PDMA-capable GPU (A100, A40, L4, L40S, H100, H200, B100, B200, B300)");
    }
    // Open kernel modules >= 565: /proc/driver/nvidia/version says "Open Kernel Module".
    let nv = read_trim(&paths.proc("driver/nvidia/version")).unwrap_or_default();
    let open = nv.contains("Open Kernel Module");
    let branch = nv.split_whitespace().find_map(|w| {
        w.split('.')
            .next()?
            .parse::<u32>()
            .ok()
            .filter(|_| w.contains('.'))
    });
    ev.push(format!(
        "NVIDIA driver: {}",
        nv.lines().next().unwrap_or("unreadable")
    ));
    if !(open && branch.is_some_and(|b| b >= 565)) {
        missing.push("the open GPU kernel modules, driver 565 or newer");
    }
    // 14.3 registry (x86 only).
    if cfg!(target_arch = "x86_64") {
        let params = fs::read_to_string(paths.proc("driver/nvidia/params")).unwrap_or_default();
        let dwords = params
            .lines()
            .find_map(|l| l.strip_prefix("RegistryDwords:"))
            .unwrap_or("")
            .to_ascii_lowercase();
        let reg_ok = ["rmforcestaticbar1=1", "rmforcedisableiomapwc=1"]
            .iter()
            .all(|k| dwords.contains(k));
        ev.push(format!("RegistryDwords {}", dwords.trim()));
        if !reg_ok {
            missing.push(
                "NVreg_RegistryDwords=\"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\" for the nvidia module",
            );
        }
    }
    let mp = read_trim(&paths.sys("module/nvme_core/parameters/multipath"));
    ev.push(format!(
        "nvme_core multipath={}",
        mp.as_deref().unwrap_or("?")
    ));
    if mp.as_deref() != Some("N") {
        missing.push("nvme_core multipath=N");
    }
    let enabled = matches!(cfg, CufileState::Ok(c) if c.p2pdma_enabled());
    ev.push(format!("use_pci_p2pdma in cufile.json: {enabled}"));
    if !enabled {
        missing.push("\"use_pci_p2pdma\": true in cufile.json");
    }
    P2p {
        ready: missing.is_empty(),
        evidence: ev.join("; "),
        missing,
    }
}

/// The storage drivers registered with nvidia-fs as a cuFile process sees them (a device node
/// held open, see [`read_modules_held`]); None when nvidia-fs or its nodes are not there.
pub(crate) fn registered_drivers(paths: &HostPaths) -> Option<Vec<NvfsModule>> {
    let dev = nvfs_device_nodes(paths).into_iter().next()?;
    read_modules_held(paths, &paths.dev_root.join(dev)).ok()
}

/// `nvidia-fs<N>` names under the dev root.
fn nvfs_device_nodes(paths: &HostPaths) -> Vec<String> {
    list_dir_names(&paths.dev_root)
        .into_iter()
        .filter(|n| {
            n.strip_prefix("nvidia-fs")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

/// NVMe would take the P2PDMA route on this node: no nvidia_fs, `use_pci_p2pdma` set.
pub(crate) fn p2pdma_route(paths: &HostPaths) -> bool {
    !paths.sys("module/nvidia_fs").is_dir()
        && matches!(load_cufile(paths), CufileState::Ok(c) if c.p2pdma_enabled())
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

pub fn node_checks(paths: &HostPaths, backend: Backend) -> Vec<Check> {
    let mut out = Vec::new();
    let cfg = load_cufile(paths);

    // --- nvidia_fs module -------------------------------------------------------------------
    let module_dir = paths.sys("module/nvidia_fs");
    let loaded = module_dir.is_dir();
    let p2p = (backend == Backend::Nvme).then(|| p2pdma_state(paths, &cfg));
    let p2p_ready = p2p.as_ref().is_some_and(|p| p.ready);
    const LOAD_REMEDY: &str = "load nvidia_fs (GPU Operator: ClusterPolicy spec.gds.enabled=true, \
        needs the open GPU kernel modules; or `modprobe nvidia_fs`), then reload the storage driver";

    if loaded {
        let sysv = read_trim(&module_dir.join("version")).unwrap_or_default();
        let procv = fs::read_to_string(paths.proc("driver/nvidia-fs/version"))
            .ok()
            .map(|t| match parse::parse_nvfs_version(&t) {
                Ok(v) => v.raw,
                Err(e) => format!("unparsable ({e})"),
            });
        let mut ev = format!("{} present", module_dir.display());
        if !sysv.is_empty() {
            ev += &format!(", module version {sysv}");
        }
        match procv {
            Some(v) => ev += &format!(", /proc/driver/nvidia-fs/version {v}"),
            None => ev += ", /proc/driver/nvidia-fs/version unreadable",
        }
        out.push(Check::pass(
            "nvidia_fs.module",
            "nvidia_fs kernel module loaded",
            ev,
        ));
    } else if p2p_ready {
        out.push(Check::na(
            "nvidia_fs.module",
            "nvidia_fs kernel module loaded",
            format!(
                "{} absent; not needed: NVMe uses P2PDMA mode",
                module_dir.display()
            ),
        ));
    } else {
        out.push(Check::fail(
            "nvidia_fs.module",
            "nvidia_fs kernel module loaded",
            format!("{} absent", module_dir.display()),
            LOAD_REMEDY,
        ));
    }

    // --- device nodes -----------------------------------------------------------------------
    let devs = nvfs_device_nodes(paths);
    let title = "nvidia-fs device nodes present";
    if !devs.is_empty() {
        out.push(Check::pass(
            "nvidia_fs.devices",
            title,
            format!("{} in {}", devs.join(" "), paths.dev_root.display()),
        ));
    } else if !loaded && p2p_ready {
        out.push(Check::na(
            "nvidia_fs.devices",
            title,
            "not needed in P2PDMA mode",
        ));
    } else {
        out.push(Check::fail(
            "nvidia_fs.devices",
            title,
            format!("no nvidia-fs<N> under {}", paths.dev_root.display()),
            if loaded {
                "nvidia_fs is loaded but its device nodes are not visible: give the container \
                 /dev/nvidia-fs* (CDI device nvidia.com/gds=all) or create them on the host"
            } else {
                LOAD_REMEDY
            },
        ));
    }

    // --- storage driver registered with nvidia_fs --------------------------------------------
    let wanted = required_drivers(backend);
    let title = format!("{} registered with nvidia_fs", wanted.join(" or "));
    let held_dev = devs.first().map(|d| paths.dev_root.join(d));
    if loaded {
        let listing = match &held_dev {
            Some(d) => read_modules_held(paths, d),
            None => Err(format!(
                "no nvidia-fs<N> under {} to hold open while reading the listing",
                paths.dev_root.display()
            )),
        };
        match listing {
            Ok(mods) => {
                let names: Vec<&str> = mods.iter().map(|m| m.name.as_str()).collect();
                let listed = if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                };
                let syms = kallsyms(paths, registration_symbols(backend))
                    .map(|s| {
                        format!(
                            "; registration symbols in kallsyms: {}",
                            if s.is_empty() {
                                "none".to_string()
                            } else {
                                s.into_iter().collect::<Vec<_>>().join(", ")
                            }
                        )
                    })
                    .unwrap_or_default();
                let ev = format!(
                    "with {} held open, /proc/driver/nvidia-fs/modules lists: {listed}{syms}",
                    held_dev
                        .as_deref()
                        .map_or("?".into(), |d| d.display().to_string())
                );
                if names.iter().any(|n| wanted.contains(n)) {
                    out.push(Check::pass("nvidia_fs.storage_driver", title, ev));
                } else {
                    let remedy = match backend {
                        Backend::Nvme => {
                            "load an nvme driver built with nvidia_fs support after nvidia_fs \
                             (e.g. `modprobe -r nvme && modprobe nvme` once nvidia_fs is loaded; \
                             MOFED or the GPU Operator's GDS-enabled driver), or use P2PDMA mode"
                        }
                        Backend::NfsRdma => {
                            "load an rpcrdma built with nvidia_fs support (MOFED with \
                             --with-nfsrdma --enable-gds) after nvidia_fs, then remount"
                        }
                    };
                    // With P2PDMA the NVMe path does not need the registration.
                    let c = if p2p_ready {
                        Check::warn(
                            "nvidia_fs.storage_driver",
                            title,
                            format!("{ev}; P2PDMA mode covers NVMe"),
                            remedy,
                        )
                    } else {
                        Check::fail(
                            "nvidia_fs.storage_driver",
                            title,
                            format!(
                                "{ev}: cuFile silently falls back to compat mode for this backend"
                            ),
                            remedy,
                        )
                    };
                    out.push(c);
                }
            }
            Err(e) => out.push(Check::fail(
                "nvidia_fs.storage_driver",
                title,
                format!("nvidia_fs loaded but the registered drivers cannot be read: {e}"),
                "give the container /dev/nvidia-fs* (CDI device nvidia.com/gds=all) and the \
                 host's /proc/driver/nvidia-fs; check that the module is healthy (dmesg)",
            )),
        }
    } else if p2p_ready {
        out.push(Check::na(
            "nvidia_fs.storage_driver",
            title,
            "nvidia_fs not loaded; NVMe uses P2PDMA mode",
        ));
    } else {
        out.push(Check::fail(
            "nvidia_fs.storage_driver",
            title,
            "nvidia_fs not loaded",
            LOAD_REMEDY,
        ));
    }

    // --- P2PDMA alternative (NVMe only) ----------------------------------------------------
    if let Some(p) = p2p {
        let title = "NVMe P2PDMA mode (no nvidia_fs needed)";
        let nvfs_ok = out
            .iter()
            .any(|c| c.id == "nvidia_fs.storage_driver" && c.status == Status::Pass);
        let c = if p.ready {
            Check::pass("nvme.p2pdma", title, p.evidence)
        } else if nvfs_ok {
            Check::na(
                "nvme.p2pdma",
                title,
                format!("not used (nvidia_fs path is ready); {}", p.evidence),
            )
        } else {
            Check::fail(
                "nvme.p2pdma",
                title,
                format!("{}; missing: {}", p.evidence, p.missing.join(", ")),
                format!(
                    "either fix nvidia_fs (above) or provide what P2PDMA mode needs (GDS \
                     troubleshooting guide, NVMe P2PDMA): {}",
                    p.missing.join("; ")
                ),
            )
        };
        out.push(c);
    }

    // --- cufile.json ------------------------------------------------------------------------
    out.extend(cufile_checks(&cfg, backend));

    // --- IOMMU ------------------------------------------------------------------------------
    out.push(iommu_check(paths));

    // --- RDMA devices (NFS) -----------------------------------------------------------------
    if backend == Backend::NfsRdma {
        let ib = paths.sys("class/infiniband");
        let devs = list_dir_names(&ib);
        let title = "RDMA device present";
        if devs.is_empty() {
            out.push(Check::fail(
                "rdma.devices",
                title,
                format!("no devices under {}", ib.display()),
                "install an RDMA NIC driver (MOFED / mlx5_ib) or, for tests, Soft-RoCE \
                 (`rdma link add rxe0 type rxe netdev <if>`)",
            ));
        } else {
            let mut ev = format!("{}: {}", ib.display(), devs.join(" "));
            if let CufileState::Ok(c) = &cfg {
                if !c.nfs_rdma_dev_addr_list.is_empty() {
                    ev += &format!(
                        "; fs.nfs.rdma_dev_addr_list: {}",
                        c.nfs_rdma_dev_addr_list.join(" ")
                    );
                }
            }
            out.push(Check::pass("rdma.devices", title, ev));
        }
    }
    out
}

fn cufile_checks(cfg: &CufileState, backend: Backend) -> Vec<Check> {
    let mut out = Vec::new();
    let c = match cfg {
        CufileState::Missing(e) => {
            out.push(Check::warn(
                "cufile.config",
                "cufile.json readable",
                format!("{e}; libcufile uses built-in defaults (compat mode allowed)"),
                "install /etc/cufile.json (or set CUFILE_ENV_PATH_JSON) and mount it into \
                 workload pods",
            ));
            return out;
        }
        CufileState::Invalid(e) => {
            out.push(Check::fail(
                "cufile.config",
                "cufile.json readable",
                e.clone(),
                "fix the JSON (comments are allowed; keys must have the documented types)",
            ));
            return out;
        }
        CufileState::Ok(c) => c,
    };
    let mut ev = format!(
        "allow_compat_mode={} force_compat_mode={} use_pci_p2pdma={} use_poll_mode={}",
        opt(c.allow_compat_mode),
        opt(c.force_compat_mode),
        opt(c.use_pci_p2pdma.or(c.nvme_use_pci_p2pdma)),
        opt(c.use_poll_mode)
    );
    if let Some(kb) = c.max_direct_io_size_kb {
        ev += &format!(" max_direct_io_size_kb={kb}");
    }
    out.push(Check::pass("cufile.config", "cufile.json readable", ev));

    let title = "cufile.json does not force compat mode";
    out.push(if c.force_compat_mode == Some(true) {
        Check::fail(
            "cufile.force_compat",
            title,
            "properties.force_compat_mode is true: every read goes through POSIX",
            "set \"force_compat_mode\": false in cufile.json",
        )
    } else {
        Check::pass("cufile.force_compat", title, "force_compat_mode not set")
    });

    let title = "compat fallback disabled";
    out.push(match c.allow_compat_mode {
        Some(false) => Check::pass("cufile.allow_compat", title, "allow_compat_mode is false"),
        v => Check::warn(
            "cufile.allow_compat",
            title,
            format!(
                "allow_compat_mode is {}: cuFile silently falls back to POSIX I/O when GDS \
                 is unavailable",
                v.map_or("unset (default true)".to_string(), |b| b.to_string())
            ),
            "set \"allow_compat_mode\": false for workloads that require true GDS, or rely on \
             the volume probe to detect fallback",
        ),
    });

    let deny: Vec<&String> = c
        .denylist
        .drivers
        .iter()
        .filter(|d| required_drivers(backend).contains(&d.as_str()))
        .collect();
    let title = "storage driver not denylisted";
    out.push(if deny.is_empty() {
        Check::pass(
            "cufile.denylist_drivers",
            title,
            format!("denylist.drivers: [{}]", c.denylist.drivers.join(", ")),
        )
    } else {
        Check::fail(
            "cufile.denylist_drivers",
            title,
            format!(
                "denylist.drivers names {}: I/O through it is disabled (IO_DISABLED)",
                deny.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "remove the driver from denylist.drivers in cufile.json",
        )
    });
    out
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("unset".to_string(), |v| v.to_string())
}

fn iommu_check(paths: &HostPaths) -> Check {
    let title = "IOMMU off or in passthrough";
    let cmdline = read_trim(&paths.proc("cmdline")).unwrap_or_default();
    let args: Vec<&str> = cmdline.split_whitespace().collect();
    let units = list_dir_names(&paths.sys("class/iommu"));
    let pt = args.contains(&"iommu=pt")
        || args.contains(&"iommu.passthrough=1")
        || args.contains(&"intel_iommu=off")
        || args.contains(&"amd_iommu=off");
    if units.is_empty() {
        Check::pass("iommu", title, "no IOMMU units under /sys/class/iommu")
    } else if pt {
        Check::pass(
            "iommu",
            title,
            format!(
                "IOMMU units {}; kernel cmdline has passthrough/off",
                units.join(" ")
            ),
        )
    } else {
        Check::warn(
            "iommu",
            title,
            format!(
                "IOMMU active ({}) and no iommu=pt on the kernel command line",
                units.join(" ")
            ),
            "boot with iommu=pt (or disable the IOMMU): GDS P2P DMA through a translating \
             IOMMU fails or is slow",
        )
    }
}

#[cfg(test)]
mod kallsyms_cache_tests {
    use super::*;

    #[test]
    fn kallsyms_is_rescanned_only_when_the_module_list_changes() {
        let root = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            proc_root: root.path().to_owned(),
            ..HostPaths::default()
        };
        let sym = "ffffffffc0a01000 T nvme_v1_register_nvfs_dma_ops\t[nvme]\n";
        fs::write(root.path().join("kallsyms"), sym).unwrap();
        fs::write(root.path().join("modules"), "nvme 1 0 - Live\n").unwrap();
        let wanted = ["nvme_v1_register_nvfs_dma_ops"];
        assert_eq!(kallsyms(&paths, &wanted).unwrap().len(), 1);
        // Same modules: the cached answer stands even though the file changed.
        fs::write(root.path().join("kallsyms"), "").unwrap();
        assert_eq!(kallsyms(&paths, &wanted).unwrap().len(), 1);
        // A module went away: scanned again.
        fs::write(root.path().join("modules"), "").unwrap();
        assert!(kallsyms(&paths, &wanted).unwrap().is_empty());
    }
}
