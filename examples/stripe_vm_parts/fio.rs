//! The stripe figures (docs/benchmarks.md): O_DIRECT sequential read with fio (Debian's) through a file on
//! a volume of 1 drive (a partition volume), a stripe of 2 and a stripe of 4, each drive
//! throttled by QEMU to the same bandwidth. Runs interleave the volumes, so drift on the
//! host hits all alike; the table gives medians and the ratio to one drive.
//!
//! Beside each stripe, in the same runs, its member partitions read all at once without md
//! (one fio job per member, the same request size and depth): what the rig itself gives N
//! concurrent readers. A stripe passes at N x 0.9 of one drive, or at 0.9 of the rig's own
//! figure (then below N, and the line says the rig is the limit); anything else fails.
//!
//! 1 MiB requests run 8 deep, 16 MiB requests one at a time (a synchronous `cuFileRead`):
//! 8 and 16 MiB in flight. Deeper 16 MiB queues (64-128 MiB in flight, more than the
//! file) measure the emulator's throttled queues, not md: on an idle host a 4-drive
//! stripe reads 394, 385, 364 and 310 MiB/s at depth 1, 2, 4 and 8, and its members read
//! without md fall with it (docs/benchmarks.md); `FIO_CHUNKS` records those depths.

use super::{ensure, sh, vm_common, Result, Rig, MIB};

const FILE_MIB: i64 = 96;
/// Request size and queue depth of each measured column.
const REQUESTS: [(&str, u32); 2] = [("1M", 8), ("16M", 1)];

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One fio run: read bandwidth in MiB/s (terse v3 field 7 is the read bandwidth in KiB/s).
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

/// The devices behind a mounted block device: an md array's members (`slaves` in sysfs),
/// sorted; the device itself for anything else.
fn members(src: &str) -> Vec<String> {
    let name = std::path::Path::new(src)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out: Vec<String> = std::fs::read_dir(format!("/sys/block/{name}/slaves"))
        .map(|rd| {
            rd.flatten()
                .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    if out.is_empty() {
        out.push(src.to_owned());
    }
    out
}

/// One fio job per device, all at once, read-only: their summed read bandwidth in MiB/s
/// (group reporting gives one terse line for the group).
fn fio_parallel(devices: &[String], bs: &str, iodepth: u32, seconds: u64) -> Result<f64> {
    let jobs: String = devices
        .iter()
        .enumerate()
        .map(|(i, d)| format!(" --name=member{i} --filename={d}"))
        .collect();
    let out = sh(&format!(
        "fio --readonly --rw=read --bs={bs} --direct=1 --ioengine=libaio --iodepth={iodepth} \
         --runtime={seconds} --time_based --group_reporting --output-format=terse \
         --terse-version=3{jobs}"
    ))?;
    let kib: f64 = out
        .lines()
        .last()
        .and_then(|l| l.split(';').nth(6))
        .ok_or_else(|| format!("fio printed no terse line: {out}"))?
        .parse()?;
    ensure(kib > 0.0, format!("fio read nothing from {devices:?}"))?;
    Ok(kib / 1024.0)
}

/// A request size cut into `n` shares (`16M` / 4 = `4096k`): what md gives each member of
/// one request.
fn share(bs: &str, n: usize) -> String {
    let kib: usize = match bs.strip_suffix('M') {
        Some(m) => m.parse::<usize>().unwrap_or(1) * 1024,
        None => bs.trim_end_matches('k').parse().unwrap_or(1024),
    };
    format!("{}k", (kib / n.max(1)).max(4))
}

/// A stripe of `n` drives at `ratio` x one drive, where the rig's own `n` readers reach
/// `rig` x one drive: `Ok(note)` when it meets the goal, `Err(why)` when it does not.
fn verdict(n: f64, ratio: f64, rig: f64) -> std::result::Result<String, String> {
    const GOAL: f64 = 0.9;
    if ratio >= GOAL * n {
        return Ok(format!("{:.2} of {n} drives", ratio / n));
    }
    // Below that, 0.9 of what the members give at once without md (then below N x too):
    // the rig, not the stripe, sets the limit.
    if ratio >= GOAL * rig {
        return Ok(format!(
            "{:.2} of {n} drives, the rig's own limit: {n} members read at once without md give \
             {rig:.2} x one drive, the stripe {:.2} of that",
            ratio / n,
            ratio / rig
        ));
    }
    Err(format!(
        "{:.2} of {n} drives (goal {GOAL}); {n} members read at once without md give {rig:.2} x \
         one drive, the stripe {:.2} of that",
        ratio / n,
        ratio / rig
    ))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub async fn bench(r: &mut Rig) -> Result<String> {
    // Five runs: the verdict compares two medians taken on a loaded host.
    let runs = env_or("FIO_RUNS", 5).max(1) as usize;
    let seconds = env_or("FIO_SECONDS", 2).max(1);
    // `FIO_SHARE=0` leaves out the `members, share` columns: figures for the record that
    // no verdict reads (scripts/test.sh saves their runs).
    let with_share = env_or("FIO_SHARE", 1) != 0;
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
    // mibs[request][volume]: one figure per run; raw[request][volume]: the volume's
    // members read at once without md (the 1-drive volume's entry is unused).
    let mut mibs = vec![vec![Vec::new(); vols.len()]; REQUESTS.len()];
    let mut raw = vec![vec![Vec::new(); vols.len()]; REQUESTS.len()];
    // The members read at once with md's share of each request, for the record.
    let mut shared = vec![vec![Vec::new(); vols.len()]; REQUESTS.len()];
    let devices: Vec<Vec<String>> = vols.iter().map(|(_, _, _, src)| members(src)).collect();
    for _ in 0..runs {
        for (b, (bs, depth)) in REQUESTS.iter().enumerate() {
            for (i, (_, _, file, _)) in vols.iter().enumerate() {
                mibs[b][i].push(fio_at(file, bs, *depth, seconds)?);
                if devices[i].len() > 1 {
                    raw[b][i].push(fio_parallel(&devices[i], bs, *depth, seconds)?);
                    if with_share {
                        let part = share(bs, devices[i].len());
                        shared[b][i].push(fio_parallel(&devices[i], &part, *depth, seconds)?);
                    }
                }
            }
        }
    }
    println!("fio: O_DIRECT sequential read of a {FILE_MIB} MiB file, libaio, {runs} runs of {seconds} s each, median MiB/s; `members at once`: the stripe's member partitions read together without md, one job each, with the same request size and depth (`same`) and with md's share of one request (`share`), as x one drive");
    println!("| drives | volume | 1 MiB requests, depth 8 | x one drive | members, same | members, share | 16 MiB requests, depth 1 | x one drive | members, same | members, share |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let base: Vec<f64> = mibs.iter_mut().map(|per| median(&mut per[0])).collect();
    let (mut passed, mut failed) = (Vec::new(), Vec::new());
    for (i, (count, _, _, src)) in vols.iter().enumerate() {
        let n: f64 = count.parse()?;
        let mut row = format!("| {count} | {src} |");
        for (b, (bs, depth)) in REQUESTS.iter().enumerate() {
            let m = median(&mut mibs[b][i]);
            let ratio = m / base[b];
            row += &format!(" {m:.0} | {ratio:.2} |");
            if raw[b][i].is_empty() {
                row += " | |";
                continue;
            }
            let rig = median(&mut raw[b][i]) / base[b];
            let part = if shared[b][i].is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", median(&mut shared[b][i]) / base[b])
            };
            row += &format!(" {rig:.2} | {part} |");
            match verdict(n, ratio, rig) {
                Ok(note) => passed.push(format!("{count} drives, {bs} x{depth}: {note}")),
                Err(why) => failed.push(format!("{count} drives, {bs} x{depth}: {why}")),
            }
        }
        println!("{row}");
    }
    for (_, v, _, _) in &vols {
        vm_common::unstage(&mut r.c, v).await?;
        vm_common::delete(&mut r.c, v).await?;
    }
    if failed.is_empty() {
        Ok(passed.join("; "))
    } else {
        Err(failed.join("; ").into())
    }
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
    let cases: Vec<(&str, u32)> = [
        ("1M", 1),
        ("1M", 8),
        ("16M", 1),
        ("16M", 2),
        ("16M", 4),
        ("16M", 8),
    ]
    .to_vec();
    let mut mibs = vec![vec![Vec::new(); cases.len()]; vols.len()];
    for _ in 0..runs {
        for (c, (bs, depth)) in cases.iter().enumerate() {
            for (i, (_, _, file)) in vols.iter().enumerate() {
                mibs[i][c].push(fio_at(file, bs, *depth, seconds)?);
            }
        }
    }
    println!("fio by chunk: 4-drive stripes, O_DIRECT sequential read of a {FILE_MIB} MiB file, {runs} runs of {seconds} s, median MiB/s");
    let head: Vec<String> = cases
        .iter()
        .map(|(bs, d)| format!("{bs}, depth {d}"))
        .collect();
    println!("| chunk | {} |", head.join(" | "));
    println!("|---|{}", "---|".repeat(cases.len()));
    let mut summary = Vec::new();
    for (i, (chunk, _, _)) in vols.iter().enumerate() {
        let m: Vec<f64> = mibs[i].iter_mut().map(|per| median(per)).collect();
        let cells: Vec<String> = m.iter().map(|v| format!("{v:.0}")).collect();
        println!("| {chunk} | {} |", cells.join(" | "));
        summary.push(format!("{chunk}: {}", cells.join("/")));
    }
    for (_, v, _) in &vols {
        vm_common::unstage(&mut r.c, v).await?;
        vm_common::delete(&mut r.c, v).await?;
    }
    Ok(format!(
        "MiB/s at {}: {}",
        head.join("/"),
        summary.join("; ")
    ))
}
