//! Section p of the benchmark: the `partition` layout against whole devices,
//! run against a driver of its own (scripts/bench.sh starts it on its own pool, so best
//! fit cannot carve the devices the other sections hand out whole).
//!
//! - `p1` (pool: one 64 MiB device, one fully written 1030 MiB device): O_DIRECT read
//!   through a file on a partition volume vs the raw partition; CreateVolume/DeleteVolume
//!   p50/p99 of partitions vs whole devices, interleaved; 64 creates on the one device.
//! - `p4` (pool: four devices of 16 volumes each): 64 creates spread over four devices.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{
    create_with, delete, pct, publish, read_direct, source_of, stage, teardown, write_direct, yes,
    Result, Table, Vol, MIB, READ_BYTES,
};
use gds_csi::csi::Clients;

fn part() -> Vec<(&'static str, &'static str)> {
    vec![("layout", "partition")]
}

/// Create then delete, `rounds` times each for partitions and whole devices, interleaved
/// so both see the same machine; p99 is nearest-rank (with 100 samples, the 99th).
pub async fn lifecycle(c: &mut Clients, work: &Path, rounds: usize, t: &mut Table) -> Result<()> {
    let (mut pc, mut pd, mut wc, mut wd) = (vec![], vec![], vec![], vec![]);
    for r in 0..rounds {
        let s = Instant::now();
        let v = create_with(
            c,
            work,
            &format!("pl-{r}"),
            (64 * MIB, 64 * MIB),
            "ext4",
            &part(),
        )
        .await?;
        pc.push(s.elapsed());
        let s = Instant::now();
        delete(c, &v).await?;
        pd.push(s.elapsed());
        let s = Instant::now();
        let v = create_with(
            c,
            work,
            &format!("wl-{r}"),
            (40 * MIB, 64 * MIB),
            "ext4",
            &[],
        )
        .await?;
        wc.push(s.elapsed());
        let s = Instant::now();
        delete(c, &v).await?;
        wd.push(s.elapsed());
    }
    let fmt = |s: &[Duration]| format!("p50 {:.1} ms, p99 {:.1} ms", pct(s, 50.0), pct(s, 99.0));
    for (what, s) in [
        ("CreateVolume, partition 64 MiB", &pc),
        ("CreateVolume, whole 64 MiB device", &wc),
        (
            "DeleteVolume, partition 64 MiB (wipe + discard + label)",
            &pd,
        ),
        ("DeleteVolume, whole 64 MiB device (wipefs)", &wd),
    ] {
        t.row(format!("p. {what}, {rounds} samples"), fmt(s), "", "");
    }
    Ok(())
}

/// `n` creates of 16 MiB partitions one after another (each timed), all deleted, then
/// `n` at once (wall time), all deleted.
pub async fn storm(
    c: &mut Clients,
    work: &Path,
    n: usize,
    devices: usize,
    t: &mut Table,
) -> Result<()> {
    let range = (16 * MIB, 16 * MIB);
    let mut serial = Duration::ZERO;
    let mut vols = Vec::new();
    for i in 0..n {
        let s = Instant::now();
        vols.push(
            create_with(
                c,
                work,
                &format!("ps-{devices}-{i}"),
                range,
                "ext4",
                &part(),
            )
            .await?,
        );
        serial += s.elapsed();
    }
    for v in &vols {
        delete(c, v).await?;
    }
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (mut c, work) = (c.clone(), work.to_path_buf());
        set.spawn(async move {
            create_with(
                &mut c,
                &work,
                &format!("pc-{devices}-{i}"),
                range,
                "ext4",
                &part(),
            )
            .await
        });
    }
    let mut vols = Vec::new();
    while let Some(r) = set.join_next().await {
        vols.push(r??);
    }
    let wall = start.elapsed();
    for v in &vols {
        delete(c, v).await?;
    }
    t.row(
        format!("p. {n} partition creates (16 MiB) on {devices} loop device(s) at once"),
        format!(
            "wall {:.0} ms vs serial sum {:.0} ms = {:.2} x",
            wall.as_secs_f64() * 1e3,
            serial.as_secs_f64() * 1e3,
            wall.as_secs_f64() / serial.as_secs_f64()
        ),
        "",
        "",
    );
    Ok(())
}

/// O_DIRECT 1 MiB sequential read of a file on a mounted partition volume vs the raw
/// partition device; best of 5 each, alternating.
pub async fn reads(c: &mut Clients, work: &Path, t: &mut Table) -> Result<()> {
    let v: Vol = create_with(c, work, "pread", (400 * MIB, 400 * MIB), "ext4", &part()).await?;
    stage(c, &v).await?;
    publish(c, &v).await?;
    let result = async {
        let device = source_of(&v.staging)?;
        let file = v.target.join("bench.dat");
        write_direct(&file, READ_BYTES)?;
        let (mut best_fs, mut best_raw) = (0f64, 0f64);
        for _ in 0..5 {
            best_fs = best_fs.max(read_direct(&file, READ_BYTES)?);
            best_raw = best_raw.max(read_direct(&device, READ_BYTES)?);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((device, best_fs, best_raw))
    }
    .await;
    teardown(c, &v).await?;
    let (device, through_fs, raw) = result?;
    let ratio = through_fs / raw;
    t.row(
        format!(
            "p. O_DIRECT 1 MiB seq. read, 256 MiB, ext4 on a partition volume vs raw {}",
            device.display()
        ),
        format!("{through_fs:.0} vs {raw:.0} MiB/s = {ratio:.2} x"),
        ">= 0.95 x",
        yes(ratio >= 0.95),
    );
    Ok(())
}
