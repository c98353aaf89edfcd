//! CreateVolume of the stripe layout: choose N pool devices behind distinct controllers,
//! claim the volume in the state file, carve every member, all under the chosen devices'
//! locks.
//!
//! Placement is the partition layout's (`partition::create`): in its short pool-wide
//! section the devices whose lock is free are locked and their labels read; the chosen
//! ones keep their locks, the others are let go at once. A device busy with another
//! create or a delete (an erase takes minutes) is passed over, so a stripe never waits
//! for a drive while enough free ones fit; only when too few do, it waits for the busy
//! ones (holding no lock) and picks again. No lock is waited for while another is held,
//! so two multi-device callers never wait for each other crosswise.

use std::collections::BTreeMap;

use tracing::info;

use super::{controllers, member_name, pcie, stripe_of, Striped, DATA_OFFSET};
use crate::csi::id::{BlockVolumeId, IdLayout};
use crate::disk::gpt::{label, volume, OnDisk};
use crate::error::{AllocationError, Error, LayoutError, Result};
use crate::os::Host;
use crate::pool::{
    AllocationRequest, PartitionRecord, PoolDevice, StripeMember, StripeRecord, VolumeRecord,
};
use crate::request::{stripe as params, StripeParams};
use crate::volume::block::partition::blank_capacity;
use crate::volume::block::partition::guard::DeviceGuard;

/// Devices locked by placement, with what they carry.
type Locked = Vec<(PoolDevice, OnDisk, DeviceGuard)>;

/// A device chosen for a member, with its controller, holding its lock.
struct Chosen {
    dev: PoolDevice,
    controller: String,
    gpu_pcie: Option<&'static str>,
    _guard: DeviceGuard,
}

/// A locked device a member fits on: labelled by us, or blank (labelled once all N are
/// found).
struct Fit {
    dev: PoolDevice,
    largest: u64,
    labelled: bool,
    controller: String,
    /// None where the node shows no GPU.
    gpu_pcie: Option<pcie::Nearness>,
    guard: DeviceGuard,
}

/// The volume's geometry from its stored parameters.
fn geometry(rec_params: &BTreeMap<String, String>) -> Result<StripeParams> {
    params::stripe_params(rec_params, true)?
        .ok_or_else(|| Error::invalid("parameters.stripeCount", "required with layout: stripe"))
}

impl Striped {
    pub(super) async fn allocate_volume(
        &self,
        host: &dyn Host,
        req: &AllocationRequest,
    ) -> Result<(BlockVolumeId, VolumeRecord)> {
        if let Some(id) = self.existing(req)? {
            let _members = self.lock_members(&id.to_string()).await?;
            return self.carve(&id).await;
        }
        let geo = geometry(&req.parameters)?;
        let member = super::member_size(req.required_bytes, req.limit_bytes, geo)?;
        let chosen = self.place(host, geo.count, member).await?;
        let id = self.claim(req, &chosen, geo, member)?;
        let members = self.member_ids(&id.to_string())?;
        if !members
            .iter()
            .all(|m| chosen.iter().any(|c| &c.dev.id == m))
        {
            // A create of the same name claimed first on devices we do not hold: carve
            // its claim under its devices' locks.
            drop(chosen);
            let _held = self.lock_sorted(members).await;
            return self.carve(&id).await;
        }
        let done = self.carve(&id).await;
        drop(chosen);
        done
    }

    /// N devices behind distinct controllers that each take a member of `member` bytes,
    /// returned locked (see the module doc).
    async fn place(&self, host: &dyn Host, n: u32, member: u64) -> Result<Vec<Chosen>> {
        loop {
            let busy = {
                let _placing = self.parts.placing().await;
                let (free, busy) = self.parts.lock_free_devices();
                match self.pick(host, free, n, member).await? {
                    Ok(chosen) => return Ok(chosen),
                    Err(short) if busy.is_empty() => {
                        return Err(LayoutError::NoRoom { why: short }.into());
                    }
                    Err(_) => busy,
                }
            };
            // Too few free devices fit: wait until the busy ones are done, then pick again.
            for id in busy {
                drop(self.parts.device_lock(&id).await);
            }
        }
    }

    /// The devices among `locked` a member fits on: nearest the GPUs on PCIe first (where
    /// sysfs shows GPUs), then ours, then the tightest fit.
    fn fits(&self, locked: Locked, member: u64) -> Vec<Fit> {
        let free = self.pool.free_devices();
        let sys = self.pool.host_sys();
        let gpus = pcie::gpus(sys);
        let mut fit: Vec<Fit> = locked
            .into_iter()
            .filter_map(|(dev, on, guard)| {
                let (largest, labelled) = match on {
                    OnDisk::Ours { label, .. } => (label.capacity().1, true),
                    OnDisk::Blank if free.iter().any(|f| f.id == dev.id) => {
                        (blank_capacity(&dev).1, false)
                    }
                    _ => return None,
                };
                let controller = controllers::controller_of(sys, &dev);
                let gpu_pcie = (!gpus.is_empty())
                    .then(|| pcie::nearness(pcie::drive_place(sys, &dev).as_ref(), &gpus));
                (largest >= member).then_some(Fit {
                    dev,
                    largest,
                    labelled,
                    controller,
                    gpu_pcie,
                    guard,
                })
            })
            .collect();
        fit.sort_by_key(|f| {
            let near = std::cmp::Reverse(f.gpu_pcie);
            (near, !f.labelled, f.largest, f.dev.id.clone())
        });
        fit
    }

    /// N of the locked devices, one per controller, a blank one proven blank by the
    /// signature probe and labelled only once all N are found; else (`Err` inside) why
    /// too few fit, for the ResourceExhausted message.
    async fn pick(
        &self,
        host: &dyn Host,
        locked: Locked,
        n: u32,
        member: u64,
    ) -> Result<std::result::Result<Vec<Chosen>, String>> {
        let fit = self.fits(locked, member);
        let named: Vec<(String, &PoolDevice)> =
            fit.iter().map(|f| (f.controller.clone(), &f.dev)).collect();
        let shared = controllers::shared(&named);
        let mounts = host.mount_table()?;
        let mut chosen: Vec<(Fit, Option<label::Blank>)> = Vec::new();
        for f in fit {
            if chosen.len() == n as usize {
                break;
            }
            if chosen.iter().any(|(c, _)| c.controller == f.controller) {
                continue;
            }
            if f.labelled {
                chosen.push((f, None));
                continue;
            }
            if !self.pool.uses(&f.dev, &mounts).is_empty() {
                continue;
            }
            // A probe that fails is a refusal of that device.
            let Ok(sigs) = host.probe_signatures(&f.dev.path).await else {
                continue;
            };
            if let Some(proof) = label::Blank::from_signature_probe(&f.dev.path, &sigs) {
                chosen.push((f, Some(proof)));
            }
        }
        if chosen.len() < n as usize {
            return Ok(Err(self.shortfall(n, member, chosen.len(), &shared)));
        }
        let mut out = Vec::new();
        for (f, proof) in chosen {
            if let Some(proof) = proof {
                self.label_blank(&f.dev, proof).await?;
            }
            out.push(Chosen {
                dev: f.dev,
                controller: f.controller,
                gpu_pcie: f.gpu_pcie.map(pcie::Nearness::name),
                _guard: f.guard,
            });
        }
        Ok(Ok(out))
    }

    fn shortfall(&self, n: u32, member: u64, found: usize, shared: &[String]) -> String {
        let mut msg = format!(
            "stripeCount {n} needs {n} distinct pool devices behind distinct NVMe \
             controllers with a free extent of {member} bytes each; node {} has {found} \
             such device(s); ask for less capacity or a smaller stripeCount, delete \
             volumes or add drives",
            self.pool.node_id()
        );
        if !shared.is_empty() {
            msg.push_str(&format!(
                "; namespaces of one controller count once (they share its bandwidth): {}",
                shared.join("; ")
            ));
        }
        msg
    }

    /// A new label on a device proven blank, taken from the whole-device layout first
    /// (`Pool::reserve_for_carving`, so the two layouts never both take it).
    async fn label_blank(&self, dev: &PoolDevice, proof: label::Blank) -> Result<()> {
        let why = "a gds-csi partition table (layout: stripe)".to_owned();
        let before = self.pool.reserve_for_carving(&dev.id, why)?;
        let path = dev.path.clone();
        let write = move || label::create(&path, proof.clone());
        match self.settled(&dev.path, "writing a new label", write).await {
            Ok(_) => {}
            // Still pending in the kernel: it may yet land (the mark stays).
            Err(Error::Layout(e)) if e.is_pending() => return Err(e.into()),
            Err(e) => {
                self.pool.set_foreign(&dev.id, before);
                return Err(e);
            }
        }
        self.parts.keep_from_whole_device_use(dev);
        info!(device = %dev.path.display(), "new gds-csi partition table (stripe member)");
        Ok(())
    }

    /// The stripe volume of this name already recorded, when its request agrees.
    fn existing(&self, req: &AllocationRequest) -> Result<Option<BlockVolumeId>> {
        let state = self.pool.state.snapshot();
        let Some((id, rec)) = state.by_name(&req.name) else {
            return Ok(None);
        };
        let stripe = id.layout == IdLayout::Stripe;
        if stripe && req.fits(rec.capacity_bytes) && req.made(rec) {
            return Ok(Some(id.clone()));
        }
        Err(AllocationError::NameTakenOtherLayout {
            name: req.name.clone(),
        }
        .into())
    }

    /// Records the volume with its members' devices before anything is carved.
    fn claim(
        &self,
        req: &AllocationRequest,
        devices: &[Chosen],
        geo: StripeParams,
        member: u64,
    ) -> Result<BlockVolumeId> {
        self.pool.state.update(|state| {
            if let Some((id, _)) = state.by_name(&req.name) {
                return Ok(id.clone());
            }
            let uuid = uuid::Uuid::new_v4();
            let first = &devices[0].dev;
            let id = BlockVolumeId {
                device_id: first.id.clone(),
                allocation: uuid.simple().to_string()[..8].to_owned(),
                node_id: self.pool.node_id().to_owned(),
                layout: IdLayout::Stripe,
            };
            let members = devices
                .iter()
                .map(|c| StripeMember {
                    device_id: c.dev.id.clone(),
                    device_key: c.dev.key.clone(),
                    partition: None,
                    controller: Some(c.controller.clone()),
                    gpu_pcie: c.gpu_pcie.map(str::to_owned),
                })
                .collect();
            let record = VolumeRecord {
                name: req.name.clone(),
                device_id: first.id.clone(),
                device_key: first.key.clone(),
                capacity_bytes: (member - DATA_OFFSET) * u64::from(geo.count),
                fs_type: req.fs_type,
                parameters: req.parameters.clone(),
                fs_uuid: uuid.hyphenated().to_string(),
                formatted: false,
                deleting: false,
                device_identity: None,
                partition: None,
                stripe: Some(StripeRecord {
                    chunk_bytes: geo.chunk_bytes,
                    member_bytes: member,
                    members,
                    array_uuid: None,
                }),
                source: req.source.clone(),
            };
            state.insert(&id, record);
            Ok(id)
        })
    }

    /// Carves (or finds) every member not yet recorded as carved; the caller holds the
    /// members' device locks.
    async fn carve(&self, id: &BlockVolumeId) -> Result<(BlockVolumeId, VolumeRecord)> {
        let raw = &id.to_string();
        let rec = self.record(raw)?;
        let stripe = stripe_of(raw, &rec)?;
        for (i, m) in stripe.members.iter().enumerate() {
            if m.partition.is_some() {
                continue;
            }
            let dev = self.member_device(m)?;
            let name = member_name(&id.allocation, i);
            let (path, len) = (dev.path.clone(), stripe.member_bytes);
            let held = self.parts.held(&dev.id);
            let step = move || volume::carve(&path, &name, len, &held);
            let carved = self
                .settled(&dev.path, "carving a stripe member", step)
                .await?;
            self.parts
                .zero_new(&format!("{raw}/member-{i}"), &dev.path, carved.partuuid)
                .await?;
            let part = PartitionRecord {
                partuuid: carved.partuuid.to_string(),
                number: carved.number,
                span: Some((carved.span.start, carved.span.len)),
                erased: false,
                moving: None,
            };
            self.pool.state.update(|s| {
                let r = s.get_mut(raw).and_then(|r| r.stripe.as_mut());
                let r = r.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))?;
                r.members[i].partition = Some(part);
                Ok(())
            })?;
            info!(volume_id = raw, member = i, node = %carved.node.display(), "stripe member carved");
        }
        Ok((id.clone(), self.record(raw)?))
    }
}
