//! `gds-csi workload-read PATH`, run inside a workload container: what this container gives
//! cuFile (the findings of [`super::inspect`], gathered from its own `/dev`, mount table,
//! capabilities and environment), then a read of PATH into GPU memory through libcufile
//! with the container's own cufile.json, and which path that read took.
//!
//! Which path: libcufile says nothing per read, so the read runs first with compat mode off
//! (a success cannot have gone through POSIX: GDS), and only when that finds no GDS path
//! again with compat allowed (compat), each in a child process under a deadline
//! ([`gds_check::run_probe`]). A container whose cufile.json has compat mode off is told
//! that its reads fail where compat would have worked.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use gds_check::{GdsMode, ProbeStatus, Report};
use serde_json::json;

use super::inspect::{ContainerView, CufileView, DeviceNode, NodeNvfs, VolumeView};
use crate::runtime::config::WorkloadReadArgs;

/// The bit of CAP_SYS_ADMIN in /proc/self/status's CapEff (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

/// This container as cuFile will see it, with `path`'s volume; an error when its mount
/// table or `/dev` cannot be read (an empty one would read as "nothing mounted").
pub fn own_view(path: &Path) -> Result<ContainerView, String> {
    let mounts = crate::os::mount::read_table()
        .map_err(|e| format!("cannot read this container's mount table: {e}"))?;
    let at = |p: &str| mounts.iter().rev().find(|m| m.mount_point == Path::new(p));
    let devices = dev_nodes(Path::new("/dev"))
        .map_err(|e| format!("cannot list /dev in this container: {e}"))?;
    let udev = at("/run/udev/data").or_else(|| at("/run/udev"));
    let (cufile_path, from_env) = match std::env::var_os(crate::gds::workload::allocate::CUFILE_ENV)
    {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from("/etc/cufile.json"), false),
    };
    let content = std::fs::read_to_string(&cufile_path).map_err(|e| e.to_string());
    Ok(ContainerView {
        label: "this container".into(),
        devices,
        // A device cgroup cannot be read from inside; an open() of each nvidia-fs node
        // tells what it grants them, and CAP_SYS_ADMIN or the host's devtmpfs the rest.
        all_devices_allowed: false,
        host_dev_mounted: at("/dev").is_some_and(|m| m.fs_type == "devtmpfs"),
        sys_admin: capability_bits().is_some_and(|b| b & (1 << CAP_SYS_ADMIN) != 0),
        udev_mount: udev.map(|m| m.read_only()),
        cufile: CufileView {
            path: cufile_path,
            from_env,
            content,
        },
        volumes: volume_of(path, &mounts).into_iter().collect(),
    })
}

/// Character and block devices directly under `dev`; each nvidia-fs node opened read-write
/// to learn whether the device cgroup grants it.
fn dev_nodes(dev: &Path) -> std::io::Result<Vec<DeviceNode>> {
    let mut out: Vec<DeviceNode> = std::fs::read_dir(dev)?
        .flatten()
        .filter(|e| {
            e.file_type()
                .is_ok_and(|t| t.is_char_device() || t.is_block_device())
        })
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let read_write = crate::gds::workload::allocate::is_nvfs_name(&name).then(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(e.path())
                    .is_ok()
            });
            DeviceNode {
                path: format!("/dev/{name}"),
                read_write,
            }
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn capability_bits() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The mount `path` is on (the deepest whose device is the file's), as a volume.
fn volume_of(path: &Path, mounts: &[crate::os::mount::MountEntry]) -> Option<VolumeView> {
    let md = std::fs::metadata(path).ok()?;
    let (major, minor) = (
        nix::sys::stat::major(md.dev()) as u32,
        nix::sys::stat::minor(md.dev()) as u32,
    );
    let abs = std::path::absolute(path).ok()?;
    let m = mounts
        .iter()
        .filter(|m| m.is_device(major, minor) && abs.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())?;
    let block_device = (major != 0).then_some((major, minor));
    let udev_entry = block_device.map(|(a, b)| {
        let entry = Path::new(crate::gds::workload::allocate::CONTAINER_UDEV_DATA)
            .join(format!("b{a}:{b}"));
        std::fs::read_to_string(&entry).map_err(|e| format!("{}: {e}", entry.display()))
    });
    Some(VolumeView {
        destination: m.mount_point.clone(),
        name: m.source.clone().unwrap_or_else(|| m.fs_type.clone()),
        block_device,
        udev_entry,
        compat_mark: None,
    })
}

/// nvidia_fs is loaded on the node: its procfs directory (src/nvfs-core.c makes
/// /proc/driver/nvidia-fs at load) or its line in /proc/modules, both the host's in a
/// container.
fn node_nvfs_loaded() -> bool {
    Path::new("/proc/driver/nvidia-fs").is_dir()
        || std::fs::read_to_string("/proc/modules")
            .is_ok_and(|m| m.lines().any(|l| l.starts_with("nvidia_fs ")))
}

/// The path a read took, in the operator's words; `compat_works`: whether a read with compat
/// allowed worked, asked only when this container's cufile.json turns compat mode off.
pub fn path_taken(status: ProbeStatus, mode: GdsMode, compat_works: Option<bool>) -> &'static str {
    match (status, mode) {
        (ProbeStatus::Completed, GdsMode::TrueGds) => "GDS",
        (ProbeStatus::Completed, GdsMode::Compat) => {
            "compat (POSIX reads through host memory, no DMA to the GPU)"
        }
        _ if compat_works == Some(true) => {
            "none (compat mode is off in this container's cufile.json and there is no GDS path; \
             with compat allowed the read works, through host memory)"
        }
        _ => "none (cuFile cannot read this file here)",
    }
}

/// The probe of `args.path` with the library asked for and `cufile_json` (compat off first,
/// [`gds_check::run_probe`]'s default).
fn probe_args(args: &WorkloadReadArgs, cufile_json: &Path) -> gds_check::ProbeArgs {
    let mut a = gds_check::ProbeArgs::new(args.backend);
    a.library = args.cufile_library.clone();
    a.path = Some(args.path.clone());
    a.cufile_json = Some(cufile_json.to_path_buf());
    a
}

/// With compat mode off in the container and no GDS path: the read again with a copy of the
/// container's cufile.json that allows compat, to tell "no GDS path" from "cuFile does not
/// work here". The copy goes to the temp dir and is removed.
fn compat_retry(
    view: &ContainerView,
    args: &WorkloadReadArgs,
    exe: &Path,
    probe_prefix: &[String],
) -> Option<gds_check::ProbeOutcome> {
    let text = view.cufile.content.as_ref().ok()?;
    let allowed =
        crate::gds::workload::cufile::derive(Some(text), crate::gds::workload::Resource::GdsCompat)
            .ok()?;
    let file = std::env::temp_dir().join(format!("gds-csi-compat-{}.json", std::process::id()));
    std::fs::write(&file, allowed).ok()?;
    let mut a = probe_args(args, &file);
    a.strict = false;
    let o = gds_check::run_probe(exe, probe_prefix, &a, args.timeout);
    let _ = std::fs::remove_file(&file);
    Some(o)
}

/// Runs the findings and the read; the exit status: 0 when the read worked (on the GDS path
/// with `--require-gds`) and nothing failed, 1 when not, 2 when this container could not be
/// inspected.
pub fn main(args: &WorkloadReadArgs, exe: &Path, probe_prefix: &[String]) -> i32 {
    let view = match own_view(&args.path) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("workload-read: {e}");
            return 2;
        }
    };
    let report = Report::new(super::inspect::findings(
        &view,
        &NodeNvfs::Loaded(node_nvfs_loaded()),
        &args.driver.name,
    ));
    let compat_allowed = super::inspect::compat_allowed(&view);
    let read = gds_check::run_probe(
        exe,
        probe_prefix,
        &probe_args(args, &view.cufile.path),
        args.timeout,
    );
    let read_with_compat_allowed = (compat_allowed == Some(false) && found_no_gds_path(&read))
        .then(|| compat_retry(&view, args, exe, probe_prefix))
        .flatten();
    let compat_works = read_with_compat_allowed
        .as_ref()
        .map(read_went_through_compat);
    let result = ReadResult {
        path: &args.path,
        ok: read_ok(&read, compat_allowed, args.require_gds) && report.ready(),
        taken: path_taken(read.status, read.mode, compat_works),
        compat_allowed,
        report,
        read,
        read_with_compat_allowed,
    };
    let text = if args.json {
        result.json()
    } else {
        result.text()
    };
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
    i32::from(!result.ok)
}

/// The probe ran and found no GDS path (with compat mode off, no path at all).
fn found_no_gds_path(read: &gds_check::ProbeOutcome) -> bool {
    read.status == ProbeStatus::Completed && read.mode == GdsMode::Unavailable
}

/// The read with compat allowed worked, through compat.
fn read_went_through_compat(read: &gds_check::ProbeOutcome) -> bool {
    read.status == ProbeStatus::Completed
        && read.mode == GdsMode::Compat
        && read.read.as_ref().is_some_and(|r| r.ok())
}

/// The read worked on a path this container accepts: GDS, or compat where cufile.json
/// allows it and `--require-gds` is not given.
fn read_ok(
    read: &gds_check::ProbeOutcome,
    compat_allowed: Option<bool>,
    require_gds: bool,
) -> bool {
    read.status == ProbeStatus::Completed
        && match read.mode {
            GdsMode::TrueGds => true,
            GdsMode::Compat => compat_allowed != Some(false) && !require_gds,
            _ => false,
        }
}

/// What `main` reports: the reads, the path taken and the findings.
struct ReadResult<'a> {
    path: &'a Path,
    ok: bool,
    taken: &'static str,
    compat_allowed: Option<bool>,
    report: Report,
    read: gds_check::ProbeOutcome,
    read_with_compat_allowed: Option<gds_check::ProbeOutcome>,
}

impl ReadResult<'_> {
    fn json(&self) -> String {
        serde_json::to_string_pretty(&json!({
            "ok": self.ok,
            "path": self.path,
            "cufile_path": self.taken.split(' ').next(),
            "cufile_path_detail": self.taken,
            "compat_allowed": self.compat_allowed,
            "findings": self.report.checks,
            "read": self.read,
            "read_with_compat_allowed": self.read_with_compat_allowed,
        }))
        .unwrap_or_default()
            + "\n"
    }

    fn text(&self) -> String {
        let mut out = format!(
            "{}: cuFile path: {}\n  {}\n",
            self.path.display(),
            self.taken,
            self.read.summary()
        );
        if let Some(o) = &self.read_with_compat_allowed {
            out += &format!("  with compat allowed: {}\n", o.summary());
        }
        out += "\n";
        out += &super::inspect::findings_text(&self.report);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_under_dev_are_devices_only() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("nvidia-fs0"), b"").unwrap();
        std::fs::create_dir(t.path().join("pts")).unwrap();
        std::os::unix::fs::symlink("/dev/null", t.path().join("stdin")).unwrap();
        assert!(dev_nodes(t.path()).unwrap().is_empty());
        assert!(dev_nodes(&t.path().join("missing")).is_err());
        let nodes = dev_nodes(Path::new("/dev")).unwrap();
        assert!(nodes
            .iter()
            .any(|d| d.path == "/dev/null" && d.read_write.is_none()));
    }

    #[test]
    fn a_file_maps_to_its_mount() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let mounts = crate::os::mount::read_table().unwrap();
        let v = volume_of(&f, &mounts).unwrap();
        assert!(f.starts_with(&v.destination), "{v:?}");
        assert!(volume_of(&t.path().join("missing"), &mounts).is_none());
    }

    #[test]
    fn the_path_named_follows_mode_and_config() {
        let done = ProbeStatus::Completed;
        assert_eq!(path_taken(done, GdsMode::TrueGds, None), "GDS");
        assert!(path_taken(done, GdsMode::Compat, None).starts_with("compat"));
        let off = path_taken(done, GdsMode::Unavailable, Some(true));
        assert!(
            off.starts_with("none (compat mode is off") && off.contains("the read works"),
            "{off}"
        );
        assert_eq!(
            path_taken(done, GdsMode::Unavailable, Some(false)),
            "none (cuFile cannot read this file here)"
        );
        assert!(path_taken(ProbeStatus::TimedOut, GdsMode::TrueGds, None).starts_with("none"));
    }
}
