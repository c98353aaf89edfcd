//! Per-volume try-locks, taken by the gRPC handlers. A second call on a busy volume gets
//! `Aborted` at once instead of queueing, and different volumes never wait on each other.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// What a guard is held on.
#[derive(Debug, Clone, Copy)]
pub enum LockKey<'a> {
    /// A volume, by its id: its stage, publish, expand and delete, a clone's CreateVolume
    /// of it, a snapshot's copy of it.
    Volume(&'a str),
    /// A CreateVolume's name: one allocation per name at a time.
    VolumeName(&'a str),
    /// A snapshot's name: its CreateSnapshot and DeleteSnapshot.
    SnapshotName(&'a str),
}

/// A key as the set of held guards keeps it: a volume id never collides with a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Held {
    Volume(String),
    VolumeName(String),
    SnapshotName(String),
}

impl From<LockKey<'_>> for Held {
    fn from(key: LockKey<'_>) -> Held {
        match key {
            LockKey::Volume(id) => Held::Volume(id.to_owned()),
            LockKey::VolumeName(n) => Held::VolumeName(n.to_owned()),
            LockKey::SnapshotName(n) => Held::SnapshotName(n.to_owned()),
        }
    }
}

impl fmt::Display for LockKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKey::Volume(id) => write!(f, "{id}"),
            LockKey::VolumeName(n) => write!(f, "volume name {n}"),
            LockKey::SnapshotName(n) => write!(f, "snapshot {n}"),
        }
    }
}

#[derive(Clone, Default)]
pub struct VolumeLocks {
    held: Arc<Mutex<HashSet<Held>>>,
}

/// Releases the key when dropped, on every return path.
#[must_use]
pub struct VolumeGuard {
    held: Arc<Mutex<HashSet<Held>>>,
    key: Held,
}

impl VolumeLocks {
    pub fn try_lock(&self, key: LockKey<'_>) -> Result<VolumeGuard> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.insert(key.into()) {
            return Err(Error::Busy(key.to_string()));
        }
        Ok(VolumeGuard {
            held: Arc::clone(&self.held),
            key: key.into(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_volume_is_busy_until_released() {
        let locks = VolumeLocks::default();
        let guard = locks.try_lock(LockKey::Volume("a")).unwrap();
        assert!(matches!(
            locks.try_lock(LockKey::Volume("a")),
            Err(Error::Busy(_))
        ));
        let _other = locks
            .try_lock(LockKey::Volume("b"))
            .expect("other volumes are independent");
        // A name is not a volume id, whatever its text.
        let _name = locks
            .try_lock(LockKey::VolumeName("a"))
            .expect("a name never waits for a volume");
        let _snap = locks
            .try_lock(LockKey::SnapshotName("a"))
            .expect("nor a snapshot's name");
        drop(guard);
        let _again = locks
            .try_lock(LockKey::Volume("a"))
            .expect("released on drop");
    }
}
