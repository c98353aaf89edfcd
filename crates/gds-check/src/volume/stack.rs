//! The block device stack under a mount, walked through sysfs: partitions, device-mapper, md
//! arrays and their members, NVMe namespaces and their transport.

use crate::HostPaths;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub(super) enum Layer {
    Partition(String),
    Dm(String),
    Md(MdArray),
    Nvme {
        name: String,
        transport: Option<String>,
    },
    Other(String),
}

/// An md array as sysfs shows it: `md/level` and one `slaves/<member>` link per member.
#[derive(Debug)]
pub(super) struct MdArray {
    pub(super) name: String,
    pub(super) level: String,
    pub(super) members: Vec<MdMember>,
}

#[derive(Debug)]
pub(super) struct MdMember {
    /// Kernel name (`nvme0n1`, `nvme0n1p1`).
    pub(super) name: String,
    /// From the member's sysfs `dev` file: names its udev database entry.
    pub(super) majmin: Option<String>,
    /// An NVMe namespace, or a partition of one.
    pub(super) nvme: bool,
}

fn md_members(dir: &Path) -> Vec<MdMember> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir.join("slaves"))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v.iter()
        .map(|p| {
            let real = fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            let name = name_of(p);
            let majmin = fs::read_to_string(real.join("dev"))
                .ok()
                .map(|s| s.trim().to_string());
            let whole = if real.join("partition").exists() {
                real.parent().map(name_of).unwrap_or_default()
            } else {
                name.clone()
            };
            MdMember {
                nvme: is_nvme_namespace(&whole),
                name,
                majmin,
            }
        })
        .collect()
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_nvme_namespace(name: &str) -> bool {
    // nvme0n1, or nvme0c1n1 (a multipath path device)
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    digits.len() < rest.len() && digits.contains('n') && !digits.contains('p')
}

fn nvme_transport(paths: &HostPaths, dir: &Path, name: &str) -> Option<String> {
    let rd = |p: PathBuf| fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    if let Some(t) = rd(dir.join("device/transport")) {
        return Some(t);
    }
    // Native multipath: `device` is the subsystem, whose controllers carry the transport.
    if let Ok(rdir) = fs::read_dir(dir.join("device")) {
        let mut ts: Vec<String> = rdir
            .filter_map(|e| e.ok())
            .filter_map(|e| rd(e.path().join("transport")))
            .collect();
        ts.sort();
        ts.dedup();
        if !ts.is_empty() {
            return Some(ts.join("+"));
        }
    }
    let ctrl: String = name
        .trim_start_matches("nvme")
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    rd(paths.sys(&format!("class/nvme/nvme{ctrl}/transport")))
}

pub(super) fn walk(paths: &HostPaths, dir: &Path, depth: usize, out: &mut Vec<Layer>) {
    if depth > 8 {
        return;
    }
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name = name_of(&dir);
    // A partition (the partition layout's volumes, issue 13) is followed to its disk and
    // judged as that disk: nvidia_fs has no notion of partitions. It maps the block
    // requests of the disk's queue (`nvfs_blk_rq_check`: `req->q`, gds-nvidia-fs
    // src/nvfs-dma.c:246-247) through the DMA ops the disk's driver registered
    // (`nvme_v1/v2_register_nvfs_dma_ops`, src/nvfs-dma.c:61-80), and the block layer
    // remaps a partition's I/O onto its disk's queue. So a partition of an NVMe namespace
    // needs the parent's driver (nvme) registered, which the node's
    // `nvidia_fs.storage_driver` check asks; a partition of device-mapper, md or a loop
    // device is judged by what lies below it. The udev entry cuFile needs is the mounted
    // device's own, the partition's (`block_checks::udev_check` with the mount's dev).
    if dir.join("partition").exists() {
        out.push(Layer::Partition(name));
        if let Some(parent) = dir.parent() {
            walk(paths, parent, depth + 1, out);
        }
        return;
    }
    let slaves = |out: &mut Vec<Layer>| {
        let mut s: Vec<PathBuf> = fs::read_dir(dir.join("slaves"))
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        s.sort();
        for p in s {
            walk(paths, &p, depth + 1, out);
        }
    };
    if dir.join("dm").is_dir() || name.starts_with("dm-") {
        let dm_name = fs::read_to_string(dir.join("dm/name")).unwrap_or_default();
        out.push(Layer::Dm(format!("{name} ({})", dm_name.trim())));
        slaves(out);
    } else if dir.join("md").is_dir() {
        let level = fs::read_to_string(dir.join("md/level")).unwrap_or_default();
        out.push(Layer::Md(MdArray {
            name,
            level: level.trim().to_string(),
            members: md_members(&dir),
        }));
        slaves(out);
    } else if is_nvme_namespace(&name) {
        let transport = nvme_transport(paths, &dir, &name);
        out.push(Layer::Nvme { name, transport });
    } else {
        out.push(Layer::Other(name));
    }
}

pub(super) fn describe(layers: &[Layer]) -> String {
    layers
        .iter()
        .map(|l| match l {
            Layer::Partition(n) => format!("{n} (partition)"),
            Layer::Dm(n) => format!("{n} (device-mapper)"),
            Layer::Md(md) => format!("{} (md {})", md.name, md.level),
            Layer::Nvme { name, transport } => format!(
                "{name} (nvme, transport {})",
                transport.as_deref().unwrap_or("unknown")
            ),
            Layer::Other(n) => n.clone(),
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}
