//! The md RAID members check: the array runs, and each member is an NVMe namespace (or a
//! partition of one, as the stripe layout builds them) whose driver nvidia_fs has registered.
//!
//! Grounding:
//! - nvidia-fs has no notion of md: gds-nvidia-fs 2.28.4 src/ holds no reference to md or RAID
//!   (`git grep -i raid src/` is empty). md RAID0 splits each bio by chunk and submits the
//!   pieces to its members' queues (drivers/md/raid0.c `raid0_make_request`), and nvidia-fs
//!   maps the GPU pages of a request on the member's queue (`nvfs_blk_rq_check`,
//!   src/nvfs-dma.c:246-247) through the DMA ops the member's driver registered. The drivers
//!   it can register for NVMe are `nvme` (PCIe) and `nvme_rdma` (NVMe-oF/RDMA) only
//!   (`modules_list`, src/nvfs-dma.c:61-97; names in src/nvfs-dma.h:61-62). So every member's
//!   driver must be registered, and a member on another transport (tcp, fc) has no DMA path.
//! - A partition member is judged as its disk: the block layer remaps a partition's I/O onto
//!   the disk's queue (see `stack::walk`).
//! - libcufile 1.20.0.107 (`strings`): "RAID member not supported by cuFile in RAID group",
//!   "cuFile support has been disabled for members in the RAID group": one unsupported
//!   member costs the whole array its GDS path (inferred from the strings; the source is
//!   closed).
//! - NVIDIA gds-diag (MagnumIO gds-diag/checks/fs_matrix.py, `raid0`): "RAID0 over supported
//!   NVMe devices. The nvidia-fs/nvfs direct path is supported."

use super::stack::{MdArray, MdMember};
use crate::node::registered_drivers;
use crate::{Check, HostPaths};
use std::collections::BTreeSet;

const ID: &str = "volume.md_members";

/// What keeps an array from GDS: a few words for the check's line, and the full reason.
struct Problem {
    short: String,
    detail: String,
}

/// The nvidia-fs registration name of the driver behind an NVMe transport; None: nvidia-fs
/// has no DMA ops for it.
fn nvfs_driver(transport: &str) -> Option<&'static str> {
    match transport {
        "pcie" => Some("nvme"),
        "rdma" => Some("nvme_rdma"),
        _ => None,
    }
}

pub(super) fn md_members_check(paths: &HostPaths, md: &MdArray) -> Check {
    // Read as a cuFile process sees it (a nvidia-fs node held open); None: not readable, which
    // the node check `nvidia_fs.storage_driver` reports.
    let registered: Option<Vec<String>> =
        registered_drivers(paths).map(|m| m.into_iter().map(|m| m.name).collect());
    let mut problems = Vec::new();
    let mut remedies = BTreeSet::new();
    if let Some((problem, remedy)) = array_not_running(md) {
        problems.push(problem);
        remedies.insert(remedy);
    }
    if md.members.is_empty() {
        problems.push(Problem {
            short: format!("{} has no members", md.name),
            detail: format!("{} lists no member in md/dev-*/block or slaves/", md.name),
        });
    }
    let mut ev = Vec::new();
    for m in &md.members {
        let (desc, problem, remedy) = judge_member(m, registered.as_deref());
        ev.push(desc);
        if let Some(p) = problem {
            problems.push(p);
        }
        if let Some(r) = remedy {
            remedies.insert(r);
        }
    }
    verdict(md, array_evidence(md, &ev), problems, remedies)
}

/// The problem and its fix when the array's state says it is not running.
fn array_not_running(md: &MdArray) -> Option<(Problem, String)> {
    let st = md.array_state.as_deref()?;
    if !matches!(st, "broken" | "inactive" | "clear" | "suspended") {
        return None;
    }
    let problem = Problem {
        short: format!("{} is {st}", md.name),
        detail: format!("{} array_state is {st}", md.name),
    };
    let remedy = format!(
        "the array lost a member or is not running: see `mdadm --detail /dev/{}`; \
         bring the member's drive back (a stripe volume's NodeStage reassembles it)",
        md.name
    );
    Some((problem, remedy))
}

/// The array and its members as the check's evidence shows them.
fn array_evidence(md: &MdArray, members: &[String]) -> String {
    let state = md.array_state.as_deref().unwrap_or("unknown");
    format!(
        "{} ({}, array_state {state}): {}",
        md.name,
        md.level,
        if members.is_empty() {
            "no members".into()
        } else {
            members.join("; ")
        }
    )
}

/// Pass when nothing keeps the array from GDS, else a failure naming every problem.
fn verdict(
    md: &MdArray,
    evidence: String,
    problems: Vec<Problem>,
    remedies: BTreeSet<String>,
) -> Check {
    if problems.is_empty() {
        return Check::pass(
            ID,
            "md array running; each member an NVMe partition whose driver nvidia_fs registered",
            evidence,
        );
    }
    let remedy: Vec<String> = remedies.into_iter().collect();
    let (short, detail): (Vec<String>, Vec<String>) =
        problems.into_iter().map(|p| (p.short, p.detail)).unzip();
    Check::fail(
        ID,
        format!("{} unfit for GDS: {}", md.name, short.join("; ")),
        format!("{evidence}; {}", detail.join("; ")),
        remedy.join("; "),
    )
}

/// How a member reads, what is wrong with it, and the fix.
type Judgement = (String, Option<Problem>, Option<String>);

/// One member: how it reads, what is wrong with it, and the fix.
fn judge_member(m: &MdMember, registered: Option<&[String]>) -> Judgement {
    let mut desc = format!("{} ({}", m.name, m.majmin.as_deref().unwrap_or("no dev"));
    if let Some(p) = &m.parent {
        desc += &format!(", partition of {p}");
    }
    if let Some(st) = &m.state {
        desc += &format!(", state {st}");
    }
    // Each verdict reads on from the description so far, and closes it.
    let (rest, problem, remedy) = if st_faulty(m) {
        faulty(m)
    } else if !m.nvme {
        not_nvme(m)
    } else {
        judge_transport(m, registered)
    };
    (desc + &rest, problem, remedy)
}

fn faulty(m: &MdMember) -> Judgement {
    let why = Problem {
        short: format!("member {} faulty", m.name),
        detail: format!("member {} is faulty", m.name),
    };
    let fix = "replace or bring back the faulty member (`mdadm --detail` names it)";
    (")".into(), Some(why), Some(fix.into()))
}

fn not_nvme(m: &MdMember) -> Judgement {
    let why = Problem {
        short: format!("member {} not NVMe", m.name),
        detail: format!(
            "member {} is not on an NVMe namespace: nvidia-fs has no DMA path for it, and \
             cuFile disables GDS for the whole RAID group",
            m.name
        ),
    };
    let fix = "build the RAID0 from NVMe namespaces or their partitions only";
    (", not NVMe)".into(), Some(why), Some(fix.into()))
}

/// An NVMe member: its transport must have a driver nvidia-fs registered.
fn judge_transport(m: &MdMember, registered: Option<&[String]>) -> Judgement {
    let transport = m.transport.as_deref().unwrap_or("unknown");
    let Some(driver) = nvfs_driver(transport) else {
        return transport_without_dma(m, transport);
    };
    match registered {
        Some(r) if r.iter().any(|n| n == driver) => (
            format!(", NVMe over {transport}, driver {driver} registered)"),
            None,
            None,
        ),
        Some(_) => driver_not_registered(m, transport, driver),
        None => (
            format!(", NVMe over {transport}, driver {driver}: registration unread)"),
            None,
            None,
        ),
    }
}

fn transport_without_dma(m: &MdMember, transport: &str) -> Judgement {
    let why = Problem {
        short: format!("member {} is NVMe over {transport}", m.name),
        detail: format!(
            "member {} is NVMe over {transport}: nvidia-fs registers DMA ops for nvme \
             (PCIe) and nvme_rdma only",
            m.name
        ),
    };
    (
        format!(", NVMe over {transport})"),
        Some(why),
        Some("use NVMe over PCIe or RDMA members".into()),
    )
}

fn driver_not_registered(m: &MdMember, transport: &str, driver: &str) -> Judgement {
    let why = Problem {
        short: format!(
            "member {}'s driver {driver} not registered with nvidia_fs",
            m.name
        ),
        detail: format!(
            "member {}: its driver {driver} is not registered with nvidia_fs \
             (/proc/driver/nvidia-fs/modules, read with a nvidia-fs node open)",
            m.name
        ),
    };
    let fix = format!(
        "load a GDS-enabled {driver} driver after nvidia_fs (MLNX_OFED/DOCA builds \
         one), so that nvidia-fs lists `{driver}` in /proc/driver/nvidia-fs/modules"
    );
    (
        format!(", NVMe over {transport}, driver {driver} NOT registered)"),
        Some(why),
        Some(fix),
    )
}

fn st_faulty(m: &MdMember) -> bool {
    m.state
        .as_deref()
        .is_some_and(|s| s.split(',').any(|f| f == "faulty"))
}
