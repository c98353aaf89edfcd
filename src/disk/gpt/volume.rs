//! The steps the `partition` layout runs, each idempotent and in the order that keeps a
//! crash harmless (see the module doc): a retry after a crash at any point finishes the
//! job. The caller serialises the calls on one device (one lock per pool device) and
//! runs the host steps between them: mkfs after [`carve`]; before [`remove`], the
//! signature wipe, then [`kernel::zero_offloaded`] on the partition node, or the host
//! port's `zero_device` where that is `Unsupported`, so the next tenant reads zeros.

use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::alloc::{Extent, Held};
use super::format::{Label, TYPE_GUID};
use super::label::{self, OnDisk};
use super::{kernel, Error, Result};

/// Each 1 GiB of the space a grow adds must be zeroed within this.
const GROW_ZERO_CHUNK: std::time::Duration = std::time::Duration::from_secs(20);

/// A partition of ours on a device, as the kernel now shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carved {
    pub number: u32,
    /// The PARTUUID, by which the volume is found again after a reboot or a rename.
    pub partuuid: Uuid,
    pub span: Extent,
    /// `/dev/<parent>p<N>` or `/dev/<parent><N>`.
    pub node: PathBuf,
}

/// The device's label, which must be ours.
pub fn ours(device: &Path) -> Result<Label> {
    match label::read(device)? {
        OnDisk::Ours { label, .. } => Ok(label),
        OnDisk::Blank => Err(Error::foreign(device, "it holds no label")),
        OnDisk::Foreign(why) => Err(Error::foreign(device, why)),
    }
}

/// Rewrites both copies of the device's label (and its protective MBR) from the one
/// [`label::read`] trusts when a crash or another tool left them different or damaged;
/// returns why, or None when the label was whole. Call under the device's lock.
pub fn repair(device: &Path) -> Result<Option<String>> {
    match label::read(device)? {
        OnDisk::Ours {
            label,
            repair: Some(why),
        } => {
            label::write(device, &label)?;
            Ok(Some(why))
        }
        OnDisk::Ours { repair: None, .. } => Ok(None),
        OnDisk::Blank => Err(Error::foreign(device, "it holds no label")),
        OnDisk::Foreign(why) => Err(Error::foreign(device, why)),
    }
}

/// What must not be carved on `device` besides what its label lists: `held` (the spans
/// and numbers the state records) and every partition the kernel shows that the label
/// lacks (another tool removed its entry; its blocks may hold a tenant's data).
/// Only the kernel's partitions at numbers the label does not list are read, so the cost
/// does not grow with the partitions the label holds.
pub fn held_on(device: &Path, label: &Label, held: &Held) -> Result<Held> {
    let mut all = held.clone();
    for n in kernel::numbers(device)? {
        if label.extent(n).is_some() {
            continue;
        }
        if let Some(k) = kernel::partition(device, n)? {
            all.numbers.push(k.number);
            all.spans.push(Extent {
                start: k.start,
                len: k.len,
            });
        }
    }
    Ok(all)
}

/// The pool device and extent for a new partition of `size` among the carved devices'
/// labels, clear of what each device holds: the best [`super::alloc::Placement::rank`]
/// (growth room kept, then the smallest gap; the first device on a tie).
pub fn choose(labels: &[(PathBuf, Label, Held)], size: u64) -> Option<(&Path, Extent)> {
    labels
        .iter()
        .filter_map(|(dev, l, h)| Some((dev, l.placement(size, h)?)))
        .min_by_key(|(_, p)| p.rank())
        .map(|(dev, p)| (dev.as_path(), p.at))
}

/// Carves partition `name` of `size` bytes on `device` (our label), clear of `held` and
/// of what the kernel shows outside the label, or finds the one a previous try carved:
/// the label is written first, then the kernel told.
pub fn carve(device: &Path, name: &str, size: u64, held: &Held) -> Result<Carved> {
    let mut label = ours(device)?;
    let number = match label.by_name(name) {
        Some((n, _)) => {
            let span = label
                .extent(n)
                .ok_or_else(|| Error::NotInLabel(n.to_string()))?;
            if span.len != size {
                return Err(Error::NameTaken {
                    name: name.to_owned(),
                    number: n,
                    len: span.len,
                });
            }
            n
        }
        None => {
            let held = held_on(device, &label, held)?;
            let n = label.allocate_clear_of(name, size, &held)?;
            label::write(device, &label)?;
            n
        }
    };
    shown(device, &label, number)
}

/// Makes sure the kernel shows `number` at its span, and returns it with its node.
fn shown(device: &Path, label: &Label, number: u32) -> Result<Carved> {
    let span = label
        .extent(number)
        .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
    let partuuid = label
        .partitions()
        .find(|(n, _)| *n == number)
        .map(|(_, e)| e.guid)
        .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
    let now = kernel::partition(device, number)?;
    kernel::ensure(device, now.as_slice(), number, span)?;
    Ok(Carved {
        number,
        partuuid,
        span,
        node: kernel::node(device, number)?,
    })
}

/// Finds partition `partuuid` in our label of `device`.
fn find(device: &Path, partuuid: &Uuid) -> Result<(Label, u32)> {
    let label = ours(device)?;
    let number = label
        .by_guid(partuuid)
        .map(|(n, _)| n)
        .ok_or_else(|| Error::NotInLabel(format!("with PARTUUID {partuuid}")))?;
    Ok((label, number))
}

/// Grows partition `partuuid` in place to `size` bytes (never shrinks): the label
/// first, then the kernel. Blocked, naming the neighbour, when the space after it is
/// taken.
pub fn grow(device: &Path, partuuid: &Uuid, size: u64, held: &Held) -> Result<Carved> {
    let (mut label, number) = find(device, partuuid)?;
    let held = held_on(device, &label, held)?;
    let before = label.extent(number);
    if label.grow_clear_of(number, size, &held)? {
        // The space grown into was free in our label, clear of anything held: zeroed
        // before the label gives it to the volume, so no earlier tenant's byte reaches it.
        if let (Some(before), Some(after)) = (before, label.extent(number)) {
            let added = Extent {
                start: before.end(),
                len: after.end() - before.end(),
            };
            kernel::zero_span(device, added, GROW_ZERO_CHUNK)?;
        }
        label::write(device, &label)?;
    }
    shown(device, &label, number)
}

/// Where a move of partition `partuuid` stands in the label: its span, and the span and
/// name of its spare entry `spare` when the label lists it (over the extent it moves to
/// until the switch, the one it leaves after it).
pub fn move_spans(
    device: &Path,
    partuuid: &Uuid,
    spare: &Uuid,
) -> Result<(Extent, Option<(Extent, String)>)> {
    let (label, number) = find(device, partuuid)?;
    let span = label
        .extent(number)
        .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
    let spare = label
        .by_guid(spare)
        .and_then(|(n, e)| Some((label.extent(n)?, e.name.clone())));
    Ok((span, spare))
}

/// The first step of a move: spare entry `name` (PARTUUID `spare`) over `to`, free and
/// clear of `held`, so nothing is carved there while the volume is copied. Not shown to
/// the kernel. Done already when the entry is there.
pub fn reserve(device: &Path, name: &str, spare: &Uuid, to: Extent, held: &Held) -> Result<()> {
    let mut label = ours(device)?;
    if let Some((n, _)) = label.by_guid(spare) {
        return match label.extent(n) {
            Some(at) if at == to => Ok(()),
            other => Err(Error::Changed(format!(
                "the spare entry {spare} of a move on {} spans {other:?}, not {to:?}",
                device.display()
            ))),
        };
    }
    let held = held_on(device, &label, held)?;
    label.insert_at(name, *spare, to, &held)?;
    label::write(device, &label)
}

/// The switch of a move, one label write: partition `partuuid` takes `to` (where its
/// bytes were copied) and the spare entry the span it leaves; then the kernel shows the
/// partition at `to` (refused while its old node is open). Done already when the
/// partition spans `to`.
pub fn switch(device: &Path, partuuid: &Uuid, spare: &Uuid, to: Extent) -> Result<Carved> {
    let (mut label, number) = find(device, partuuid)?;
    let now = label
        .extent(number)
        .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
    if now != to {
        let s = label.by_guid(spare).map(|(n, _)| n);
        let s = s.filter(|&n| label.extent(n) == Some(to)).ok_or_else(|| {
            Error::Changed(format!(
                "the spare entry {spare} of a move on {} no longer spans {to:?}",
                device.display()
            ))
        })?;
        label.set_span(number, to)?;
        label.set_span(s, now)?;
        label::write(device, &label)?;
    }
    shown(device, &label, number)
}

/// Where partition `partuuid` is now, telling the kernel of it if it forgot.
pub fn locate(device: &Path, partuuid: &Uuid) -> Result<Carved> {
    let (label, number) = find(device, partuuid)?;
    shown(device, &label, number)
}

/// Where a volume's record says its partition is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub partuuid: Uuid,
    pub number: u32,
    /// Its span when carved (bytes); None in records older than it.
    pub span: Option<Extent>,
    /// Its name in the label (the allocation id), when the caller knows it.
    pub name: Option<String>,
}

/// [`locate`] for a recorded partition. When the label no longer holds it as recorded,
/// or is no longer ours, the error ([`Error::Changed`]) says what another tool changed
/// and how to undo it.
pub fn locate_recorded(device: &Path, want: &Recorded) -> Result<Carved> {
    match locate(device, &want.partuuid) {
        Err(Error::NotInLabel(_)) => Err(Error::Changed(missing(device, want)?)),
        Err(Error::Foreign { why, .. }) => Err(Error::Changed(format!(
            "the label of {dev}, which holds partition {n} (PARTUUID {g}) of this volume, \
             was changed by another tool: {why}. The driver changes no label it does not \
             recognise as its own: undo that change (delete the partition it added, e.g. \
             `sgdisk --delete=N {dev}`, or restore the label) and retry; nothing was changed",
            dev = device.display(),
            n = want.number,
            g = want.partuuid,
        ))),
        other => other,
    }
}

/// Why the label lacks the recorded partition: its PARTUUID changed, its span now
/// belongs to another entry, or its entry was removed; with the command that restores it.
fn missing(device: &Path, want: &Recorded) -> Result<String> {
    let label = ours(device)?;
    let dev = device.display();
    let (n, g) = (want.number, want.partuuid);
    let shown = kernel::partition(device, n)?;
    let span = want.span.or(shown.as_ref().map(|k| Extent {
        start: k.start,
        len: k.len,
    }));
    let head =
        format!("partition {n} of {dev} (PARTUUID {g}) is not in the gds-csi label as recorded");
    let tail = "its blocks are not erased and stay reserved (the volume's record is kept, \
                nothing is carved over them): restore the entry and retry";
    if let Some((_, e)) = label.partitions().find(|(m, _)| *m == n) {
        if span.is_none_or(|s| e.first_lba * label.sector == s.start) {
            return Ok(format!(
                "{head}: its PARTUUID was changed to {} by another tool; {tail} \
                 (`sgdisk --partition-guid={n}:{g} {dev}`)",
                e.guid
            ));
        }
    }
    let Some(span) = span else {
        return Ok(format!(
            "{head}: another tool removed its entry and the kernel no longer shows it; \
             restore the entry with its PARTUUID and retry"
        ));
    };
    let overlapping = label.partitions().find(|(_, e)| {
        let (s, end) = (e.first_lba * label.sector, (e.last_lba + 1) * label.sector);
        s < span.end() && span.start < end
    });
    if let Some((m, e)) = overlapping {
        return Ok(format!(
            "{head}: its span now belongs to partition {m} (PARTUUID {}, name {:?}), \
             changed by another tool; {tail} as it was",
            e.guid, e.name
        ));
    }
    let (first, last) = (span.start / label.sector, span.end() / label.sector - 1);
    let kernel = if shown.is_some() {
        " (the kernel still shows it)"
    } else {
        ""
    };
    let name = want
        .name
        .as_ref()
        .map(|name| format!(" --change-name={n}:{name}"))
        .unwrap_or_default();
    Ok(format!(
        "{head}: another tool removed its entry{kernel}; {tail} (`sgdisk --new={n}:{first}:{last} \
         --typecode={n}:{TYPE_GUID} --partition-guid={n}:{g}{name} {dev}`)"
    ))
}

/// Partition `partuuid` located (told to the kernel if it forgot) and its node opened
/// exclusively: for a step that must find the node a moment after a label write, when
/// udevd may be re-reading the disk (run it under the disk's lock).
pub fn open_located(device: &Path, partuuid: &Uuid) -> Result<(std::fs::File, PathBuf)> {
    let carved = locate(device, partuuid)?;
    let file = kernel::open_exclusive(&carved.node)?;
    Ok((file, carved.node))
}

/// The first half of [`remove`]: the kernel stops showing partition `partuuid` (refused
/// while it is open); the label keeps it. Done already when the label lacks it.
pub fn unshow(device: &Path, partuuid: &Uuid) -> Result<()> {
    match find(device, partuuid) {
        Err(Error::NotInLabel(_)) => Ok(()),
        Err(e) => Err(e),
        Ok((_, number)) => kernel::delete(device, number),
    }
}

/// Removes partition `partuuid`: from the kernel first (refused while it is open), then
/// from the label. Done already when the label lacks it. Erase its blocks before.
pub fn remove(device: &Path, partuuid: &Uuid) -> Result<()> {
    let (mut label, number) = match find(device, partuuid) {
        Err(Error::NotInLabel(_)) => return Ok(()),
        other => other?,
    };
    kernel::delete(device, number)?;
    label.remove(number);
    label::write(device, &label)
}
