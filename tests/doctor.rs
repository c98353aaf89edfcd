//! `gds-csi doctor`, the real binary, over fixture host trees (no GPU needed): its exit
//! status (0 only when GDS-ready, 1 when not, 2 for a bad command line), `--json`,
//! `--backend`, `--path` and `--probe`.

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
    assert!(t.contains("No NVIDIA GPU"), "{t}");
    assert!(t.contains("nvidia_fs is not loaded"), "{t}");
    assert!(t.contains("The cuFile probe was not run"), "{t}");

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
