//! `gds-csi pool discover`: what the pool would take, before it takes anything. Every NVMe
//! namespace (as `--nvme-discover` would see it) and every listed device, with what is on
//! it and the verdict the pool itself reaches: the same scan (`Pool::rescan`) and the same
//! signature probe (`Pool::classify_free`), so a device listed here as taken is one the
//! driver allocates and a refused one is one it refuses, for the same reason. Nothing is
//! written to a device; the state dir is only read (an absent one reads as empty).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{inventory, Pool, PoolConfig, PoolDevice};
use crate::os::{blockdev, Host, MountEntry};

/// One device and what the pool makes of it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub device: String,
    pub size_bytes: u64,
    pub model: Option<String>,
    pub numa_node: Option<String>,
    pub pci_address: Option<String>,
    pub partitions: Vec<String>,
    pub holders: Vec<String>,
    pub mounts: Vec<String>,
    /// What the signature probe found (`blkid -p`, `wipefs`), or why it could not look.
    pub signatures: String,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "verdict", content = "detail")]
pub enum Verdict {
    /// Already the pool's: volumes are recorded on it.
    InPool(String),
    /// Taken as the driver is configured.
    Taken,
    /// Clean, but only `--nvme-discover` would take it.
    TakenWithDiscovery,
    /// Left out, and why.
    Refused(String),
}

/// What the pool configured as `config` would take; `config.nvme_discover` is what the
/// driver does, the dry run looks at every namespace either way.
pub async fn discover(config: PoolConfig, host: &dyn Host) -> Result<Vec<Candidate>, String> {
    let discovery_on = config.nvme_discover;
    let sys = config.host_sys.clone();
    // No state dir yet (before the first install): an empty one of our own, removed after.
    let scratch = std::env::temp_dir().join(format!("gds-csi-discover-{}", std::process::id()));
    let state_dir = if config.state_dir.join("volumes").is_dir() {
        config.state_dir.clone()
    } else {
        fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        scratch.clone()
    };
    let pool = Pool::open(PoolConfig {
        nvme_discover: true,
        state_dir,
        ..config
    });
    let found = match pool {
        Ok(pool) => look(&pool, host, &sys, discovery_on).await,
        Err(e) => Err(e.to_string()),
    };
    let _ = fs::remove_dir_all(&scratch);
    found
}

async fn look(
    pool: &Pool,
    host: &dyn Host,
    sys: &Path,
    discovery_on: bool,
) -> Result<Vec<Candidate>, String> {
    let mounts = host.mount_table().map_err(|e| e.to_string())?;
    pool.rescan(&mounts);
    pool.classify_free(host).await;
    let state = pool.state.snapshot();
    let mut out = Vec::new();
    for dev in pool.devices() {
        let volumes = state
            .values()
            .filter(|r| {
                r.device_id == dev.id
                    || r.stripe
                        .iter()
                        .flat_map(|s| &s.members)
                        .any(|m| m.device_id == dev.id)
            })
            .count();
        let verdict = if volumes > 0 {
            Verdict::InPool(format!("{volumes} volume(s) recorded on it"))
        } else if let Some(why) = pool.foreign_reason(&dev.id) {
            Verdict::Refused(format!("not blank: {why}"))
        } else if dev.source != inventory::Source::Listed && !discovery_on {
            Verdict::TakenWithDiscovery
        } else {
            Verdict::Taken
        };
        let signatures = match pool.foreign_reason(&dev.id) {
            Some(why) => why,
            None if volumes > 0 => "(the driver's)".to_owned(),
            None => "none".to_owned(),
        };
        out.push(describe(
            sys,
            &mounts,
            &dev.path,
            Some(&dev),
            signatures,
            verdict,
        ));
    }
    for ex in pool.excluded() {
        let path = excluded_path(&pool.config.host_dev, &ex.device);
        let signatures = match host.probe_signatures(&path).await {
            Ok(sigs) if sigs.is_empty() => "none".to_owned(),
            Ok(sigs) => super::describe_signatures(&sigs),
            Err(e) => format!("probe failed: {e}"),
        };
        let verdict = Verdict::Refused(ex.reason.clone());
        out.push(describe(sys, &mounts, &path, None, signatures, verdict));
    }
    out.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(out)
}

/// An excluded entry names a listed path, or a namespace's kernel name under /dev.
fn excluded_path(dev: &Path, name: &str) -> PathBuf {
    if name.starts_with('/') {
        PathBuf::from(name)
    } else {
        dev.join(name)
    }
}

/// What sysfs and the mount table say of the device at `path`.
fn describe(
    sys: &Path,
    mounts: &[MountEntry],
    path: &Path,
    dev: Option<&PoolDevice>,
    signatures: String,
    verdict: Verdict,
) -> Candidate {
    let devnum = dev
        .map(|d| (d.major, d.minor))
        .or_else(|| blockdev::devnum_of(path).ok());
    let dir = devnum.map(|(ma, mi)| sys.join(format!("dev/block/{ma}:{mi}")));
    let read = |rel: &str| {
        let d = dir.as_ref()?;
        let s = fs::read_to_string(d.join(rel)).ok()?;
        Some(s.trim().to_owned()).filter(|s| !s.is_empty() && s != "-1")
    };
    let size_bytes = dev.map(|d| d.size_bytes).unwrap_or_else(|| {
        devnum
            .and_then(|(ma, mi)| blockdev::size_bytes(sys, ma, mi).ok())
            .unwrap_or(0)
    });
    let children = |pick: fn(&Path) -> bool| -> Vec<String> {
        let Some(d) = dir.as_ref() else {
            return Vec::new();
        };
        let mut names: Vec<String> = fs::read_dir(d)
            .map(|it| {
                it.filter_map(|e| e.ok())
                    .filter(|e| pick(&e.path()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let (holders, uses) = match devnum {
        Some((ma, mi)) => (
            blockdev::holders(sys, ma, mi),
            blockdev::mounts(mounts, ma, mi),
        ),
        None => (Vec::new(), Vec::new()),
    };
    Candidate {
        device: path.display().to_string(),
        size_bytes,
        // An NVMe namespace's controller is `device`, its PCI function `device/device`.
        model: read("device/model"),
        numa_node: read("device/numa_node").or_else(|| read("device/device/numa_node")),
        pci_address: pci_address(dir.as_deref()),
        partitions: children(|p| p.join("partition").exists()),
        holders,
        mounts: uses.iter().map(ToString::to_string).collect(),
        signatures,
        verdict,
    }
}

/// The PCI function behind the device (`0000:41:00.0`), where sysfs links one.
fn pci_address(dir: Option<&Path>) -> Option<String> {
    let dir = dir?;
    ["device/device", "device"].iter().find_map(|rel| {
        let target = fs::canonicalize(dir.join(rel)).ok()?;
        let name = target.file_name()?.to_str()?.to_owned();
        let pci = name.len() == 12 && name.as_bytes()[4] == b':' && name.as_bytes()[7] == b':';
        pci.then_some(name)
    })
}

/// The report as text: one block per device, the verdict last.
pub fn render(found: &[Candidate]) -> String {
    let mut out = String::new();
    for c in found {
        let mut head = format!("{}  {}", c.device, human(c.size_bytes));
        for (label, v) in [
            ("", &c.model),
            ("NUMA ", &c.numa_node),
            ("PCI ", &c.pci_address),
        ] {
            if let Some(v) = v {
                head.push_str(&format!("  {label}{v}"));
            }
        }
        out.push_str(&head);
        out.push('\n');
        let mut on = Vec::new();
        if !c.partitions.is_empty() {
            on.push(format!("partitions {}", c.partitions.join(", ")));
        }
        if !c.holders.is_empty() {
            on.push(format!("held by {}", c.holders.join(", ")));
        }
        if !c.mounts.is_empty() {
            on.push(c.mounts.join(", "));
        }
        if c.signatures != "none" {
            on.push(format!("signatures: {}", c.signatures));
        }
        let on = if on.is_empty() {
            "nothing found (no partition, holder, mount or signature)".to_owned()
        } else {
            on.join("; ")
        };
        out.push_str(&format!("  on it:   {on}\n"));
        let verdict = match &c.verdict {
            Verdict::InPool(why) => format!("in the pool: {why}"),
            Verdict::Taken => "taken into the pool".to_owned(),
            Verdict::TakenWithDiscovery => {
                "clean: taken with --nvme-discover (chart: node.nvmeDiscover), or list it"
                    .to_owned()
            }
            Verdict::Refused(why) => format!("not taken: {why}"),
        };
        out.push_str(&format!("  verdict: {verdict}\n"));
    }
    if found.is_empty() {
        out.push_str("no NVMe namespace and no listed device found\n");
    }
    out
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_what_is_on_each_device_and_the_verdict() {
        let c = |device: &str, signatures: &str, verdict| Candidate {
            device: device.into(),
            size_bytes: 3 << 30,
            model: Some("SAMSUNG MZQL23T8HCLS".into()),
            numa_node: Some("1".into()),
            pci_address: Some("0000:41:00.0".into()),
            partitions: Vec::new(),
            holders: Vec::new(),
            mounts: Vec::new(),
            signatures: signatures.into(),
            verdict,
        };
        let text = render(&[
            c("/dev/nvme0n1", "none", Verdict::TakenWithDiscovery),
            c(
                "/dev/nvme1n1",
                "ext4 (UUID 1)",
                Verdict::Refused("not blank: ext4 (UUID 1)".into()),
            ),
        ]);
        assert!(
            text.contains("/dev/nvme0n1  3.0 GiB  SAMSUNG MZQL23T8HCLS  NUMA 1  PCI 0000:41:00.0"),
            "{text}"
        );
        assert!(text.contains("nothing found"), "{text}");
        assert!(text.contains("taken with --nvme-discover"), "{text}");
        assert!(text.contains("not taken: not blank: ext4"), "{text}");
        assert_eq!(
            render(&[]),
            "no NVMe namespace and no listed device found\n"
        );
    }
}
