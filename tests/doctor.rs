//! `gds-csi doctor`, the real binary, over fixture host trees (no GPU needed): its exit
//! status (0 only when GDS-ready, 1 when not, 2 for a bad command line), `--json`,
//! `--backend`, `--path` and `--probe`.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::Path;
use std::process::Output;

mod common;
use common::gds_fixture::Tree;

fn doctor(root: &Path, extra: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gds-csi"))
        .arg("doctor")
        .arg("--host-proc")
        .arg(root.join("proc"))
        .arg("--host-sys")
        .arg(root.join("sys"))
        .arg("--host-dev")
        .arg(root.join("dev"))
        .arg("--udev-data-dir")
        .arg(root.join("run/udev/data"))
        .arg("--cufile-json")
        .arg(root.join("etc/cufile.json"))
        .args(extra)
        .env_remove("CUFILE_ENV_PATH_JSON")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--json printed no JSON ({e}):\n{}", text(o)))
}

fn failed_ids(v: &serde_json::Value) -> Vec<String> {
    v["failed"]
        .as_array()
        .expect("failed is a list")
        .iter()
        .map(|l| l.as_str().unwrap().split(':').next().unwrap().to_owned())
        .collect()
}

#[test]
fn a_node_without_gpu_or_nvidia_fs_is_not_ready_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    Tree::new(dir.path());
    let o = doctor(dir.path(), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("NOT GDS-ready"), "{t}");
    // The cause first; no probe to add where it cannot run.
    let first = t.lines().nth(1).unwrap_or_default();
    assert!(first.contains("No NVIDIA GPU"), "{t}");
    assert!(t.contains("nvidia_fs is not loaded"), "{t}");
    assert!(!t.contains("add --probe"), "{t}");
    assert!(t.contains("the same cause as nvidia_fs.module"), "{t}");

    let o = doctor(dir.path(), &["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert_eq!(v["ready"], false);
    assert_eq!(v["backend"], "nvme");
    let failed = failed_ids(&v);
    for id in ["gpu.driver", "nvidia_fs.module"] {
        assert!(failed.iter().any(|f| f == id), "{id} not in {failed:?}");
    }
}

#[test]
fn a_ready_node_exits_0_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    tree.gpu_node().nvidia_fs("nvme: 1\n");
    let o = doctor(dir.path(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains(": GDS-ready"), "{t}");
    assert!(!t.contains("NOT GDS-ready"), "{t}");

    let o = doctor(dir.path(), &["--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v = json(&o);
    assert_eq!(v["ready"], true, "{v:#}");
    assert_eq!(failed_ids(&v), Vec::<String>::new());
    assert!(v["probe"].is_null(), "no probe without --probe");
}

#[test]
fn the_backend_decides_which_storage_driver_must_be_registered() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    // nvidia_fs is loaded, but only the NVMe driver registered with it.
    tree.gpu_node().nvidia_fs("nvme: 1\n");
    let o = doctor(dir.path(), &["--backend", "nfs-rdma", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["backend"], "nfs-rdma");
    assert_eq!(v["ready"], false);
    assert!(
        failed_ids(&v).iter().any(|f| f.starts_with("nvidia_fs")),
        "{v:#}"
    );
}

#[test]
fn a_bad_command_line_exits_2_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    Tree::new(dir.path());
    let o = doctor(dir.path(), &["--backend", "iscsi"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).is_empty(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("iscsi"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn path_and_probe_check_the_volume_and_report_a_missing_library() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    tree.gpu_node().nvidia_fs("nvme: 1\n");
    let vol = tempfile::tempdir().unwrap();
    let o = doctor(
        dir.path(),
        &[
            "--path",
            vol.path().to_str().unwrap(),
            "--probe",
            "--cufile-library",
            "/nonexistent/libcufile.so.0",
            "--probe-timeout",
            "20s",
            "--json",
        ],
    );
    // A ready node, but the path is not a GDS volume and libcufile is missing: not ready.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["ready"], false);
    assert_eq!(v["path"], vol.path().to_str().unwrap());
    assert_eq!(v["probe"]["status"], "library_missing", "{v:#}");
    let notes = v["notes"].to_string();
    assert!(notes.contains("libcufile is not installed"), "{notes}");
    assert!(
        v["checks"].as_array().unwrap().len() > failed_ids(&v).len(),
        "passing checks are listed too"
    );
}

/// The check of `id` in doctor's JSON report.
fn check<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    let checks = v["checks"].as_array().expect("checks is a list");
    checks
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {v:#}"))
}

/// `doctor --path` on a volume of the partition layout: the stack from the partition to
/// its NVMe namespace, the partition's own udev entry; a partition of a loop device is
/// reported as no NVMe namespace.
#[test]
fn path_reports_a_partition_volume_and_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    tree.gpu_node()
        .nvidia_fs("nvme: 1\n")
        .nvme_partition_volume(Path::new("/mnt/vol"), true);
    let o = doctor(dir.path(), &["--path", "/mnt/vol", "--json"]);
    let v = json(&o);
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    let stack = check(&v, "volume.block_stack");
    assert_eq!(stack["status"], "pass", "{stack}");
    assert_eq!(
        stack["evidence"],
        "nvme0n1p1 (partition) -> nvme0n1 (nvme, transport pcie)"
    );
    let udev = check(&v, "volume.udev");
    assert_eq!(udev["status"], "pass", "{udev}");
    assert!(
        udev["evidence"].as_str().unwrap().contains("b259:1"),
        "{udev}"
    );
    assert_eq!(check(&v, "volume.nvme_transport")["status"], "pass");

    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    tree.gpu_node()
        .nvidia_fs("nvme: 1\n")
        .loop_partition_volume(Path::new("/mnt/vol"));
    let v = json(&doctor(dir.path(), &["--path", "/mnt/vol", "--json"]));
    assert_eq!(
        check(&v, "volume.block_stack")["evidence"],
        "loop0p1 (partition) -> loop0"
    );
    let t = check(&v, "volume.nvme_transport");
    assert_eq!(t["status"], "warn", "{t}");
    let why = t["evidence"].as_str().unwrap();
    assert!(
        why.contains("loop0 is not an NVMe namespace (loop device)"),
        "{why}"
    );
}

/// Each line states what was found, so a WARN or FAIL line never reads as a pass: a GPU
/// node whose cufile.json allows the compat fallback, and a volume on a loop device.
#[test]
fn warn_and_fail_lines_state_what_was_found() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(dir.path());
    tree.gpu_node()
        .nvidia_fs("nvme: 1\n")
        .loop_partition_volume(Path::new("/mnt/vol"))
        .write(
            "etc/cufile.json",
            r#"{ "properties": { "allow_compat_mode": true } }"#,
        );
    let o = doctor(dir.path(), &["--path", "/mnt/vol"]);
    let t = text(&o);
    for line in [
        "[WARN] cufile.allow_compat          compat fallback enabled (allow_compat_mode is \
         true): I/O may silently bounce through the CPU\n",
        "[WARN] volume.nvme_transport        /dev/loop0 is not an NVMe namespace: no GDS path\n",
    ] {
        assert!(t.contains(line), "{line:?} not in:\n{t}");
    }
    let v = json(&doctor(dir.path(), &["--path", "/mnt/vol", "--json"]));
    assert_eq!(
        check(&v, "cufile.allow_compat")["summary"],
        "compat fallback enabled (allow_compat_mode is true): I/O may silently bounce through \
         the CPU"
    );
    assert_eq!(
        check(&v, "volume.nvme_transport")["summary"],
        "/dev/loop0 is not an NVMe namespace: no GDS path"
    );

    // No GPU: the failed line says there is none.
    let dir = tempfile::tempdir().unwrap();
    Tree::new(dir.path());
    let t = text(&doctor(dir.path(), &[]));
    assert!(
        t.contains("[FAIL] gpu.driver                   no NVIDIA GPU driver"),
        "{t}"
    );
}
