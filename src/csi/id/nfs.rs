//! NFS volume ids. An id carries everything needed to find the volume again without
//! any other state (the central controller's state dir is scratch):
//! `nfs:<onDelete>-<proto>-<port>-<vers>:<share>:<dir>:<server>`, with every `/` of the
//! share and of the directory written as `~` (ids must not contain `/`), e.g.
//! `nfs:d-rdma-20049-4.1:~export~gds:pvc-0b6f...:nfs01.ib.example`. The server comes last
//! because a bracketed IPv6 address contains `:`. Ids longer than 128 bytes are refused
//! at CreateVolume (shorten the share, the server name or the `subDir` pattern).

use std::fmt;

use crate::error::{Error, Result};

const PREFIX: &str = "nfs";
/// The field a transport from the capability's mount flags is checked as.
pub const MOUNT_FLAGS_FIELD: &str = "volume_capability.mount.mount_flags";
/// The NFS port of RDMA transports (RFC 5666 / 8267).
pub const RDMA_PORT: u16 = 20049;
const PROTOS: &[&str] = &["rdma", "rdma6", "tcp", "tcp6", "udp", "udp6"];
const VERSIONS: &[&str] = &["3", "4", "4.0", "4.1", "4.2"];

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

/// Kept in records as the id's text; text that is no NFS volume id does not read back.
impl serde::Serialize for NfsVolumeId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for NfsVolumeId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        NfsVolumeId::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is no NFS directory id of this driver"))
        })
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnDelete {
    Delete,
    Retain,
    Archive,
}

impl OnDelete {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "delete" => OnDelete::Delete,
            "retain" => OnDelete::Retain,
            "archive" => OnDelete::Archive,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnDelete::Delete => "delete",
            OnDelete::Retain => "retain",
            OnDelete::Archive => "archive",
        }
    }

    pub(crate) fn code(self) -> char {
        match self {
            OnDelete::Delete => 'd',
            OnDelete::Retain => 'r',
            OnDelete::Archive => 'a',
        }
    }

    pub(crate) fn from_code(c: &str) -> Option<Self> {
        Some(match c {
            "d" => OnDelete::Delete,
            "r" => OnDelete::Retain,
            "a" => OnDelete::Archive,
            _ => return None,
        })
    }
}

/// A host name, an IPv4 address or a bracketed IPv6 address: never anything mount(8)
/// could read as an option or a second field.
pub fn check_server(server: &str) -> std::result::Result<(), String> {
    let ok = if let Some(inner) = server.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        !inner.is_empty()
            && inner.len() <= 45
            && inner
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            && inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !server.is_empty()
            && server.len() <= 253
            && server.starts_with(|c: char| c.is_ascii_alphanumeric())
            && server
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && !server.contains("..")
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "server {server:?} must be a host name, an IPv4 address or a bracketed IPv6 address"
        ))
    }
}

pub fn path_component_ok(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 255
        && c != "."
        && !c.contains("..")
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'+' | b'@'))
}

/// An absolute export path of plain components (no `..`, `~`, `:` or spaces); trailing
/// slashes dropped.
pub fn check_share(share: &str) -> std::result::Result<String, String> {
    let err = || {
        format!(
            "share {share:?} must be an absolute export path of components made of letters, \
             digits, '-', '.', '_', '+' or '@' (no '..')"
        )
    };
    let rest = share.strip_prefix('/').ok_or_else(err)?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() {
        return Ok("/".into());
    }
    if share.len() > 200 || !rest.split('/').all(path_component_ok) {
        return Err(err());
    }
    Ok(format!("/{rest}"))
}

/// A relative directory of plain components below the share.
pub fn check_dir(dir: &str) -> std::result::Result<(), String> {
    if !dir.is_empty() && !dir.starts_with('/') && dir.split('/').all(path_component_ok) {
        Ok(())
    } else {
        Err(format!(
            "the volume directory {dir:?} must be a relative path of components made of \
             letters, digits, '-', '.', '_', '+' or '@' (no '..', no empty components)"
        ))
    }
}

/// What the controller records in the volume id, so that any instance (the node
/// plugin, a restarted central controller) mounts the export the same way.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Transport {
    /// `rdma`, `tcp`, ... (mount.nfs's `proto=`).
    pub proto: String,
    /// `None`: the transport's default port.
    pub port: Option<u16>,
    /// `None`: let mount.nfs negotiate.
    pub vers: Option<String>,
}

impl Default for Transport {
    /// `rdma,port=20049,vers=4.1`: NFS v4.1 over RDMA, what GDS reads through.
    fn default() -> Self {
        Transport {
            proto: "rdma".into(),
            port: Some(RDMA_PORT),
            vers: Some("4.1".into()),
        }
    }
}

impl Transport {
    pub fn is_rdma(&self) -> bool {
        self.proto.starts_with("rdma")
    }

    /// The port the kernel must report when RDMA was asked for.
    pub fn effective_port(&self) -> Option<u16> {
        self.port.or(self.is_rdma().then_some(RDMA_PORT))
    }

    pub fn options(&self) -> Vec<String> {
        let mut out = vec![if self.proto == "rdma" {
            "rdma".to_owned()
        } else {
            format!("proto={}", self.proto)
        }];
        if let Some(port) = self.port {
            out.push(format!("port={port}"));
        }
        if let Some(vers) = &self.vers {
            out.push(format!("vers={vers}"));
        }
        out
    }

    pub fn check(&self) -> Result<()> {
        if !PROTOS.contains(&self.proto.as_str()) {
            return Err(Error::invalid(
                MOUNT_FLAGS_FIELD,
                format!(
                    "proto {:?} must be one of {}",
                    self.proto,
                    PROTOS.join(", ")
                ),
            ));
        }
        if let Some(v) = &self.vers {
            if !VERSIONS.contains(&v.as_str()) {
                return Err(Error::invalid(
                    MOUNT_FLAGS_FIELD,
                    format!("vers {v:?} must be one of {}", VERSIONS.join(", ")),
                ));
            }
        }
        if self.port == Some(0) {
            return Err(Error::invalid(MOUNT_FLAGS_FIELD, "port must be 1-65535"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
