//! The job that takes a snapshot: the volume's files copied into `<snapshot>/tree` (or a
//! raw block volume's bytes into `<snapshot>/device.img`), the manifest written last,
//! then this node's record marked ready.
//!
//! What is copied from, by the volume's state:
//! - a filesystem volume nothing uses: mounted read-only in a private directory of the
//!   state dir and copied;
//! - a filesystem volume staged here (a pod may be writing): copied live from its own
//!   mount, then its filesystem frozen (FIFREEZE) only for a last pass over what changed
//!   since (`copy::delta`), bounded by `--snapshot-freeze-limit`: past it the filesystem
//!   is thawed at once and the snapshot fails, nothing listed as ready;
//! - a volume without a filesystem nothing uses: its bytes, read `O_EXCL` (a mount or
//!   another exclusive open fails meanwhile), runs of zeros left as holes; one that only
//!   ever held zeros is recorded as empty. In use as a raw block device it is refused:
//!   there is no filesystem to freeze, so no copy of it would be a state that existed;
//! - an NFS volume: its directory through the controller's export mount.
//!
//! The source volume's lock is held for the whole job, so its NodeStage, NodeUnstage and
//! DeleteVolume answer Aborted (and are retried) until the copy ends.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::source::source;
use super::{key, store_record, Context, Record};
use crate::error::{Error, Result, SnapshotError, StoreError};
use crate::os::{FsType, Host};
use crate::request::snapshot::SnapshotId;
use crate::runtime::overlap::VolumeGuard;
use crate::runtime::state_dir::short_hash;
use crate::volume::block::freeze::{self, LastPass};
use crate::volume::copy::base::Base;
use crate::volume::copy::walk::Entry;
use crate::volume::copy::{copy_tree_at, CopyRequest, Progress, Saved, Verify};
use crate::volume::mounts::private;
use crate::volume::nfs::{fs_error, fsops};
use crate::volume::snapshot_store::manifest::{self, Content, Manifest, IMAGE, TREE};
use crate::volume::snapshot_store::{self as store, Owner, SnapshotDir};
use crate::volume::ContentView;

/// What the job owns: everything it needs once the call that started it has returned.
struct Job {
    host: Arc<dyn Host>,
    rec: Record,
    node_id: String,
    /// The snapshot's directory and its `tree/`, opened on the store.
    store: Opened,
    /// The last snapshot of the same volume on the same store, to link unchanged files from.
    base: Option<Arc<Base>>,
    /// The store, for messages.
    store_location: String,
    from: ContentView,
    /// Held for the whole copy (see the module's comment).
    guard: Option<VolumeGuard>,
    progress: Arc<Progress>,
    record_path: PathBuf,
    work: PathBuf,
    state_dir: PathBuf,
    freeze_limit: Duration,
}

pub(super) fn progress_of(ctx: &Context<'_>, rec: &Record) -> Arc<Progress> {
    ctx.snapshots.copies.progress(
        &key(&rec.name),
        &key(&rec.name),
        ctx.snapshots.progress_path(&rec.name),
        &rec.id.to_string(),
    )
}

/// Joins the record's copy or starts it, waiting at most the create wait: true when it
/// ended well, false while it still runs (the job goes on).
pub(super) async fn run(
    ctx: &Context<'_>,
    rec: &Record,
    source_guard: Option<VolumeGuard>,
) -> Result<bool> {
    let k = key(&rec.name);
    let progress = progress_of(ctx, rec);
    let wait = ctx.snapshots.create_wait;
    let jobs = &ctx.snapshots.copies.jobs;
    match tokio::time::timeout(wait, jobs.join(&k)).await {
        Ok(Some(outcome)) => return outcome.map(|()| true),
        Ok(None) => {}
        Err(_) => return Ok(false),
    }
    let work = job(ctx, rec, progress, source_guard).await?;
    match tokio::time::timeout(wait, jobs.run(&k, "snapshot", work.run())).await {
        Ok(outcome) => outcome.map(|()| true),
        Err(_) => Ok(false),
    }
}

async fn job(
    ctx: &Context<'_>,
    rec: &Record,
    progress: Arc<Progress>,
    source_guard: Option<VolumeGuard>,
) -> Result<Job> {
    let (from, guard) = source(ctx, &rec.source_volume_id, source_guard).await?;
    let store = prepare_dir(ctx, &rec.id, &rec.name).await?;
    let base = match (&from, base_record(ctx, rec)?) {
        (ContentView::Device { .. }, _) | (_, None) => None,
        (_, Some(b)) => open_base(ctx, &b, &store).await?.map(Arc::new),
    };
    Ok(Job {
        host: Arc::clone(ctx.host),
        rec: rec.clone(),
        node_id: ctx.node_id.to_owned(),
        store,
        base,
        store_location: rec.id.store_location(),
        from,
        guard,
        progress,
        record_path: ctx.snapshots.record_path(&rec.name),
        work: ctx.snapshots.work.join(short_hash(&rec.name)),
        state_dir: ctx.snapshots.state_dir.clone(),
        freeze_limit: ctx.snapshots.freeze_limit,
    })
}

/// The snapshot's directory made on its store, walked from the store's root without
/// following a symlink, and taken for this snapshot (`SnapshotDir::claim`); with its
/// `tree/` for a snapshot of files. Both are kept open: the copy writes through them.
async fn prepare_dir(ctx: &Context<'_>, id: &SnapshotId, name: &str) -> Result<Opened> {
    let (text, name, shown) = (id.to_string(), name.to_owned(), id.location());
    ctx.on_store(id, "making the snapshot's directory", move |root, rel| {
        let dir = SnapshotDir::create(root, rel, &shown)?;
        dir.claim(&text, &name)?;
        let tree = dir.make_subdir(TREE)?;
        Ok(Opened { dir, tree })
    })
    .await
}

/// A snapshot's directory and its `tree/`, open.
struct Opened {
    dir: SnapshotDir,
    tree: SnapshotDir,
}

/// The newest ready snapshot this node took of the same volume on the same store.
fn base_record(ctx: &Context<'_>, rec: &Record) -> Result<Option<Record>> {
    Ok(ctx
        .snapshots
        .records()?
        .into_iter()
        .filter(|r| r.ready && r.name != rec.name && r.manifest_sha256.is_some())
        .filter(|r| r.source_volume_id == rec.source_volume_id && r.id.store == rec.id.store)
        .max_by_key(|r| (r.created_secs, r.created_nanos)))
}

/// `base`'s snapshot as the new one's base: only a snapshot of files whose manifest is
/// still the one this node wrote (its SHA-256 kept in the record: the file list a store
/// writer cannot change), whose tree is there, and only when the store links files
/// (tried once, from the base's manifest to a name in the new directory). Otherwise
/// None: the snapshot is a full copy.
async fn open_base(ctx: &Context<'_>, base: &Record, new: &Opened) -> Result<Option<Base>> {
    let (text, shown) = (base.id.to_string(), base.id.location());
    let want = base.manifest_sha256.clone().unwrap_or_default();
    let new_dir = new.dir.dup()?;
    let opened = ctx
        .on_store(&base.id, "opening the base snapshot", move |root, rel| {
            let Some(dir) = SnapshotDir::open(root, rel, &shown)? else {
                return Ok(None);
            };
            let Some(bytes) = dir.manifest_bytes()? else {
                return Ok(None);
            };
            let m = match serde_json::from_slice::<Manifest>(&bytes) {
                Ok(m) if manifest::digest(&bytes) == want && m.snapshot_id.to_string() == text => m,
                _ => return Ok(None),
            };
            let Some(tree) = dir.subdir(TREE)? else {
                return Ok(None);
            };
            if m.content != Content::Files || !links_between(&dir, &new_dir) {
                return Ok(None);
            }
            let (tree, files) = (tree.dup()?, m.base_files());
            Ok(Some(Base {
                tree,
                label: text,
                files,
            }))
        })
        .await?;
    if opened.is_none() {
        tracing::info!(snapshot = %base.name, "the last snapshot of this volume cannot be a base: a full copy");
    }
    Ok(opened)
}

/// The store takes a hard link from the base's directory into the new one.
fn links_between(base: &SnapshotDir, new: &OwnedFd) -> bool {
    const PROBE: &str = ".link-probe";
    let _ = nix::unistd::unlinkat(new, PROBE, nix::unistd::UnlinkatFlags::NoRemoveDir);
    let Ok(from) = base.dup() else {
        return false;
    };
    let linked = nix::unistd::linkat(
        &from,
        manifest::FILE,
        new,
        PROBE,
        nix::fcntl::AtFlags::empty(),
    )
    .is_ok();
    let _ = nix::unistd::unlinkat(new, PROBE, nix::unistd::UnlinkatFlags::NoRemoveDir);
    linked
}

impl Job {
    async fn run(self) -> Result<()> {
        let started = Instant::now();
        let (store, progress) = (self.store_location.clone(), Arc::clone(&self.progress));
        // A store that fills up is said so, with about what the rest of the copy needs.
        let outcome = self.copy().await.map_err(|e| {
            let needed = progress
                .total_bytes()
                .saturating_sub(progress.copied_bytes());
            store::full(e, &store, needed.max(1))
        });
        match &outcome {
            Ok(()) => crate::metrics::snapshot::taken(started.elapsed().as_secs_f64()),
            Err(_) => crate::metrics::snapshot::failed(),
        }
        outcome
    }

    async fn copy(mut self) -> Result<()> {
        let guard = self.guard.take();
        let from = std::mem::replace(
            &mut self.from,
            ContentView::Tree {
                root: PathBuf::new(),
                rel: String::new(),
            },
        );
        let job = Arc::new(self);
        let j = Arc::clone(&job);
        let manifest = match from {
            ContentView::Unmounted { dev, fs } => {
                private::clean_copy_dir(job.host.as_ref(), &job.work).await?;
                let at = private::pin(&job.work, "source")?;
                job.host.mount(&dev, &at, fs, &["ro".to_owned()]).await?;
                let shown = at.path().to_owned();
                let copied = blocking(move || {
                    let root = open_dir(&shown)?;
                    let entries = j.copy_files(root.as_fd(), &shown, false)?;
                    // Mounted read-only by this job: still what was copied.
                    j.manifest(Some(fs), &entries, Some(root.as_fd()), None)
                })
                .await;
                let down = private::unmount_retrying(job.host.as_ref(), &at.without_final()).await;
                let m = copied?;
                down?;
                m
            }
            ContentView::Mounted { at, dev, fs } => {
                blocking(move || j.copy_mounted(&at, dev, fs)).await?
            }
            ContentView::Device { path, dev, bytes } => {
                blocking(move || j.copy_device(&path, dev, bytes)).await?
            }
            ContentView::Tree { root, rel } => {
                blocking(move || {
                    let shown = root.join(&rel);
                    let dir = fsops::open_dir(&root, &rel)
                        .map_err(|e| fs_error(shown.display().to_string(), e))?
                        .ok_or_else(|| SnapshotError::SourceDirGone {
                            path: shown.display().to_string(),
                        })?;
                    let entries = j.copy_files(dir.as_fd(), &shown, false)?;
                    j.manifest(None, &entries, None, None)
                })
                .await?
            }
        };
        // Ready from here on: the manifest first, then this node's record.
        let m = Arc::clone(&job);
        blocking(move || m.publish(&manifest)).await?;
        drop(guard);
        Ok(())
    }

    /// The file tree below `src` copied into the snapshot's `tree/`; `live`: the source
    /// may change meanwhile (nothing verified; see `copy::delta`).
    fn copy_files(
        &self,
        src: std::os::fd::BorrowedFd<'_>,
        shown: &Path,
        live: bool,
    ) -> Result<Vec<Entry>> {
        let dst = self.store.tree.dup()?;
        let req = CopyRequest {
            source: shown.to_owned(),
            target: PathBuf::from(self.store.tree.location()),
            label: self.rec.id.to_string(),
            streams: crate::volume::copy::STREAMS,
            chunk: crate::volume::copy::CHUNK,
            verify: self.verify(),
            live,
            target_reused: true,
            base: self.base.clone(),
            extents: None,
        };
        copy_tree_at(src, dst.as_fd(), &req, &self.progress)
    }

    fn verify(&self) -> Verify {
        if self.rec.checksums {
            Verify::Checksum
        } else {
            Verify::Sizes
        }
    }

    /// A mounted filesystem: copied live, then frozen for the pass over what changed,
    /// thawed at the limit whatever that pass has done.
    fn copy_mounted(&self, at: &Path, dev: (u32, u32), fs: FsType) -> Result<Manifest> {
        let root = open_mount_of(at, dev)?;
        let before = self.copy_files(root.as_fd(), at, true)?;
        let delta_progress = Progress::new(
            self.record_path.with_extension("delta"),
            self.rec.id.to_string(),
        );
        let outcome = self.frozen_pass(&root, at, dev, &before, &delta_progress);
        let _ = std::fs::remove_file(delta_progress.path());
        let (entries, changes, seconds) = outcome?;
        tracing::info!(snapshot = %self.rec.name, at = %at.display(), freeze_seconds = seconds,
            changed = changes.copied, removed = changes.removed, changed_bytes = changes.bytes,
            "snapshot of a mounted volume: froze it for the last pass");
        crate::metrics::snapshot::frozen(seconds);
        self.manifest(Some(fs), &entries, None, Some(seconds))
    }

    /// The filesystem at `at` frozen while what changed since `before` is copied, thawed
    /// when that is done or at the freeze limit, whichever comes first: the entries, what
    /// changed, and the seconds it stayed frozen.
    fn frozen_pass(
        &self,
        root: &OwnedFd,
        at: &Path,
        dev: (u32, u32),
        before: &[Entry],
        progress: &Progress,
    ) -> Result<LastPass> {
        let dst = self.store.tree.dup()?;
        let name = format!("snapshot-{}", short_hash(&self.rec.name));
        let pass = freeze::Pass {
            state_dir: &self.state_dir,
            name: &name,
            root,
            at,
            dev,
            dst: dst.as_fd(),
            verify: self.verify(),
            limit: self.freeze_limit,
        };
        pass.run(before, progress)?.map_err(|freeze::Overran| {
            SnapshotError::FreezeOverran {
                name: self.rec.name.clone(),
                at: at.display().to_string(),
                limit_secs: self.freeze_limit.as_secs_f64(),
            }
            .into()
        })
    }

    /// A volume without a filesystem: its bytes into `device.img`, zeros left as holes.
    /// Empty when it held only zeros (the image is then removed: nothing to restore).
    fn copy_device(&self, path: &Path, (major, minor): (u32, u32), bytes: u64) -> Result<Manifest> {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        let st =
            nix::sys::stat::fstat(dev.as_fd()).map_err(|e| Error::io("stat", path, e.into()))?;
        if st.st_rdev != nix::sys::stat::makedev(major.into(), minor.into()) {
            return Err(SnapshotError::SourceMoved {
                path: path.display().to_string(),
                what: "device",
            }
            .into());
        }
        let image_path = PathBuf::from(self.store.dir.shown(IMAGE));
        // Made anew each run: the device may have been written between two runs.
        let image = self.store.dir.create_file(IMAGE)?;
        image
            .set_len(bytes)
            .map_err(|e| Error::io("size", &image_path, e))?;
        self.progress.set(Saved {
            source: self.rec.id.to_string(),
            total_bytes: bytes,
            ..Saved::default()
        })?;
        let mut buf = vec![0u8; crate::volume::copy::BUFFER];
        let (mut at, mut written) = (0u64, 0u64);
        while at < bytes {
            let want = ((bytes - at) as usize).min(buf.len());
            let b = &mut buf[..want];
            dev.read_exact_at(b, at)
                .map_err(|e| Error::io("read", path, e))?;
            if b.iter().any(|&x| x != 0) {
                image
                    .write_all_at(b, at)
                    .map_err(|e| Error::io("write", &image_path, e))?;
                written += want as u64;
            }
            at += want as u64;
            self.progress.moved(want as u64);
            self.progress.advance(0, at)?;
        }
        image
            .sync_all()
            .map_err(|e| Error::io("sync", &image_path, e))?;
        let content = if written == 0 {
            drop(image);
            let _ = self.store.dir.remove_file(IMAGE);
            Content::Empty
        } else {
            Content::Device
        };
        let mut m = manifest_of(&self.rec, &self.node_id, content);
        m.data_bytes = written;
        Ok(m)
    }

    /// The manifest of a snapshot of files. `source`: the source's root when nothing can
    /// have changed it since the copy (it gives the data extents of files with holes).
    fn manifest(
        &self,
        fs: Option<FsType>,
        entries: &[Entry],
        source: Option<std::os::fd::BorrowedFd<'_>>,
        freeze_seconds: Option<f64>,
    ) -> Result<Manifest> {
        let mut m = manifest_of(&self.rec, &self.node_id, Content::Files);
        m.fs_type = fs.map(|f| f.as_str().to_owned());
        m.freeze_seconds = freeze_seconds;
        let streams = crate::volume::copy::Streams {
            count: crate::volume::copy::STREAMS,
            progress: Some(&self.progress),
        };
        let how = (self.rec.checksums, self.base.as_deref());
        m.list(entries, &self.store.tree, how, source, streams)?;
        Ok(m)
    }

    /// The manifest written (the snapshot is ready on its store), then this node's record.
    fn publish(&self, m: &Manifest) -> Result<()> {
        let digest = m.write(&self.store.dir)?;
        let ready = Record {
            ready: true,
            manifest_sha256: Some(digest),
            ..self.rec.clone()
        };
        store_record(&self.record_path, &ready)?;
        let _ = std::fs::remove_file(self.progress.path());
        tracing::info!(snapshot = %self.rec.name, snapshot_id = %self.rec.id,
            content = m.content.as_str(), entries = m.entries.len(), data_bytes = m.data_bytes,
            written_bytes = m.written_bytes, base = m.base_snapshot_id.as_deref(), "snapshot ready");
        Ok(())
    }
}

/// The manifest of the snapshot `head` records, before its content is listed.
fn manifest_of(head: &Record, source_node: &str, content: Content) -> Manifest {
    Manifest {
        format: manifest::FORMAT,
        snapshot_id: head.id.clone(),
        name: head.name.clone(),
        source_volume_id: head.source_volume_id.raw(),
        source_node: source_node.to_owned(),
        created_secs: head.created_secs,
        created_nanos: head.created_nanos,
        content,
        fs_type: None,
        size_bytes: head.size_bytes,
        data_bytes: 0,
        freeze_seconds: None,
        base_snapshot_id: None,
        written_bytes: None,
        entries: Vec::new(),
    }
}

/// The directory `at`, opened once and proven to be the root of device `dev`'s mount.
fn open_mount_of(at: &Path, (major, minor): (u32, u32)) -> Result<OwnedFd> {
    let root = open_dir(at)?;
    let st = nix::sys::stat::fstat(root.as_fd()).map_err(|e| Error::io("stat", at, e.into()))?;
    if st.st_dev != nix::sys::stat::makedev(major.into(), minor.into()) {
        return Err(SnapshotError::SourceMoved {
            path: at.display().to_string(),
            what: "mount",
        }
        .into());
    }
    Ok(root)
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open", path, e.into()))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::from(SnapshotError::Stopped {
            what: "the snapshot's copy".into(),
            cause: e.to_string(),
        })
    })?
}

/// The snapshot's directory removed from its store: the manifest first (a snapshot half
/// removed is never listed as ready), then its tree as a job a retry joins (one round trip
/// per entry: a tree of many files outlasts a call), then the rest, the snapshot-id file
/// last (a removal cut short at any point leaves a directory this snapshot's id file still
/// claims, so the retry may go on). Each component is walked without following a symlink
/// (a symlink in it is removed itself, never what it points to), and only a directory that
/// is this snapshot's (`SnapshotDir::owner`) is touched.
pub(super) async fn remove_snapshot_dir(ctx: &Context<'_>, id: &SnapshotId) -> Result<()> {
    let what = format!("removing the snapshot on {}", id.location());
    let ours = ctx
        .on_store(id, &what, remove_in_dir(id, &[manifest::FILE]))
        .await?;
    if !ours {
        return Ok(());
    }
    let tree = ctx.store_path(id, TREE).await?;
    let key = format!("remove:{}", id.location());
    let removals = &ctx.snapshots.removals;
    removals
        .remove_tree(&key, &what, tree, ctx.store_wait(id)?)
        .await
        .map_err(|e| ctx.unreachable_unless_waiting(id, e))?;
    ctx.on_store(id, &what, remove_in_dir(id, &[IMAGE])).await?;
    ctx.on_store(id, &what, move |root, rel| {
        fsops::remove_tree(root, rel, &Default::default())
            .map_err(|e| fs_error(format!("removing {rel}"), e))
    })
    .await
}

/// Removes `names` from the snapshot `id`'s directory when that directory is this
/// snapshot's: whether it is (false: there is none; someone else's: refused).
fn remove_in_dir(
    id: &SnapshotId,
    names: &'static [&'static str],
) -> impl FnOnce(&Path, &str) -> Result<bool> + Send + 'static {
    let (text, shown) = (id.to_string(), id.location());
    move |root, rel| {
        let Some(dir) = SnapshotDir::open(root, rel, &shown)? else {
            return Ok(false);
        };
        if let Owner::Foreign(why) = dir.owner(&text, None)? {
            return Err(StoreError::Foreign {
                path: shown,
                id: text,
                why,
            }
            .into());
        }
        for name in names {
            dir.remove_file(name)?;
        }
        Ok(true)
    }
}

/// Mounts a killed driver left in the snapshot's private directory, taken down.
pub(super) async fn take_down_leftovers(ctx: &Context<'_>, rec: &Record) -> Result<()> {
    let work = ctx.snapshots.work.join(short_hash(&rec.name));
    if !work.exists() {
        return Ok(());
    }
    private::take_down(ctx.host.as_ref(), &work, "source").await?;
    let _ = std::fs::remove_dir(work.join("source"));
    let _ = std::fs::remove_dir(&work);
    Ok(())
}
