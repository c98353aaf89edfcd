//! Hostile and malformed input, and what the driver exposes.
//!
//! - `bad_inputs_are_rejected_before_the_host_is_touched` (no root): a table of hostile or
//!   malformed requests over the real gRPC server and services, on a recording host double.
//!   Each must get its gRPC code and a message naming the field, with no host call recorded
//!   and not one file created, changed or removed anywhere under the test's directory.
//! - `socket_is_created_0660_and_honours_socket_mode` (root): stat of the real socket.
//! - `secrets_never_reach_the_log` (root): the real binary at RUST_LOG=trace gets secrets
//!   in every call that carries them, successful and failing; the marker never shows up.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::host_double::HostDouble;
use gds_csi::csi::volume_capability::{
    access_mode::Mode as AM, AccessMode, AccessType, BlockVolume, MountVolume,
};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::service::Driver;
use tonic::Code;

/// Every path under `root` with its content (files), link target (symlinks) or nothing (dirs).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if meta.is_dir() {
                stack.push(path.clone());
                Vec::new()
            } else if meta.file_type().is_file() {
                std::fs::read(&path).unwrap()
            } else {
                b"(special)".to_vec()
            };
            out.insert(path, content);
        }
    }
    out
}

fn cap(mode: AM, fs: &str, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
    }
}

fn rw() -> VolumeCapability {
    cap(AM::SingleNodeWriter, "", &[])
}

fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One hostile request to one RPC.
#[derive(Debug)]
enum Call {
    Create(CreateVolumeRequest),
    Delete(DeleteVolumeRequest),
    Validate(ValidateVolumeCapabilitiesRequest),
    Capacity(GetCapacityRequest),
    Stage(NodeStageVolumeRequest),
    Unstage(NodeUnstageVolumeRequest),
    Publish(NodePublishVolumeRequest),
    Unpublish(NodeUnpublishVolumeRequest),
    Stats(NodeGetVolumeStatsRequest),
    Snapshot(CreateSnapshotRequest),
    DeleteSnapshot(DeleteSnapshotRequest),
    GetSnapshot(GetSnapshotRequest),
    ListSnapshots(ListSnapshotsRequest),
}

async fn send(c: &Clients, call: Call) -> std::result::Result<(), tonic::Status> {
    let (mut ctl, mut node) = (c.controller.clone(), c.node.clone());
    match call {
        Call::Create(r) => ctl.create_volume(r).await.map(drop),
        Call::Delete(r) => ctl.delete_volume(r).await.map(drop),
        Call::Validate(r) => ctl.validate_volume_capabilities(r).await.map(drop),
        Call::Capacity(r) => ctl.get_capacity(r).await.map(drop),
        Call::Stage(r) => node.node_stage_volume(r).await.map(drop),
        Call::Unstage(r) => node.node_unstage_volume(r).await.map(drop),
        Call::Publish(r) => node.node_publish_volume(r).await.map(drop),
        Call::Unpublish(r) => node.node_unpublish_volume(r).await.map(drop),
        Call::Stats(r) => node.node_get_volume_stats(r).await.map(drop),
        Call::Snapshot(r) => ctl.create_snapshot(r).await.map(drop),
        Call::DeleteSnapshot(r) => ctl.delete_snapshot(r).await.map(drop),
        Call::GetSnapshot(r) => ctl.get_snapshot(r).await.map(drop),
        Call::ListSnapshots(r) => ctl.list_snapshots(r).await.map(drop),
    }
}

struct Case {
    what: String,
    call: Call,
    code: Code,
    /// Must appear in the error message: the field (or the value) at fault.
    names: &'static str,
    /// And this too, when the message must also give the reason.
    also: Option<&'static str>,
}

/// The number of distinct hostile requests (docs/testing.md and docs/operations.md quote it).
const HOSTILE_REQUESTS: usize = 237;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_rejected_before_the_host_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = dir.path().join("kubelet");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(kubelet.join("staging")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"do not touch").unwrap();
    // A directory link and a final-component link, both pointing out of the allowed root.
    std::os::unix::fs::symlink(&outside, kubelet.join("evil")).unwrap();
    std::os::unix::fs::symlink(outside.join("precious"), kubelet.join("finallink")).unwrap();

    // Fixture sysfs: two NVMe namespaces (one for the real volume, one for the controls).
    let sys = dir.path().join("sys");
    for i in 0..2 {
        let ns = sys.join(format!("block/nvme{i}n1"));
        std::fs::create_dir_all(ns.join("holders")).unwrap();
        std::fs::write(ns.join("wwid"), format!("nvme.1b36-security-{i:04}\n")).unwrap();
        std::fs::write(ns.join("dev"), format!("259:{i}\n")).unwrap();
        let by_dev = sys.join(format!("dev/block/259:{i}"));
        std::fs::create_dir_all(&by_dev).unwrap();
        std::fs::write(by_dev.join("size"), format!("{}\n", (1u64 << 30) / 512)).unwrap();
    }

    let host = Arc::new(HostDouble::recording());
    let pool = Pool::open(PoolConfig {
        node_id: "node-a".into(),
        host_sys: sys,
        host_dev: dir.path().join("dev"),
        listed: vec![],
        nvme_discover: true,
        state_dir: dir.path().join("state"),
    })
    .unwrap();
    let snapshots = gds_csi::snapshot::Snapshots::open(&dir.path().join("state")).unwrap();
    let driver = Arc::new(
        Driver::new(
            "gds.csi.test".into(),
            "node-a".into(),
            vec![kubelet.clone()],
            pool,
            host.clone(),
        )
        .with_snapshots(snapshots),
    );
    let c = common::serve_in_process(driver, dir.path()).await;
    // One real volume, so path and capability cases are refused for the field under test.
    let vol = c
        .controller
        .clone()
        .create_volume(CreateVolumeRequest {
            name: "real".into(),
            volume_capabilities: vec![rw()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let id = vol.volume_id.clone();

    let p = |rel: &str| kubelet.join(rel).to_str().unwrap().to_owned();
    let staging = p("staging/v");
    let target = p("pods/p/mount");
    let stage = |vid: &str, path: &str, cap: Option<VolumeCapability>| {
        Call::Stage(NodeStageVolumeRequest {
            volume_id: vid.into(),
            staging_target_path: path.into(),
            volume_capability: cap,
            ..Default::default()
        })
    };
    let publish = |vid: &str, stg: &str, tgt: &str, cap: Option<VolumeCapability>| {
        Call::Publish(NodePublishVolumeRequest {
            volume_id: vid.into(),
            staging_target_path: stg.into(),
            target_path: tgt.into(),
            volume_capability: cap,
            ..Default::default()
        })
    };
    let create = |name: &str, caps: Vec<VolumeCapability>, params: HashMap<String, String>| {
        Call::Create(CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: caps,
            parameters: params,
            ..Default::default()
        })
    };
    let case = |what: &str, call: Call, code: Code, names: &'static str| Case {
        what: what.into(),
        call,
        code,
        names,
        also: None,
    };
    use Code::{FailedPrecondition as FP, InvalidArgument as IA, NotFound as NF};

    let long_id = "x".repeat(4096);
    let device_part = id.split(':').nth(1).unwrap();
    let other_allocation = format!("blk:{device_part}:00000000:node-a");
    let hostile_ids: Vec<(&str, String, Code, &'static str)> = vec![
        (
            "does not decode",
            "not-a-gds-volume".into(),
            NF,
            "not-a-gds-volume",
        ),
        (
            "blk: with bad token",
            "blk:dev-\u{fc}:a:node-a".into(),
            NF,
            "does not exist",
        ),
        ("unknown allocation", other_allocation, NF, "does not exist"),
        ("another node", id.replace("node-a", "node-b"), NF, "node-b"),
        ("carries ..", "blk:..:a:node-a".into(), IA, "volume_id"),
        (
            "carries ../..",
            "blk:../../etc:a:node-a".into(),
            IA,
            "volume_id",
        ),
        (
            "carries NUL",
            "blk:dev-1\0:a:node-a".into(),
            IA,
            "volume_id",
        ),
        ("carries /", "blk:dev-1/x:a:node-a".into(), IA, "volume_id"),
        (
            "carries newline",
            "blk:dev-1\n:a:node-a".into(),
            IA,
            "volume_id",
        ),
        ("4 KiB long", long_id.clone(), IA, "volume_id"),
        ("129 bytes", "b".repeat(129), IA, "volume_id"),
        ("empty", String::new(), IA, "volume_id"),
    ];
    let mut cases = Vec::new();
    for (what, vid, code, names) in &hostile_ids {
        cases.push(case(
            &format!("NodeStage id {what}"),
            stage(vid, &staging, Some(rw())),
            *code,
            names,
        ));
    }
    for (what, vid) in [
        ("carries ..", "blk:../x:a:node-a"),
        ("carries NUL", "a\0b"),
        ("carries /", "a/b"),
        ("4 KiB long", long_id.as_str()),
    ] {
        cases.push(case(
            &format!("NodePublish id {what}"),
            publish(vid, &staging, &target, Some(rw())),
            IA,
            "volume_id",
        ));
        cases.push(case(
            &format!("NodeUnpublish id {what}"),
            Call::Unpublish(NodeUnpublishVolumeRequest {
                volume_id: vid.into(),
                target_path: target.clone(),
            }),
            IA,
            "volume_id",
        ));
        cases.push(case(
            &format!("NodeUnstage id {what}"),
            Call::Unstage(NodeUnstageVolumeRequest {
                volume_id: vid.into(),
                staging_target_path: staging.clone(),
            }),
            IA,
            "volume_id",
        ));
        cases.push(case(
            &format!("DeleteVolume id {what}"),
            Call::Delete(DeleteVolumeRequest {
                volume_id: vid.into(),
                secrets: HashMap::new(),
            }),
            IA,
            "volume_id",
        ));
        cases.push(case(
            &format!("ValidateVolumeCapabilities id {what}"),
            Call::Validate(ValidateVolumeCapabilitiesRequest {
                volume_id: vid.into(),
                volume_capabilities: vec![rw()],
                ..Default::default()
            }),
            IA,
            "volume_id",
        ));
        cases.push(case(
            &format!("NodeGetVolumeStats id {what}"),
            Call::Stats(NodeGetVolumeStatsRequest {
                volume_id: vid.into(),
                volume_path: target.clone(),
                staging_target_path: String::new(),
            }),
            IA,
            "volume_id",
        ));
    }
    cases.push(case(
        "DeleteVolume id of another node",
        Call::Delete(DeleteVolumeRequest {
            volume_id: id.replace("node-a", "node-b"),
            secrets: HashMap::new(),
        }),
        FP,
        "node-b",
    ));

    // Names.
    for (what, name) in [
        ("129 bytes", "n".repeat(129)),
        ("4 KiB", "n".repeat(4096)),
        ("empty", String::new()),
        ("NUL", "pv\0x".into()),
        ("newline", "pv\nx".into()),
    ] {
        cases.push(case(
            &format!("CreateVolume name {what}"),
            create(&name, vec![rw()], HashMap::new()),
            IA,
            "name",
        ));
    }

    // Staging and target paths.
    let outside_s = outside.join("x").to_str().unwrap().to_owned();
    let sibling = format!("{}-evil/x", kubelet.display());
    let dotdot = format!("{}/../outside/x", kubelet.display());
    let through_link = p("evil/x");
    let final_link = p("finallink");
    let bad_paths: Vec<(&str, String, &'static str)> = vec![
        ("relative", "kubelet/staging/v".into(), "absolute"),
        ("outside the roots", outside_s.clone(), "allowed roots"),
        ("/etc", "/etc/gds".into(), "allowed roots"),
        ("sibling of the root", sibling, "allowed roots"),
        ("with ..", dotdot, ".."),
        ("through a symlinked directory", through_link, "symlink"),
        ("a symlink itself", final_link, "symlink"),
        ("empty", String::new(), "required"),
        ("with NUL", format!("{staging}\0x"), "control"),
        ("with newline", format!("{staging}\nx"), "control"),
        // The whole kubelet directory as a mount point.
        (
            "the allowed root itself",
            kubelet.to_str().unwrap().into(),
            "allowed root",
        ),
        (
            "the allowed root with a slash",
            format!("{}/", kubelet.display()),
            "allowed root",
        ),
        // Beyond NAME_MAX and PATH_MAX: InvalidArgument, not an Internal error from mkdir.
        ("a 300-byte component", p(&"n".repeat(300)), "at most 255"),
        ("a 4100-byte path", p(&"d/".repeat(2048)), "at most 4095"),
    ];
    for (what, path, why) in &bad_paths {
        cases.push(Case {
            also: Some(why),
            ..case(
                &format!("NodeStage staging path {what}"),
                stage(&id, path, Some(rw())),
                IA,
                "staging_target_path",
            )
        });
        cases.push(case(
            &format!("NodePublish target path {what}"),
            publish(&id, &staging, path, Some(rw())),
            IA,
            "target_path",
        ));
        cases.push(case(
            &format!("NodeUnpublish target path {what}"),
            Call::Unpublish(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: path.clone(),
            }),
            IA,
            "target_path",
        ));
        // A volume is never at a path that fails the checks: NotFound (csi-sanity's
        // "volume does not exist on the specified path"), never whether the path exists.
        cases.push(case(
            &format!("NodeGetVolumeStats volume path {what}"),
            Call::Stats(NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: path.clone(),
                staging_target_path: String::new(),
            }),
            if path.is_empty() { IA } else { NF },
            if path.is_empty() { "volume_path" } else { why },
        ));
        cases.push(case(
            &format!("NodeUnstage staging path {what}"),
            Call::Unstage(NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: path.clone(),
            }),
            IA,
            "staging_target_path",
        ));
    }
    // NodeGetVolumeStats must not answer whether a host file exists.
    cases.push(case(
        "NodeGetVolumeStats of /etc/shadow",
        Call::Stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: "/etc/shadow".into(),
            staging_target_path: String::new(),
        }),
        NF,
        "allowed roots",
    ));
    cases.push(case(
        "NodePublish staging path through a symlink",
        publish(&id, &p("evil/s"), &target, Some(rw())),
        IA,
        "staging_target_path",
    ));

    // Capabilities: missing, malformed, unsupported, contradictory.
    let no_mode = VolumeCapability {
        access_mode: None,
        ..rw()
    };
    let no_type = VolumeCapability {
        access_type: None,
        ..rw()
    };
    let bogus_mode = VolumeCapability {
        access_mode: Some(AccessMode { mode: 99 }),
        ..rw()
    };
    let unknown_mode = cap(AM::Unknown, "", &[]);
    let multi = cap(AM::MultiNodeMultiWriter, "", &[]);
    let block_multi = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: AM::MultiNodeReaderOnly as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    for (what, capability) in [
        ("missing", None),
        ("without access_mode", Some(no_mode.clone())),
        ("without access_type", Some(no_type.clone())),
        ("mode 99", Some(bogus_mode.clone())),
        ("mode UNKNOWN", Some(unknown_mode.clone())),
        ("MULTI_NODE_MULTI_WRITER", Some(multi.clone())),
        ("block MULTI_NODE_READER_ONLY", Some(block_multi.clone())),
    ] {
        cases.push(case(
            &format!("NodeStage capability {what}"),
            stage(&id, &staging, capability.clone()),
            IA,
            "volume_capability",
        ));
        cases.push(case(
            &format!("NodePublish capability {what}"),
            publish(&id, &staging, &target, capability),
            IA,
            "volume_capability",
        ));
    }
    for (what, caps) in [
        ("none", vec![]),
        ("without access_mode", vec![no_mode]),
        ("without access_type", vec![no_type]),
        ("mode 99", vec![bogus_mode]),
        ("mode UNKNOWN", vec![unknown_mode]),
        ("MULTI_NODE_MULTI_WRITER", vec![multi]),
        (
            "ext4 and xfs at once",
            vec![
                cap(AM::SingleNodeWriter, "ext4", &[]),
                cap(AM::SingleNodeWriter, "xfs", &[]),
            ],
        ),
    ] {
        // request/mod.rs names UNKNOWN as `volume_capability.access_mode` for every RPC.
        let names = if what == "mode UNKNOWN" {
            "access_mode"
        } else {
            "volume_capabilities"
        };
        cases.push(case(
            &format!("CreateVolume capabilities {what}"),
            create("c", caps, HashMap::new()),
            IA,
            names,
        ));
    }
    cases.push(case(
        "CreateVolume capability xfs but fsType=ext4",
        create(
            "c",
            vec![cap(AM::SingleNodeWriter, "xfs", &[])],
            params(&[("fsType", "ext4")]),
        ),
        IA,
        "volume_capabilities",
    ));
    cases.push(case(
        "ValidateVolumeCapabilities with no capability",
        Call::Validate(ValidateVolumeCapabilitiesRequest {
            volume_id: id.clone(),
            ..Default::default()
        }),
        IA,
        "volume_capabilities",
    ));
    for (what, required, limit) in [
        ("required > limit", 2i64 << 30, 1i64 << 30),
        ("negative required", -1, 0),
        ("negative limit", 0, -5),
    ] {
        cases.push(case(
            &format!("CreateVolume capacity_range {what}"),
            Call::Create(CreateVolumeRequest {
                name: "c".into(),
                volume_capabilities: vec![rw()],
                capacity_range: Some(CapacityRange {
                    required_bytes: required,
                    limit_bytes: limit,
                }),
                ..Default::default()
            }),
            IA,
            "capacity_range",
        ));
    }
    cases.push(case(
        "CreateVolume from a snapshot",
        Call::Create(CreateVolumeRequest {
            name: "c".into(),
            volume_capabilities: vec![rw()],
            volume_content_source: Some(VolumeContentSource { r#type: None }),
            ..Default::default()
        }),
        IA,
        "volume_content_source",
    ));

    // Mount flags that inject options or take over what the driver manages.
    for flag in [
        "ro,exec",
        "noatime,data=journal",
        "nodev\nexec",
        "nodev\0exec",
        "uid=0 gid=0",
        "\tnoatime",
        "",
        "data=journal",
        "data=writeback",
        "bind",
        "rbind",
        "remount",
        "move",
        "loop",
        "offset=4096",
        "sizelimit=1",
        "X-mount.mkdir",
        "make-shared",
    ] {
        cases.push(case(
            &format!("NodeStage mount flag {flag:?}"),
            stage(
                &id,
                &staging,
                Some(cap(AM::SingleNodeWriter, "", &["noatime", flag])),
            ),
            IA,
            "mount_flags",
        ));
        cases.push(case(
            &format!("CreateVolume mount flag {flag:?}"),
            create(
                "c",
                vec![cap(AM::SingleNodeWriter, "", &[flag])],
                HashMap::new(),
            ),
            IA,
            "mount_flags",
        ));
    }
    cases.push(case(
        "NodePublish mount flag \"ro,exec\"",
        publish(
            &id,
            &staging,
            &target,
            Some(cap(AM::SingleNodeWriter, "", &["ro,exec"])),
        ),
        IA,
        "mount_flags",
    ));

    // fsType outside the set, in the capability and in the StorageClass.
    for fs in [
        "btrfs",
        "vfat",
        "EXT4",
        "ext4 ",
        "ext4,nodev",
        "nfs",
        "../ext4",
    ] {
        cases.push(case(
            &format!("NodeStage fs_type {fs:?}"),
            stage(&id, &staging, Some(cap(AM::SingleNodeWriter, fs, &[]))),
            IA,
            "fs_type",
        ));
        cases.push(case(
            &format!("CreateVolume capability fs_type {fs:?}"),
            create(
                "c",
                vec![cap(AM::SingleNodeWriter, fs, &[])],
                HashMap::new(),
            ),
            IA,
            "fs_type",
        ));
    }
    for fs in ["btrfs", "vfat", "EXT4", "", "ext3"] {
        cases.push(case(
            &format!("CreateVolume parameter fsType={fs:?}"),
            create("c", vec![rw()], params(&[("fsType", fs)])),
            IA,
            "fsType",
        ));
    }

    // StorageClass parameters: option injection and unknown names.
    for (key, value) in [
        ("fsType", "ext4,nodev"),
        ("fsType", "ext4=1"),
        ("fsType", "ext4\nexec"),
        ("fsType", "ext4\0"),
        ("gdsPolicy", "required,exec"),
        ("gdsPolicy", "required=1"),
        ("gdsPolicy", "required\n"),
        ("gdsPolicy", "maybe"),
    ] {
        cases.push(case(
            &format!("CreateVolume parameter {key}={value:?}"),
            create("c", vec![rw()], params(&[(key, value)])),
            IA,
            "parameters",
        ));
    }
    for (what, kv, names) in [
        (
            "mountOptions",
            vec![("fsType", "ext4"), ("mountOptions", "exec")],
            "mountOptions",
        ),
        ("fstype (case)", vec![("fstype", "ext4")], "fstype"),
        (
            "two unknown, listed sorted",
            vec![("zeta", "1"), ("alpha", "1")],
            r#"["alpha", "zeta"]"#,
        ),
        ("key with =", vec![("a=b", "1")], "a=b"),
        ("key with comma", vec![("ro,exec", "")], "ro,exec"),
    ] {
        cases.push(case(
            &format!("CreateVolume unknown parameter {what}"),
            create("c", vec![rw()], params(&kv)),
            IA,
            names,
        ));
        cases.push(case(
            &format!("GetCapacity unknown parameter {what}"),
            Call::Capacity(GetCapacityRequest {
                parameters: params(&kv),
                ..Default::default()
            }),
            IA,
            names,
        ));
    }

    // Snapshots: every class parameter, the ids, the listing's paging.
    let store = dir.path().join("store").display().to_string();
    let snap = |name: &str, source: &str, kv: &[(&str, &str)]| {
        Call::Snapshot(CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: source.into(),
            parameters: params(kv),
            ..Default::default()
        })
    };
    let dir_store = [("storeDir", store.as_str())];
    let nfs_store = |extra: (&'static str, &'static str)| {
        vec![
            ("storeServer", "192.0.2.1"),
            ("storeShare", "/export"),
            extra,
        ]
    };
    for (what, call, code, names) in [
        ("no name", snap("", &id, &dir_store), IA, "name"),
        (
            "a control character in the name",
            snap("a\nb", &id, &dir_store),
            IA,
            "name",
        ),
        (
            "no source",
            snap("s", "", &dir_store),
            IA,
            "source_volume_id",
        ),
        ("no store", snap("s", &id, &[]), IA, "storeServer"),
        (
            "a relative storeDir",
            snap("s", &id, &[("storeDir", "snaps")]),
            IA,
            "parameters.storeDir",
        ),
        (
            "storeDir with ..",
            snap("s", &id, &[("storeDir", "/var/../etc")]),
            IA,
            "parameters.storeDir",
        ),
        (
            "two stores",
            snap(
                "s",
                &id,
                &[
                    ("storeDir", "/snaps"),
                    ("storeServer", "192.0.2.1"),
                    ("storeShare", "/e"),
                ],
            ),
            IA,
            "parameters.storeDir",
        ),
        (
            "storeServer without storeShare",
            snap("s", &id, &[("storeServer", "192.0.2.1")]),
            IA,
            "parameters.storeShare",
        ),
        (
            "storePort 0",
            snap("s", &id, &nfs_store(("storePort", "0"))),
            IA,
            "parameters.storePort",
        ),
        (
            "storeProto bogus",
            snap("s", &id, &nfs_store(("storeProto", "carrier-pigeon"))),
            IA,
            "parameters.storeProto",
        ),
        (
            "storeVers 9",
            snap("s", &id, &nfs_store(("storeVers", "9"))),
            IA,
            "parameters.storeVers",
        ),
        (
            "storePath with ..",
            snap("s", &id, &nfs_store(("storePath", "a/../b"))),
            IA,
            "parameters.storePath",
        ),
        (
            "a server with a slash",
            snap("s", &id, &[("storeServer", "a/b"), ("storeShare", "/e")]),
            IA,
            "parameters.storeServer",
        ),
        (
            "checksums yes",
            snap("s", &id, &[("storeDir", "/snaps"), ("checksums", "yes")]),
            IA,
            "parameters.checksums",
        ),
        (
            "an unknown parameter",
            snap("s", &id, &[("storeDir", "/snaps"), ("bogus", "1")]),
            IA,
            "bogus",
        ),
        (
            "an unknown source volume",
            snap("s", "blk:dev-0:aa:node-a", &dir_store),
            NF,
            "source_volume_id",
        ),
        (
            "DeleteSnapshot without an id",
            Call::DeleteSnapshot(DeleteSnapshotRequest::default()),
            IA,
            "snapshot_id",
        ),
        (
            "GetSnapshot without an id",
            Call::GetSnapshot(GetSnapshotRequest::default()),
            IA,
            "snapshot_id",
        ),
        (
            "GetSnapshot of an unknown id",
            Call::GetSnapshot(GetSnapshotRequest {
                snapshot_id: "snap:dir:~nowhere:x".into(),
                ..Default::default()
            }),
            NF,
            "snap:dir:~nowhere:x",
        ),
        (
            "ListSnapshots with negative max_entries",
            Call::ListSnapshots(ListSnapshotsRequest {
                max_entries: -1,
                ..Default::default()
            }),
            IA,
            "max_entries",
        ),
        (
            "ListSnapshots with a foreign token",
            Call::ListSnapshots(ListSnapshotsRequest {
                starting_token: "page-2".into(),
                ..Default::default()
            }),
            Code::Aborted,
            "starting_token",
        ),
        (
            "CreateVolume from an empty snapshot id",
            Call::Create(CreateVolumeRequest {
                name: "from-snap".into(),
                volume_capabilities: vec![rw()],
                volume_content_source: Some(VolumeContentSource {
                    r#type: Some(volume_content_source::Type::Snapshot(
                        volume_content_source::SnapshotSource {
                            snapshot_id: String::new(),
                        },
                    )),
                }),
                ..Default::default()
            }),
            IA,
            "volume_content_source.snapshot.snapshot_id",
        ),
    ] {
        cases.push(case(&format!("CreateSnapshot {what}"), call, code, names));
    }

    // Run them all. The host and the filesystem must not move.
    let calls_before = host.calls();
    let files_before = snapshot(dir.path());
    // Every case is a different request: a duplicate would count twice and prove nothing new.
    let mut seen = std::collections::HashSet::new();
    for c in &cases {
        assert!(
            seen.insert(format!("{:?}", c.call)),
            "duplicate request: {}",
            c.what
        );
    }
    let tried = cases.len();
    assert_eq!(
        tried, HOSTILE_REQUESTS,
        "update HOSTILE_REQUESTS and docs/testing.md, docs/operations.md"
    );
    let mut rejected = 0;
    let mut failures = Vec::new();
    for Case {
        what,
        call,
        code,
        names,
        also,
    } in cases
    {
        let result = send(&c, call).await;
        let calls = host.calls();
        let touched: Vec<_> = calls[calls_before.len().min(calls.len())..].to_vec();
        let files_changed = snapshot(dir.path()) != files_before;
        match result {
            Err(s)
                if s.code() == code
                    && s.message().contains(names)
                    && also.is_none_or(|a| s.message().contains(a))
                    && touched.is_empty()
                    && !files_changed =>
            {
                rejected += 1
            }
            other => failures.push(format!(
                "{what}: want {code:?} naming {names:?} {also:?}; got {:?}; host calls {touched:?}; files changed: {files_changed}",
                other.map_err(|s| (s.code(), s.message().to_owned()))
            )),
        }
        host.state
            .lock()
            .unwrap()
            .calls
            .truncate(calls_before.len());
    }
    for f in &failures {
        println!("NOT REJECTED CLEANLY: {f}");
    }
    println!("bad inputs rejected: {rejected}/{tried}");
    assert!(failures.is_empty(), "{} cases failed", failures.len());
    assert_eq!(
        std::fs::read(outside.join("precious")).unwrap(),
        b"do not touch"
    );

    // Controls: at the limits, the same requests are accepted.
    c.controller
        .clone()
        .create_volume(CreateVolumeRequest {
            name: "n".repeat(128),
            volume_capabilities: vec![cap(AM::SingleNodeWriter, "xfs", &["noatime"])],
            parameters: params(&[
                ("fsType", "xfs"),
                ("gdsPolicy", "disabled"),
                ("csi.storage.k8s.io/pvc/name", "a,b=c"),
            ]),
            ..Default::default()
        })
        .await
        .map(drop)
        .unwrap_or_else(|e| panic!("a 128-byte name is valid: {e:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_is_created_0660_and_honours_socket_mode() {
    let Some(mut rig) = common::Rig::new(0) else {
        return;
    };
    for (args, want) in [(&[][..], 0o660), (&["--socket-mode", "0600"][..], 0o600)] {
        let _c = rig.start_with(&[], args).await;
        let meta = std::fs::symlink_metadata(rig.socket()).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        let mode = meta.permissions().mode() & 0o7777;
        println!("socket {args:?}: mode {mode:04o}");
        assert_eq!(mode, want, "{args:?}");
        rig.kill9();
    }
    // A mode that is not an octal file mode is refused before anything starts.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gds-csi"))
        .args(["serve", "--node-id", "n", "--socket-mode", "0999"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_log() {
    let Some(mut rig) = common::Rig::new(1) else {
        return;
    };
    const MARKER: &str = "S3CR3T-marker-7f1c9a";
    let secrets = || {
        HashMap::from([
            ("password".to_string(), MARKER.to_string()),
            (format!("key-{MARKER}"), format!("{MARKER}\n{MARKER}")),
        ])
    };
    for format in ["text", "json"] {
        let c = rig
            .start_with(&[("RUST_LOG", "trace")], &["--log-format", format])
            .await;
        let (mut ctl, mut node) = (c.controller.clone(), c.node.clone());
        let name = format!("secret-{format}");
        let vol = ctl
            .create_volume(CreateVolumeRequest {
                name: name.clone(),
                volume_capabilities: vec![rw()],
                secrets: secrets(),
                parameters: params(&[("gdsPolicy", "disabled")]),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let id = vol.volume_id;
        let staging = rig.path(&format!("staging/{format}"));
        let target = rig.path(&format!("pods/{format}/mount"));
        std::fs::create_dir_all(&staging).unwrap();
        let stage_req = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
            volume_capability: Some(rw()),
            secrets: secrets(),
            ..Default::default()
        };
        node.node_stage_volume(stage_req.clone()).await.unwrap();
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
            target_path: target.to_str().unwrap().into(),
            volume_capability: Some(rw()),
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap();
        ctl.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: id.clone(),
            volume_capabilities: vec![rw()],
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap();
        // Failing calls with secrets: the error path logs the message, never the request.
        for bad in [
            NodeStageVolumeRequest {
                volume_id: "blk:..:a:node-a".into(),
                ..stage_req.clone()
            },
            NodeStageVolumeRequest {
                staging_target_path: "/etc/x".into(),
                ..stage_req.clone()
            },
        ] {
            node.node_stage_volume(bad).await.unwrap_err();
        }
        ctl.create_volume(CreateVolumeRequest {
            name: "bad".into(),
            volume_capabilities: vec![rw()],
            parameters: params(&[("unknown", "x")]),
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap_err();
        let err = ctl
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                secrets: secrets(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "still mounted");
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_str().unwrap().into(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await
        .unwrap();
        ctl.delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: secrets(),
        })
        .await
        .unwrap();
        rig.kill9();
    }
    let logs = rig.logs();
    assert!(
        logs.contains("NodeStageVolume") && logs.contains("CreateVolume"),
        "the calls were logged"
    );
    let lines = logs.lines().count();
    let leaked: Vec<_> = logs.lines().filter(|l| l.contains("S3CR3T")).collect();
    println!(
        "secrets in the log: {} of {lines} lines at RUST_LOG=trace (text and json)",
        leaked.len()
    );
    assert!(leaked.is_empty(), "secret marker in the log: {leaked:?}");
}
