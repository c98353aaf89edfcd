//! CreateVolume of a clone: its source checked and its kind told before anything is
//! allocated; DeleteVolume of a source refused while a clone of it is not filled.

use super::unfilled_clones_of;
use super::volume::check_source;
use crate::error::{CloneError, Error, Result};
use crate::pool::{RecordedSource, SourceOf};
use crate::request::{self, Access};
use crate::volume::block::fill::source::{self, Source};
use crate::volume::block::BlockBackend;

/// DeleteVolume of a clone's source: refused while a clone of it is not filled (its copy
/// is made from the source at the clone's first NodeStage).
pub fn refuse_unfilled_clones(b: &BlockBackend, source: &str) -> Result<()> {
    let clones = unfilled_clones_of(b, source)?;
    if clones.is_empty() {
        return Ok(());
    }
    Err(CloneError::UnfilledClones {
        origin: source.to_owned(),
        clones: clones
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
    .into())
}

/// CreateVolume of a clone: the smallest size its source needs, checked against the
/// limit before anything is allocated, and the source to record with the volume.
pub async fn check_clone(
    b: &BlockBackend,
    req: &request::CreateVolume<'_>,
    nfs: Option<&crate::volume::nfs::NfsBackend>,
) -> Result<Option<(u64, Option<RecordedSource>)>> {
    let Some(source) = source::requested(req)? else {
        return Ok(None);
    };
    let access = clone_access(req, &source)?;
    let mut recorded = None;
    let size = match (&source, &req.restore) {
        // A snapshot's manifest says how large a volume it needs.
        (_, Some(restore)) => {
            if req.limit_bytes != 0 && req.limit_bytes < restore.size_bytes {
                return Err(CloneError::LimitBelowSource {
                    origin: restore.text.clone(),
                    bytes: restore.size_bytes,
                    limit: req.limit_bytes,
                }
                .into());
            }
            recorded = Some(SourceOf::Snapshot {
                id: restore.id.clone(),
                content: restore.content,
            });
            restore.size_bytes
        }
        (Source::Block { id, label }, None) => {
            let new = b.pool.state.snapshot().by_name(&req.name).is_none();
            check_source(b, (id, label), req.limit_bytes, new, access)?
        }
        (Source::Nfs { id, label }, None) => {
            super::nfs::check_nfs(nfs, id, label, req.limit_bytes).await?
        }
        (Source::Snapshot { .. } | Source::Empty { .. } | Source::Image { .. }, None) => {
            unreachable!("only a snapshot restores from a directory, an image or nothing")
        }
    };
    if let Some((_, id)) = req.source.as_ref().and_then(request::ContentSource::volume) {
        recorded = Some(SourceOf::Volume(id.clone()));
    }
    if let Some(id) = &req.params.dataset {
        recorded = Some(SourceOf::Dataset(id.clone()));
    }
    let recorded = recorded.map(|of| RecordedSource {
        of,
        raw_block: access == Access::Block,
    });
    Ok(Some((size, recorded)))
}

/// The clone's kind, from its capabilities, before anything is allocated: one access
/// type, and block access only from a block volume (an NFS directory is copied file by
/// file into a filesystem).
pub fn clone_access(req: &request::CreateVolume<'_>, source: &Source) -> Result<Access> {
    let caps = request::capabilities(req.capabilities)?;
    let block = caps.iter().any(|c| c.access == Access::Block);
    if block && caps.iter().any(|c| c.access == Access::Mount) {
        return Err(Error::invalid(
            "volume_capabilities",
            "a clone is either a raw block copy of its source (block access) or a copy of \
             its files (mount access): ask for one access type",
        ));
    }
    match source {
        Source::Image { label, .. } if !block => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "snapshot {label} holds a raw block volume's bytes: restore it with block \
                 access (Kubernetes: volumeMode: Block)"
            ),
        )),
        Source::Nfs { label, .. } | Source::Snapshot { label, .. } if block => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the clone's source {label} is an NFS directory, copied file by file into a \
                 filesystem; a raw block clone copies a block volume of this node: ask for \
                 mount access (Kubernetes: volumeMode: Filesystem)"
            ),
        )),
        _ if block => Ok(Access::Block),
        _ => Ok(Access::Mount),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType};
    use crate::csi::volume_content_source::{Type, VolumeSource};

    fn capability(block: bool) -> crate::csi::VolumeCapability {
        crate::csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(if block {
                AccessType::Block(Default::default())
            } else {
                AccessType::Mount(Default::default())
            }),
        }
    }

    fn clone_of(source: &str, caps: &[bool]) -> crate::csi::CreateVolumeRequest {
        crate::csi::CreateVolumeRequest {
            name: "clone".into(),
            volume_capabilities: caps.iter().map(|&b| capability(b)).collect(),
            volume_content_source: Some(crate::csi::VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: source.into(),
                })),
            }),
            ..Default::default()
        }
    }

    fn access(source: &str, caps: &[bool]) -> Result<Access> {
        let req = clone_of(source, caps);
        let req = request::create_volume(&req)?;
        let source = source::requested(&req)?.expect("a clone");
        clone_access(&req, &source)
    }

    #[test]
    fn a_clone_is_one_kind_and_raw_only_of_a_block_volume() {
        let block = "blk:dev-0123456789abcdef:0badf00d:node-a";
        assert_eq!(access(block, &[true]).unwrap(), Access::Block);
        assert_eq!(access(block, &[false]).unwrap(), Access::Mount);
        let both = tonic::Status::from(access(block, &[true, false]).unwrap_err());
        assert_eq!(both.code(), tonic::Code::InvalidArgument);
        assert!(
            both.message()
                .starts_with("volume_capabilities: a clone is either a raw block copy"),
            "{}",
            both.message()
        );
        let nfs = "nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1";
        assert_eq!(access(nfs, &[false]).unwrap(), Access::Mount);
        let raw_of_nfs = tonic::Status::from(access(nfs, &[true]).unwrap_err());
        assert_eq!(raw_of_nfs.code(), tonic::Code::InvalidArgument);
        assert!(
            raw_of_nfs.message().starts_with(
                "volume_capabilities: the clone's source nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1 is an NFS directory"
            ) && raw_of_nfs.message().contains("ask for mount access"),
            "{}",
            raw_of_nfs.message()
        );
    }
}
