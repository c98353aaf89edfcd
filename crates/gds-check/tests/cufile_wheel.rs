//! The probe against a real libcufile, e.g. from the PyPI wheel `nvidia-cufile`
//! (tests/cufile-wheel.sh sets it up). Skipped unless GDS_CHECK_CUFILE_LIB names the library.
//!
//! On a machine without a GPU, cuFileDriverOpen has been seen to hang for over 60 s: the probe
//! must come back within its deadline with a named outcome, whatever the library does.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use gds_check::{probe_check, run_probe, Backend, ProbeArgs, ProbeStatus};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn real_libcufile_gives_a_named_outcome_within_the_deadline() {
    let Some(lib) = std::env::var_os("GDS_CHECK_CUFILE_LIB") else {
        eprintln!("GDS_CHECK_CUFILE_LIB not set: skipping");
        return;
    };
    let secs: u64 = std::env::var("GDS_CHECK_PROBE_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let strict = std::env::var("GDS_CHECK_CUFILE_STRICT").is_ok_and(|v| v == "1");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut a = ProbeArgs::new(Backend::Nvme);
    a.library = Some(PathBuf::from(lib));
    a.path = Some(dir.path().to_path_buf());
    a.strict = strict;
    let t = Instant::now();
    let o = run_probe(
        Path::new(env!("CARGO_BIN_EXE_gds-probe")),
        &[],
        &a,
        Duration::from_secs(secs),
    );
    let took = t.elapsed();
    println!("probe outcome: {}", serde_json::to_string(&o).unwrap());
    println!(
        "check: {:?}: {}",
        probe_check(&o).status,
        probe_check(&o).evidence
    );
    println!("wall time: {:.2} s (deadline {secs} s)", took.as_secs_f64());
    assert!(
        took < Duration::from_secs(secs + 5),
        "run_probe overran its deadline"
    );
    // The library must really have loaded: its version was read (by the child's answer or,
    // when a later call hung, by the info line it printed first). A missing library, a
    // missing symbol, a crash or a file error is a failure of this suite, not an outcome.
    let v = o
        .library_version
        .unwrap_or_else(|| panic!("no libcufile version read: the library did not load: {o:#?}"));
    assert!(v >= 1000, "implausible cuFileGetVersion {v}");
    match o.status {
        ProbeStatus::Completed => {
            let open = o.driver_open.as_ref().expect("driver_open recorded");
            assert!(!open.name.is_empty());
        }
        ProbeStatus::TimedOut => {
            let step = o.stage.as_deref().unwrap_or("");
            // Any step after the version was read: cuda (the read check's GPU buffer) or a
            // cuFile call.
            assert!(
                step == "cuda" || step.starts_with("cuFile"),
                "a timeout must name the step it hung in, got {step:?}: {}",
                o.detail
            );
            assert!(o.detail.contains("last step"), "{}", o.detail);
        }
        other => {
            panic!("outcome {other:?} is neither Completed nor a timeout at a named step: {o:#?}")
        }
    }
    // Nothing of the probe's (scratch file, cufile.log) is left on the volume.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
