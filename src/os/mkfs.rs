//! What `Host::mkfs` runs: the program and its arguments, with the stripe geometry of an
//! md RAID0 volume when there is one.
//!
//! The geometry is always passed, never left to mkfs to find: both would take md's
//! `io_min`/`io_opt` from blkid's topology (e2fsprogs misc/mke2fs.c, PRS(): `s_raid_stride
//! = dev_param.min_io / blocksize`, `s_raid_stripe_width = dev_param.opt_io / blocksize`),
//! but e2fsprogs commit b61f182b (May 2025, "don't set the raid stripe for non-rotational
//! devices by default", mke2fs.conf `set_raid_stripe = disk`) stops taking the stripe width
//! on flash, which an NVMe array is, so what a volume gets would depend on the node's
//! e2fsprogs. Explicit `-E stride=,stripe_width=` (xfs `-d su=,sw=`) gives every node the
//! same geometry. (That commit's reason, the ext4 allocator's cost when it
//! aligns to a stripe on flash, is still to be measured on a real node.)

use std::ffi::OsString;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Filesystems GDS can use on a block device (gds-facts.md section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    pub const SUPPORTED: &'static str = "ext4, xfs";

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "ext4" => Some(FsType::Ext4),
            "xfs" => Some(FsType::Xfs),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }

    /// Options the driver always mounts with. GDS needs ext4's `data=ordered` to be
    /// explicit: the implicit default is not accepted by NVIDIA's own checks.
    pub fn required_mount_options(self) -> &'static [&'static str] {
        match self {
            FsType::Ext4 => &["data=ordered"],
            FsType::Xfs => &[],
        }
    }
}

/// The filesystem block the stripe geometry is counted in (ext4's `-b`, xfs's default).
pub const FS_BLOCK: u64 = 4096;
/// ext4 keeps the stride in 16 bits of blocks (`s_raid_stride`, `__u16` in e2fsprogs
/// lib/ext2fs/ext2_fs.h; mke2fs stores 65536 as 0 without a word): the largest
/// power-of-two chunk it can describe is 32768 blocks, 128 MiB.
pub const MAX_CHUNK: u64 = 32768 * FS_BLOCK;
const MAX_MEMBERS: u32 = 256;

/// How an md RAID0 array lays data out, for mkfs to align to: a power-of-two chunk of at
/// least one 4 KiB block and at most [`MAX_CHUNK`], over 2 to 256 members. Only
/// [`StripeGeometry::new`] makes one, so mkfs never gets a geometry it would refuse or
/// silently drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StripeGeometry {
    chunk_bytes: u64,
    members: u32,
}

impl StripeGeometry {
    pub fn new(chunk_bytes: u64, members: u32) -> Result<Self> {
        let chunk_ok =
            chunk_bytes.is_power_of_two() && (FS_BLOCK..=MAX_CHUNK).contains(&chunk_bytes);
        if !chunk_ok {
            return Err(Error::invalid(
                "parameters.stripeChunk",
                format!(
                    "{chunk_bytes} bytes cannot be a filesystem's stripe unit: it must be a \
                     power of two from 4 KiB to {} MiB",
                    MAX_CHUNK >> 20
                ),
            ));
        }
        if !(2..=MAX_MEMBERS).contains(&members) {
            return Err(Error::invalid(
                "parameters.stripeCount",
                format!("{members} members: a stripe has 2 to {MAX_MEMBERS}"),
            ));
        }
        Ok(StripeGeometry {
            chunk_bytes,
            members,
        })
    }

    pub fn chunk_bytes(self) -> u64 {
        self.chunk_bytes
    }

    pub fn members(self) -> u32 {
        self.members
    }

    /// ext4's stride (the chunk) and stripe width (a full stripe), in 4 KiB blocks.
    fn ext4_blocks(self) -> (u64, u64) {
        let stride = self.chunk_bytes / FS_BLOCK;
        (stride, stride * u64::from(self.members))
    }
}

/// The mkfs program and arguments for `device`. No force flags: mkfs.xfs then refuses
/// an existing filesystem; mkfs.ext4 does not when stdin is not a terminal (e2fsprogs
/// misc/mke2fs.c lines 2912-2921 check for an existing filesystem only under isatty), so
/// the guard is the caller's probe, taken again under `hold_device`.
pub(super) fn command(
    device: &Path,
    fs: FsType,
    uuid: &str,
    stripe: Option<StripeGeometry>,
) -> (&'static str, Vec<OsString>) {
    let mut args: Vec<OsString> = vec!["-q".into()];
    let program = match fs {
        FsType::Ext4 => {
            let mut extended = "nodiscard,lazy_itable_init=1,lazy_journal_init=1".to_owned();
            if let Some(g) = stripe {
                // The stride is counted in blocks: the block size is fixed, not left to
                // mke2fs.conf (which gives small filesystems 1 KiB blocks).
                let (stride, width) = g.ext4_blocks();
                extended.push_str(&format!(",stride={stride},stripe_width={width}"));
                args.extend(["-b".into(), FS_BLOCK.to_string().into()]);
            }
            args.extend(["-U".into(), uuid.into(), "-m".into(), "0".into()]);
            args.extend(["-E".into(), extended.into()]);
            "mkfs.ext4"
        }
        FsType::Xfs => {
            args.extend(["-K".into(), "-m".into(), format!("uuid={uuid}").into()]);
            if let Some(g) = stripe {
                let data = format!("su={}k,sw={}", g.chunk_bytes / 1024, g.members);
                args.extend(["-d".into(), data.into()]);
            }
            "mkfs.xfs"
        }
    };
    args.push(device.as_os_str().to_owned());
    (program, args)
}

/// The same command as [`command`] as a dry run on a scratch file (`mke2fs -n`: "do not
/// actually create a filesystem", mke2fs(8); `mkfs.xfs -N`: "print out the filesystem
/// parameters without really creating", mkfs.xfs(8)); both still check the size, so the
/// smallest size this accepts is the smallest the real mkfs formats, geometry included.
pub fn dry_run_command(
    file: &Path,
    fs: FsType,
    stripe: Option<StripeGeometry>,
) -> (&'static str, Vec<OsString>) {
    const ANY_UUID: &str = "00000000-0000-4000-8000-000000000000";
    let (program, mut args) = command(file, fs, ANY_UUID, stripe);
    let flag = match fs {
        FsType::Ext4 => "-n",
        FsType::Xfs => "-N",
    };
    args.insert(0, flag.into());
    (program, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(fs: FsType, stripe: Option<StripeGeometry>) -> String {
        let (program, args) = command(Path::new("/dev/md127"), fs, "u-1", stripe);
        let args: Vec<_> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        format!("{program} {}", args.join(" "))
    }

    #[test]
    fn only_a_chunk_and_count_mkfs_can_describe_make_a_geometry() {
        assert!(StripeGeometry::new(4096, 2).is_ok());
        assert!(StripeGeometry::new(MAX_CHUNK, 16).is_ok());
        for (chunk, members) in [
            (2048, 2),
            (3 * 4096, 2),
            (MAX_CHUNK * 2, 2),
            (0, 2),
            (4096, 1),
            (4096, 0),
            (4096, 257),
        ] {
            assert!(
                StripeGeometry::new(chunk, members).is_err(),
                "{chunk} x {members}"
            );
        }
    }

    #[test]
    fn the_stripe_geometry_reaches_mkfs_as_each_filesystem_spells_it() {
        let g = StripeGeometry::new(512 * 1024, 4).unwrap();
        assert_eq!(
            line(FsType::Ext4, Some(g)),
            "mkfs.ext4 -q -b 4096 -U u-1 -m 0 -E nodiscard,lazy_itable_init=1,\
             lazy_journal_init=1,stride=128,stripe_width=512 /dev/md127"
        );
        assert_eq!(
            line(FsType::Xfs, Some(g)),
            "mkfs.xfs -q -K -m uuid=u-1 -d su=512k,sw=4 /dev/md127"
        );
        // Without a stripe: what mkfs ran before geometry existed.
        assert_eq!(
            line(FsType::Ext4, None),
            "mkfs.ext4 -q -U u-1 -m 0 -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 \
             /dev/md127"
        );
        assert_eq!(
            line(FsType::Xfs, None),
            "mkfs.xfs -q -K -m uuid=u-1 /dev/md127"
        );
    }
}
