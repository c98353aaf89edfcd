//! Per-volume try-locks. A second call on a busy volume gets `Aborted` at once
//! instead of queueing, and different volumes never wait on each other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

#[derive(Clone, Default)]
pub struct VolumeLocks {
    held: Arc<Mutex<HashSet<String>>>,
}

/// Releases the volume when dropped, on every return path.
#[must_use]
pub struct VolumeGuard {
    held: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl VolumeLocks {
    pub fn try_lock(&self, key: &str) -> Result<VolumeGuard> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.insert(key.to_owned()) {
            return Err(Error::Busy(key.to_owned()));
        }
        Ok(VolumeGuard {
            held: Arc::clone(&self.held),
            key: key.to_owned(),
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
        let guard = locks.try_lock("a").unwrap();
        assert!(matches!(locks.try_lock("a"), Err(Error::Busy(_))));
        let _other = locks.try_lock("b").expect("other volumes are independent");
        drop(guard);
        let _again = locks.try_lock("a").expect("released on drop");
    }
}
