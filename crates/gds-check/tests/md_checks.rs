//! The md RAID checks against a fixture tree laid out as the kernel lays out an md
//! RAID0 over NVMe partitions, as the stripe layout builds it. This build machine's kernel has
//! no md driver, so the tree is the honest stand-in; its shape follows drivers/md/md.c:
//! `md/level` (`level_show`), `md/array_state` (`array_state_show`), one `md/dev-<member>`
//! per member (`bind_rdev_to_array`: `kobject_add(..., "dev-%s")`) with the link `block` to
//! the member's block device and its `state` (`state_show`), and `slaves/<member>`
//! (`bd_link_disk_holder`, block/holder.c); a partition's directory lies inside its disk's
//! (block/partitions/core.c). Checked against the VM rig's Debian 6.1 kernel by the stripe
//! scenario (`/sys/block/md*/md/dev-*/block`).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use gds_check::{node_checks, volume_checks, Backend, Check, HostPaths, Report, Status};
use std::fs;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

const PCI: &str = "sys/devices/pci0000:00/0000:00:01.0/nvme";
const MD: &str = "sys/devices/virtual/block/md127";
const MNT: &str = "/var/lib/kubelet/plugins/gds/stage/stripe-1";
/// mdadm's stock line (mdadm udev-md-raid-arrays.rules:20, BINDIR expanded as Debian does).
const STOCK_RULE: &str =
    "SUBSYSTEM!=\"block\", GOTO=\"md_end\"\nKERNEL!=\"md*\", GOTO=\"md_end\"\n\
    IMPORT{program}=\"/sbin/mdadm --detail --no-devices --export $devnode\"\nLABEL=\"md_end\"\n";
/// The line NVIDIA's guide asks for ("Adding udev Rules for RAID Volumes").
const NVIDIA_RULE: &str =
    "SUBSYSTEM!=\"block\", GOTO=\"md_end\"\nKERNEL!=\"md*\", GOTO=\"md_end\"\n\
    # GDS: export the members\n\
    IMPORT{program}=\"/usr/sbin/mdadm --detail \\\n    --export $devnode\"\nLABEL=\"md_end\"\n";

struct Host {
    _dir: TempDir,
    root: PathBuf,
    paths: HostPaths,
}

impl Host {
    fn write(&self, rel: &str, text: &str) -> &Self {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
        self
    }
    fn link(&self, rel: &str, target: &str) -> &Self {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink(target, p).unwrap();
        self
    }
    fn rm(&self, rel: &str) -> &Self {
        let p = self.root.join(rel);
        let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
        self
    }

    /// NVMe controller `ctrl` on `transport` with namespace `<ctrl>n1` (dev 259:<2i>) and its
    /// partition 1 (259:<2i+1>), a member of md127 (in_sync, slot i).
    fn member(&self, i: usize, transport: &str) -> &Self {
        let ctrl = format!("nvme{i}");
        let ns = format!("{ctrl}n1");
        let part = format!("{ns}p1");
        let pdir = format!("{PCI}/{ctrl}/{ns}/{part}");
        let from_md_dev = format!("../../../../../pci0000:00/0000:00:01.0/nvme/{ctrl}/{ns}/{part}");
        self.write(
            &format!("{PCI}/{ctrl}/transport"),
            &format!("{transport}\n"),
        )
        .write(
            &format!("{PCI}/{ctrl}/{ns}/dev"),
            &format!("259:{}\n", 2 * i),
        )
        .link(&format!("{PCI}/{ctrl}/{ns}/device"), "..")
        .write(&format!("{pdir}/dev"), &format!("259:{}\n", 2 * i + 1))
        .write(&format!("{pdir}/partition"), "1\n")
        .link(
            &format!("{pdir}/holders/md127"),
            "../../../../../../../virtual/block/md127",
        )
        .link(&format!("{MD}/md/dev-{part}/block"), &from_md_dev)
        .write(&format!("{MD}/md/dev-{part}/state"), "in_sync\n")
        .write(&format!("{MD}/md/dev-{part}/slot"), &format!("{i}\n"))
        .link(&format!("{MD}/slaves/{part}"), &from_md_dev[3..])
        .write(
            &format!("run/udev/data/b259:{}", 2 * i + 1),
            "E:ID_FS_TYPE=linux_raid_member\nE:ID_FS_USAGE=raid\nE:ID_PART_ENTRY_NUMBER=1\n",
        )
    }

    /// md127's udev entry: blkid's keys, plus what `mdadm --detail --export` adds when
    /// `members` (Detail.c:252-321: MD_LEVEL, MD_DEVICES, MD_UUID, then per member
    /// MD_DEVICE_<sysfs name made alphanumeric>_ROLE/_DEV), else the stock rule's keys.
    fn md_entry(&self, members: bool) -> &Self {
        let mut t = String::from(
            "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=xfs\nE:MD_LEVEL=raid0\nE:MD_DEVICES=2\n\
             E:MD_METADATA=1.2\nE:MD_UUID=4d8bea96:08136ba8:75029197:fe2e2a4b\n",
        );
        if members {
            for i in 0..2 {
                t += &format!(
                    "E:MD_DEVICE_dev_nvme{i}n1p1_ROLE={i}\nE:MD_DEVICE_dev_nvme{i}n1p1_DEV=/dev/nvme{i}n1p1\n"
                );
            }
        }
        self.write("run/udev/data/b9:127", &t)
    }

    /// A stripe's md RAID0 `md127` (9:127) over `nvme0n1p1` and `nvme1n1p1` on PCIe, xfs
    /// mounted, nvidia_fs with `nvme` registered, NVIDIA's rule overriding mdadm's stock one.
    fn stripe() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let h = Host {
            paths: HostPaths::under(&root),
            root,
            _dir: dir,
        };
        h.write(
            "etc/cufile.json",
            r#"{ "properties": { "allow_compat_mode": false } }"#,
        )
        .write("sys/module/nvidia_fs/version", "2.28.4\n")
        .write("proc/driver/nvidia-fs/modules", "nvme: 1\nwekafsio: 1\n")
        .write("dev/nvidia-fs0", "")
        .member(0, "pcie")
        .member(1, "pcie")
        .write(&format!("{MD}/dev"), "9:127\n")
        .write(&format!("{MD}/md/level"), "raid0\n")
        .write(&format!("{MD}/md/array_state"), "clean\n")
        .write(&format!("{MD}/md/raid_disks"), "2\n")
        .write(&format!("{MD}/md/chunk_size"), "524288\n")
        .link("sys/dev/block/9:127", "../../devices/virtual/block/md127")
        .md_entry(true)
        .write("lib/udev/rules.d/63-md-raid-arrays.rules", STOCK_RULE)
        .write("etc/udev/rules.d/63-md-raid-arrays.rules", NVIDIA_RULE)
        .write(
            "proc/self/mountinfo",
            &format!("100 29 9:127 / {MNT} rw,relatime - xfs /dev/md127 rw,sunit=1024\n"),
        );
        h
    }

    fn checks(&self) -> Vec<Check> {
        volume_checks(&self.paths, Backend::Nvme, Path::new(MNT))
    }

    /// The stripe on a node without nvidia_fs, in NVMe P2PDMA mode as NVIDIA's troubleshooting
    /// guide (14) sets it up (kernel with `p2pdma_pgmap_ops`, an H200, the open modules 570,
    /// the registry keys, `nvme_core multipath=N`, `use_pci_p2pdma`), on kernel `release`,
    /// with `block.raid.use_pci_p2pdma` as `raid_key` gives it (None: absent).
    fn p2pdma_stripe(release: &str, raid_key: Option<bool>) -> Host {
        let h = Host::stripe();
        let raid = raid_key.map_or(String::new(), |v| {
            format!(r#", "block": {{ "raid": {{ "use_pci_p2pdma": {v} }} }}"#)
        });
        h.rm("sys/module/nvidia_fs")
            .rm("proc/driver/nvidia-fs")
            .rm("dev/nvidia-fs0")
            .write(
                "etc/cufile.json",
                &format!(
                    r#"{{ "properties": {{ "use_pci_p2pdma": true, "allow_compat_mode": false }}{raid} }}"#
                ),
            )
            .write("proc/sys/kernel/osrelease", &format!("{release}\n"))
            .write("proc/kallsyms", "0000000000000000 D p2pdma_pgmap_ops\n")
            .write(
                "proc/driver/nvidia/gpus/0000:18:00.0/information",
                "Model: \t\t NVIDIA H200\n",
            )
            .write(
                "proc/driver/nvidia/version",
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build\n",
            )
            .write(
                "proc/driver/nvidia/params",
                "RegistryDwords: \"RMForceStaticBar1=1;RmForceDisableIomapWC=1;\"\n",
            )
            .write("sys/module/nvme_core/parameters/multipath", "N\n");
        h
    }

    /// What a doctor run prints for the stripe: the node checks, then the volume's.
    fn doctor(&self) -> Report {
        let mut r = Report::new(node_checks(&self.paths, Backend::Nvme));
        r.extend(self.checks());
        r
    }
}

fn get(checks: &[Check], id: &str) -> Check {
    checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no check {id} in {checks:#?}"))
        .clone()
}

/// `id` fails, its evidence names `what`, and the whole report is not ready.
fn refused(h: &Host, id: &str, what: &str) -> Check {
    let c = h.checks();
    let r = Report::new(c.clone());
    let k = get(&c, id);
    assert_eq!(k.status, Status::Fail, "{k:#?}");
    assert!(k.evidence.contains(what), "{what:?} not in {}", k.evidence);
    assert!(k.remedy.as_deref().is_some_and(|r| !r.is_empty()), "{k:#?}");
    assert!(!r.ready(), "{}", r.to_text());
    k
}

#[test]
fn stripe_over_nvme_partitions_is_ready() {
    let h = Host::stripe();
    let c = h.checks();
    let r = Report::new(c.clone());
    assert!(r.ready(), "{}", r.to_text());
    let m = get(&c, "volume.md_members");
    assert!(
        m.evidence.contains(
            "nvme0n1p1 (259:1, partition of nvme0n1, state in_sync, NVMe over pcie, driver nvme registered)"
        ),
        "{}",
        m.evidence
    );
    assert!(
        m.evidence.contains("md127 (raid0, array_state clean)"),
        "{}",
        m.evidence
    );
    assert!(get(&c, "volume.block_stack")
        .evidence
        .contains("nvme1n1p1 (partition)"));
    let u = get(&c, "volume.md_udev");
    assert!(
        u.evidence.contains("nvme0n1p1 (259:1), nvme1n1p1 (259:3)"),
        "{}",
        u.evidence
    );
    let rule = get(&c, "volume.md_udev_rule");
    assert_eq!(rule.status, Status::Pass, "{rule:#?}");
    assert!(
        rule.evidence
            .contains("etc/udev/rules.d/63-md-raid-arrays.rules:4"),
        "{}",
        rule.evidence
    );
}

#[test]
fn a_level_other_than_raid0_is_refused_naming_it() {
    let h = Host::stripe();
    h.write(&format!("{MD}/md/level"), "raid1\n");
    let c = refused(&h, "volume.block_stack", "md127 is raid1 (md/level)");
    assert!(c.remedy.unwrap().contains("md RAID0"));
}

#[test]
fn a_broken_array_or_faulty_member_is_refused() {
    let h = Host::stripe();
    h.write(&format!("{MD}/md/array_state"), "broken\n");
    refused(&h, "volume.md_members", "md127 array_state is broken");
    h.write(&format!("{MD}/md/array_state"), "clean\n");
    h.write(&format!("{MD}/md/dev-nvme1n1p1/state"), "faulty\n");
    refused(&h, "volume.md_members", "member nvme1n1p1 is faulty");
}

#[test]
fn every_member_must_be_nvme_with_a_registered_driver() {
    let h = Host::stripe();
    // The driver of the members' namespaces is not registered with nvidia_fs.
    h.write(
        "proc/driver/nvidia-fs/modules",
        "nvme_rdma: 1\nwekafsio: 1\n",
    );
    let c = refused(&h, "volume.md_members", "its driver nvme is not registered");
    assert!(c.remedy.unwrap().contains("nvidia-fs/modules"));
    h.write("proc/driver/nvidia-fs/modules", "nvme: 1\nwekafsio: 1\n");

    // A member on NVMe/TCP: nvidia-fs has no DMA ops for nvme_tcp.
    h.write(&format!("{PCI}/nvme1/transport"), "tcp\n");
    refused(&h, "volume.md_members", "member nvme1n1p1 is NVMe over tcp");
    h.write(&format!("{PCI}/nvme1/transport"), "pcie\n");

    // A member that is a partition of a SATA disk.
    let sda = "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda";
    h.rm(&format!("{MD}/md/dev-nvme1n1p1"))
        .rm(&format!("{MD}/slaves/nvme1n1p1"))
        .write(&format!("{sda}/dev"), "8:0\n")
        .write(&format!("{sda}/sda1/dev"), "8:1\n")
        .write(&format!("{sda}/sda1/partition"), "1\n")
        .link(
            &format!("{MD}/md/dev-sda1/block"),
            "../../../../../pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1",
        )
        .write(&format!("{MD}/md/dev-sda1/state"), "in_sync\n");
    refused(
        &h,
        "volume.md_members",
        "member sda1 is not on an NVMe namespace",
    );
}

#[test]
fn members_come_from_md_dev_entries_and_fall_back_to_slaves() {
    let h = Host::stripe();
    // md/dev-* is the array's own list: a stale slaves/ link does not count.
    h.rm(&format!("{MD}/slaves"));
    let m = get(&h.checks(), "volume.md_members");
    assert_eq!(m.status, Status::Pass, "{m:#?}");
    assert!(m.evidence.contains("nvme1n1p1 (259:3"), "{}", m.evidence);
    // No md/dev-* entries (an older kernel): slaves/ names the members, without a state.
    let h = Host::stripe();
    h.rm(&format!("{MD}/md/dev-nvme0n1p1"))
        .rm(&format!("{MD}/md/dev-nvme1n1p1"));
    let m = get(&h.checks(), "volume.md_members");
    assert_eq!(m.status, Status::Pass, "{m:#?}");
    assert!(
        m.evidence
            .contains("nvme0n1p1 (259:1, partition of nvme0n1, NVMe over pcie"),
        "{}",
        m.evidence
    );
}

#[test]
fn the_udev_entry_must_carry_the_partition_members() {
    let h = Host::stripe();
    h.md_entry(false);
    refused(&h, "volume.md_udev", "--no-devices");
    h.md_entry(true).rm("run/udev/data/b259:3");
    refused(&h, "volume.md_udev", "member nvme1n1p1 has no udev entry");
}

#[test]
fn the_rule_nvidia_documents_must_be_installed() {
    let h = Host::stripe();
    // Only mdadm's stock rule: refused, naming the file and line, with NVIDIA's fix.
    h.rm("etc/udev/rules.d/63-md-raid-arrays.rules");
    let c = refused(
        &h,
        "volume.md_udev_rule",
        "lib/udev/rules.d/63-md-raid-arrays.rules:3: mdadm --detail --no-devices --export",
    );
    let fix = c.remedy.unwrap();
    assert!(
        fix.contains("/etc/udev/rules.d/63-md-raid-arrays.rules"),
        "{fix}"
    );
    assert!(fix.contains("mdadm --detail --export $devnode"), "{fix}");
    assert!(
        fix.contains("udevadm trigger --action=change /dev/md127"),
        "{fix}"
    );
    // NVIDIA's line in a file of another name counts too.
    h.write("etc/udev/rules.d/99-gds-raid.rules", NVIDIA_RULE);
    assert_eq!(get(&h.checks(), "volume.md_udev_rule").status, Status::Pass);
    // A masked 63-md-raid-arrays.rules (empty in /etc) and no other: nothing exports members.
    h.rm("etc/udev/rules.d/99-gds-raid.rules")
        .write("etc/udev/rules.d/63-md-raid-arrays.rules", "");
    refused(&h, "volume.md_udev_rule", "no rule in");
}

#[test]
fn invisible_rules_directories_only_warn() {
    let mut h = Host::stripe();
    h.paths.udev_rules_dirs.clear();
    let c = h.checks();
    let rule = get(&c, "volume.md_udev_rule");
    assert_eq!(rule.status, Status::Warn, "{rule:#?}");
    assert!(
        rule.evidence.contains("--udev-rules-dir"),
        "{}",
        rule.evidence
    );
    assert!(Report::new(c).ready());
    h.paths.udev_rules_dirs = vec![h.root.join("nowhere")];
    let rule = get(&h.checks(), "volume.md_udev_rule");
    assert_eq!(rule.status, Status::Warn, "{rule:#?}");
}

/// On a kernel that may pass P2PDMA through md (7.1 or newer) with `block.raid.use_pci_p2pdma`,
/// a node without nvidia_fs passes the stripe pending the cuFile probe: every node and volume
/// check passes, and the P2PDMA line says the probe decides.
#[test]
fn p2pdma_stripe_passes_pending_the_probe_with_the_raid_key_on_a_new_kernel() {
    for release in ["7.1.0", "7.2.0-rc1-generic"] {
        let h = Host::p2pdma_stripe(release, Some(true));
        let r = h.doctor();
        assert!(r.ready(), "{release}:\n{}", r.to_text());
        assert_eq!(r.get("nvme.p2pdma").unwrap().status, Status::Pass);
        let p = r.get("volume.p2pdma").unwrap();
        assert_eq!(p.status, Status::Pass, "{p:#?}");
        assert!(
            p.summary.contains("the strict cuFile probe decides"),
            "{}",
            p.summary
        );
        for want in [
            "md127 is md raid0 over NVMe",
            &format!("kernel {release} may carry md P2PDMA"),
            "block.raid.use_pci_p2pdma is true",
            "compat mode off",
        ] {
            assert!(p.evidence.contains(want), "{want:?} not in {}", p.evidence);
        }
    }
}

/// Without `block.raid.use_pci_p2pdma: true` (absent or false) the stripe is refused, and the
/// line names the key.
#[test]
fn p2pdma_stripe_fails_without_the_raid_key() {
    for key in [None, Some(false)] {
        let h = Host::p2pdma_stripe("7.2.0", key);
        let p = refused(
            &h,
            "volume.p2pdma",
            "md127 is md raid0 but cufile.json lacks",
        );
        assert!(
            p.summary.contains("block.raid.use_pci_p2pdma"),
            "{key:?}: {}",
            p.summary
        );
        let fix = p.remedy.unwrap();
        assert!(
            fix.contains(r#""raid": { "use_pci_p2pdma": true }"#),
            "{fix}"
        );
        assert!(!fix.contains("kernel 7.1"), "{fix}");
    }
}

/// On a kernel older than 7.1, or one whose release cannot be read, the stripe is refused even
/// with the key, and the line names the kernel.
#[test]
fn p2pdma_stripe_fails_on_a_kernel_without_md_p2pdma() {
    for release in ["7.0.12", "6.8.0-45-generic"] {
        let h = Host::p2pdma_stripe(release, Some(true));
        let p = refused(
            &h,
            "volume.p2pdma",
            &format!("kernel {release} predates md P2PDMA"),
        );
        assert!(
            p.summary.contains(&format!("kernel {release}")),
            "{}",
            p.summary
        );
        let fix = p.remedy.unwrap();
        assert!(fix.contains("kernel 7.1 or newer"), "{fix}");
        assert!(!fix.contains("\"raid\""), "{fix}");
    }
    let h = Host::p2pdma_stripe("7.2.0", None);
    h.rm("proc/sys/kernel/osrelease");
    refused(
        &h,
        "volume.p2pdma",
        "the kernel release is unreadable, so md P2PDMA (7.1) is not assumed and cufile.json \
         lacks",
    );
}

/// The route keys change nothing for what P2PDMA through md cannot serve: another md level,
/// a member on NVMe-oF, a member that is not NVMe.
#[test]
fn p2pdma_stripe_other_levels_and_members_still_fail() {
    let h = Host::p2pdma_stripe("7.2.0", Some(true));
    h.write(&format!("{MD}/md/level"), "raid1\n");
    refused(&h, "volume.p2pdma", "md127 is md raid1");
    refused(&h, "volume.block_stack", "md127 is raid1 (md/level)");
    h.write(&format!("{MD}/md/level"), "raid0\n")
        .write(&format!("{PCI}/nvme1/transport"), "tcp\n");
    let p = refused(&h, "volume.p2pdma", "nvme1n1 is NVMe over tcp");
    assert!(p.remedy.unwrap().contains("NVMe over PCIe"));
    h.write(&format!("{PCI}/nvme1/transport"), "pcie\n");
    let sda = "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda";
    h.rm(&format!("{MD}/md/dev-nvme1n1p1"))
        .rm(&format!("{MD}/slaves/nvme1n1p1"))
        .write(&format!("{sda}/dev"), "8:0\n")
        .write(&format!("{sda}/sda1/dev"), "8:1\n")
        .write(&format!("{sda}/sda1/partition"), "1\n")
        .link(
            &format!("{MD}/md/dev-sda1/block"),
            "../../../../../pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1",
        )
        .write(&format!("{MD}/md/dev-sda1/state"), "in_sync\n");
    refused(
        &h,
        "volume.p2pdma",
        "md127 is md raid0 but its members sda1 are not NVMe",
    );
}
