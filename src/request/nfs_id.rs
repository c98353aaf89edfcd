//! NFS volume ids. An id carries everything needed to find the volume again without
//! any other state (the central controller's state dir is scratch):
//! `nfs:<onDelete>-<proto>-<port>-<vers>:<share>:<dir>:<server>`, with every `/` of the
//! share and of the directory written as `~` (ids must not contain `/`), e.g.
//! `nfs:d-rdma-20049-4.1:~export~gds:pvc-0b6f...:nfs01.ib.example`. The server comes last
//! because a bracketed IPv6 address contains `:`. Ids longer than 128 bytes are refused
//! at CreateVolume (shorten the share, the server name or the `subDir` pattern).

use std::fmt;

use sha2::Digest;

use super::nfs::{check_dir, check_server, check_share, invalid, NfsParams, OnDelete, PREFIX};
use super::nfs_options::Transport;
use crate::csi::id::MAX_VOLUME_ID_LEN;
use crate::error::Result;

/// Everything needed to mount, find and remove an NFS volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NfsVolumeId {
    pub server: String,
    /// Absolute, normalised (`/` or `/a/b`).
    pub share: String,
    /// Relative to the share, `a` or `a/b`.
    pub dir: String,
    pub on_delete: OnDelete,
    pub transport: Transport,
}

impl fmt::Display for NfsVolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.transport;
        write!(
            f,
            "{PREFIX}:{}-{}-{}-{}:{}:{}:{}",
            self.on_delete.code(),
            t.proto,
            t.port.map(|p| p.to_string()).unwrap_or_default(),
            t.vers.as_deref().unwrap_or(""),
            self.share.replace('/', "~"),
            self.dir.replace('/', "~"),
            self.server
        )
    }
}

impl NfsVolumeId {
    /// `None` when the id is not an NFS id of this driver.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.splitn(5, ':');
        if parts.next()? != PREFIX {
            return None;
        }
        let flags = parts.next()?;
        let share = parts.next()?.replace('~', "/");
        let dir = parts.next()?.replace('~', "/");
        let server = parts.next()?;
        let mut f = flags.splitn(4, '-');
        let on_delete = OnDelete::from_code(f.next()?)?;
        let proto = f.next()?.to_owned();
        let port = match f.next()? {
            "" => None,
            // Only the form `to_string` writes: `0100` and `+100` would be a second id for
            // the same volume, and per-volume locks key on the id's text.
            p => {
                let port: u16 = p.parse().ok()?;
                Some((port.to_string() == p).then_some(port)?)
            }
        };
        let vers = match f.next()? {
            "" => None,
            v => Some(v.to_owned()),
        };
        let transport = Transport { proto, port, vers };
        transport.check().ok()?;
        check_server(server).ok()?;
        if check_share(&share).ok()? != share {
            return None;
        }
        check_dir(&dir).ok()?;
        Some(NfsVolumeId {
            server: server.to_owned(),
            share,
            dir,
            on_delete,
            transport,
        })
    }

    /// Builds the id and checks its length.
    pub fn new(params: &NfsParams, dir: String, transport: Transport) -> Result<Self> {
        let id = NfsVolumeId {
            server: params.server.clone(),
            share: params.share.clone(),
            dir,
            on_delete: params.on_delete,
            transport,
        };
        let len = id.to_string().len();
        if len > MAX_VOLUME_ID_LEN {
            return Err(invalid(format!(
                "the NFS volume id would be {len} bytes, over the {MAX_VOLUME_ID_LEN}-byte limit \
                 (it carries server, share and directory); use a shorter server name, share or \
                 subDir pattern"
            )));
        }
        Ok(id)
    }

    /// Like `new`, but a directory whose id would be too long (a 128-byte volume name,
    /// say) gets its last component cut and suffixed with a hash of the full directory,
    /// deterministically, so a repeated CreateVolume finds the same directory.
    pub fn fitted(params: &NfsParams, dir: String, transport: Transport) -> Result<Self> {
        let full = NfsVolumeId {
            server: params.server.clone(),
            share: params.share.clone(),
            dir: dir.clone(),
            on_delete: params.on_delete,
            transport: transport.clone(),
        };
        let over = full.to_string().len().saturating_sub(MAX_VOLUME_ID_LEN);
        if over == 0 {
            return Ok(full);
        }
        let digest = sha2::Sha256::digest(dir.as_bytes());
        let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        let (parent, last) = match dir.rsplit_once('/') {
            Some((p, l)) => (Some(p), l),
            None => (None, dir.as_str()),
        };
        let keep = last.len().saturating_sub(over + hash.len() + 1);
        if keep == 0 {
            return Self::new(params, dir, transport);
        }
        let short = format!("{}-{hash}", &last[..keep]);
        let dir = match parent {
            Some(p) => format!("{p}/{short}"),
            None => short,
        };
        Self::new(params, dir, transport)
    }

    /// `server:/share`, what the controller mounts to manage directories.
    pub fn export_source(&self) -> String {
        format!("{}:{}", self.server, self.share)
    }

    /// `server:/share/dir`, what a node stages.
    pub fn source(&self) -> String {
        if self.share == "/" {
            format!("{}:/{}", self.server, self.dir)
        } else {
            format!("{}:{}/{}", self.server, self.share, self.dir)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::request::nfs::DEFAULT_SUB_DIR;

    #[test]
    fn ids_round_trip_stay_short_and_carry_no_slash() {
        let params = NfsParams {
            server: "nfs01.ib.example".into(),
            share: "/export/gds".into(),
            sub_dir: DEFAULT_SUB_DIR.into(),
            on_delete: OnDelete::Archive,
        };
        let dir = "pvc-0b6f3c1e-8e5a-4f3b-9d7e-2c9a1b3d4e5f".to_string();
        let id = NfsVolumeId::new(&params, dir, Transport::default()).unwrap();
        let text = id.to_string();
        assert_eq!(
            text,
            "nfs:a-rdma-20049-4.1:~export~gds:pvc-0b6f3c1e-8e5a-4f3b-9d7e-2c9a1b3d4e5f:nfs01.ib.example"
        );
        assert!(text.len() <= MAX_VOLUME_ID_LEN && !text.contains('/') && !text.contains(".."));
        crate::csi::id::check_well_formed("volume_id", &text).unwrap();
        assert_eq!(NfsVolumeId::parse(&text), Some(id.clone()));
        assert_eq!(
            id.source(),
            "nfs01.ib.example:/export/gds/pvc-0b6f3c1e-8e5a-4f3b-9d7e-2c9a1b3d4e5f"
        );
        assert_eq!(id.export_source(), "nfs01.ib.example:/export/gds");

        let v6 = NfsVolumeId {
            server: "[fd00::1]".into(),
            share: "/".into(),
            dir: "ns/claim".into(),
            on_delete: OnDelete::Delete,
            transport: Transport {
                proto: "tcp".into(),
                port: None,
                vers: None,
            },
        };
        assert_eq!(v6.to_string(), "nfs:d-tcp--:~:ns~claim:[fd00::1]");
        assert_eq!(NfsVolumeId::parse(&v6.to_string()), Some(v6.clone()));
        assert_eq!(v6.source(), "[fd00::1]:/ns/claim");

        let name = "n".repeat(128);
        let fitted = NfsVolumeId::fitted(&params, name.clone(), Transport::default()).unwrap();
        assert_eq!(fitted.to_string().len(), MAX_VOLUME_ID_LEN);
        assert!(fitted.dir.starts_with("nnn") && fitted.dir.len() < name.len());
        assert_eq!(
            NfsVolumeId::fitted(&params, name, Transport::default()).unwrap(),
            fitted
        );
        let long = NfsParams {
            server: "x".repeat(100),
            ..params
        };
        assert!(matches!(
            NfsVolumeId::new(&long, "pvc-1".into(), Transport::default()),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn foreign_or_tampered_ids_do_not_parse() {
        for id in [
            "blk:dev-1:a:n",
            "nfs:x-rdma-20049-4.1:~:d:h",
            "nfs:d-pigeon-1-4.1:~:d:h",
            "nfs:d-rdma-20049-4.1:~:..:h",
            "nfs:d-rdma-20049-4.1:~a~~b:d:h",
            "nfs:d-rdma-20049-4.1:~:d:-oexec",
            "nfs:d-rdma-20049-4.1:~:d",
            "nfs:d-rdma-20049-4.1:~::h",
            // Found by fuzzing: a port with leading zeros decoded to another id's volume.
            "nfs:d-rdma-020049-4.1:~:d:h",
            "nfs:d-rdma-+20049-4.1:~:d:h",
        ] {
            assert_eq!(NfsVolumeId::parse(id), None, "{id}");
        }
    }
}
