//! External commands, each with a deadline, in its own process group so that a
//! hung helper (mount.nfs against a dead server, say) is killed whole.

use std::ffi::OsStr;
use std::process::{Output, Stdio};
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

/// Runs `program args` and returns its output whatever its exit status.
pub async fn run_raw(
    program: &str,
    args: &[&OsStr],
    timeout: Duration,
) -> Result<Output, CommandError> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CommandError::Spawn {
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
