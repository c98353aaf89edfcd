//! NodeStage/NodeUnstage of a stripe volume: its md array running before the usual
//! stage (mkfs once, mount), stopped after the unstage. The array is created only when
//! every member is blank (the full signature probe and mdadm's own examine) and mkfs
//! never completed; otherwise it is assembled by the UUID in the record. An array or
//! superblock with another UUID is never assembled, stopped or written.

use std::path::PathBuf;

use tracing::info;

use super::{stripe_of, Striped, DATA_OFFSET};
use crate::csi::id::BlockVolumeId;
use crate::disk::md::{self, CreateSpec, Examined, HOMEHOST};
use crate::error::{Error, LayoutError, Result};
use crate::os::{Host, MountEntry, Signature, StripeGeometry};
use crate::pool::{PoolDevice, VolumeRecord};

/// The md name of a volume's array (`gds-csi:gdscsi-<allocation>` in the superblock).
pub fn md_name(id: &BlockVolumeId) -> String {
    format!("gdscsi-{}", id.allocation)
}

/// A member as NodeStage needs it: its partition node and what mdadm finds on it.
struct Member {
    index: usize,
    node: PathBuf,
    drive: PathBuf,
    examined: Option<Examined>,
}

impl Member {
    /// Refusal to create the array over this member: what the probe found on it.
    fn not_blank(&self, volume: &str, sigs: &[Signature]) -> Error {
        LayoutError::MemberNotBlank {
            index: self.index,
            node: self.node.clone(),
            drive: self.drive.clone(),
            volume: volume.to_owned(),
            found: crate::pool::describe_signatures(sigs),
        }
        .into()
    }
}

impl Striped {
    /// The volume's array running (created, adopted or assembled); its node.
    pub async fn ensure_array(&self, host: &dyn Host, id: &BlockVolumeId) -> Result<PathBuf> {
        let raw = id.to_string();
        // The members' labels stay as they are while the array is assembled over them.
        let _members = self.lock_members(&raw).await?;
        let rec = self.record(&raw)?;
        let stripe = stripe_of(&raw, &rec)?;
        if let Some(running) = stripe
            .array_uuid
            .as_deref()
            .and_then(|u| md::sysfs::find(self.pool.host_sys(), u))
        {
            return Ok(running.node);
        }
        let mounts = host.mount_table()?;
        let name = md_name(id);
        if stripe.array_uuid.is_none() {
            if let Some(node) = self.adopt_running(host, id, &rec, &mounts, &name).await? {
                return Ok(node);
            }
        }
        let members = self.examined_members(host, id, &rec, &mounts, true).await?;
        let nodes: Vec<PathBuf> = members.iter().map(|m| m.node.clone()).collect();
        let uuid = match &stripe.array_uuid {
            Some(uuid) => {
                every_member_ours(&raw, &members, uuid)?;
                uuid.clone()
            }
            None => match adoptable(&members, &name) {
                Some(uuid) => self.record_uuid(&raw, &uuid)?,
                None => {
                    let members = self
                        .clear_cut_short_create(host, id, &rec, &mounts, members)
                        .await?;
                    return self.create_recorded(host, id, &rec, &members).await;
                }
            },
        };
        md::assemble(host, &name, &uuid, &nodes).await?;
        info!(volume_id = %raw, %uuid, "stripe array assembled");
        self.running_after(&raw, &uuid)
    }

    /// Creates the array and records the UUID mdadm wrote; the running array's node.
    async fn create_recorded(
        &self,
        host: &dyn Host,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        members: &[Member],
    ) -> Result<PathBuf> {
        let raw = &id.to_string();
        let first = &members[0].node;
        self.create(host, id, rec, members).await?;
        let examined = md::examine(host, first).await?;
        let uuid =
            examined
                .map(|e| e.uuid)
                .ok_or_else(|| LayoutError::NoSuperblockAfterCreate {
                    volume: raw.to_owned(),
                    member: first.clone(),
                })?;
        self.running_after(raw, &self.record_uuid(raw, &uuid)?)
    }

    /// A driver killed while `mdadm --create` wrote its superblocks (seen on the VM rig,
    /// SIGKILL of the driver and its children during the first NodeStage) leaves some
    /// members with our array's superblock and the others blank, and no UUID recorded.
    /// Those superblocks are cleared, so the create runs again, only when the volume was
    /// never formatted (no data can be on it) and every signature on every member is that
    /// one superblock (`cut_short`, `owned_superblocks`); a member carrying anything else
    /// is refused by name, nothing cleared.
    async fn clear_cut_short_create(
        &self,
        host: &dyn Host,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        mounts: &[MountEntry],
        members: Vec<Member>,
    ) -> Result<Vec<Member>> {
        let Some(uuid) = cut_short(&members, &md_name(id)).filter(|_| !rec.formatted) else {
            return Ok(members);
        };
        for m in &members {
            let sigs = host.probe_signatures(&m.node).await?;
            if !super::delete::member_erasable(&sigs, Some(&uuid)) {
                return Err(m.not_blank(&id.to_string(), &sigs));
            }
        }
        for m in members.iter().filter(|m| m.examined.is_some()) {
            md::zero_superblock(host, &m.node).await?;
        }
        info!(volume_id = %id, %uuid, "superblocks of a create cut short cleared");
        self.examined_members(host, id, rec, mounts, true).await
    }

    /// The UUID of this volume's own superblocks when none is recorded yet: from a create
    /// that finished or was cut short (`owned_superblocks`). DeleteVolume erases members
    /// carrying it.
    pub(super) async fn unrecorded_uuid(
        &self,
        host: &dyn Host,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        mounts: &[MountEntry],
    ) -> Result<Option<String>> {
        if rec.formatted {
            return Ok(None);
        }
        let members = self.examined_members(host, id, rec, mounts, false).await?;
        Ok(owned_superblocks(&members, &md_name(id)))
    }

    /// A driver killed after `mdadm --create` started the array but before its UUID was
    /// recorded leaves our array running over our members (seen on the VM rig, SIGKILL
    /// during the first NodeStage). It is adopted only when it holds exactly the recorded
    /// members and every member's superblock says it is ours (`adoptable`); anything
    /// else holding a member is refused as in use by `examined_members`.
    async fn adopt_running(
        &self,
        host: &dyn Host,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        mounts: &[MountEntry],
        name: &str,
    ) -> Result<Option<PathBuf>> {
        let raw = &id.to_string();
        let Ok(members) = self.examined_members(host, id, rec, mounts, false).await else {
            return Ok(None);
        };
        let kernel_name = |m: &Member| m.node.file_name().map(|n| n.to_string_lossy().into_owned());
        let mut ours: Vec<String> = members.iter().filter_map(kernel_name).collect();
        ours.sort();
        let Some(first) = ours.first() else {
            return Ok(None);
        };
        let Some(running) = md::sysfs::holding(self.pool.host_sys(), first) else {
            return Ok(None);
        };
        match adoptable(&members, name) {
            Some(uuid) if running.members == ours && md::same_uuid(&running.uuid, &uuid) => {
                info!(volume_id = %raw, %uuid, array = %running.name, "running stripe array adopted");
                self.record_uuid(raw, &uuid)?;
                Ok(Some(running.node))
            }
            _ => Ok(None),
        }
    }

    fn running_after(&self, raw: &str, uuid: &str) -> Result<PathBuf> {
        md::sysfs::find(self.pool.host_sys(), uuid)
            .map(|r| r.node)
            .ok_or_else(|| {
                LayoutError::ArrayNotRunning {
                    uuid: uuid.to_owned(),
                    volume: raw.to_owned(),
                }
                .into()
            })
    }

    /// Creates the array over members that are all provably blank, mkfs never done.
    async fn create(
        &self,
        host: &dyn Host,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        members: &[Member],
    ) -> Result<()> {
        let raw = &id.to_string();
        if rec.formatted {
            return Err(LayoutError::FormattedWithoutArray {
                volume: raw.to_owned(),
            }
            .into());
        }
        for m in members {
            let sigs = host.probe_signatures(&m.node).await?;
            if m.examined.is_some() || !sigs.is_empty() {
                return Err(m.not_blank(raw, &sigs));
            }
        }
        let stripe = stripe_of(raw, rec)?;
        let spec = CreateSpec {
            name: md_name(id),
            chunk_bytes: stripe.chunk_bytes,
            data_offset_bytes: DATA_OFFSET,
            members: members.iter().map(|m| m.node.clone()).collect(),
        };
        md::create(host, &spec).await?;
        info!(volume_id = raw, "stripe array created");
        Ok(())
    }

    fn record_uuid(&self, raw: &str, uuid: &str) -> Result<String> {
        self.pool.state.update(|s| {
            let r = s.get_mut(raw).and_then(|r| r.stripe.as_mut());
            let r = r.ok_or_else(|| Error::VolumeNotFound(raw.to_owned()))?;
            r.array_uuid = Some(uuid.to_owned());
            Ok(uuid.to_owned())
        })
    }

    /// Every member present and free, with its md superblock; a missing one is
    /// FailedPrecondition naming it and its drive.
    async fn examined_members(
        &self,
        host: &dyn Host,
        id: &BlockVolumeId,
        rec: &VolumeRecord,
        mounts: &[MountEntry],
        must_be_free: bool,
    ) -> Result<Vec<Member>> {
        let raw = &id.to_string();
        let stripe = stripe_of(raw, rec)?;
        let found = self.present_members(id, rec, mounts)?;
        let mut out = Vec::new();
        for (index, m) in stripe.members.iter().enumerate() {
            let partuuid = m.partition.as_ref().map(|p| p.partuuid.as_str());
            let hit = found
                .iter()
                .find(|(_, c)| Some(c.partuuid.to_string()).as_deref() == partuuid);
            let Some((parent, carved)) = hit else {
                return Err(LayoutError::MemberMissing {
                    index,
                    volume: raw.to_owned(),
                    partition: partuuid.unwrap_or("never carved").to_owned(),
                    device_id: m.device_id.clone(),
                    device_key: m.device_key.clone(),
                }
                .into());
            };
            if must_be_free {
                self.member_free(raw, parent, carved, mounts)?;
            }
            out.push(Member {
                index,
                node: carved.node.clone(),
                drive: parent.path.clone(),
                examined: md::examine(host, &carved.node).await?,
            });
        }
        Ok(out)
    }

    fn member_free(
        &self,
        raw: &str,
        parent: &PoolDevice,
        carved: &crate::disk::gpt::Carved,
        mounts: &[MountEntry],
    ) -> Result<()> {
        let dev = super::member_as_device(parent, carved)?;
        match self.pool.uses(&dev, mounts).first() {
            None => Ok(()),
            Some(u) => Err(LayoutError::MemberInUse {
                member: carved.node.clone(),
                volume: raw.to_owned(),
                uses: u.to_string(),
                fix: "it is left as it is",
            }
            .into()),
        }
    }

    /// NodeUnstage's last step: the array stopped (when running, found by our UUID).
    pub async fn stop_array(&self, host: &dyn Host, id: &BlockVolumeId) -> Result<()> {
        let raw = id.to_string();
        let Ok(rec) = self.record(&raw) else {
            return Ok(());
        };
        let mounts = host.mount_table()?;
        self.stop_ours(host, &raw, stripe_of(&raw, &rec)?, &mounts)
            .await
    }
}

/// The geometry mkfs aligns a stripe volume's filesystem to (None for other layouts).
pub fn mkfs_geometry(rec: &VolumeRecord) -> Result<Option<StripeGeometry>> {
    let Some(stripe) = &rec.stripe else {
        return Ok(None);
    };
    let members = u32::try_from(stripe.members.len()).unwrap_or(u32::MAX);
    StripeGeometry::new(stripe.chunk_bytes, members).map(Some)
}

/// Assembling by the recorded UUID: every member must carry it.
fn every_member_ours(raw: &str, members: &[Member], uuid: &str) -> Result<()> {
    for m in members {
        let ours = m
            .examined
            .as_ref()
            .is_some_and(|e| md::same_uuid(&e.uuid, uuid));
        if !ours {
            return Err(LayoutError::MemberNotOfArray {
                index: m.index,
                node: m.node.clone(),
                drive: m.drive.clone(),
                volume: raw.to_owned(),
                uuid: uuid.to_owned(),
            }
            .into());
        }
    }
    Ok(())
}

/// The members' superblocks, when every one found is our create's for this volume: one
/// array UUID, named ours, with our homehost, as many members as recorded, level 0. At
/// least one member carries it; the others carry no superblock.
fn owned_superblocks(members: &[Member], name: &str) -> Option<String> {
    let first = members.iter().find_map(|m| m.examined.as_ref())?;
    let ours = members.iter().all(|m| {
        m.examined.as_ref().is_none_or(|e| {
            md::same_uuid(&e.uuid, &first.uuid)
                && e.name_for(HOMEHOST) == Some(name)
                && e.level == "raid0"
                && e.devices as usize == members.len()
        })
    });
    ours.then(|| first.uuid.clone())
}

/// A create that finished before its UUID was recorded: every member carries our superblock.
fn adoptable(members: &[Member], name: &str) -> Option<String> {
    let every = members.iter().all(|m| m.examined.is_some());
    owned_superblocks(members, name).filter(|_| every)
}

/// A create cut short: some members carry our superblock, the others none.
fn cut_short(members: &[Member], name: &str) -> Option<String> {
    let some_blank = members.iter().any(|m| m.examined.is_none());
    owned_superblocks(members, name).filter(|_| some_blank)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(i: usize, uuid: Option<&str>, name: &str) -> Member {
        Member {
            index: i,
            node: format!("/dev/nvme{i}n1p1").into(),
            drive: format!("/dev/nvme{i}n1").into(),
            examined: uuid.map(|u| Examined {
                level: "raid0".into(),
                devices: 2,
                name: format!("gds-csi:{name}"),
                uuid: u.into(),
                dev_uuid: format!("{i}"),
            }),
        }
    }

    #[test]
    fn only_our_names_superblocks_are_adopted_or_cleared() {
        let u = "002cd3f1:01eb3f8d:ef68842e:73da9813";
        let both = [
            member(0, Some(u), "gdscsi-a"),
            member(1, Some(u), "gdscsi-a"),
        ];
        assert_eq!(adoptable(&both, "gdscsi-a"), Some(u.to_owned()));
        assert_eq!(adoptable(&both, "gdscsi-b"), None);
        let half = [member(0, Some(u), "gdscsi-a"), member(1, None, "gdscsi-a")];
        assert_eq!(adoptable(&half, "gdscsi-a"), None);
        let other = "11111111:01eb3f8d:ef68842e:73da9813";
        let mixed = [
            member(0, Some(u), "gdscsi-a"),
            member(1, Some(other), "gdscsi-a"),
        ];
        assert_eq!(adoptable(&mixed, "gdscsi-a"), None);
        assert_eq!(cut_short(&both, "gdscsi-a"), None);
        assert_eq!(cut_short(&half, "gdscsi-a"), Some(u.to_owned()));
        assert_eq!(cut_short(&half, "gdscsi-b"), None);
        assert_eq!(cut_short(&mixed, "gdscsi-a"), None);
        let none = [member(0, None, "gdscsi-a"), member(1, None, "gdscsi-a")];
        assert_eq!(owned_superblocks(&none, "gdscsi-a"), None);
        let mut three_members = member(0, Some(u), "gdscsi-a");
        three_members.examined.as_mut().unwrap().devices = 3;
        let wrong_count = [three_members, member(1, None, "gdscsi-a")];
        assert_eq!(cut_short(&wrong_count, "gdscsi-a"), None);
        let mut raid1 = member(0, Some(u), "gdscsi-a");
        raid1.examined.as_mut().unwrap().level = "raid1".into();
        assert_eq!(
            cut_short(&[raid1, member(1, None, "gdscsi-a")], "gdscsi-a"),
            None
        );
        assert!(every_member_ours("v", &both, u).is_ok());
        let err = every_member_ours("v", &half, u).unwrap_err().to_string();
        assert!(
            err.contains("/dev/nvme1n1p1") && err.contains("/dev/nvme1n1"),
            "{err}"
        );
    }
}
