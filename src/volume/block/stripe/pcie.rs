//! How near a pool drive sits to the node's GPUs on PCIe, so that a stripe prefers
//! members whose DMA into GPU memory stays below the host bridge (GDS throughput falls
//! when peer-to-peer traffic crosses the CPU's root complex, and more across sockets).
//!
//! From sysfs: a PCI device's canonical path is its chain from the host bridge down,
//! `/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...` (drivers/pci/probe.c names
//! the host bridge `pci%04x:%02x` in `pci_register_host_bridge`, each device by
//! `pci_setup_device`'s `dev_set_name(&dev->dev, "%04x:%02x:%02x.%d", ...)`, and every
//! device is added under its parent bridge). A GPU is a PCI device with vendor 0x10de
//! and class 0x0300xx (VGA) or 0x0302xx (3D controller), as `lspci` shows an H200.
//! The levels are `nvidia-smi topo -m`'s names, so operators read them as they already do.

use std::path::{Path, PathBuf};

use crate::pool::PoolDevice;

/// The volume-context key naming each member's nearness to the nearest GPU, in array
/// order (`PXB,PHB`); absent where sysfs shows no GPU.
pub const CONTEXT_KEY: &str = "stripeGpuPcie";

/// Nearness of a drive to a GPU, nearest last (so `max` picks the best).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Nearness {
    /// No PCI path (loop, virtual or unknown devices).
    Unknown,
    /// Different host bridges on different NUMA nodes.
    Sys,
    /// Different host bridges of one NUMA node.
    Node,
    /// One host bridge, different root ports: traffic crosses the host bridge.
    Phb,
    /// A PCIe bridge below the host bridge in common (a switch or a root port).
    Pxb,
}

impl Nearness {
    pub fn name(self) -> &'static str {
        match self {
            Nearness::Unknown => "unknown",
            Nearness::Sys => "SYS",
            Nearness::Node => "NODE",
            Nearness::Phb => "PHB",
            Nearness::Pxb => "PXB",
        }
    }
}

/// A PCI device's chain from the host bridge (`pci0000:00`) to itself, and its NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPlace {
    chain: Vec<String>,
    numa: Option<i32>,
}

impl PciPlace {
    /// The device's own PCI address (`0000:03:00.0`).
    pub fn address(&self) -> &str {
        self.chain.last().map_or("", String::as_str)
    }
}

fn is_function(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && name
            .chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The PCI place of the canonical sysfs path `path` (any device below a PCI function:
/// the function's own directory, or e.g. `.../0000:01:00.0/nvme/nvme0`).
pub fn place_of(path: &Path) -> Option<PciPlace> {
    let names: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let root = names.iter().position(|n| n.starts_with("pci"))?;
    let mut chain = vec![names[root].clone()];
    let mut dir: PathBuf = names[..=root].iter().collect();
    for n in &names[root + 1..] {
        if !is_function(n) {
            break;
        }
        chain.push(n.clone());
        dir.push(n);
    }
    if chain.len() < 2 {
        return None;
    }
    let numa = std::fs::read_to_string(dir.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Some(PciPlace { chain, numa })
}

/// The node's GPUs (NVIDIA display or 3D controllers) from `<sys>/bus/pci/devices`.
pub fn gpus(sys: &Path) -> Vec<PciPlace> {
    let Ok(entries) = std::fs::read_dir(sys.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let mut out: Vec<PciPlace> = entries
        .flatten()
        .filter(|e| {
            let vendor = read(e.path().join("vendor"));
            let class = read(e.path().join("class"));
            vendor.trim() == "0x10de"
                && (class.starts_with("0x0300") || class.starts_with("0x0302"))
        })
        .filter_map(|e| std::fs::canonicalize(e.path()).ok())
        .filter_map(|p| place_of(&p))
        .collect();
    out.sort_by(|a, b| a.chain.cmp(&b.chain));
    out
}

/// The PCI place of a pool device's disk (`<sys>/dev/block/<major>:<minor>`).
pub fn drive_place(sys: &Path, dev: &PoolDevice) -> Option<PciPlace> {
    let node = sys
        .join("dev/block")
        .join(format!("{}:{}", dev.major, dev.minor));
    place_of(&std::fs::canonicalize(node).ok()?)
}

/// A stripe volume's members' nearness for its volume context: `PXB,PHB`; None for
/// volumes chosen where no GPU was seen.
pub fn context(rec: &crate::pool::VolumeRecord) -> Option<(String, String)> {
    let members = &rec.stripe.as_ref()?.members;
    let names: Option<Vec<&str>> = members.iter().map(|m| m.gpu_pcie.as_deref()).collect();
    Some((CONTEXT_KEY.to_owned(), names?.join(",")))
}

/// How near `drive` is to the nearest of `gpus`.
pub fn nearness(drive: Option<&PciPlace>, gpus: &[PciPlace]) -> Nearness {
    let Some(d) = drive else {
        return Nearness::Unknown;
    };
    gpus.iter()
        .map(|g| {
            let common = d
                .chain
                .iter()
                .zip(&g.chain)
                .take_while(|(a, b)| a == b)
                .count();
            match common {
                // The drive is the GPU itself, or below it: never a drive of ours.
                _ if common == d.chain.len() || common == g.chain.len() => Nearness::Unknown,
                0 if d.numa.is_some() && d.numa == g.numa => Nearness::Node,
                0 => Nearness::Sys,
                1 => Nearness::Phb,
                _ => Nearness::Pxb,
            }
        })
        .max()
        .unwrap_or(Nearness::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mk(s: &Path, rel: &str, files: &[(&str, &str)]) {
        std::fs::create_dir_all(s.join(rel)).unwrap();
        for (f, v) in files {
            std::fs::write(s.join(rel).join(f), v).unwrap();
        }
    }

    /// The PCIe switch GPU0 and nvme0 sit behind.
    const SWITCH: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";

    /// Two sockets: GPU0 and nvme0 behind one switch on host bridge pci0000:00 (NUMA 0),
    /// nvme1 on another root port of that bridge, nvme2 on pci0000:40 (NUMA 0), nvme3 on
    /// pci0000:80 (NUMA 1). Links as the kernel makes them: `bus/pci/devices/<bdf>` and
    /// `dev/block/<maj:min>` point into `devices/`.
    fn two_socket_sysfs(s: &Path) {
        mk(s, "bus/pci/devices", &[]);
        mk(s, "dev/block", &[]);
        gpu_and_lookalikes(s);
        nvme_drives_and_a_loop_device(s);
    }

    /// GPU0, and beside it another vendor's 3D controller and an NVIDIA bridge, which are
    /// not GPUs.
    fn gpu_and_lookalikes(s: &Path) {
        let gpu = format!("{SWITCH}/0000:02:00.0/0000:03:00.0");
        mk(
            s,
            &gpu,
            &[
                ("vendor", "0x10de\n"),
                ("class", "0x030200\n"),
                ("numa_node", "0\n"),
            ],
        );
        mk(
            s,
            "devices/pci0000:00/0000:00:03.0",
            &[("vendor", "0x1af4\n"), ("class", "0x030200\n")],
        );
        mk(
            s,
            "devices/pci0000:00/0000:00:04.0",
            &[("vendor", "0x10de\n"), ("class", "0x060400\n")],
        );
        for bdf in ["0000:00:03.0", "0000:00:04.0"] {
            symlink(
                s.join(format!("devices/pci0000:00/{bdf}")),
                s.join("bus/pci/devices").join(bdf),
            )
            .unwrap();
        }
        symlink(s.join(&gpu), s.join("bus/pci/devices/0000:03:00.0")).unwrap();
    }

    /// nvme0-3 as `259:0`-`259:3`, and loop3 (`7:3`) with no PCI path.
    fn nvme_drives_and_a_loop_device(s: &Path) {
        let places = [
            (
                "nvme0",
                format!("{SWITCH}/0000:02:04.0/0000:05:00.0"),
                "259:0",
            ),
            (
                "nvme1",
                "devices/pci0000:00/0000:00:02.0/0000:06:00.0".into(),
                "259:1",
            ),
            (
                "nvme2",
                "devices/pci0000:40/0000:40:01.0/0000:41:00.0".into(),
                "259:2",
            ),
            (
                "nvme3",
                "devices/pci0000:80/0000:80:01.0/0000:81:00.0".into(),
                "259:3",
            ),
        ];
        for (name, func, num) in &places {
            let numa = if func.contains("pci0000:80") {
                "1\n"
            } else {
                "0\n"
            };
            mk(s, func, &[("numa_node", numa)]);
            let disk = format!("{func}/nvme/{name}/{name}n1");
            mk(s, &disk, &[]);
            symlink(s.join(disk), s.join("dev/block").join(num)).unwrap();
        }
        mk(s, "devices/virtual/block/loop3", &[]);
        symlink(
            s.join("devices/virtual/block/loop3"),
            s.join("dev/block/7:3"),
        )
        .unwrap();
    }

    /// A pool drive whose disk is `major:minor`: all `drive_place` reads of it.
    fn pool_device(major: u32, minor: u32) -> crate::pool::PoolDevice {
        crate::pool::PoolDevice {
            id: "d".into(),
            key: "path:/dev/d".into(),
            path: "/dev/d".into(),
            size_bytes: 1 << 30,
            major,
            minor,
            identity: None,
            source: crate::pool::inventory::Source::Listed,
        }
    }

    #[test]
    fn drives_are_ranked_by_the_pcie_path_to_the_nearest_gpu() {
        let t = tempfile::tempdir().unwrap();
        let s = t.path();
        two_socket_sysfs(s);

        let found = gpus(s);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].chain.last().unwrap(), "0000:03:00.0");
        let of = |minor: u32, major: u32| {
            nearness(drive_place(s, &pool_device(major, minor)).as_ref(), &found).name()
        };
        assert_eq!(of(0, 259), "PXB");
        assert_eq!(of(1, 259), "PHB");
        assert_eq!(of(2, 259), "NODE");
        assert_eq!(of(3, 259), "SYS");
        assert_eq!(of(3, 7), "unknown");
        assert_eq!(of(9, 259), "unknown");
        // No GPU at all: every drive is unknown, and the order of choice stays as before.
        assert_eq!(
            nearness(drive_place(s, &pool_device(259, 0)).as_ref(), &[]),
            Nearness::Unknown
        );
    }

    #[test]
    fn only_pci_function_names_extend_the_chain() {
        assert!(is_function("0000:00:01.0"));
        assert!(is_function("abcd:ef:1f.7"));
        assert!(!is_function("0000:00:01"));
        assert!(!is_function("nvme0"));
        assert!(!is_function("0000:0g:01.0"));
        let p = place_of(Path::new(
            "/sys/devices/pci0000:00/0000:00:01.0/virtio0/block/vda",
        ))
        .unwrap();
        assert_eq!(p.chain, vec!["pci0000:00", "0000:00:01.0"]);
        assert!(place_of(Path::new("/sys/devices/virtual/block/loop0")).is_none());
    }
}
