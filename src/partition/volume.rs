//! The steps the `partition` layout runs, each idempotent and in the order that keeps a
//! crash harmless (see the module doc): a retry after a crash at any point finishes the
//! job. The caller serialises the calls on one device (one lock per pool device) and
//! runs the host steps between them: mkfs after [`carve`]; before [`remove`], the
//! signature wipe, then [`kernel::zero_offloaded`] on the partition node, or the host
//! port's `zero_device` where that is `Unsupported`, so the next tenant reads zeros.

use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::alloc::{best_fit, Extent};
use super::gpt::Label;
use super::label::{self, OnDisk};
use super::{kernel, Error, Result};

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

/// The pool device and extent that fit `size` best among the carved devices' labels
/// (smallest hole that holds it; the first device on a tie).
pub fn choose(labels: &[(PathBuf, Label)], size: u64) -> Option<(&Path, Extent)> {
    labels
        .iter()
        .filter_map(|(dev, l)| best_fit(&l.free_extents(), size).map(|e| (dev, l, e)))
        .min_by_key(|(_, l, e)| {
            let hole = l.free_extents().into_iter().find(|f| f.start == e.start);
            hole.map_or(u64::MAX, |h| h.len)
        })
        .map(|(dev, _, e)| (dev.as_path(), e))
}

/// Carves partition `name` of `size` bytes on `device` (our label), or finds the one a
/// previous try carved: the label is written first, then the kernel told.
pub fn carve(device: &Path, name: &str, size: u64) -> Result<Carved> {
    let mut label = ours(device)?;
    let number = match label.by_name(name) {
        Some((n, _)) => {
            let span = label
                .extent(n)
                .ok_or_else(|| Error::NotFound(n.to_string()))?;
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
            let n = label.allocate(name, size)?;
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
        .ok_or_else(|| Error::NotFound(number.to_string()))?;
    let partuuid = label
        .partitions()
        .find(|(n, _)| *n == number)
        .map(|(_, e)| e.guid)
        .ok_or_else(|| Error::NotFound(number.to_string()))?;
    kernel::ensure(device, &kernel::list(device)?, number, span)?;
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
        .ok_or_else(|| Error::NotFound(format!("with PARTUUID {partuuid}")))?;
    Ok((label, number))
}

/// Grows partition `partuuid` in place to `size` bytes (never shrinks): the label
/// first, then the kernel. Blocked, naming the neighbour, when the space after it is
/// taken.
pub fn grow(device: &Path, partuuid: &Uuid, size: u64) -> Result<Carved> {
    let (mut label, number) = find(device, partuuid)?;
    if label.grow(number, size)? {
        label::write(device, &label)?;
    }
    shown(device, &label, number)
}

/// Where partition `partuuid` is now, telling the kernel of it if it forgot.
pub fn locate(device: &Path, partuuid: &Uuid) -> Result<Carved> {
    let (label, number) = find(device, partuuid)?;
    shown(device, &label, number)
}

/// The first half of [`remove`]: the kernel stops showing partition `partuuid` (refused
/// while it is open); the label keeps it. Done already when the label lacks it.
pub fn unshow(device: &Path, partuuid: &Uuid) -> Result<()> {
    match find(device, partuuid) {
        Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
        Ok((_, number)) => kernel::delete(device, number),
    }
}

/// Removes partition `partuuid`: from the kernel first (refused while it is open), then
/// from the label. Done already when the label lacks it. Erase its blocks before.
pub fn remove(device: &Path, partuuid: &Uuid) -> Result<()> {
    let (mut label, number) = match find(device, partuuid) {
        Err(Error::NotFound(_)) => return Ok(()),
        other => other?,
    };
    kernel::delete(device, number)?;
    label.remove(number);
    label::write(device, &label)
}
