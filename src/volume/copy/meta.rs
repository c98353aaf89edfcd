//! Everything of a tree but the file data: directories, empty files at their size (the
//! large ones: a file of one piece is made and finished by the data phase, through
//! [`create_file`] and [`set_file_metadata`]),
//! symlinks (as links: the text is copied, never resolved), device nodes and FIFOs,
//! hard links (a second name of the first copy), and last owners, modes, attributes and
//! times, once every name exists (so no later creation moves a directory's times). Every
//! step is repeatable: a resumed copy finds its own earlier work.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{
    fchmod, fchmodat, fstatat, futimens, mkdirat, mknodat, utimensat, FchmodatFlags, FileStat,
    Mode, SFlag, UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{
    fchown, fchownat, ftruncate, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags,
};

use super::walk::{kind_of, open_beneath, open_dir, Entry, Kind};
use crate::error::{Error, Result};

/// Which entries carry data (the first name of each inode) and, for every further name
/// of a hard-linked inode, the entry whose copy it links to.
pub struct Links {
    pub primaries: Vec<usize>,
    pub secondaries: Vec<(usize, usize)>,
    /// Primaries the data phase copies whole on one stream: made, written and given
    /// their metadata there (`data::Unit::whole`), so no other phase makes or sets them.
    pub whole: std::collections::HashSet<usize>,
}

impl Links {
    /// `entries` but the `whole` files: what the phases after the data phase finish.
    pub fn not_whole<'e>(&self, entries: &'e [Entry]) -> Vec<&'e Entry> {
        (entries.iter().enumerate())
            .filter(|(i, _)| !self.whole.contains(i))
            .map(|(_, e)| e)
            .collect()
    }
}

pub fn links(entries: &[Entry]) -> Links {
    let mut first: HashMap<(libc::dev_t, libc::ino_t), usize> = HashMap::new();
    let (mut primaries, mut secondaries) = (Vec::new(), Vec::new());
    for (i, e) in entries.iter().enumerate() {
        if e.kind != Kind::File {
            continue;
        }
        if e.st.st_nlink > 1 {
            let key = (e.st.st_dev, e.st.st_ino);
            if let Some(&p) = first.get(&key) {
                secondaries.push((i, p));
                continue;
            }
            first.insert(key, i);
        }
        primaries.push(i);
    }
    Links {
        primaries,
        secondaries,
        whole: Default::default(),
    }
}

/// The parent directory's descriptor (beneath `root`) and the entry's own name.
fn parent_of<'a>(root: BorrowedFd<'_>, rel: &'a Path) -> nix::Result<(OwnedFd, &'a OsStr)> {
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().ok_or(Errno::EINVAL)?;
    Ok((open_dir(root, parent)?, name))
}

/// As [`parent_of`], and the root itself as `.` in its own descriptor.
pub fn holder_of<'a>(root: BorrowedFd<'_>, rel: &'a Path) -> nix::Result<(OwnedFd, &'a OsStr)> {
    if rel.as_os_str().is_empty() {
        Ok((open_dir(root, Path::new(""))?, OsStr::new(".")))
    } else {
        parent_of(root, rel)
    }
}

fn io(what: &'static str, shown: &Path, rel: &Path) -> impl FnOnce(Errno) -> Error {
    let at = shown.join(rel);
    move |e| Error::io(what, at, e.into())
}

/// Creates what `entries[1..]` name in the target (the root exists), files at their
/// size without data; `secondaries` are left for `link_all`, `whole` files for the data
/// phase. One depth at a time, each on `streams` threads: a directory exists before
/// anything is made in it, and on an NFS target every creation is a round trip. `live`:
/// the source may change meanwhile (`CopyRequest::live`), so an entry gone from it since
/// the walk is skipped.
pub fn create_structure(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    entries: &[Entry],
    links: &Links,
    streams: super::Streams<'_>,
    live: bool,
) -> Result<()> {
    let secondary: std::collections::HashSet<usize> =
        links.secondaries.iter().map(|(i, _)| *i).collect();
    let mut by_depth: std::collections::BTreeMap<usize, Vec<&Entry>> = Default::default();
    for (i, e) in entries.iter().enumerate().skip(1) {
        if !secondary.contains(&i) && !links.whole.contains(&i) {
            by_depth
                .entry(e.rel.components().count())
                .or_default()
                .push(e);
        }
    }
    for level in by_depth.values() {
        streams.each(level, |e| {
            gone_is_fine(create_one(src, dst, e), live).map_err(io("create", shown, &e.rel))
        })?;
    }
    Ok(())
}

pub(super) fn create_one(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, e: &Entry) -> nix::Result<()> {
    let (dir, name) = parent_of(dst, &e.rel)?;
    let existing = match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Some(st),
        Err(Errno::ENOENT) => None,
        Err(err) => return Err(err),
    };
    let private = Mode::from_bits_truncate(0o700);
    match e.kind {
        Kind::Dir => match existing {
            Some(st) if kind_of(&st) == Kind::Dir => Ok(()),
            Some(_) => Err(Errno::EEXIST),
            None => mkdirat(dir.as_fd(), name, private),
        },
        Kind::File => {
            if existing.is_some_and(|st| kind_of(&st) != Kind::File) {
                return Err(Errno::EEXIST);
            }
            // A name with other links may share its inode with another snapshot's copy
            // (`base`): replaced, never written through. The structure is made before any
            // data is copied, and `link_all` links further names again, so a run cut
            // short loses nothing here.
            if existing.is_some_and(|st| st.st_nlink > 1) {
                unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)?;
            }
            let fd = open_beneath(
                dst,
                &e.rel,
                OFlag::O_WRONLY | OFlag::O_CREAT,
                Mode::from_bits_truncate(0o600),
            )?;
            ftruncate(&fd, e.st.st_size)
        }
        Kind::Symlink => {
            let (sdir, _) = parent_of(src, &e.rel)?;
            let text = readlinkat(sdir.as_fd(), name)?;
            if let Some(st) = existing {
                if kind_of(&st) == Kind::Symlink && readlinkat(dir.as_fd(), name)? == text {
                    return Ok(());
                }
                // Ours from a run cut short: only a symlink or file is ever replaced.
                if kind_of(&st) == Kind::Dir {
                    return Err(Errno::EEXIST);
                }
                unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)?;
            }
            symlinkat(text.as_os_str(), dir.as_fd(), name)
        }
        Kind::Special => {
            let kind = SFlag::from_bits_truncate(e.st.st_mode) & SFlag::S_IFMT;
            if existing.is_some() || kind == SFlag::S_IFSOCK {
                // A socket is no file to copy: its listener is not on this host.
                return Ok(());
            }
            mknodat(dir.as_fd(), name, kind, private, e.st.st_rdev)
        }
    }
}

/// Makes each further name of a hard-linked file a link to its first name's copy.
pub fn link_all(dst: BorrowedFd<'_>, shown: &Path, entries: &[Entry], links: &Links) -> Result<()> {
    for &(i, p) in &links.secondaries {
        let (rel, first) = (&entries[i].rel, &entries[p].rel);
        let run = || -> nix::Result<()> {
            let (dir, name) = parent_of(dst, rel)?;
            let (fdir, fname) = parent_of(dst, first)?;
            match linkat(fdir.as_fd(), fname, dir.as_fd(), name, AtFlags::empty()) {
                Err(Errno::EEXIST) => {
                    let a = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
                    let b = fstatat(fdir.as_fd(), fname, AtFlags::AT_SYMLINK_NOFOLLOW)?;
                    if a.st_ino == b.st_ino {
                        return Ok(());
                    }
                    // Ours from a run cut short, whose first name was made anew since
                    // (`create_one`): the name is replaced, never a directory.
                    if kind_of(&a) == Kind::Dir {
                        return Err(Errno::EEXIST);
                    }
                    unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)?;
                    linkat(fdir.as_fd(), fname, dir.as_fd(), name, AtFlags::empty())
                }
                other => other,
            }
        };
        run().map_err(io("link", shown, rel))?;
    }
    Ok(())
}

/// Sizes cut to the source's (O_DIRECT writes whole blocks), then owner, mode, the
/// extended attributes [`copied_xattr`] names, and times of every entry; the root's too.
/// On `streams` threads: every entry exists by now, and setting an entry's owner, mode,
/// attributes or times changes no other entry's times (only adding or removing names
/// changes a directory's), so the order does not matter; on an NFS target each step is a
/// round trip to the server. The `whole` files have theirs from the data phase.
pub fn finish_metadata(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    shown: &Path,
    entries: &[Entry],
    links: &Links,
    streams: super::Streams<'_>,
    live: bool,
) -> Result<()> {
    let xattrs = has_xattrs(src);
    streams.each(&links.not_whole(entries), |e| {
        gone_is_fine(set_one(src, dst, e, xattrs), live).map_err(io(
            "set owner, mode and times of",
            shown,
            &e.rel,
        ))
    })
}

/// In a live copy, an entry the source lost (or whose parent it replaced) since the
/// walk is left as it is: the frozen pass (`delta`) removes or copies it again.
fn gone_is_fine(r: nix::Result<()>, live: bool) -> nix::Result<()> {
    match r {
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) if live => Ok(()),
        other => other,
    }
}

/// Extended attributes a copy keeps: the users' own (`user.*`), POSIX ACLs and file
/// capabilities. The rest belong to the source's filesystem (`system.nfs4_acl`, which no
/// local filesystem takes), to the target's security policy (`security.selinux`), or to
/// the kernel's own users (`trusted.*`).
pub fn copied_xattr(name: &OsStr) -> bool {
    let n = name.as_encoded_bytes();
    n.starts_with(b"user.")
        || n == b"system.posix_acl_access"
        || n == b"system.posix_acl_default"
        || n == b"security.capability"
}

/// The source's filesystem has extended attributes at all (else no entry is asked).
pub fn has_xattrs(src: BorrowedFd<'_>) -> bool {
    !matches!(
        xattr::list(at(src, OsStr::new("."))),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP)
    )
}

/// `name` in the directory `dir` as a path the `l*xattr` calls take: through the
/// directory's descriptor, never following `name` itself.
pub fn at(dir: BorrowedFd<'_>, name: &OsStr) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

/// What extended attributes are read from or set on: a name reached through its
/// directory's descriptor (`at`, never followed), or a file this process holds open.
pub trait Xattrs {
    fn list(&self) -> std::io::Result<xattr::XAttrs>;
    fn get(&self, name: &OsStr) -> std::io::Result<Option<Vec<u8>>>;
    fn set(&self, name: &OsStr, value: &[u8]) -> std::io::Result<()>;
    fn remove(&self, name: &OsStr) -> std::io::Result<()>;
}

impl Xattrs for Path {
    fn list(&self) -> std::io::Result<xattr::XAttrs> {
        xattr::list(self)
    }
    fn get(&self, name: &OsStr) -> std::io::Result<Option<Vec<u8>>> {
        xattr::get(self, name)
    }
    fn set(&self, name: &OsStr, value: &[u8]) -> std::io::Result<()> {
        xattr::set(self, name, value)
    }
    fn remove(&self, name: &OsStr) -> std::io::Result<()> {
        xattr::remove(self, name)
    }
}

impl Xattrs for File {
    fn list(&self) -> std::io::Result<xattr::XAttrs> {
        xattr::FileExt::list_xattr(self)
    }
    fn get(&self, name: &OsStr) -> std::io::Result<Option<Vec<u8>>> {
        xattr::FileExt::get_xattr(self, name)
    }
    fn set(&self, name: &OsStr, value: &[u8]) -> std::io::Result<()> {
        xattr::FileExt::set_xattr(self, name, value)
    }
    fn remove(&self, name: &OsStr) -> std::io::Result<()> {
        xattr::FileExt::remove_xattr(self, name)
    }
}

fn xattr_errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Copied extended attributes by name.
pub type XattrMap = std::collections::BTreeMap<std::ffi::OsString, Vec<u8>>;

/// The copied extended attributes of `of`, by name (none where the filesystem has none).
pub fn xattrs_of(of: &(impl Xattrs + ?Sized)) -> nix::Result<XattrMap> {
    let names = match of.list() {
        Ok(names) => names,
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(Default::default()),
        Err(e) => return Err(xattr_errno(e)),
    };
    let mut out = std::collections::BTreeMap::new();
    for name in names.filter(|n| copied_xattr(n)) {
        // Removed between the list and the read: not there.
        if let Some(value) = of.get(&name).map_err(xattr_errno)? {
            out.insert(name, value);
        }
    }
    Ok(out)
}

/// The target's copied attributes made the source's: set, and those the source no longer
/// has (a resumed copy) removed. Returns the source's.
fn copy_xattrs(src: &Path, dst: &(impl Xattrs + ?Sized)) -> nix::Result<XattrMap> {
    let (want, have) = (xattrs_of(src)?, xattrs_of(dst)?);
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        dst.remove(name).map_err(xattr_errno)?;
    }
    for (name, value) in want.iter().filter(|(n, v)| have.get(*n) != Some(*v)) {
        dst.set(name, value).map_err(xattr_errno)?;
    }
    Ok(want)
}

/// Opens the copy of the file `e` for writing, made now where the name is free (with the
/// source's permission bits: nothing else is set afterwards where the create already gave
/// them). A name in the way is handled as [`create_one`] does: a file of a run cut short
/// is opened as it is, one whose inode other names share (another snapshot's copy) is
/// replaced, anything else refused. Returns the file and whether it was made now.
/// `O_NONBLOCK`: a FIFO planted in the name's place fails the open instead of blocking it.
pub(super) fn create_file(dst: BorrowedFd<'_>, e: &Entry) -> nix::Result<(File, bool)> {
    let write = OFlag::O_WRONLY | OFlag::O_NONBLOCK;
    let create = write | OFlag::O_CREAT | OFlag::O_EXCL;
    let mode = Mode::from_bits_truncate(e.st.st_mode & 0o777);
    match open_beneath(dst, &e.rel, create, mode) {
        Ok(fd) => return Ok((File::from(fd), true)),
        Err(Errno::EEXIST) => {}
        Err(err) => return Err(err),
    }
    let (dir, name) = parent_of(dst, &e.rel)?;
    let st = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if kind_of(&st) != Kind::File {
        return Err(Errno::EEXIST);
    }
    if st.st_nlink > 1 {
        unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)?;
        return Ok((File::from(open_beneath(dst, &e.rel, create, mode)?), true));
    }
    Ok((
        File::from(open_beneath(dst, &e.rel, write, Mode::empty())?),
        false,
    ))
}

/// Owner, mode, copied attributes and times of the file `e` set on its open copy, in
/// [`set_one`]'s order; `made` is the copy's stat before its data was written, so an
/// owner or mode the create already gave is not set again (on an NFS target each is a
/// round trip). Returns the source's copied attributes when `xattrs` (what the copy must
/// read back).
pub(super) fn set_file_metadata(
    src: BorrowedFd<'_>,
    file: &File,
    e: &Entry,
    xattrs: bool,
    made: &FileStat,
) -> nix::Result<Option<XattrMap>> {
    let owner = (Uid::from_raw(e.st.st_uid), Gid::from_raw(e.st.st_gid));
    let chown = (made.st_uid, made.st_gid) != (e.st.st_uid, e.st.st_gid);
    if chown {
        fchown(file, Some(owner.0), Some(owner.1))?;
    }
    let mode = e.st.st_mode & 0o7777;
    // After chown, which clears set-id bits.
    if chown || made.st_mode & 0o7777 != mode {
        fchmod(file, Mode::from_bits_truncate(mode))?;
    }
    let copied = match xattrs {
        true => {
            let (sdir, name) = parent_of(src, &e.rel)?;
            Some(copy_xattrs(&at(sdir.as_fd(), name), file)?)
        }
        false => None,
    };
    let atime = TimeSpec::new(e.st.st_atime, e.st.st_atime_nsec);
    let mtime = TimeSpec::new(e.st.st_mtime, e.st.st_mtime_nsec);
    futimens(file, &atime, &mtime)?;
    Ok(copied)
}

pub(super) fn set_one(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    e: &Entry,
    xattrs: bool,
) -> nix::Result<()> {
    let (dir, name) = holder_of(dst, &e.rel)?;
    let dir = dir.as_fd();
    if e.kind == Kind::File {
        let fd = open_beneath(dst, &e.rel, OFlag::O_WRONLY, Mode::empty())?;
        ftruncate(&fd, e.st.st_size)?;
    }
    let nofollow = AtFlags::AT_SYMLINK_NOFOLLOW;
    fchownat(
        dir,
        name,
        Some(Uid::from_raw(e.st.st_uid)),
        Some(Gid::from_raw(e.st.st_gid)),
        nofollow,
    )?;
    if e.kind != Kind::Symlink {
        // After chown, which clears set-id bits. The entry is ours and no symlink.
        let mode = Mode::from_bits_truncate(e.st.st_mode & 0o7777);
        fchmodat(dir, name, mode, FchmodatFlags::FollowSymlink)?;
    }
    // After chown (which drops file capabilities) and chmod (an ACL sets the group bits
    // its own way). Only files and directories: others take no user attributes.
    if xattrs && matches!(e.kind, Kind::File | Kind::Dir) {
        let (sdir, _) = holder_of(src, &e.rel)?;
        copy_xattrs(&at(sdir.as_fd(), name), at(dir, name).as_path())?;
    }
    let atime = TimeSpec::new(e.st.st_atime, e.st.st_atime_nsec);
    let mtime = TimeSpec::new(e.st.st_mtime, e.st.st_mtime_nsec);
    utimensat(dir, name, &atime, &mtime, UtimensatFlags::NoFollowSymlink)
}
