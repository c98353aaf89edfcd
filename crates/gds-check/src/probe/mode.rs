//! The verdict: which GDS mode a child's results prove, and why.

use super::{CuFileResult, GdsMode, ProbeOutcome};
use crate::Backend;

pub(super) fn decide_mode(o: &ProbeOutcome) -> (GdsMode, String) {
    let Some(open) = &o.driver_open else {
        return (GdsMode::Unknown, "driver not opened".into());
    };
    if !open.ok() {
        return (
            GdsMode::Unavailable,
            format!("cuFileDriverOpen failed: {open}"),
        );
    }
    match &o.registration {
        Some(r) => registered_mode(o, r),
        None => driver_mode(o),
    }
}

/// A file was registered (or refused): the per-file answer.
fn registered_mode(o: &ProbeOutcome, r: &CuFileResult) -> (GdsMode, String) {
    if !r.ok() {
        return (
            GdsMode::Unavailable,
            if o.strict {
                format!(
                    "compat mode off: cuFileHandleRegister failed: {r}: no GDS path for this file"
                )
            } else {
                format!("cuFileHandleRegister failed: {r}")
            },
        );
    }
    let read = o
        .read
        .as_ref()
        .map_or(String::new(), |r| format!("; {}", r.summary()));
    match &o.read {
        Some(rd) if !rd.ok() => (
            GdsMode::Unavailable,
            format!("registered, but {}", rd.summary()),
        ),
        // Compat off for this run: cuFile had to take the GDS path for this very file
        // (troubleshooting guide, API errors: CU_FILE_IO_NOT_SUPPORTED otherwise).
        _ if o.strict => (
            GdsMode::TrueGds,
            format!("registered with compat mode off{read}"),
        ),
        // With compat allowed, registration succeeds on any O_DIRECT file: it proves
        // that cuFile works, not that this file gets DMA to GPU memory.
        _ => (
            GdsMode::Compat,
            format!("registered with compat mode allowed (no per-file GDS proof){read}"),
        ),
    }
}

/// No file registered: what the driver's properties say for the backend.
fn driver_mode(o: &ProbeOutcome) -> (GdsMode, String) {
    let path_ok = o.props.as_ref().is_some_and(|p| p.supports(o.backend));
    let compat = o.props.as_ref().is_some_and(|p| p.compat_allowed);
    let what = match o.backend {
        Backend::Nvme => "NVMe",
        Backend::NfsRdma => "NFS",
    };
    if path_ok {
        (
            GdsMode::TrueGds,
            format!("driver has a {what} GDS path (no file registered)"),
        )
    } else if compat {
        (
            GdsMode::Compat,
            format!("no {what} GDS path; compat mode allowed"),
        )
    } else {
        (
            GdsMode::Unavailable,
            format!("no {what} GDS path and compat mode off"),
        )
    }
}
