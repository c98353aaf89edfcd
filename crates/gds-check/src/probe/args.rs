//! The child's arguments, and their round trip through argv.

use crate::Backend;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What the child is asked to do. Round-trips through argv ([`ProbeArgs::to_args`],
/// [`ProbeArgs::parse`]) so the main binary's hidden `cufile-probe` subcommand can forward it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeArgs {
    /// libcufile to dlopen; default: `libcufile.so.0` from the loader's search path.
    pub library: Option<PathBuf>,
    /// A file on the volume to register, or a directory on it (a scratch file is created there
    /// and removed). None: only open the driver and read its properties.
    pub path: Option<PathBuf>,
    pub backend: Backend,
    /// Run with compat mode off (private cufile.json with `allow_compat_mode: false`), so a
    /// successful registration cannot be a silent POSIX fallback. On by default: the only
    /// per-file answer cuFile gives (`cuFileDriverGetProperties` is driver-wide). When the
    /// strict run finds no GDS path, [`run_probe`](super::run_probe) runs a second, compat-allowed child to tell
    /// compat mode from "cuFile does not work here".
    pub strict: bool,
    /// libcuda for the read check (GPU memory); default `libcuda.so.1` from the loader path.
    pub cuda_library: Option<PathBuf>,
    /// cufile.json to start from; default `$CUFILE_ENV_PATH_JSON` or `/etc/cufile.json`.
    pub cufile_json: Option<PathBuf>,
    /// Where cufile.log (and the strict config) go; default: a fresh temp dir, removed after.
    pub work_dir: Option<PathBuf>,
}

impl ProbeArgs {
    pub fn new(backend: Backend) -> Self {
        ProbeArgs {
            library: None,
            path: None,
            backend,
            strict: true,
            cuda_library: None,
            cufile_json: None,
            work_dir: None,
        }
    }

    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec!["--backend".to_string(), self.backend.to_string()];
        let mut push = |flag: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                v.push(flag.to_string());
                v.push(p.to_string_lossy().into_owned());
            }
        };
        push("--library", &self.library);
        push("--path", &self.path);
        push("--cufile-json", &self.cufile_json);
        push("--work-dir", &self.work_dir);
        push("--cuda-library", &self.cuda_library);
        if !self.strict {
            v.push("--no-strict".to_string());
        }
        v
    }

    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Self, String> {
        let mut a = ProbeArgs::new(Backend::Nvme);
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let mut val = |f: &str| it.next().ok_or_else(|| format!("{f} needs a value"));
            match flag.as_str() {
                "--backend" => a.backend = val(&flag)?.parse()?,
                "--library" => a.library = Some(val(&flag)?.into()),
                "--path" => a.path = Some(val(&flag)?.into()),
                "--cufile-json" => a.cufile_json = Some(val(&flag)?.into()),
                "--work-dir" => a.work_dir = Some(val(&flag)?.into()),
                "--strict" => a.strict = true,
                "--no-strict" => a.strict = false,
                "--cuda-library" => a.cuda_library = Some(val(&flag)?.into()),
                other => return Err(format!("unknown probe argument {other:?}")),
            }
        }
        Ok(a)
    }
}
