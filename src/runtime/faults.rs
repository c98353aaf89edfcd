//! Test-only fault injection: kill the plugin with SIGKILL at a named step, so the
//! crash-recovery tests (`tests/faults.rs`) can prove every step is safe to die in.
//!
//! Compiled in only with the cargo feature `fault-injection`, which the release build and
//! the image leave off: without it [`reached`] is an empty inline function and the
//! environment variable is not read at all (`config.rs` has no such setting then).
//! With it, armed only by `GDS_CSI_FAULT_KILL_AT=<point>` (or the hidden
//! `--fault-kill-at`), read once at start-up into [`crate::runtime::config::ServeArgs`] and handed
//! to [`arm`]: the plugin kills itself the first time it reaches the point. Unarmed,
//! [`reached`] costs one atomic load and an `Option` check.

#[cfg(feature = "fault-injection")]
use std::sync::OnceLock;

/// Environment variable that arms a kill point (read only with `fault-injection`).
pub const ENV: &str = "GDS_CSI_FAULT_KILL_AT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillPoint {
    /// CreateVolume: the allocation is in the state file, the reply not yet sent.
    AfterAllocate,
    /// NodeStageVolume: mkfs finished, the "formatted" state update not yet written.
    AfterMkfs,
    /// NodeStageVolume: the staging mount exists, not yet verified.
    AfterStageMount,
    /// NodePublishVolume: the bind mount exists, the reply not yet sent.
    AfterBindMount,
    /// DeleteVolume: `deleting = true` is written, the device not yet wiped.
    DeleteBeforeWipe,
    /// DeleteVolume: the device is wiped and zeroed, the record not yet removed.
    DeleteAfterWipe,
    /// CreateVolume (partition layout): the record is written, no partition carved yet.
    PartAfterClaim,
    /// CreateVolume (partition layout): the GPT and the kernel show the partition, the
    /// record does not say so yet.
    PartAfterLabel,
    /// DeleteVolume (partition layout): the kernel no longer shows the erased partition,
    /// the GPT still lists it.
    PartAfterUnshow,
    /// DeleteVolume (partition layout): the partition is gone from the GPT, the record
    /// is not removed yet.
    PartAfterRemove,
    /// CreateSnapshot (an incremental one): the unchanged files are linked from the base
    /// snapshot, nothing else copied, no manifest written.
    SnapshotAfterLinks,
    /// ControllerExpandVolume moving a partition: the move is in the record, the label
    /// unchanged.
    MoveAfterRecord,
    /// The move's spare entry holds the new extent in the label, nothing copied.
    MoveAfterReserve,
    /// The volume's bytes are on the new extent (flushed), the label not switched.
    MoveAfterCopy,
    /// The label gives the volume the new extent, the old one not erased.
    MoveAfterSwitch,
    /// The old extent is zeroed, its spare entry still in the label.
    MoveAfterErase,
}

impl KillPoint {
    pub const ALL: [KillPoint; 16] = [
        KillPoint::AfterAllocate,
        KillPoint::AfterMkfs,
        KillPoint::AfterStageMount,
        KillPoint::AfterBindMount,
        KillPoint::DeleteBeforeWipe,
        KillPoint::DeleteAfterWipe,
        KillPoint::PartAfterClaim,
        KillPoint::PartAfterLabel,
        KillPoint::PartAfterUnshow,
        KillPoint::PartAfterRemove,
        KillPoint::SnapshotAfterLinks,
        KillPoint::MoveAfterRecord,
        KillPoint::MoveAfterReserve,
        KillPoint::MoveAfterCopy,
        KillPoint::MoveAfterSwitch,
        KillPoint::MoveAfterErase,
    ];

    /// The points a move of a partition passes (an expansion the space after it cannot
    /// take), in order.
    pub const MOVE: [KillPoint; 5] = [
        KillPoint::MoveAfterRecord,
        KillPoint::MoveAfterReserve,
        KillPoint::MoveAfterCopy,
        KillPoint::MoveAfterSwitch,
        KillPoint::MoveAfterErase,
    ];

    /// The points the partition layout passes, in the order of a volume's life (it also
    /// passes after-allocate, after-mkfs, delete-before-wipe and delete-after-wipe).
    pub const PARTITION: [KillPoint; 8] = [
        KillPoint::PartAfterClaim,
        KillPoint::PartAfterLabel,
        KillPoint::AfterAllocate,
        KillPoint::AfterMkfs,
        KillPoint::DeleteBeforeWipe,
        KillPoint::DeleteAfterWipe,
        KillPoint::PartAfterUnshow,
        KillPoint::PartAfterRemove,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KillPoint::AfterAllocate => "after-allocate",
            KillPoint::AfterMkfs => "after-mkfs",
            KillPoint::AfterStageMount => "after-stage-mount",
            KillPoint::AfterBindMount => "after-bind-mount",
            KillPoint::DeleteBeforeWipe => "delete-before-wipe",
            KillPoint::DeleteAfterWipe => "delete-after-wipe",
            KillPoint::PartAfterClaim => "part-after-claim",
            KillPoint::PartAfterLabel => "part-after-label",
            KillPoint::PartAfterUnshow => "part-after-unshow",
            KillPoint::PartAfterRemove => "part-after-remove",
            KillPoint::SnapshotAfterLinks => "snapshot-after-links",
            KillPoint::MoveAfterRecord => "move-after-record",
            KillPoint::MoveAfterReserve => "move-after-reserve",
            KillPoint::MoveAfterCopy => "move-after-copy",
            KillPoint::MoveAfterSwitch => "move-after-switch",
            KillPoint::MoveAfterErase => "move-after-erase",
        }
    }

    #[cfg(feature = "fault-injection")]
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|p| p.as_str()).collect();
                format!("unknown kill point {s:?}; one of {}", names.join(", "))
            })
    }
}

#[cfg(feature = "fault-injection")]
static ARMED: OnceLock<KillPoint> = OnceLock::new();

/// Arms `point` for the life of the process; called once from `main` with the config value.
#[cfg(feature = "fault-injection")]
pub fn arm(point: Option<KillPoint>) {
    if let Some(p) = point {
        if ARMED.set(p).is_ok() {
            tracing::warn!(
                kill_point = p.as_str(),
                "TEST-ONLY fault injection armed ({ENV}); the plugin will SIGKILL itself there"
            );
        }
    }
}

/// Marks a step. When it is the armed kill point, the process dies here with SIGKILL:
/// no destructors, no flush, no reply, exactly like the OOM killer or a node crash.
#[cfg(feature = "fault-injection")]
#[inline]
pub fn reached(point: KillPoint) {
    if let Some(&armed) = ARMED.get() {
        if armed == point {
            die(point);
        }
    }
}

/// Without `fault-injection`: nothing, whatever the environment says.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn reached(_point: KillPoint) {}

#[cfg(feature = "fault-injection")]
#[cold]
fn die(point: KillPoint) -> ! {
    // stderr is unbuffered: the line is in the log before the signal lands.
    eprintln!("gds-csi fault injection: killed at {}", point.as_str());
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for p in KillPoint::ALL {
            assert_eq!(KillPoint::parse(p.as_str()), Ok(p));
        }
        let err = KillPoint::parse("after-lunch").unwrap_err();
        assert!(err.contains("after-mkfs"), "{err}");
    }
}
