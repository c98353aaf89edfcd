//! Snapshot calls as the root tests make them: a directory store, CreateSnapshot repeated
//! until ready, a restore, a volume staged and published for a test to write, and a
//! tree's full state (bytes, kinds, owners, modes, links) to compare restores with.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_content_source::{SnapshotSource, Type};
use gds_csi::csi::*;

use super::{digest_file, requests, Rig};

/// A CreateSnapshot of `source` onto the directory store `store`, with checksums.
pub fn snapshot_req(name: &str, source: &str, store: &Path) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        parameters: [
            ("storeDir".to_string(), store.display().to_string()),
            ("checksums".to_string(), "true".to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// CreateSnapshot repeated (as the snapshotter does) until the snapshot is ready.
pub async fn take(c: &mut Clients, req: CreateSnapshotRequest) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = c
            .controller
            .create_snapshot(req.clone())
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        if s.ready_to_use {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "snapshot {} never ready",
            req.name
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A CreateVolume from the snapshot `snapshot_id`.
pub fn restore_req(name: &str, snapshot_id: &str, cap: VolumeCapability) -> CreateVolumeRequest {
    let mut req = requests::create_without_gds(name, cap);
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.into(),
        })),
    });
    req
}

pub async fn delete_snapshot(c: &mut Clients, snapshot_id: &str) {
    c.controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snapshot_id.into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Volume `id` staged and published under the rig as `tag`: (staging, target).
pub async fn stage_publish(c: &mut Clients, rig: &Rig, id: &str, tag: &str) -> (PathBuf, PathBuf) {
    let (staging, target) = (
        rig.path(&format!("staging/{tag}")),
        rig.path(&format!("pods/{tag}/v")),
    );
    fs::create_dir_all(&staging).unwrap();
    let cap = requests::single_writer_mount();
    requests::stage(c, id, &staging, cap.clone()).await.unwrap();
    requests::publish(c, id, &staging, &target, cap)
        .await
        .unwrap();
    (staging, target)
}

pub async fn take_down(c: &mut Clients, id: &str, staging: &Path, target: &Path) {
    requests::unpublish(c, id, target).await.unwrap();
    requests::unstage(c, id, staging).await.unwrap();
}

/// A directory store under /tmp, removed with the test.
pub fn store_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gds-snapstore-")
        .tempdir_in("/tmp")
        .unwrap()
}

/// Every entry below `root` but `lost+found`: its kind, SHA-256 or symlink text, owner,
/// mode, mtime and, for a file, the first name of its inode below `root` (how many links
/// it has is left out: a snapshot's copy may share its inode with other snapshots').
pub fn tree_state(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut first_name: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(root.join(&rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            if rel == Path::new("lost+found") {
                continue;
            }
            let (path, key) = (root.join(&rel), rel.display().to_string());
            let m = fs::symlink_metadata(&path).unwrap();
            let what = if m.is_dir() {
                stack.push(rel.clone());
                "dir".to_string()
            } else if m.is_symlink() {
                format!("symlink {}", fs::read_link(&path).unwrap().display())
            } else {
                let first = first_name.entry(m.ino()).or_insert_with(|| key.clone());
                let sum: String = digest_file(&path)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                format!("file {sum} first {first}")
            };
            let dir_time = if m.is_dir() { 0 } else { m.mtime() };
            let line = format!("{what} {}:{} {:o} {dir_time}", m.uid(), m.gid(), m.mode());
            out.insert(key, line);
        }
    }
    out
}

/// The bytes the files below `root` take (each inode once).
pub fn bytes_used(root: &Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-s", "-B1"])
        .arg(root)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `have` equals `want`, or a panic naming the first entries that differ.
pub fn assert_same_tree(
    have: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
    what: &str,
) {
    let keys: std::collections::BTreeSet<&String> = have.keys().chain(want.keys()).collect();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| have.get(*k) != want.get(*k))
        .take(5)
        .map(|k| format!("{k}: {:?} instead of {:?}", have.get(k), want.get(k)))
        .collect();
    assert!(differ.is_empty(), "{what}: {}", differ.join("; "));
}
