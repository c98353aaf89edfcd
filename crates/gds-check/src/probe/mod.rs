//! cuFile probe. libcufile is loaded with dlopen in a *child* process: `cuFileDriverOpen` has
//! been seen to hang for over 60 s on a node without a GPU, and a crash inside the library must
//! not take the CSI plugin down. The parent ([`run_probe`]) puts the child in its own process
//! group, kills the group at the deadline and always returns a [`ProbeOutcome`].
//!
//! Protocol: the child prints exactly one JSON [`ProbeOutcome`] line on stdout, and
//! `gds-probe stage: <name>` lines on stderr as it goes, so a timeout can say where it hung.
//!
//! Modules: `args` what the child is asked, `outcome` what it answers, `child` the cuFile
//! steps, `parent`/`spawn` the deadline and the compat-allowed second run, `mode` the verdict,
//! `check` the verdict as a readiness check; `ffi`, `file`, `gpu`, `strict_config`, `workdir`
//! serve the child.

mod args;
mod check;
mod child;
mod ffi;
mod file;
mod gpu;
mod mode;
mod outcome;
mod parent;
mod spawn;
mod strict_config;
mod workdir;

pub use args::ProbeArgs;
pub use check::{probe_check, probe_check_required};
pub use child::probe_child_main;
pub use ffi::error_name;
pub use file::READ_BYTES;
pub use outcome::{CuFileResult, DriverProps, GdsMode, ProbeOutcome, ProbeStatus, ReadCheck};
pub use parent::run_probe;

pub const DEFAULT_LIBRARY: &str = "libcufile.so.0";
const STAGE_PREFIX: &str = "gds-probe stage: ";
const INFO_PREFIX: &str = "gds-probe info: ";

#[cfg(test)]
mod tests {
    use super::ffi::{RawDrvProps, RawError, RawNvfs};
    use super::mode::decide_mode;
    use super::*;
    use crate::Backend;

    #[test]
    fn args_round_trip() {
        let mut a = ProbeArgs::new(Backend::NfsRdma);
        a.library = Some("/x/libcufile.so.0".into());
        a.path = Some("/mnt/v a".into());
        a.strict = true;
        assert_eq!(ProbeArgs::parse(a.to_args()).unwrap(), a);
        assert!(ProbeArgs::parse(["--bogus".to_string()]).is_err());
        assert!(ProbeArgs::parse(["--path".to_string()]).is_err());
    }

    #[test]
    fn names_and_modes() {
        assert_eq!(error_name(5027), "HANDLE_NOT_REGISTERED");
        assert_eq!(error_name(5034), "IO_DISABLED");
        assert_eq!(error_name(4242), "UNKNOWN_ERROR");
        let raw = RawDrvProps {
            nvfs: RawNvfs {
                dstatusflags: 1 << 4,
                dcontrolflags: 0x2,
                ..Default::default()
            },
            fflags: 0xf,
            ..Default::default()
        };
        let p = DriverProps::from_raw(&raw);
        assert_eq!(p.supported, ["nvme"]);
        assert!(p.compat_allowed && p.supports(Backend::Nvme) && !p.supports(Backend::NfsRdma));

        let mut o = ProbeOutcome::new(&ProbeArgs::new(Backend::Nvme), ProbeStatus::Completed, "");
        o.driver_open = Some(CuFileResult::from_raw(RawError::default()));
        o.props = Some(p.clone());
        o.registration = Some(CuFileResult::from_raw(RawError::default()));
        // Registered with compat off: the GDS path for this file.
        assert_eq!(decide_mode(&o).0, GdsMode::TrueGds);
        // Registered with compat allowed: no per-file proof, whatever the driver advertises.
        o.strict = false;
        assert_eq!(decide_mode(&o).0, GdsMode::Compat);
        // H200 without nvidia_fs: dstatusflags 0, compat allowed.
        o.props = Some(DriverProps::from_raw(&RawDrvProps {
            nvfs: RawNvfs {
                dcontrolflags: 2,
                ..Default::default()
            },
            fflags: 0xf,
            ..Default::default()
        }));
        let (m, _) = decide_mode(&o);
        assert_eq!(m, GdsMode::Compat);
        o.mode = m;
        assert_eq!(probe_check(&o).status, crate::Status::Warn);
        assert_eq!(probe_check_required(&o).status, crate::Status::Fail);
        o.registration = Some(CuFileResult::from_raw(RawError {
            err: 5027,
            cu_err: 0,
        }));
        let (m, why) = decide_mode(&o);
        assert_eq!(m, GdsMode::Unavailable);
        assert!(why.contains("5027 HANDLE_NOT_REGISTERED"), "{why}");
    }
}
