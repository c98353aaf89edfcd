//! Block → block clones on one node: CreateVolume checks the source and records it in
//! the clone's volume record (`cloneSource`, and `cloneAccess: block` for a raw block
//! clone, written with the allocation, so no crash leaves a clone without its source or
//! its kind); the first NodeStage fills the volume before anything can publish it.
//!
//! Two kinds, as the clone's access type asks (Kubernetes' external-provisioner clones a
//! claim only from one of the same volumeMode, and CreateVolume refuses what it can tell
//! is the other kind): a filesystem clone is formatted and filled file by file through
//! its filesystem before it is mounted at the staging path; a raw block clone is the
//! source device's bytes copied onto its own (`copy::raw`), no filesystem made.
//!
//! What is safe to copy from: a source volume that nothing has staged, mounted or
//! published, copied at the clone's first NodeStage; or a filesystem source staged here,
//! copied at the clone's CreateVolume from its own mount, frozen for the copy
//! (`fill_from_mounted_source`; copying what a pod writes meanwhile gives a copy that
//! never existed). A raw block source in use is refused (no filesystem to freeze); a
//! second mount of a mounted ext4 shares its live superblock. While a file copy runs, the
//! source is mounted read-only in a private directory of the state dir; a raw copy holds
//! both devices open exclusively; either way a NodeStage or DeleteVolume of the source
//! waits for or is refused until the copy ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::copy::raw::{DeviceAt, RawCopyRequest};
use crate::copy::{copy_tree, CopyRequest, Progress, Saved, Verify};
use crate::error::{CloneError, CopyError, Error, Result};
use crate::metrics::clone::Cause;
use crate::os::safepath::{self, Create};
use crate::os::{Anchored, FsType, Host, MountEntry};
use crate::request::snapshot::SnapshotId;
use crate::request::{self, Access, Capability, VolumeRef};
use crate::volume::block::clone_source::{self, Source, SourceMount};
use crate::volume::block::{BlockBackend, Located};
use crate::volume::id::{BlockVolumeId, IdLayout};

/// The record's parameter naming the source volume (set by CreateVolume only: a class
/// cannot name it, unknown parameters are refused).
pub const SOURCE_KEY: &str = "cloneSource";
/// The record's parameter of a raw block clone (`block`), set with `SOURCE_KEY`; absent
/// for a filesystem clone.
pub const ACCESS_KEY: &str = "cloneAccess";
const RAW: &str = "block";

/// Whether the record is a raw block clone's: its source's bytes, no filesystem of its
/// own.
pub fn is_raw_clone(rec: &crate::pool::VolumeRecord) -> bool {
    rec.parameters.get(ACCESS_KEY).map(String::as_str) == Some(RAW)
}
/// How long a NodeStage waits for the copy before answering Unavailable with the
/// progress (the kubelet gives up on a call after 2 minutes and retries).
pub const STAGE_WAIT: Duration = Duration::from_secs(100);

use crate::state_dir::short_hash as short;

fn progress_path(b: &BlockBackend, id: &str) -> PathBuf {
    b.pool
        .state_dir()
        .join("clones")
        .join(format!("{}.json", short(id)))
}

fn copy_dir(b: &BlockBackend, id: &str) -> PathBuf {
    b.pool.state_dir().join("clone-mnt").join(short(id))
}

pub(crate) fn done(b: &BlockBackend, id: &str) -> Result<bool> {
    Ok(Saved::load(&progress_path(b, id))?.is_some_and(|s| s.done))
}

/// CreateVolume with `volume_content_source.volume` naming a block volume: the source
/// must be a block volume of this node, not being deleted or filled itself, fit `limit`
/// (0: none), and when the clone is `new` (a repeated CreateVolume answers what it made)
/// be of the clone's `access` and not in use. Returns its capacity, the clone's smallest
/// size.
pub fn check_source(
    b: &BlockBackend,
    source: &str,
    limit: u64,
    new: bool,
    access: Access,
) -> Result<u64> {
    let field = "volume_content_source.volume.volume_id";
    let not_found = || CloneError::SourceMissing {
        field,
        origin: source.to_owned(),
    };
    let id = match request::volume_ref(source) {
        Ok(VolumeRef::Block(id)) => id,
        _ => return Err(not_found().into()),
    };
    if id.node_id != b.node.node_id {
        return Err(CloneError::SourceOnOtherNode {
            field,
            node: id.node_id,
            this: b.node.node_id.clone(),
        }
        .into());
    }
    let rec = b
        .pool
        .state
        .snapshot()
        .get(source)
        .cloned()
        .ok_or_else(not_found)?;
    if rec.deleting {
        return Err(CloneError::SourceDeleting {
            field,
            origin: source.to_owned(),
        }
        .into());
    }
    if clone_source::of_record(&rec)?.is_some() && !done(b, source)? {
        return Err(CloneError::SourceNotFilled {
            field,
            origin: source.to_owned(),
        }
        .into());
    }
    if limit != 0 && limit < rec.capacity_bytes {
        return Err(CloneError::LimitBelowSource {
            origin: source.to_owned(),
            bytes: rec.capacity_bytes,
            limit,
        }
        .into());
    }
    if new {
        same_access(source, &rec, access)?;
    }
    // A filesystem source in use is copied at CreateVolume from its own mount, frozen
    // (`fill_from_mounted_source`); a raw one has no filesystem to freeze.
    if let Some(at) = in_use(b, &id).filter(|_| new && (access == Access::Block || !rec.formatted))
    {
        let e = CloneError::RawSourceInUse {
            field,
            origin: source.to_owned(),
            at,
        }
        .into();
        crate::metrics::clone::failed(&e);
        return Err(e);
    }
    Ok(rec.capacity_bytes)
}

/// A raw block clone is made of a raw block source and a filesystem clone of a
/// filesystem source, as Kubernetes asks (a claim is cloned only from a claim of its
/// volumeMode). A source that holds a filesystem of ours, or is a raw block clone, shows
/// its kind; one never staged with a filesystem may be either and is copied as asked.
fn same_access(source: &str, rec: &crate::pool::VolumeRecord, access: Access) -> Result<()> {
    match access {
        Access::Block if rec.formatted => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the source volume {source} holds an {} filesystem (it is used with mount \
                 access): a raw block clone copies a raw block volume; ask for mount access, \
                 as the source's (Kubernetes: volumeMode: Filesystem)",
                rec.fs_type.as_str()
            ),
        )),
        Access::Mount if is_raw_clone(rec) => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the source volume {source} is a raw block clone (used with block access): \
                 its clone is one too; ask for block access, as the source's (Kubernetes: \
                 volumeMode: Block)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Where the volume's device is staged or held now; None when nothing uses it (or its
/// device cannot be found, so nothing can).
pub(crate) fn in_use(b: &BlockBackend, id: &BlockVolumeId) -> Option<String> {
    let dev = b.mounted_device(id).ok()?;
    let mounts = b.mounter.mount_table().ok()?;
    let uses = b.pool.uses(&dev, &mounts);
    (!uses.is_empty()).then(|| {
        uses.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Block clones of `source` recorded but not filled yet.
pub fn unfilled_clones_of(b: &BlockBackend, source: &str) -> Result<Vec<String>> {
    let state = b.pool.state.snapshot();
    let mut out = Vec::new();
    for (id, rec) in state.iter() {
        let names = rec.parameters.get(SOURCE_KEY).map(String::as_str) == Some(source);
        if names && !rec.deleting && !done(b, id)? {
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// DeleteVolume of a clone's source: refused while a clone of it is not filled (its copy
/// is made from the source at the clone's first NodeStage).
pub fn refuse_unfilled_clones(b: &BlockBackend, source: &str) -> Result<()> {
    let clones = unfilled_clones_of(b, source)?;
    if clones.is_empty() {
        return Ok(());
    }
    Err(CloneError::UnfilledClones {
        origin: source.to_owned(),
        clones: clones.join(", "),
    }
    .into())
}

/// CreateVolume of a clone: the smallest size its source needs, checked against the
/// limit before anything is allocated, and the record parameters that name a claim's
/// source and a raw block clone's kind (a class's dataset is in the class's own
/// parameters).
pub async fn check_clone(
    b: &BlockBackend,
    req: &request::CreateVolume<'_>,
    nfs: Option<&crate::volume::nfs::NfsBackend>,
) -> Result<Option<(u64, BTreeMap<String, String>)>> {
    let Some(source) = clone_source::requested(req)? else {
        return Ok(None);
    };
    let access = clone_access(req, &source)?;
    let mut recorded = BTreeMap::new();
    let size = match (&source, &req.restore) {
        // A snapshot's manifest says how large a volume it needs.
        (_, Some(restore)) => {
            if req.limit_bytes != 0 && req.limit_bytes < restore.size_bytes {
                return Err(CloneError::LimitBelowSource {
                    origin: restore.text.clone(),
                    bytes: restore.size_bytes,
                    limit: req.limit_bytes,
                }
                .into());
            }
            recorded.insert(SOURCE_KEY.to_owned(), restore.text.clone());
            recorded.insert(
                clone_source::SNAPSHOT_CONTENT_KEY.to_owned(),
                restore.content.as_str().to_owned(),
            );
            restore.size_bytes
        }
        (Source::Block(raw), None) => {
            let new = b.pool.state.snapshot().by_name(&req.name).is_none();
            check_source(b, raw, req.limit_bytes, new, access)?
        }
        (Source::Nfs { id, label }, None) => {
            clone_source::check_nfs(nfs, id, label, req.limit_bytes).await?
        }
        (Source::Snapshot { .. } | Source::Empty { .. } | Source::Image { .. }, None) => {
            unreachable!("only a snapshot restores from a directory, an image or nothing")
        }
    };
    if let Some(claim_source) = &req.clone_of {
        recorded.insert(SOURCE_KEY.to_owned(), claim_source.clone());
    }
    if access == Access::Block {
        recorded.insert(ACCESS_KEY.to_owned(), RAW.to_owned());
    }
    Ok(Some((size, recorded)))
}

/// The file copy of a clone from `source`: paths set by the job once it has mounted both.
fn copy_request(source: &Source, rec: &crate::pool::VolumeRecord) -> CopyRequest {
    CopyRequest {
        source: PathBuf::new(),
        target: PathBuf::new(),
        label: source.label().to_owned(),
        streams: crate::copy::STREAMS,
        chunk: crate::copy::CHUNK,
        verify: verify_of(rec),
        live: false,
        target_reused: false,
    }
}

/// `verify` of the class: `sizes` (the default) or `checksum`.
pub fn verify_of(rec: &crate::pool::VolumeRecord) -> Verify {
    match rec
        .parameters
        .get(request::PARAM_VERIFY)
        .map(String::as_str)
    {
        Some("checksum") => Verify::Checksum,
        _ => Verify::Sizes,
    }
}

/// Before a clone is deleted: a copy still running refuses the delete; mounts a driver
/// killed mid-copy left in the clone's private directory are taken down (they would
/// hold the clone, and the source, in use for ever).
pub async fn unmount_leftovers(b: &BlockBackend, id: &str) -> Result<()> {
    let key = format!("clone:{id}");
    if tokio::time::timeout(Duration::ZERO, b.clones.jobs.join(&key))
        .await
        .is_err()
    {
        return Err(CloneError::CopyRunning {
            volume: id.to_owned(),
        }
        .into());
    }
    let dir = copy_dir(b, id);
    if !dir.exists() {
        return Ok(());
    }
    for name in ["source", "target"] {
        take_down(b.mounter.host.as_ref(), &dir, name).await?;
        let _ = std::fs::remove_dir(dir.join(name));
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// NodeStage of a clone: mounts left in its private copy directory (a driver killed
/// after the copy, or a take-down that failed) would make the stage find the clone in
/// use there for ever, done or not. Taken down as a job under the copy's key, so no
/// copy starts meanwhile; a copy running now is joined (its own end takes them down).
async fn take_down_idle_leftovers(
    b: &BlockBackend,
    key: &str,
    id: &str,
    progress: &Progress,
) -> Result<()> {
    let dir = copy_dir(b, id);
    let mounts = b.mounter.mount_table()?;
    if !mounts.iter().any(|m| m.mount_point.starts_with(&dir)) {
        return Ok(());
    }
    let (host, dir2) = (Arc::clone(&b.mounter.host), dir.clone());
    let job = async move {
        for name in ["source", "target"] {
            take_down(host.as_ref(), &dir2, name).await?;
        }
        tracing::info!(dir = %dir2.display(), "took down mounts left in a clone's copy directory");
        Ok(())
    };
    b.clones.run(key, progress, STAGE_WAIT, job).await
}

/// CreateVolume of a filesystem clone whose source is mounted on this node now (a pod
/// uses it): the clone is filled here, from the source's own mount (a second mount of a
/// mounted ext4 or xfs would share its live superblock) with the source's filesystem
/// frozen for the copy, so the clone is the source as it was at CreateVolume. A job
/// under the copy's key, which a retry joins. A source not mounted: Ok, its clone is
/// filled at its first NodeStage, or the source's, whichever comes first.
pub async fn fill_from_mounted_source(b: &BlockBackend, id: &BlockVolumeId) -> Result<()> {
    let raw = id.to_string();
    // From the record first: most volumes are no clone, and a stripe's device exists only
    // while it is staged, so locating it here would fail its CreateVolume.
    let Some(record) = b.pool.state.snapshot().get(&raw).cloned() else {
        return Ok(());
    };
    let Some(source) = clone_source::of_record(&record)? else {
        return Ok(());
    };
    let Source::Block(src_raw) = &source else {
        return Ok(());
    };
    if is_raw_clone(&record) || done(b, &raw)? {
        return Ok(());
    }
    let VolumeRef::Block(src_id) = request::volume_ref(src_raw)? else {
        return Ok(());
    };
    // A source whose device is not here now (a stripe not staged) is mounted nowhere.
    let Ok(mut src) = b.locate(&src_id) else {
        return Ok(());
    };
    let mounts = b.mounter.mount_table()?;
    let dev = (src.device.major, src.device.minor);
    let Some(at) = b.mounter.filesystem_root(&mounts, dev.0, dev.1) else {
        return Ok(());
    };
    if id.layout == crate::volume::id::IdLayout::Stripe {
        // A stripe clone's md array runs only while it is staged: it is filled at its
        // first NodeStage, from a source nothing uses then.
        return Err(CloneError::StripeSourceInUse {
            origin: src_raw.clone(),
            at,
        }
        .into());
    }
    let mut vol = b.locate(id)?;
    let key = format!("clone:{raw}");
    let progress = b
        .clones
        .progress(&key, &raw, progress_path(b, &raw), source.label());
    match tokio::time::timeout(STAGE_WAIT, b.clones.jobs.join(&key)).await {
        Ok(Some(outcome)) => return outcome,
        Ok(None) => {}
        Err(_) => return Err(Error::NotReady(progress.message())),
    }
    let fs = vol.record.fs_type;
    crate::volume::block::format::format_if_blank(b, &mut vol, fs).await?;
    let dir = copy_dir(b, &raw);
    refuse_in_use(b, &vol, Some(&dir), &mounts, "clone")
        .inspect_err(crate::metrics::clone::failed)?;
    b.verify_located(&mut src)?;
    b.verify_located(&mut vol)?;
    tracing::info!(volume_id = %raw, source = %src_raw, at = %at.display(),
        "filling the clone now from its source's mount, frozen for the copy");
    let job = fill_frozen(
        Arc::clone(&b.mounter.host),
        (b.pool.state_dir().to_owned(), dir),
        (at, dev),
        (vol.device.path.clone(), fs),
        copy_request(&source, &vol.record),
        Arc::clone(&progress),
        raw.clone(),
    );
    b.clones.run(&key, &progress, STAGE_WAIT, job).await
}

/// The job of `fill_from_mounted_source`: the clone mounted in `dir`, the source's mount
/// root `at` opened and checked as device `dev`'s, frozen, copied from, thawed (the
/// guard thaws on every path, a panic included), the clone unmounted.
async fn fill_frozen(
    host: Arc<dyn Host>,
    (state_dir, dir): (PathBuf, PathBuf),
    (at, dev): (PathBuf, (u32, u32)),
    (dst_dev, dst_fs): (PathBuf, FsType),
    mut req: CopyRequest,
    progress: Arc<Progress>,
    volume: String,
) -> Result<()> {
    use nix::fcntl::OFlag;
    clean_copy_dir(host.as_ref(), &dir).await?;
    let dst_at = pin(&dir, "target")?;
    host.mount(&dst_dev, &dst_at, dst_fs, &[])
        .await
        .inspect_err(|_| crate::metrics::clone::failed_because(Cause::Mount))?;
    let open = |p: &std::path::Path| {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        nix::fcntl::open(p, flags, nix::sys::stat::Mode::empty())
            .map_err(|e| Error::io("open", p, e.into()))
    };
    let copied = async {
        let (src, dst) = (open(&at)?, open(dst_at.path())?);
        let st = nix::sys::stat::fstat(&src).map_err(|e| Error::io("stat", &at, e.into()))?;
        if (libc::major(st.st_dev), libc::minor(st.st_dev)) != dev {
            return Err(CloneError::SourceMountGone { at: at.clone() }.into());
        }
        (req.source, req.target) = (at.clone(), dst_at.path().to_owned());
        let p = Arc::clone(&progress);
        let name = short(&volume);
        tokio::task::spawn_blocking(move || {
            use std::os::fd::AsFd;
            let root = src
                .try_clone()
                .map_err(|e| Error::io("open", &req.source, e))?;
            let frozen = crate::volume::block::freeze::Frozen::freeze(
                &state_dir,
                &name,
                root,
                dev,
                &req.source,
            )?;
            let copied = crate::copy::copy_tree_at(src.as_fd(), dst.as_fd(), &req, &p).map(drop);
            drop(frozen);
            copied
        })
        .await
        .map_err(|e| CloneError::CopyStopped(e.to_string()).into())
        .and_then(|r| r)
    }
    .await;
    let outcome = copied.and(unmount_retrying(host.as_ref(), &dst_at).await);
    if outcome.is_err() {
        // Not filled until the clone's mount is down (see `fill`).
        let mut saved = progress.saved();
        if saved.done {
            saved.done = false;
            let _ = progress.set(saved);
        }
    }
    match &outcome {
        Ok(()) => crate::metrics::clone::finished(&volume, progress.elapsed()),
        Err(e) => crate::metrics::clone::failed(e),
    }
    outcome
}

/// Removes a deleted clone's progress record.
pub fn forget(b: &BlockBackend, id: &str) {
    let _ = std::fs::remove_file(progress_path(b, id));
    b.clones.forget(&format!("clone:{id}"));
    crate::metrics::clone::forget(id);
}

/// A clone's copy still to be made, found by [`pending`].
pub struct Pending {
    key: String,
    source: Source,
    progress: Arc<Progress>,
    raw: bool,
}

impl Pending {
    /// A filesystem clone is filled through its own filesystem, made first.
    pub fn needs_filesystem(&self) -> bool {
        !self.raw
    }
}

/// The fill step's question (`block::fill`): the copy volume `vol` still needs, checked
/// against the capability it is staged or published with; None for every volume that is
/// no clone, a clone filled already, or one whose copy a given-up call left running and
/// that finished while this call waited for it.
pub async fn pending(b: &BlockBackend, vol: &Located, cap: &Capability) -> Result<Option<Pending>> {
    let raw = vol.id.to_string();
    let Some(source) = clone_source::of_record(&vol.record)? else {
        return Ok(None);
    };
    let raw_clone = is_raw_clone(&vol.record);
    if raw_clone && cap.access == Access::Mount {
        // Its device holds the source's bytes: a mount would find no filesystem of its
        // own and format over them.
        return Err(Error::invalid(
            "volume_capability",
            format!(
                "volume {raw} is a raw block clone (its device holds its source's bytes, no \
                 filesystem of its own): stage and publish it with block access"
            ),
        ));
    }
    let key = format!("clone:{raw}");
    let progress = b
        .clones
        .progress(&key, &raw, progress_path(b, &raw), source.label());
    take_down_idle_leftovers(b, &key, &raw, &progress).await?;
    if done(b, &raw)? {
        return Ok(None);
    }
    let on_nfs = match &source {
        Source::Nfs { .. } => true,
        Source::Snapshot { id, .. } => id.nfs_dir("").is_some(),
        _ => false,
    };
    if let (true, false) = (on_nfs, b.nfs_sources) {
        let label = source.label();
        return Err(CloneError::NfsSourceDisabled {
            volume: raw,
            label: label.to_owned(),
        }
        .into());
    }
    if !raw_clone && cap.access == Access::Block {
        return Err(Error::invalid(
            "volume_capability",
            format!(
                "volume {raw} is a filesystem clone, filled file by file through its \
                 filesystem: stage it with mount access"
            ),
        ));
    }
    // A copy a given-up call left running: wait for it, do not start another.
    match tokio::time::timeout(STAGE_WAIT, b.clones.jobs.join(&key)).await {
        Ok(Some(outcome)) => return outcome.map(|()| None),
        Ok(None) => {}
        Err(_) => return Err(Error::NotReady(progress.message())),
    }
    Ok(Some(Pending {
        key,
        source,
        progress,
        raw: raw_clone,
    }))
}

/// Makes the pending copy into `vol` (a filesystem clone formatted already), verified,
/// as a job a retry joins.
pub async fn run(b: &BlockBackend, vol: &mut Located, fs: FsType, pending: Pending) -> Result<()> {
    let Pending {
        key,
        source,
        progress,
        raw: raw_clone,
    } = pending;
    if let Source::Empty { label } = &source {
        // A snapshot of a volume that held nothing: the volume as allocated.
        return progress.set(Saved {
            source: label.clone(),
            done: true,
            ..Saved::default()
        });
    }
    if raw_clone {
        let job = raw_fill(b, vol, &source, &progress)?;
        return b.clones.run(&key, &progress, STAGE_WAIT, job).await;
    }
    let raw = vol.id.to_string();
    let dir = copy_dir(b, &raw);
    let mounts = b.mounter.mount_table()?;
    refuse_in_use(b, vol, Some(&dir), &mounts, "clone")
        .inspect_err(crate::metrics::clone::failed)?;
    let Some(from) = source_mount(b, &source, &dir, &mounts)? else {
        // A block source never staged: an empty filesystem, which mkfs just made.
        return progress.set(Saved {
            source: source.label().to_owned(),
            done: true,
            ..Saved::default()
        });
    };
    b.verify_located(vol)?;
    let job = fill(
        Arc::clone(&b.mounter.host),
        dir,
        from,
        (vol.device.path.clone(), fs),
        copy_request(&source, &vol.record),
        Arc::clone(&progress),
        raw.clone(),
    );
    b.clones.run(&key, &progress, STAGE_WAIT, job).await
}

/// The job that fills raw block clone `vol` from `source`: both devices in use nowhere
/// and verified as the volumes' own now, then copied by device number.
fn raw_fill(
    b: &BlockBackend,
    vol: &mut Located,
    source: &Source,
    progress: &Arc<Progress>,
) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'static>>> {
    if let Source::Image { at, label } = source {
        return image_fill(b, vol, at, label, progress).map(|f| Box::pin(f) as _);
    }
    let src_id = match source {
        Source::Block(raw) => match request::volume_ref(raw)? {
            VolumeRef::Block(id) => id,
            _ => {
                return Err(CloneError::NotABlockSource {
                    origin: raw.to_string(),
                }
                .into())
            }
        },
        // CreateVolume refuses it: a raw copy needs a device.
        Source::Nfs { label, .. }
        | Source::Snapshot { label, .. }
        | Source::Empty { label }
        | Source::Image { label, .. } => {
            return Err(CloneError::RawCloneOfNfs {
                volume: vol.id.to_string(),
                label: label.clone(),
            }
            .into())
        }
    };
    let mut src = b.locate(&src_id)?;
    let mounts = b.mounter.mount_table()?;
    for (what, v) in [("clone", &*vol), ("source", &src)] {
        refuse_in_use(b, v, None, &mounts, what).inspect_err(crate::metrics::clone::failed)?;
    }
    if src.record.capacity_bytes > vol.record.capacity_bytes {
        return Err(CloneError::SourceGrew {
            origin: src.id.to_string(),
            bytes: src.record.capacity_bytes,
            volume: vol.id.to_string(),
            volume_bytes: vol.record.capacity_bytes,
        }
        .into());
    }
    b.verify_located(&mut src)?;
    b.verify_located(vol)?;
    let at = |v: &Located| DeviceAt {
        path: v.device.path.clone(),
        major: v.device.major,
        minor: v.device.minor,
        image: false,
    };
    let req = RawCopyRequest {
        source: at(&src),
        target: at(vol),
        bytes: src.record.capacity_bytes,
        // A partition (and a stripe over partitions) is zeroed when carved; a whole
        // device is zeroed only when a volume on it is deleted, so a device never used
        // by a volume before may hold anything.
        zero_tail: vol.id.layout == IdLayout::Device,
        label: source.label().to_owned(),
        streams: crate::copy::STREAMS,
        chunk: crate::copy::CHUNK,
        verify: verify_of(&vol.record),
    };
    let (progress, volume) = (Arc::clone(progress), vol.id.to_string());
    Ok(Box::pin(async move {
        tracing::info!(volume_id = %volume, source = %req.label, bytes = req.bytes,
            from = %req.source.path.display(), to = %req.target.path.display(),
            "copying the source device onto the raw block clone");
        let p = Arc::clone(&progress);
        let outcome = tokio::task::spawn_blocking(move || crate::copy::raw::copy_device(&req, &p))
            .await
            .map_err(|e| CloneError::CopyStopped(e.to_string()).into())
            .and_then(|r| r);
        match &outcome {
            Ok(()) => crate::metrics::clone::finished(&volume, progress.elapsed()),
            Err(e) => crate::metrics::clone::failed(e),
        }
        outcome
    }))
}

/// The job that fills raw block volume `vol` from a raw block snapshot's image: the
/// volume in use nowhere and verified as its own device, the image (on an NFS store, in
/// the snapshot's directory mounted read-only in the volume's private directory) copied
/// onto it as a raw clone's source device is, then the mount taken down.
fn image_fill(
    b: &BlockBackend,
    vol: &mut Located,
    at: &clone_source::ImageAt,
    label: &str,
    progress: &Arc<Progress>,
) -> Result<impl std::future::Future<Output = Result<()>> + Send + 'static> {
    let mounts = b.mounter.mount_table()?;
    refuse_in_use(b, vol, None, &mounts, "restored")?;
    b.verify_located(vol)?;
    let target = DeviceAt {
        path: vol.device.path.clone(),
        major: vol.device.major,
        minor: vol.device.minor,
        image: false,
    };
    let zero_tail = vol.id.layout == IdLayout::Device;
    let verify = verify_of(&vol.record);
    let (host, dir) = (
        Arc::clone(&b.mounter.host),
        copy_dir(b, &vol.id.to_string()),
    );
    let (at, label, progress) = (at.clone(), label.to_owned(), Arc::clone(progress));
    let volume = vol.id.to_string();
    Ok(async move {
        let (opened, mounted) = match &at {
            clone_source::ImageAt::Local(id) => (open_image(id, None), None),
            clone_source::ImageAt::Nfs(nfs_dir) => {
                clean_copy_dir(host.as_ref(), &dir).await?;
                let m = pin(&dir, "source")?;
                let from = SourceMount::Nfs {
                    id: nfs_dir.clone(),
                    label: label.clone(),
                };
                from.mount(host.as_ref(), &m).await?;
                // Checked on what was mounted: the server resolved the path itself.
                let id = SnapshotId::parse(&label);
                let opened = id
                    .ok_or_else(|| Error::NotFound(format!("snapshot {label} does not exist")))
                    .and_then(|id| open_image(&id, Some(m.path())));
                (opened, Some((m, from)))
            }
        };
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                if let Some((m, _)) = mounted {
                    unmount_retrying(host.as_ref(), &m.without_final()).await?;
                }
                return Err(e);
            }
        };
        let (image, bytes) = (
            crate::os::safepath::fd_path(std::os::fd::AsFd::as_fd(&opened)),
            opened
                .metadata()
                .map_err(|e| Error::io("stat", &label, e))?
                .len(),
        );
        let req = RawCopyRequest {
            source: DeviceAt::image(image),
            target,
            bytes,
            zero_tail,
            label,
            streams: crate::copy::STREAMS,
            chunk: crate::copy::CHUNK,
            verify,
        };
        tracing::info!(volume_id = %volume, source = %req.label, bytes,
            "copying a raw block snapshot's image onto the volume");
        let p = Arc::clone(&progress);
        let copied = tokio::task::spawn_blocking(move || {
            // The image is read through its descriptor's path while it is open.
            let copied = crate::copy::raw::copy_device(&req, &p);
            drop(opened);
            copied
        })
        .await
        .map_err(|e| CloneError::CopyStopped(e.to_string()).into())
        .and_then(|r| r);
        let copied = match &mounted {
            Some((_, from)) => copied.map_err(|e| from.explain(e, &progress)),
            None => copied,
        };
        if let Some((m, _)) = mounted {
            unmount_retrying(host.as_ref(), &m.without_final()).await?;
        }
        match &copied {
            Ok(()) => crate::metrics::clone::finished(&volume, progress.elapsed()),
            Err(e) => crate::metrics::clone::failed(e),
        }
        copied
    })
}

/// A raw block snapshot's image, opened without following a symlink in the directory
/// proven to be snapshot `id`'s (on a directory store, or an NFS store's snapshot
/// directory mounted at `mounted`): a regular file, never a link to one elsewhere.
fn open_image(id: &SnapshotId, mounted: Option<&std::path::Path>) -> Result<std::fs::File> {
    let dir = match mounted {
        None => clone_source::local_snapshot(id)?,
        Some(at) => crate::snapshot::store::open_ready(at, "", &id.to_string(), &id.location())?,
    };
    dir.open_file(crate::request::snapshot::IMAGE)?
        .ok_or_else(|| Error::NotFound(format!("snapshot {id} has no image at {}", id.location())))
}

/// How the copy mounts `source`; None when there is nothing to copy.
fn source_mount(
    b: &BlockBackend,
    source: &Source,
    dir: &std::path::Path,
    mounts: &[MountEntry],
) -> Result<Option<SourceMount>> {
    match source {
        Source::Block(src) => block_source(b, src, dir, mounts),
        // Unlike a block volume, an NFS directory is shared: pods on other nodes may
        // have it mounted, and this node's stage of it is a separate NFS mount, not a
        // second mount of one local superblock. It is never refused for being in use;
        // a tree that changes during the copy is what any reader of a shared dataset
        // sees, and the copy verifies sizes (and checksums when asked) at its end.
        Source::Nfs { id, label } => Ok(Some(SourceMount::Nfs {
            id: id.clone(),
            label: label.clone(),
        })),
        Source::Snapshot { id, label } => Ok(Some(match id.nfs_dir("") {
            Some(dir) => SourceMount::NfsSnapshot {
                dir,
                id: id.clone(),
                label: label.clone(),
            },
            None => SourceMount::Tree { id: id.clone() },
        })),
        Source::Empty { .. } => Ok(None),
        // CreateVolume and NodeStage refuse it: a raw block snapshot restores only raw.
        Source::Image { label, .. } => Err(CloneError::ImageNeedsBlock {
            label: label.clone(),
        }
        .into()),
    }
}

/// A block source: mounted nowhere but in `dir`, and still its own device. None when it
/// was never formatted (nothing to copy).
fn block_source(
    b: &BlockBackend,
    source: &str,
    dir: &std::path::Path,
    mounts: &[MountEntry],
) -> Result<Option<SourceMount>> {
    let src_id = match request::volume_ref(source)? {
        VolumeRef::Block(id) => id,
        _ => {
            return Err(CloneError::NotABlockSource {
                origin: source.to_string(),
            }
            .into())
        }
    };
    let mut src = b.locate(&src_id)?;
    if !src.record.formatted {
        return Ok(None);
    }
    refuse_in_use(b, &src, Some(dir), mounts, "source")
        .inspect_err(crate::metrics::clone::failed)?;
    b.verify_located(&mut src)?;
    Ok(Some(SourceMount::Device {
        dev: src.device.path.clone(),
        fs: src.record.fs_type,
    }))
}

/// The volume's device is mounted nowhere but (after a killed driver) in the copy's
/// private `dir`, if it has one.
fn refuse_in_use(
    b: &BlockBackend,
    vol: &Located,
    dir: Option<&std::path::Path>,
    mounts: &[MountEntry],
    what: &str,
) -> Result<()> {
    let uses = b.pool.uses(&vol.device, mounts);
    let private = |at: &std::path::Path| dir.is_some_and(|d| at.starts_with(d));
    let elsewhere: Vec<String> = uses
        .iter()
        .filter(|u| !matches!(u, crate::os::DeviceUse::Mounted(at) if private(at)))
        .map(|u| u.to_string())
        .collect();
    if elsewhere.is_empty() {
        return Ok(());
    }
    Err(CopyError::InUse {
        what: format!("the {what} volume {}", vol.id),
        uses: elsewhere.join(", "),
        fix: "a clone is copied only from and into volumes nothing has staged, so the copy \
              is consistent: stop what uses it; the kubelet's retry then copies",
    }
    .into())
}

/// The copy's private directory, made if missing and with nothing mounted in it: a driver
/// killed mid-copy may have left its mounts there.
pub(crate) async fn clean_copy_dir(host: &dyn Host, dir: &std::path::Path) -> Result<()> {
    host.create_dir_all(dir)?;
    take_down(host, dir, "source").await?;
    take_down(host, dir, "target").await
}

/// Unmounts what is mounted at `<dir>/<name>` (left by a driver killed mid-copy).
pub(crate) async fn take_down(host: &dyn Host, dir: &std::path::Path, name: &str) -> Result<()> {
    if clone_source::take_down_nfs(host, &dir.join(name)).await? {
        return Ok(());
    }
    let mounts = host.mount_table()?;
    if crate::os::mountinfo::at(&mounts, &dir.join(name)).is_some() {
        // Pinned after the mount: its own descriptor of the mount root would keep it busy.
        let at = pin(dir, name)?.without_final();
        unmount_retrying(host, &at).await?;
    }
    Ok(())
}

/// How long an unmount of the copy's private mounts retries while it is busy.
const BUSY_RETRY: Duration = Duration::from_secs(5);

/// Unmounts a private copy mount, retrying a while on EBUSY. Nothing of the driver's
/// holds it once the copy has returned, but a holder may be transient: a process of
/// this mount namespace whose working directory or open file lies under it for a
/// moment (a host-exec process that entered the namespace, a tree scanner), or a child
/// the driver forked meanwhile for another volume that holds the copy's descriptors
/// until it execs.
pub(crate) async fn unmount_retrying(host: &dyn Host, at: &Anchored) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match clone_source::unmount(host, at).await {
            Err(e) if is_busy(&e) && started.elapsed() < BUSY_RETRY => {
                tracing::info!(at = %at.path().display(), "copy mount busy; unmounting again shortly");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

fn is_busy(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } => source.raw_os_error() == Some(libc::EBUSY),
        Error::Shared(inner) => is_busy(inner),
        _ => false,
    }
}

pub(crate) fn pin(dir: &std::path::Path, name: &str) -> Result<Anchored> {
    let path = dir.join(name);
    let root = dir.parent().unwrap_or(dir).to_owned();
    safepath::open("clone directory", &[root], &path, Create::Dir, None)?.ok_or_else(|| {
        Error::FailedPrecondition(format!("{} could not be created", path.display()))
    })
}

/// The job: the source mounted read-only and the clone read-write in `dir`, the tree
/// copied and verified, both unmounted whatever the outcome.
async fn fill(
    host: Arc<dyn Host>,
    dir: PathBuf,
    from: SourceMount,
    (dst_dev, dst_fs): (PathBuf, FsType),
    mut req: CopyRequest,
    progress: Arc<Progress>,
    volume: String,
) -> Result<()> {
    clean_copy_dir(host.as_ref(), &dir).await?;
    let (src_at, dst_at) = (pin(&dir, "source")?, pin(&dir, "target")?);
    from.mount(host.as_ref(), &src_at)
        .await
        .inspect_err(|_| crate::metrics::clone::failed_because(Cause::Mount))?;
    let copied = async {
        let (files, manifest) = from.files(src_at.path())?;
        host.mount(&dst_dev, &dst_at, dst_fs, &[]).await?;
        (req.source, req.target) = (files, dst_at.path().to_owned());
        let p = Arc::clone(&progress);
        let copied = tokio::task::spawn_blocking(move || {
            copy_tree(&req, &p)?;
            match manifest {
                Some(m) => verify_recorded(&req.target, &m, &p),
                None => Ok(()),
            }
        })
        .await
        .map_err(|e| CloneError::CopyStopped(e.to_string()).into())
        .and_then(|r| r)
        .map_err(|e| from.explain(e, &progress));
        let unmounted = unmount_retrying(host.as_ref(), &dst_at).await;
        copied.and(unmounted)
    }
    .await;
    let unmounted = unmount_retrying(host.as_ref(), &src_at).await;
    let outcome = copied.and(unmounted);
    if outcome.is_err() {
        // The copy records done when it ends, before the take-down: a mount left behind
        // must leave the clone not filled, so the retry takes it down (and checks the
        // copy again) rather than staging a clone mounted here.
        let mut saved = progress.saved();
        if saved.done {
            saved.done = false;
            let _ = progress.set(saved).inspect_err(
                |e| tracing::warn!(volume_id = %volume, error = %e, "recording the clone not filled"),
            );
        }
    }
    match &outcome {
        Ok(()) => crate::metrics::clone::finished(&volume, progress.elapsed()),
        Err(e) => crate::metrics::clone::failed(e),
    }
    outcome
}

/// A restore from a snapshot that recorded checksums: every file of the copy at `target`
/// read back and compared with its manifest's SHA-256, so bytes changed on the store after
/// the snapshot was taken are refused, not restored. On a mismatch the volume is emptied
/// and its copy forgotten, so a retry after the store is repaired copies it all again.
fn verify_recorded(
    target: &std::path::Path,
    m: &crate::snapshot::Manifest,
    progress: &Progress,
) -> Result<()> {
    use nix::fcntl::OFlag;
    use std::os::fd::AsFd;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = nix::fcntl::open(target, flags, nix::sys::stat::Mode::empty())
        .map_err(|e| Error::io("open", target, e.into()))?;
    let digests = m.digests();
    let shown = std::path::Path::new(&m.snapshot_id);
    if let Some((path, recorded, found)) =
        crate::copy::verify::first_mismatch(root.as_fd(), shown, &digests)?
    {
        crate::copy::delta::empty(root.as_fd(), target)?;
        progress.set(Saved::default())?;
        return Err(crate::error::StoreError::Corrupt {
            id: m.snapshot_id.clone(),
            path,
            recorded,
            found,
        }
        .into());
    }
    Ok(())
}

/// The clone's kind, from its capabilities, before anything is allocated: one access
/// type, and block access only from a block volume (an NFS directory is copied file by
/// file into a filesystem).
pub fn clone_access(req: &request::CreateVolume<'_>, source: &Source) -> Result<Access> {
    let caps = request::capabilities(req.capabilities)?;
    let block = caps.iter().any(|c| c.access == Access::Block);
    if block && caps.iter().any(|c| c.access == Access::Mount) {
        return Err(Error::invalid(
            "volume_capabilities",
            "a clone is either a raw block copy of its source (block access) or a copy of \
             its files (mount access): ask for one access type",
        ));
    }
    match source {
        Source::Image { label, .. } if !block => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "snapshot {label} holds a raw block volume's bytes: restore it with block \
                 access (Kubernetes: volumeMode: Block)"
            ),
        )),
        Source::Nfs { label, .. } | Source::Snapshot { label, .. } if block => Err(Error::invalid(
            "volume_capabilities",
            format!(
                "the clone's source {label} is an NFS directory, copied file by file into a \
                 filesystem; a raw block clone copies a block volume of this node: ask for \
                 mount access (Kubernetes: volumeMode: Filesystem)"
            ),
        )),
        _ if block => Ok(Access::Block),
        _ => Ok(Access::Mount),
    }
}

/// The content source a clone's (or restored volume's) Volume answers with (CSI:
/// returned when it was asked).
pub fn content_source(rec: &crate::pool::VolumeRecord) -> Option<crate::csi::VolumeContentSource> {
    rec.parameters
        .get(SOURCE_KEY)
        .map(|id| request::snapshot::content_source(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType};
    use crate::csi::volume_content_source::{Type, VolumeSource};

    fn capability(block: bool) -> crate::csi::VolumeCapability {
        crate::csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(if block {
                AccessType::Block(Default::default())
            } else {
                AccessType::Mount(Default::default())
            }),
        }
    }

    fn clone_of(source: &str, caps: &[bool]) -> crate::csi::CreateVolumeRequest {
        crate::csi::CreateVolumeRequest {
            name: "clone".into(),
            volume_capabilities: caps.iter().map(|&b| capability(b)).collect(),
            volume_content_source: Some(crate::csi::VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: source.into(),
                })),
            }),
            ..Default::default()
        }
    }

    fn access(source: &str, caps: &[bool]) -> Result<Access> {
        let req = clone_of(source, caps);
        let req = request::create_volume(&req)?;
        let source = clone_source::requested(&req)?.expect("a clone");
        clone_access(&req, &source)
    }

    #[test]
    fn a_clone_is_one_kind_and_raw_only_of_a_block_volume() {
        let block = "blk:dev-0123456789abcdef:0badf00d:node-a";
        assert_eq!(access(block, &[true]).unwrap(), Access::Block);
        assert_eq!(access(block, &[false]).unwrap(), Access::Mount);
        let both = tonic::Status::from(access(block, &[true, false]).unwrap_err());
        assert_eq!(both.code(), tonic::Code::InvalidArgument);
        assert!(
            both.message()
                .starts_with("volume_capabilities: a clone is either a raw block copy"),
            "{}",
            both.message()
        );
        let nfs = "nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1";
        assert_eq!(access(nfs, &[false]).unwrap(), Access::Mount);
        let raw_of_nfs = tonic::Status::from(access(nfs, &[true]).unwrap_err());
        assert_eq!(raw_of_nfs.code(), tonic::Code::InvalidArgument);
        assert!(
            raw_of_nfs.message().starts_with(
                "volume_capabilities: the clone's source nfs:r-rdma-20049-4.1:~export:sets~a:192.0.2.1 is an NFS directory"
            ) && raw_of_nfs.message().contains("ask for mount access"),
            "{}",
            raw_of_nfs.message()
        );
    }
}
