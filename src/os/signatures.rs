//! What the two signature probes print, parsed: `blkid -p -o export` and `wipefs -n -J`.
//! A device is blank only when both ran and both found nothing (see `Host::probe_signatures`).

use serde::{Deserialize, Serialize};

/// One on-disk signature (filesystem, partition table, RAID member, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signature {
    pub kind: String,
    pub uuid: Option<String>,
    pub offset: Option<String>,
    pub seen_by: &'static str,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(uuid) = &self.uuid {
            write!(f, " uuid={uuid}")?;
        }
        if let Some(offset) = &self.offset {
            write!(f, " at {offset}")?;
        }
        write!(f, " ({})", self.seen_by)
    }
}

/// `blkid -p -o export`: KEY=VALUE lines for every superblock and partition table.
pub(super) fn parse_blkid_export(text: &str) -> Vec<Signature> {
    // On a partition, blkid also prints (and exits 0 for) the parent's entry for it,
    // PART_ENTRY_*: that is the partition table's, not a signature on the partition.
    let own = |l: &&str| !(l.starts_with("DEVNAME=") || l.starts_with("PART_ENTRY_"));
    if !text.lines().any(|l| own(&l)) {
        return Vec::new();
    }
    let mut kind = None;
    let mut uuid = None;
    let mut offset = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("TYPE" | "PTTYPE", v)) if kind.is_none() => kind = Some(v.to_owned()),
            Some(("UUID" | "PTUUID", v)) => uuid = Some(v.to_owned()),
            Some(("SBMAGIC_OFFSET", v)) => offset = Some(v.to_owned()),
            _ => {}
        }
    }
    // blkid found something (exit 0) even when it printed no TYPE we recognise.
    vec![Signature {
        kind: kind.unwrap_or_else(|| "unknown".into()),
        uuid,
        offset,
        seen_by: "blkid -p",
    }]
}

#[derive(Deserialize)]
struct WipefsReport {
    #[serde(default)]
    signatures: Vec<WipefsSignature>,
}

#[derive(Deserialize)]
struct WipefsSignature {
    #[serde(rename = "type")]
    kind: String,
    uuid: Option<String>,
    offset: Option<String>,
}

pub(super) fn parse_wipefs_json(
    text: &str,
) -> std::result::Result<Vec<Signature>, serde_json::Error> {
    // wipefs prints nothing at all when the device carries no signature.
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let report: WipefsReport = serde_json::from_str(text)?;
    Ok(report
        .signatures
        .into_iter()
        .map(|s| Signature {
            kind: s.kind,
            uuid: s.uuid,
            offset: s.offset,
            seen_by: "wipefs -n",
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_export_with_a_partition_table_is_a_signature() {
        let sigs = parse_blkid_export("DEVNAME=/dev/loop4\nPTUUID=abcd\nPTTYPE=dos\n");
        assert_eq!(sigs.len(), 1);
        assert_eq!(sigs[0].kind, "dos");
        assert_eq!(sigs[0].uuid.as_deref(), Some("abcd"));
    }

    #[test]
    fn wipefs_json_lists_every_signature_and_empty_output_means_none() {
        let text = r#"{"signatures": [
            {"device":"loop0","offset":"0x438","type":"ext4","uuid":"u-1","label":null},
            {"device":"loop0","offset":"0x1fe","type":"dos","uuid":null,"label":null}]}"#;
        let sigs = parse_wipefs_json(text).unwrap();
        assert_eq!(sigs.len(), 2);
        assert_eq!(sigs[1].kind, "dos");
        assert!(parse_wipefs_json("").unwrap().is_empty());
        assert!(parse_wipefs_json("garbage").is_err());
    }
}
