//! The copy checked against its source before the volume may be published: every entry
//! there with the same kind, every file with the same size and every symlink with the
//! same text; with `verify: checksum` every file's SHA-256 as well (both read again).

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};
use sha2::{Digest, Sha256};

use super::meta;
use super::walk::{kind_of, open_beneath, open_dir, Entry, Kind};
use crate::error::{CopyError, Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    #[default]
    Sizes,
    Checksum,
}

fn mismatch(shown: &Path, e: &Entry, what: String) -> Error {
    CopyError::Differs {
        copy: shown.join(&e.rel).display().to_string(),
        at: format!(": {what}"),
    }
    .into()
}

/// Every entry but the root, on `streams` threads (a checksum reads both sides again).
/// The size of a `whole` file was checked on its open copy as the data phase finished it
/// (`data::copy_whole_file`): only its checksum is left.
pub fn verify(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    entries: &[Entry],
    links: &meta::Links,
    how: Verify,
    streams: super::Streams<'_>,
) -> Result<()> {
    // The root (a directory, never `whole`) is first either way.
    let left: Vec<&Entry> = match how {
        Verify::Checksum => entries.iter().collect(),
        Verify::Sizes => links.not_whole(entries),
    };
    let below_root = left.get(1..).unwrap_or_default();
    streams.each(below_root, |e| verify_one(src, dst, shown, e, how))
}

pub(super) fn verify_one(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    e: &Entry,
    how: Verify,
) -> Result<()> {
    let err = |x: nix::Error| Error::io("verify", shown.join(&e.rel), x.into());
    let parent = e.rel.parent().unwrap_or(Path::new(""));
    let name = e.rel.file_name().unwrap_or_default();
    let dir = open_dir(dst, parent).map_err(err)?;
    let st = match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        // A socket is not copied (meta.rs).
        Err(nix::errno::Errno::ENOENT) if is_socket(e) => return Ok(()),
        Err(x) => return Err(err(x)),
    };
    if kind_of(&st) != e.kind {
        return Err(mismatch(
            shown,
            e,
            format!("{:?} instead of {:?}", kind_of(&st), e.kind),
        ));
    }
    match e.kind {
        Kind::File if st.st_size != e.st.st_size => {
            return Err(mismatch(
                shown,
                e,
                format!("{} bytes instead of {}", st.st_size, e.st.st_size),
            ));
        }
        Kind::File if how == Verify::Checksum => {
            let (a, b) = (
                digest(src, &e.rel).map_err(err)?,
                digest(dst, &e.rel).map_err(err)?,
            );
            if a != b {
                return Err(mismatch(shown, e, "a different SHA-256".into()));
            }
        }
        Kind::Symlink => {
            let sdir = open_dir(src, parent).map_err(err)?;
            if readlinkat(&sdir, name).map_err(err)? != readlinkat(&dir, name).map_err(err)? {
                return Err(mismatch(shown, e, "another symlink target".into()));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Every file's and directory's copied extended attributes (`meta::copied_xattr`) equal
/// the source's. Checked after times are set: reading attributes moves no time. The
/// `whole` files' were read back from their open copies as the data phase set them
/// (`meta::set_file_metadata`).
pub fn xattrs(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    entries: &[Entry],
    links: &meta::Links,
    streams: super::Streams<'_>,
) -> Result<()> {
    streams.each(&links.not_whole(entries), |e| {
        xattrs_one(src, dst, shown, e)
    })
}

fn xattrs_one(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, shown: &Path, e: &Entry) -> Result<()> {
    if !matches!(e.kind, Kind::File | Kind::Dir) {
        return Ok(());
    }
    let err = |x: nix::Error| Error::io("verify attributes of", shown.join(&e.rel), x.into());
    let ((sdir, name), (ddir, _)) = (
        meta::holder_of(src, &e.rel).map_err(err)?,
        meta::holder_of(dst, &e.rel).map_err(err)?,
    );
    let source = meta::at(sdir.as_fd(), name);
    same_xattrs(&source, meta::at(ddir.as_fd(), name).as_path(), shown, e)
}

/// The copied extended attributes of `copy` (of the entry `e`) equal those of `source`
/// (a name reached through its directory's descriptor, `meta::at`).
fn same_xattrs(
    source: &Path,
    copy: &(impl meta::Xattrs + ?Sized),
    shown: &Path,
    e: &Entry,
) -> Result<()> {
    let err = |x: nix::Error| Error::io("verify attributes of", shown.join(&e.rel), x.into());
    let want = meta::xattrs_of(source).map_err(err)?;
    copy_has_xattrs(&want, copy, shown, e)
}

/// The copied extended attributes of `copy` (of the entry `e`), read from it, are `want`.
pub(super) fn copy_has_xattrs(
    want: &meta::XattrMap,
    copy: &(impl meta::Xattrs + ?Sized),
    shown: &Path,
    e: &Entry,
) -> Result<()> {
    let err = |x: nix::Error| Error::io("verify attributes of", shown.join(&e.rel), x.into());
    let have = meta::xattrs_of(copy).map_err(err)?;
    if *want != have {
        let names = |m: &meta::XattrMap| {
            m.keys()
                .map(|k| k.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        return Err(mismatch(
            shown,
            e,
            format!(
                "extended attributes {:?} instead of {:?}",
                names(&have),
                names(want)
            ),
        ));
    }
    Ok(())
}

fn is_socket(e: &Entry) -> bool {
    nix::sys::stat::SFlag::from_bits_truncate(e.st.st_mode) & nix::sys::stat::SFlag::S_IFMT
        == nix::sys::stat::SFlag::S_IFSOCK
}

/// Read with O_NOATIME: the copy's times are already set and must stay as copied.
/// SHA-256 of the file `rel` beneath `root`, in hex (a snapshot's manifest).
/// The first of `digests` (a relative path and the SHA-256 it should have, in hex) whose
/// file beneath `root` has another: its path, the digest wanted and the one found.
pub fn first_mismatch(
    root: BorrowedFd<'_>,
    shown: &Path,
    digests: &[(String, String)],
) -> Result<Option<(String, String, String)>> {
    for (rel, want) in digests {
        let found = sha256_beneath(root, Path::new(rel))
            .map_err(|e| Error::io("checksum", shown.join(rel), e.into()))?;
        if &found != want {
            return Ok(Some((rel.clone(), want.clone(), found)));
        }
    }
    Ok(None)
}

pub fn sha256_beneath(root: BorrowedFd<'_>, rel: &Path) -> nix::Result<String> {
    Ok(digest(root, rel)?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn digest(root: BorrowedFd<'_>, rel: &Path) -> nix::Result<Vec<u8>> {
    let mut f = File::from(open_beneath(
        root,
        rel,
        OFlag::O_RDONLY | OFlag::O_NOATIME,
        Mode::empty(),
    )?);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        if n == 0 {
            return Ok(h.finalize().to_vec());
        }
        h.update(&buf[..n]);
    }
}
