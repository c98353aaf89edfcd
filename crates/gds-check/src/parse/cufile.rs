//! cufile.json: the keys that decide whether I/O gets true GDS, typed.

use super::{strip_json_comments, ParseError};
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Denylist {
    pub drivers: Vec<String>,
    pub devices: Vec<String>,
    pub mounts: Vec<String>,
    pub filesystems: Vec<String>,
}

/// The cufile.json keys that decide whether I/O gets true GDS. `None` means absent (libcufile's
/// default applies).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CufileConfig {
    pub allow_compat_mode: Option<bool>,
    pub force_compat_mode: Option<bool>,
    pub use_pci_p2pdma: Option<bool>,
    pub use_poll_mode: Option<bool>,
    pub max_direct_io_size_kb: Option<u64>,
    pub rdma_dev_addr_list: Vec<String>,
    pub nfs_rdma_dev_addr_list: Vec<String>,
    pub posix_unaligned_writes: Option<bool>,
    pub denylist: Denylist,
    /// The per-route P2PDMA keys: `block.nvme.use_pci_p2pdma` (local NVMe) and
    /// `block.raid.use_pci_p2pdma` (md RAID0). libcufile 1.20.0.107 names both among its config
    /// keys (`strings libcufile.so.0`: `block.raid.use_pci_p2pdma`, `block.raid1...`,
    /// `block.raid10...`, `block.nvme...`, `block.nvmeof.use_pci_p2pdma`; with the log line "has
    /// P2PDMA flag but RAID PCI P2PDMA is disabled"), and NVIDIA's gds-diag wants the route's
    /// key beside `properties.use_pci_p2pdma` (MagnumIO gds-diag/checks/fs_matrix.py,
    /// `P2PDMA_SUPPORTED_ROUTE_KEYS`). NVIDIA's cufile.json reference does not list them yet.
    pub nvme_use_pci_p2pdma: Option<bool>,
    pub raid_use_pci_p2pdma: Option<bool>,
    pub logging_dir: Option<String>,
    #[serde(skip)]
    pub raw: Value,
}

impl CufileConfig {
    /// libcufile allows compat mode unless told otherwise.
    pub fn compat_allowed(&self) -> bool {
        self.allow_compat_mode.unwrap_or(true) || self.force_compat_mode == Some(true)
    }

    pub fn p2pdma_enabled(&self) -> bool {
        self.use_pci_p2pdma == Some(true) || self.nvme_use_pci_p2pdma == Some(true)
    }

    /// md RAID0 over P2PDMA is asked for by its own key only, off when absent (gds-diag
    /// checks/cufile_config.py `CONFIG_SCHEMA`: `block.raid.use_pci_p2pdma`, default false).
    pub fn raid_p2pdma_enabled(&self) -> bool {
        self.raid_use_pci_p2pdma == Some(true)
    }
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn get_bool(v: &Value, path: &[&str]) -> Result<Option<bool>, ParseError> {
    match at(v, path) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ParseError::Type {
            key: path.join("."),
            expected: "true or false",
        }),
    }
}

fn get_u64(v: &Value, path: &[&str]) -> Result<Option<u64>, ParseError> {
    match at(v, path) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or(ParseError::Type {
            key: path.join("."),
            expected: "a non-negative integer",
        }),
    }
}

fn get_strings(v: &Value, path: &[&str]) -> Result<Vec<String>, ParseError> {
    let err = || ParseError::Type {
        key: path.join("."),
        expected: "an array of strings",
    };
    match at(v, path) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(err))
            .collect(),
        Some(_) => Err(err()),
    }
}

pub fn parse_cufile_json(text: &str) -> Result<CufileConfig, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let stripped = strip_json_comments(text)?;
    let raw: Value =
        serde_json::from_str(&stripped).map_err(|e| ParseError::Json(e.to_string()))?;
    if !raw.is_object() {
        return Err(ParseError::Json("top level is not an object".into()));
    }
    fn p(k: &str) -> [&str; 2] {
        ["properties", k]
    }
    Ok(CufileConfig {
        allow_compat_mode: get_bool(&raw, &p("allow_compat_mode"))?,
        force_compat_mode: get_bool(&raw, &p("force_compat_mode"))?,
        use_pci_p2pdma: get_bool(&raw, &p("use_pci_p2pdma"))?,
        use_poll_mode: get_bool(&raw, &p("use_poll_mode"))?,
        max_direct_io_size_kb: get_u64(&raw, &p("max_direct_io_size_kb"))?,
        rdma_dev_addr_list: get_strings(&raw, &p("rdma_dev_addr_list"))?,
        nfs_rdma_dev_addr_list: get_strings(&raw, &["fs", "nfs", "rdma_dev_addr_list"])?,
        posix_unaligned_writes: get_bool(&raw, &["fs", "generic", "posix_unaligned_writes"])?,
        denylist: Denylist {
            drivers: get_strings(&raw, &["denylist", "drivers"])?,
            devices: get_strings(&raw, &["denylist", "devices"])?,
            mounts: get_strings(&raw, &["denylist", "mounts"])?,
            filesystems: get_strings(&raw, &["denylist", "filesystems"])?,
        },
        nvme_use_pci_p2pdma: get_bool(&raw, &["block", "nvme", "use_pci_p2pdma"])?,
        raid_use_pci_p2pdma: get_bool(&raw, &["block", "raid", "use_pci_p2pdma"])?,
        logging_dir: at(&raw, &["logging", "dir"])
            .and_then(Value::as_str)
            .map(str::to_string),
        raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compat mode is allowed by default, off only with allow_compat_mode false, and forced
    /// on by force_compat_mode whatever allow_compat_mode says.
    #[test]
    fn compat_allowed_follows_both_keys() {
        for (props, allowed) in [
            ("", true),
            (r#""allow_compat_mode": true"#, true),
            (r#""allow_compat_mode": false"#, false),
            (
                r#""allow_compat_mode": false, "force_compat_mode": false"#,
                false,
            ),
            (
                r#""allow_compat_mode": false, "force_compat_mode": true"#,
                true,
            ),
            (r#""force_compat_mode": false"#, true),
        ] {
            let c = parse_cufile_json(&format!(r#"{{ "properties": {{ {props} }} }}"#)).unwrap();
            assert_eq!(c.compat_allowed(), allowed, "{props}");
        }
    }

    #[test]
    fn cufile_config() {
        let t = r#"{
    "logging": { "dir": "/tmp/gds", "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb" : 16384,
        "use_poll_mode" : false,
        // allow compat mode, this will enable use of cuFile posix read/writes
        "allow_compat_mode": true,
        "rdma_dev_addr_list": [ "172.172.1.240" ],
        "use_pci_p2pdma": false
    },
    "fs": { "generic": { "posix_unaligned_writes": false },
            "nfs": { "rdma_dev_addr_list": [ "10.0.0.2" ] } },
    "denylist": {
        // specify list of vendor driver modules to deny for nvidia-fs (e.g. ["nvme" , "nvme_rdma"])
        "drivers":  [ ],
        "devices": [ "/dev/nvme9n1" ],
        "mounts": [ "/mnt/deny" ],
        "filesystems": [ "lustre" ]
    },
    "block": { "nvme": { "use_pci_p2pdma": true } }
}"#;
        let c = parse_cufile_json(t).unwrap();
        assert_eq!(c.allow_compat_mode, Some(true));
        assert_eq!(c.force_compat_mode, None);
        assert_eq!(c.max_direct_io_size_kb, Some(16384));
        assert_eq!(c.rdma_dev_addr_list, ["172.172.1.240"]);
        assert_eq!(c.nfs_rdma_dev_addr_list, ["10.0.0.2"]);
        assert_eq!(c.denylist.mounts, ["/mnt/deny"]);
        assert_eq!(c.denylist.devices, ["/dev/nvme9n1"]);
        assert_eq!(c.nvme_use_pci_p2pdma, Some(true));
        assert!(c.p2pdma_enabled());
        assert_eq!(c.logging_dir.as_deref(), Some("/tmp/gds"));
        assert!(parse_cufile_json("").is_err());
        assert!(parse_cufile_json("[1,2]").is_err());
        assert!(parse_cufile_json("{\"properties\": {\"allow_compat_mode\": \"yes\"}}").is_err());
        assert!(parse_cufile_json("{\"denylist\": {\"mounts\": \"/x\"}}").is_err());
        assert!(parse_cufile_json("{garbage").is_err());
    }

    /// Both route keys: true, false, absent (None: libcufile's default) and null read as
    /// absent; any other type is an error naming the key.
    #[test]
    fn route_keys_true_false_absent_wrong_type() {
        let parse = |block: &str| parse_cufile_json(&format!(r#"{{ "block": {block} }}"#));
        for (route, get) in [
            (
                "nvme",
                (|c: &CufileConfig| c.nvme_use_pci_p2pdma) as fn(&CufileConfig) -> _,
            ),
            ("raid", |c: &CufileConfig| c.raid_use_pci_p2pdma),
        ] {
            for (v, want) in [("true", Some(true)), ("false", Some(false)), ("null", None)] {
                let c = parse(&format!(r#"{{ "{route}": {{ "use_pci_p2pdma": {v} }} }}"#)).unwrap();
                assert_eq!(get(&c), want, "{route} {v}");
            }
            assert_eq!(
                get(&parse(&format!(r#"{{ "{route}": {{}} }}"#)).unwrap()),
                None
            );
            assert_eq!(get(&parse("{}").unwrap()), None);
            for v in [r#""true""#, "1", "[true]"] {
                let e = parse(&format!(r#"{{ "{route}": {{ "use_pci_p2pdma": {v} }} }}"#))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains(&format!("block.{route}.use_pci_p2pdma")), "{e}");
            }
        }
    }

    /// The RAID key enables md RAID0 only; the NVMe keys do not stand in for it, nor it for them.
    #[test]
    fn raid_key_is_its_own() {
        let c =
            parse_cufile_json(r#"{ "block": { "raid": { "use_pci_p2pdma": true } } }"#).unwrap();
        assert!(c.raid_p2pdma_enabled());
        assert!(!c.p2pdma_enabled());
        let c = parse_cufile_json(
            r#"{ "properties": { "use_pci_p2pdma": true },
                 "block": { "nvme": { "use_pci_p2pdma": true }, "raid": { "use_pci_p2pdma": false } } }"#,
        )
        .unwrap();
        assert!(c.p2pdma_enabled());
        assert!(!c.raid_p2pdma_enabled());
    }
}
