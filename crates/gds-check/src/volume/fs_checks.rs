//! What the mount itself decides: the filesystem and its options, and cufile.json's denylist.

use super::mount::{normalize, opts_string, super_opt};
use crate::node::CufileState;
use crate::parse::CufileConfig;
use crate::{Backend, Check};
use procfs_core::process::MountInfo;
use std::path::Path;

const FS_ID: &str = "volume.filesystem";

pub(super) fn filesystem_check(m: &MountInfo, backend: Backend) -> Check {
    let id = FS_ID;
    let fs = m.fs_type.as_str();
    let opts = opts_string(m);
    let ev = format!("{fs} super options: {opts}");
    let nfs = fs == "nfs" || fs == "nfs4";
    match (backend, fs) {
        (Backend::Nvme, "ext4") => ext4_check(m, ev),
        (Backend::Nvme, "xfs") => Check::pass(id, "xfs supports true GDS", ev),
        (Backend::NfsRdma, _) if nfs => nfs_check(m, ev),
        (Backend::Nvme, _) if nfs => Check::fail(
            id,
            "an NFS mount where an NVMe volume should be",
            format!("{ev}: an NFS mount on an NVMe volume"),
            "format the NVMe volume with xfs or ext4 (data=ordered)",
        ),
        (Backend::NfsRdma, _) => Check::fail(
            id,
            format!("{fs} where an NFS over RDMA volume should be"),
            format!("{ev}: not NFS, but the volume's backend is NFS over RDMA"),
            "mount the NFS export with -o rdma,port=20049",
        ),
        (Backend::Nvme, _) => Check::fail(
            id,
            format!("{fs} gets compat mode only, no true GDS"),
            format!("{ev}: {fs} gets compat mode only"),
            "use xfs, or ext4 mounted with -o data=ordered",
        ),
    }
}

fn ext4_check(m: &MountInfo, ev: String) -> Check {
    let id = FS_ID;
    match super_opt(m, "data") {
        Some(Some("ordered")) => Check::pass(id, "ext4 with data=ordered supports true GDS", ev),
        Some(Some("journal")) => Check::fail(
            id,
            "ext4 with data=journal: no O_DIRECT, no GDS",
            format!("{ev}: data=journal disables O_DIRECT"),
            "mount with -o data=ordered",
        ),
        Some(Some(other)) => Check::fail(
            id,
            format!("ext4 with data={other}: not supported by GDS"),
            format!("{ev}: data={other} is not supported by GDS"),
            "mount with -o data=ordered",
        ),
        _ => Check::fail(
            id,
            "ext4 without an explicit data=ordered: not supported by GDS",
            format!("{ev}: data=ordered is not set explicitly (GDS requires it)"),
            "mount with -o data=ordered",
        ),
    }
}

fn nfs_check(m: &MountInfo, ev: String) -> Check {
    let proto = super_opt(m, "proto").flatten();
    let rdma = matches!(proto, Some("rdma") | Some("rdma6")) || super_opt(m, "rdma").is_some();
    if rdma {
        return Check::pass(FS_ID, "NFS over RDMA supports true GDS", ev);
    }
    let over = proto.unwrap_or("an unknown transport");
    Check::fail(
        FS_ID,
        format!("NFS over {over}, not RDMA: compat mode only"),
        format!("{ev}: NFS over {over} is compat mode only"),
        "mount with -o rdma,port=20049 (server: `echo \"rdma 20049\" > \
         /proc/fs/nfsd/portlist`)",
    )
}

pub(super) fn denylist_check(
    cfg: &CufileState,
    m: &MountInfo,
    mp: &str,
    requested: &Path,
    dev_name: Option<&str>,
) -> Check {
    let id = "volume.denylist";
    let c = match cfg {
        CufileState::Ok(c) => c,
        CufileState::Missing(e) => {
            return Check::na(
                id,
                "no cufile.json, so no denylist",
                format!("no cufile.json: {e}"),
            )
        }
        CufileState::Invalid(e) => {
            return Check::warn(
                id,
                "denylist not checked: cufile.json is invalid",
                format!("cannot evaluate: {e}"),
                "fix cufile.json",
            )
        }
    };
    let hits = denylist_hits(c, m, mp, requested, dev_name);
    if hits.is_empty() {
        Check::pass(
            id,
            "volume not denylisted in cufile.json",
            format!(
                "mount {mp}, device {}, filesystem {} not listed",
                dev_name.or(m.mount_source.as_deref()).unwrap_or("none"),
                m.fs_type
            ),
        )
    } else {
        Check::fail(
            id,
            "volume denylisted in cufile.json: cuFile disables GDS for it",
            format!(
                "{}: cuFile disables GDS for it (IO_DISABLED)",
                hits.join("; ")
            ),
            "remove the entry from the denylist section of cufile.json",
        )
    }
}

/// Each denylist entry that names this mount, its device or its filesystem.
fn denylist_hits(
    c: &CufileConfig,
    m: &MountInfo,
    mp: &str,
    requested: &Path,
    dev_name: Option<&str>,
) -> Vec<String> {
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
    hits
}
