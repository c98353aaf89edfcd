//! The md port: the mdadm calls the stripe layout makes, built and parsed
//! here, run through the host port (`Host::mdadm`, one deadline per call), and the
//! kernel's view of running arrays from sysfs.
//!
//! Facts from the VM rig (Debian kernel 6.1.0-57, mdadm 4.2-5, QEMU NVMe, 2026-11-30):
//! - `mdadm --create /dev/md/<name>` starts the array as `/dev/md127`; the
//!   `/dev/md/<name>` link is made by mdadm's udev rules, and without udev mdadm waits,
//!   says "timeout waiting for /dev/md/<name>", and exits 0. So an array is found by its
//!   UUID in sysfs ([`sysfs::find`]) and used as `/dev/mdN`, never by the link.
//! - With `--data-offset=1M`, two 64 MiB members give exactly 2 x 63 MiB
//!   (`/sys/block/md127/size` 258048 sectors): the array's size is known in advance.
//! - `--examine --export` of a blank device exits 1 with "No md superblock detected";
//!   `--zero-superblock` of a member of a running array exits 1 ("Couldn't open ... for
//!   write - not zeroing") and changes nothing.
//! - blkid shows a member as `TYPE=linux_raid_member`, `UUID=` the array UUID with
//!   dashes; mdadm prints it with colons; sysfs `md/uuid` with dashes.
//!
//! Homehost: mdadm records `<homehost>:<name>` in a 1.x superblock and treats an array
//! whose homehost is not this host's name as foreign (mdadm.conf(5), HOMEHOST and AUTO:
//! with `AUTO homehost -all` only local arrays are auto-assembled). [`HOMEHOST`] is
//! "gds-csi", a name no host has, so every host's `AUTO homehost` policy keeps away
//! from these arrays and none is ever "local" to some other node. A host without an
//! AUTO line may still auto-assemble it (as a foreign `/dev/md127`); the layout then
//! finds it running by UUID and uses it, so that is harmless.

pub mod parse;
pub mod sysfs;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::error::{Error, LayoutError, Result};
use crate::os::Host;

pub use parse::{parse_export, Examined};

/// The homehost recorded in every array this driver creates (see the module doc).
pub const HOMEHOST: &str = "gds-csi";

/// An array to create: level 0, metadata 1.2, members in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSpec {
    /// The md name (at most 32 bytes in a 1.x superblock with the homehost prefix).
    pub name: String,
    pub chunk_bytes: u64,
    pub data_offset_bytes: u64,
    pub members: Vec<PathBuf>,
}

fn os(s: &str) -> OsString {
    OsString::from(s)
}

/// `mdadm --create` of a RAID0 array; `--run` so it never asks, no `--force`.
pub fn create_args(spec: &CreateSpec) -> Vec<OsString> {
    let mut a = vec![
        os("--create"),
        os(&format!("/dev/md/{}", spec.name)),
        os("--level=0"),
        os(&format!("--raid-devices={}", spec.members.len())),
        os(&format!("--chunk={}K", spec.chunk_bytes / 1024)),
        os("--metadata=1.2"),
        os(&format!("--homehost={HOMEHOST}")),
        os(&format!("--name={}", spec.name)),
        os(&format!("--data-offset={}K", spec.data_offset_bytes / 1024)),
        os("--run"),
    ];
    a.extend(spec.members.iter().map(|m| m.as_os_str().to_owned()));
    a
}

/// `mdadm --assemble` of exactly these members, and only if their UUID is `uuid`.
pub fn assemble_args(name: &str, uuid: &str, members: &[PathBuf]) -> Vec<OsString> {
    let mut a = vec![
        os("--assemble"),
        os(&format!("/dev/md/{name}")),
        os(&format!("--uuid={uuid}")),
        os(&format!("--homehost={HOMEHOST}")),
        os("--run"),
    ];
    a.extend(members.iter().map(|m| m.as_os_str().to_owned()));
    a
}

async fn mdadm(host: &dyn Host, args: &[OsString]) -> Result<std::process::Output> {
    let refs: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    match host.mdadm(&refs).await {
        Err(Error::Command(crate::error::CommandError::Spawn { source, .. }))
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Err(LayoutError::MdadmMissing.into())
        }
        other => other,
    }
}

fn failed(what: &str, out: &std::process::Output) -> Error {
    LayoutError::MdadmFailed {
        what: what.to_owned(),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    }
    .into()
}

/// The md superblock on `device`: None when mdadm finds none; any other failure is an
/// error (a probe that fails is never "blank").
pub async fn examine(host: &dyn Host, device: &Path) -> Result<Option<Examined>> {
    let args = [
        os("--examine"),
        os("--export"),
        device.as_os_str().to_owned(),
    ];
    let out = mdadm(host, &args).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(1) && stderr.contains("No md superblock detected") {
        return Ok(None);
    }
    if !out.status.success() {
        return Err(failed("--examine", &out));
    }
    Examined::from_export(&String::from_utf8_lossy(&out.stdout)).map(Some)
}

pub async fn create(host: &dyn Host, spec: &CreateSpec) -> Result<()> {
    let out = mdadm(host, &create_args(spec)).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed("--create", &out))
    }
}

pub async fn assemble(host: &dyn Host, name: &str, uuid: &str, members: &[PathBuf]) -> Result<()> {
    let out = mdadm(host, &assemble_args(name, uuid, members)).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed("--assemble", &out))
    }
}

/// Stops the running array at `node` (`/dev/mdN`, found by UUID).
pub async fn stop(host: &dyn Host, node: &Path) -> Result<()> {
    let out = mdadm(host, &[os("--stop"), node.as_os_str().to_owned()]).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed("--stop", &out))
    }
}

/// Erases the md superblock of `member`; the caller proved it is of our array.
pub async fn zero_superblock(host: &dyn Host, member: &Path) -> Result<()> {
    let args = [os("--zero-superblock"), member.as_os_str().to_owned()];
    let out = mdadm(host, &args).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed("--zero-superblock", &out))
    }
}

/// md UUIDs compare without their separators (blkid prints dashes, mdadm colons).
pub fn same_uuid(a: &str, b: &str) -> bool {
    let hex = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_hexdigit)
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let (a, b) = (hex(a), hex(b));
    a.len() == 32 && a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_and_assemble_pin_level_metadata_homehost_offset_and_members() {
        let spec = CreateSpec {
            name: "gdscsi-a1b2c3d4".into(),
            chunk_bytes: 512 * 1024,
            data_offset_bytes: 1 << 20,
            members: vec!["/dev/nvme0n1p1".into(), "/dev/nvme1n1p1".into()],
        };
        let text = |a: Vec<OsString>| {
            a.iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            text(create_args(&spec)),
            "--create /dev/md/gdscsi-a1b2c3d4 --level=0 --raid-devices=2 --chunk=512K \
             --metadata=1.2 --homehost=gds-csi --name=gdscsi-a1b2c3d4 --data-offset=1024K \
             --run /dev/nvme0n1p1 /dev/nvme1n1p1"
        );
        let uuid = "002cd3f1:01eb3f8d:ef68842e:73da9813";
        assert_eq!(
            text(assemble_args("gdscsi-a1b2c3d4", uuid, &spec.members)),
            format!(
                "--assemble /dev/md/gdscsi-a1b2c3d4 --uuid={uuid} --homehost=gds-csi --run \
                 /dev/nvme0n1p1 /dev/nvme1n1p1"
            )
        );
    }
}
