//! Node and volume checks against fixture trees shaped like the real files.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use gds_check::{node_checks, volume_checks, Backend, Check, HostPaths, Report, Status};
use std::fs;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

#[path = "fake/nvfs_double.rs"]
mod nvfs_double;
use nvfs_double::NvfsDouble;

struct Host {
    _dir: TempDir,
    root: PathBuf,
    paths: HostPaths,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let paths = HostPaths::under(&root);
        for d in ["proc/self", "sys/module", "dev", "run/udev/data", "etc"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        Host {
            _dir: dir,
            root,
            paths,
        }
    }
    fn write(&self, rel: &str, text: &str) -> &Self {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
        self
    }
    fn mkdir(&self, rel: &str) -> &Self {
        fs::create_dir_all(self.root.join(rel)).unwrap();
        self
    }
    /// Relative symlink, like sysfs.
    fn link(&self, rel: &str, target: &str) -> &Self {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
        self
    }
    fn nvfs_loaded(&self, modules: &str) -> &Self {
        self.write("sys/module/nvidia_fs/version", "2.20.5\n")
            .write("proc/driver/nvidia-fs/version", "version: 2.20\n")
            .write("proc/driver/nvidia-fs/modules", modules)
            .write("dev/nvidia-fs0", "")
            .write("dev/nvidia-fs1", "")
    }
    /// An NVMe namespace with one partition, as sysfs lays it out.
    fn nvme_disk(&self, transport: &str) -> &Self {
        let ctrl = "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0";
        self.write(&format!("{ctrl}/transport"), &format!("{transport}\n"))
            .write(&format!("{ctrl}/nvme0n1/dev"), "259:0\n")
            .write(&format!("{ctrl}/nvme0n1/wwid"), "eui.0025385b71b0a1b2\n")
            .link(&format!("{ctrl}/nvme0n1/device"), "..")
            .write(&format!("{ctrl}/nvme0n1/nvme0n1p1/partition"), "1\n")
            .write(&format!("{ctrl}/nvme0n1/nvme0n1p1/dev"), "259:1\n")
            .link(
                "sys/dev/block/259:1",
                "../../devices/pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1/nvme0n1p1",
            )
    }
    fn mountinfo(&self, lines: &[&str]) -> &Self {
        let base = "21 1 0:20 / /proc rw,nosuid - proc proc rw\n\
                    22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n";
        self.write(
            "proc/self/mountinfo",
            &format!("{base}{}\n", lines.join("\n")),
        )
    }
    /// What mdadm's rule adds to an array's udev entry with `mdadm --detail --export` (Detail.c:
    /// MD_LEVEL, MD_DEVICES, MD_METADATA, MD_UUID, then MD_DEVICE_<dev>_ROLE/_DEV per member).
    fn md_rule_keys(&self, majmin: &str, level: &str, members: &[&str]) -> &Self {
        let p = self.root.join(format!("run/udev/data/b{majmin}"));
        let mut t = fs::read_to_string(&p).unwrap_or_default();
        t += &format!(
            "E:MD_LEVEL={level}\nE:MD_DEVICES={}\nE:MD_METADATA=1.2\nE:MD_UUID=4d8bea96:08136ba8:75029197:fe2e2a4b\n",
            members.len()
        );
        for (i, m) in members.iter().enumerate() {
            t += &format!("E:MD_DEVICE_dev_{m}_ROLE={i}\nE:MD_DEVICE_dev_{m}_DEV=/dev/{m}\n");
        }
        fs::write(p, t).unwrap();
        self
    }
    fn udev(&self, majmin: &str, usage: bool) -> &Self {
        let mut t = String::from("S:disk/by-id/nvme-eui.0025385b71b0a1b2-part1\n");
        if usage {
            t += "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=xfs\nE:ID_FS_UUID=1b4e28ba-2fa1-11d2-883f-0016d3cca427\n";
        }
        self.write(&format!("run/udev/data/b{majmin}"), &t)
    }
}

fn remedy(c: &Check) -> &str {
    c.remedy.as_deref().unwrap_or("")
}

fn get<'a>(checks: &'a [Check], id: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no check {id} in {checks:#?}"))
}

const CUFILE_OK: &str = r#"{
    // comments are allowed, as in NVIDIA's sample
    "logging": { "dir": "/var/log/gds", "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb": 16384,
        "allow_compat_mode": false, /* no silent fallback */
        "use_poll_mode": false
    },
    "fs": { "nfs": { "rdma_dev_addr_list": [] } },
    "denylist": { "drivers": [], "devices": [], "mounts": [], "filesystems": [] }
}"#;

#[test]
fn nvidia_fs_absent_fails_nvme_and_nfs() {
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .write("proc/sys/kernel/osrelease", "5.15.0-100-generic\n")
        .write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro quiet\n");
    let c = node_checks(&h.paths, Backend::Nvme);
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::Fail);
    assert_eq!(get(&c, "nvidia_fs.devices").status, Status::Fail);
    assert_eq!(get(&c, "nvidia_fs.storage_driver").status, Status::Fail);
    let p = get(&c, "nvme.p2pdma");
    assert_eq!(p.status, Status::Fail);
    assert!(p.evidence.contains("CONFIG_PCI_P2PDMA"), "{}", p.evidence);
    assert_eq!(get(&c, "iommu").status, Status::Pass);
    let r = Report::new(c);
    assert!(!r.ready());
    assert!(r.to_text().contains("remedy:"));

    let c = node_checks(&h.paths, Backend::NfsRdma);
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::Fail);
    assert_eq!(get(&c, "rdma.devices").status, Status::Fail);
    assert!(c.iter().all(|c| c.id != "nvme.p2pdma"));
}

#[test]
fn nvme_registered_passes() {
    let h = Host::new();
    h.nvfs_loaded("nvme: 1\nnvme_rdma: 1\n")
        .write("etc/cufile.json", CUFILE_OK)
        .write("proc/sys/kernel/osrelease", "5.15.0\n")
        .write(
            "proc/kallsyms",
            "ffffffffc0a01000 t nvme_v1_register_nvfs_dma_ops\t[nvme]\n",
        )
        .mkdir("sys/class/iommu/dmar0")
        .write("proc/cmdline", "ro iommu=pt\n");
    let c = node_checks(&h.paths, Backend::Nvme);
    let r = Report::new(c.clone());
    assert!(r.ready(), "{}", r.to_text());
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::Pass);
    assert!(get(&c, "nvidia_fs.module").evidence.contains("2.20.5"));
    assert!(get(&c, "nvidia_fs.devices")
        .evidence
        .contains("nvidia-fs0 nvidia-fs1"));
    let s = get(&c, "nvidia_fs.storage_driver");
    assert_eq!(s.status, Status::Pass);
    assert!(s.evidence.contains("nvme_v1_register_nvfs_dma_ops"));
    assert_eq!(get(&c, "nvme.p2pdma").status, Status::NotApplicable);
    assert_eq!(get(&c, "cufile.allow_compat").status, Status::Pass);
    assert_eq!(get(&c, "iommu").status, Status::Pass);
}

#[test]
fn only_wekafsio_registered_is_not_ready_for_nvme() {
    let h = Host::new();
    h.nvfs_loaded("wekafsio: 1\n")
        .write("proc/sys/kernel/osrelease", "5.15.0\n")
        .mkdir("sys/class/iommu/dmar0")
        .write("proc/cmdline", "ro\n");
    let c = node_checks(&h.paths, Backend::Nvme);
    let s = get(&c, "nvidia_fs.storage_driver");
    assert_eq!(s.status, Status::Fail);
    assert!(s.evidence.contains("wekafsio"), "{}", s.evidence);
    assert!(s.evidence.contains("compat"), "{}", s.evidence);
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::Pass);
    // No cufile.json: a warning, defaults allow compat mode.
    assert_eq!(get(&c, "cufile.config").status, Status::Warn);
    assert_eq!(get(&c, "iommu").status, Status::Warn);
    // And for NFS the same node lacks rpcrdma.
    let c = node_checks(&h.paths, Backend::NfsRdma);
    assert_eq!(get(&c, "nvidia_fs.storage_driver").status, Status::Fail);
}

#[test]
fn p2pdma_mode_counts_without_nvidia_fs() {
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true, "allow_compat_mode": false } }"#,
    )
    // A distribution kernel older than 6.2 with P2PDMA backported (RHEL 9): the kallsyms check
    // is what the guide documents, not the version.
    .write(
        "proc/sys/kernel/osrelease",
        "5.14.0-427.13.1.el9_4.x86_64\n",
    )
    .write("proc/kallsyms", "0000000000000000 D p2pdma_pgmap_ops\n");
    p2pdma_host(&h);
    let c = node_checks(&h.paths, Backend::Nvme);
    assert_eq!(get(&c, "nvme.p2pdma").status, Status::Pass, "{c:#?}");
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::NotApplicable);
    assert!(Report::new(c).ready());
    // Each documented item, when unmet, is named.
    for (rel, text, named) in [
        (
            "sys/module/nvme_core/parameters/multipath",
            "Y\n",
            "nvme_core multipath=N",
        ),
        (
            "proc/driver/nvidia/params",
            "RegistryDwords: \"\"\n",
            "RMForceStaticBar1=1",
        ),
        (
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06\n",
            "open GPU kernel modules",
        ),
        (
            "proc/driver/nvidia/gpus/0000:18:00.0/information",
            "Model: Tesla V100-SXM2-32GB\n",
            "P2PDMA-capable GPU",
        ),
        ("proc/kallsyms", "", "CONFIG_PCI_P2PDMA"),
    ] {
        let before = fs::read_to_string(h.root.join(rel)).unwrap();
        // /proc/modules changes too, as it would: kallsyms is rescanned only then.
        h.write(rel, text)
            .write("proc/modules", &format!("{rel} 1 0 - Live\n"));
        let c = node_checks(&h.paths, Backend::Nvme);
        let p = get(&c, "nvme.p2pdma");
        assert_eq!(p.status, Status::Fail, "{rel}");
        assert!(p.evidence.contains(named), "{rel}: {}", p.evidence);
        h.write(rel, &before);
    }
    // NFS still needs nvidia_fs.
    let c = node_checks(&h.paths, Backend::NfsRdma);
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::Fail);
}

/// On a kernel that may carry nvme-multipath P2PDMA (7.1 or newer), `nvme_core multipath=N`
/// is no longer required: multipath heads are judged per volume and the cuFile probe decides.
/// On an older kernel it stays required, and the failure names both ways out.
#[test]
fn p2pdma_multipath_on_needs_a_kernel_with_multipath_p2pdma() {
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true, "allow_compat_mode": false } }"#,
    )
    .write("proc/kallsyms", "0000000000000000 D p2pdma_pgmap_ops\n");
    p2pdma_host(&h);
    h.write("sys/module/nvme_core/parameters/multipath", "Y\n");
    for (release, status) in [
        ("7.2.0-rc1\n", Status::Pass),
        ("7.1.0\n", Status::Pass),
        ("7.0.9\n", Status::Fail),
        ("6.8.0-45-generic\n", Status::Fail),
    ] {
        h.write("proc/sys/kernel/osrelease", release);
        let c = node_checks(&h.paths, Backend::Nvme);
        let p = get(&c, "nvme.p2pdma");
        assert_eq!(p.status, status, "{release}: {p:#?}");
        if status == Status::Pass {
            assert!(
                p.evidence.contains("the cuFile probe decides"),
                "{}",
                p.evidence
            );
        } else {
            assert!(
                p.evidence
                    .contains("nvme_core multipath=N (or a kernel 7.1 or newer"),
                "{}",
                p.evidence
            );
        }
    }
}

#[test]
fn cufile_force_compat_and_denylisted_driver_fail() {
    let h = Host::new();
    h.nvfs_loaded("nvme: 1\n").write(
        "etc/cufile.json",
        r#"{ "properties": { "force_compat_mode": true },
             "denylist": { "drivers": ["nvme"] } }"#,
    );
    let c = node_checks(&h.paths, Backend::Nvme);
    assert_eq!(get(&c, "cufile.force_compat").status, Status::Fail);
    assert_eq!(get(&c, "cufile.allow_compat").status, Status::Warn);
    assert_eq!(get(&c, "cufile.denylist_drivers").status, Status::Fail);
    h.write("etc/cufile.json", "{ \"properties\": { ");
    let c = node_checks(&h.paths, Backend::Nvme);
    assert_eq!(get(&c, "cufile.config").status, Status::Fail);
}

#[test]
fn stats_fixture_parses() {
    let h = Host::new();
    h.write(
        "proc/driver/nvidia-fs/stats",
        "GDS Version: 1.10.0.4 \nNVFS statistics(ver: 4.0)\nNVFS Driver(version: 2.20.5)\n\
         Mellanox PeerDirect Supported: False\nActive Process: 0\n\
         Reads\t\t\t\t: n=5 ok=5 err=0 readMiB=1280 io_state_err=0\n\
         Writes\t\t\t\t: n=0 ok=0 err=0 writeMiB=0 io_state_err=0\n\
         GPU 0000:18:00.0  uuid:7f6e9a3c-1111-2222-3333-444455556666 : Registered_MiB=256 Cache_MiB=0\n",
    );
    let t = fs::read_to_string(h.paths.proc("driver/nvidia-fs/stats")).unwrap();
    let s = gds_check::parse::parse_stats(&t).unwrap();
    assert_eq!(s.reads.mib, Some(1280));
    assert_eq!(s.peerdirect_supported, Some(false));
    assert_eq!(s.gpus[0].fields["Registered_MiB"], "256");
}

const EXT4_ORDERED: &str =
    "100 29 259:1 / /mnt/vol rw,relatime shared:50 - ext4 /dev/nvme0n1p1 rw,data=ordered";
const EXT4_IMPLICIT: &str =
    "100 29 259:1 / /mnt/vol rw,relatime shared:50 - ext4 /dev/nvme0n1p1 rw";
const XFS: &str =
    "100 29 259:1 / /mnt/vol rw,relatime - xfs /dev/nvme0n1p1 rw,attr2,inode64,logbufs=8,noquota";

fn nvme_volume(mountline: &str, udev: bool) -> Host {
    let h = Host::new();
    h.nvfs_loaded("nvme: 1\n")
        .write("etc/cufile.json", CUFILE_OK)
        .nvme_disk("pcie")
        .mountinfo(&[mountline])
        .udev("259:1", udev);
    h
}

#[test]
fn ext4_needs_explicit_data_ordered() {
    let h = nvme_volume(EXT4_IMPLICIT, true);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let f = get(&c, "volume.filesystem");
    assert_eq!(f.status, Status::Fail);
    assert_eq!(f.remedy.as_deref(), Some("mount with -o data=ordered"));

    let h = nvme_volume(EXT4_ORDERED, true);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let r = Report::new(c.clone());
    assert!(r.ready(), "{}", r.to_text());
    assert_eq!(get(&c, "volume.filesystem").status, Status::Pass);
    let s = get(&c, "volume.block_stack");
    assert!(
        s.evidence.contains("nvme0n1p1 (partition) -> nvme0n1"),
        "{}",
        s.evidence
    );
    let t = get(&c, "volume.nvme_transport");
    assert_eq!(t.status, Status::Pass);
    assert!(t.evidence.contains("transport pcie"), "{}", t.evidence);
    assert_eq!(get(&c, "volume.udev").status, Status::Pass);
}

#[test]
fn xfs_passes_and_path_inside_mount_is_found() {
    let h = nvme_volume(XFS, true);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol/data/x"));
    assert!(Report::new(c.clone()).ready());
    assert!(get(&c, "volume.mount").evidence.contains("inside"));
}

#[test]
fn tmpfs_fails() {
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .mountinfo(&["200 29 0:55 / /mnt/vol rw,relatime - tmpfs tmpfs rw,size=1024k"]);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let f = get(&c, "volume.filesystem");
    assert_eq!(f.status, Status::Fail);
    assert!(f.evidence.contains("compat"));
    assert_eq!(get(&c, "volume.block_stack").status, Status::Fail);
}

#[test]
fn not_mounted_fails() {
    let h = Host::new();
    h.mountinfo(&[]);
    // "/" is not in this fixture's mountinfo either, so nothing covers the path.
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/none"));
    assert_eq!(get(&c, "volume.mount").status, Status::Fail);
    // A garbage mountinfo does not panic.
    h.write("proc/self/mountinfo", "garbage\n\u{0}\n1 2\n");
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/none"));
    assert_eq!(get(&c, "volume.mount").status, Status::Fail);
}

#[test]
fn udev_db_absent_or_without_usage_fails() {
    let h = nvme_volume(XFS, false);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let u = get(&c, "volume.udev");
    assert_eq!(u.status, Status::Fail);
    assert!(
        u.evidence.contains("ID_FS_USAGE is missing"),
        "{}",
        u.evidence
    );
    fs::remove_file(h.root.join("run/udev/data/b259:1")).unwrap();
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let u = get(&c, "volume.udev");
    assert_eq!(u.status, Status::Fail);
    assert!(u.evidence.contains("5027"));
    assert!(u.remedy.as_deref().unwrap().contains("/run/udev"));
}

#[test]
fn denylist_names_the_mount() {
    let h = nvme_volume(XFS, true);
    h.write(
        "etc/cufile.json",
        r#"{
        "properties": { "allow_compat_mode": false },
        "denylist": {
            // specify list of mount points to prevent (e.g. [ "/mnt/test" ])
            "mounts": [ "/mnt/vol/" ],
            "devices": [ ],
            "filesystems": [ ]
        }
    }"#,
    );
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let d = get(&c, "volume.denylist");
    assert_eq!(d.status, Status::Fail);
    assert!(d.evidence.contains("IO_DISABLED"));
    h.write(
        "etc/cufile.json",
        r#"{ "denylist": { "devices": ["/dev/nvme0n1p1"], "filesystems": ["xfs"] } }"#,
    );
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let d = get(&c, "volume.denylist");
    assert!(
        d.evidence.contains("devices") && d.evidence.contains("filesystems"),
        "{}",
        d.evidence
    );
}

#[test]
fn device_mapper_and_md() {
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .nvme_disk("pcie")
        .write("sys/devices/virtual/block/dm-0/dm/name", "vg-lv\n")
        .link(
            "sys/devices/virtual/block/dm-0/slaves/nvme0n1p1",
            "../../../../pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1/nvme0n1p1",
        )
        .link("sys/dev/block/253:0", "../../devices/virtual/block/dm-0")
        .write("sys/devices/virtual/block/md0/md/level", "raid0\n")
        .link(
            "sys/devices/virtual/block/md0/slaves/nvme0n1",
            "../../../../pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1",
        )
        .link("sys/dev/block/9:0", "../../devices/virtual/block/md0")
        .write("sys/devices/virtual/block/md1/md/level", "raid1\n")
        .link("sys/dev/block/9:1", "../../devices/virtual/block/md1")
        .mountinfo(&[
            "300 29 253:0 / /mnt/lvm rw - xfs /dev/mapper/vg-lv rw",
            "301 29 9:0 / /mnt/md0 rw - xfs /dev/md0 rw",
            "302 29 9:1 / /mnt/md1 rw - xfs /dev/md1 rw",
        ])
        .udev("9:0", true)
        .md_rule_keys("9:0", "raid0", &["nvme0n1"])
        .udev("259:0", false);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/lvm"));
    let s = get(&c, "volume.block_stack");
    assert_eq!(s.status, Status::Fail);
    assert!(
        s.evidence.contains("dm-0 (vg-lv) (device-mapper)"),
        "{}",
        s.evidence
    );
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/md0"));
    assert_eq!(get(&c, "volume.block_stack").status, Status::Pass);
    assert_eq!(get(&c, "volume.nvme_transport").status, Status::Pass);
    assert!(
        Report::new(c.clone()).ready(),
        "{}",
        Report::new(c).to_text()
    );
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/md1"));
    assert_eq!(get(&c, "volume.block_stack").status, Status::Fail);
}

/// A volume on md RAID0 needs mdadm's udev rule to export the members (NVIDIA's
/// "Adding udev Rules for RAID Volumes"); mdadm's stock rule runs `--no-devices`, so MD_LEVEL
/// is there but no member is. ID_FS_USAGE alone is not enough.
/// md0 (RAID0) over nvme0n1 and nvme1n1, mounted at /mnt/md0; the members known to udev.
/// Also md0's udev entry, with blkid's keys only, and that text.
fn md0_over_two_namespaces() -> (Host, PathBuf, String) {
    let h = Host::new();
    let ctrl = "sys/devices/pci0000:00/0000:00:01.0/nvme";
    h.write("etc/cufile.json", CUFILE_OK)
        .nvme_disk("pcie")
        .write(&format!("{ctrl}/nvme1/transport"), "pcie\n")
        .write(&format!("{ctrl}/nvme1/nvme1n1/dev"), "259:2\n")
        .link(&format!("{ctrl}/nvme1/nvme1n1/device"), "..")
        .write("sys/devices/virtual/block/md0/md/level", "raid0\n")
        .write("sys/devices/virtual/block/md0/dev", "9:0\n")
        .link(
            "sys/devices/virtual/block/md0/slaves/nvme0n1",
            "../../../../pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1",
        )
        .link(
            "sys/devices/virtual/block/md0/slaves/nvme1n1",
            "../../../../pci0000:00/0000:00:01.0/nvme/nvme1/nvme1n1",
        )
        .link("sys/dev/block/9:0", "../../devices/virtual/block/md0")
        .mountinfo(&["301 29 9:0 / /mnt/md0 rw - xfs /dev/md0 rw"])
        .udev("259:0", false)
        .udev("259:2", false)
        .udev("9:0", true);
    let p = h.root.join("run/udev/data/b9:0");
    let blkid_only = fs::read_to_string(&p).unwrap();
    (h, p, blkid_only)
}

/// The md udev check of /mnt/md0, and whether the whole report is ready.
fn md_check(h: &Host) -> (Check, bool) {
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/md0"));
    (get(&c, "volume.md_udev").clone(), Report::new(c).ready())
}

#[test]
fn md_raid0_needs_the_members_in_its_udev_entry() {
    let (h, p, blkid_only) = md0_over_two_namespaces();

    // blkid's keys only (what the stock rules give after `--no-devices`, minus MD_*): refused.
    let (c, ready) = md_check(&h);
    assert_eq!(c.status, Status::Fail, "{c:#?}");
    assert!(!ready);
    assert!(c.evidence.contains("MD_LEVEL"), "{}", c.evidence);
    assert!(
        remedy(&c).contains("mdadm --detail --export"),
        "{:?}",
        c.remedy
    );
    assert!(remedy(&c).contains("udevadm trigger"), "{:?}", c.remedy);

    // mdadm's stock rule (`--detail --no-devices --export`): level and count, no members.
    fs::write(
        &p,
        format!("{blkid_only}E:MD_LEVEL=raid0\nE:MD_DEVICES=2\nE:MD_METADATA=1.2\n"),
    )
    .unwrap();
    let (c, ready) = md_check(&h);
    assert_eq!(c.status, Status::Fail, "{c:#?}");
    assert!(!ready);
    assert!(c.evidence.contains("--no-devices"), "{}", c.evidence);

    // NVIDIA's rule: the members are exported; both are NVMe and known to udev.
    fs::write(&p, &blkid_only).unwrap();
    h.md_rule_keys("9:0", "raid0", &["nvme0n1", "nvme1n1"]);
    let (c, ready) = md_check(&h);
    assert_eq!(c.status, Status::Pass, "{c:#?}");
    assert!(ready);
    assert!(
        c.evidence.contains("nvme0n1 (259:0), nvme1n1 (259:2)"),
        "{}",
        c.evidence
    );
}

#[test]
fn md_raid0_members_must_be_nvme_and_known_to_udev() {
    let (h, p, blkid_only) = md0_over_two_namespaces();
    h.md_rule_keys("9:0", "raid0", &["nvme0n1", "nvme1n1"]);
    assert_eq!(md_check(&h).0.status, Status::Pass);

    // A member without its own udev entry is named.
    fs::remove_file(h.root.join("run/udev/data/b259:2")).unwrap();
    let (c, _) = md_check(&h);
    assert_eq!(c.status, Status::Fail, "{c:#?}");
    assert!(
        c.evidence.contains("member nvme1n1 has no udev entry"),
        "{}",
        c.evidence
    );
    assert!(!remedy(&c).contains("mdadm --detail"), "{:?}", c.remedy);
    h.udev("259:2", false);

    // A stale entry (a member added after the last udev event) names the missing key.
    fs::write(&p, &blkid_only).unwrap();
    h.md_rule_keys("9:0", "raid0", &["nvme0n1"]);
    let (c, _) = md_check(&h);
    assert_eq!(c.status, Status::Fail, "{c:#?}");
    assert!(
        c.evidence.contains("MD_DEVICE_dev_nvme1n1_DEV"),
        "{}",
        c.evidence
    );

    // A member that is not NVMe (a SATA disk) disables GDS for the whole group in cuFile.
    h.write("sys/devices/pci0000:00/0000:00:17.0/ata1/sda/dev", "8:0\n")
        .link(
            "sys/devices/virtual/block/md0/slaves/sda",
            "../../../../pci0000:00/0000:00:17.0/ata1/sda",
        )
        .udev("8:0", false);
    fs::write(&p, &blkid_only).unwrap();
    h.md_rule_keys("9:0", "raid0", &["nvme0n1", "nvme1n1", "sda"]);
    let (c, _) = md_check(&h);
    assert_eq!(c.status, Status::Fail, "{c:#?}");
    assert!(
        c.evidence.contains("member sda is not an NVMe namespace"),
        "{}",
        c.evidence
    );
    assert!(remedy(&c).contains("NVMe namespaces"), "{:?}", c.remedy);

    // Not md: no such check.
    h.mountinfo(&["302 29 259:1 / /mnt/vol rw - xfs /dev/nvme0n1p1 rw"]);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    assert!(c.iter().all(|c| c.id != "volume.md_udev"), "{c:#?}");
}

#[test]
fn loop_device_is_a_warning_with_evidence() {
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .write(
            "sys/devices/virtual/block/loop0/loop/backing_file",
            "/var/img\n",
        )
        .link("sys/dev/block/7:0", "../../devices/virtual/block/loop0")
        .mountinfo(&["400 29 7:0 / /mnt/loop rw - ext4 /dev/loop0 rw,data=ordered"])
        .udev("7:0", true);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/loop"));
    let t = get(&c, "volume.nvme_transport");
    assert_eq!(t.status, Status::Warn);
    assert!(
        t.evidence
            .contains("loop0 is not an NVMe namespace (loop device)"),
        "{}",
        t.evidence
    );
}

#[test]
fn nfs_needs_rdma() {
    let h = Host::new();
    h.nvfs_loaded("rpcrdma: 1\n")
        .write("etc/cufile.json", CUFILE_OK)
        .mkdir("sys/class/infiniband/rxe0")
        .mountinfo(&[
            "500 29 0:60 / /mnt/nfs rw,relatime - nfs4 10.0.0.1:/export rw,vers=4.1,rsize=262144,wsize=262144,hard,proto=rdma,port=20049,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.2",
            "501 29 0:61 / /mnt/tcp rw,relatime - nfs4 10.0.0.1:/export rw,vers=4.1,proto=tcp,port=0",
        ]);
    let n = node_checks(&h.paths, Backend::NfsRdma);
    assert_eq!(get(&n, "nvidia_fs.storage_driver").status, Status::Pass);
    assert_eq!(get(&n, "rdma.devices").status, Status::Pass);
    let c = volume_checks(&h.paths, Backend::NfsRdma, Path::new("/mnt/nfs"));
    let r = Report::new(c.clone());
    assert!(r.ready(), "{}", r.to_text());
    assert_eq!(get(&c, "volume.udev").status, Status::NotApplicable);
    let c = volume_checks(&h.paths, Backend::NfsRdma, Path::new("/mnt/tcp"));
    let f = get(&c, "volume.filesystem");
    assert_eq!(f.status, Status::Fail);
    assert!(f.remedy.as_deref().unwrap().contains("rdma"));
}

/// The double of nvidia-fs, or a clear failure: the root suite has CAP_SYS_ADMIN for fanotify.
fn double(h: &Host, registrable: &[&str], rw_stats: bool) -> NvfsDouble {
    NvfsDouble::start(&h.root, registrable, 2, rw_stats)
        .unwrap_or_else(|e| panic!("nvidia-fs double needs fanotify (root): {e}"))
}

#[test]
fn idle_gds_node_is_ready_because_registration_is_read_with_a_device_held_open() {
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .write("proc/sys/kernel/osrelease", "5.15.0\n")
        .write("proc/cmdline", "ro\n");
    let d = double(&h, &["nvme", "nvme_rdma"], false);
    // The idle listing, as a real idle node shows it.
    assert_eq!(d.modules_now(), "wekafsio: 1\n");
    let c = node_checks(&h.paths, Backend::Nvme);
    let s = get(&c, "nvidia_fs.storage_driver");
    assert_eq!(s.status, Status::Pass, "{s:#?}");
    assert!(
        s.evidence.contains("nvidia-fs0 held open"),
        "{}",
        s.evidence
    );
    assert!(
        s.evidence.contains("nvme, nvme_rdma, wekafsio"),
        "{}",
        s.evidence
    );
    assert!(d.opens_seen() >= 1);
    assert!(Report::new(c).ready());
    // Closed again: the listing is back to idle (the last close unregisters).
    let t = std::time::Instant::now();
    while d.modules_now() != "wekafsio: 1\n" {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "listing never went idle"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The same node for NFS: rpcrdma cannot register there.
    let c = node_checks(&h.paths, Backend::NfsRdma);
    assert_eq!(get(&c, "nvidia_fs.storage_driver").status, Status::Fail);
}

#[test]
fn nvme_without_registration_symbols_fails_even_when_held_open() {
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .write("proc/sys/kernel/osrelease", "5.15.0\n")
        .write("proc/cmdline", "ro\n");
    // Only nvme_rdma exports its symbols: a PCIe NVMe volume gets no GDS path.
    let d = double(&h, &["nvme_rdma"], true);
    let c = node_checks(&h.paths, Backend::Nvme);
    let s = get(&c, "nvidia_fs.storage_driver");
    assert_eq!(s.status, Status::Fail, "{s:#?}");
    assert!(s.evidence.contains("nvme_rdma, wekafsio"), "{}", s.evidence);
    assert!(d.opens_seen() >= 1);
    // The stats file in the rw_stats_enabled format parses.
    let st = fs::read_to_string(h.root.join("proc/driver/nvidia-fs/stats")).unwrap();
    assert!(gds_check::parse::parse_stats(&st).is_ok());
}

/// What NVIDIA's P2PDMA troubleshooting section asks for besides the kernel and cufile.json: an
/// H200, the open modules 570, the registry keys, nvme_core multipath=N.
fn p2pdma_host(h: &Host) {
    h.write(
        "proc/driver/nvidia/gpus/0000:18:00.0/information",
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\n",
    )
    .write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build\n\
         GCC version:  gcc version 11.4.0\n",
    )
    .write(
        "proc/driver/nvidia/params",
        "ResmanDebugLevel: 4294967295\nRegistryDwords: \"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\"\n",
    )
    .write("sys/module/nvme_core/parameters/multipath", "N\n");
}

/// In P2PDMA mode (no nvidia_fs), md RAID without the RAID key on a kernel of unknown release,
/// and NVMe-oF volumes, are refused; and an NVMe-oF volume is judged with nvme_rdma's
/// registration read as cuFile sees it.
#[test]
fn p2pdma_mode_refuses_md_and_nvme_of_volumes() {
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true } }"#,
    )
    .nvme_disk("pcie")
    .write("sys/devices/virtual/block/md0/md/level", "raid0\n")
    .link(
        "sys/devices/virtual/block/md0/slaves/nvme0n1",
        "../../../../pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1",
    )
    .link("sys/dev/block/9:0", "../../devices/virtual/block/md0")
    .mountinfo(&[
        "301 29 9:0 / /mnt/md0 rw - xfs /dev/md0 rw",
        "302 29 259:1 / /mnt/vol rw - xfs /dev/nvme0n1p1 rw",
    ])
    .udev("9:0", true)
    .udev("259:1", true);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/md0"));
    let p = get(&c, "volume.p2pdma");
    assert_eq!(p.status, Status::Fail, "{p:#?}");
    assert!(p.evidence.contains("md0 is md raid0"), "{}", p.evidence);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    assert_eq!(get(&c, "volume.p2pdma").status, Status::Pass);
    // NVMe-oF over RDMA: refused in P2PDMA mode ...
    h.write(
        "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0/transport",
        "rdma\n",
    );
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let p = get(&c, "volume.p2pdma");
    assert_eq!(p.status, Status::Fail);
    assert!(p.evidence.contains("NVMe over rdma"), "{}", p.evidence);
    // ... and with nvidia_fs, accepted once nvme_rdma registers (read with a device held open).
    let _d = double(&h, &["nvme", "nvme_rdma"], false);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    assert!(c.iter().all(|c| c.id != "volume.p2pdma"));
    assert_eq!(
        get(&c, "volume.nvme_transport").status,
        Status::Pass,
        "{c:#?}"
    );
}

/// Native nvme-multipath: the head `nvme0n1` (259:0) in the subsystem `nvme-subsys0`, which
/// links its controller `nvme0` (the head's parent is the subsystem: drivers/nvme/host/
/// multipath.c `nvme_mpath_set_live`); xfs on it mounted at /mnt/mp.
fn multipath_head(h: &Host) {
    let subsys = "sys/devices/virtual/nvme-subsystem/nvme-subsys0";
    h.write(
        "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0/transport",
        "pcie\n",
    )
    .link(
        &format!("{subsys}/nvme0"),
        "../../../pci0000:00/0000:00:01.0/nvme/nvme0",
    )
    .write(&format!("{subsys}/nvme0n1/dev"), "259:0\n")
    .link(&format!("{subsys}/nvme0n1/device"), "..")
    .link(
        "sys/dev/block/259:0",
        "../../devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1",
    )
    .mountinfo(&["310 29 259:0 / /mnt/mp rw - xfs /dev/nvme0n1 rw"])
    .udev("259:0", true);
}

/// In P2PDMA mode an nvme-multipath head over PCIe passes pending the cuFile probe on a kernel
/// that may carry multipath P2PDMA (with `nvme_core multipath=Y`), and is refused on an older
/// one, naming the kernel; a path over NVMe/TCP stays refused.
#[test]
fn p2pdma_multipath_head_passes_pending_the_probe_on_a_new_kernel_only() {
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true, "allow_compat_mode": false },
             "block": { "nvme": { "use_pci_p2pdma": true } } }"#,
    )
    .write("proc/kallsyms", "0000000000000000 D p2pdma_pgmap_ops\n");
    p2pdma_host(&h);
    multipath_head(&h);
    h.write("sys/module/nvme_core/parameters/multipath", "Y\n")
        .write("proc/sys/kernel/osrelease", "7.2.0\n");
    let doctor = || {
        let mut r = Report::new(node_checks(&h.paths, Backend::Nvme));
        r.extend(volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/mp")));
        r
    };
    let r = doctor();
    assert!(r.ready(), "{}", r.to_text());
    let s = r.get("volume.block_stack").unwrap();
    assert!(
        s.evidence
            .contains("nvme0n1 (nvme multipath head, transport pcie)"),
        "{}",
        s.evidence
    );
    let p = r.get("volume.p2pdma").unwrap();
    assert!(
        p.summary.contains("the strict cuFile probe decides"),
        "{p:#?}"
    );
    assert!(
        p.evidence.contains(
            "nvme0n1 is an nvme-multipath head over pcie and kernel 7.2.0 may carry multipath \
             P2PDMA"
        ),
        "{}",
        p.evidence
    );

    h.write("proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
    let r = doctor();
    let p = r.get("volume.p2pdma").unwrap();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
    assert!(
        p.summary.contains(
            "nvme0n1 is an nvme-multipath head and kernel 6.8.0-45-generic predates multipath \
             P2PDMA"
        ),
        "{}",
        p.summary
    );
    assert!(remedy(p).contains("nvme_core multipath=N"), "{}", remedy(p));
    assert!(!r.ready());

    h.write("proc/sys/kernel/osrelease", "7.2.0\n").write(
        "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0/transport",
        "tcp\n",
    );
    let p = get(
        &volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/mp")),
        "volume.p2pdma",
    )
    .clone();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
    assert!(
        p.evidence.contains("nvme0n1 is NVMe over tcp"),
        "{}",
        p.evidence
    );
}

/// Each passthrough/off argument the IOMMU check documents is enough on its own; without one
/// an active IOMMU is a warning, and without IOMMU units there is nothing to pass through.
#[test]
fn iommu_each_documented_argument_alone_passes() {
    let h = Host::new();
    h.write("proc/cmdline", "ro iommu=pt\n");
    let iommu = |h: &Host| get(&node_checks(&h.paths, Backend::Nvme), "iommu").clone();
    assert_eq!(iommu(&h).status, Status::Pass, "no IOMMU units");
    h.mkdir("sys/class/iommu/dmar0");
    for arg in [
        "iommu=pt",
        "iommu.passthrough=1",
        "intel_iommu=off",
        "amd_iommu=off",
    ] {
        h.write("proc/cmdline", &format!("ro quiet {arg}\n"));
        let c = iommu(&h);
        assert_eq!(c.status, Status::Pass, "{arg}: {}", c.evidence);
        assert!(c.evidence.contains("dmar0"), "{}", c.evidence);
    }
    h.write("proc/cmdline", "ro quiet iommu=on\n");
    assert_eq!(iommu(&h).status, Status::Warn);
}

/// The RDMA check names cufile.json's NFS RDMA addresses when there are some, and only then.
#[test]
fn rdma_evidence_names_the_configured_addresses() {
    let h = Host::new();
    h.nvfs_loaded("rpcrdma: 1\n")
        .mkdir("sys/class/infiniband/mlx5_0")
        .write("etc/cufile.json", CUFILE_OK);
    let ev = get(&node_checks(&h.paths, Backend::NfsRdma), "rdma.devices")
        .evidence
        .clone();
    assert!(ev.contains("mlx5_0"), "{ev}");
    assert!(!ev.contains("rdma_dev_addr_list"), "{ev}");
    h.write(
        "etc/cufile.json",
        r#"{ "fs": { "nfs": { "rdma_dev_addr_list": ["192.0.2.7", "192.0.2.8"] } } }"#,
    );
    let ev = get(&node_checks(&h.paths, Backend::NfsRdma), "rdma.devices")
        .evidence
        .clone();
    assert!(
        ev.contains("fs.nfs.rdma_dev_addr_list: 192.0.2.7 192.0.2.8"),
        "{ev}"
    );
}

/// nvidia_fs loaded but without NVMe registered, and P2PDMA not available either: the
/// P2PDMA check is a failure naming what is missing, not "not used (nvidia_fs path is
/// ready)" because some other nvidia_fs check passed.
#[test]
fn p2pdma_fails_when_only_other_nvidia_fs_checks_pass() {
    let h = Host::new();
    h.nvfs_loaded("wekafsio: 1\n")
        .write("etc/cufile.json", CUFILE_OK)
        .write("proc/sys/kernel/osrelease", "5.15.0\n");
    let c = node_checks(&h.paths, Backend::Nvme);
    assert_eq!(get(&c, "nvidia_fs.module").status, Status::Pass);
    assert_eq!(get(&c, "nvidia_fs.storage_driver").status, Status::Fail);
    let p = get(&c, "nvme.p2pdma");
    assert_eq!(p.status, Status::Fail, "{}", p.evidence);
    assert!(p.evidence.contains("missing"), "{}", p.evidence);
}

/// cufile.json's evidence line shows each key's value, and "unset" for an absent one.
#[test]
fn cufile_config_evidence_shows_set_and_unset_keys() {
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "allow_compat_mode": false, "use_poll_mode": true } }"#,
    );
    let ev = get(&node_checks(&h.paths, Backend::Nvme), "cufile.config")
        .evidence
        .clone();
    for want in [
        "allow_compat_mode=false",
        "force_compat_mode=unset",
        "use_pci_p2pdma=unset",
        "use_poll_mode=true",
    ] {
        assert!(ev.contains(want), "{want} in {ev}");
    }
}

/// Only `nvidia-fs<N>` (nvidia-fs0 .. nvidia-fs15) are nvidia-fs's device nodes: a bare
/// `nvidia-fs` or another suffix is not one.
#[test]
fn device_nodes_are_nvidia_fs_and_a_number() {
    let h = Host::new();
    h.nvfs_loaded("nvme: 1\n")
        .write("dev/nvidia-fs", "")
        .write("dev/nvidia-fsctl", "");
    let c = node_checks(&h.paths, Backend::Nvme);
    let d = get(&c, "nvidia_fs.devices");
    assert_eq!(d.status, Status::Pass);
    assert!(
        d.evidence.starts_with("nvidia-fs0 nvidia-fs1 in "),
        "{}",
        d.evidence
    );
}

/// An NVMe-oF/RDMA volume while nvidia_fs registers only the PCIe driver (read with a device
/// held open, as cuFile sees it): a failure naming nvme_rdma.
#[test]
fn nvme_of_volume_fails_without_nvme_rdma_registered() {
    let h = nvme_volume("302 29 259:1 / /mnt/vol rw - xfs /dev/nvme0n1p1 rw", true);
    h.write(
        "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0/transport",
        "rdma\n",
    );
    let _d = double(&h, &["nvme"], false);
    let c = volume_checks(&h.paths, Backend::Nvme, Path::new("/mnt/vol"));
    let t = get(&c, "volume.nvme_transport");
    assert_eq!(t.status, Status::Fail, "{t:#?}");
    assert!(
        t.evidence.contains("nvme_rdma is not registered"),
        "{}",
        t.evidence
    );
}

/// Every check a doctor run can print, each reached below with its pass and a non-pass outcome.
const CHECK_IDS: [&str; 21] = [
    "nvidia_fs.module",
    "nvidia_fs.devices",
    "nvidia_fs.storage_driver",
    "nvme.p2pdma",
    "cufile.config",
    "cufile.force_compat",
    "cufile.allow_compat",
    "cufile.denylist_drivers",
    "iommu",
    "rdma.devices",
    "volume.mount",
    "volume.filesystem",
    "volume.denylist",
    "volume.block_stack",
    "volume.nvme_transport",
    "volume.p2pdma",
    "volume.udev",
    "volume.md_members",
    "volume.md_udev",
    "volume.md_udev_rule",
    "cufile.probe",
];

/// A probe outcome as the child reports it, with only `status` and `mode` set.
fn probe_outcome(status: &str, mode: &str) -> gds_check::ProbeOutcome {
    serde_json::from_value(serde_json::json!({
        "status": status, "mode": mode, "detail": "fixture", "backend": "nvme",
        "strict": false, "elapsed_ms": 0, "log_tail": [],
    }))
    .unwrap()
}

/// The lines of every outcome the fixtures of this file reach, check by check.
fn lines_of_every_outcome() -> Vec<Check> {
    let mut lines = Vec::new();
    let node = |h: &Host, b: Backend| node_checks(&h.paths, b);
    let vol = |h: &Host, b: Backend, at: &str| volume_checks(&h.paths, b, Path::new(at));

    // nvidia_fs ready with NVMe registered; an IOMMU in passthrough.
    let h = Host::new();
    h.nvfs_loaded("nvme: 1\n")
        .write("etc/cufile.json", CUFILE_OK)
        .mkdir("sys/class/iommu/dmar0")
        .write("proc/cmdline", "ro iommu=pt\n");
    lines.extend(node(&h, Backend::Nvme));
    // Neither nvidia_fs nor P2PDMA; an IOMMU translating; no RDMA device.
    h.write("proc/cmdline", "ro\n");
    fs::remove_dir_all(h.root.join("sys/module/nvidia_fs")).unwrap();
    lines.extend(node(&h, Backend::Nvme));
    lines.extend(node(&h, Backend::NfsRdma));
    // nvidia_fs loaded, but no device node to read its registrations through.
    h.nvfs_loaded("nvme: 1\n");
    for n in ["dev/nvidia-fs0", "dev/nvidia-fs1"] {
        fs::remove_file(h.root.join(n)).unwrap();
    }
    lines.extend(node(&h, Backend::Nvme));
    // An RDMA device.
    h.mkdir("sys/class/infiniband/mlx5_0");
    lines.extend(node(&h, Backend::NfsRdma));

    // P2PDMA mode ready: without nvidia_fs, then with it but NVMe unregistered.
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true, "allow_compat_mode": false } }"#,
    )
    .write("proc/kallsyms", "0000000000000000 D p2pdma_pgmap_ops\n");
    p2pdma_host(&h);
    lines.extend(node(&h, Backend::Nvme));
    h.nvfs_loaded("wekafsio: 1\n");
    lines.extend(node(&h, Backend::Nvme));

    // cufile.json forcing compat mode, compat fallback on, NVMe denylisted; then unset
    // fallback; then invalid; then absent.
    let h = Host::new();
    h.nvfs_loaded("nvme: 1\n").write(
        "etc/cufile.json",
        r#"{ "properties": { "force_compat_mode": true, "allow_compat_mode": true },
             "denylist": { "drivers": ["nvme"] } }"#,
    );
    lines.extend(node(&h, Backend::Nvme));
    h.write("etc/cufile.json", "{}");
    lines.extend(node(&h, Backend::Nvme));
    h.write("etc/cufile.json", "{ \"properties\": { ");
    lines.extend(node(&h, Backend::Nvme));
    fs::remove_file(h.root.join("etc/cufile.json")).unwrap();
    lines.extend(node(&h, Backend::Nvme));

    // An NVMe volume: ready; then each filesystem and mount the checks refuse.
    let h = nvme_volume(EXT4_ORDERED, true);
    lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    for mount in [
        EXT4_IMPLICIT,
        XFS,
        "100 29 259:1 / /mnt/vol rw - ext4 /dev/nvme0n1p1 rw,data=journal",
        "100 29 259:1 / /mnt/vol rw - ext4 /dev/nvme0n1p1 rw,data=writeback",
        "100 29 259:1 / /mnt/vol rw - btrfs /dev/nvme0n1p1 rw",
        "100 29 0:60 / /mnt/vol rw - nfs4 10.0.0.1:/export rw,proto=rdma",
    ] {
        h.mountinfo(&[mount]);
        lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    }
    lines.extend(vol(&h, Backend::Nvme, "/mnt/none"));
    fs::remove_file(h.root.join("proc/self/mountinfo")).unwrap();
    lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    // Its udev entry without ID_FS_USAGE, then gone; the volume denylisted, then cufile.json
    // invalid, then absent.
    let h = nvme_volume(XFS, false);
    h.write(
        "etc/cufile.json",
        r#"{ "denylist": { "mounts": ["/mnt/vol"] } }"#,
    );
    lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    fs::remove_file(h.root.join("run/udev/data/b259:1")).unwrap();
    h.write("etc/cufile.json", "{ \"denylist\": ");
    lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    fs::remove_file(h.root.join("etc/cufile.json")).unwrap();
    lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    // NVMe over TCP (no GDS path), then NVMe-oF over RDMA with only `nvme` registered.
    let ctrl = "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0/transport";
    for transport in ["tcp\n", "rdma\n"] {
        h.write(ctrl, transport);
        lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    }

    // A loop device, device-mapper, md RAID1, tmpfs.
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK)
        .nvme_disk("pcie")
        .write(
            "sys/devices/virtual/block/loop0/loop/backing_file",
            "/var/img\n",
        )
        .link("sys/dev/block/7:0", "../../devices/virtual/block/loop0")
        .write("sys/devices/virtual/block/dm-0/dm/name", "vg-lv\n")
        .link(
            "sys/devices/virtual/block/dm-0/slaves/nvme0n1p1",
            "../../../../pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1/nvme0n1p1",
        )
        .link("sys/dev/block/253:0", "../../devices/virtual/block/dm-0")
        .write("sys/devices/virtual/block/md1/md/level", "raid1\n")
        .link("sys/dev/block/9:1", "../../devices/virtual/block/md1")
        .mountinfo(&[
            "400 29 7:0 / /mnt/loop rw - ext4 /dev/loop0 rw,data=ordered",
            "300 29 253:0 / /mnt/lvm rw - xfs /dev/mapper/vg-lv rw",
            "302 29 9:1 / /mnt/md1 rw - xfs /dev/md1 rw",
            "200 29 0:55 / /mnt/tmp rw - tmpfs tmpfs rw",
        ]);
    for at in ["/mnt/loop", "/mnt/lvm", "/mnt/md1", "/mnt/tmp"] {
        lines.extend(vol(&h, Backend::Nvme, at));
    }

    // NFS: over RDMA, over TCP, and a local filesystem where NFS should be.
    let h = Host::new();
    h.write("etc/cufile.json", CUFILE_OK).mountinfo(&[
        "500 29 0:60 / /mnt/nfs rw - nfs4 10.0.0.1:/export rw,vers=4.1,proto=rdma,port=20049",
        "501 29 0:61 / /mnt/tcp rw - nfs4 10.0.0.1:/export rw,vers=4.1,proto=tcp,port=0",
        "502 29 0:62 / /mnt/tmp rw - tmpfs tmpfs rw",
    ]);
    for at in ["/mnt/nfs", "/mnt/tcp", "/mnt/tmp"] {
        lines.extend(vol(&h, Backend::NfsRdma, at));
    }

    // P2PDMA mode: one NVMe namespace over PCIe, then md RAID0.
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true } }"#,
    )
    .nvme_disk("pcie")
    .write("sys/devices/virtual/block/md0/md/level", "raid0\n")
    .link(
        "sys/devices/virtual/block/md0/slaves/nvme0n1",
        "../../../../pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1",
    )
    .link("sys/dev/block/9:0", "../../devices/virtual/block/md0")
    .mountinfo(&[
        "301 29 9:0 / /mnt/md0 rw - xfs /dev/md0 rw",
        "302 29 259:1 / /mnt/vol rw - xfs /dev/nvme0n1p1 rw",
    ])
    .udev("9:0", true)
    .udev("259:1", true);
    lines.extend(vol(&h, Backend::Nvme, "/mnt/vol"));
    lines.extend(vol(&h, Backend::Nvme, "/mnt/md0"));
    // ... and md RAID0 pending the probe: a kernel that may carry md P2PDMA, the RAID key.
    h.write("proc/sys/kernel/osrelease", "7.2.0\n").write(
        "etc/cufile.json",
        r#"{ "properties": { "use_pci_p2pdma": true },
             "block": { "raid": { "use_pci_p2pdma": true } } }"#,
    );
    lines.extend(vol(&h, Backend::Nvme, "/mnt/md0"));

    // md RAID0: members exported by NVIDIA's rule; then mdadm's stock rule; then no rule and
    // a SATA member; then no rules directory at all.
    let (h, p, blkid_only) = md0_over_two_namespaces();
    let rules = "etc/udev/rules.d/63-md-raid-arrays.rules";
    h.md_rule_keys("9:0", "raid0", &["nvme0n1", "nvme1n1"])
        .write(
            rules,
            "IMPORT{program}=\"/sbin/mdadm --detail --export $devnode\"\n",
        );
    lines.extend(vol(&h, Backend::Nvme, "/mnt/md0"));
    fs::write(
        &p,
        format!("{blkid_only}E:MD_LEVEL=raid0\nE:MD_DEVICES=2\n"),
    )
    .unwrap();
    h.write(
        rules,
        "IMPORT{program}=\"/sbin/mdadm --detail --no-devices --export $devnode\"\n",
    );
    lines.extend(vol(&h, Backend::Nvme, "/mnt/md0"));
    h.write(rules, "# masked\n")
        .write("sys/devices/pci0000:00/0000:00:17.0/ata1/sda/dev", "8:0\n")
        .link(
            "sys/devices/virtual/block/md0/slaves/sda",
            "../../../../pci0000:00/0000:00:17.0/ata1/sda",
        );
    lines.extend(vol(&h, Backend::Nvme, "/mnt/md0"));
    fs::remove_dir_all(h.root.join("etc/udev")).unwrap();
    lines.extend(vol(&h, Backend::Nvme, "/mnt/md0"));

    // The probe: every status, and each mode of a completed run.
    for (status, mode) in [
        ("completed", "true_gds"),
        ("completed", "compat"),
        ("completed", "unavailable"),
        ("completed", "unknown"),
        ("library_missing", "unknown"),
        ("symbol_missing", "unknown"),
        ("file_error", "unknown"),
        ("bad_args", "unknown"),
        ("timed_out", "unknown"),
        ("crashed", "unknown"),
        ("spawn_failed", "unknown"),
        ("no_output", "unknown"),
    ] {
        let o = probe_outcome(status, mode);
        lines.push(gds_check::probe_check(&o));
        lines.push(gds_check::probe_check_required(&o));
    }
    lines
}

/// A Warn, Fail or N/A line that reads like the pass would hide the problem: every line says
/// what was found. Checked on the summary the text report prints and the JSON carries.
#[test]
fn every_non_pass_line_states_what_was_found() {
    let lines = lines_of_every_outcome();
    for id in CHECK_IDS {
        let of = |pass: bool| -> Vec<&Check> {
            lines
                .iter()
                .filter(|c| c.id == id && (c.status == Status::Pass) == pass)
                .collect()
        };
        let (passes, others) = (of(true), of(false));
        assert!(!passes.is_empty(), "{id}: no fixture passes it");
        assert!(
            !others.is_empty(),
            "{id}: no fixture makes it other than pass"
        );
        for p in &passes {
            for o in &others {
                assert!(
                    !o.summary.contains(&p.summary) && !p.summary.contains(&o.summary),
                    "{id}: the {:?} line {:?} reads as the pass line {:?}",
                    o.status,
                    o.summary,
                    p.summary
                );
            }
        }
    }
    let unknown: Vec<&str> = lines
        .iter()
        .map(|c| c.id)
        .filter(|id| !CHECK_IDS.contains(id))
        .collect();
    assert!(
        unknown.is_empty(),
        "checks this test does not cover: {unknown:?}"
    );

    let report = Report::new(lines);
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    let text = report.to_text();
    for (c, j) in report.checks.iter().zip(json["checks"].as_array().unwrap()) {
        assert_eq!(j["summary"], c.summary.as_str(), "{c:?}");
        let line = format!("[{:<4}] {:<28} {}\n", c.status.as_str(), c.id, c.summary);
        assert!(text.contains(&line), "{line:?} not in the text report");
    }
}

#[test]
fn compat_fallback_enabled_and_a_loop_device_say_so() {
    let h = Host::new();
    h.write(
        "etc/cufile.json",
        r#"{ "properties": { "allow_compat_mode": true } }"#,
    )
    .write(
        "sys/devices/virtual/block/loop0/loop/backing_file",
        "/var/img\n",
    )
    .link("sys/dev/block/7:0", "../../devices/virtual/block/loop0")
    .mountinfo(&["400 29 7:0 / /mnt/loop rw - ext4 /dev/loop0 rw,data=ordered"])
    .udev("7:0", true);
    let mut report = Report::new(node_checks(&h.paths, Backend::Nvme));
    report.extend(volume_checks(
        &h.paths,
        Backend::Nvme,
        Path::new("/mnt/loop"),
    ));
    let text = report.to_text();
    for line in [
        "[WARN] cufile.allow_compat          compat fallback enabled (allow_compat_mode is \
         true): I/O may silently bounce through the CPU\n",
        "[WARN] volume.nvme_transport        /dev/loop0 is not an NVMe namespace: no GDS path\n",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    let summary = |id: &str| {
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["summary"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(
        summary("cufile.allow_compat"),
        "compat fallback enabled (allow_compat_mode is true): I/O may silently bounce through \
         the CPU"
    );
    assert_eq!(
        summary("volume.nvme_transport"),
        "/dev/loop0 is not an NVMe namespace: no GDS path"
    );
}
