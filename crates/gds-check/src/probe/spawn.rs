//! One child under a deadline: spawned in its own process group, its output captured, the
//! whole group killed at the deadline, and whatever it said (or did not) made an outcome.

use super::{ProbeArgs, ProbeOutcome, ProbeStatus, DEFAULT_LIBRARY, INFO_PREFIX, STAGE_PREFIX};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

const MAX_CAPTURE: usize = 1 << 20;

type Captured = Arc<Mutex<Vec<u8>>>;

fn capture<R: Read + Send + 'static>(mut r: R) -> Captured {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = Arc::clone(&buf);
    // Detached: if a stray process keeps the pipe open, we read what is there and move on.
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut g = b.lock().unwrap_or_else(|e| e.into_inner());
                    if g.len() < MAX_CAPTURE {
                        g.extend_from_slice(&chunk[..n]);
                    }
                }
            }
        }
    });
    buf
}

fn snapshot(b: &Captured) -> String {
    String::from_utf8_lossy(&b.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

fn kill_group(pgid: i32) {
    // SAFETY: kill(2) takes no pointers; -pgid names our child's own process group, and ESRCH
    // when the group is already gone is fine.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// The child's answer and its pid (which names its scratch file).
pub(super) fn spawn_and_wait(
    exe: &Path,
    prefix: &[String],
    args: &ProbeArgs,
    timeout: Duration,
) -> (ProbeOutcome, Option<u32>) {
    let mut cmd = Command::new(exe);
    cmd.args(prefix)
        .args(args.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let o = ProbeOutcome::new(
                args,
                ProbeStatus::SpawnFailed,
                format!("cannot start {}: {e}", exe.display()),
            );
            return (o, None);
        }
    };
    let pgid = child.id() as i32;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        // Both were asked for as pipes; should the runtime not give them, no answer can come.
        kill_group(pgid);
        let _ = child.wait();
        let detail = format!("started {} but got no pipe to read it", exe.display());
        let o = ProbeOutcome::new(args, ProbeStatus::SpawnFailed, detail);
        return (o, Some(pgid as u32));
    };
    let (out, err) = (capture(stdout), capture(stderr));
    let (status, timed_out) = wait_until(&mut child, pgid, Instant::now() + timeout);
    // Anything the child left behind in its group (helpers, threads' forks) goes too.
    kill_group(pgid);
    // Let the reader threads drain the closed pipes.
    let drain_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < drain_until && Arc::strong_count(&out) + Arc::strong_count(&err) > 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stdout = snapshot(&out);
    let stderr = ChildStderr::parse(&snapshot(&err));
    let answer = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<ProbeOutcome>(l.trim()).ok());
    let ended = Ended {
        status,
        timed_out,
        timeout,
    };
    let o = match answer {
        Some(a) => a,
        None => no_answer(args, &ended, &stderr),
    };
    (finish(o, &ended, stderr), Some(pgid as u32))
}

/// Waits for the child until `deadline`, then kills its group. Its exit status (if it could be
/// had) and whether the deadline passed.
fn wait_until(child: &mut Child, pgid: i32, deadline: Instant) -> (Option<ExitStatus>, bool) {
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return (Some(s), false),
            Ok(None) if Instant::now() >= deadline => {
                kill_group(pgid);
                return (child.wait().ok(), true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => {
                kill_group(pgid);
                return (child.wait().ok(), false);
            }
        }
    }
}

/// How the child ended.
struct Ended {
    status: Option<ExitStatus>,
    timed_out: bool,
    timeout: Duration,
}

/// What the child said on stderr: its last step, the library version it read, other lines.
struct ChildStderr {
    last_stage: Option<String>,
    info_version: Option<i32>,
    tail: Option<String>,
}

impl ChildStderr {
    fn parse(stderr: &str) -> Self {
        let last_stage = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(STAGE_PREFIX))
            .map(str::to_string);
        let info_version: Option<i32> = stderr
            .lines()
            .filter_map(|l| {
                l.strip_prefix(INFO_PREFIX)?
                    .strip_prefix("library_version=")
            })
            .find_map(|v| v.trim().parse().ok());
        let other: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.starts_with(STAGE_PREFIX) && !l.starts_with(INFO_PREFIX))
            .collect();
        let tail = (!other.is_empty()).then(|| {
            let t = other[other.len().saturating_sub(10)..].join("\n");
            t.chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect()
        });
        ChildStderr {
            last_stage,
            info_version,
            tail,
        }
    }
}

/// The outcome of a child that printed no answer: timed out, crashed, or exited silently.
fn no_answer(args: &ProbeArgs, ended: &Ended, stderr: &ChildStderr) -> ProbeOutcome {
    let last = stderr.last_stage.as_deref();
    let (st, detail) = if ended.timed_out {
        (
            ProbeStatus::TimedOut,
            format!(
                "no answer within {:.1} s (killed); last step: {}",
                ended.timeout.as_secs_f64(),
                last.unwrap_or("none")
            ),
        )
    } else {
        match ended.status.and_then(|s| s.signal()) {
            Some(sig) => (
                ProbeStatus::Crashed,
                format!(
                    "killed by signal {sig} ({}) during {}",
                    signal_name(sig),
                    last.unwrap_or("startup")
                ),
            ),
            None => (
                ProbeStatus::NoOutput,
                format!(
                    "exited with {} without an answer",
                    ended
                        .status
                        .and_then(|s| s.code())
                        .map_or("unknown status".into(), |c| format!("code {c}"))
                ),
            ),
        }
    };
    let mut o = ProbeOutcome::new(args, st, detail);
    o.library = Some(
        args.library
            .as_ref()
            .map_or(DEFAULT_LIBRARY.to_string(), |p| {
                p.to_string_lossy().into_owned()
            }),
    );
    o.library_version = stderr.info_version;
    o.file = args.path.as_ref().map(|p| p.to_string_lossy().into_owned());
    o
}

/// What the parent knows and the child may not have said: the last step, the exit status,
/// a kill at the deadline, the stderr tail.
fn finish(mut o: ProbeOutcome, ended: &Ended, stderr: ChildStderr) -> ProbeOutcome {
    if o.stage.is_none() || o.status == ProbeStatus::TimedOut || o.status == ProbeStatus::Crashed {
        o.stage = stderr.last_stage.or(o.stage.take());
    }
    if let Some(s) = ended.status {
        o.exit_code = s.code();
        o.signal = s.signal();
    }
    if ended.timed_out && o.status != ProbeStatus::TimedOut {
        o.detail += "; the child answered but did not exit before the deadline (killed)";
    }
    o.stderr_tail = stderr.tail;
    o
}
