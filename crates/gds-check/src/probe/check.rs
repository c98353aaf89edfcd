//! The probe's verdict as a readiness check.

use super::{GdsMode, ProbeOutcome, ProbeStatus};
use crate::Check;

/// The probe as a check: Pass only for true GDS. Compat mode is a Warn here; callers that
/// require true GDS (gdsPolicy=required) use [`probe_check_required`] or look at `mode`.
pub fn probe_check(outcome: &ProbeOutcome) -> Check {
    to_check(outcome, false)
}

/// Like [`probe_check`], but compat mode is a Fail.
pub fn probe_check_required(outcome: &ProbeOutcome) -> Check {
    to_check(outcome, true)
}

fn to_check(o: &ProbeOutcome, required: bool) -> Check {
    let id = "cufile.probe";
    let ev = o.summary();
    match (o.status, o.mode) {
        (ProbeStatus::Completed, GdsMode::TrueGds) => {
            Check::pass(id, "cuFile gives this volume true GDS", ev)
        }
        (ProbeStatus::Completed, GdsMode::Compat) => {
            let summary = "cuFile gives this volume compat mode only: I/O bounces through the CPU";
            let r = "fix the failing node and volume checks (nvidia_fs registration, mount \
                     options, udev); until then cuFile reads through POSIX bounce buffers";
            if required {
                Check::fail(id, summary, ev, r)
            } else {
                Check::warn(id, summary, ev, r)
            }
        }
        (ProbeStatus::LibraryMissing, _) | (ProbeStatus::SymbolMissing, _) => Check::fail(
            id,
            "libcufile not found: cuFile was not probed",
            ev,
            "install libcufile (CUDA GDS packages or the nvidia-cufile wheel) or pass its path",
        ),
        (ProbeStatus::TimedOut, _) => Check::fail(
            id,
            "the cuFile probe hung and was killed",
            ev,
            "cuFile hung (seen in cuFileDriverOpen without a working GPU driver): check \
             nvidia-smi, the NVIDIA driver and nvidia_fs",
        ),
        (ProbeStatus::Crashed, _) => Check::fail(
            id,
            "the cuFile probe crashed",
            ev,
            "libcufile crashed: check that its version matches the NVIDIA driver and nvidia_fs",
        ),
        _ => Check::fail(
            id,
            no_mode_summary(o.status),
            ev,
            "see the error code: 5027 usually means no udev data for the device, 5034 a \
             denylist entry, 5001 nvidia_fs missing with compat mode off",
        ),
    }
}

/// What a probe that found no usable mode says it found.
fn no_mode_summary(status: ProbeStatus) -> &'static str {
    match status {
        ProbeStatus::Completed => "cuFile does not work on this volume",
        ProbeStatus::FileError => "the probe cannot open the volume with O_DIRECT",
        _ => "the cuFile probe gave no answer",
    }
}
