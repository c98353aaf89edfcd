//! Root-only: the cost of a change to the allocation state does not grow with the number
//! of volumes. With 300 partition volumes on a node, one CreateVolume writes one record
//! file of bounded size and one DeleteVolume removes one, and nothing else in the state
//! dir changes: the flatness `scripts/bench.sh scale` measures, kept by a check that
//! times nothing.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use gds_csi::csi::*;

mod common;
use common::{requests, PartRig};

const MIB: u64 = 1 << 20;
const VOLUMES: usize = 300;

/// Every file under the state dir with its size and modification time.
fn files(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                out.insert(e.path(), (meta.len(), meta.modified().unwrap()));
            }
        }
    }
    out
}

/// The files added, changed or removed between two listings.
fn changed(
    before: &BTreeMap<PathBuf, (u64, SystemTime)>,
    after: &BTreeMap<PathBuf, (u64, SystemTime)>,
) -> Vec<(PathBuf, Option<u64>)> {
    let mut out: Vec<_> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v))
        .map(|(p, (len, _))| (p.clone(), Some(*len)))
        .collect();
    out.extend(
        before
            .keys()
            .filter(|p| !after.contains_key(*p))
            .map(|p| (p.clone(), None)),
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_create_or_delete_writes_one_record_whatever_the_volume_count() {
    let Some(mut rig) = PartRig::with_size(2, 640 * MIB) else {
        return;
    };
    let mut c = rig.start().await;
    for i in 0..VOLUMES {
        requests::create_volume(
            &mut c,
            requests::partition_create(&format!("v{i}"), 2 * MIB),
        )
        .await;
    }
    let state = rig.path("state");
    let records = state.join("volumes");
    assert_eq!(fs::read_dir(&records).unwrap().count(), VOLUMES);
    let marker = fs::read_to_string(state.join("volumes.json")).unwrap();
    assert!(
        marker.len() < 256,
        "volumes.json is a marker only: {marker}"
    );

    // File times have a granularity: a change within it would go unseen.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let before = files(&state);
    let v = requests::create_volume(&mut c, requests::partition_create("one-more", 2 * MIB)).await;
    let after = files(&state);
    let diff = changed(&before, &after);
    assert_eq!(diff.len(), 1, "one file changed: {diff:?}");
    let (path, len) = &diff[0];
    assert_eq!(path.parent(), Some(records.as_path()), "{diff:?}");
    let len = len.expect("the new record");
    assert!(len < 4096, "one record is small: {len} bytes");
    assert!(fs::read_to_string(path).unwrap().contains(&v.volume_id));

    std::thread::sleep(std::time::Duration::from_millis(20));
    let before = after;
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let diff = changed(&before, &files(&state));
    assert_eq!(
        diff,
        vec![(path.clone(), None)],
        "the record removed, nothing else written"
    );
    let listed = c
        .controller
        .list_volumes(ListVolumesRequest {
            max_entries: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 100);
    assert!(!listed.next_token.is_empty());
}
