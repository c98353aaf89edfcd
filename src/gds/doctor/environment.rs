//! What the cuFile probe needs from the process's own environment, which inside the node
//! pod comes from five different places: libcufile (the image), libcuda and the
//! `/dev/nvidia*` nodes (the NVIDIA container runtime: the chart's `gds.runtimeClassName`
//! and `NVIDIA_VISIBLE_DEVICES`), the udev database (the `/run/udev` hostPath) and
//! cufile.json (the `cufile.mount` hostPath). `gds-csi doctor` names whichever is missing,
//! so an operator knows which chart value or node setting to fix.
//!
//! These are the process's own paths, not the `--host-*` views: libcuda opens
//! `/dev/nvidiactl` and `/dev/nvidia<N>` in the container's own `/dev` (the host's `/dev`
//! mounted at `/host/dev` does not help it), and libcufile reads `/run/udev/data`.

use std::path::{Path, PathBuf};

/// One piece of the probe's environment and whether it is here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub name: &'static str,
    pub present: bool,
    /// What to change when it is missing, in the node pod (the chart value).
    pub remedy: &'static str,
    /// The same on a host, outside any pod.
    pub host_remedy: &'static str,
}

/// Where to look: the process's own `/dev`, the udev data dir and cufile.json the checks
/// use, an explicit libcufile (`--cufile-library`), and the loader's search directories.
pub struct Env<'a> {
    pub dev: &'a Path,
    pub udev_data_dir: &'a Path,
    pub cufile_json: &'a Path,
    pub cufile_library: Option<&'a Path>,
    pub lib_dirs: &'a [PathBuf],
}

pub fn pieces(env: &Env) -> Vec<Piece> {
    let libcufile = match env.cufile_library {
        Some(p) => p.is_file(),
        None => on_loader_path(env.lib_dirs, "libcufile.so.0"),
    };
    vec![
        Piece {
            name: "libcufile.so.0",
            present: libcufile,
            remedy: "the gds-csi image ships it from the nvidia-cufile wheel; elsewhere pass --cufile-library",
            host_remedy: "install the GDS packages (libcufile) or pass --cufile-library",
        },
        Piece {
            name: "libcuda.so.1",
            present: on_loader_path(env.lib_dirs, "libcuda.so.1"),
            remedy: "brought by the NVIDIA container runtime: chart value \
                     gds.runtimeClassName=nvidia, NVIDIA_DRIVER_CAPABILITIES with compute",
            host_remedy: "install the NVIDIA driver",
        },
        Piece {
            name: "/dev/nvidiactl and /dev/nvidia<N>",
            present: env.dev.join("nvidiactl").exists() && has_gpu_node(env.dev),
            remedy: "made by the NVIDIA container runtime: chart values gds.runtimeClassName, \
                     gds.visibleDevices=all",
            host_remedy: "load the NVIDIA driver (nvidia-modprobe makes the nodes)",
        },
        Piece {
            name: "the udev database",
            present: dir_has_entries(env.udev_data_dir),
            remedy: "the host's /run/udev mounted read-only, as the chart does, on a host that runs udev",
            host_remedy: "run systemd-udevd",
        },
        Piece {
            name: "cufile.json",
            present: env.cufile_json.is_file(),
            remedy:
                "chart values cufile.mount=true and cufile.hostPath, the host's /etc/cufile.json",
            host_remedy: "install /etc/cufile.json (the GDS packages ship one) or set \
                          CUFILE_ENV_PATH_JSON",
        },
    ]
}

/// Where `doctor` runs, which decides which remedy fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In a pod (the node plugin's): remedies are chart values.
    Pod,
    /// On a host: remedies are packages and node settings.
    Host,
}

impl Place {
    /// A pod has the API server's service variables in its environment.
    pub fn here() -> Place {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            Place::Pod
        } else {
            Place::Host
        }
    }
}

/// One sentence naming every missing piece with the remedy that fits `place`; None when all
/// are here.
pub fn missing_note(pieces: &[Piece], place: Place) -> Option<String> {
    let missing: Vec<String> = pieces
        .iter()
        .filter(|p| !p.present)
        .map(|p| {
            let remedy = match place {
                Place::Pod => p.remedy,
                Place::Host => p.host_remedy,
            };
            format!("{} ({remedy})", p.name)
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "The cuFile probe cannot run here; missing: {}.",
            missing.join("; ")
        )
    })
}

/// The directories ld.so searches, in its order (ld.so(8)): `LD_LIBRARY_PATH`, the
/// directories configured in /etc/ld.so.conf (its include files), then the defaults.
pub fn loader_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(conf_dirs(Path::new("/etc/ld.so.conf"), 0));
    for d in [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ] {
        dirs.push(d.into());
    }
    dirs
}

fn conf_dirs(file: &Path, depth: u8) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
    {
        if let Some(pattern) = line.strip_prefix("include ") {
            // Debian's only form: `include /etc/ld.so.conf.d/*.conf`.
            if let Some(dir) = pattern.trim().strip_suffix("/*.conf") {
                if depth < 2 {
                    out.extend(included(Path::new(dir), depth));
                }
            }
        } else if line.starts_with('/') {
            out.push(line.into());
        }
    }
    out
}

fn included(dir: &Path, depth: u8) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| conf_dirs(f, depth + 1)).collect()
}

fn on_loader_path(dirs: &[PathBuf], name: &str) -> bool {
    dirs.iter().any(|d| d.join(name).exists())
}

fn has_gpu_node(dev: &Path) -> bool {
    std::fs::read_dir(dev).is_ok_and(|entries| {
        entries.filter_map(|e| e.ok()).any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.strip_prefix("nvidia")
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

fn dir_has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut e| e.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_missing_piece_and_nothing_when_all_are_there() {
        let t = tempfile::tempdir().unwrap();
        let (dev, udev, lib) = (
            t.path().join("dev"),
            t.path().join("udev"),
            t.path().join("lib"),
        );
        for d in [&dev, &udev, &lib] {
            std::fs::create_dir(d).unwrap();
        }
        let json = t.path().join("cufile.json");
        let dirs = vec![lib.clone()];
        let env = Env {
            dev: &dev,
            udev_data_dir: &udev,
            cufile_json: &json,
            cufile_library: None,
            lib_dirs: &dirs,
        };
        let note = missing_note(&pieces(&env), Place::Pod).unwrap();
        for name in [
            "libcufile.so.0",
            "libcuda.so.1",
            "/dev/nvidiactl",
            "udev",
            "cufile.json",
        ] {
            assert!(note.contains(name), "{name} not named in: {note}");
        }
        assert!(note.contains("gds.runtimeClassName"), "{note}");
        let on_host = missing_note(&pieces(&env), Place::Host).unwrap();
        assert!(
            !on_host.contains("chart value"),
            "a host has no chart: {on_host}"
        );
        assert!(on_host.contains("install the NVIDIA driver"), "{on_host}");

        std::fs::write(lib.join("libcufile.so.0"), b"").unwrap();
        std::fs::write(dev.join("nvidiactl"), b"").unwrap();
        std::fs::write(dev.join("nvidia-uvm"), b"").unwrap();
        let note = missing_note(&pieces(&env), Place::Pod).unwrap();
        assert!(!note.contains("libcufile"), "{note}");
        assert!(
            note.contains("/dev/nvidiactl"),
            "nvidia-uvm is no GPU node: {note}"
        );

        std::fs::write(lib.join("libcuda.so.1"), b"").unwrap();
        std::fs::write(dev.join("nvidia0"), b"").unwrap();
        std::fs::write(udev.join("b259:0"), b"").unwrap();
        std::fs::write(&json, b"{}").unwrap();
        assert_eq!(missing_note(&pieces(&env), Place::Pod), None);
    }

    #[test]
    fn loader_dirs_follow_ld_so_conf_includes() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("ld.so.conf.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("gds-csi-cufile.conf"), "/usr/local/lib/gds-csi\n").unwrap();
        std::fs::write(d.join("skip.txt"), "/nowhere\n").unwrap();
        let conf = t.path().join("ld.so.conf");
        std::fs::write(
            &conf,
            format!("# comment\ninclude {}/*.conf\n/opt/x\n", d.display()),
        )
        .unwrap();
        assert_eq!(
            conf_dirs(&conf, 0),
            vec![
                PathBuf::from("/usr/local/lib/gds-csi"),
                PathBuf::from("/opt/x")
            ]
        );
    }
}
