//! The nvidia_fs checks: module loaded, device nodes present, the backend's storage driver
//! registered. Each is N/A instead of Fail when NVMe takes the P2PDMA route.

use super::nvfs::{kallsyms, read_modules_held, registration_symbols, required_drivers};
use super::read_trim;
use crate::parse::{self, NvfsModule};
use crate::{Backend, Check, HostPaths};
use std::fs;
use std::path::PathBuf;

/// The N/A line of each nvidia_fs check when NVMe takes the P2PDMA route instead.
const NOT_NEEDED: &str = "nvidia_fs not loaded, not needed: NVMe uses P2PDMA mode";

const LOAD_REMEDY: &str = "load nvidia_fs (GPU Operator: ClusterPolicy spec.gds.enabled=true, \
    needs the open GPU kernel modules; or `modprobe nvidia_fs`), then reload the storage driver";

/// What the three checks share.
pub(super) struct NvfsState<'a> {
    pub(super) paths: &'a HostPaths,
    pub(super) backend: Backend,
    /// `/sys/module/nvidia_fs` exists.
    pub(super) loaded: bool,
    /// NVMe's P2PDMA route is ready, so nvidia_fs is not needed.
    pub(super) p2p_ready: bool,
    /// `nvidia-fs<N>` names under the dev root.
    pub(super) devs: &'a [String],
}

pub(super) fn module_check(s: &NvfsState) -> Check {
    let module_dir = s.paths.sys("module/nvidia_fs");
    if !s.loaded {
        return if s.p2p_ready {
            Check::na(
                "nvidia_fs.module",
                NOT_NEEDED,
                format!(
                    "{} absent; not needed: NVMe uses P2PDMA mode",
                    module_dir.display()
                ),
            )
        } else {
            Check::fail(
                "nvidia_fs.module",
                "nvidia_fs kernel module not loaded",
                format!("{} absent", module_dir.display()),
                LOAD_REMEDY,
            )
        };
    }
    let sysv = read_trim(&module_dir.join("version")).unwrap_or_default();
    let procv = fs::read_to_string(s.paths.proc("driver/nvidia-fs/version"))
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
    Check::pass("nvidia_fs.module", "nvidia_fs kernel module loaded", ev)
}

pub(super) fn devices_check(s: &NvfsState) -> Check {
    if !s.devs.is_empty() {
        Check::pass(
            "nvidia_fs.devices",
            "nvidia-fs device nodes present",
            format!("{} in {}", s.devs.join(" "), s.paths.dev_root.display()),
        )
    } else if !s.loaded && s.p2p_ready {
        Check::na("nvidia_fs.devices", NOT_NEEDED, "not needed in P2PDMA mode")
    } else {
        Check::fail(
            "nvidia_fs.devices",
            "no nvidia-fs device nodes",
            format!("no nvidia-fs<N> under {}", s.paths.dev_root.display()),
            if s.loaded {
                "nvidia_fs is loaded but its device nodes are not visible: give the container \
                 /dev/nvidia-fs* (CDI device nvidia.com/gds=all) or create them on the host"
            } else {
                LOAD_REMEDY
            },
        )
    }
}

pub(super) fn storage_driver_check(s: &NvfsState) -> Check {
    let wanted = required_drivers(s.backend).join(" or ");
    if !s.loaded {
        return if s.p2p_ready {
            Check::na(
                "nvidia_fs.storage_driver",
                NOT_NEEDED,
                "nvidia_fs not loaded; NVMe uses P2PDMA mode",
            )
        } else {
            Check::fail(
                "nvidia_fs.storage_driver",
                format!("{wanted} not registered: nvidia_fs not loaded"),
                "nvidia_fs not loaded",
                LOAD_REMEDY,
            )
        };
    }
    let held_dev = s.devs.first().map(|d| s.paths.dev_root.join(d));
    let listing = match &held_dev {
        Some(d) => read_modules_held(s.paths, d),
        None => Err(format!(
            "no nvidia-fs<N> under {} to hold open while reading the listing",
            s.paths.dev_root.display()
        )),
    };
    match listing {
        Ok(mods) => listed_check(s, &wanted, &mods, held_dev),
        Err(e) => Check::fail(
            "nvidia_fs.storage_driver",
            "nvidia_fs loaded, but its registered drivers cannot be read",
            format!("nvidia_fs loaded but the registered drivers cannot be read: {e}"),
            "give the container /dev/nvidia-fs* (CDI device nvidia.com/gds=all) and the \
             host's /proc/driver/nvidia-fs; check that the module is healthy (dmesg)",
        ),
    }
}

/// The listing could be read: Pass when it names the backend's driver (`wanted`).
fn listed_check(
    s: &NvfsState,
    wanted: &str,
    mods: &[NvfsModule],
    held_dev: Option<PathBuf>,
) -> Check {
    let names: Vec<&str> = mods.iter().map(|m| m.name.as_str()).collect();
    let ev = format!(
        "with {} held open, /proc/driver/nvidia-fs/modules lists: {}{}",
        held_dev
            .as_deref()
            .map_or("?".into(), |d| d.display().to_string()),
        none_or_list(&names),
        symbols_evidence(s)
    );
    if names
        .iter()
        .any(|n| required_drivers(s.backend).contains(n))
    {
        return Check::pass(
            "nvidia_fs.storage_driver",
            format!("{wanted} registered with nvidia_fs"),
            ev,
        );
    }
    let remedy = match s.backend {
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
    if s.p2p_ready {
        Check::warn(
            "nvidia_fs.storage_driver",
            format!("{wanted} not registered with nvidia_fs; P2PDMA mode serves NVMe instead"),
            format!("{ev}; P2PDMA mode covers NVMe"),
            remedy,
        )
    } else {
        Check::fail(
            "nvidia_fs.storage_driver",
            format!("{wanted} not registered with nvidia_fs: no GDS path, compat mode only"),
            format!("{ev}: cuFile silently falls back to compat mode for this backend"),
            remedy,
        )
    }
}

fn none_or_list<S: AsRef<str>>(v: &[S]) -> String {
    if v.is_empty() {
        "none".to_string()
    } else {
        v.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
    }
}

/// `; registration symbols in kallsyms: ...`, or nothing when kallsyms cannot be read.
fn symbols_evidence(s: &NvfsState) -> String {
    kallsyms(s.paths, registration_symbols(s.backend))
        .map(|syms| {
            let syms: Vec<String> = syms.into_iter().collect();
            format!(
                "; registration symbols in kallsyms: {}",
                none_or_list(&syms)
            )
        })
        .unwrap_or_default()
}
