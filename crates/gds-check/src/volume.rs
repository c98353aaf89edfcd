//! Volume-level checks: will I/O on this mounted volume get true GDS?

use crate::node::{load_cufile, p2pdma_route, registered_drivers, CufileState};
use crate::parse::{parse_udev_db, unescape_mount_path};
use crate::{Backend, Check, HostPaths};
use procfs_core::process::{MountInfo, MountInfos};
use procfs_core::FromRead;
use std::fs;
use std::path::{Path, PathBuf};

/// Parses mountinfo with procfs-core; if one line is malformed, keeps the others rather than
/// losing the whole table.
fn read_mountinfo(paths: &HostPaths) -> Result<Vec<MountInfo>, String> {
    let p = paths.proc("self/mountinfo");
    let text = fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    match MountInfos::from_read(text.as_bytes()) {
        Ok(m) => Ok(m.0),
        Err(_) => Ok(text
            .lines()
            .filter_map(|l| MountInfo::from_line(l).ok())
            .collect()),
    }
}

fn normalize(p: &Path) -> PathBuf {
    // Lexical only: the mount point may not exist in this mount namespace.
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The mount whose mount point is `target` (last one wins: it is on top), or else the one with
/// the longest mount point that contains `target`.
fn find_mount<'a>(mounts: &'a [MountInfo], target: &Path) -> Option<(&'a MountInfo, bool)> {
    let target = normalize(target);
    let mp = |m: &MountInfo| PathBuf::from(unescape_mount_path(&m.mount_point.to_string_lossy()));
    if let Some(m) = mounts.iter().rev().find(|m| mp(m) == target) {
        return Some((m, true));
    }
    mounts
        .iter()
        .rev()
        .filter(|m| target.starts_with(mp(m)))
        .max_by_key(|m| mp(m).components().count())
        .map(|m| (m, false))
}

fn super_opt<'a>(m: &'a MountInfo, key: &str) -> Option<Option<&'a str>> {
    m.super_options.get(key).map(|v| v.as_deref())
}

fn opts_string(m: &MountInfo) -> String {
    let mut v: Vec<String> = m
        .super_options
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => k.clone(),
        })
        .collect();
    v.sort();
    v.join(",")
}

fn parse_majmin(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

pub fn volume_checks(paths: &HostPaths, backend: Backend, mount_point: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    let mounts = match read_mountinfo(paths) {
        Ok(m) => m,
        Err(e) => {
            out.push(Check::fail(
                "volume.mount",
                "volume is mounted",
                e,
                "make the host's /proc visible to the plugin",
            ));
            return out;
        }
    };
    let Some((m, exact)) = find_mount(&mounts, mount_point) else {
        out.push(Check::fail(
            "volume.mount",
            "volume is mounted",
            format!("no mountinfo entry covers {}", mount_point.display()),
            "mount the volume before checking it",
        ));
        return out;
    };
    let mp_str = unescape_mount_path(&m.mount_point.to_string_lossy());
    let source = m.mount_source.clone().unwrap_or_else(|| "none".into());
    let mut ev = format!("{} {} on {} (dev {})", m.fs_type, source, mp_str, m.majmin);
    if !exact {
        ev += &format!("; {} lies inside this mount", mount_point.display());
    }
    out.push(Check::pass("volume.mount", "volume is mounted", ev));

    out.push(filesystem_check(m, backend));

    let majmin = parse_majmin(&m.majmin);
    let sysdev = paths.sys(&format!("dev/block/{}", m.majmin));
    // NFS and other virtual filesystems have anonymous major 0 and no block device.
    let block = majmin.is_some_and(|(maj, _)| maj != 0) && sysdev.exists();

    let cfg = load_cufile(paths);
    let dev_name = block
        .then(|| fs::canonicalize(&sysdev).ok())
        .flatten()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    out.push(denylist_check(
        &cfg,
        m,
        &mp_str,
        mount_point,
        dev_name.as_deref(),
    ));

    if backend == Backend::NfsRdma && !block {
        let why = "NFS volume: no local block device";
        out.push(Check::na(
            "volume.block_stack",
            "block device stack supported",
            why,
        ));
        out.push(Check::na("volume.nvme_transport", "NVMe transport", why));
        out.push(Check::na("volume.udev", "udev database entry", why));
        return out;
    }
    if !block {
        let why = format!(
            "no block device for dev {} ({})",
            m.majmin,
            sysdev.display()
        );
        out.push(Check::fail(
            "volume.block_stack",
            "block device stack supported",
            why,
            "GDS on NVMe needs a filesystem on a block device",
        ));
        return out;
    }
    let mut layers = Vec::new();
    walk(paths, &sysdev, 0, &mut layers);
    out.extend(block_checks(paths, backend, &layers));
    out.push(udev_check(paths, &m.majmin));
    if let Some(md) = layers.iter().find_map(|l| match l {
        Layer::Md(md) => Some(md),
        _ => None,
    }) {
        out.push(md_udev_check(paths, &m.majmin, md));
    }
    out
}

fn filesystem_check(m: &MountInfo, backend: Backend) -> Check {
    let id = "volume.filesystem";
    let title = "filesystem supports true GDS";
    let fs = m.fs_type.as_str();
    let opts = opts_string(m);
    let ev = format!("{fs} super options: {opts}");
    let nfs = fs == "nfs" || fs == "nfs4";
    match (backend, fs) {
        (Backend::Nvme, "ext4") => match super_opt(m, "data") {
            Some(Some("ordered")) => Check::pass(id, title, ev),
            Some(Some("journal")) => Check::fail(
                id,
                title,
                format!("{ev}: data=journal disables O_DIRECT"),
                "mount with -o data=ordered",
            ),
            Some(Some(other)) => Check::fail(
                id,
                title,
                format!("{ev}: data={other} is not supported by GDS"),
                "mount with -o data=ordered",
            ),
            _ => Check::fail(
                id,
                title,
                format!("{ev}: data=ordered is not set explicitly (GDS requires it)"),
                "mount with -o data=ordered",
            ),
        },
        (Backend::Nvme, "xfs") => Check::pass(id, title, ev),
        (Backend::NfsRdma, _) if nfs => {
            let proto = super_opt(m, "proto").flatten();
            let rdma =
                matches!(proto, Some("rdma") | Some("rdma6")) || super_opt(m, "rdma").is_some();
            if rdma {
                Check::pass(id, title, ev)
            } else {
                Check::fail(
                    id,
                    title,
                    format!(
                        "{ev}: NFS over {} is compat mode only",
                        proto.unwrap_or("an unknown transport")
                    ),
                    "mount with -o rdma,port=20049 (server: `echo \"rdma 20049\" > \
                     /proc/fs/nfsd/portlist`)",
                )
            }
        }
        (Backend::Nvme, _) if nfs => Check::fail(
            id,
            title,
            format!("{ev}: an NFS mount on an NVMe volume"),
            "format the NVMe volume with xfs or ext4 (data=ordered)",
        ),
        (Backend::NfsRdma, _) => Check::fail(
            id,
            title,
            format!("{ev}: not NFS, but the volume's backend is NFS over RDMA"),
            "mount the NFS export with -o rdma,port=20049",
        ),
        (Backend::Nvme, _) => Check::fail(
            id,
            title,
            format!("{ev}: {fs} gets compat mode only"),
            "use xfs, or ext4 mounted with -o data=ordered",
        ),
    }
}

fn denylist_check(
    cfg: &CufileState,
    m: &MountInfo,
    mp: &str,
    requested: &Path,
    dev_name: Option<&str>,
) -> Check {
    let id = "volume.denylist";
    let title = "volume not denylisted in cufile.json";
    let c = match cfg {
        CufileState::Ok(c) => c,
        CufileState::Missing(e) => return Check::na(id, title, format!("no cufile.json: {e}")),
        CufileState::Invalid(e) => {
            return Check::warn(
                id,
                title,
                format!("cannot evaluate: {e}"),
                "fix cufile.json",
            )
        }
    };
    let same_path = |a: &str, b: &Path| normalize(Path::new(a)) == normalize(b);
    let mut hits = Vec::new();
    for d in &c.denylist.mounts {
        if same_path(d, Path::new(mp)) || same_path(d, requested) {
            hits.push(format!("denylist.mounts has {d}"));
        }
    }
    for d in &c.denylist.devices {
        let by_source = m
            .mount_source
            .as_deref()
            .is_some_and(|s| same_path(d, Path::new(s)));
        let by_name =
            dev_name.is_some_and(|n| d.as_str() == n || same_path(d, &Path::new("/dev").join(n)));
        if by_source || by_name {
            hits.push(format!("denylist.devices has {d}"));
        }
    }
    for d in &c.denylist.filesystems {
        let fs = m.fs_type.as_str();
        if d == fs || (d == "nfs" && fs.starts_with("nfs")) {
            hits.push(format!("denylist.filesystems has {d}"));
        }
    }
    if hits.is_empty() {
        Check::pass(
            id,
            title,
            format!(
                "mount {mp}, device {}, filesystem {} not listed",
                dev_name.or(m.mount_source.as_deref()).unwrap_or("none"),
                m.fs_type
            ),
        )
    } else {
        Check::fail(
            id,
            title,
            format!(
                "{}: cuFile disables GDS for it (IO_DISABLED)",
                hits.join("; ")
            ),
            "remove the entry from the denylist section of cufile.json",
        )
    }
}

#[derive(Debug)]
enum Layer {
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
struct MdArray {
    name: String,
    level: String,
    members: Vec<MdMember>,
}

#[derive(Debug)]
struct MdMember {
    /// Kernel name (`nvme0n1`, `nvme0n1p1`).
    name: String,
    /// From the member's sysfs `dev` file: names its udev database entry.
    majmin: Option<String>,
    /// An NVMe namespace, or a partition of one.
    nvme: bool,
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

fn walk(paths: &HostPaths, dir: &Path, depth: usize, out: &mut Vec<Layer>) {
    if depth > 8 {
        return;
    }
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name = name_of(&dir);
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

fn describe(layers: &[Layer]) -> String {
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

fn block_checks(paths: &HostPaths, backend: Backend, layers: &[Layer]) -> Vec<Check> {
    let stack = describe(layers);
    let mut out = Vec::new();

    let title = "block device stack supported";
    let dm = layers.iter().any(|l| matches!(l, Layer::Dm(_)));
    let bad_md = layers.iter().find_map(|l| match l {
        Layer::Md(md) if md.level != "raid0" => Some(format!("{} is {}", md.name, md.level)),
        _ => None,
    });
    out.push(if dm {
        Check::fail(
            "volume.block_stack",
            title,
            format!("{stack}: device-mapper (LVM, dm-crypt, multipath) is not supported by GDS"),
            "put the filesystem directly on the NVMe namespace (or md RAID0 over namespaces)",
        )
    } else if let Some(md) = bad_md {
        Check::fail(
            "volume.block_stack",
            title,
            format!("{stack}: {md}; GDS supports md RAID0 only"),
            "use md RAID0 or a single namespace",
        )
    } else {
        Check::pass("volume.block_stack", title, stack.clone())
    });

    let title = "NVMe transport supports GDS";
    let nvme: Vec<(&str, Option<&str>)> = layers
        .iter()
        .filter_map(|l| match l {
            Layer::Nvme { name, transport } => Some((name.as_str(), transport.as_deref())),
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
        out.push(Check::warn(
            "volume.nvme_transport",
            title,
            format!("{what}; cuFile uses compat mode for it"),
            "back the volume with an NVMe namespace for true GDS",
        ));
    } else {
        // Read as a cuFile process sees it: the idle listing never shows nvme_rdma.
        let modules = registered_drivers(paths);
        let mut problems = Vec::new();
        let mut fail = false;
        for (n, t) in &nvme {
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
        if !others.is_empty() {
            problems.push(format!("non-NVMe members: {}", others.join(" ")));
        }
        let ev = if problems.is_empty() {
            stack.clone()
        } else {
            format!("{stack}: {}", problems.join("; "))
        };
        out.push(if fail {
            Check::fail(
                "volume.nvme_transport",
                title,
                ev,
                "load nvme_rdma after nvidia_fs (GDS-enabled MOFED driver)",
            )
        } else if problems.is_empty() {
            Check::pass("volume.nvme_transport", title, ev)
        } else {
            Check::warn(
                "volume.nvme_transport",
                title,
                ev,
                "use NVMe over PCIe or NVMe-oF over RDMA for true GDS",
            )
        });
    }
    // P2PDMA mode serves NVMe over PCIe only: "RAID0 over NVMe and NVMEoF are not supported"
    // (NVIDIA, "GDS Support for NVMe Drives Using Linux PCI P2PDMA", 1 Intro; GDS release notes,
    // Known Limitations: "not supported with RAID0 and multipath NVMe").
    if backend == Backend::Nvme && p2pdma_route(paths) {
        let title = "volume supported in NVMe P2PDMA mode";
        let mut bad: Vec<String> = layers
            .iter()
            .filter_map(|l| match l {
                Layer::Md(md) => Some(format!("{} is md {}", md.name, md.level)),
                Layer::Nvme { name, transport } if transport.as_deref() != Some("pcie") => {
                    Some(format!(
                        "{name} is NVMe over {}",
                        transport.as_deref().unwrap_or("an unknown transport")
                    ))
                }
                _ => None,
            })
            .collect();
        bad.dedup();
        out.push(if bad.is_empty() {
            Check::pass("volume.p2pdma", title, format!("{stack}: NVMe over PCIe"))
        } else {
            Check::fail(
                "volume.p2pdma",
                title,
                format!(
                    "{stack}: {}; this node has no nvidia_fs, and P2PDMA mode does not serve md \
                     RAID, multipath or NVMe-oF",
                    bad.join("; ")
                ),
                "put the filesystem on one NVMe namespace over PCIe, or load nvidia_fs with a \
                 GDS-enabled nvme driver for RAID0 and NVMe-oF",
            )
        });
    }
    out
}

fn udev_check(paths: &HostPaths, majmin: &str) -> Check {
    let id = "volume.udev";
    let title = "udev database identifies the block device";
    let p = paths.udev_data_dir.join(format!("b{majmin}"));
    let remedy = "run udevd on the node (or `udevadm trigger --action=change` for the device) and \
                  give workload pods /run/udev read-only (CDI device nvidia.com/gds=all does)";
    match fs::read_to_string(&p) {
        Err(e) => Check::fail(
            id,
            title,
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
                    title,
                    format!(
                        "{}: ID_FS_USAGE=filesystem ID_FS_TYPE={}",
                        p.display(),
                        props.get("ID_FS_TYPE").map_or("?", |s| s.as_str())
                    ),
                ),
                other => Check::fail(
                    id,
                    title,
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

/// The udev keys mdadm exports for one member (Detail.c, `--export`): `MD_DEVICE_<sysfs name>_DEV`
/// with the sysfs name `dev-nvme0n1` made alphanumeric (`dev_nvme0n1`).
fn md_member_dev_key(member: &str) -> String {
    let sys: String = format!("dev-{member}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("MD_DEVICE_{sys}_DEV")
}

/// For a volume on md RAID: the array's udev entry must carry what libcufile reads to judge the
/// RAID group, and each member must be an NVMe device udev knows.
///
/// Grounding:
/// - NVIDIA, GDS Installation and Troubleshooting Guide, 5.15 "Adding udev Rules for RAID
///   Volumes" (docs.nvidia.com/gpudirect-storage/troubleshooting-guide, read from a stored copy
///   of the page): change the line in `/lib/udev/rules.d/63-md-raid-arrays.rules` to
///   `IMPORT{program}="/usr/sbin/mdadm --detail --export $devnode"`, then reboot or restart mdadm.
///   GDS release notes: "RHEL 8.3 or later does not have default udev rules for detecting RAID
///   members, which disables GDS on RAID volumes."
/// - mdadm (md-raid-utilities/mdadm d1447022): udev-md-raid-arrays.rules:20 ships
///   `mdadm --detail --no-devices --export` (commit 1a52f1fc, first released in mdadm 4.2);
///   Detail.c:252-322 prints MD_LEVEL, MD_DEVICES, MD_UUID always and `MD_DEVICE_<dev>_ROLE/_DEV`
///   per member only without `--no-devices`. So the stock rule gives MD_LEVEL but no members.
/// - libcufile 1.20.0.107 (PyPI wheel nvidia-cufile, `strings`): its udev helper reads
///   `MD_LEVEL`, `MD_DEVICES` and `..._DEV` keys (`UDISKS_MD_DEVICE_` too) and logs "cannot
///   verify RAID members, RAID group size empty", "RAID member not supported by cuFile in RAID
///   group", "can't create udev device for RAID member", "cuFile support has been disabled for
///   members in the RAID group". The source is closed; what it does with each key is inferred
///   from these strings, not read.
fn md_udev_check(paths: &HostPaths, majmin: &str, md: &MdArray) -> Check {
    let id = "volume.md_udev";
    let title = "udev database carries the md array's members (mdadm rule)";
    let rule_remedy = format!(
        "make mdadm's udev rule export the members, as NVIDIA's GDS troubleshooting guide says \
         (\"Adding udev Rules for RAID Volumes\"): in 63-md-raid-arrays.rules use \
         IMPORT{{program}}=\"/usr/sbin/mdadm --detail --export $devnode\" (no --no-devices; an \
         edited copy in /etc/udev/rules.d/ overrides /lib/udev/rules.d/ and survives mdadm \
         updates), then `udevadm trigger --action=change /dev/{}` (or reboot)",
        md.name
    );
    let p = paths.udev_data_dir.join(format!("b{majmin}"));
    let props = match fs::read_to_string(&p) {
        Ok(t) => parse_udev_db(&t),
        Err(e) => {
            return Check::fail(
                id,
                title,
                format!(
                    "{}: {e}; cuFile finds no MD_LEVEL or members for {}",
                    p.display(),
                    md.name
                ),
                rule_remedy,
            )
        }
    };
    let mut missing = Vec::new();
    let level = props.get("MD_LEVEL");
    match level {
        None => missing.push("MD_LEVEL (mdadm's rule did not run for the array)".to_string()),
        Some(l) if *l != md.level => missing.push(format!(
            "MD_LEVEL={l} but sysfs says {} (stale entry)",
            md.level
        )),
        Some(_) => {}
    }
    let count = props.get("MD_DEVICES");
    match count.map(|c| c.parse::<usize>()) {
        None => missing.push("MD_DEVICES".into()),
        Some(Ok(n)) if n == md.members.len() => {}
        Some(_) => missing.push(format!(
            "MD_DEVICES={} but sysfs lists {} member(s) (stale entry)",
            count.map_or("", |s| s.as_str()),
            md.members.len()
        )),
    }
    let exported: Vec<&str> = props
        .iter()
        .filter(|(k, _)| k.starts_with("MD_DEVICE_") && k.ends_with("_DEV"))
        .map(|(_, v)| v.as_str())
        .collect();
    let no_members = exported.is_empty();
    let mut unexported = Vec::new();
    for mb in &md.members {
        let key = md_member_dev_key(&mb.name);
        let by_value = exported.iter().any(|v| {
            Path::new(v)
                .file_name()
                .is_some_and(|n| n == mb.name.as_str())
        });
        if !props.contains_key(&key) && !by_value {
            unexported.push(key);
        }
    }
    if no_members {
        missing.push(
            "every MD_DEVICE_<member>_DEV key: the rule runs `mdadm --detail --no-devices \
             --export` (mdadm's default since 4.2), so cuFile cannot verify the RAID members"
                .into(),
        );
    } else if !unexported.is_empty() {
        missing.push(format!("{} (stale entry)", unexported.join(", ")));
    }

    // Each member, as cuFile checks it: an NVMe device that udev knows.
    let mut member_problems = Vec::new();
    let mut member_ev = Vec::new();
    for mb in &md.members {
        let entry = mb
            .majmin
            .as_ref()
            .map(|mm| paths.udev_data_dir.join(format!("b{mm}")));
        let known = entry.as_ref().is_some_and(|e| e.exists());
        member_ev.push(format!(
            "{} ({})",
            mb.name,
            mb.majmin.as_deref().unwrap_or("no dev")
        ));
        if !mb.nvme {
            member_problems.push(format!(
                "member {} is not an NVMe namespace: cuFile disables GDS for the whole RAID group",
                mb.name
            ));
        }
        if !known {
            member_problems.push(format!(
                "member {} has no udev entry ({})",
                mb.name,
                entry.map_or("no dev file in sysfs".into(), |e| e.display().to_string())
            ));
        }
    }
    if md.members.is_empty() {
        member_problems.push(format!("{} has no members in sysfs (slaves/)", md.name));
    }

    let ev_ok = format!(
        "{}: MD_LEVEL={} MD_DEVICES={}; members {}",
        p.display(),
        level.map_or("?", |s| s.as_str()),
        count.map_or("?", |s| s.as_str()),
        member_ev.join(", ")
    );
    if missing.is_empty() && member_problems.is_empty() {
        return Check::pass(id, title, ev_ok);
    }
    let mut ev = vec![format!("{}: {}", p.display(), md.name)];
    if !missing.is_empty() {
        ev.push(format!("missing {}", missing.join("; ")));
    }
    ev.extend(member_problems.iter().cloned());
    let mut remedy = Vec::new();
    if !missing.is_empty() {
        remedy.push(rule_remedy);
    }
    if member_problems.iter().any(|p| p.contains("not an NVMe")) {
        remedy.push("build the RAID0 from NVMe namespaces (or their partitions) only".into());
    }
    if member_problems.iter().any(|p| p.contains("no udev entry")) {
        remedy.push(
            "run udevd on the node and `udevadm trigger --action=change` for the members".into(),
        );
    }
    Check::fail(id, title, ev.join("; "), remedy.join("; "))
}
