//! What nvidia-fs says about itself: its device nodes, and the storage drivers registered
//! with it (read the way a cuFile process sees them), plus the kernel symbols that show a
//! driver built with nvidia-fs support.

use super::list_dir_names;
use crate::parse::{self, NvfsModule};
use crate::{Backend, HostPaths};
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::BufReader;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// Names nvidia_fs must list in `modules` for the backend to get true GDS.
pub(super) fn required_drivers(backend: Backend) -> &'static [&'static str] {
    match backend {
        // The pool's volumes are NVMe over PCIe: only the `nvme` entry registers their DMA
        // hooks; `nvme_rdma` (src/nvfs-dma.c:87-97) serves NVMe-oF namespaces only.
        Backend::Nvme => &["nvme"],
        Backend::NfsRdma => &["rpcrdma"],
    }
}

pub(super) fn registration_symbols(backend: Backend) -> &'static [&'static str] {
    match backend {
        Backend::Nvme => &[
            "nvme_v1_register_nvfs_dma_ops",
            "nvme_v2_register_nvfs_dma_ops",
        ],
        Backend::NfsRdma => &["rpcrdma_register_nvfs_dma_ops"],
    }
}

/// The modules nvidia_fs lists, or why they could not be read.
fn read_modules(paths: &HostPaths) -> Result<Vec<NvfsModule>, String> {
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
pub(super) fn read_modules_held(paths: &HostPaths, dev: &Path) -> Result<Vec<NvfsModule>, String> {
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
pub(super) fn kallsyms(paths: &HostPaths, wanted: &[&str]) -> Option<BTreeSet<String>> {
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

/// The storage drivers registered with nvidia-fs as a cuFile process sees them (a device node
/// held open, see [`read_modules_held`]); None when nvidia-fs or its nodes are not there.
pub(crate) fn registered_drivers(paths: &HostPaths) -> Option<Vec<NvfsModule>> {
    let dev = nvfs_device_nodes(paths).into_iter().next()?;
    read_modules_held(paths, &paths.dev_root.join(dev)).ok()
}

/// `nvidia-fs<N>` names under the dev root.
pub(super) fn nvfs_device_nodes(paths: &HostPaths) -> Vec<String> {
    list_dir_names(&paths.dev_root)
        .into_iter()
        .filter(|n| {
            n.strip_prefix("nvidia-fs")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
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
