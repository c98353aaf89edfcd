//! ControllerExpandVolume of a partition whose neighbour takes the space after it: the
//! volume moves to a larger extent of the same drive, keeping its PARTUUID, partition
//! entry and id. Only a volume nothing uses (offline expansion): the caller checks, and
//! the old partition node stays open exclusively while it is copied (nothing mounts it).
//!
//! The steps, each idempotent, a kill point after each; the label says which extent
//! holds the volume:
//! 1. record the move (`moving`: the extent it moves to, the one it leaves, a spare
//!    PARTUUID), under the device's lock;
//! 2. reserve: a spare label entry over the new extent, so nothing is carved there;
//! 3. copy, without the device's lock (creates and deletes on the drive go on): the new
//!    extent zeroed, the old one's non-zero chunks written to it, flushed;
//! 4. switch, one label write under the lock: the volume's entry takes the new extent,
//!    the spare entry the old one; the kernel shows the partition at the new extent; the
//!    record takes the new span and size;
//! 5. erase the old extent (zeroed), then drop the spare entry and the record's move.
//!
//! A crash before the switch leaves the old extent the volume's, intact: [`settle`]
//! zeroes the partial copy and drops the spare entry. After it, the new extent holds the
//! whole volume: [`settle`] zeroes the old extent and drops the spare entry. The old
//! extent is never free while it holds the only copy, and a copy is never left where
//! another volume could be carved. `settle` runs at start-up and before any other step
//! on a volume with a move recorded; the retried ControllerExpandVolume then moves again
//! or finds the volume grown. A running move is a job (`move:<volume id>`): a retry joins
//! it, NodeStage and DeleteVolume are refused (Aborted) until it ends.

use std::path::Path;
use std::time::Duration;

use tracing::{info, warn};
use uuid::Uuid;

use super::guard::settled;
use super::{as_device, Partitioned};
use crate::csi::id::BlockVolumeId;
use crate::disk::gpt::{self, kernel, volume, Extent, Held};
use crate::error::{Error, ExpandError, LayoutError, Result};
use crate::os::MountEntry;
use crate::pool::{MoveRecord, PoolDevice, VolumeRecord};
use crate::runtime::faults::{self, KillPoint};

/// Each GiB copied or zeroed must finish within this.
const PER_GIB: Duration = Duration::from_secs(120);

/// The job key of a move: a retried call joins it, other calls see it running.
pub fn move_key(raw: &str) -> String {
    format!("move:{raw}")
}

/// The spare entry's name: the volume's allocation id marked as a move's.
fn spare_name(id: &BlockVolumeId) -> String {
    format!("{}.move", id.allocation)
}

/// [`spare_name`] of volume id `raw`.
fn spare_of(raw: &str) -> Option<String> {
    BlockVolumeId::parse(raw).map(|id| spare_name(&id))
}

/// What a move needs that the record says.
struct Planned {
    partuuid: Uuid,
    spare: Uuid,
    from: Extent,
    to: Extent,
}

impl Planned {
    fn of(raw: &str, rec: &VolumeRecord) -> Result<Option<Planned>> {
        let Some(part) = rec.partition.as_ref() else {
            return Ok(None);
        };
        let Some(m) = part.moving.as_ref() else {
            return Ok(None);
        };
        let bad = |what: &str| ExpandError::BadPartuuid {
            volume: raw.to_owned(),
            why: what.to_owned(),
        };
        Ok(Some(Planned {
            partuuid: Uuid::parse_str(&part.partuuid).map_err(|e| bad(&e.to_string()))?,
            spare: Uuid::parse_str(&m.spare).map_err(|e| bad(&e.to_string()))?,
            from: Extent {
                start: m.from.0,
                len: m.from.1,
            },
            to: m.to_span(),
        }))
    }
}

impl Partitioned {
    /// Moves volume `id` to an extent of `size` bytes of its drive, as a job a retried
    /// call joins (the copy of a large volume outlasts the resizer's timeout).
    /// `blocked` says why it cannot grow in place (for the error when no extent fits).
    pub(crate) async fn relocate(
        &self,
        id: &BlockVolumeId,
        size: u64,
        blocked: &str,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let raw = id.to_string();
        let (this, id, mounts) = (self.clone(), id.clone(), mounts.to_vec());
        let blocked = blocked.to_owned();
        let job = async move { this.relocate_job(&id, size, &blocked, &mounts).await };
        self.pool
            .jobs
            .run(&move_key(&raw), "partition-move", job)
            .await
    }

    /// Whether a move of volume `raw` is running now.
    pub(crate) fn moving_now(&self, raw: &str) -> bool {
        self.pool.jobs.is_running(&move_key(raw))
    }

    async fn relocate_job(
        &self,
        id: &BlockVolumeId,
        size: u64,
        blocked: &str,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let raw = id.to_string();
        let rec = self.record(&raw)?;
        let parent = self.parent(&rec)?;
        let moved = self.move_steps(id, &parent, size, blocked, mounts).await;
        if moved.is_err() {
            // Nothing half done stays behind a failed step: finished or rolled back.
            let _device = self.device_lock(&parent.id).await;
            if let Err(e) = self.settle(&raw, &parent.path).await {
                warn!(volume_id = raw, error = %e, "a failed move could not be settled; start-up settles it");
            }
        }
        moved
    }

    async fn move_steps(
        &self,
        id: &BlockVolumeId,
        parent: &PoolDevice,
        size: u64,
        blocked: &str,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let raw = id.to_string();
        let device = self.device_lock(&parent.id).await;
        let Some((plan, old)) = self.plan(id, parent, size, blocked, mounts).await? else {
            return Ok(());
        };
        self.record_move(&raw, &plan)?;
        faults::reached(KillPoint::MoveAfterRecord);
        let held = self.held_except(&parent.id, plan.to);
        let (path, name, spare, to) = (parent.path.clone(), spare_name(id), plan.spare, plan.to);
        let reserve = move || volume::reserve(&path, &name, &spare, to, &held);
        let what = "reserving a new extent";
        settled(&parent.path, what, self.label_deadline, reserve).await?;
        faults::reached(KillPoint::MoveAfterReserve);
        drop(device);
        info!(volume_id = raw, from = ?plan.from, to = ?plan.to, "moving the partition to grow it");
        let path = parent.path.clone();
        let (from, to) = (plan.from, plan.to);
        let (copied, old) = tokio::task::spawn_blocking(move || {
            (kernel::copy_extent(&path, from, to, PER_GIB), old)
        })
        .await
        .map_err(|e| LayoutError::ZeroTaskFailed {
            why: format!("the copy: {e}"),
        })?;
        let copied = copied?;
        faults::reached(KillPoint::MoveAfterCopy);
        let _device = self.device_lock(&parent.id).await;
        drop(old);
        let path = parent.path.clone();
        let switch = move || volume::switch(&path, &plan.partuuid, &plan.spare, plan.to);
        let what = "switching to the new extent";
        settled(&parent.path, what, self.label_deadline, switch).await?;
        self.record_span(&raw, plan.to)?;
        faults::reached(KillPoint::MoveAfterSwitch);
        self.settle(&raw, &parent.path).await?;
        let (read, written) = (copied.read, copied.written);
        info!(volume_id = raw, read, written, "partition moved");
        Ok(())
    }

    /// Under the device's lock: an earlier move settled, the volume located and proven
    /// unused (its node then held open exclusively, returned), the extent it moves to
    /// chosen. None when it already has `size` (a retry after the move).
    async fn plan(
        &self,
        id: &BlockVolumeId,
        parent: &PoolDevice,
        size: u64,
        blocked: &str,
        mounts: &[MountEntry],
    ) -> Result<Option<(Planned, std::fs::File)>> {
        let raw = id.to_string();
        self.repair_label(&parent.path).await?;
        self.settle(&raw, &parent.path).await?;
        let rec = self.record(&raw)?;
        let partuuid = rec.partition.as_ref().map(|p| p.partuuid.clone());
        let partuuid = partuuid.ok_or_else(|| ExpandError::NoPartitionRecorded {
            volume: raw.clone(),
        })?;
        let partuuid = Uuid::parse_str(&partuuid).map_err(|e| ExpandError::BadPartuuid {
            volume: raw.clone(),
            why: e.to_string(),
        })?;
        let carved = self.locate_bounded(&parent.path, partuuid)?;
        if carved.span.len >= size {
            self.record_span(&raw, carved.span)?;
            return Ok(None);
        }
        let dev = as_device(parent, &rec, &carved).ok_or_else(|| LayoutError::PartitionGone {
            node: carved.node.clone(),
        })?;
        let in_use = |uses: String| -> Error {
            let (free, largest) = volume::ours(&parent.path).map_or((0, 0), |l| l.capacity());
            let (volume, blocked) = (raw.clone(), blocked.to_owned());
            let e = ExpandError::InUse {
                volume,
                wanted: size,
                blocked,
                uses,
                free,
                largest,
            };
            e.into()
        };
        if let Some(u) = self.pool.uses(&dev, mounts).first() {
            return Err(in_use(u.to_string()));
        }
        // Held open exclusively until the switch: nothing mounts the volume meanwhile.
        let old = kernel::open_exclusive(&carved.node).map_err(|e| in_use(e.to_string()))?;
        let to = self.new_extent(&raw, parent, size, blocked)?;
        let plan = Planned {
            partuuid,
            spare: Uuid::new_v4(),
            from: carved.span,
            to,
        };
        Ok(Some((plan, old)))
    }

    /// Where the volume moves: a placement of `size` on its drive, clear of every
    /// partition and held span; OutOfRange with the drive's free space when none fits.
    fn new_extent(
        &self,
        raw: &str,
        parent: &PoolDevice,
        size: u64,
        blocked: &str,
    ) -> Result<Extent> {
        let held = self.held(&parent.id);
        let label = volume::ours(&parent.path)?;
        let held = volume::held_on(&parent.path, &label, &held)?;
        if let Some(p) = label.placement(size, &held) {
            return Ok(p.at);
        }
        let free = label.free_extents_clear_of(&held);
        Err(ExpandError::NoRoomToMove {
            volume: raw.to_owned(),
            blocked: blocked.to_owned(),
            device: parent.path.clone(),
            wanted: size,
            free: free.iter().map(|e| e.len).sum(),
            largest: free.iter().map(|e| e.len).max().unwrap_or(0),
        }
        .into())
    }

    /// The drive's held spans and numbers without the extent a move reserves itself.
    fn held_except(&self, device_id: &str, to: Extent) -> Held {
        let mut held = self.held(device_id);
        held.spans.retain(|s| *s != to);
        held
    }

    fn record_move(&self, raw: &str, plan: &Planned) -> Result<()> {
        self.pool.state.update(|s| {
            let p = s.get_mut(raw).and_then(|r| r.partition.as_mut());
            let p = p.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))?;
            p.moving = Some(MoveRecord {
                to: (plan.to.start, plan.to.len),
                from: (plan.from.start, plan.from.len),
                spare: plan.spare.to_string(),
            });
            Ok(())
        })
    }

    /// The record says the partition spans `span` (and at least its size).
    fn record_span(&self, raw: &str, span: Extent) -> Result<()> {
        self.pool.state.update(|s| {
            let r = s
                .get_mut(raw)
                .ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))?;
            r.capacity_bytes = r.capacity_bytes.max(span.len);
            if let Some(p) = r.partition.as_mut() {
                p.span = Some((span.start, span.len));
            }
            Ok(())
        })
    }

    /// Finishes or rolls back the move recorded for volume `raw` (see the module doc);
    /// nothing when none is. The caller holds the device's lock. A label that no longer
    /// shows the move as this driver left it is refused, naming what changed, and
    /// nothing is zeroed.
    pub(crate) async fn settle(&self, raw: &str, parent: &Path) -> Result<()> {
        let Ok(rec) = self.record(raw) else {
            return Ok(());
        };
        let Some(plan) = Planned::of(raw, &rec)? else {
            return Ok(());
        };
        let path = parent.to_owned();
        let (partuuid, spare) = (plan.partuuid, plan.spare);
        let spans = move || volume::move_spans(&path, &partuuid, &spare);
        let (span, spare_span) = settled(
            parent,
            "reading a move's entries",
            self.label_deadline,
            spans,
        )
        .await?;
        let (switched, leftover) = if span == plan.to {
            (true, plan.from)
        } else if span == plan.from {
            (false, plan.to)
        } else {
            return Err(changed(
                raw,
                parent,
                &format!("the volume's entry spans {span:?}"),
            ));
        };
        if let Some((s, name)) = spare_span {
            // Another volume's entry (planted PARTUUID) has another name, or another span.
            if s != leftover || Some(name.as_str()) != spare_of(raw).as_deref() {
                let what = format!("the spare entry {name:?} spans {s:?}");
                return Err(changed(raw, parent, &what));
            }
            self.clear_spare(parent, s, spare).await?;
        }
        if switched {
            self.record_span(raw, plan.to)?;
        }
        self.pool.state.update(|s| {
            if let Some(p) = s.get_mut(raw).and_then(|r| r.partition.as_mut()) {
                p.moving = None;
            }
            Ok(())
        })?;
        info!(volume_id = raw, switched, "move settled");
        Ok(())
    }

    /// Zeroes the extent spare entry `spare` holds (`span`), then drops the entry.
    async fn clear_spare(&self, parent: &Path, span: Extent, spare: Uuid) -> Result<()> {
        let path = parent.to_owned();
        let zero = move || kernel::zero_span(&path, span, PER_GIB);
        settled(parent, "zeroing a move's leftover extent", PER_GIB, zero).await?;
        faults::reached(KillPoint::MoveAfterErase);
        let path = parent.to_owned();
        let remove = move || volume::remove(&path, &spare);
        let what = "removing a move's spare entry";
        settled(parent, what, self.label_deadline, remove).await
    }

    /// Start-up: every move a crash cut short is finished or rolled back before the
    /// backend is ready.
    pub async fn settle_moves(&self) {
        let state = self.pool.state.snapshot();
        let moving: Vec<(String, String)> = state
            .iter()
            .filter(|(_, r)| r.partition.as_ref().is_some_and(|p| p.moving.is_some()))
            .map(|(id, r)| (id.clone(), r.device_id.clone()))
            .collect();
        for (raw, device_id) in moving {
            let Some(parent) = self.pool.device(&device_id) else {
                warn!(
                    volume_id = raw,
                    device_id, "a move cannot be settled: its device is not in the pool"
                );
                continue;
            };
            let _device = self.device_lock(&device_id).await;
            if let Err(e) = self.settle(&raw, &parent.path).await {
                warn!(volume_id = raw, error = %e, "a move could not be settled");
            }
        }
    }
}

fn changed(raw: &str, parent: &Path, what: &str) -> Error {
    Error::Label(gpt::Error::Changed(format!(
        "the move of volume {raw} on {} is not as this driver left it: {what}; nothing was \
         zeroed. Restore the label (`sgdisk --backup` first) and restart the driver",
        parent.display()
    )))
}
