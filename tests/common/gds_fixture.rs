//! Fixture host trees for the GDS gate and doctor tests: the files the checks read, laid out as on a real
//! node, under a directory the caller owns, and a stand-in probe child.
//! Moved out of the product (`gds_gate::fixture`): test support only.

use std::fs;
use std::path::{Path, PathBuf};

use gds_check::HostPaths;

pub const CUFILE_STRICT: &str = r#"{
    // as NVIDIA ships it, with compat mode off
    "logging": { "level": "ERROR" },
    "properties": { "allow_compat_mode": false, "max_direct_io_size_kb": 16384 },
    "denylist": { "drivers": [], "devices": [], "mounts": [], "filesystems": [] }
}"#;

pub struct Tree {
    pub root: PathBuf,
    pub paths: HostPaths,
}

impl Tree {
    pub fn new(root: &Path) -> Tree {
        for d in ["proc/self", "sys/module", "dev", "run/udev/data", "etc"] {
            fs::create_dir_all(root.join(d)).expect("fixture dir");
        }
        Tree {
            root: root.to_path_buf(),
            paths: HostPaths::under(root),
        }
    }

    /// A GPU node with nvidia_fs loaded (`modules`: the drivers registered with it, as
    /// /proc/driver/nvidia-fs/modules lists them) and the NVMe volume 259:0 mounted at
    /// `mount_point` (`udev`: whether udev's database has its filesystem entry).
    pub fn gpu_nvme(root: &Path, modules: &str, mount_point: &Path, udev: bool) -> Tree {
        let t = Tree::new(root);
        t.gpu_node()
            .nvidia_fs(modules)
            .nvme_volume(mount_point, udev);
        t
    }

    pub fn write(&self, rel: &str, text: &str) -> &Self {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("fixture dir");
        fs::write(p, text).expect("fixture file");
        self
    }

    pub fn link(&self, rel: &str, target: &str) -> &Self {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("fixture dir");
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink(target, p).expect("fixture link");
        self
    }

    pub fn remove(&self, rel: &str) -> &Self {
        let p = self.root.join(rel);
        let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
        self
    }

    /// A GPU node with cufile.json (compat off), IOMMU passthrough, kernel 5.15, and no
    /// nvidia_fs yet.
    pub fn gpu_node(&self) -> &Self {
        self.write(
            "proc/driver/nvidia/gpus/0000:18:00.0/information",
            "Model: NVIDIA H200\n",
        )
        .write("dev/nvidia0", "")
        .write("etc/cufile.json", CUFILE_STRICT)
        .write("proc/sys/kernel/osrelease", "5.15.0-100-generic\n")
        .write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro iommu=pt\n")
    }

    /// nvidia_fs loaded, with these storage drivers registered (`nvme: 1\n`, ...).
    pub fn nvidia_fs(&self, modules: &str) -> &Self {
        self.write("sys/module/nvidia_fs/version", "2.20.5\n")
            .write("proc/driver/nvidia-fs/version", "version: 2.20\n")
            .write("proc/driver/nvidia-fs/modules", modules)
            .write("dev/nvidia-fs0", "")
    }

    /// An NVMe namespace `nvme0n1` (dev 259:0, PCIe) holding an ext4 filesystem mounted at
    /// `mount_point` with `data=ordered`; `udev`: whether the udev database knows it.
    pub fn nvme_volume(&self, mount_point: &Path, udev: bool) -> &Self {
        let ctrl = "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0";
        self.write(&format!("{ctrl}/transport"), "pcie\n")
            .write(&format!("{ctrl}/nvme0n1/dev"), "259:0\n")
            .write(&format!("{ctrl}/nvme0n1/size"), "2097152\n")
            .link(&format!("{ctrl}/nvme0n1/device"), "..")
            .link(
                "sys/dev/block/259:0",
                "../../devices/pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1",
            )
            .mountinfo(&format!(
                "100 29 259:0 / {} rw,relatime shared:50 - ext4 /dev/nvme0n1 rw,data=ordered",
                mount_point.display()
            ));
        if udev {
            self.write(
                "run/udev/data/b259:0",
                "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:ID_FS_UUID=5e1f1a4c-0000-4000-8000-000000000001\n",
            );
        } else {
            self.remove("run/udev/data/b259:0");
        }
        self
    }

    /// Partition 1 of the PCIe namespace `nvme0n1`, `nvme0n1p1` (dev 259:1), as the
    /// partition layout carves it: ext4 mounted at `mount_point` with `data=ordered`;
    /// `udev`: whether the udev database has the partition's entry (`b259:1`).
    pub fn nvme_partition_volume(&self, mount_point: &Path, udev: bool) -> &Self {
        let ctrl = "sys/devices/pci0000:00/0000:00:01.0/nvme/nvme0";
        let part = format!("{ctrl}/nvme0n1/nvme0n1p1");
        self.write(&format!("{ctrl}/transport"), "pcie\n")
            .write(&format!("{ctrl}/nvme0n1/dev"), "259:0\n")
            .link(&format!("{ctrl}/nvme0n1/device"), "..")
            .write(&format!("{part}/dev"), "259:1\n")
            .write(&format!("{part}/partition"), "1\n")
            .write(&format!("{part}/start"), "2048\n")
            .link(
                "sys/dev/block/259:1",
                "../../devices/pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1/nvme0n1p1",
            )
            .mountinfo(&format!(
                "100 29 259:1 / {} rw,relatime shared:50 - ext4 /dev/nvme0n1p1 rw,data=ordered",
                mount_point.display()
            ));
        self.udev_entry("259:1", udev)
    }

    /// Partition 1 of the loop device `loop0`, `loop0p1` (dev 259:5: loop partitions get
    /// minors of the extended major), ext4 mounted at `mount_point`, with its udev entry.
    pub fn loop_partition_volume(&self, mount_point: &Path) -> &Self {
        let dir = "sys/devices/virtual/block/loop0";
        self.write(&format!("{dir}/loop/backing_file"), "/var/img\n")
            .write(&format!("{dir}/dev"), "7:0\n")
            .write(&format!("{dir}/loop0p1/dev"), "259:5\n")
            .write(&format!("{dir}/loop0p1/partition"), "1\n")
            .link(
                "sys/dev/block/259:5",
                "../../devices/virtual/block/loop0/loop0p1",
            )
            .mountinfo(&format!(
                "100 29 259:5 / {} rw,relatime shared:50 - ext4 /dev/loop0p1 rw,data=ordered",
                mount_point.display()
            ));
        self.udev_entry("259:5", true)
    }

    fn udev_entry(&self, majmin: &str, present: bool) -> &Self {
        let rel = format!("run/udev/data/b{majmin}");
        if present {
            self.write(
                &rel,
                "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:ID_PART_ENTRY_NUMBER=1\n\
                 E:ID_FS_UUID=5e1f1a4c-0000-4000-8000-000000000002\n",
            )
        } else {
            self.remove(&rel)
        }
    }

    /// md RAID0 `md0` (dev 9:0) over partition 1 of the PCIe namespaces `nvme0n1` and
    /// `nvme1n1` (`nvme0n1p1` 259:1, `nvme1n1p1` 259:3), as the stripe layout builds it, ext4
    /// mounted at `mount_point` with `data=ordered`; every device has its udev entry. Laid out
    /// as drivers/md/md.c shows an array: `md/level`, `md/array_state`, `md/dev-<member>/block`
    /// and `state` (`bind_rdev_to_array`), and `slaves/` (`bd_link_disk_holder`). `rule`: the
    /// host has NVIDIA's udev rule for RAID volumes (`mdadm --detail --export`, in
    /// /etc/udev/rules.d over mdadm's stock file) and the array's entry carries the members as
    /// it exports them; else only mdadm's stock rule (`--no-devices`: level and count, no
    /// members).
    pub fn md_volume(&self, mount_point: &Path, rule: bool) -> &Self {
        let pci = "sys/devices/pci0000:00/0000:00:01.0/nvme";
        let md = "sys/devices/virtual/block/md0";
        for (i, ctrl) in ["nvme0", "nvme1"].iter().enumerate() {
            let (ns, part) = (format!("{ctrl}n1"), format!("{ctrl}n1p1"));
            let from_md = format!("../../../../../pci0000:00/0000:00:01.0/nvme/{ctrl}/{ns}/{part}");
            let pdir = format!("{pci}/{ctrl}/{ns}/{part}");
            self.write(&format!("{pci}/{ctrl}/transport"), "pcie\n")
                .write(
                    &format!("{pci}/{ctrl}/{ns}/dev"),
                    &format!("259:{}\n", 2 * i),
                )
                .link(&format!("{pci}/{ctrl}/{ns}/device"), "..")
                .write(&format!("{pdir}/dev"), &format!("259:{}\n", 2 * i + 1))
                .write(&format!("{pdir}/partition"), "1\n")
                .link(&format!("{md}/md/dev-{part}/block"), &from_md)
                .write(&format!("{md}/md/dev-{part}/state"), "in_sync\n")
                .link(&format!("{md}/slaves/{part}"), &from_md[3..])
                .write(
                    &format!("run/udev/data/b259:{}", 2 * i + 1),
                    "E:ID_FS_TYPE=linux_raid_member\nE:ID_FS_USAGE=raid\n",
                );
        }
        let mut entry = String::from(
            "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:MD_LEVEL=raid0\nE:MD_DEVICES=2\n\
             E:MD_METADATA=1.2\nE:MD_UUID=4d8bea96:08136ba8:75029197:fe2e2a4b\n",
        );
        let stock = "KERNEL!=\"md*\", GOTO=\"md_end\"\n\
                     IMPORT{program}=\"/sbin/mdadm --detail --no-devices --export $devnode\"\n\
                     LABEL=\"md_end\"\n";
        self.write("lib/udev/rules.d/63-md-raid-arrays.rules", stock);
        if rule {
            entry += "E:MD_DEVICE_dev_nvme0n1p1_ROLE=0\nE:MD_DEVICE_dev_nvme0n1p1_DEV=/dev/nvme0n1p1\n\
                      E:MD_DEVICE_dev_nvme1n1p1_ROLE=1\nE:MD_DEVICE_dev_nvme1n1p1_DEV=/dev/nvme1n1p1\n";
            self.write(
                "etc/udev/rules.d/63-md-raid-arrays.rules",
                &stock.replace(" --no-devices", ""),
            );
        } else {
            self.remove("etc/udev/rules.d/63-md-raid-arrays.rules");
        }
        self.write(&format!("{md}/md/level"), "raid0\n")
            .write(&format!("{md}/md/array_state"), "clean\n")
            .write(&format!("{md}/dev"), "9:0\n")
            .link("sys/dev/block/9:0", "../../devices/virtual/block/md0")
            .write("run/udev/data/b9:0", &entry)
            .mountinfo(&format!(
                "100 29 9:0 / {} rw,relatime shared:50 - ext4 /dev/md0 rw,data=ordered",
                mount_point.display()
            ))
    }

    pub fn mountinfo(&self, line: &str) -> &Self {
        self.write(
            "proc/self/mountinfo",
            &format!("21 1 0:20 / /proc rw,nosuid - proc proc rw\n{line}\n"),
        )
    }

    /// A stand-in for `gds-csi cufile-probe`: `/bin/sh <script>` that counts its runs and
    /// answers with a completed probe in `mode` (`true_gds` or `compat`).
    pub fn probe_stub(&self, mode: &str) -> (PathBuf, Vec<String>) {
        let supported: &[&str] = if mode == "true_gds" { &["nvme"] } else { &[] };
        let outcome = serde_json::json!({
            "status": "completed", "mode": mode,
            "detail": if mode == "true_gds" { "registered; driver has a NVMe GDS path" }
                      else { "registered, but the driver reports no NVMe GDS path: compat mode" },
            "backend": "nvme", "strict": false, "library": "libcufile.so.0",
            "library_version": 1150,
            "driver_open": { "code": 0, "name": "SUCCESS", "cu_err": 0 },
            "props": {
                "nvfs_major": 2, "nvfs_minor": 20, "poll_thresh_size": 4, "max_direct_io_size": 16384,
                "dstatusflags": if mode == "true_gds" { 16 } else { 0 }, "dcontrolflags": 0, "fflags": 15,
                "max_device_cache_size": 0, "per_buffer_cache_size": 0, "max_device_pinned_mem_size": 0,
                "max_batch_io_size": 128, "max_batch_io_timeout_msecs": 5,
                "supported": supported, "compat_allowed": mode != "true_gds", "poll_mode": false, "p2pdma": false
            },
            "file": null, "registration": { "code": 0, "name": "SUCCESS", "cu_err": 0 },
            "stage": "done", "elapsed_ms": 1, "exit_code": null, "signal": null,
            "log_tail": [], "stderr_tail": null
        });
        let answer = self.root.join(format!("probe-{mode}.json"));
        fs::write(&answer, outcome.to_string()).expect("probe answer");
        let runs = self.root.join("probe-runs");
        let script = self.root.join(format!("probe-{mode}.sh"));
        fs::write(
            &script,
            format!(
                "echo run >> '{}'\ncat '{}'\n",
                runs.display(),
                answer.display()
            ),
        )
        .expect("probe script");
        (
            "/bin/sh".into(),
            vec![script.to_string_lossy().into_owned()],
        )
    }

    /// How often the stand-in probe ran.
    pub fn probe_runs(&self) -> usize {
        fs::read_to_string(self.root.join("probe-runs")).map_or(0, |t| t.lines().count())
    }
}
