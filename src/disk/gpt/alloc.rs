//! Space on a carved device: free extents, the size a CSI CapacityRange asks for, best
//! fit, growth in place. All in bytes, every start and size a multiple of [`ALIGN`].

use uuid::Uuid;

use super::format::{Entry, Label, NAME_UNITS, TYPE_GUID};
use super::{Error, Result};

/// Partition alignment and size granularity: 1 MiB, a multiple of every logical and
/// physical block size and of common NVMe/SSD erase and stripe units.
pub const ALIGN: u64 = 1 << 20;

/// A span of bytes on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    pub start: u64,
    pub len: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

fn align_up(n: u64) -> Option<u64> {
    n.checked_next_multiple_of(ALIGN)
}

fn align_down(n: u64) -> u64 {
    n - n % ALIGN
}

/// CSI's CapacityRange: 0 means unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SizeRange {
    pub required: u64,
    pub limit: u64,
}

impl SizeRange {
    /// The partition size for this range: `required` rounded up to [`ALIGN`] (exact when
    /// aligned); without `required`, `default` capped at `limit`. OutOfRange when no
    /// aligned size lies in the range.
    pub fn size(&self, default: u64) -> Result<u64> {
        let (req, lim) = (self.required, self.limit);
        if lim != 0 && req > lim {
            return Err(Error::NoSizeInRange(format!(
                "required_bytes {req} is more than limit_bytes {lim}"
            )));
        }
        if req > 0 {
            let size = align_up(req).ok_or_else(|| {
                Error::NoSizeInRange(format!("required_bytes {req} is too large"))
            })?;
            if lim != 0 && size > lim {
                return Err(Error::NoSizeInRange(format!(
                    "required_bytes {req} rounds up to {size} (partitions are whole MiB), \
                     beyond limit_bytes {lim}; ask for a multiple of {ALIGN} bytes or allow \
                     limit_bytes of at least {size}"
                )));
            }
            return Ok(size);
        }
        let target = if lim != 0 { default.min(lim) } else { default };
        let mut size = align_up(target.max(1)).unwrap_or(align_down(u64::MAX));
        if lim != 0 && size > lim {
            size = align_down(lim);
        }
        if size == 0 {
            return Err(Error::NoSizeInRange(format!(
                "limit_bytes {lim} is less than one {ALIGN}-byte partition"
            )));
        }
        Ok(size)
    }
}

/// Free space kept after each partition so that it can grow in place later, as a
/// percentage of its size: a new partition is carved that far past the one before it
/// while the device has the room.
pub const GROWTH_ROOM_PERCENT: u64 = 50;

/// The room a partition of `len` bytes keeps after it (whole MiB).
pub fn growth_room(len: u64) -> u64 {
    let share = (u128::from(len) * u128::from(GROWTH_ROOM_PERCENT) / 100) as u64;
    align_up(share).unwrap_or(align_down(u64::MAX))
}

/// Where a new partition goes, and how well that placement keeps room to grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The new partition's span.
    pub at: Extent,
    /// The free extent it is carved from.
    pub gap: Extent,
    /// Both the partition before the gap and the new one keep their whole growth room.
    pub full_room: bool,
}

impl Placement {
    /// Orders placements, best first: those that keep every growth room, the smallest
    /// gap first (large extents stay whole for large claims); then the rest, the largest
    /// gap first (the most room shared out).
    pub fn rank(&self) -> (bool, u64, u64) {
        let key = if self.full_room {
            self.gap.len
        } else {
            u64::MAX - self.gap.len
        };
        (!self.full_room, key, self.gap.start)
    }
}

/// The placement of a new partition of `size` bytes in gap `gap`, whose predecessor (the
/// partition ending where the gap starts, if any) wants `room_before` bytes after it.
/// With enough space both keep their whole room; otherwise the gap's slack is shared in
/// proportion to the rooms wanted, so a claim as large as the gap still fits.
fn place_in(gap: Extent, size: u64, room_before: u64) -> Option<Placement> {
    let slack = gap.len.checked_sub(size)?;
    let room_after = growth_room(size);
    let full_room = slack >= room_before.saturating_add(room_after);
    let offset = if full_room {
        room_before
    } else {
        let wanted = u128::from(room_before) + u128::from(room_after);
        let share = u128::from(slack) * u128::from(room_before) / wanted.max(1);
        align_down(share as u64)
    };
    Some(Placement {
        at: Extent {
            start: gap.start + offset,
            len: size,
        },
        gap,
        full_room,
    })
}

/// The best placement for `size` among the `free` gaps, `used` being every span taken
/// (partitions and held spans): see [`Placement::rank`].
pub fn place(free: &[Extent], used: &[Extent], size: u64) -> Option<Placement> {
    free.iter()
        .filter_map(|&gap| {
            let before = used
                .iter()
                .filter(|u| u.len > 0 && u.end() <= gap.start)
                .max_by_key(|u| u.end())
                .filter(|u| align_up(u.end()) == Some(gap.start));
            place_in(gap, size, before.map_or(0, |u| growth_room(u.len)))
        })
        .min_by_key(Placement::rank)
}

/// Partition numbers and spans the label does not list that must stay untouched: a
/// partition the kernel still shows, or a volume whose entry another tool removed or
/// changed (its blocks are not erased, so never carved or grown over).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    pub numbers: Vec<u32>,
    pub spans: Vec<Extent>,
}

impl Label {
    /// The aligned span partitions may occupy.
    pub fn usable(&self) -> Extent {
        let start = align_up(self.first_usable * self.sector).unwrap_or(u64::MAX);
        let end = align_down((self.last_usable + 1) * self.sector);
        Extent {
            start,
            len: end.saturating_sub(start),
        }
    }

    /// Partition `number`'s span in bytes.
    pub fn extent(&self, number: u32) -> Option<Extent> {
        let e = self.slots.get(number.checked_sub(1)? as usize)?.as_ref()?;
        Some(self.span(e))
    }

    fn span(&self, e: &Entry) -> Extent {
        Extent {
            start: e.first_lba * self.sector,
            len: (e.last_lba + 1 - e.first_lba) * self.sector,
        }
    }

    /// Free aligned extents between the partitions, in device order.
    pub fn free_extents(&self) -> Vec<Extent> {
        self.free_extents_clear_of(&Held::default())
    }

    /// The lowest partition number with a free entry, outside the `held` numbers and
    /// within the numbers the kernel registers.
    pub fn free_slot(&self, held: &Held) -> Option<u32> {
        // One flag per entry, not a scan of `held.numbers` per entry: a full label's
        // search would be quadratic in the volume count.
        let usable = self.usable_entries();
        let mut taken = vec![false; usable];
        for n in &held.numbers {
            if let Some(t) = (*n as usize).checked_sub(1).and_then(|i| taken.get_mut(i)) {
                *t = true;
            }
        }
        self.slots
            .iter()
            .zip(taken)
            .position(|(e, held)| e.is_none() && !held)
            .map(|i| i as u32 + 1)
    }

    /// How many entries can hold a partition the kernel shows: all of a 128-entry
    /// label, 255 of a 256-entry one.
    pub fn usable_entries(&self) -> usize {
        self.slots
            .len()
            .min(super::format::MAX_PARTITION_NUMBER as usize)
    }

    /// Free aligned extents between the partitions and the `held` spans, in device order;
    /// none when every partition entry is used (nothing more can be carved).
    pub fn free_extents_clear_of(&self, held: &Held) -> Vec<Extent> {
        if self.free_slot(held).is_none() {
            return Vec::new();
        }
        let usable = self.usable();
        let used = self.used_spans(held);
        let mut free = Vec::new();
        let mut at = usable.start;
        for u in used.iter().chain(std::iter::once(&Extent {
            start: usable.end(),
            len: 0,
        })) {
            let end = align_down(u.start.min(usable.end()));
            if end > at {
                free.push(Extent {
                    start: at,
                    len: end - at,
                });
            }
            at = at.max(align_up(u.end()).unwrap_or(u64::MAX));
        }
        free
    }

    /// The spans of the partitions and the `held` spans, in device order.
    pub fn used_spans(&self, held: &Held) -> Vec<Extent> {
        let mut used: Vec<Extent> = self.partitions().map(|(_, e)| self.span(e)).collect();
        used.extend(held.spans.iter().filter(|h| h.len > 0));
        used.sort_unstable();
        used
    }

    /// Where a new partition of `size` would go, clear of `held` ([`place`]).
    pub fn placement(&self, size: u64, held: &Held) -> Option<Placement> {
        place(
            &self.free_extents_clear_of(held),
            &self.used_spans(held),
            size,
        )
    }

    /// Free bytes (CSI `available_capacity`) and the largest single extent (CSI
    /// `maximum_volume_size`).
    pub fn capacity(&self) -> (u64, u64) {
        let free = self.free_extents();
        let total = free.iter().map(|e| e.len).sum();
        (total, free.iter().map(|e| e.len).max().unwrap_or(0))
    }

    pub fn by_name(&self, name: &str) -> Option<(u32, &Entry)> {
        self.partitions().find(|(_, e)| e.name == name)
    }

    pub fn by_guid(&self, guid: &Uuid) -> Option<(u32, &Entry)> {
        self.partitions().find(|(_, e)| &e.guid == guid)
    }

    /// Adds a partition of `size` bytes named `name` where [`place`] puts it, in the
    /// lowest free slot, with a fresh PARTUUID; returns its number. Only in memory: write
    /// the label.
    pub fn allocate(&mut self, name: &str, size: u64) -> Result<u32> {
        self.allocate_clear_of(name, size, &Held::default())
    }

    /// The free entry slot a new partition `name` takes: the name valid and not taken, a
    /// slot free and clear of `held`.
    fn slot_for_new(&self, name: &str, held: &Held) -> Result<u32> {
        check_name(name)?;
        if let Some((number, _)) = self.by_name(name) {
            return Err(Error::NameTaken {
                name: name.to_owned(),
                number,
                len: self.extent(number).map_or(0, |e| e.len),
            });
        }
        self.free_slot(held).ok_or(Error::NoEntry {
            entries: self.usable_entries(),
        })
    }

    /// [`Label::allocate`] outside the `held` spans and numbers.
    pub fn allocate_clear_of(&mut self, name: &str, size: u64, held: &Held) -> Result<u32> {
        if size == 0 || !size.is_multiple_of(ALIGN) {
            return Err(Error::Invalid(format!(
                "size {size} is not a positive multiple of {ALIGN}"
            )));
        }
        let slot = self.slot_for_new(name, held)?;
        let at = self.placement(size, held).map(|p| p.at).ok_or_else(|| {
            let free = self.free_extents_clear_of(held);
            Error::NoSpace {
                wanted: size,
                largest: free.iter().map(|e| e.len).max().unwrap_or(0),
            }
        })?;
        let slot = slot as usize - 1;
        self.slots[slot] = Some(Entry {
            type_guid: TYPE_GUID,
            guid: Uuid::new_v4(),
            first_lba: at.start / self.sector,
            last_lba: at.end() / self.sector - 1,
            attributes: 0,
            name: name.to_owned(),
        });
        Ok(slot as u32 + 1)
    }

    /// Adds partition `name` with PARTUUID `guid` exactly over `span` (free, clear of
    /// `held`), in the lowest free slot; returns its number. Only in memory.
    pub fn insert_at(&mut self, name: &str, guid: Uuid, span: Extent, held: &Held) -> Result<u32> {
        if span.len == 0 || !span.start.is_multiple_of(ALIGN) || !span.len.is_multiple_of(ALIGN) {
            return Err(Error::Invalid(format!(
                "span {span:?} is not aligned to {ALIGN}"
            )));
        }
        let slot = self.slot_for_new(name, held)?;
        let free = self.free_extents_clear_of(held);
        if !free
            .iter()
            .any(|g| g.start <= span.start && span.end() <= g.end())
        {
            return Err(Error::NoSpace {
                wanted: span.len,
                largest: free.iter().map(|e| e.len).max().unwrap_or(0),
            });
        }
        self.slots[slot as usize - 1] = Some(Entry {
            type_guid: TYPE_GUID,
            guid,
            first_lba: span.start / self.sector,
            last_lba: span.end() / self.sector - 1,
            attributes: 0,
            name: name.to_owned(),
        });
        Ok(slot)
    }

    /// Gives partition `number` the span `span` (only in memory; the caller has checked
    /// that nothing else holds it).
    pub fn set_span(&mut self, number: u32, span: Extent) -> Result<()> {
        let sector = self.sector;
        let e = self
            .slots
            .get_mut(
                number
                    .checked_sub(1)
                    .ok_or_else(|| Error::NotInLabel(number.to_string()))? as usize,
            )
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
        e.first_lba = span.start / sector;
        e.last_lba = span.end() / sector - 1;
        Ok(())
    }

    /// Grows partition `number` in place to `size` bytes; `Ok(false)` when it is already
    /// at least that large. Blocked, naming the neighbour, when the space after it is used.
    pub fn grow(&mut self, number: u32, size: u64) -> Result<bool> {
        self.grow_clear_of(number, size, &Held::default())
    }

    /// [`Label::grow`], never into a `held` span.
    pub fn grow_clear_of(&mut self, number: u32, size: u64, held: &Held) -> Result<bool> {
        if !size.is_multiple_of(ALIGN) {
            return Err(Error::Invalid(format!(
                "size {size} is not a multiple of {ALIGN}"
            )));
        }
        let now = self
            .extent(number)
            .ok_or_else(|| Error::NotInLabel(number.to_string()))?;
        if size <= now.len {
            return Ok(false);
        }
        let end = now.start + size;
        let next = self
            .partitions()
            .filter(|&(n, e)| n != number && e.first_lba * self.sector >= now.end())
            .min_by_key(|(_, e)| e.first_lba);
        let limit = next.map_or(self.usable().end(), |(_, e)| e.first_lba * self.sector);
        let held_at = held
            .spans
            .iter()
            .filter(|h| h.len > 0 && h.start >= now.end() && h.start < limit)
            .map(|h| h.start)
            .min();
        if let Some(h) = held_at.filter(|&h| end > h) {
            return Err(Error::Blocked {
                number,
                wanted: size,
                blocker: format!(
                    "bytes from {h} are held by a partition that is not in the label (another \
                     tool removed or changed its entry); at most {} bytes fit",
                    h - now.start
                ),
            });
        }
        if end > limit {
            let blocker = match next {
                Some((n, e)) => format!("partition {n} ({:?}) starts at byte {limit}", e.name),
                None => format!("the usable space ends at byte {limit}"),
            };
            return Err(Error::Blocked {
                number,
                wanted: size,
                blocker: format!("{blocker}; at most {} bytes fit", limit - now.start),
            });
        }
        if let Some(Some(e)) = self.slots.get_mut(number as usize - 1) {
            e.last_lba = end / self.sector - 1;
        }
        Ok(true)
    }

    /// Removes partition `number` from the label (in memory), returning its entry.
    pub fn remove(&mut self, number: u32) -> Option<Entry> {
        self.slots.get_mut(number.checked_sub(1)? as usize)?.take()
    }
}

/// A partition name: the allocation id, 1 to 36 UTF-16 units, no NUL.
fn check_name(name: &str) -> Result<()> {
    let units = name.encode_utf16().count();
    if units == 0 || units > NAME_UNITS || name.contains('\0') {
        return Err(Error::Invalid(format!(
            "partition name {name:?} must be 1 to {NAME_UNITS} UTF-16 units without NUL"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "alloc_tests.rs"]
mod tests;
