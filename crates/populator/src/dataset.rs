//! The Dataset custom resource: where a claim's data is, checked before anything is made,
//! and the status the populator reports per claim.

use std::path::{Path, PathBuf};

use kube::core::{ApiResource, GroupVersionKind};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "gds-csi.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "Dataset";

pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), "datasets")
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// A directory on the node, beneath the chart's `populator.nodeDatasetRoot`.
    pub node_path: Option<String>,
    /// A directory on an NFS export.
    pub nfs: Option<Nfs>,
    /// `sizes` (default) or `checksum`.
    pub verify: Option<String>,
}

/// `server:/share/path` and its transport. The fill pod checks it in full, by the rules
/// of a class's `dataset*` parameters (`gds-csi populate`); the populator only what a
/// claim's event should say before anything is made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nfs {
    pub server: String,
    pub share: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vers: Option<String>,
}

/// Where a Dataset's tree is, as the fill pod opens it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// `rel` beneath the node's dataset root.
    Node { rel: PathBuf },
    /// An NFS directory, mounted by the fill pod.
    Nfs(Nfs),
}

/// The source a Dataset names, checked: an error says which field is wrong and how to
/// write it. `root` is the node directory datasets may be read from (none: refused).
pub fn source(spec: &Spec, root: Option<&Path>) -> Result<Source, String> {
    if let Some(v) = spec.verify.as_deref() {
        if v != "sizes" && v != "checksum" {
            return Err(format!(
                "spec.verify: {v:?} is neither \"sizes\" nor \"checksum\""
            ));
        }
    }
    match (&spec.node_path, &spec.nfs) {
        (Some(_), Some(_)) => Err("spec: set nodePath or nfs, not both".into()),
        (None, None) => {
            Err("spec: set nodePath (a directory on the node) or nfs (server, share, path)".into())
        }
        (None, Some(n)) => nfs_source(n),
        (Some(p), None) => node_source(p, root),
    }
}

/// Whether `rel` is a plain relative path: no empty, `.` or `..` component.
pub fn plain_relative(rel: &str) -> bool {
    !rel.is_empty() && rel.split('/').all(|seg| !matches!(seg, "" | "." | ".."))
}

fn nfs_source(n: &Nfs) -> Result<Source, String> {
    if n.server.is_empty() {
        return Err("spec.nfs.server: required (a host name or address)".into());
    }
    if !n.share.starts_with('/') || n.share.split('/').any(|s| s == "..") {
        return Err(format!(
            "spec.nfs.share: {:?} must be the absolute exported path",
            n.share
        ));
    }
    if !plain_relative(n.path.trim_matches('/')) {
        return Err(format!(
            "spec.nfs.path: {:?} must name the dataset's directory below the share, without \
             `.` or `..`",
            n.path
        ));
    }
    Ok(Source::Nfs(n.clone()))
}

fn node_source(path: &str, root: Option<&Path>) -> Result<Source, String> {
    let Some(root) = root else {
        return Err(
            "spec.nodePath: node directories are off in this cluster (the chart's \
             populator.nodeDatasetRoot is empty); ask the administrator to set it"
                .into(),
        );
    };
    let p = Path::new(path);
    // Segment by segment: `Path::components` would drop a `.` or an empty segment.
    let plain = path.len() > 1
        && path.starts_with('/')
        && path[1..]
            .split('/')
            .all(|seg| !matches!(seg, "" | "." | ".."));
    if !plain {
        return Err(format!(
            "spec.nodePath: {path:?} must be an absolute path without `.`, `..`, `//` or a \
             trailing `/`"
        ));
    }
    match p.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => Ok(Source::Node { rel: ".".into() }),
        Ok(rel) => Ok(Source::Node { rel: rel.into() }),
        Err(_) => Err(format!(
            "spec.nodePath: {path:?} is not beneath the node dataset root {}; move the \
             dataset there",
            root.display()
        )),
    }
}

/// One claim's fill, as the Dataset's status lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    pub claim: String,
    /// Pending, Copying, Done or Failed.
    pub phase: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(default)]
    pub copied_bytes: u64,
    #[serde(default)]
    pub total_bytes: u64,
    #[serde(default)]
    pub entries: u64,
    #[serde(default)]
    pub bytes_per_second: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_error: String,
}

/// The Dataset's status: one entry per claim naming it, and the columns `kubectl get`
/// shows (claims filling, filled, and how far the fills in progress are together).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub claims: Vec<ClaimStatus>,
    #[serde(default)]
    pub filling: u64,
    #[serde(default)]
    pub filled: u64,
    #[serde(default)]
    pub progress: String,
}

impl Status {
    /// The status of `claims` (sorted by claim), a Done claim keeping the figures it had.
    pub fn of(mut claims: Vec<ClaimStatus>, before: &Status) -> Status {
        for c in &mut claims {
            if c.phase == "Done" && c.total_bytes == 0 {
                if let Some(b) = before.claims.iter().find(|b| b.claim == c.claim) {
                    c.copied_bytes = b.total_bytes;
                    c.total_bytes = b.total_bytes;
                    c.entries = b.entries;
                }
            }
        }
        claims.sort_by(|a, b| a.claim.cmp(&b.claim));
        let active: Vec<&ClaimStatus> = claims
            .iter()
            .filter(|c| c.phase == "Pending" || c.phase == "Copying")
            .collect();
        let filled = claims.iter().filter(|c| c.phase == "Done").count() as u64;
        let progress = progress(&active, claims.iter().any(|c| c.phase == "Failed"));
        Status {
            filling: active.len() as u64,
            filled,
            progress,
            claims,
        }
    }
}

/// `43% (12.1 GiB of 28.0 GiB), 3m left` over the fills in progress.
fn progress(active: &[&ClaimStatus], failed: bool) -> String {
    let (copied, total, rate) = active.iter().fold((0u64, 0u64, 0u64), |a, c| {
        (
            a.0 + c.copied_bytes,
            a.1 + c.total_bytes,
            a.2 + c.bytes_per_second,
        )
    });
    if active.is_empty() {
        return if failed { "failed" } else { "idle" }.into();
    }
    if total == 0 {
        return "starting".into();
    }
    let mut s = format!(
        "{}% ({} of {})",
        copied * 100 / total,
        size(copied),
        size(total)
    );
    if let Some(eta) = eta(copied, total, rate) {
        s.push_str(&format!(", {} left", short(eta)));
    }
    s
}

pub fn eta(copied: u64, total: u64, rate: u64) -> Option<u64> {
    (rate > 0 && total >= copied).then(|| (total - copied).div_ceil(rate))
}

/// `812.4 MiB`, `28.0 GiB`, `1.2 TiB`.
fn size(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        n if n < 1 << 30 => format!("{:.1} MiB", b / (1u64 << 20) as f64),
        n if n < 1 << 40 => format!("{:.1} GiB", b / (1u64 << 30) as f64),
        _ => format!("{:.1} TiB", b / (1u64 << 40) as f64),
    }
}

fn short(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str) -> Result<Source, String> {
        let spec = Spec {
            node_path: Some(path.into()),
            ..Default::default()
        };
        source(&spec, Some(Path::new("/srv/datasets")))
    }

    #[test]
    fn node_paths_must_be_plain_and_beneath_the_root() {
        assert_eq!(
            node("/srv/datasets/imagenet/train"),
            Ok(Source::Node {
                rel: "imagenet/train".into()
            })
        );
        assert_eq!(node("/srv/datasets"), Ok(Source::Node { rel: ".".into() }));
        for bad in [
            "srv/datasets/a",
            "/srv/datasets/../etc",
            "/srv/datasets/./a",
            "/srv/datasets//a",
            "/srv/datasets/a/",
            "/srv/datasetsX",
            "/etc",
            "/",
        ] {
            let e = node(bad).unwrap_err();
            assert!(e.starts_with("spec.nodePath:"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_cluster_without_a_root_refuses_node_paths_and_nfs_is_named() {
        let spec = Spec {
            node_path: Some("/srv/datasets/a".into()),
            ..Default::default()
        };
        assert!(source(&spec, None).unwrap_err().contains("nodeDatasetRoot"));
        let nfs = |share: &str, path: &str| Spec {
            nfs: Some(Nfs {
                server: "nfs01".into(),
                share: share.into(),
                path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(source(&nfs("/export", "datasets/imagenet"), None).is_ok());
        for (share, path, field) in [
            ("export", "a", "spec.nfs.share"),
            ("/export/..", "a", "spec.nfs.share"),
            ("/export", "../a", "spec.nfs.path"),
            ("/export", "", "spec.nfs.path"),
            ("/export", "a/./b", "spec.nfs.path"),
        ] {
            let e = source(&nfs(share, path), None).unwrap_err();
            assert!(e.starts_with(field), "{share} {path}: {e}");
        }
        let bad = Spec {
            node_path: Some("/srv/a".into()),
            verify: Some("crc".into()),
            ..Default::default()
        };
        assert!(source(&bad, Some(Path::new("/srv")))
            .unwrap_err()
            .starts_with("spec.verify:"));
    }

    #[test]
    fn the_status_counts_fills_and_keeps_a_done_claims_figures() {
        let before = Status {
            claims: vec![ClaimStatus {
                claim: "b".into(),
                phase: "Copying".into(),
                total_bytes: 4 << 30,
                entries: 9,
                ..Default::default()
            }],
            ..Default::default()
        };
        let now = Status::of(
            vec![
                ClaimStatus {
                    claim: "b".into(),
                    phase: "Done".into(),
                    ..Default::default()
                },
                ClaimStatus {
                    claim: "a".into(),
                    phase: "Copying".into(),
                    copied_bytes: 1 << 30,
                    total_bytes: 4 << 30,
                    bytes_per_second: 1 << 28,
                    ..Default::default()
                },
            ],
            &before,
        );
        assert_eq!((now.filling, now.filled), (1, 1));
        assert_eq!(now.claims[0].claim, "a");
        assert_eq!(now.claims[1].total_bytes, 4 << 30);
        assert_eq!(now.progress, "25% (1.0 GiB of 4.0 GiB), 12s left");
        assert_eq!(size(120 << 20), "120.0 MiB");
    }
}
