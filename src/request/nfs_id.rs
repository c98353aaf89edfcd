//! NFS volume ids made from a class's parameters, cut to the id length limit (the id's
//! format and its parsing: `csi::id::nfs`).

use sha2::Digest;

use super::nfs::{invalid, NfsParams};
pub use crate::csi::id::nfs::NfsVolumeId;
use crate::csi::id::nfs::Transport;
use crate::csi::id::MAX_VOLUME_ID_LEN;
use crate::error::Result;

impl NfsVolumeId {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::id::nfs::OnDelete;
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
}
