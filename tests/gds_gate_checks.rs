//! The GDS gate on its own (no driver, no handlers): a fixture host tree, a stand-in probe
//! child, and a state dir for the compat marks. What each policy does with the checks' answer,
//! the probe cache, and compat marks that outlive a restart.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::Path;
use std::time::Duration;

use gds_csi::csi::VolumeCondition;
use gds_csi::error::Error;
use gds_csi::gds::gate::{
    gpu_check, volume_condition, GateConfig, GdsGate, MountedVolume, Policy, Verdict, MARKS_FILE,
};

mod common;
use common::gds_fixture::Tree;

const MP: &str = "/var/lib/kubelet/plugins/gds/staging/vol";

fn config(tree: &Tree, mode: &str, ttl: Duration) -> GateConfig {
    let (exe, prefix) = tree.probe_stub(mode);
    GateConfig {
        paths: tree.paths.clone(),
        probe_exe: exe,
        probe_prefix: prefix,
        cufile_library: None,
        probe_timeout: Duration::from_secs(10),
        cache_ttl: ttl,
    }
}

fn gate(tree: &Tree, mode: &str, ttl: Duration) -> GdsGate {
    GdsGate::new(config(tree, mode, ttl))
}

/// The fixture's NVMe volume (259:0) staged at [`MP`].
fn staged(id: &str) -> MountedVolume {
    MountedVolume::block(id.into(), Some(Path::new(MP)), 259, 0)
}

fn healthy() -> VolumeCondition {
    VolumeCondition {
        abnormal: false,
        message: "mounted".into(),
    }
}

#[tokio::test]
async fn required_refuses_and_names_every_failed_check() {
    let dir = tempfile::tempdir().unwrap();
    // The field failure: nvidia_fs loaded but only wekafsio registered; no udev entry.
    let t = Tree::gpu_nvme(dir.path(), "wekafsio: 1\n", Path::new(MP), false);
    let g = gate(&t, "compat", Duration::from_secs(60));
    let err = g
        .check_publish(&staged("vol-1"), Policy::Required)
        .await
        .unwrap_err();
    let Error::GdsRequired { .. } = &err else {
        panic!("{err:?}")
    };
    let msg = err.to_string();
    let lines: Vec<&str> = msg.lines().skip(1).collect();
    for id in [
        "nvidia_fs.storage_driver",
        "nvme.p2pdma",
        "volume.udev",
        "cufile.probe",
    ] {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("{id}: ")))
            .unwrap_or_else(|| panic!("{id} not named in:\n{msg}"));
        assert!(line.contains(" -> "), "no remedy on {line}");
    }
    assert!(msg.contains("wekafsio"), "{msg}");
    assert!(msg.contains("5027"), "{msg}");
    // nvme.p2pdma is the fourth: neither route to true GDS on NVMe is there.
    assert!(msg.contains("4 check(s) failed"), "{msg}");
    assert_eq!(lines.len(), 4, "{msg}");
    // Nothing is remembered as compat for a refused volume.
    assert_eq!(g.compat_reason("vol-1"), None);
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::FailedPrecondition
    );
}

#[tokio::test]
async fn nvidia_fs_absent_fails_module_devices_and_driver() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::new(dir.path());
    t.gpu_node().nvme_volume(Path::new(MP), true);
    let g = gate(&t, "compat", Duration::from_secs(60));
    let Err(err @ Error::GdsRequired { .. }) =
        g.check_publish(&staged("vol-1"), Policy::Required).await
    else {
        panic!("required must refuse without nvidia_fs")
    };
    let msg = err.to_string();
    for id in [
        "nvidia_fs.module",
        "nvidia_fs.devices",
        "nvidia_fs.storage_driver",
        "nvme.p2pdma",
        "cufile.probe",
    ] {
        assert!(msg.contains(&format!("\n{id}: ")), "{id} missing:\n{msg}");
    }
    assert!(!msg.contains("volume.udev"), "{msg}");
}

/// A `preferred` volume published in compat mode is still reported abnormal by a driver that
/// restarted since (a new gate on the same state dir), until a publish passes.
#[tokio::test]
async fn compat_marks_survive_a_restart_until_a_publish_passes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let t = Tree::gpu_nvme(
        &dir.path().join("host"),
        "wekafsio: 1\n",
        Path::new(MP),
        false,
    );
    let ttl = Duration::from_secs(60);
    let g = GdsGate::open(config(&t, "compat", ttl), &state).unwrap();
    let o = g
        .check_publish(&staged("vol-2"), Policy::Preferred)
        .await
        .unwrap();
    let Verdict::Compat(why) = &o.verdict else {
        panic!("{:?}", o.verdict)
    };
    assert!(why.contains("compat mode"), "{why}");
    assert!(why.contains("volume.udev"), "{why}");
    assert_eq!(g.compat_reason("vol-2").as_deref(), Some(why.as_str()));
    assert!(state.join(MARKS_FILE).is_file());
    drop(g);

    // Restarted: the mark is read back, and NodeGetVolumeStats' condition carries it.
    let g = GdsGate::open(config(&t, "compat", ttl), &state).unwrap();
    assert_eq!(g.compat_reason("vol-2").as_deref(), Some(why.as_str()));
    let c = volume_condition(Some(&g), "vol-2", healthy());
    assert!(c.abnormal, "{c:?}");
    assert_eq!(c.message, format!("mounted; {why}"));
    assert_eq!(
        volume_condition(Some(&g), "vol-other", healthy()),
        healthy()
    );
    drop(g);

    // Fixed (udev entry and nvme registration): the next publish clears the mark, on disk too.
    t.nvidia_fs("nvme: 1\n").nvme_volume(Path::new(MP), true);
    let g = GdsGate::open(config(&t, "true_gds", ttl), &state).unwrap();
    let o = g
        .check_publish(&staged("vol-2"), Policy::Preferred)
        .await
        .unwrap();
    assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
    assert_eq!(g.compat_reason("vol-2"), None);
    drop(g);
    let g = GdsGate::open(config(&t, "true_gds", ttl), &state).unwrap();
    assert_eq!(g.compat_reason("vol-2"), None);
    assert_eq!(volume_condition(Some(&g), "vol-2", healthy()), healthy());
}

/// `disabled` forgets a mark left by an earlier `preferred` publish, on disk too.
#[tokio::test]
async fn disabled_runs_nothing_and_forgets_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Nothing GDS-related on this node at all.
    let t = Tree::new(&dir.path().join("host"));
    let ttl = Duration::from_secs(60);
    let g = GdsGate::open(config(&t, "compat", ttl), &state).unwrap();
    let o = g
        .check_publish(&staged("vol-3"), Policy::Preferred)
        .await
        .unwrap();
    assert!(matches!(o.verdict, Verdict::Compat(_)), "{:?}", o.verdict);
    let runs = t.probe_runs();
    let o = g
        .check_publish(&staged("vol-3"), Policy::Disabled)
        .await
        .unwrap();
    assert_eq!(o.verdict, Verdict::Skipped);
    assert!(o.report.checks.is_empty());
    assert_eq!(t.probe_runs(), runs);
    drop(g);
    let g = GdsGate::open(config(&t, "compat", ttl), &state).unwrap();
    assert_eq!(g.compat_reason("vol-3"), None);
}

#[tokio::test]
async fn ready_node_passes_and_probe_is_cached_per_volume() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::gpu_nvme(dir.path(), "nvme: 1\n", Path::new(MP), true);
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    let o = g
        .check_publish(&staged("vol-4"), Policy::Required)
        .await
        .unwrap();
    assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
    assert!(!o.probe_cached);
    let o = g
        .check_publish(&staged("vol-4"), Policy::Required)
        .await
        .unwrap();
    assert!(o.probe_cached);
    assert_eq!(t.probe_runs(), 1);
    // Another volume gets its own probe.
    g.check_publish(&staged("vol-5"), Policy::Required)
        .await
        .unwrap();
    assert_eq!(t.probe_runs(), 2);
    // The cheap checks are re-read every time: losing the udev entry refuses at once,
    // although the probe answer is still cached.
    t.nvme_volume(Path::new(MP), false);
    let err = g
        .check_publish(&staged("vol-4"), Policy::Required)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("volume.udev: "), "{err}");
    assert_eq!(t.probe_runs(), 2);
    // A zero TTL probes every time.
    let g0 = gate(&t, "true_gds", Duration::ZERO);
    t.nvme_volume(Path::new(MP), true);
    for _ in 0..2 {
        g0.check_publish(&staged("vol-4"), Policy::Required)
            .await
            .unwrap();
    }
    assert_eq!(t.probe_runs(), 4);
}

/// A cached probe answer belongs to the device it was taken on.
#[tokio::test]
async fn another_device_is_probed_again() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::gpu_nvme(dir.path(), "nvme: 1\n", Path::new(MP), true);
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    g.check_publish(&staged("vol-7"), Policy::Required)
        .await
        .unwrap();
    let moved = MountedVolume::block("vol-7".into(), Some(Path::new(MP)), 259, 9);
    let o = g.check_publish(&moved, Policy::Required).await.unwrap();
    assert!(!o.probe_cached);
    assert_eq!(t.probe_runs(), 2);
}

#[tokio::test]
async fn block_volume_skips_filesystem_checks() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::new(dir.path());
    // No mount, no udev entry: irrelevant for a raw block volume.
    t.gpu_node().nvidia_fs("nvme: 1\n");
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    let raw = MountedVolume::block("vol-6".into(), None, 259, 0);
    let o = g.check_publish(&raw, Policy::Required).await.unwrap();
    assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
    assert!(o.report.checks.iter().all(|c| !c.id.starts_with("volume.")));
}

#[test]
fn readiness_per_backend() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::new(dir.path());
    t.gpu_node().nvidia_fs("nvme: 1\n");
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    assert_eq!(
        g.node_readiness(),
        vec![("gds-nvme", true), ("gds-nfs-rdma", false)]
    );
    t.nvidia_fs("wekafsio: 1\n");
    assert_eq!(
        g.node_readiness(),
        vec![("gds-nvme", false), ("gds-nfs-rdma", false)]
    );
    // No GPU at all: the GPU check says so.
    let empty = tempfile::tempdir().unwrap();
    let e = Tree::new(empty.path());
    let c = gpu_check(&e.paths);
    assert_eq!(c.status, gds_check::Status::Fail);
    assert!(c.evidence.contains("no GPU"), "{}", c.evidence);
}

/// NodeGetInfo's segments: the node key, plus `true` for each ready backend when there is a gate.
#[test]
fn node_topology_adds_readiness_to_the_node_key() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::new(dir.path());
    t.gpu_node().nvidia_fs("nvme: 1\n");
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    let own = std::collections::HashMap::from([("d.example/node".into(), "node-a".into())]);
    let seg = gds_csi::gds::gate::node_topology(Some(&g), "d.example", own);
    // A backend that is not ready has no key (never "false": the kubelet would refuse to
    // change it to "true" later).
    assert_eq!(seg.len(), 2, "{seg:?}");
    assert_eq!(seg["d.example/node"], "node-a");
    assert_eq!(seg["d.example/gds-nvme"], "true");
    assert!(!seg.contains_key("d.example/gds-nfs-rdma"), "{seg:?}");
}

/// The fixture's partition volume: `nvme0n1p1` (259:1), or `loop0p1` (259:5).
fn staged_partition(id: &str, minor: u32) -> MountedVolume {
    MountedVolume::block(id.into(), Some(Path::new(MP)), 259, minor)
}

/// A volume of the partition layout on an NVMe namespace is GDS-ready: the stack check
/// walks from the partition to its namespace, the udev check reads the partition's own
/// entry, and nvidia_fs must have the parent's driver (nvme) registered.
#[tokio::test]
async fn a_partition_of_an_nvme_namespace_passes_on_its_own_udev_entry() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::new(dir.path());
    t.gpu_node()
        .nvidia_fs("nvme: 1\n")
        .nvme_partition_volume(Path::new(MP), true);
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    let o = g
        .check_publish(&staged_partition("vol-p", 1), Policy::Required)
        .await
        .unwrap();
    assert_eq!(o.verdict, Verdict::Ready, "{}", o.report.to_text());
    let stack = o.report.get("volume.block_stack").unwrap();
    assert_eq!(
        stack.evidence, "nvme0n1p1 (partition) -> nvme0n1 (nvme, transport pcie)",
        "{stack:?}"
    );
    let udev = o.report.get("volume.udev").unwrap();
    assert!(udev.evidence.contains("b259:1"), "{udev:?}");
    // The namespace's entry is no stand-in for the partition's: cuFile looks the
    // mounted device (the partition) up.
    t.nvme_partition_volume(Path::new(MP), false)
        .write("run/udev/data/b259:0", "E:ID_PART_TABLE_TYPE=gpt\n");
    let err = g
        .check_publish(&staged_partition("vol-p", 1), Policy::Required)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\nvolume.udev: "), "{err}");
    assert!(err.to_string().contains("b259:1"), "{err}");
    // The parent's driver not registered with nvidia_fs: refused, naming it.
    t.nvme_partition_volume(Path::new(MP), true)
        .nvidia_fs("wekafsio: 1\n");
    let err = g
        .check_publish(&staged_partition("vol-p", 1), Policy::Required)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("\nnvidia_fs.storage_driver: "),
        "{err}"
    );
}

/// A partition of a non-NVMe device (a loop device here) gets no true GDS: cuFile answers
/// compat mode, and the refusal names the cause, the device under the partition.
#[tokio::test]
async fn a_partition_of_a_loop_device_is_refused_naming_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::new(dir.path());
    t.gpu_node()
        .nvidia_fs("nvme: 1\n")
        .loop_partition_volume(Path::new(MP));
    let g = gate(&t, "compat", Duration::from_secs(60));
    let err = g
        .check_publish(&staged_partition("vol-l", 5), Policy::Required)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\ncufile.probe: "), "{msg}");
    assert!(
        msg.contains(
            "\nwarning: volume.nvme_transport: loop0 is not an NVMe namespace (loop device)"
        ),
        "{msg}"
    );
    let o = g
        .check_publish(&staged_partition("vol-l", 5), Policy::Preferred)
        .await
        .unwrap();
    let Verdict::Compat(why) = &o.verdict else {
        panic!("{:?}", o.verdict)
    };
    assert!(why.contains("loop0 is not an NVMe namespace"), "{why}");
    let stack = o.report.get("volume.block_stack").unwrap();
    assert_eq!(stack.evidence, "loop0p1 (partition) -> loop0", "{stack:?}");
}

/// Without a GPU driver the probe is not run (cuFile would only hang until the deadline on
/// every publish): preferred publishes in compat mode at once, required refuses, and both name
/// gpu.driver as why the probe line failed. With the driver back, the probe runs again.
#[tokio::test]
async fn no_gpu_driver_means_no_probe_run() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tree::gpu_nvme(dir.path(), "nvme: 1\n", Path::new(MP), true);
    t.remove("proc/driver/nvidia").remove("dev/nvidia0");
    let g = gate(&t, "true_gds", Duration::from_secs(60));
    let started = std::time::Instant::now();
    let out = g
        .check_publish(&staged("vol-1"), Policy::Preferred)
        .await
        .unwrap();
    assert!(
        matches!(out.verdict, Verdict::Compat(_)),
        "{:?}",
        out.verdict
    );
    let probe = out
        .report
        .checks
        .iter()
        .find(|c| c.id == "cufile.probe")
        .expect("a cufile.probe line");
    assert_eq!(probe.status, gds_check::Status::Fail);
    assert!(probe.evidence.contains("gpu.driver"), "{}", probe.evidence);
    assert_eq!(t.probe_runs(), 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = g
        .check_publish(&staged("vol-2"), Policy::Required)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("gpu.driver"), "{err}");
    assert_eq!(t.probe_runs(), 0);

    t.gpu_node();
    let out = g
        .check_publish(&staged("vol-3"), Policy::Required)
        .await
        .unwrap();
    assert!(matches!(out.verdict, Verdict::Ready), "{:?}", out.verdict);
    assert_eq!(t.probe_runs(), 1);
}
