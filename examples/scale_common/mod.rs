//! What the scale benchmarks share (examples/scale.rs on loop devices, examples/scale_nfs.rs
//! in process): the CSI calls of one volume with the kubelet's paths, the fill, the
//! measured round, samples and their percentiles, /proc readings, and the table with the
//! ratio of the largest count to the smallest.
// Each example uses only part of this.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gds_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use gds_csi::csi::Clients;
use gds_csi::csi::*;
use serde::{Deserialize, Serialize};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

pub const MIB: u64 = 1 << 20;
/// Creates in flight while a node is filled.
const FILL_CALLS: usize = 8;

pub fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// A volume as the kubelet handles it: its id, its context, its staging and target paths.
#[derive(Clone)]
pub struct Vol {
    pub id: String,
    pub context: HashMap<String, String>,
    pub staging: PathBuf,
    pub target: PathBuf,
}

/// CreateVolume of `bytes`; the kubelet's paths for it under `dir` (named after `name`).
pub async fn create(
    c: &mut Clients,
    dir: &Path,
    name: &str,
    bytes: u64,
    params: &HashMap<String, String>,
) -> Result<Vol> {
    let v = c
        .controller
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![cap()],
            parameters: params.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .ok_or("CreateVolume answered no volume")?;
    Ok(Vol {
        id: v.volume_id,
        context: v.volume_context,
        staging: dir.join("staging").join(name),
        target: dir.join("pods").join(name),
    })
}

pub async fn stage(c: &mut Clients, v: &Vol) -> Result<()> {
    // The kubelet makes the staging directory; the driver makes the target.
    std::fs::create_dir_all(&v.staging)?;
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: path_str(&v.staging)?,
            volume_capability: Some(cap()),
            volume_context: v.context.clone(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

pub async fn publish(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: path_str(&v.staging)?,
            target_path: path_str(&v.target)?,
            volume_capability: Some(cap()),
            volume_context: v.context.clone(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

pub async fn unpublish(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: path_str(&v.target)?,
        })
        .await?;
    Ok(())
}

pub async fn unstage(c: &mut Clients, v: &Vol) -> Result<()> {
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: path_str(&v.staging)?,
        })
        .await?;
    Ok(())
}

pub async fn delete(c: &mut Clients, id: &str) -> Result<()> {
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

fn path_str(p: &Path) -> Result<String> {
    Ok(p.to_str().ok_or("a path that is not UTF-8")?.to_owned())
}

/// `count` volumes of `bytes` named `fill-<i>`, a few calls at a time.
pub async fn fill(
    c: &Clients,
    dir: &Path,
    count: usize,
    bytes: u64,
    params: &HashMap<String, String>,
) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..FILL_CALLS {
        let (mut c, dir, params) = (c.clone(), dir.to_owned(), params.clone());
        tasks.spawn(async move {
            for i in (t..count).step_by(FILL_CALLS) {
                create(&mut c, &dir, &format!("fill-{i}"), bytes, &params).await?;
            }
            Ok::<(), Error>(())
        });
    }
    while let Some(t) = tasks.join_next().await {
        t??;
    }
    Ok(())
}

/// One measured round: CreateVolume of `bytes`, NodeStage, NodePublish, (unpublished and
/// unstaged untimed) DeleteVolume, every page of ListVolumes and GetCapacity.
pub async fn round(
    c: &mut Clients,
    f: &mut Figures,
    dir: &Path,
    r: usize,
    bytes: u64,
    params: &HashMap<String, String>,
) -> Result<()> {
    let began = Instant::now();
    let v = create(c, dir, &format!("round-{r}"), bytes, params).await?;
    f.add("CreateVolume", began.elapsed());
    let began = Instant::now();
    stage(c, &v).await?;
    f.add("NodeStageVolume", began.elapsed());
    let began = Instant::now();
    publish(c, &v).await?;
    f.add("NodePublishVolume", began.elapsed());
    unpublish(c, &v).await?;
    unstage(c, &v).await?;
    let began = Instant::now();
    delete(c, &v.id).await?;
    f.add("DeleteVolume", began.elapsed());
    let mut token = String::new();
    loop {
        let began = Instant::now();
        let page = c
            .controller
            .list_volumes(ListVolumesRequest {
                max_entries: 100,
                starting_token: token,
            })
            .await?
            .into_inner();
        f.add("ListVolumes (a page of 100)", began.elapsed());
        token = page.next_token;
        if token.is_empty() {
            break;
        }
    }
    let began = Instant::now();
    c.controller
        .get_capacity(GetCapacityRequest {
            parameters: params.clone(),
            ..Default::default()
        })
        .await?;
    f.add("GetCapacity", began.elapsed());
    Ok(())
}

/// Samples of each timed figure (ms) and single values, each in the order first added
/// (the order printed). Serialisable: the NFS benchmark measures each count in a child.
#[derive(Default, Serialize, Deserialize)]
pub struct Figures {
    samples: Vec<(String, Vec<f64>)>,
    values: Vec<(String, f64)>,
}

impl Figures {
    pub fn add(&mut self, what: &str, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        match self.samples.iter_mut().find(|(w, _)| w == what) {
            Some((_, v)) => v.push(ms),
            None => self.samples.push((what.to_owned(), vec![ms])),
        }
    }

    pub fn value(&mut self, what: &str, v: f64) {
        self.values.push((what.to_owned(), v));
    }

    pub fn pct(&self, what: &str, p: f64) -> f64 {
        self.samples
            .iter()
            .find(|(w, _)| w == what)
            .map_or(f64::NAN, |(_, v)| pct(v, p))
    }

    fn get(&self, what: &str) -> f64 {
        self.values
            .iter()
            .find(|(w, _)| w == what)
            .map_or(f64::NAN, |(_, v)| *v)
    }
}

/// The `p` quantile (0..=1) of `v`, nearest rank.
pub fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub fn ms_of(d: &[Duration]) -> Vec<f64> {
    d.iter().map(|d| d.as_secs_f64() * 1e3).collect()
}

/// A markdown table: a column per count (p50 and p99 of each call, ms; the values), and
/// the ratio of the largest count's figure to the smallest's.
pub fn print_table(all: &[(usize, Figures)]) {
    let (Some((n0, first)), Some((n1, last))) = (all.first(), all.last()) else {
        return;
    };
    print!("| figure |");
    for (n, _) in all {
        print!(" {n} volumes: p50 (p99) |");
    }
    println!(" ratio {n1} / {n0} |");
    println!("|---|{}---|", "---|".repeat(all.len()));
    for (what, _) in &first.samples {
        print!("| {what}, ms |");
        for (_, f) in all {
            print!(" {:.2} ({:.2}) |", f.pct(what, 0.5), f.pct(what, 0.99));
        }
        println!(" {:.2} |", last.pct(what, 0.5) / first.pct(what, 0.5));
    }
    for (what, _) in &first.values {
        print!("| {what} |");
        for (_, f) in all {
            print!(" {:.1} |", f.get(what));
        }
        println!(" {:.2} |", last.get(what) / first.get(what));
    }
}

/// A field of /proc/PID/status in its first unit (kB for memory), 0 if unreadable.
fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> u64 {
    status_field(pid, "VmRSS")
}

pub fn threads(pid: u32) -> u64 {
    status_field(pid, "Threads")
}

pub fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// The driver's state under `dir` as (bytes in its files, bytes allocated on disk,
/// directories included), in KiB. `nfs-exports` is left out: there the in-process NFS
/// benchmark keeps what stands in for the server's export.
pub fn state_kib(dir: &Path) -> (f64, f64) {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut disk) = (0u64, 0u64);
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            disk += m.blocks() * 512;
            if m.is_dir() {
                if e.file_name() != "nfs-exports" {
                    todo.push(e.path());
                }
            } else {
                bytes += m.len();
            }
        }
    }
    (bytes as f64 / 1024.0, disk as f64 / 1024.0)
}

/// Adds the state's rows to `f`.
pub fn add_state(f: &mut Figures, dir: &Path) {
    let (bytes, disk) = state_kib(dir);
    f.value("state, in its files (KiB)", bytes);
    f.value("state, allocated on disk (KiB)", disk);
}

/// COUNTS as `10,100,1000`.
pub fn parse_counts(text: &str) -> Result<Vec<usize>> {
    let counts: Vec<usize> = text
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    if counts.is_empty() {
        return Err("no counts".into());
    }
    Ok(counts)
}
