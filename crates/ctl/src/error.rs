//! What can go wrong, how it is told, and the exit code of each kind.

use std::fmt;
use std::process::ExitCode;

use tonic::Code;
use tonic_types::StatusExt;

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The daemon answered with an error status.
    #[error("{}", describe(.0))]
    Status(Box<tonic::Status>),
    /// The daemon could not be reached.
    #[error("cannot connect to {addr}: {detail}")]
    Connect {
        /// The address tried.
        addr: String,
        /// Why.
        detail: String,
    },
    /// A bad option or argument found before any call.
    #[error("{0}")]
    Usage(String),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The verifier did not pass the plan an approval would commit.
    #[error(
        "the verifier did not pass this plan; it cannot be committed as it is (see docs/operators.md, \"Answering an escalation\")"
    )]
    Unverified,
    /// The operator declined at the confirmation prompt.
    #[error("not confirmed; nothing was changed")]
    Declined,
    /// A watch stream ended in a way that breaks its promise (a marker
    /// skipped or repeated).
    #[error("{0}")]
    Stream(String),
}

impl From<tonic::Status> for CtlError {
    fn from(status: tonic::Status) -> CtlError {
        CtlError::Status(Box::new(status))
    }
}

/// The exit code of each kind of failure (documented in
/// docs/operators.md, "Operator CLI").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Ok = 0,
    /// 1: anything not below (a local file that cannot be read or is not
    /// a snapshot, a broken stream, an internal error of the daemon,
    /// declined at the prompt).
    Failed = 1,
    /// 2: a bad command line (clap's own code).
    Usage = 2,
    /// 3: the daemon could not be reached or did not answer in time.
    Unreachable = 3,
    /// 4: the daemon refused the request as it stands (invalid argument,
    /// failed precondition, conflict, quota), or its plan did not pass
    /// the verifier.
    Refused = 4,
    /// 5: the session or span does not exist.
    NotFound = 5,
    /// 6: no or a wrong token, or a role that may not do this.
    Denied = 6,
}

impl Exit {
    /// As a process exit code.
    pub fn code(self) -> ExitCode {
        ExitCode::from(self as u8)
    }
}

impl CtlError {
    /// The exit code for this failure.
    pub fn exit(&self) -> Exit {
        match self {
            CtlError::Status(status) => match status.code() {
                Code::Unavailable | Code::DeadlineExceeded => Exit::Unreachable,
                Code::InvalidArgument
                | Code::OutOfRange
                | Code::FailedPrecondition
                | Code::AlreadyExists
                | Code::Aborted
                | Code::ResourceExhausted => Exit::Refused,
                Code::NotFound => Exit::NotFound,
                Code::Unauthenticated | Code::PermissionDenied => Exit::Denied,
                _ => Exit::Failed,
            },
            CtlError::Connect { .. } => Exit::Unreachable,
            CtlError::Unverified => Exit::Refused,
            CtlError::Usage(_) => Exit::Usage,
            CtlError::File { .. } | CtlError::Declined | CtlError::Stream(_) => Exit::Failed,
        }
    }
}

/// A status as the operator reads it: the code, the message, then the
/// `ErrorInfo` reason and metadata and each field violation, when the
/// daemon sent them.
fn describe(status: &tonic::Status) -> String {
    let mut out = format!("{:?}: {}", status.code(), status.message());
    let details = status.get_error_details();
    if let Some(info) = details.error_info() {
        out.push_str(&format!("\n  reason: {}", info.reason));
        let mut metadata: Vec<_> = info.metadata.iter().collect();
        metadata.sort();
        for (key, value) in metadata {
            out.push_str(&format!("\n  {key}: {value}"));
        }
    }
    if let Some(bad) = details.bad_request() {
        for violation in &bad.field_violations {
            out.push_str(&format!(
                "\n  field {}: {}",
                violation.field, violation.description
            ));
        }
    }
    if let Some(failure) = details.precondition_failure() {
        for violation in &failure.violations {
            out.push_str(&format!(
                "\n  violation {} {}: {}",
                violation.r#type, violation.subject, violation.description
            ));
        }
    }
    out
}

/// A file error with its path.
pub(crate) fn file_error(path: &std::path::Path, source: std::io::Error) -> CtlError {
    CtlError::File {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `ctxbrokerctl: <error>` to stderr.
pub(crate) struct Report<'a>(pub(crate) &'a CtlError);

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ctxbrokerctl: {}", self.0)
    }
}
