//! Root-only: growth on a crowded drive, through the real binary on a 4 GiB loop device.
//! 24 partition claims of 64-160 MiB (2.6 GiB carved), each written (ext4), then each
//! expanded to 1.5 x its size while staged (online): every one the room kept after its
//! partition allows grows in place, the rest are refused (FailedPrecondition, saying when
//! it can grow). Then every third claim is deleted and the others, unstaged (offline),
//! are expanded to 2 x their first size one after another: every expansion that fits
//! the drive succeeds, in place or moved past its neighbour, and the files stay intact.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::path::Path;

use gds_csi::csi::Clients;
use gds_csi::csi::*;
use tonic::Code;

mod common;
use common::{digest_file, requests, run, PartRig};

const MIB: u64 = 1 << 20;
const DISK: u64 = 4 << 30;
/// The usable span of a GPT on DISK, in whole MiB (the label's head and tail outside).
const USABLE: (u64, u64) = (MIB, DISK - MIB);

fn sizes() -> Vec<u64> {
    (0..24).map(|i| (64 + (i * 37) % 97) * MIB).collect()
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

/// Every label entry's (name, start, bytes), in device order.
fn entries(disk: &Path) -> Vec<(String, u64, u64)> {
    let out = run("sfdisk", &["-J", disk.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let parts = v["partitiontable"]["partitions"].as_array().cloned();
    let mut all: Vec<(String, u64, u64)> = parts
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["start"].as_u64().unwrap() * 512,
                p["size"].as_u64().unwrap() * 512,
            )
        })
        .collect();
    all.sort_by_key(|e| e.1);
    all
}

/// Whether `alloc` can grow to `bytes` in place, and the largest free extent.
fn room(disk: &Path, alloc: &str, bytes: u64) -> (bool, u64) {
    let all = entries(disk);
    let i = all.iter().position(|e| e.0 == alloc).unwrap();
    let next = all.get(i + 1).map_or(USABLE.1, |e| e.1);
    let in_place = all[i].1 + bytes <= next;
    let mut at = USABLE.0;
    let mut largest = 0;
    for e in all.iter().map(|e| (e.1, e.2)).chain([(USABLE.1, 0)]) {
        largest = largest.max(e.0.saturating_sub(at));
        at = at.max(e.0 + e.1);
    }
    (in_place, largest)
}

struct Claim {
    id: String,
    alloc: String,
    size: u64,
    digest: Vec<u8>,
}

async fn write_files(c: &mut Clients, rig: &PartRig, claims: &mut [Claim]) {
    let staging = rig.0.path("staging");
    for (i, cl) in claims.iter_mut().enumerate() {
        requests::stage(c, &cl.id, &staging, requests::single_writer_mount())
            .await
            .unwrap();
        let bytes: Vec<u8> = (0..4 * MIB as usize)
            .map(|b| (b * 31 + i * 7) as u8)
            .collect();
        fs::write(staging.join("data"), bytes).unwrap();
        run("sync", &[]);
        cl.digest = digest_file(&staging.join("data"));
        requests::unstage(c, &cl.id, &staging).await.unwrap();
    }
}

async fn check_files(c: &mut Clients, rig: &PartRig, claims: &[Claim]) {
    let staging = rig.0.path("staging");
    for cl in claims {
        requests::stage(c, &cl.id, &staging, requests::single_writer_mount())
            .await
            .unwrap();
        assert_eq!(digest_file(&staging.join("data")), cl.digest, "{}", cl.id);
        requests::unstage(c, &cl.id, &staging).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_expansion_that_fits_succeeds_offline_and_most_grow_in_place_online() {
    let Some(mut rig) = PartRig::with_size(1, DISK) else {
        return;
    };
    let disk = rig.0.loops[0].clone();
    let mut c = rig.0.start().await;
    let mut claims = Vec::new();
    for (i, size) in sizes().into_iter().enumerate() {
        let req = requests::partition_create(&format!("claim-{i}"), size);
        let id = requests::create_volume(&mut c, req).await.volume_id;
        let alloc = gds_csi::csi::id::BlockVolumeId::parse(&id)
            .unwrap()
            .allocation;
        claims.push(Claim {
            id,
            alloc,
            size,
            digest: Vec::new(),
        });
    }
    write_files(&mut c, &rig, &mut claims).await;

    // Online: each staged while it is expanded to 1.5 x.
    let staging = rig.0.path("staging-online");
    let (mut in_place, mut refused) = (0, 0);
    for cl in &mut claims {
        let wanted = (cl.size * 3 / 2).next_multiple_of(MIB);
        let (fits_in_place, _) = room(&disk, &cl.alloc, wanted);
        requests::stage(&mut c, &cl.id, &staging, requests::single_writer_mount())
            .await
            .unwrap();
        match c
            .controller
            .controller_expand_volume(expand_req(&cl.id, wanted))
            .await
        {
            Ok(r) => {
                assert!(fits_in_place, "{}: grown though the room was taken", cl.id);
                assert_eq!(r.into_inner().capacity_bytes as u64, wanted);
                cl.size = wanted;
                in_place += 1;
            }
            Err(e) => {
                assert!(!fits_in_place, "{}: refused with room: {e}", cl.id);
                assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
                assert!(e.message().contains("once no pod uses it"), "{e}");
                refused += 1;
            }
        }
        requests::unstage(&mut c, &cl.id, &staging).await.unwrap();
    }
    println!("online, 24 claims to 1.5 x: {in_place} grew in place, {refused} refused");
    assert!(
        in_place * 4 >= 24 * 3,
        "goal: 75 % in place; {in_place} of 24"
    );

    // Offline: every third claim deleted, the others to 2 x their first size; a move
    // where the room is taken.
    let mut kept = Vec::new();
    for (i, (cl, first)) in claims.into_iter().zip(sizes()).enumerate() {
        if i % 3 == 1 {
            c.controller
                .delete_volume(requests::delete_request(&cl.id))
                .await
                .unwrap();
        } else {
            kept.push((cl, first));
        }
    }
    let (mut grown, mut moved, mut no_room) = (0, 0, 0);
    for (cl, first) in &mut kept {
        let first = *first;
        let wanted = 2 * first;
        let (fits_in_place, largest) = room(&disk, &cl.alloc, wanted);
        let start = entries(&disk)
            .into_iter()
            .find(|e| e.0 == cl.alloc)
            .unwrap()
            .1;
        match c
            .controller
            .controller_expand_volume(expand_req(&cl.id, wanted))
            .await
        {
            Ok(r) => {
                assert!(
                    fits_in_place || largest >= wanted,
                    "{}: grew beyond the free space",
                    cl.id
                );
                assert_eq!(r.into_inner().capacity_bytes as u64, wanted);
                let now = entries(&disk)
                    .into_iter()
                    .find(|e| e.0 == cl.alloc)
                    .unwrap();
                assert_eq!(now.2, wanted);
                if now.1 != start {
                    moved += 1;
                }
                cl.size = wanted;
                grown += 1;
            }
            Err(e) => {
                assert!(
                    !fits_in_place && largest < wanted,
                    "{}: refused though it fits: {e}",
                    cl.id
                );
                assert_eq!(e.code(), Code::OutOfRange, "{e}");
                no_room += 1;
            }
        }
    }
    println!(
        "offline, {} claims to 2 x: {grown} grew ({moved} moved), {no_room} found no room",
        kept.len()
    );
    assert!(moved > 0, "the scenario moves some volumes");
    assert_eq!(
        entries(&disk).len(),
        kept.len(),
        "one label entry per volume"
    );
    let claims: Vec<Claim> = kept.into_iter().map(|(cl, _)| cl).collect();
    let verify = run("sgdisk", &["-v", disk.to_str().unwrap()]);
    assert!(verify.contains("No problems found"), "{verify}");
    check_files(&mut c, &rig, &claims).await;
    rig.0.kill9();
}
