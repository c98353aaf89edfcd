//! Pool devices carved into GPT partitions (the `partition` and `stripe` block layouts).
//!
//! A partition is the allocation unit: 1 MiB aligned, typed with [`TYPE_GUID`], named
//! with the allocation id, found again by its PARTUUID. Only a label this driver wrote
//! (its disk GUID carries [`gpt::is_ours`]'s mark and every entry has our type) is ever
//! changed; a new label goes only on a device the caller proved blank ([`Blank`]).
//!
//! - [`format`]: the on-disk label (protective MBR, both headers and entry arrays, CRC32s).
//! - [`label`]: reading a device's label and telling ours from foreign; writing it.
//! - [`alloc`]: free extents, the size a CSI CapacityRange asks for, best fit, growth.
//! - [`kernel`]: the kernel's partition table (BLKPG, sysfs), re-sync, nodes, discard.
//! - [`volume`]: the layout's idempotent steps: choose, carve, grow, locate, remove.
//! - [`wholedisk`]: the whole-disk lock udevd honours, and the retries around each step.
//!
//! This module depends only on std, libc, uuid and crc32fast: the layout composes it
//! with the host port (signature probe, wipe, zero-out) and the state store.
//!
//! Ordering that keeps a crash harmless (the layout's job; each step is idempotent):
//! create = label write, then kernel add; grow = label write, then kernel resize;
//! delete = kernel delete, then label write. So the kernel never shows a partition our
//! label lacks, and a start-up [`kernel::resync`] brings back anything it misses.

//!
//! Kernel facts this relies on (6.18 on the dev machine, no CONFIG_EFI_PARTITION; Debian's
//! kernel in the VM rig has it):
//! - BLKPG works on every loop device; partscan (`losetup -P`) is not needed. Loop
//!   partitions get minors of the extended major 259 (loop's max_part is 0 and, built
//!   in, cannot change without a reboot).
//! - Without a GPT parser a re-read (BLKRRPART) drops every partition: on a partscan
//!   loop device at once, on a plain one it fails (EINVAL) and they stay. A plain loop
//!   device keeps its partitions after `losetup -d`; delete them first.
//! - systemd-udevd watches disks and, after a writer closes one, re-reads its table:
//!   `flock(LOCK_EX|LOCK_NB)` then BLKRRPART (systemd src/udev/udevd.c
//!   synthesize_change), which the kernel refuses while a partition is open
//!   (block/partitions/core.c bdev_disk_changed, `open_partitions`). With a GPT parser
//!   that rebuilds our partitions; without one it drops the unused ones, so the layout
//!   locates (and so re-adds) a partition before each use. Every label write and
//!   BLKPG call holds the disk's BSD lock ([`wholedisk`]), so udevd neither probes nor
//!   re-reads meanwhile, and what it does after is waited out.

pub mod alloc;
pub mod format;
pub mod kernel;
pub mod label;
pub mod volume;
pub mod wholedisk;

pub use alloc::{Extent, Held, SizeRange, ALIGN};
pub use format::{Entry, Label, TYPE_GUID};
pub use kernel::{Erased, KernelPartition, Located, Resync};
pub use label::{Blank, OnDisk};
pub use volume::{Carved, Recorded};

pub use crate::error::LabelError as Error;

pub type Result<T> = std::result::Result<T, Error>;
