//! Format once: a block volume's device gets a filesystem only when it is provably this
//! volume's and blank (a full signature probe that succeeded and found nothing, mkfs never
//! completed for it). The one format step of staging, used by the NodeStage pipeline
//! (`stage.rs`), the fill step (`fill/`) and a clone copied at CreateVolume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::info;

use super::{BlockBackend, Located};
use crate::error::{Error, Result, VolumeError};
use crate::os::{FsType, Host, Signature, StripeGeometry};
use crate::pool::{describe_signatures, VolumeRecord};
use crate::runtime::faults::{self, KillPoint};

#[derive(Debug, PartialEq, Eq)]
pub enum FormatDecision {
    /// Fresh device of this volume, probe found nothing: format it.
    Format,
    /// The volume's own filesystem (recognised by the uuid given to mkfs).
    /// `adopt`: mkfs finished but the state update did not (crash in between).
    UseExisting {
        adopt: bool,
    },
    Refuse(String),
}

/// The data-safety table. Formatting needs all of: the device is this volume's,
/// mkfs never completed for it, and a successful probe found no signature at all.
pub fn decide_format(
    record: &VolumeRecord,
    fs: FsType,
    device: &Path,
    sigs: &[Signature],
) -> FormatDecision {
    if sigs.is_empty() {
        return if record.formatted {
            FormatDecision::Refuse(format!(
                "{} was formatted for this volume but no longer carries its filesystem (uuid {}); \
                 refusing to format it again: inspect the device before doing anything else",
                device.display(),
                record.fs_uuid
            ))
        } else {
            FormatDecision::Format
        };
    }
    let ours = sigs
        .iter()
        .all(|s| s.uuid.as_deref() == Some(record.fs_uuid.as_str()) && s.kind == fs.as_str());
    if ours {
        FormatDecision::UseExisting {
            adopt: !record.formatted,
        }
    } else {
        FormatDecision::Refuse(format!(
            "{} carries {}, which is not this volume's {} filesystem (uuid {}); it will not be \
             formatted or mounted: wipe it by hand only if its contents are disposable",
            device.display(),
            describe_signatures(sigs),
            fs.as_str(),
            record.fs_uuid
        ))
    }
}

/// Formats the device when the data-safety table says so (a job a retry joins), records
/// a finished mkfs, refuses what the table refuses.
pub(crate) async fn format_if_blank(b: &BlockBackend, vol: &mut Located, fs: FsType) -> Result<()> {
    let key = format!("format:{}", vol.id);
    // An mkfs that a cancelled call started holds the device: join it before probing.
    if let Some(outcome) = b.pool.jobs.join(&key).await {
        outcome?;
    }
    let sigs = b.mounter.host.probe_signatures(&vol.device.path).await?;
    match decide_format(&vol.record, fs, &vol.device.path, &sigs) {
        FormatDecision::Refuse(why) => Err(VolumeError::FormatRefused(why).into()),
        FormatDecision::Format => {
            b.verify_located(vol)?;
            let geometry = b.layout_of(vol.id.layout).mkfs_geometry(&vol.record)?;
            let job = format_job(
                Arc::clone(&b.mounter.host),
                vol.id.to_string(),
                vol.device.path.clone(),
                vol.record.clone(),
                (fs, geometry),
            );
            b.pool.jobs.run(&key, "mkfs", job).await?;
            mark_formatted(b, vol, fs)
        }
        FormatDecision::UseExisting { adopt: true } => mark_formatted(b, vol, fs),
        FormatDecision::UseExisting { adopt: false } => Ok(()),
    }
}

/// mkfs under the device hold, after probing again under it: whatever appeared since the
/// first probe, or whoever holds the device now (a mount, an mkfs left running by an
/// earlier driver process), is refused. Runs as a job, so a cancelled call leaves it
/// running and the retry joins it.
async fn format_job(
    host: Arc<dyn Host>,
    volume_id: String,
    device: PathBuf,
    record: VolumeRecord,
    (fs, geometry): (FsType, Option<StripeGeometry>),
) -> Result<()> {
    let _hold = crate::os::hold_when_free(host.as_ref(), &device, crate::os::HOLD_PATIENCE).await?;
    let sigs = host.probe_signatures(&device).await?;
    match decide_format(&record, fs, &device, &sigs) {
        FormatDecision::Format => {}
        FormatDecision::UseExisting { .. } => return Ok(()),
        FormatDecision::Refuse(why) => return Err(VolumeError::FormatRefused(why).into()),
    }
    info!(%volume_id, device = %device.display(), fs = fs.as_str(), uuid = %record.fs_uuid, "formatting fresh device");
    host.mkfs(&device, fs, &record.fs_uuid, geometry).await?;
    faults::reached(KillPoint::AfterMkfs);
    Ok(())
}

/// Records a finished mkfs, in the state and in `vol`'s copy of its record.
fn mark_formatted(b: &BlockBackend, vol: &mut Located, fs: FsType) -> Result<()> {
    let raw = vol.id.to_string();
    b.pool.state.update(|s| {
        let rec = s
            .get_mut(&raw)
            .ok_or_else(|| Error::VolumeNotFound(raw.clone()))?;
        rec.formatted = true;
        rec.fs_type = fs;
        Ok(())
    })?;
    vol.record.formatted = true;
    vol.record.fs_type = fs;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn record(formatted: bool) -> VolumeRecord {
        VolumeRecord {
            name: "v".into(),
            device_id: "dev-1".into(),
            device_key: "path:/dev/loop1".into(),
            capacity_bytes: 1,
            fs_type: FsType::Ext4,
            parameters: BTreeMap::new(),
            fs_uuid: "uuid-1".into(),
            formatted,
            deleting: false,
            device_identity: None,
            partition: None,
            stripe: None,
            source: None,
        }
    }

    fn sig(kind: &str, uuid: Option<&str>) -> Signature {
        Signature {
            kind: kind.into(),
            uuid: uuid.map(Into::into),
            offset: None,
            seen_by: "test",
        }
    }

    #[test]
    fn format_decision_table() {
        let dev = Path::new("/dev/loop1");
        let ext4 = FsType::Ext4;
        assert_eq!(
            decide_format(&record(false), ext4, dev, &[]),
            FormatDecision::Format
        );
        assert!(matches!(
            decide_format(&record(true), ext4, dev, &[]),
            FormatDecision::Refuse(_)
        ));
        let ours = [sig("ext4", Some("uuid-1")), sig("ext4", Some("uuid-1"))];
        assert_eq!(
            decide_format(&record(true), ext4, dev, &ours),
            FormatDecision::UseExisting { adopt: false }
        );
        assert_eq!(
            decide_format(&record(false), ext4, dev, &ours),
            FormatDecision::UseExisting { adopt: true }
        );
        for foreign in [
            vec![sig("dos", Some("abcd"))],
            vec![sig("ext4", Some("other"))],
            vec![sig("ext4", Some("uuid-1")), sig("gpt", None)],
            vec![sig("xfs", Some("uuid-1"))],
            vec![sig("unknown", None)],
        ] {
            for formatted in [false, true] {
                match decide_format(&record(formatted), ext4, dev, &foreign) {
                    FormatDecision::Refuse(msg) => assert!(msg.contains("/dev/loop1"), "{msg}"),
                    other => panic!("{foreign:?} formatted={formatted}: {other:?}"),
                }
            }
        }
    }
}
