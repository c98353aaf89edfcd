//! The probe's child-process handling: deadlines, crashes, missing libraries, and the FFI
//! against a fake libcufile built from tests/fake/fake_cufile.c (skipped without a C compiler).
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use gds_check::{
    probe_check, probe_check_required, run_probe, Backend, GdsMode, ProbeArgs, ProbeStatus, Status,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

const PROBE: &str = env!("CARGO_BIN_EXE_gds-probe");

fn sh(script: &str) -> (PathBuf, Vec<String>) {
    // `sh -c script sh <probe args...>`: the probe args become $1.. and are ignored.
    (
        "/bin/sh".into(),
        vec!["-c".into(), script.into(), "sh".into()],
    )
}

#[test]
fn missing_library_is_reported_not_crashed() {
    let mut a = ProbeArgs::new(Backend::Nvme);
    a.library = Some("/nonexistent/libcufile.so.0".into());
    let o = run_probe(Path::new(PROBE), &[], &a, Duration::from_secs(10));
    assert_eq!(o.status, ProbeStatus::LibraryMissing, "{o:#?}");
    assert!(o.detail.contains("/nonexistent/libcufile.so.0"));
    assert_eq!(probe_check(&o).status, Status::Fail);
}

#[test]
fn hang_is_killed_at_the_deadline_with_its_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let (exe, prefix) = sh(&format!(
        "echo 'gds-probe stage: cuFileDriverOpen' >&2; sleep 30 & echo $! > {}; wait",
        pidfile.display()
    ));
    let t = Instant::now();
    let o = run_probe(
        &exe,
        &prefix,
        &ProbeArgs::new(Backend::Nvme),
        Duration::from_millis(800),
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(o.status, ProbeStatus::TimedOut, "{o:#?}");
    assert!(
        o.detail.contains("last step: cuFileDriverOpen"),
        "{}",
        o.detail
    );
    assert_eq!(o.stage.as_deref(), Some("cuFileDriverOpen"));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // The grandchild `sleep` was in the group and must be gone (reaped by init or a zombie).
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z"),
        "grandchild still alive: {state}"
    );
    assert_eq!(probe_check(&o).status, Status::Fail);
}

#[test]
fn crash_is_reported_with_the_signal() {
    let (exe, prefix) = sh("echo 'gds-probe stage: cuFileHandleRegister' >&2; kill -SEGV $$");
    let o = run_probe(
        &exe,
        &prefix,
        &ProbeArgs::new(Backend::Nvme),
        Duration::from_secs(10),
    );
    assert_eq!(o.status, ProbeStatus::Crashed, "{o:#?}");
    assert_eq!(o.signal, Some(11));
    assert!(
        o.detail
            .contains("signal 11 (SIGSEGV) during cuFileHandleRegister"),
        "{}",
        o.detail
    );
}

#[test]
fn spawn_failure_and_silent_exit() {
    let o = run_probe(
        Path::new("/nonexistent/gds-csi"),
        &[],
        &ProbeArgs::new(Backend::Nvme),
        Duration::from_secs(1),
    );
    assert_eq!(o.status, ProbeStatus::SpawnFailed);
    let (exe, prefix) = sh("echo oops >&2; exit 7");
    let o = run_probe(
        &exe,
        &prefix,
        &ProbeArgs::new(Backend::Nvme),
        Duration::from_secs(10),
    );
    assert_eq!(o.status, ProbeStatus::NoOutput);
    assert_eq!(o.exit_code, Some(7));
    assert_eq!(o.stderr_tail.as_deref(), Some("oops"));
}

// ----- fake libcufile -----------------------------------------------------------------------

fn fake_lib() -> Option<PathBuf> {
    static BUILD: Once = Once::new();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libfakecufile.so");
    BUILD.call_once(|| {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake/fake_cufile.c");
        let ok = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = std::fs::remove_file(&out);
        }
    });
    out.exists().then_some(out)
}

/// Runs the probe binary against the fake library with extra env vars for the child.
fn probe_fake(
    env: &[(&str, &str)],
    strict: bool,
    path: Option<&Path>,
) -> Option<gds_check::ProbeOutcome> {
    probe_fake_t(env, strict, path, Duration::from_secs(10))
}

fn probe_fake_t(
    env: &[(&str, &str)],
    strict: bool,
    path: Option<&Path>,
    timeout: Duration,
) -> Option<gds_check::ProbeOutcome> {
    let lib = fake_lib().or_else(|| {
        // scripts/test.sh sets GDS_CSI_NO_SKIP=1: there a skip is a failure.
        if std::env::var_os("GDS_CSI_NO_SKIP").is_some_and(|v| v == "1") {
            panic!("no C compiler (cc) to build the fake libcufile, and GDS_CSI_NO_SKIP=1");
        }
        eprintln!("no C compiler: skipping fake libcufile test");
        None
    })?;
    let mut a = ProbeArgs::new(Backend::Nvme);
    a.cuda_library = Some(lib.clone());
    a.library = Some(lib);
    a.strict = strict;
    a.path = path.map(Path::to_path_buf);
    a.cufile_json = Some("/nonexistent/cufile.json".into());
    // Env reaches the child through a shell wrapper: the parent's env must stay untouched.
    let mut script = String::new();
    for (k, v) in env {
        script += &format!("export {k}='{v}'; ");
    }
    script += &format!("exec {PROBE} \"$@\"");
    let (exe, prefix) = sh(&script);
    Some(run_probe(&exe, &prefix, &a, timeout))
}

fn scratch_dir() -> tempfile::TempDir {
    // Not /tmp: it may be tmpfs, and O_DIRECT is what the test is about.
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// "maj:min" of the filesystem holding `p`, as FAKE_CUFILE_GDS_DEVS lists it.
fn dev_of(p: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let d = std::fs::metadata(p).unwrap().dev();
    format!("{}:{}", libc::major(d), libc::minor(d))
}

#[test]
fn fake_true_gds_registration_and_read() {
    let d = scratch_dir();
    let devs = dev_of(d.path());
    let env = [
        ("FAKE_CUFILE_DSTATUS", "16"),
        ("FAKE_CUFILE_GDS_DEVS", devs.as_str()),
    ];
    let Some(o) = probe_fake(&env, true, Some(d.path())) else {
        return;
    };
    assert_eq!(o.status, ProbeStatus::Completed, "{o:#?}");
    assert_eq!(o.library_version, Some(1200));
    assert!(o.registration.as_ref().unwrap().ok(), "{o:#?}");
    assert_eq!(o.mode, GdsMode::TrueGds, "{o:#?}");
    assert_eq!(o.strict_pass, None);
    let rd = o.read.as_ref().expect("read check ran");
    assert!(rd.ok(), "{rd:#?}");
    assert_eq!(rd.bytes, gds_check::probe::READ_BYTES);
    assert_eq!(rd.mode, GdsMode::TrueGds);
    assert_eq!(o.props.as_ref().unwrap().supported, ["nvme"]);
    assert_eq!(probe_check_required(&o).status, Status::Pass);
    assert!(o.summary().contains("bytes match"), "{}", o.summary());
    // The scratch file was removed and no cufile.log landed in the volume.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
}

/// The driver advertises NVMe (dstatusflags bit 4), but this file is on a device
/// without a GDS path (a loop device, say). The default probe must say compat, not true GDS.
#[test]
fn default_probe_reports_compat_for_a_file_without_a_gds_path() {
    let d = scratch_dir();
    let Some(lib) = fake_lib() else { return };
    let mut a = ProbeArgs::new(Backend::Nvme);
    a.library = Some(lib.clone());
    a.cuda_library = Some(lib);
    a.path = Some(d.path().to_path_buf());
    a.cufile_json = Some("/nonexistent/cufile.json".into());
    let (exe, prefix) = sh(&format!(
        "export FAKE_CUFILE_DSTATUS=16; exec {PROBE} \"$@\""
    ));
    let o = run_probe(&exe, &prefix, &a, Duration::from_secs(10));
    assert_eq!(o.status, ProbeStatus::Completed, "{o:#?}");
    assert_eq!(o.mode, GdsMode::Compat, "{o:#?}");
    let sp = o
        .strict_pass
        .as_deref()
        .expect("the compat-off run is reported");
    assert!(sp.contains("5008 IO_NOT_SUPPORTED"), "{sp}");
    // The compat-allowed run read the bytes back right, through POSIX.
    let rd = o.read.as_ref().expect("read check ran");
    assert!(rd.ok() && rd.mode == GdsMode::Compat, "{rd:#?}");
    assert_eq!(probe_check_required(&o).status, Status::Fail);
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
}

#[test]
fn wrong_bytes_from_cufile_read_are_not_gds() {
    let d = scratch_dir();
    let devs = dev_of(d.path());
    let env = [
        ("FAKE_CUFILE_DSTATUS", "16"),
        ("FAKE_CUFILE_GDS_DEVS", devs.as_str()),
        ("FAKE_CUFILE_READ_CORRUPT", "1"),
    ];
    let Some(o) = probe_fake(&env, true, Some(d.path())) else {
        return;
    };
    assert_ne!(o.mode, GdsMode::TrueGds, "{o:#?}");
    assert!(
        o.summary().contains("wrong byte at offset 12345"),
        "{}",
        o.summary()
    );
    assert_eq!(probe_check_required(&o).status, Status::Fail);
    // No GPU (cuInit fails): registration alone does not pass.
    let env = [
        ("FAKE_CUFILE_DSTATUS", "16"),
        ("FAKE_CUFILE_GDS_DEVS", devs.as_str()),
        ("FAKE_CUDA_INIT_ERR", "100"),
    ];
    let Some(o) = probe_fake(&env, true, Some(d.path())) else {
        return;
    };
    assert_ne!(o.mode, GdsMode::TrueGds, "{o:#?}");
    assert!(
        o.summary().contains("cuInit returned CUDA error 100"),
        "{}",
        o.summary()
    );
}

#[test]
fn fake_compat_mode_and_registration_errors() {
    let d = scratch_dir();
    let Some(o) = probe_fake(&[], false, Some(d.path())) else {
        return;
    };
    assert_eq!(o.mode, GdsMode::Compat, "{o:#?}");
    assert_eq!(probe_check(&o).status, Status::Warn);
    assert_eq!(probe_check_required(&o).status, Status::Fail);

    let Some(o) = probe_fake(&[("FAKE_CUFILE_REG_ERR", "5027")], false, Some(d.path())) else {
        return;
    };
    let r = o.registration.as_ref().unwrap();
    assert_eq!((r.code, r.name.as_str()), (5027, "HANDLE_NOT_REGISTERED"));
    assert_eq!(o.mode, GdsMode::Unavailable);

    let Some(o) = probe_fake(&[("FAKE_CUFILE_OPEN_ERR", "5001")], false, None) else {
        return;
    };
    assert_eq!(
        o.driver_open.as_ref().unwrap().name,
        "DRIVER_NOT_INITIALIZED"
    );
    assert!(
        o.detail.contains("5001 DRIVER_NOT_INITIALIZED"),
        "{}",
        o.detail
    );
}

#[test]
fn fake_strict_mode_turns_compat_off() {
    let Some(o) = probe_fake(&[], true, None) else {
        return;
    };
    // The compat-off run saw compat off (the library read the private config) ...
    let sp = o.strict_pass.as_deref().expect("strict run reported");
    assert!(
        sp.contains("compat mode off"),
        "strict config not seen: {o:#?}"
    );
    // ... and the second run, compat allowed, says compat mode.
    assert_eq!(o.mode, GdsMode::Compat, "{o:#?}");
}

#[test]
fn fake_hang_and_crash_inside_the_library() {
    let t = Instant::now();
    let Some(o) = probe_fake_t(
        &[("FAKE_CUFILE_HANG", "1")],
        false,
        None,
        Duration::from_secs(2),
    ) else {
        return;
    };
    assert_eq!(o.status, ProbeStatus::TimedOut, "{o:#?}");
    assert_eq!(o.stage.as_deref(), Some("cuFileDriverOpen"));
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    let Some(o) = probe_fake(&[("FAKE_CUFILE_CRASH", "1")], false, None) else {
        return;
    };
    assert_eq!(o.status, ProbeStatus::Crashed, "{o:#?}");
    assert!(o.detail.contains("cuFileDriverOpen"));
}

#[test]
fn file_that_cannot_be_opened() {
    let Some(o) = probe_fake(
        &[("FAKE_CUFILE_DSTATUS", "16")],
        false,
        Some(Path::new("/nonexistent/f")),
    ) else {
        return;
    };
    assert_eq!(o.status, ProbeStatus::FileError, "{o:#?}");
    assert!(o.detail.contains("O_DIRECT"));
    assert_eq!(probe_check(&o).status, Status::Fail);
}

/// A full volume is still probed (and so not refused for the probe's own scratch file): the
/// scratch file falls back to a sparse one. Root: mounts a 1 MiB tmpfs and fills it.
#[test]
fn full_volume_is_probed_with_a_sparse_scratch_file() {
    let d = scratch_dir();
    let mnt = d.path().join("full");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "gds-probe-full"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mounting a tmpfs needs root");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&mnt);
    // Fill it.
    let _ = std::fs::write(mnt.join("fill"), vec![1u8; 2 << 20]);
    let devs = dev_of(&mnt);
    let env = [
        ("FAKE_CUFILE_DSTATUS", "16"),
        ("FAKE_CUFILE_GDS_DEVS", devs.as_str()),
    ];
    let Some(o) = probe_fake(&env, true, Some(&mnt)) else {
        return;
    };
    assert_eq!(o.status, ProbeStatus::Completed, "{o:#?}");
    assert_eq!(o.mode, GdsMode::TrueGds, "{o:#?}");
    assert!(o.read.as_ref().is_some_and(|r| r.ok()), "{o:#?}");
    let left: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["fill"]);
}

/// A read-only volume is probed on a file already there (read-only), not refused because the
/// scratch file cannot be created. Root: a read-only bind mount.
#[test]
fn read_only_volume_is_probed_on_an_existing_file() {
    let d = scratch_dir();
    let src = d.path().join("src");
    let ro = d.path().join("ro");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::create_dir(&ro).unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("sub/data.bin"), &data).unwrap();
    let mount = |args: &[&str]| {
        Command::new("mount")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    let (s, r) = (src.to_str().unwrap(), ro.to_str().unwrap());
    assert!(mount(&["--bind", s, r]), "bind mount needs root");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&ro);
    assert!(mount(&["-o", "remount,bind,ro", r]));
    let devs = dev_of(&ro);
    let env = [
        ("FAKE_CUFILE_DSTATUS", "16"),
        ("FAKE_CUFILE_GDS_DEVS", devs.as_str()),
    ];
    let Some(o) = probe_fake(&env, true, Some(&ro)) else {
        return;
    };
    assert_eq!(o.status, ProbeStatus::Completed, "{o:#?}");
    assert_eq!(o.mode, GdsMode::TrueGds, "{o:#?}");
    let rd = o.read.as_ref().expect("read check ran");
    assert!(rd.ok() && rd.bytes == 1 << 20, "{rd:#?}");
}
