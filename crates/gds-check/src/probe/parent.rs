//! The parent side: one child with compat mode off, a second with it allowed when the first
//! finds no GDS path, and the cleanup a killed child could not do.

use super::spawn::spawn_and_wait;
use super::workdir::{tail_lines, unique_temp_dir};
use super::{GdsMode, ProbeArgs, ProbeOutcome, ProbeStatus};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Spawns `exe <prefix...> <probe args>` in its own process group and waits at most `timeout`.
/// Never panics; every failure mode comes back as a [`ProbeOutcome`].
pub fn run_probe(
    exe: &Path,
    exe_args_prefix: &[String],
    args: &ProbeArgs,
    timeout: Duration,
) -> ProbeOutcome {
    let t0 = Instant::now();
    // The parent owns the work dir so it can read cufile.log even after killing the child.
    let mut child_args = args.clone();
    let own_work = if args.work_dir.is_none() {
        match unique_temp_dir() {
            Ok(d) => {
                child_args.work_dir = Some(d);
                true
            }
            Err(_) => false,
        }
    } else {
        false
    };
    let (mut o, child_pid) = spawn_and_wait(exe, exe_args_prefix, &child_args, timeout);
    if args.strict && o.status == ProbeStatus::Completed && o.mode == GdsMode::Unavailable {
        let left = timeout.saturating_sub(t0.elapsed());
        let first = Child {
            outcome: o,
            pid: child_pid,
        };
        o = compat_run(exe, exe_args_prefix, args, &child_args, left, first);
    }
    remove_scratch(child_pid, &args.path);
    o.elapsed_ms = t0.elapsed().as_millis() as u64;
    if let Some(w) = &child_args.work_dir {
        if o.log_tail.is_empty() {
            o.log_tail = tail_lines(&w.join("cufile.log"), 20);
        }
        if own_work {
            let _ = std::fs::remove_dir_all(w);
        }
    }
    o
}

/// A finished child: its answer and pid.
struct Child {
    outcome: ProbeOutcome,
    pid: Option<u32>,
}

/// No GDS path with compat off. Ask again with compat allowed (libcufile reads its config once
/// per process, so this is a second child) to tell compat mode from a cuFile that does not
/// work at all.
fn compat_run(
    exe: &Path,
    exe_args_prefix: &[String],
    args: &ProbeArgs,
    child_args: &ProbeArgs,
    left: Duration,
    strict: Child,
) -> ProbeOutcome {
    let mut o = strict.outcome;
    let mut lenient = child_args.clone();
    lenient.strict = false;
    let (mut o2, pid2) = spawn_and_wait(exe, exe_args_prefix, &lenient, left);
    remove_scratch(pid2, &args.path);
    o2.strict = true;
    o2.strict_pass = Some(o.detail.clone());
    if o2.status != ProbeStatus::Completed {
        // The second child hung or broke: the strict answer stands.
        o.detail += &format!("; the compat-allowed run: {:?}: {}", o2.status, o2.detail);
        return o;
    }
    if o2.mode == GdsMode::TrueGds {
        o2.mode = GdsMode::Compat;
    }
    o2.detail = match o2.mode {
        GdsMode::Compat => format!(
            "compat mode: with compat off, {}; with compat allowed, {}",
            o.detail, o2.detail
        ),
        _ => format!("{}; with compat allowed too: {}", o.detail, o2.detail),
    };
    if o2.mode != GdsMode::Compat {
        o2.mode = GdsMode::Unavailable;
    }
    remove_scratch(strict.pid, &args.path);
    o2
}

/// A child killed mid-probe leaves its scratch file on the volume; remove it here.
fn remove_scratch(child_pid: Option<u32>, path: &Option<PathBuf>) {
    if let (Some(pid), Some(p)) = (child_pid, path) {
        if p.is_dir() {
            let _ = std::fs::remove_file(p.join(format!(".gds-probe-{pid}")));
        }
    }
}
