//! Domain errors, and the one place where they become gRPC status codes.

use std::path::PathBuf;
use std::time::Duration;

use tonic::{Code, Status};

/// A failed external command (mkfs, mount, blkid, ...).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("could not start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{command}` did not finish within {after:?}; its process group was killed")]
    Timeout { command: String, after: Duration },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong: names the field and what to send instead.
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("volume {0} does not exist on this node")]
    VolumeNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("an operation on {0} is already in progress; retry later")]
    Busy(String),
    /// The call cannot go on as asked (a stale pagination token, say); start over.
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    NotReady(String),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {}: {reason}", path.display())]
    State { path: PathBuf, reason: String },
    /// The outcome of a long job that more than one call waited for (src/jobs.rs).
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }
}

fn code(err: &Error) -> Code {
    match err {
        Error::InvalidArgument { .. } => Code::InvalidArgument,
        Error::VolumeNotFound(_) | Error::NotFound(_) => Code::NotFound,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::Busy(_) | Error::Aborted(_) => Code::Aborted,
        Error::ResourceExhausted(_) => Code::ResourceExhausted,
        Error::OutOfRange(_) => Code::OutOfRange,
        Error::NotReady(_) => Code::Unavailable,
        Error::Command(CommandError::Timeout { .. }) => Code::DeadlineExceeded,
        Error::Command(_) | Error::Io { .. } | Error::State { .. } => Code::Internal,
        Error::Shared(inner) => code(inner),
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        Status::new(code(&err), err.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
