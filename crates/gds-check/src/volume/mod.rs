//! Volume-level checks: will I/O on this mounted volume get true GDS?
//!
//! `mount` finds the volume in mountinfo; `fs_checks` judges the filesystem and the denylist;
//! `stack` walks the block devices under it, `block_checks` judges them (`p2pdma`: on NVMe's
//! route without nvidia_fs); for an md array,
//! `md_members` judges its state and members, `md_udev` its udev entry and `md_rule` the udev
//! rule that writes that entry.

mod block_checks;
mod fs_checks;
mod md_members;
mod md_rule;
mod md_udev;
mod mount;
mod p2pdma;
mod stack;

use crate::node::load_cufile;
use crate::parse::unescape_mount_path;
use crate::{Backend, Check, HostPaths};
use procfs_core::process::MountInfo;
use stack::Layer;
use std::fs;
use std::path::Path;

pub fn volume_checks(paths: &HostPaths, backend: Backend, mount_point: &Path) -> Vec<Check> {
    let mounts = match mount::read_mountinfo(paths) {
        Ok(m) => m,
        Err(e) => {
            return vec![Check::fail(
                "volume.mount",
                "the mount table cannot be read",
                e,
                "make the host's /proc visible to the plugin",
            )];
        }
    };
    let Some((m, exact)) = mount::find_mount(&mounts, mount_point) else {
        return vec![Check::fail(
            "volume.mount",
            "volume is not mounted",
            format!("no mountinfo entry covers {}", mount_point.display()),
            "mount the volume before checking it",
        )];
    };
    let mp_str = unescape_mount_path(&m.mount_point.to_string_lossy());
    let source = m.mount_source.clone().unwrap_or_else(|| "none".into());
    let mut ev = format!("{} {} on {} (dev {})", m.fs_type, source, mp_str, m.majmin);
    if !exact {
        ev += &format!("; {} lies inside this mount", mount_point.display());
    }
    let mut out = vec![
        Check::pass("volume.mount", "volume is mounted", ev),
        fs_checks::filesystem_check(m, backend),
    ];
    let majmin = mount::parse_majmin(&m.majmin);
    let sysdev = paths.sys(&format!("dev/block/{}", m.majmin));
    // NFS and other virtual filesystems have anonymous major 0 and no block device.
    let block = majmin.is_some_and(|(maj, _)| maj != 0) && sysdev.exists();
    let dev_name = block
        .then(|| fs::canonicalize(&sysdev).ok())
        .flatten()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let cfg = load_cufile(paths);
    out.push(fs_checks::denylist_check(
        &cfg,
        m,
        &mp_str,
        mount_point,
        dev_name.as_deref(),
    ));
    out.extend(device_checks(paths, backend, m, &sysdev, block));
    out
}

/// The checks on what lies under the mount: the block device stack and its udev entries.
fn device_checks(
    paths: &HostPaths,
    backend: Backend,
    m: &MountInfo,
    sysdev: &Path,
    block: bool,
) -> Vec<Check> {
    if backend == Backend::NfsRdma && !block {
        let why = "NFS volume: no local block device";
        return vec![
            Check::na("volume.block_stack", why, why),
            Check::na("volume.nvme_transport", why, why),
            Check::na("volume.udev", why, why),
        ];
    }
    if !block {
        let why = format!(
            "no block device for dev {} ({})",
            m.majmin,
            sysdev.display()
        );
        return vec![Check::fail(
            "volume.block_stack",
            "no block device under the mount: no GDS path",
            why,
            "GDS on NVMe needs a filesystem on a block device",
        )];
    }
    let mut layers = Vec::new();
    stack::walk(paths, sysdev, 0, &mut layers);
    let mut out = block_checks::block_checks(paths, backend, &layers);
    out.push(block_checks::udev_check(paths, &m.majmin));
    if let Some(md) = layers.iter().find_map(|l| match l {
        Layer::Md(md) => Some(md),
        _ => None,
    }) {
        out.push(md_members::md_members_check(paths, md));
        out.push(md_udev::md_udev_check(paths, &m.majmin, md));
        out.push(md_rule::md_rule_check(paths, md));
    }
    out
}
