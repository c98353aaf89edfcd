//! CreateVolume's domain operation on the pool: idempotent by name, the smallest fitting
//! clean device, checked again after the scan and claimed under the state lock.

use tracing::{info, warn};

use super::{describe_signatures, inventory, AllocationRequest, Pool, PoolDevice, VolumeRecord};
use crate::csi::id::BlockVolumeId;
use crate::error::{AllocationError, Error, Result};
use crate::os::{Host, MountEntry};
use crate::runtime::faults::{self, KillPoint};

/// Why a free device was passed over at allocation; `changed`: the scan is stale (rescan).
struct Refusal {
    why: String,
    changed: bool,
}

impl Refusal {
    fn changed(why: String) -> Self {
        Refusal { why, changed: true }
    }

    fn kept(why: String) -> Self {
        Refusal {
            why,
            changed: false,
        }
    }
}

impl Pool {
    /// CreateVolume's domain operation: idempotent by name, smallest fitting clean device.
    pub async fn allocate(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)> {
        if let Some(found) = self.existing(req)? {
            return Ok(found);
        }
        let fitting: Vec<_> = self
            .free_devices()
            .into_iter()
            .filter(|d| req.fits(d.size_bytes))
            .collect();
        let mut refused = Vec::new();
        let mut changed = false;
        let mounts = host.mount_table()?;
        for dev in fitting {
            let now = match self.still_allocatable(host, &dev, &mounts).await {
                Ok(now) => now,
                Err(Refusal { why, changed: c }) => {
                    refused.push(why);
                    changed |= c;
                    continue;
                }
            };
            // Either way a claim answers a volume of this name: found or just claimed.
            if let Some(id) = self.claim(req, &dev, &now)? {
                faults::reached(KillPoint::AfterAllocate);
                info!(volume_id = %id, device = %dev.path.display(), "allocated");
                return self
                    .existing(req)?
                    .ok_or(Error::VolumeNotFound(id.to_string()));
            }
        }
        if changed {
            self.rescan(&mounts);
        }
        Err(self.nothing_fits(req, &refused))
    }

    /// The checks between the scan and a claim: the device must still be there, be what was
    /// scanned, be in use nowhere and carry no signature (a probe that fails is a refusal).
    async fn still_allocatable(
        &self,
        host: &dyn Host,
        dev: &PoolDevice,
        mounts: &[MountEntry],
    ) -> std::result::Result<inventory::Observed, Refusal> {
        let path = dev.path.display();
        let now = match inventory::observe(&self.config.host_sys, dev) {
            Ok(now) if now == dev.observed_at_scan() => now,
            Ok(now) => {
                warn!(device = %path, was = %dev.observed_at_scan(), %now, "pool device changed since the scan; not allocating");
                let was = dev.observed_at_scan();
                return Err(Refusal::changed(format!(
                    "{path} is no longer the device scanned (was {was}, now {now})"
                )));
            }
            Err(why) => {
                warn!(device = %path, %why, "pool device gone since the scan; not allocating");
                return Err(Refusal::changed(format!("{path} is gone ({why})")));
            }
        };
        if let Some(u) = self.uses(dev, mounts).first() {
            return Err(Refusal::kept(format!("{path} is in use: {u}")));
        }
        // Probe outside the state lock: a slow device must not stall other volumes.
        match host.probe_signatures(&dev.path).await {
            Ok(sigs) if sigs.is_empty() => Ok(now),
            Ok(sigs) => {
                let why = describe_signatures(&sigs);
                warn!(device = %path, signatures = %why, "foreign signature; not allocating");
                self.set_foreign(&dev.id, Some(why.clone()));
                Err(Refusal::kept(format!("{path} carries {why}")))
            }
            Err(e) => Err(Refusal::kept(e.to_string())),
        }
    }

    /// Records the allocation under the state lock: the id of the volume named `req.name`
    /// (found, or claimed on `dev` now), or `None` when another volume took `dev` meanwhile.
    fn claim(
        &self,
        req: &AllocationRequest,
        dev: &PoolDevice,
        now: &inventory::Observed,
    ) -> Result<Option<BlockVolumeId>> {
        self.state.update(|state| {
            if let Some((id, _)) = state.by_name(&req.name) {
                return Ok(Some(id.clone()));
            }
            // Taken meanwhile: by a volume, or by the partition layout for a new label
            // (`reserve_for_carving`, under this same lock).
            if state.by_device(&dev.id).is_some() || self.foreign_reason(&dev.id).is_some() {
                return Ok(None);
            }
            let uuid = uuid::Uuid::new_v4();
            let id = BlockVolumeId {
                device_id: dev.id.clone(),
                allocation: uuid.simple().to_string()[..8].to_owned(),
                node_id: self.config.node_id.clone(),
                layout: crate::csi::id::IdLayout::Device,
            };
            let record = VolumeRecord {
                name: req.name.clone(),
                device_id: dev.id.clone(),
                device_key: dev.key.clone(),
                capacity_bytes: dev.size_bytes,
                fs_type: req.fs_type,
                parameters: req.parameters.clone(),
                fs_uuid: uuid.hyphenated().to_string(),
                formatted: false,
                deleting: false,
                device_identity: now.identity.clone(),
                partition: None,
                stripe: None,
                source: req.source.clone(),
            };
            state.insert(&id, record);
            Ok(Some(id))
        })
    }

    fn existing(&self, req: &AllocationRequest) -> Result<Option<(BlockVolumeId, VolumeRecord)>> {
        let state = self.state.snapshot();
        let Some((id, rec)) = state.by_name(&req.name) else {
            return Ok(None);
        };
        if !req.fits(rec.capacity_bytes) {
            return Err(AllocationError::NameTakenOtherSize {
                name: req.name.clone(),
                bytes: rec.capacity_bytes,
            }
            .into());
        }
        if !req.made(rec) {
            return Err(AllocationError::NameTakenOtherParameters {
                name: req.name.clone(),
            }
            .into());
        }
        Ok(Some((id.clone(), rec.clone())))
    }

    fn nothing_fits(&self, req: &AllocationRequest, refused: &[String]) -> Error {
        let range = if req.limit_bytes == 0 {
            format!("at least {} bytes", req.required_bytes)
        } else {
            format!("{}..={} bytes", req.required_bytes, req.limit_bytes)
        };
        let any_fits = self.devices().iter().any(|d| req.fits(d.size_bytes));
        if !any_fits {
            let sizes: Vec<String> = self
                .devices()
                .iter()
                .map(|d| d.size_bytes.to_string())
                .collect();
            return AllocationError::NoDeviceFits {
                node: self.config.node_id.clone(),
                range,
                sizes: sizes.join(", "),
            }
            .into();
        }
        let mut refused = refused.to_vec();
        for dev in self.devices() {
            if let Some(why) = self.foreign_reason(&dev.id) {
                let line = format!("{} carries {why}", dev.path.display());
                if !refused.contains(&line) {
                    refused.push(line);
                }
            }
        }
        AllocationError::NoneFree {
            node: self.config.node_id.clone(),
            range,
            refused,
        }
        .into()
    }
}
