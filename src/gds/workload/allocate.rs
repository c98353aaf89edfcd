//! The answer to Allocate: what the kubelet and the container runtime put into a container
//! that holds one of the resources. Built from what the host has at that moment, so a
//! node where nvidia_fs was loaded after the plugin started hands out its devices.

use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::api::{ContainerAllocateResponse, DeviceSpec, Mount};

/// Where the container finds the cufile.json of its resource.
pub const CONTAINER_CUFILE_JSON: &str = "/etc/gds-csi/cufile.json";
/// The variable libcufile reads the path of its configuration from, instead of
/// /etc/cufile.json (NVIDIA GPUDirect Storage Configuration Guide, "GPUDirect Storage
/// Parameters": "Workload/application-specific parameters can be set by using the
/// CUFILE_ENV_PATH_JSON environment variable").
pub const CUFILE_ENV: &str = "CUFILE_ENV_PATH_JSON";
/// Where libcufile looks up a block device's udev properties (`b<major>:<minor>`), inside
/// the container as on the host.
pub const CONTAINER_UDEV_DATA: &str = "/run/udev/data";
/// Device cgroup access for `/dev/nvidia-fs*`: read and write, no mknod. Read-only is not
/// enough: nvidia-fs maps its buffers only into a shared, writable mapping
/// (gds-nvidia-fs 2.28.4 src/nvfs-mmap.c:651-668 refuses a vma without
/// VM_READ|VM_WRITE|VM_MAYWRITE or VM_SHARED), and the kernel grants a shared writable
/// mapping only of a file opened for writing.
pub const NVFS_PERMISSIONS: &str = "rw";

/// The host's files one container gets; every path is the host's.
pub struct Pieces<'a> {
    /// `/dev/nvidia-fs<N>` names present on the host, e.g. `nvidia-fs0`.
    pub nvfs_devices: &'a [String],
    /// The host's udev database directory.
    pub udev_data_dir: &'a Path,
    /// The cufile.json written for the resource.
    pub cufile_json: &'a Path,
}

/// One container's answer: the nvidia-fs device nodes read-write, the udev database and
/// the cufile.json read-only, and the variable naming the file. Nothing else of the host.
pub fn container_response(p: &Pieces) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: HashMap::from([(CUFILE_ENV.to_string(), CONTAINER_CUFILE_JSON.to_string())]),
        mounts: vec![
            Mount {
                container_path: CONTAINER_UDEV_DATA.into(),
                host_path: p.udev_data_dir.to_string_lossy().into_owned(),
                read_only: true,
            },
            Mount {
                container_path: CONTAINER_CUFILE_JSON.into(),
                host_path: p.cufile_json.to_string_lossy().into_owned(),
                read_only: true,
            },
        ],
        devices: p
            .nvfs_devices
            .iter()
            .map(|name| DeviceSpec {
                container_path: format!("/dev/{name}"),
                host_path: format!("/dev/{name}"),
                permissions: NVFS_PERMISSIONS.into(),
            })
            .collect(),
        annotations: HashMap::new(),
        cdi_devices: Vec::new(),
    }
}

/// `nvidia-fs<N>`: the nodes nvidia-fs creates (src/nvfs-core.c, `device_create` with
/// DEVICE_NAME"%d"), as the container toolkit's `/dev/nvidia-fs*` finds them.
pub fn is_nvfs_name(name: &str) -> bool {
    name.strip_prefix("nvidia-fs")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The nvidia-fs character devices under `host_dev` (the host's /dev as this process
/// sees it), in their numbers' order.
pub fn nvfs_devices(host_dev: &Path) -> std::io::Result<Vec<String>> {
    let mut found: Vec<(u32, String)> = Vec::new();
    for entry in std::fs::read_dir(host_dev)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if is_nvfs_name(&name) && entry.file_type()?.is_char_device() {
            let n = name["nvidia-fs".len()..].parse().unwrap_or(u32::MAX);
            found.push((n, name));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, name)| name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numbered_nvidia_fs_nodes() {
        for name in ["nvidia-fs0", "nvidia-fs15", "nvidia-fs123"] {
            assert!(is_nvfs_name(name), "{name}");
        }
        for name in [
            "nvidia-fs",
            "nvidia0",
            "nvidiactl",
            "nvidia-fsx",
            "nvidia-fs1a",
            "nvme0n1",
        ] {
            assert!(!is_nvfs_name(name), "{name}");
        }
    }

    #[test]
    fn the_answer_holds_exactly_the_pieces_cufile_needs() {
        let devices = vec!["nvidia-fs0".to_string(), "nvidia-fs1".to_string()];
        let r = container_response(&Pieces {
            nvfs_devices: &devices,
            udev_data_dir: Path::new("/run/udev/data"),
            cufile_json: Path::new("/var/lib/gds-csi/workload/cufile-gds.json"),
        });
        assert_eq!(
            r.envs,
            HashMap::from([(
                "CUFILE_ENV_PATH_JSON".to_string(),
                "/etc/gds-csi/cufile.json".to_string()
            )])
        );
        assert_eq!(
            r.mounts,
            [
                Mount {
                    container_path: "/run/udev/data".into(),
                    host_path: "/run/udev/data".into(),
                    read_only: true
                },
                Mount {
                    container_path: "/etc/gds-csi/cufile.json".into(),
                    host_path: "/var/lib/gds-csi/workload/cufile-gds.json".into(),
                    read_only: true
                },
            ]
        );
        assert_eq!(
            r.devices,
            [
                DeviceSpec {
                    container_path: "/dev/nvidia-fs0".into(),
                    host_path: "/dev/nvidia-fs0".into(),
                    permissions: "rw".into()
                },
                DeviceSpec {
                    container_path: "/dev/nvidia-fs1".into(),
                    host_path: "/dev/nvidia-fs1".into(),
                    permissions: "rw".into()
                },
            ]
        );
        assert!(r.annotations.is_empty() && r.cdi_devices.is_empty());
    }

    /// A node without nvidia_fs: no device at all, the rest as ever.
    #[test]
    fn no_nvidia_fs_no_devices() {
        let r = container_response(&Pieces {
            nvfs_devices: &[],
            udev_data_dir: Path::new("/run/udev/data"),
            cufile_json: Path::new("/s/cufile-gds-compat.json"),
        });
        assert!(r.devices.is_empty());
        assert_eq!(r.mounts.len(), 2);
    }

    /// Regular files named like the nodes (a fixture tree) are not devices; character
    /// devices are, in their numbers' order (nvidia-fs10 after nvidia-fs2).
    #[test]
    fn the_scan_takes_character_devices_by_number() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("nvidia-fs0"), b"").unwrap();
        assert!(nvfs_devices(t.path()).unwrap().is_empty());
        let null = std::fs::metadata("/dev/null").unwrap();
        if nix::unistd::Uid::effective().is_root() {
            use std::os::unix::fs::MetadataExt;
            for n in [10, 2] {
                nix::sys::stat::mknod(
                    &t.path().join(format!("nvidia-fs{n}")),
                    nix::sys::stat::SFlag::S_IFCHR,
                    nix::sys::stat::Mode::from_bits_truncate(0o666),
                    null.rdev(),
                )
                .unwrap();
            }
            assert_eq!(
                nvfs_devices(t.path()).unwrap(),
                ["nvidia-fs2", "nvidia-fs10"]
            );
        }
    }
}
