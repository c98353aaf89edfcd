//! The stripe figures (docs/benchmarks.md): O_DIRECT sequential read with fio (Debian's) through a file on
//! a volume of 1 drive (a partition volume), a stripe of 2 and a stripe of 4, each drive
//! throttled by QEMU to the same bandwidth. Runs interleave the volumes, so drift on the
//! host hits all alike; the table gives medians and the ratio to one drive.

use super::{ensure, sh, vm_common, Result, Rig, MIB};

const FILE_MIB: i64 = 96;
const REQUESTS: [&str; 2] = ["1M", "16M"];
const IODEPTH: u32 = 8;

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One fio run: read bandwidth in MiB/s (terse v3 field 7 is the read bandwidth in KiB/s).
fn fio(file: &str, bs: &str, seconds: u64) -> Result<f64> {
    fio_at(file, bs, IODEPTH, seconds)
}

fn fio_at(file: &str, bs: &str, iodepth: u32, seconds: u64) -> Result<f64> {
    let out = sh(&format!(
        "fio --name=seqread --filename={file} --rw=read --bs={bs} --direct=1 --ioengine=libaio \
         --iodepth={iodepth} --runtime={seconds} --time_based --output-format=terse --terse-version=3"
    ))?;
    let kib: f64 = out
        .lines()
        .last()
        .and_then(|l| l.split(';').nth(6))
        .ok_or_else(|| format!("fio printed no terse line: {out}"))?
        .parse()?;
    ensure(kib > 0.0, format!("fio read nothing from {file}"))?;
    Ok(kib / 1024.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub async fn bench(r: &mut Rig) -> Result<String> {
    let runs = env_or("FIO_RUNS", 3).max(1) as usize;
    let seconds = env_or("FIO_SECONDS", 2).max(1);
    let mut vols = Vec::new();
    for count in ["1", "2", "4"] {
        let v = r
            .create(&format!("fio-{count}"), count, "ext4", 128 * MIB)
            .await?;
        vm_common::stage(&mut r.c, &v).await?;
        let file = v.staging.join("seq").display().to_string();
        sh(&format!("dd if=/dev/urandom of={file} bs=1M count={FILE_MIB} oflag=direct conv=fsync status=none"))?;
        let (_, src, _) = vm_common::mountinfo(&v.staging).ok_or("not mounted")?;
        vols.push((count, v, file, src));
    }
    // mibs[request][volume]: one figure per run.
    let mut mibs = vec![vec![Vec::new(); vols.len()]; REQUESTS.len()];
    for _ in 0..runs {
        for (b, bs) in REQUESTS.iter().enumerate() {
            for (i, (_, _, file, _)) in vols.iter().enumerate() {
                mibs[b][i].push(fio(file, bs, seconds)?);
            }
        }
    }
    println!("fio: O_DIRECT sequential read of a {FILE_MIB} MiB file, iodepth {IODEPTH}, libaio, {runs} runs of {seconds} s each, median MiB/s");
    println!("| drives | volume | 1 MiB requests | x one drive | 16 MiB requests | x one drive |");
    println!("|---|---|---|---|---|---|");
    let mut worst = f64::MAX;
    let base: Vec<f64> = mibs.iter_mut().map(|per| median(&mut per[0])).collect();
    for (i, (count, _, _, src)) in vols.iter().enumerate() {
        let n: f64 = count.parse()?;
        let mut row = format!("| {count} | {src} |");
        for (b, per) in mibs.iter_mut().enumerate() {
            let m = median(&mut per[i]);
            let ratio = m / base[b];
            worst = worst.min(ratio / n);
            row += &format!(" {m:.0} | {ratio:.2} |");
        }
        println!("{row}");
    }
    for (_, v, _, _) in &vols {
        vm_common::unstage(&mut r.c, v).await?;
        vm_common::delete(&mut r.c, v).await?;
    }
    Ok(format!("lowest ratio / N: {worst:.2} (goal 0.9)"))
}

/// The default chunk against others (`FIO_CHUNKS="128K 512K 1M"`): a 4-drive stripe per
/// chunk, read with 1 MiB and 16 MiB requests at iodepth 1 (one request at a time, as a
/// synchronous `cuFileRead` issues them) and 8, interleaved; medians in MiB/s.
pub async fn chunks(r: &mut Rig, chunks: &[String]) -> Result<String> {
    let runs = env_or("FIO_RUNS", 3).max(1) as usize;
    let seconds = env_or("FIO_SECONDS", 2).max(1);
    let mut vols = Vec::new();
    for chunk in chunks {
        let name = format!("chunk-{}", chunk.to_lowercase());
        let v = r
            .create_chunked(&name, "4", chunk, "ext4", 128 * MIB)
            .await?;
        vm_common::stage(&mut r.c, &v).await?;
        let file = v.staging.join("seq").display().to_string();
        sh(&format!("dd if=/dev/urandom of={file} bs=1M count={FILE_MIB} oflag=direct conv=fsync status=none"))?;
        vols.push((chunk, v, file));
    }
    let cases: Vec<(&str, u32)> = [("1M", 1), ("1M", 8), ("16M", 1), ("16M", 8)].to_vec();
    let mut mibs = vec![vec![Vec::new(); cases.len()]; vols.len()];
    for _ in 0..runs {
        for (c, (bs, depth)) in cases.iter().enumerate() {
            for (i, (_, _, file)) in vols.iter().enumerate() {
                mibs[i][c].push(fio_at(file, bs, *depth, seconds)?);
            }
        }
    }
    println!("fio by chunk: 4-drive stripes, O_DIRECT sequential read of a {FILE_MIB} MiB file, {runs} runs of {seconds} s, median MiB/s");
    println!("| chunk | 1 MiB, depth 1 | 1 MiB, depth 8 | 16 MiB, depth 1 | 16 MiB, depth 8 |");
    println!("|---|---|---|---|---|");
    let mut summary = Vec::new();
    for (i, (chunk, _, _)) in vols.iter().enumerate() {
        let m: Vec<f64> = mibs[i].iter_mut().map(|per| median(per)).collect();
        println!(
            "| {chunk} | {:.0} | {:.0} | {:.0} | {:.0} |",
            m[0], m[1], m[2], m[3]
        );
        summary.push(format!(
            "{chunk}: {:.0}/{:.0}/{:.0}/{:.0}",
            m[0], m[1], m[2], m[3]
        ));
    }
    for (_, v, _) in &vols {
        vm_common::unstage(&mut r.c, v).await?;
        vm_common::delete(&mut r.c, v).await?;
    }
    Ok(format!(
        "MiB/s at 1M d1/1M d8/16M d1/16M d8: {}",
        summary.join("; ")
    ))
}
