//! Which NVMe controller a pool device sits behind, so that a stripe's members come
//! from distinct controllers: namespaces of one controller share its queues and its PCIe
//! link, so striping over them adds no bandwidth.
//!
//! From sysfs, `<sys>/dev/block/<major>:<minor>/device`:
//! - a namespace's disk is added under its controller's device (drivers/nvme/host/core.c,
//!   `nvme_alloc_ns`: `device_add_disk(ctrl->device, ns->disk, ...)`), so the link ends
//!   in `nvme<X>`, the controller;
//! - with native multipath the visible disk is the namespace head, added under its
//!   subsystem (drivers/nvme/host/multipath.c, `nvme_mpath_set_live`:
//!   `device_add_disk(&head->subsys->dev, head->disk, ...)`), so it ends in
//!   `nvme-subsys<N>`: every namespace of that subsystem shares its controllers;
//! - a SCSI or virtio disk links to its own LUN or virtio device, and a loop device
//!   has no link: each is its own controller.

use std::collections::BTreeMap;
use std::path::Path;

use crate::pool::{PoolDevice, VolumeRecord};

/// The volume-context key naming each member's controller, in array order.
pub const CONTEXT_KEY: &str = "stripeControllers";

/// A stripe volume's choice of controllers for its volume context: `nvme0,nvme2`
/// (`unknown` for a member recorded before the choice was kept).
pub fn context(rec: &VolumeRecord) -> Option<(String, String)> {
    let members = &rec.stripe.as_ref()?.members;
    let names: Vec<&str> = members
        .iter()
        .map(|m| m.controller.as_deref().unwrap_or("unknown"))
        .collect();
    Some((CONTEXT_KEY.to_owned(), names.join(",")))
}

/// The controller of `dev` as a short name: `nvme0`, `nvme-subsys1`, or the device's own
/// kernel name (`loop3`) when it has none.
pub fn controller_of(host_sys: &Path, dev: &PoolDevice) -> String {
    let node = host_sys
        .join("dev/block")
        .join(format!("{}:{}", dev.major, dev.minor));
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(c) = std::fs::canonicalize(node.join("device"))
        .ok()
        .as_deref()
        .and_then(name)
    {
        return c;
    }
    std::fs::canonicalize(&node)
        .ok()
        .as_deref()
        .and_then(name)
        .unwrap_or_else(|| dev.id.clone())
}

/// Namespaces that share a controller, for the message when too few distinct ones have
/// room: `nvme0 (nvme0n1, nvme0n2)`.
pub fn shared(devices: &[(String, &PoolDevice)]) -> Vec<String> {
    let mut by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (c, d) in devices {
        by.entry(c.as_str())
            .or_default()
            .push(d.path.display().to_string());
    }
    by.into_iter()
        .filter(|(_, ds)| ds.len() > 1)
        .map(|(c, mut ds)| {
            ds.sort(); // the same message whatever order the pool listed them in
            format!("{c} ({})", ds.join(", "))
        })
        .collect()
}

/// The largest room behind each controller: a stripe takes at most one member there.
pub fn largest_per_controller(rooms: impl IntoIterator<Item = (String, u64)>) -> Vec<u64> {
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for (c, largest) in rooms {
        let slot = by.entry(c).or_default();
        *slot = (*slot).max(largest);
    }
    by.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dev(id: &str, major: u32, minor: u32) -> PoolDevice {
        PoolDevice {
            id: id.into(),
            key: format!("path:/dev/{id}"),
            path: format!("/dev/{id}").into(),
            size_bytes: 1 << 30,
            major,
            minor,
            identity: None,
            source: crate::pool::inventory::Source::Listed,
        }
    }

    /// A sysfs tree as the kernel lays it out: two namespaces of controller nvme0, one
    /// of nvme1, a multipath head under nvme-subsys2, and a loop device.
    #[test]
    fn namespaces_are_grouped_by_the_controller_sysfs_names() {
        let sys = tempfile::tempdir().unwrap();
        let s = sys.path();
        let mk = |rel: &str| std::fs::create_dir_all(s.join(rel)).unwrap();
        let pci = "devices/pci0000:00/0000:00:04.0/nvme";
        for (ctrl, disk) in [
            ("nvme0", "nvme0n1"),
            ("nvme0", "nvme0n2"),
            ("nvme1", "nvme1n1"),
        ] {
            mk(&format!("{pci}/{ctrl}/{disk}"));
            // As the kernel links it: `<disk>/device -> ../../<controller>`.
            let link = s.join(format!("{pci}/{ctrl}/{disk}/device"));
            symlink(format!("../../{ctrl}"), link).unwrap();
        }
        mk("devices/virtual/nvme-subsystem/nvme-subsys2/nvme2n1");
        symlink(
            "../../nvme-subsys2",
            s.join("devices/virtual/nvme-subsystem/nvme-subsys2/nvme2n1/device"),
        )
        .unwrap();
        mk("devices/virtual/block/loop3");
        mk("dev/block");
        for (num, target) in [
            ("259:0", format!("{pci}/nvme0/nvme0n1")),
            ("259:1", format!("{pci}/nvme0/nvme0n2")),
            ("259:2", format!("{pci}/nvme1/nvme1n1")),
            (
                "259:3",
                "devices/virtual/nvme-subsystem/nvme-subsys2/nvme2n1".into(),
            ),
            ("7:3", "devices/virtual/block/loop3".into()),
        ] {
            symlink(s.join(target), s.join("dev/block").join(num)).unwrap();
        }
        let of = |major, minor| controller_of(s, &dev("d", major, minor));
        assert_eq!(of(259, 0), "nvme0");
        assert_eq!(of(259, 1), "nvme0");
        assert_eq!(of(259, 2), "nvme1");
        assert_eq!(of(259, 3), "nvme-subsys2");
        assert_eq!(of(7, 3), "loop3");
        // Not in sysfs at all: the pool device's own id.
        assert_eq!(of(8, 99), "d");

        let (a, b, c) = (
            dev("nvme0n1", 259, 0),
            dev("nvme0n2", 259, 1),
            dev("nvme1n1", 259, 2),
        );
        let named = [
            ("nvme0".to_owned(), &a),
            ("nvme0".to_owned(), &b),
            ("nvme1".to_owned(), &c),
        ];
        assert_eq!(shared(&named), vec!["nvme0 (/dev/nvme0n1, /dev/nvme0n2)"]);
        let per = largest_per_controller([
            ("nvme0".into(), 5),
            ("nvme0".into(), 9),
            ("nvme1".into(), 7),
        ]);
        assert_eq!(per, vec![9, 7]);
    }
}
