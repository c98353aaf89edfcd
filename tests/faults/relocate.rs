//! Kill points of a move (ControllerExpandVolume of a partition whose neighbour takes the
//! space after it), through the real binary on one loop device: volume `v` is carved,
//! written (ext4) and unstaged, neighbour `n` carved after it and written; then `v` is
//! expanded past `n` on a driver armed with the point, which dies by SIGKILL. The state at
//! the kill is checked against what the point promises; a restarted driver settles the
//! move at start-up and the retried expansion (three times) must converge: `v` at the
//! new size with its PARTUUID, one label entry per volume, no spare entry, `sgdisk -v`
//! clean, every file of `v` and `n` equal (SHA-256), the extent `v` left reads zeros.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::common::{digest_file, killed_by_sigkill, requests, run, PartRig, Rig};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use gds_csi::runtime::faults::KillPoint;

const MIB: u64 = 1 << 20;
const DISK: u64 = 128 * MIB;
const V_SIZE: u64 = 24 * MIB;
const GROWN: u64 = 40 * MIB;

fn create_req(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![requests::single_writer_mount()],
        parameters: [
            ("gdsPolicy".to_string(), "disabled".to_string()),
            ("layout".to_string(), "partition".to_string()),
        ]
        .into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

fn expand_req(id: &str, bytes: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(requests::single_writer_mount()),
        ..Default::default()
    }
}

/// The label as `sfdisk -J` reads it: (name, PARTUUID, start byte, bytes).
pub fn gpt_entries(disk: &Path) -> Vec<(String, String, u64, u64)> {
    let out = run("sfdisk", &["-J", disk.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let parts = v["partitiontable"]["partitions"].as_array().cloned();
    parts
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["uuid"].as_str().unwrap_or_default().to_lowercase(),
                p["start"].as_u64().unwrap() * 512,
                p["size"].as_u64().unwrap() * 512,
            )
        })
        .collect()
}

fn range(disk: &Path, start: u64, len: u64) -> Vec<u8> {
    run("blockdev", &["--flushbufs", disk.to_str().unwrap()]);
    let mut f = fs::File::open(disk).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Stages `id`, writes (or, with `want`, compares) its files, unstages.
async fn files(
    c: &mut Clients,
    id: &str,
    staging: &Path,
    want: Option<&[(String, Vec<u8>)]>,
) -> Vec<(String, Vec<u8>)> {
    let cap = requests::single_writer_mount();
    requests::stage(c, id, staging, cap).await.unwrap();
    let mut digests = Vec::new();
    match want {
        None => {
            for (i, len) in [(1u8, 5 * MIB as usize), (2, 3 * MIB as usize), (3, 4096)] {
                let name = format!("f{i}");
                fs::write(staging.join(&name), payload(i, len)).unwrap();
                digests.push((name.clone(), digest_file(&staging.join(&name))));
            }
            run("sync", &[]);
        }
        Some(want) => {
            for (name, digest) in want {
                assert_eq!(&digest_file(&staging.join(name)), digest, "{name} differs");
            }
        }
    }
    requests::unstage(c, id, staging).await.unwrap();
    digests
}

fn record(rig: &Rig, id: &str) -> serde_json::Value {
    rig.state()["volumes"][id].clone()
}

fn check_at_kill(
    rig: &Rig,
    disk: &Path,
    alloc: &str,
    from: (u64, u64),
    point: KillPoint,
    id: &str,
) {
    let rec = record(rig, id);
    let moving = &rec["partition"]["moving"];
    assert!(moving.is_object(), "the move is recorded: {rec}");
    let to = (
        moving["to"][0].as_u64().unwrap(),
        moving["to"][1].as_u64().unwrap(),
    );
    let gpt = gpt_entries(disk);
    let v = gpt.iter().find(|e| e.0 == alloc).expect("v in the label");
    let spare = gpt.iter().find(|e| e.0 == format!("{alloc}.move"));
    match point {
        KillPoint::MoveAfterRecord => {
            assert_eq!((v.2, v.3), from, "v where it was");
            assert!(spare.is_none(), "no spare entry yet: {gpt:?}");
        }
        KillPoint::MoveAfterReserve => {
            assert_eq!((v.2, v.3), from);
            let s = spare.expect("the spare entry");
            assert_eq!((s.2, s.3), to, "over the new extent");
        }
        KillPoint::MoveAfterCopy => {
            assert_eq!((v.2, v.3), from, "not switched");
            assert_eq!(
                range(disk, to.0, from.1),
                range(disk, from.0, from.1),
                "the new extent holds v's bytes"
            );
        }
        KillPoint::MoveAfterSwitch | KillPoint::MoveAfterErase => {
            assert_eq!((v.2, v.3), to, "switched");
            let s = spare.expect("the spare entry");
            assert_eq!((s.2, s.3), from, "over the old extent");
            if point == KillPoint::MoveAfterErase {
                assert!(
                    range(disk, from.0, from.1).iter().all(|b| *b == 0),
                    "erased"
                );
            }
        }
        other => panic!("{other:?} is not a move kill point"),
    }
}

pub async fn scenario(point: KillPoint) -> String {
    let mut rig = PartRig(Rig::with_size(1, DISK).expect("root checked by the caller"));
    let disk: PathBuf = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let v = requests::create_volume(&mut c, create_req("v", V_SIZE))
        .await
        .volume_id;
    let v_files = files(&mut c, &v, &rig.0.path("staging-v"), None).await;
    let n = requests::create_volume(&mut c, create_req("n", 16 * MIB))
        .await
        .volume_id;
    let n_files = files(&mut c, &n, &rig.0.path("staging-n"), None).await;
    let alloc = gds_csi::csi::id::BlockVolumeId::parse(&v)
        .unwrap()
        .allocation;
    let before = gpt_entries(&disk);
    let v0 = before.iter().find(|e| e.0 == alloc).cloned().unwrap();
    let from = (v0.2, v0.3);

    rig.0.kill9();
    let mut armed = rig
        .0
        .start_with(&[(gds_csi::runtime::faults::ENV, point.as_str())], &[])
        .await;
    let err = armed
        .controller
        .controller_expand_volume(expand_req(&v, GROWN))
        .await
        .expect_err("the call that reaches the kill point never answers");
    let status = rig
        .0
        .wait_exit(Duration::from_secs(60))
        .expect("died at the point");
    assert!(killed_by_sigkill(&status), "{status:?} ({err:?})");
    assert!(rig
        .0
        .logs()
        .contains(&format!("killed at {}", point.as_str())));
    check_at_kill(&rig.0, &disk, &alloc, from, point, &v);

    let mut c = rig.0.start().await;
    let settled = record(&rig.0, &v);
    assert!(
        settled["partition"]["moving"].is_null(),
        "settled at start-up: {settled}"
    );
    for _ in 0..3 {
        let r = c
            .controller
            .controller_expand_volume(expand_req(&v, GROWN))
            .await
            .unwrap_or_else(|e| panic!("retry after {}: {e:?}", point.as_str()))
            .into_inner();
        assert_eq!(r.capacity_bytes as u64, GROWN);
    }
    let gpt = gpt_entries(&disk);
    assert_eq!(gpt.len(), 2, "one entry per volume, no spare: {gpt:?}");
    let v1 = gpt.iter().find(|e| e.0 == alloc).unwrap();
    assert_eq!(v1.1, v0.1, "the same PARTUUID");
    assert_eq!(v1.3, GROWN);
    let verify = run("sgdisk", &["-v", disk.to_str().unwrap()]);
    assert!(verify.contains("No problems found"), "{verify}");
    if v1.2 >= from.0 + from.1 || v1.2 + v1.3 <= from.0 {
        assert!(
            range(&disk, from.0, from.1).iter().all(|b| *b == 0),
            "the old extent reads zeros"
        );
    }
    files(&mut c, &v, &rig.0.path("staging-v"), Some(&v_files)).await;
    files(&mut c, &n, &rig.0.path("staging-n"), Some(&n_files)).await;
    let rec = record(&rig.0, &v);
    assert_eq!(rec["capacity_bytes"].as_u64(), Some(GROWN), "{rec}");
    format!(
        "moved {} -> {} MiB at {} MiB, PARTUUID kept, files equal, old extent zero, sgdisk -v clean",
        V_SIZE / MIB,
        GROWN / MIB,
        v1.2 / MIB
    )
}
