//! cufile.json as the node checks read it: loaded once per check run, shared with the volume
//! checks, and the keys that decide compat mode and the denylist checked.

use super::nvfs::required_drivers;
use crate::parse::{self, CufileConfig};
use crate::{Backend, Check, HostPaths};
use std::fs;

/// What reading cufile.json gave. Shared with the volume checks.
#[derive(Debug, Clone)]
pub(crate) enum CufileState {
    Missing(String),
    Invalid(String),
    Ok(Box<CufileConfig>),
}

pub(crate) fn load_cufile(paths: &HostPaths) -> CufileState {
    let p = &paths.cufile_json;
    match fs::read_to_string(p) {
        Err(e) => CufileState::Missing(format!("{}: {e}", p.display())),
        Ok(t) => match parse::parse_cufile_json(&t) {
            Ok(c) => CufileState::Ok(Box::new(c)),
            Err(e) => CufileState::Invalid(format!("{}: {e}", p.display())),
        },
    }
}

pub(super) fn cufile_checks(cfg: &CufileState, backend: Backend) -> Vec<Check> {
    let c = match cfg {
        CufileState::Missing(e) => {
            return vec![Check::warn(
                "cufile.config",
                "no cufile.json: libcufile runs on its defaults (compat mode allowed)",
                format!("{e}; libcufile uses built-in defaults (compat mode allowed)"),
                "install /etc/cufile.json (or set CUFILE_ENV_PATH_JSON) and mount it into \
                 workload pods",
            )];
        }
        CufileState::Invalid(e) => {
            return vec![Check::fail(
                "cufile.config",
                "cufile.json is invalid: libcufile cannot read it",
                e.clone(),
                "fix the JSON (comments are allowed; keys must have the documented types)",
            )];
        }
        CufileState::Ok(c) => c,
    };
    vec![
        config_check(c),
        force_compat_check(c),
        allow_compat_check(c),
        denylist_drivers_check(c, backend),
    ]
}

fn config_check(c: &CufileConfig) -> Check {
    let mut ev = format!(
        "allow_compat_mode={} force_compat_mode={} use_pci_p2pdma={} use_poll_mode={}",
        opt(c.allow_compat_mode),
        opt(c.force_compat_mode),
        opt(c.use_pci_p2pdma.or(c.nvme_use_pci_p2pdma)),
        opt(c.use_poll_mode)
    );
    if let Some(kb) = c.max_direct_io_size_kb {
        ev += &format!(" max_direct_io_size_kb={kb}");
    }
    Check::pass("cufile.config", "cufile.json read", ev)
}

fn force_compat_check(c: &CufileConfig) -> Check {
    if c.force_compat_mode == Some(true) {
        Check::fail(
            "cufile.force_compat",
            "cufile.json forces compat mode (force_compat_mode is true): no GDS",
            "properties.force_compat_mode is true: every read goes through POSIX",
            "set \"force_compat_mode\": false in cufile.json",
        )
    } else {
        Check::pass(
            "cufile.force_compat",
            "cufile.json does not force compat mode",
            "force_compat_mode not set",
        )
    }
}

fn allow_compat_check(c: &CufileConfig) -> Check {
    match c.allow_compat_mode {
        Some(false) => Check::pass(
            "cufile.allow_compat",
            "compat fallback disabled (allow_compat_mode is false)",
            "allow_compat_mode is false",
        ),
        v => {
            let value = match v {
                Some(_) => "allow_compat_mode is true",
                None => "allow_compat_mode unset, default true",
            };
            Check::warn(
                "cufile.allow_compat",
                format!(
                    "compat fallback enabled ({value}): I/O may silently bounce through the CPU"
                ),
                format!("{value}: cuFile silently falls back to POSIX I/O when GDS is unavailable"),
                "set \"allow_compat_mode\": false for workloads that require true GDS, or rely \
                 on the volume probe to detect fallback",
            )
        }
    }
}

fn denylist_drivers_check(c: &CufileConfig, backend: Backend) -> Check {
    let deny: Vec<&String> = c
        .denylist
        .drivers
        .iter()
        .filter(|d| required_drivers(backend).contains(&d.as_str()))
        .collect();
    if deny.is_empty() {
        Check::pass(
            "cufile.denylist_drivers",
            "storage driver not denylisted",
            format!("denylist.drivers: [{}]", c.denylist.drivers.join(", ")),
        )
    } else {
        let names = deny
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Check::fail(
            "cufile.denylist_drivers",
            format!("storage driver {names} denylisted in cufile.json: no GDS through it"),
            format!("denylist.drivers names {names}: I/O through it is disabled (IO_DISABLED)"),
            "remove the driver from denylist.drivers in cufile.json",
        )
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("unset".to_string(), |v| v.to_string())
}
