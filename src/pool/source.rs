//! Where a volume gets its data, as CreateVolume records it with the allocation: a clone
//! of another volume, a restore of a snapshot or its class's dataset, and whether the copy
//! is a raw block one. Written once with the record, so no crash leaves a clone without
//! its source or its kind; read by the fill at the first NodeStage and answered as the
//! Volume's `content_source` (a dataset is none: the CO never named it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::csi::id::{NfsVolumeId, SnapshotId, VolumeRef};

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    /// A file tree (`tree/`): a filesystem volume's files, or an NFS volume's.
    Files,
    /// A raw block volume's bytes (`device.img`).
    Device,
    /// A volume that held nothing: no filesystem and only zeros.
    Empty,
}

impl Content {
    pub fn as_str(self) -> &'static str {
        match self {
            Content::Files => "files",
            Content::Device => "device",
            Content::Empty => "empty",
        }
    }

    fn parse(text: &str) -> Option<Content> {
        Some(match text {
            "files" => Content::Files,
            "device" => Content::Device,
            "empty" => Content::Empty,
            _ => return None,
        })
    }
}

/// The volume, snapshot or dataset a volume is filled from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SourceOf {
    /// `volume_content_source.volume`: a volume of this driver.
    Volume(VolumeRef),
    /// `volume_content_source.snapshot`: a snapshot of this driver, holding `content`.
    Snapshot { id: SnapshotId, content: Content },
    /// The class's dataset: a directory on an NFS export.
    Dataset(NfsVolumeId),
}

/// A volume's recorded source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedSource {
    pub of: SourceOf,
    /// The source's bytes copied onto the device, no filesystem of the volume's own (a
    /// raw block clone or the restore of a raw block snapshot).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw_block: bool,
}

impl RecordedSource {
    /// The id of the volume, snapshot or dataset directory.
    pub fn id(&self) -> String {
        self.of.id()
    }

    /// Whether this is a clone of volume `id`.
    pub fn is_clone_of(&self, id: &str) -> bool {
        matches!(&self.of, SourceOf::Volume(v) if v.raw() == id)
    }
}

impl SourceOf {
    /// The id of the volume, snapshot or dataset directory.
    pub fn id(&self) -> String {
        match self {
            SourceOf::Volume(id) => id.raw(),
            SourceOf::Snapshot { id, .. } => id.to_string(),
            SourceOf::Dataset(id) => id.to_string(),
        }
    }

    /// A source recorded by its id alone, as records before the typed source kept it
    /// (`content`: a snapshot's, when recorded; file snapshots are those without). A
    /// snapshot id that does not read back (none of ours was ever recorded so) is None.
    pub fn from_legacy_id(id: &str, content: Option<&str>) -> Option<SourceOf> {
        if !id.starts_with(SNAPSHOT_PREFIX) {
            return Some(SourceOf::Volume(VolumeRef::of(id)));
        }
        let content = content.and_then(Content::parse).unwrap_or(Content::Files);
        let id = SnapshotId::parse(id)?;
        Some(SourceOf::Snapshot { id, content })
    }

    /// A source field written either way: typed, or as the id alone (older records).
    pub fn deserialize_either<'de, D>(d: D) -> Result<Option<SourceOf>, D::Error>
    where
        D: serde::Deserializer<'de>,
    {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Typed(SourceOf),
            IdAlone(String),
        }
        Option::<Stored>::deserialize(d)?
            .map(|s| match s {
                Stored::Typed(s) => Ok(s),
                Stored::IdAlone(id) => SourceOf::from_legacy_id(&id, None).ok_or_else(|| {
                    serde::de::Error::custom(format!("{id:?} is no snapshot id of this driver"))
                }),
            })
            .transpose()
    }
}

/// The parameters records of state version 2 kept the source in (the source's id, a
/// snapshot's content, `block` for a raw block copy).
const LEGACY_SOURCE: &str = "cloneSource";
const LEGACY_CONTENT: &str = "snapshotContent";
const LEGACY_ACCESS: &str = "cloneAccess";
/// Snapshot ids start so (`snap:dir:...`, `snap:nfs:...`); volume ids never do.
const SNAPSHOT_PREFIX: &str = "snap:";

/// A source kept among a version 2 record's parameters, taken out of them. Only
/// CreateVolume wrote those keys (a class cannot name them: unknown parameters are
/// refused), so their presence is the source. `None`, parameters unchanged, without.
pub fn take_legacy(parameters: &mut BTreeMap<String, String>) -> Option<RecordedSource> {
    let id = parameters.remove(LEGACY_SOURCE)?;
    let content = parameters.remove(LEGACY_CONTENT);
    let raw_block = parameters.remove(LEGACY_ACCESS).as_deref() == Some("block");
    let of = SourceOf::from_legacy_id(&id, content.as_deref())?;
    Some(RecordedSource { of, raw_block })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_version_2_records_source_parameters_become_its_source() {
        let mut p = params(&[
            ("cloneSource", "blk:dev-a:1a2b3c4d:n1"),
            ("cloneAccess", "block"),
            ("gdsPolicy", "preferred"),
        ]);
        let s = take_legacy(&mut p).unwrap();
        assert_eq!(
            s.of,
            SourceOf::Volume(VolumeRef::of("blk:dev-a:1a2b3c4d:n1"))
        );
        assert!(s.raw_block);
        assert_eq!(p, params(&[("gdsPolicy", "preferred")]));

        let mut p = params(&[
            ("cloneSource", "snap:dir:~var~snaps:s1"),
            ("snapshotContent", "device"),
        ]);
        let s = take_legacy(&mut p).unwrap();
        assert_eq!(
            s.of,
            SourceOf::Snapshot {
                id: SnapshotId::parse("snap:dir:~var~snaps:s1").unwrap(),
                content: Content::Device
            }
        );
        assert!(!s.raw_block && p.is_empty());

        let mut p = params(&[("cloneSource", "snap:dir:~var~snaps:s1")]);
        let s = take_legacy(&mut p).unwrap();
        assert!(matches!(
            s.of,
            SourceOf::Snapshot {
                content: Content::Files,
                ..
            }
        ));

        let mut p = params(&[("gdsPolicy", "preferred")]);
        assert_eq!(take_legacy(&mut p), None);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn the_recorded_form_is_stable() {
        let s = RecordedSource {
            of: SourceOf::Snapshot {
                id: SnapshotId::parse("snap:dir:~s:a").unwrap(),
                content: Content::Files,
            },
            raw_block: false,
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"of":{"snapshot":{"id":"snap:dir:~s:a","content":"files"}}}"#
        );
        assert_eq!(serde_json::from_str::<RecordedSource>(&json).unwrap(), s);
        let raw = r#"{"of":{"volume":"blk:x"},"rawBlock":true}"#;
        let s: RecordedSource = serde_json::from_str(raw).unwrap();
        assert!(s.raw_block && s.is_clone_of("blk:x"));
        let dataset = r#"{"of":{"dataset":"nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1"}}"#;
        let s: RecordedSource = serde_json::from_str(dataset).unwrap();
        assert!(matches!(&s.of, SourceOf::Dataset(id) if id.dir == "sets/a"));
        assert_eq!(serde_json::to_string(&s).unwrap(), dataset);
        // A dataset that is no NFS directory id of ours does not read back.
        assert!(serde_json::from_str::<RecordedSource>(r#"{"of":{"dataset":"blk:x"}}"#).is_err());
    }
}
