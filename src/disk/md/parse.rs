//! `mdadm --examine --export` / `--detail --export` output: `KEY=value` lines.

use std::collections::BTreeMap;

use crate::error::{LayoutError, Result};

/// Every `KEY=value` line (values may contain '='; other lines are skipped).
pub fn parse_export(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// A member's md superblock, as `mdadm --examine --export` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Examined {
    /// `raid0`, `raid1`, ...
    pub level: String,
    pub devices: u32,
    /// `<homehost>:<name>`.
    pub name: String,
    /// The array's UUID, colon form.
    pub uuid: String,
    /// This member's own UUID.
    pub dev_uuid: String,
}

impl Examined {
    pub fn from_export(text: &str) -> Result<Self> {
        let kv = parse_export(text);
        let get = |k: &str| {
            kv.get(k)
                .cloned()
                .ok_or_else(|| LayoutError::MdadmExportLacks {
                    key: k.to_owned(),
                    text: text.to_owned(),
                })
        };
        let devices = get("MD_DEVICES")?;
        Ok(Examined {
            level: get("MD_LEVEL")?,
            devices: devices.parse().map_err(|_| LayoutError::MdadmBadDevices {
                devices: devices.clone(),
            })?,
            name: get("MD_NAME")?,
            uuid: get("MD_UUID")?,
            dev_uuid: get("MD_DEV_UUID")?,
        })
    }

    /// The array's name without the homehost, and whether the homehost is `homehost`.
    pub fn name_for(&self, homehost: &str) -> Option<&str> {
        self.name
            .split_once(':')
            .filter(|(h, _)| *h == homehost)
            .map(|(_, n)| n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mdadm --examine --export /dev/nvme0n1` on the VM rig (mdadm 4.2-5, kernel
    /// 6.1.0-57), right after `--create ... --homehost=gds-csi --name=gdscsi-test`.
    const EXAMINE: &str = "MD_LEVEL=raid0
MD_DEVICES=2
MD_NAME=gds-csi:gdscsi-test
MD_UUID=002cd3f1:01eb3f8d:ef68842e:73da9813
MD_UPDATE_TIME=1796063318
MD_DEV_UUID=1a551cdb:cd078105:9e6cabaa:3829edf9
MD_EVENTS=0
";

    #[test]
    fn a_real_examine_parses_to_our_array() {
        let e = Examined::from_export(EXAMINE).unwrap();
        assert_eq!(e.level, "raid0");
        assert_eq!(e.devices, 2);
        assert_eq!(e.uuid, "002cd3f1:01eb3f8d:ef68842e:73da9813");
        assert_eq!(e.dev_uuid, "1a551cdb:cd078105:9e6cabaa:3829edf9");
        assert_eq!(e.name_for("gds-csi"), Some("gdscsi-test"));
        assert_eq!(e.name_for("node-a"), None);
        assert!(crate::disk::md::same_uuid(
            &e.uuid,
            "002cd3f1-01eb-3f8d-ef68-842e73da9813"
        ));
    }

    #[test]
    fn missing_or_bad_fields_are_errors_not_defaults() {
        for text in [
            "",
            "mdadm: No md superblock detected on /dev/nvme0n1.\n",
            &EXAMINE.replace("MD_UUID=", "MD_XUUID="),
            &EXAMINE.replace("MD_DEVICES=2", "MD_DEVICES=two"),
        ] {
            assert!(Examined::from_export(text).is_err(), "{text:?}");
        }
        let kv = parse_export("A=b=c\nnot a pair\nlower=x\n");
        assert_eq!(kv.get("A").map(String::as_str), Some("b=c"));
        assert_eq!(kv.len(), 1);
    }
}
