//! Snapshot requests: CreateSnapshot and its class's store checked, the directory a
//! snapshot gets there, a restore's source as its manifest says (the snapshot ids
//! themselves: `csi::id::snapshot`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::dataset::{parse_dir, DirKeys};
use super::nfs_id::NfsVolumeId;
use super::VolumeRef;
use crate::csi;
use crate::csi::id::snapshot::{check_store_dir, dir_name_ok};
pub use crate::csi::id::snapshot::{SnapshotId, SnapshotRef, Store};
use crate::csi::id::MAX_VOLUME_ID_LEN;
use crate::error::{Error, Result};
pub use crate::pool::source::Content;
use crate::pool::SourceOf;

pub const PARAM_STORE_DIR: &str = "storeDir";
pub const PARAM_STORE_SERVER: &str = "storeServer";
pub const PARAM_STORE_SHARE: &str = "storeShare";
pub const PARAM_STORE_PATH: &str = "storePath";
pub const PARAM_STORE_PROTO: &str = "storeProto";
pub const PARAM_STORE_PORT: &str = "storePort";
pub const PARAM_STORE_VERS: &str = "storeVers";
/// `"true"`: the manifest holds each file's SHA-256 (read once more from the store).
pub const PARAM_CHECKSUMS: &str = "checksums";

/// The longest snapshot directory name kept as the CSI name itself; longer names, and
/// names with characters a directory name should not have, are cut and given a hash.
const PLAIN_NAME_MAX: usize = 64;

const STORE: DirKeys = DirKeys {
    server: (PARAM_STORE_SERVER, "parameters.storeServer"),
    share: (PARAM_STORE_SHARE, "parameters.storeShare"),
    path: (PARAM_STORE_PATH, "parameters.storePath"),
    proto: (PARAM_STORE_PROTO, "parameters.storeProto"),
    port: (PARAM_STORE_PORT, "parameters.storePort"),
    vers: (PARAM_STORE_VERS, "parameters.storeVers"),
    what: "a snapshot class's store",
    path_optional: true,
};

/// A ready snapshot a CreateVolume restores, as its manifest says (the service reads
/// it from the store before the backend allocates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restore {
    pub id: SnapshotId,
    /// The id as given (recorded with the volume, answered as its content source).
    pub text: String,
    pub content: Content,
    /// The source's capacity: the smallest volume that holds the snapshot.
    pub size_bytes: u64,
    /// Each file's path and SHA-256 as the manifest recorded them (a snapshot taken with
    /// checksums), which the restored copy must have.
    pub digests: Vec<(String, String)>,
}

impl Restore {
    /// The snapshot's file tree as an NFS directory (an NFS store).
    pub fn nfs_tree(&self) -> Option<NfsVolumeId> {
        self.id.nfs_dir(TREE)
    }

    /// The snapshot's file tree on a directory store.
    pub fn local_tree(&self) -> Option<PathBuf> {
        self.id.local_dir().map(|d| d.join(TREE))
    }
}

/// The directory of a file snapshot's tree, beside its manifest.
pub const TREE: &str = "tree";
/// A raw block snapshot's bytes (sparse: runs of zeros are holes), beside its manifest.
pub const IMAGE: &str = "device.img";

/// A volume's content source as CSI answers it: a snapshot's id or a volume's.
pub fn content_source(source: &SourceOf) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let t = match source {
        SourceOf::Dataset(_) => return None,
        SourceOf::Snapshot { id, .. } => Type::Snapshot(SnapshotSource {
            snapshot_id: id.to_string(),
        }),
        SourceOf::Volume(id) => Type::Volume(VolumeSource {
            volume_id: id.raw(),
        }),
    };
    Some(csi::VolumeContentSource { r#type: Some(t) })
}

/// CreateSnapshot, checked.
#[derive(Debug, Clone)]
pub struct CreateSnapshot {
    pub name: String,
    /// The volume to take it of; `Unknown` (NotFound once looked for) when the id is none
    /// of this driver's.
    pub source: VolumeRef,
    pub id: SnapshotId,
    pub checksums: bool,
}

/// The snapshot DeleteSnapshot names.
pub fn delete_snapshot(req: &csi::DeleteSnapshotRequest) -> Result<SnapshotRef> {
    SnapshotRef::parse("snapshot_id", &req.snapshot_id)
}

/// The snapshot GetSnapshot names.
pub fn get_snapshot(req: &csi::GetSnapshotRequest) -> Result<SnapshotRef> {
    SnapshotRef::parse("snapshot_id", &req.snapshot_id)
}

/// ListSnapshots' `snapshot_id` filter: none when empty.
pub fn list_snapshots_filter(req: &csi::ListSnapshotsRequest) -> Option<SnapshotRef> {
    SnapshotRef::filter(&req.snapshot_id)
}

pub fn create_snapshot(req: &csi::CreateSnapshotRequest) -> Result<CreateSnapshot> {
    let name = super::name(&req.name)?;
    if req.source_volume_id.is_empty() {
        return Err(Error::invalid(
            "source_volume_id",
            "required: the volume to take the snapshot of",
        ));
    }
    let params: BTreeMap<String, String> = req
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    check_class_keys(&params)?;
    let checksums = wants_checksums(&params)?;
    let store = store(&params)?;
    let id = SnapshotId {
        store,
        dir: dir_name(&name),
    };
    check_id_len(&id)?;
    Ok(CreateSnapshot {
        name,
        source: VolumeRef::of(&req.source_volume_id),
        id,
        checksums,
    })
}

/// Every VolumeSnapshotClass parameter is one this driver knows, or the
/// external-snapshotter's own (snapshot name, namespace, content name).
fn check_class_keys(params: &BTreeMap<String, String>) -> Result<()> {
    let known = [
        PARAM_STORE_DIR,
        PARAM_STORE_SERVER,
        PARAM_STORE_SHARE,
        PARAM_STORE_PATH,
        PARAM_STORE_PROTO,
        PARAM_STORE_PORT,
        PARAM_STORE_VERS,
        PARAM_CHECKSUMS,
    ];
    let unknown = params
        .keys()
        .filter(|key| !key.starts_with("csi.storage.k8s.io/"))
        .find(|key| !known.contains(&key.as_str()));
    match unknown {
        Some(key) => Err(Error::invalid(
            "parameters",
            format!(
                "unknown VolumeSnapshotClass parameter {key:?}; known: {}",
                known.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// The `checksums` parameter; absent means false.
fn wants_checksums(params: &BTreeMap<String, String>) -> Result<bool> {
    match params.get(PARAM_CHECKSUMS).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::invalid(
            "parameters.checksums",
            format!("{other:?} must be \"true\" or \"false\""),
        )),
    }
}

/// The id fits in CSI's limit; too long, the store's parameter is the one to shorten.
fn check_id_len(id: &SnapshotId) -> Result<()> {
    let text = id.to_string();
    if text.len() <= MAX_VOLUME_ID_LEN {
        return Ok(());
    }
    let field = match id.store {
        Store::Dir(_) => "parameters.storeDir",
        Store::Nfs(_) => "parameters.storePath",
    };
    Err(Error::invalid(
        field,
        format!(
            "the snapshot id {text} would be {} bytes, over CSI's {MAX_VOLUME_ID_LEN}: \
             name a shorter store (server, share, path or directory)",
            text.len()
        ),
    ))
}

fn store(params: &BTreeMap<String, String>) -> Result<Store> {
    let nfs = parse_dir(params, &STORE)?;
    match (params.get(PARAM_STORE_DIR), nfs) {
        (Some(_), Some(_)) => Err(Error::invalid(
            "parameters.storeDir",
            "a store is either a directory (storeDir) or an NFS export (storeServer, \
             storeShare, storePath): set one",
        )),
        (None, None) => Err(Error::invalid(
            "parameters",
            "the snapshot class names no store: set storeServer and storeShare (an NFS \
             export, storePath optional) or storeDir (a directory every node sees)",
        )),
        (None, Some(id)) => Ok(Store::Nfs(id)),
        (Some(dir), None) => {
            let path = PathBuf::from(dir);
            check_store_dir(&path).map_err(|e| Error::invalid("parameters.storeDir", e))?;
            Ok(Store::Dir(path))
        }
    }
}

/// Joins a cut name and its hash in an encoded directory name; never in a plain one.
const ENCODED: char = '@';

/// The snapshot's directory: its CSI name when that is a plain directory name of at most
/// `PLAIN_NAME_MAX` bytes without `@`, else a cut of it, `@` and 16 hex digits of SHA-256
/// of the name (the same each time, so a repeated CreateSnapshot finds the same
/// directory). One name, one directory: a plain name never holds `@`, an encoded one always
/// does, so no name's directory is another name's.
pub fn dir_name(name: &str) -> String {
    if name.len() <= PLAIN_NAME_MAX && dir_name_ok(name) && !name.contains(ENCODED) {
        return name.to_owned();
    }
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!(
        "{cleaned}{ENCODED}{}",
        crate::runtime::state_dir::short_hash(name)
    )
}

/// Whether `dir` is the directory of the snapshot named `name`: its `dir_name`, or the
/// form encoded names had before `@` joined a cut name and its hash (`-`).
pub fn names_dir(name: &str, dir: &str) -> bool {
    let now = dir_name(name);
    now == dir
        || now
            .rsplit_once(ENCODED)
            .is_some_and(|(cut, hash)| dir == format!("{cut}-{hash}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn req(name: &str, params: &[(&str, &str)]) -> csi::CreateSnapshotRequest {
        csi::CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: "blk:dev-1:aa:node".into(),
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn field(e: Error) -> String {
        match e {
            Error::InvalidArgument { field, reason } => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ids_round_trip_for_both_stores_and_carry_the_directory() {
        let dir = create_snapshot(&req("snap-1", &[("storeDir", "/var/lib/snaps")])).unwrap();
        let text = dir.id.to_string();
        assert_eq!(text, "snap:dir:~var~lib~snaps:snap-1");
        assert_eq!(SnapshotId::parse(&text), Some(dir.id.clone()));
        assert_eq!(
            dir.id.local_dir().unwrap(),
            Path::new("/var/lib/snaps/snap-1")
        );

        let nfs = create_snapshot(&req(
            "snapshot-0b6f",
            &[
                ("storeServer", "192.0.2.1"),
                ("storeShare", "/export"),
                ("storePath", "snaps"),
            ],
        ))
        .unwrap();
        let text = nfs.id.to_string();
        assert_eq!(
            text,
            "snap:nfs:r-rdma-20049-4.1:~export:snaps~snapshot-0b6f:192.0.2.1"
        );
        let back = SnapshotId::parse(&text).unwrap();
        assert_eq!(back, nfs.id);
        assert_eq!(
            back.nfs_dir("tree").unwrap().source(),
            "192.0.2.1:/export/snaps/snapshot-0b6f/tree"
        );
        // The share's root as the store.
        let root = create_snapshot(&req(
            "s",
            &[("storeServer", "192.0.2.1"), ("storeShare", "/")],
        ))
        .unwrap();
        assert_eq!(
            SnapshotId::parse(&root.id.to_string()),
            Some(root.id.clone())
        );
        assert_eq!(root.id.location(), "192.0.2.1:/s");
    }

    #[test]
    fn a_long_or_odd_name_gets_a_stable_hashed_directory() {
        let long = "x".repeat(128);
        let a = dir_name(&long);
        assert_eq!(a, dir_name(&long));
        assert!(a.len() < 64 && dir_name_ok(&a), "{a}");
        assert_ne!(dir_name("a/b"), dir_name("a:b"));
        // No plain name is another name's encoded directory.
        let encoded = dir_name("x/y");
        assert!(encoded.starts_with("x-y@"), "{encoded}");
        assert_ne!(dir_name(&encoded), encoded);
        assert_eq!(dir_name("x-y"), "x-y");
        assert!(names_dir("x/y", &encoded) && names_dir("x-y", "x-y"));
        assert!(
            names_dir("x/y", &encoded.replace('@', "-")),
            "the earlier encoding"
        );
        assert!(!names_dir("x-y", &encoded) && !names_dir("x/y", "x-y"));
        assert!(dir_name_ok(&dir_name("..")));
        let id = create_snapshot(&req(&long, &[("storeDir", "/var/lib/snaps")])).unwrap();
        assert!(id.id.to_string().len() <= MAX_VOLUME_ID_LEN);
    }

    #[test]
    fn bad_parameters_name_the_parameter() {
        let e = |p: &[(&str, &str)]| field(create_snapshot(&req("s", p)).unwrap_err());
        assert!(e(&[]).starts_with("parameters: the snapshot class names no store"));
        assert!(e(&[("storeDir", "relative")]).starts_with("parameters.storeDir: "));
        assert!(e(&[("storeDir", "/a/../b")]).starts_with("parameters.storeDir: "));
        assert!(e(&[
            ("storeDir", "/a"),
            ("storeServer", "h"),
            ("storeShare", "/e")
        ])
        .starts_with("parameters.storeDir: a store is either"));
        assert!(e(&[("storeServer", "h")]).starts_with("parameters.storeShare: required"));
        assert!(e(&[
            ("storeServer", "h"),
            ("storeShare", "/e"),
            ("storePort", "0")
        ])
        .starts_with("parameters.storePort: "));
        assert!(
            e(&[("storeDir", "/a"), ("checksums", "yes")]).starts_with("parameters.checksums: ")
        );
        assert!(e(&[("storeDir", "/a"), ("bogus", "1")]).contains("\"bogus\""));
        let long = format!("/{}", "d".repeat(96));
        assert!(e(&[("storeDir", &long)]).starts_with("parameters.storeDir: "));
        let no_name = csi::CreateSnapshotRequest {
            source_volume_id: "x".into(),
            ..Default::default()
        };
        assert!(field(create_snapshot(&no_name).unwrap_err()).starts_with("name: "));
        let no_source = csi::CreateSnapshotRequest {
            name: "x".into(),
            ..Default::default()
        };
        assert!(field(create_snapshot(&no_source).unwrap_err()).starts_with("source_volume_id: "));
    }

    #[test]
    fn what_is_no_snapshot_id_parses_to_none() {
        for text in [
            "",
            "snap",
            "snap:",
            "snap:dir:rel:x",
            "snap:dir:~a:..",
            "snap:dir:~a:.hidden",
            "snap:nfs:d-rdma-20049-4.1:~export:snaps~x:h",
            "nfs:r-rdma-20049-4.1:~export:x:h",
            "non-existing-snapshot-id",
            "snap:dir:~a/b:x",
            "snap:nfs:r-rdma-20049-4.1:~export:a/b~x:h",
        ] {
            assert_eq!(SnapshotId::parse(text), None, "{text}");
        }
    }
}
