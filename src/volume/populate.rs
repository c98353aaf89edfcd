//! `gds-csi populate`: a claim's volume filled with a Dataset's tree, run by the populator's
//! pod on the node the claim's volume was made on (the volume mounted at `target`, the
//! dataset at `source`). The copy is the engine every fill uses (resume from its record,
//! verification, progress); its progress goes to stdout as one JSON line every
//! `--every`, the last line saying how it ended, which the populator reads from the pod's
//! log to fill the Dataset's status and the claim's events.
//!
//! Two sources: a directory beneath the node's dataset root, opened one component at a
//! time without following a symlink; or an NFS export, mounted read-only in the pod the
//! way a clone's fill mounts its NFS source (`fill::mount::SourceMount::Nfs`: soft, its
//! transport verified, `proto=rdma` by default) and taken down after the copy.
//!
//! The record lives beside the volume, not in it (a file of ours in the tree would be
//! copied into the user's data): a pod killed mid-copy is replaced by one that resumes
//! from it; a finished copy removes it.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{CloneError, Error, Result};
use crate::os::Host;
use crate::request::NfsVolumeId;
use crate::runtime::config::PopulateArgs;
use crate::volume::block::fill::mount::SourceMount;
use crate::volume::copy::measure::{measure, Measured};
use crate::volume::copy::{
    copy_tree_at, open_root, walk, CopyRequest, Progress, Saved, Verify, CHUNK, STREAMS,
};
use crate::volume::mounts::private::{clean_copy_dir, pin, unmount_retrying};

/// Where the Dataset is.
#[derive(Debug, Clone)]
pub enum DatasetAt {
    /// `path` beneath `root` (the node's dataset root): nothing on the way is followed,
    /// so a symlink planted there cannot send the copy elsewhere on the host.
    Node { root: PathBuf, path: PathBuf },
    /// An NFS directory, mounted at `<work>/source` for the copy.
    Nfs { id: NfsVolumeId, work: PathBuf },
}

/// What `populate` is asked to do.
#[derive(Debug, Clone)]
pub struct Populate {
    pub from: DatasetAt,
    pub target: PathBuf,
    pub record: PathBuf,
    pub verify: Verify,
    /// How the source is named in messages (`<namespace>/<dataset>`).
    pub label: String,
    pub every: Duration,
}

/// One progress line. `phase` is `Measuring`, `Copying`, `Done` or `Failed`; a failure
/// says what to do in `message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub phase: String,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    pub entries: usize,
    pub bytes_per_second: u64,
    pub message: String,
}

/// `gds-csi populate`: the Dataset named on the command line copied into --target.
pub async fn main(args: &PopulateArgs) -> std::result::Result<(), String> {
    let verify = match args.verify.as_str() {
        "checksum" => Verify::Checksum,
        _ => Verify::Sizes,
    };
    let from = match (&args.source, &args.work) {
        (Some(root), _) => DatasetAt::Node {
            root: root.clone(),
            path: args.path.clone(),
        },
        (None, Some(work)) => match nfs_dataset(args) {
            Ok(id) => DatasetAt::Nfs {
                id,
                work: work.clone(),
            },
            // Said as a report too: the populator reads the reason from the log.
            Err(m) => {
                emit(&report("Failed", 0, 0, 0, 0, m.clone()));
                return Err(m);
            }
        },
        (None, None) => return Err("--source or --nfs-server with --work is needed".into()),
    };
    let p = Populate {
        from,
        target: args.target.clone(),
        record: args.record.clone(),
        verify,
        label: args.label.clone(),
        every: args.every,
    };
    let host = Arc::new(crate::os::RealHost {
        command_timeout: Duration::from_secs(300),
        mount_timeout: Duration::from_secs(60),
    });
    run(&p, host).await.map_err(|e| e.to_string())
}

/// The NFS source of --nfs-*, by the rules of a class's `dataset*` parameters.
fn nfs_dataset(args: &PopulateArgs) -> std::result::Result<NfsVolumeId, String> {
    use crate::request::dataset::{parse_dir, DATASET_RESOURCE};
    let given = [
        ("server", &args.nfs_server),
        ("share", &args.nfs_share),
        ("path", &args.nfs_path),
        ("proto", &args.nfs_proto),
        ("port", &args.nfs_port),
        ("vers", &args.nfs_vers),
    ];
    let map = given
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| ((*k).to_owned(), v.clone())))
        .collect();
    match parse_dir(&map, &DATASET_RESOURCE) {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err("--nfs-server, --nfs-share and --nfs-path are needed".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs the copy, printing a [`Report`] line every `every` and a last one (Done or
/// Failed). The outcome is also the exit status.
pub async fn run(p: &Populate, host: Arc<dyn Host>) -> Result<()> {
    // A run after one cut short says how far the last got: the copy resumes from there.
    let (before, total) =
        Saved::load(&p.record)?.map_or((0, 0), |s| (s.copied_bytes, s.total_bytes));
    let m = match before {
        0 => "measuring the dataset".to_owned(),
        b => format!("measuring the dataset; resuming after {b} bytes copied before"),
    };
    emit(&report("Measuring", before, total, 0, 0, m));
    let outcome = match &p.from {
        DatasetAt::Node { root, path } => {
            copy_blocking(p, (root.clone(), path.clone()), None).await
        }
        DatasetAt::Nfs { id, work } => copy_from_nfs(p, host.as_ref(), id, work).await,
    };
    match &outcome {
        Ok(m) => emit(&report(
            "Done",
            m.data_bytes,
            m.data_bytes,
            m.entries,
            0,
            format!("filled with {} and verified", p.label),
        )),
        Err(e) => emit(&report("Failed", 0, 0, 0, 0, e.to_string())),
    }
    outcome.map(drop)
}

/// The export mounted read-only at `<work>/source` (a mount a killed run left there taken
/// down first), the copy, and the mount taken down whatever the outcome.
async fn copy_from_nfs(
    p: &Populate,
    host: &dyn Host,
    id: &NfsVolumeId,
    work: &Path,
) -> Result<Measured> {
    clean_copy_dir(host, work).await?;
    let at = pin(work, "source")?;
    let from = SourceMount::Nfs {
        id: id.clone(),
        label: p.label.clone(),
    };
    from.mount(host, &at).await?;
    let copied = copy_blocking(p, (at.path().to_owned(), ".".into()), Some(from)).await;
    let unmounted = unmount_retrying(host, &at).await;
    let m = copied?;
    unmounted.map(|()| m)
}

/// The measure and the copy, off the async runtime (every entry is a system call). A
/// read of an NFS source that timed out is said so (`SourceMount::explain`).
async fn copy_blocking(
    p: &Populate,
    (root, path): (PathBuf, PathBuf),
    nfs: Option<SourceMount>,
) -> Result<Measured> {
    let p = p.clone();
    tokio::task::spawn_blocking(move || {
        let m = measure_and_check(&p, &root, &path)?;
        copy(&p, (&root, &path), &m, nfs.as_ref())
    })
    .await
    .map_err(|e| crate::error::CloneError::CopyStopped(e.to_string()))?
}

fn report(phase: &str, copied: u64, total: u64, entries: usize, rate: u64, m: String) -> Report {
    Report {
        phase: phase.into(),
        copied_bytes: copied,
        total_bytes: total,
        entries,
        bytes_per_second: rate,
        message: m,
    }
}

fn emit(r: &Report) {
    if let Ok(line) = serde_json::to_string(r) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// The dataset measured and compared with the room the volume has: a dataset larger
/// than the volume can hold is refused before a byte is written, naming the size to ask
/// for. What an earlier run recorded as copied counts as room (it is rewritten in place).
fn measure_and_check(p: &Populate, root: &Path, path: &Path) -> Result<Measured> {
    let m = measure(root, path)?;
    let st = nix::sys::statvfs::statvfs(&p.target)
        .map_err(|e| Error::io("statvfs", &p.target, e.into()))?;
    let frsize = st.fragment_size() as u64;
    let copied = Saved::load(&p.record)?.map_or(0, |s| s.copied_bytes);
    let room = (st.blocks_available() as u64 * frsize).saturating_add(copied);
    // `needed_bytes` is a volume size: the files' blocks and a sixteenth for the
    // filesystem's own metadata, which a mounted filesystem's free space already left out.
    let blocks = m.needed_bytes / 16 * 15;
    if blocks > room {
        return Err(CloneError::DatasetTooLarge {
            label: p.label.clone(),
            data_bytes: m.data_bytes,
            entries: m.entries,
            needed: m.needed_bytes,
            free: room,
        }
        .into());
    }
    Ok(m)
}

fn copy(
    p: &Populate,
    (root, path): (&Path, &Path),
    m: &Measured,
    nfs: Option<&SourceMount>,
) -> Result<Measured> {
    let shown = root.join(path);
    let root = open_root(root)?;
    let src = walk::open_dir(root.as_fd(), path)
        .map_err(|e| Error::io("open directory", &shown, e.into()))?;
    let dst = open_root(&p.target)?;
    let req = CopyRequest {
        source: shown,
        target: p.target.clone(),
        label: p.label.clone(),
        streams: STREAMS,
        chunk: CHUNK,
        verify: p.verify,
        live: false,
        target_reused: true,
        base: None,
        extents: None,
    };
    let progress = Progress::new(p.record.clone(), p.label.clone());
    let done = AtomicBool::new(false);
    let copied = std::thread::scope(|s| {
        s.spawn(|| report_every(p.every, &progress, m, &done));
        let copied = copy_tree_at(src.as_fd(), dst.as_fd(), &req, &progress);
        done.store(true, Ordering::Relaxed);
        copied
    });
    copied.map_err(|e| match nfs {
        Some(from) => from.explain(e, &progress),
        None => e,
    })?;
    match std::fs::remove_file(&p.record) {
        Ok(()) => Ok(*m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(*m),
        Err(e) => Err(Error::io("remove", &p.record, e)),
    }
}

/// A `Copying` line every `every` until `done`, checked every 100 ms.
fn report_every(every: Duration, progress: &Progress, m: &Measured, done: &AtomicBool) {
    let tick = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        waited += tick;
        if waited < every {
            continue;
        }
        waited = Duration::ZERO;
        let secs = progress.elapsed().max(0.001);
        let rate = (progress.written.load(Ordering::Relaxed) as f64 / secs) as u64;
        let total = progress.total_bytes().max(m.data_bytes);
        emit(&report(
            "Copying",
            progress.copied_bytes(),
            total,
            m.entries,
            rate,
            progress.message(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn run_here(p: &Populate) -> Result<()> {
        let host: Arc<dyn Host> = Arc::new(crate::os::RealHost {
            command_timeout: Duration::from_secs(60),
            mount_timeout: Duration::from_secs(60),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(p, host))
    }

    fn request(root: &std::path::Path, path: &str, target: &std::path::Path) -> Populate {
        Populate {
            from: DatasetAt::Node {
                root: root.to_owned(),
                path: path.into(),
            },
            target: target.to_owned(),
            record: root.join("record.json"),
            verify: Verify::Checksum,
            label: "ml/ds".into(),
            every: Duration::from_millis(50),
        }
    }

    #[test]
    fn the_tree_beneath_the_root_is_copied_verified_and_its_record_removed() {
        let (root, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ds = root.path().join("ds/train");
        std::fs::create_dir_all(&ds).unwrap();
        std::fs::write(ds.join("a"), vec![7u8; 300_000]).unwrap();
        std::os::unix::fs::symlink("a", ds.join("l")).unwrap();
        let p = request(root.path(), "ds", target.path());
        run_here(&p).unwrap();
        assert_eq!(
            std::fs::read(target.path().join("train/a")).unwrap(),
            vec![7u8; 300_000]
        );
        assert_eq!(
            std::fs::read_link(target.path().join("train/l")).unwrap(),
            PathBuf::from("a")
        );
        assert!(!p.record.exists());
    }

    #[test]
    fn a_symlink_on_the_way_to_the_dataset_is_not_followed() {
        let (root, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"host file").unwrap();
        std::os::unix::fs::symlink(host.path(), root.path().join("planted")).unwrap();
        for path in ["planted", "planted/."] {
            let e = run_here(&request(root.path(), path, target.path())).unwrap_err();
            assert!(matches!(e, Error::Io { .. }), "{path}: {e}");
        }
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_dataset_larger_than_the_volume_is_refused_before_a_byte_is_written() {
        use nix::mount::{mount, umount, MsFlags};
        let (root, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // A 1 MiB filesystem as the claim's volume (root only, as the fill pod runs).
        let small = mount(
            Some("tmpfs"),
            target.path(),
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1m"),
        );
        if small.is_err() {
            panic!("mounting a tmpfs needs root: {small:?}");
        }
        std::fs::write(root.path().join("big"), vec![1u8; 3 << 20]).unwrap();
        let outcome = run_here(&request(root.path(), ".", target.path()));
        let listed = std::fs::read_dir(target.path()).unwrap().count();
        umount(target.path()).unwrap();
        let e = outcome.unwrap_err().to_string();
        assert!(e.contains("ask for at least") && e.contains("ml/ds"), "{e}");
        assert_eq!(listed, 0);
    }
}
