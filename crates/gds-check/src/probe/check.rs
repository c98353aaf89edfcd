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
    let title = "cuFile gives this volume true GDS";
    let ev = o.summary();
    match (o.status, o.mode) {
        (ProbeStatus::Completed, GdsMode::TrueGds) => Check::pass(id, title, ev),
        (ProbeStatus::Completed, GdsMode::Compat) => {
            let r = "fix the failing node and volume checks (nvidia_fs registration, mount \
                     options, udev); until then cuFile reads through POSIX bounce buffers";
            if required {
                Check::fail(id, title, ev, r)
            } else {
                Check::warn(id, title, ev, r)
            }
        }
        (ProbeStatus::LibraryMissing, _) | (ProbeStatus::SymbolMissing, _) => Check::fail(
            id,
            title,
            ev,
            "install libcufile (CUDA GDS packages or the nvidia-cufile wheel) or pass its path",
        ),
        (ProbeStatus::TimedOut, _) => Check::fail(
            id,
            title,
            ev,
            "cuFile hung (seen in cuFileDriverOpen without a working GPU driver): check \
             nvidia-smi, the NVIDIA driver and nvidia_fs",
        ),
        (ProbeStatus::Crashed, _) => Check::fail(
            id,
            title,
            ev,
            "libcufile crashed: check that its version matches the NVIDIA driver and nvidia_fs",
        ),
        _ => Check::fail(
            id,
            title,
            ev,
            "see the error code: 5027 usually means no udev data for the device, 5034 a \
             denylist entry, 5001 nvidia_fs missing with compat mode off",
        ),
    }
}
