//! External commands, each with a deadline, in its own process group so that a
//! hung helper (mount.nfs against a dead server, say) is killed whole, and with a
//! parent-death signal so that none outlives the driver (a SIGKILLed driver must not
//! leave an mkfs running that its restarted self cannot see).

use std::ffi::OsStr;
use std::io;
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::error::CommandError;

fn describe(program: &str, args: &[&OsStr]) -> String {
    let mut text = program.to_owned();
    for arg in args {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

type Spawned = io::Result<tokio::process::Child>;

struct SpawnRequest {
    command: tokio::process::Command,
    runtime: tokio::runtime::Handle,
    reply: tokio::sync::oneshot::Sender<Spawned>,
}

/// Every child is forked by this one thread, which lives as long as the process.
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process
/// (prctl(2): "the parent is considered to be the thread that created this process"),
/// and the thread calling `spawn` is whichever tokio thread polls the call; blocking-pool
/// threads end after 10 s idle, which would SIGKILL a healthy mkfs. Started by the first
/// request; a start that fails is tried again by the next.
static SPAWNER: Mutex<Option<mpsc::Sender<SpawnRequest>>> = Mutex::new(None);

fn start_spawner() -> io::Result<mpsc::Sender<SpawnRequest>> {
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new()
        .name("gds-csi-spawner".into())
        .spawn(move || {
            for mut req in rx {
                // The child's reaper and pipes belong to the caller's runtime.
                let _guard = req.runtime.enter();
                let _ = req.reply.send(req.command.spawn());
            }
        })
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("starting the process-spawner thread: {e}"),
            )
        })?;
    Ok(tx)
}

/// Hands `request` to the spawner thread, starting it first if need be.
fn send_to_spawner(request: SpawnRequest) -> io::Result<()> {
    let mut spawner = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
    let tx = match &mut *spawner {
        Some(tx) => tx,
        empty => empty.insert(start_spawner()?),
    };
    tx.send(request)
        .map_err(|_| io::Error::other("the process-spawner thread is gone"))
}

async fn spawn(mut command: tokio::process::Command) -> Spawned {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid), allocating nothing.
    unsafe {
        command.pre_exec(move || {
            // SIGKILL, not SIGTERM: mkfs and mount handle no signal that would make
            // stopping halfway any safer, and the driver is gone anyway.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The driver died between fork and prctl: the signal will never come.
            if libc::getppid() != parent {
                return Err(io::Error::other(
                    "the driver exited while starting this command",
                ));
            }
            Ok(())
        });
    }
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = SpawnRequest {
        command,
        runtime: tokio::runtime::Handle::current(),
        reply,
    };
    send_to_spawner(request)?;
    answer
        .await
        .map_err(|_| io::Error::other("the process-spawner thread is gone"))?
}

/// Runs `program args` and returns its output whatever its exit status.
pub async fn run_raw(
    program: &str,
    args: &[&OsStr],
    timeout: Duration,
) -> Result<Output, CommandError> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        // The driver takes util-linux's block-device lock itself (os::host::DeviceHold):
        // its own wipefs must not wait for it (util-linux lib/blkdev.c blkdev_lock reads
        // LOCK_BLOCK_DEVICE when no --lock is given).
        .env_remove("LOCK_BLOCK_DEVICE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = spawn(command).await.map_err(|source| CommandError::Spawn {
        program: program.to_owned(),
        source,
    })?;
    let pid = child.id();
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(source)) => Err(CommandError::Spawn {
            program: program.to_owned(),
            source,
        }),
        Err(_) => {
            if let Some(pid) = pid {
                // The group id equals the child's pid because of process_group(0).
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            Err(CommandError::Timeout {
                command: describe(program, args),
                after: timeout,
            })
        }
    }
}

/// Runs `program args` and fails unless it exits 0.
pub async fn run(
    program: &str,
    args: &[&OsStr],
    timeout: Duration,
) -> Result<Output, CommandError> {
    let output = run_raw(program, args, timeout).await?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(CommandError::Failed {
            command: describe(program, args),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn a_hung_command_is_killed_at_its_deadline_with_its_children() {
        let start = Instant::now();
        // The shell forks a grandchild; killing only the shell would leave it running.
        let err = run(
            "sh",
            &[OsStr::new("-c"), OsStr::new("sleep 30 & sleep 30; wait")],
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, CommandError::Timeout { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// The parent-death signal is tied to the thread that forked (prctl(2)); children are
    /// forked by the spawner thread, so a caller's thread ending must not kill them.
    #[test]
    fn a_child_outlives_the_thread_that_started_it() {
        let pid = std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut command = tokio::process::Command::new("sleep");
                command.arg("30");
                let child = spawn(command).await.unwrap();
                let pid = child.id().unwrap();
                // No kill_on_drop here: only the death signal could end it.
                std::mem::forget(child);
                pid
            })
        })
        .join()
        .unwrap();
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        // The signal, had it been armed on that thread, is sent as the thread exits.
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let state = stat.rsplit(')').next().unwrap().split_whitespace().next();
            assert!(
                matches!(state, Some("S" | "R" | "D")),
                "the child died with its caller's thread: {stat}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        nix::sys::signal::kill(pid, Signal::SIGKILL).unwrap();
        nix::sys::wait::waitpid(pid, None).unwrap();
    }

    #[tokio::test]
    async fn a_failing_command_reports_its_stderr() {
        let err = run(
            "sh",
            &[OsStr::new("-c"), OsStr::new("echo boom >&2; exit 3")],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        match err {
            CommandError::Failed { stderr, .. } => assert_eq!(stderr, "boom"),
            other => panic!("unexpected {other}"),
        }
    }
}
