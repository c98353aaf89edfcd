//! A dataset named by a block StorageClass: every volume of the class is a
//! clone of one directory on an NFS export, without a claim to clone from.
//!
//! `datasetServer`, `datasetShare` and `datasetPath` name `server:/share/path` with the
//! rules of an NFS class's `server` and `share` and of a volume directory; the transport
//! is what an NFS class gets from its mountOptions (`rdma`, `port=`, `vers=`), here as
//! parameters because a block class's mountOptions are its filesystem's:
//! `datasetProto` (default `rdma`), `datasetPort` (default 20049 with RDMA, the
//! protocol's own otherwise) and `datasetVers` (default `4.1`).

use std::collections::BTreeMap;

use super::nfs::{check_dir, check_server, check_share, OnDelete};
use super::nfs_id::NfsVolumeId;
use super::nfs_options::{Transport, RDMA_PORT};
use crate::error::{Error, Result};

pub const PARAM_SERVER: &str = "datasetServer";
pub const PARAM_SHARE: &str = "datasetShare";
pub const PARAM_PATH: &str = "datasetPath";
pub const PARAM_PROTO: &str = "datasetProto";
pub const PARAM_PORT: &str = "datasetPort";
pub const PARAM_VERS: &str = "datasetVers";
pub const PARAMS: &[&str] = &[
    PARAM_SERVER,
    PARAM_SHARE,
    PARAM_PATH,
    PARAM_PROTO,
    PARAM_PORT,
    PARAM_VERS,
];

/// The parameters that name one NFS directory: a class's dataset, a snapshot class's
/// store. Each key with the field an error names.
pub struct DirKeys {
    pub server: (&'static str, &'static str),
    pub share: (&'static str, &'static str),
    pub path: (&'static str, &'static str),
    pub proto: (&'static str, &'static str),
    pub port: (&'static str, &'static str),
    pub vers: (&'static str, &'static str),
    /// What the directory is, in messages ("a class's dataset").
    pub what: &'static str,
    /// Whether `path` may be left out (the share's root itself).
    pub path_optional: bool,
}

impl DirKeys {
    fn all(&self) -> [(&'static str, &'static str); 6] {
        [
            self.server,
            self.share,
            self.path,
            self.proto,
            self.port,
            self.vers,
        ]
    }

    fn invalid(&self, key: &str, reason: String) -> Error {
        let field = self
            .all()
            .into_iter()
            .find(|(k, _)| *k == key)
            .map_or("parameters", |(_, f)| f);
        Error::invalid(field, reason)
    }
}

const DATASET: DirKeys = DirKeys {
    server: (PARAM_SERVER, "parameters.datasetServer"),
    share: (PARAM_SHARE, "parameters.datasetShare"),
    path: (PARAM_PATH, "parameters.datasetPath"),
    proto: (PARAM_PROTO, "parameters.datasetProto"),
    port: (PARAM_PORT, "parameters.datasetPort"),
    vers: (PARAM_VERS, "parameters.datasetVers"),
    what: "a class's dataset",
    path_optional: false,
};

/// The dataset the class names, as the id of an NFS directory (`onDelete` retain: the
/// driver never removes it), or None when the class names none.
pub fn parse(stored: &BTreeMap<String, String>) -> Result<Option<NfsVolumeId>> {
    parse_dir(stored, &DATASET)
}

/// The NFS directory `keys` name in `stored`, or None when no key of them is there.
pub fn parse_dir(stored: &BTreeMap<String, String>, keys: &DirKeys) -> Result<Option<NfsVolumeId>> {
    if !keys.all().iter().any(|(k, _)| stored.contains_key(*k)) {
        return Ok(None);
    }
    let (server_key, share_key, path_key) = (keys.server.0, keys.share.0, keys.path.0);
    let get = |key: &str| {
        stored.get(key).ok_or_else(|| {
            keys.invalid(
                key,
                format!(
                    "required with any of these parameters: {} is \
                     {server_key}:{share_key}/{path_key}",
                    keys.what
                ),
            )
        })
    };
    let server = get(server_key)?;
    check_server(server).map_err(|e| keys.invalid(server_key, e))?;
    let share = check_share(get(share_key)?).map_err(|e| keys.invalid(share_key, e))?;
    let path = match stored.get(path_key) {
        None if keys.path_optional => String::new(),
        _ => get(path_key)?.trim_matches('/').to_owned(),
    };
    if !(path.is_empty() && keys.path_optional) {
        check_dir(&path).map_err(|e| keys.invalid(path_key, e))?;
    }
    let transport = transport(stored, keys)?;
    let id = NfsVolumeId {
        server: server.clone(),
        share,
        dir: path,
        on_delete: OnDelete::Retain,
        transport,
    };
    // Recorded with the volume and parsed again at NodeStage: it must be a valid id.
    if !id.dir.is_empty() && NfsVolumeId::parse(&id.to_string()).as_ref() != Some(&id) {
        return Err(keys.invalid(
            server_key,
            format!(
                "{} {} cannot be named by this driver",
                keys.what,
                id.source()
            ),
        ));
    }
    Ok(Some(id))
}

fn transport(stored: &BTreeMap<String, String>, keys: &DirKeys) -> Result<Transport> {
    let proto = stored
        .get(keys.proto.0)
        .cloned()
        .unwrap_or_else(|| "rdma".into());
    let port = match stored.get(keys.port.0) {
        None if proto.starts_with("rdma") => Some(RDMA_PORT),
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|n| *n != 0 && n.to_string() == *p)
                .ok_or_else(|| {
                    keys.invalid(keys.port.0, format!("{p:?} must be a port, 1-65535"))
                })?,
        ),
    };
    let vers = Some(
        stored
            .get(keys.vers.0)
            .cloned()
            .unwrap_or_else(|| "4.1".into()),
    );
    let t = Transport { proto, port, vers };
    t.check().map_err(|e| match e {
        Error::InvalidArgument { reason, .. } if reason.starts_with("vers") => {
            keys.invalid(keys.vers.0, reason)
        }
        Error::InvalidArgument { reason, .. } => keys.invalid(keys.proto.0, reason),
        other => other,
    })?;
    Ok(t)
}

/// A Dataset's `spec.nfs` (the populator's), by the same rules as a class's dataset.
pub const DATASET_RESOURCE: DirKeys = DirKeys {
    server: ("server", "spec.nfs.server"),
    share: ("share", "spec.nfs.share"),
    path: ("path", "spec.nfs.path"),
    proto: ("proto", "spec.nfs.proto"),
    port: ("port", "spec.nfs.port"),
    vers: ("vers", "spec.nfs.vers"),
    what: "a Dataset's NFS source",
    path_optional: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn field_of(e: Error) -> String {
        match e {
            Error::InvalidArgument { field, reason } => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_dataset_is_a_retained_nfs_directory_over_rdma_by_default() {
        let id = parse(&params(&[
            (PARAM_SERVER, "192.0.2.1"),
            (PARAM_SHARE, "/export/"),
            (PARAM_PATH, "datasets/imagenet"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(id.source(), "192.0.2.1:/export/datasets/imagenet");
        assert_eq!(id.transport, Transport::default());
        assert_eq!(id.on_delete, OnDelete::Retain);
        let tcp = parse(&params(&[
            (PARAM_SERVER, "nfs01"),
            (PARAM_SHARE, "/"),
            (PARAM_PATH, "d"),
            (PARAM_PROTO, "tcp"),
            (PARAM_VERS, "4.2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(tcp.transport.options(), vec!["proto=tcp", "vers=4.2"]);
        assert_eq!(parse(&params(&[("fsType", "ext4")])).unwrap(), None);
    }

    #[test]
    fn malformed_dataset_parameters_name_their_field() {
        let base = [
            (PARAM_SERVER, "192.0.2.1"),
            (PARAM_SHARE, "/export"),
            (PARAM_PATH, "d"),
        ];
        let with = |k: &'static str, v: &'static str| {
            let mut p = params(&base);
            p.insert(k.into(), v.into());
            p
        };
        let without = |k: &str| {
            let mut p = params(&base);
            p.remove(k);
            p
        };
        for (p, field) in [
            (without(PARAM_SERVER), PARAM_SERVER),
            (without(PARAM_SHARE), PARAM_SHARE),
            (without(PARAM_PATH), PARAM_PATH),
            (with(PARAM_SERVER, "-oexec"), PARAM_SERVER),
            (with(PARAM_SHARE, "relative"), PARAM_SHARE),
            (with(PARAM_PATH, "a/../b"), PARAM_PATH),
            (with(PARAM_PATH, "a b"), PARAM_PATH),
            (with(PARAM_PROTO, "pigeon"), PARAM_PROTO),
            (with(PARAM_PORT, "0"), PARAM_PORT),
            (with(PARAM_PORT, "020049"), PARAM_PORT),
            (with(PARAM_PORT, "70000"), PARAM_PORT),
            (with(PARAM_VERS, "2"), PARAM_VERS),
        ] {
            let e = field_of(parse(&p).unwrap_err());
            assert!(e.starts_with(&format!("parameters.{field}: ")), "{e}");
        }
    }
}
