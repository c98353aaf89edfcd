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
use crate::os::{Host, MountEntry, StripeGeometry};
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
                    self.create(host, &raw, &rec, &members, &name).await?;
                    let first = md::examine(host, &nodes[0]).await?;
                    let uuid = first.map(|e| e.uuid).ok_or_else(|| {
                        LayoutError::NoSuperblockAfterCreate {
                            volume: raw.clone(),
                            member: nodes[0].clone(),
                        }
                    })?;
                    return self.running_after(&raw, &self.record_uuid(&raw, &uuid)?);
                }
            },
        };
        md::assemble(host, &name, &uuid, &nodes).await?;
        info!(volume_id = %raw, %uuid, "stripe array assembled");
        self.running_after(&raw, &uuid)
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
        raw: &str,
        rec: &VolumeRecord,
        members: &[Member],
        name: &str,
    ) -> Result<()> {
        if rec.formatted {
            return Err(LayoutError::FormattedWithoutArray {
                volume: raw.to_owned(),
            }
            .into());
        }
        for m in members {
            let sigs = host.probe_signatures(&m.node).await?;
            if m.examined.is_some() || !sigs.is_empty() {
                return Err(LayoutError::MemberNotBlank {
                    index: m.index,
                    node: m.node.clone(),
                    drive: m.drive.clone(),
                    volume: raw.to_owned(),
                    found: crate::pool::describe_signatures(&sigs),
                }
                .into());
            }
        }
        let stripe = stripe_of(raw, rec)?;
        let spec = CreateSpec {
            name: name.to_owned(),
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

/// A create that finished before its UUID was recorded: every member carries one
/// array, named ours, with our homehost, as many members as recorded, level 0.
fn adoptable(members: &[Member], name: &str) -> Option<String> {
    let first = members.first()?.examined.as_ref()?;
    let same = members.iter().all(|m| {
        m.examined.as_ref().is_some_and(|e| {
            md::same_uuid(&e.uuid, &first.uuid)
                && e.name_for(HOMEHOST) == Some(name)
                && e.level == "raid0"
                && e.devices as usize == members.len()
        })
    });
    same.then(|| first.uuid.clone())
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
    fn only_a_complete_array_of_our_name_is_adopted() {
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
        assert!(every_member_ours("v", &both, u).is_ok());
        let err = every_member_ours("v", &half, u).unwrap_err().to_string();
        assert!(
            err.contains("/dev/nvme1n1p1") && err.contains("/dev/nvme1n1"),
            "{err}"
        );
    }
}
