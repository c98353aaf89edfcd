//! NFS mount options: the transport defaults (`rdma,port=20049,vers=4.1`) merged with
//! the capability's mount flags. Contradicting flags (`rdma` with `proto=tcp`, `ro` with
//! `rw`, `ac` with `noac`, ...) and flags that would break the driver's guarantees
//! (`bg`, `sloppy`, `user`, `remount`, ...) are `InvalidArgument`.

use std::collections::BTreeMap;

use crate::csi::id::nfs::MOUNT_FLAGS_FIELD as FIELD;
pub use crate::csi::id::nfs::{Transport, RDMA_PORT};
use crate::error::{Error, Result};

/// Options that the driver manages itself or that defeat its checks:
/// `bg` makes mount.nfs return success while it retries in the background (no deadline,
/// nothing to verify), `sloppy` ignores unknown options, `user`/`users`/`owner`/`group`
/// let unprivileged users unmount, the rest are mount(8) operations.
const REFUSED: &[&str] = &[
    "bg",
    "sloppy",
    "user",
    "users",
    "owner",
    "group",
    "bind",
    "rbind",
    "remount",
    "move",
    "make-shared",
    "make-private",
    "make-slave",
    "loop",
    "X-mount.mkdir",
    "x-mount.mkdir",
    "defaults",
    "nfsvers=2",
    "vers=2",
];

/// Pairs that contradict each other, by their canonical group.
fn group_of(name: &str) -> Option<&'static str> {
    Some(match name {
        "ro" | "rw" => "ro/rw",
        "hard" | "soft" | "softerr" => "hard/soft",
        "sync" | "async" => "sync/async",
        "fg" => "fg",
        "intr" | "nointr" => "intr",
        "ac" | "noac" => "ac",
        "cto" | "nocto" => "cto",
        "lock" | "nolock" => "lock",
        "acl" | "noacl" => "acl",
        "sharecache" | "nosharecache" => "sharecache",
        "resvport" | "noresvport" => "resvport",
        "rdirplus" | "nordirplus" => "rdirplus",
        "fsc" | "nofsc" => "fsc",
        "suid" | "nosuid" => "suid",
        "dev" | "nodev" => "dev",
        "exec" | "noexec" => "exec",
        "atime" | "noatime" => "atime",
        "diratime" | "nodiratime" => "diratime",
        "relatime" | "norelatime" => "relatime",
        _ => return None,
    })
}

/// The options to mount with, in a stable order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub transport: Transport,
    /// Every other flag, checked, in the order given.
    pub others: Vec<String>,
}

impl MountOptions {
    pub fn to_vec(&self) -> Vec<String> {
        let mut out = self.transport.options();
        out.extend(self.others.iter().cloned());
        out
    }

    pub fn read_only(&self) -> bool {
        self.others.iter().any(|o| o == "ro")
    }
}

/// One flag's syntax: a single option, no list, no control characters.
fn check_syntax(flag: &str) -> Result<()> {
    if flag.is_empty()
        || flag.len() > 256
        || flag.contains([',', '\n', '\0', ' ', '"', '\''])
        || flag.chars().any(char::is_control)
    {
        return Err(Error::invalid(
            FIELD,
            format!(
                "{flag:?} must be one option without commas, spaces, quotes or control characters"
            ),
        ));
    }
    Ok(())
}

/// Merges `flags` (StorageClass `mountOptions`, as the capability's mount flags) over
/// `base` (the defaults, or what the volume id recorded). A flag overrides the base value
/// of the same option; two flags that disagree are an error. Choosing a transport other
/// than the base's drops the base's port (each transport has its own default).
pub fn merge(base: &Transport, flags: &[String]) -> Result<MountOptions> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut others = Vec::new();
    for flag in flags {
        if add_flag(&mut seen, &others, flag)? {
            others.push(flag.clone());
        }
    }
    let transport = transport_of(base, &seen)?;
    transport.check()?;
    Ok(MountOptions { transport, others })
}

/// Records `key=value` from `flag`: `Ok(true)` when new, `Ok(false)` when a repeat, an
/// error when an earlier flag set another value.
fn set(seen: &mut BTreeMap<String, String>, key: &str, value: String, flag: &str) -> Result<bool> {
    match seen.get(key) {
        Some(prev) if *prev != value => Err(Error::invalid(
            FIELD,
            format!("{flag:?} contradicts an earlier flag ({key}={prev}); pass one of them"),
        )),
        Some(_) => Ok(false),
        None => {
            seen.insert(key.to_owned(), value);
            Ok(true)
        }
    }
}

/// Checks one flag and records what it sets; `Ok(true)`: it is passed on as it is (not
/// a transport option, not a repeat).
fn add_flag(seen: &mut BTreeMap<String, String>, others: &[String], flag: &String) -> Result<bool> {
    check_syntax(flag)?;
    if REFUSED.contains(&flag.as_str()) || REFUSED.contains(&flag.split('=').next().unwrap_or(flag))
    {
        return Err(Error::invalid(
            FIELD,
            format!(
                "{flag:?} is managed by the driver or unsafe for NFS volumes and cannot be passed"
            ),
        ));
    }
    let (name, value) = match flag.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (flag.as_str(), None),
    };
    match (name, value) {
        ("rdma" | "tcp" | "udp", None) => set(seen, "proto", name.to_owned(), flag).map(|_| false),
        ("proto", Some(v)) => set(seen, "proto", v.to_owned(), flag).map(|_| false),
        ("port", Some(v)) => {
            let port = parse_port(v, flag)?;
            set(seen, "port", port.to_string(), flag).map(|_| false)
        }
        ("vers" | "nfsvers", Some(v)) => set(seen, "vers", v.to_owned(), flag).map(|_| false),
        ("data", _) => Err(Error::invalid(
            FIELD,
            format!("{flag:?} is a block filesystem option; NFS volumes do not take it"),
        )),
        (_, None) => match group_of(name) {
            Some(group) => set(seen, group, name.to_owned(), flag),
            // Another flag without a value: passed on once.
            None => Ok(!others.contains(flag)),
        },
        // Valued options (timeo=, nconnect=, sec=, ...): one value each.
        (_, Some(v)) => set(seen, name, v.to_owned(), flag),
    }
}

fn parse_port(v: &str, flag: &str) -> Result<u16> {
    v.parse()
        .map_err(|_| Error::invalid(FIELD, format!("{flag:?}: port must be a number 1-65535")))
}

/// The transport the flags choose over `base`. Choosing a transport other than the
/// base's drops the base's port (each transport has its own default).
fn transport_of(base: &Transport, seen: &BTreeMap<String, String>) -> Result<Transport> {
    let proto = seen.get("proto").cloned();
    let port = match (seen.get("port"), &proto) {
        (Some(p), _) => Some(parse_port(p, p)?),
        (None, Some(p)) if *p != base.proto => None,
        (None, _) => base.port,
    };
    Ok(Transport {
        port,
        proto: proto.unwrap_or_else(|| base.proto.clone()),
        vers: seen.get("vers").cloned().or_else(|| base.vers.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_are_rdma_on_20049_v41() {
        let m = merge(&Transport::default(), &[]).unwrap();
        assert_eq!(m.to_vec(), flags(&["rdma", "port=20049", "vers=4.1"]));
        assert!(m.transport.is_rdma());
    }

    #[test]
    fn the_helm_mount_options_merge_to_the_same() {
        let m = merge(
            &Transport::default(),
            &flags(&["rdma", "port=20049", "vers=4.1"]),
        )
        .unwrap();
        assert_eq!(m.to_vec(), flags(&["rdma", "port=20049", "vers=4.1"]));
    }

    #[test]
    fn flags_override_defaults_and_other_options_are_kept() {
        let m = merge(
            &Transport::default(),
            &flags(&["vers=4.2", "nconnect=4", "hard", "noatime", "hard"]),
        )
        .unwrap();
        assert_eq!(
            m.to_vec(),
            flags(&[
                "rdma",
                "port=20049",
                "vers=4.2",
                "nconnect=4",
                "hard",
                "noatime"
            ])
        );
        // Another transport drops the RDMA port; an explicit one is kept.
        let tcp = merge(&Transport::default(), &flags(&["proto=tcp"])).unwrap();
        assert_eq!(tcp.to_vec(), flags(&["proto=tcp", "vers=4.1"]));
        assert!(!tcp.transport.is_rdma());
        let port = merge(&Transport::default(), &flags(&["tcp", "port=2049"])).unwrap();
        assert_eq!(port.transport.port, Some(2049));
        let nfsvers = merge(&Transport::default(), &flags(&["nfsvers=3"])).unwrap();
        assert_eq!(nfsvers.transport.vers.as_deref(), Some("3"));
    }

    #[test]
    fn contradictions_are_refused() {
        for bad in [
            &["rdma", "proto=tcp"][..],
            &["vers=4.1", "nfsvers=4.2"],
            &["ro", "rw"],
            &["hard", "soft"],
            &["ac", "noac"],
            &["port=1", "port=2"],
            &["timeo=600", "timeo=10"],
        ] {
            let err = merge(&Transport::default(), &flags(bad)).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. })
                    && err.to_string().contains("contradicts"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn unsafe_and_smuggled_options_are_refused() {
        for bad in [
            "bg",
            "sloppy",
            "user",
            "remount",
            "bind",
            "vers=2",
            "rdma,port=1",
            "a b",
            "x\ny",
            "x\0y",
            "",
            "data=journal",
            "proto=carrier-pigeon",
            "vers=5",
            "port=99999",
            "port=0",
        ] {
            let err = merge(&Transport::default(), &flags(&[bad])).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{bad:?}: {err}"
            );
        }
    }
}
