//! The audit log: who pinned, unpinned, approved, deleted, exported or
//! imported what, and what came of it.
//!
//! One JSON object per line in `audit.jsonl` in the data directory
//! (private like the rest of it), appended and flushed to disk after the
//! action's outcome is known, refusals included. The markers of unpins
//! and approved compactions record the same actor in the same commit as
//! the change; the log adds the actions that leave no marker. An operator
//! reads it with any JSON tool, e.g.
//! `jq 'select(.session_id == "acme/s1")' audit.jsonl`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tonic::Code;
use tracing::error;

use crate::broker::now_ms;
use crate::tenant::{Caller, tenant_of};

/// The file's name in the data directory.
pub const FILE_NAME: &str = "audit.jsonl";

/// What was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A span was pinned as a constraint.
    Pin,
    /// A pinned constraint was released.
    Unpin,
    /// A planned compaction was approved and committed.
    CommitCompaction,
    /// A session and everything it held were deleted.
    DeleteSession,
    /// A session's newest spans were taken back.
    RetractLastTurn,
    /// A session was emptied, its configuration kept.
    ResetSession,
    /// A session was exported.
    ExportSession,
    /// A session was imported.
    ImportSession,
}

/// One line of the log.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// What.
    pub action: Action,
    /// The session's full id (`tenant/session`).
    pub session_id: String,
    /// The session's tenant, when it has one.
    pub tenant: Option<String>,
    /// The token that asked; absent when authentication is off.
    pub token_id: Option<String>,
    /// The token's tenant; absent for an operator.
    pub token_tenant: Option<String>,
    /// The caller's role.
    pub role: &'static str,
    /// `ok`, or the gRPC code of the refusal (`NOT_FOUND`, ...).
    pub outcome: String,
    /// The span, marker or figures concerned.
    pub detail: String,
}

impl Entry {
    /// An entry for `caller` doing `action` to `session_id`, with the code
    /// it was refused with, if it was.
    pub fn new(
        caller: &Caller,
        action: Action,
        session_id: &str,
        refused: Option<Code>,
        detail: String,
    ) -> Entry {
        Entry {
            at_ms: now_ms(),
            action,
            session_id: session_id.to_owned(),
            tenant: tenant_of(session_id).map(str::to_owned),
            token_id: caller.token_id.as_deref().map(str::to_owned),
            token_tenant: caller.tenant.as_deref().map(str::to_owned),
            role: caller.role.name(),
            outcome: refused.map_or("ok", code_name).to_owned(),
            detail,
        }
    }
}

/// A gRPC code as the status codes are spelled: `NOT_FOUND`.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The open log, shared by every request.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens (creating it owner-only if absent) the log in `data_dir`.
    pub fn open(data_dir: &Path) -> io::Result<AuditLog> {
        let path = data_dir.join(FILE_NAME);
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path)?;
        Ok(AuditLog {
            path,
            file: Mutex::new(file),
        })
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` and flushes it to disk, off the async workers. A
    /// write that fails is logged; the action it records has happened
    /// and stands.
    pub async fn record(self: &Arc<Self>, entry: Entry) {
        let log = Arc::clone(self);
        let written = tokio::task::spawn_blocking(move || log.append(&entry)).await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(err)) => error!(path = %self.path.display(), %err, "audit entry not written"),
            Err(err) => error!(path = %self.path.display(), %err, "audit writer failed"),
        }
    }

    fn append(&self, entry: &Entry) -> io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
        line.push(b'\n');
        let file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        (&*file).write_all(&line)?;
        file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::Role;

    #[tokio::test]
    async fn entries_are_appended_as_json_lines_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(AuditLog::open(dir.path()).unwrap());
        let caller = Caller {
            token_id: Some(Arc::from("ci-bot")),
            tenant: Some(Arc::from("acme")),
            role: Role::Agent,
        };
        log.record(Entry::new(
            &caller,
            Action::Unpin,
            "acme/s1",
            None,
            "span 4".into(),
        ))
        .await;
        log.record(Entry::new(
            &Caller::open(),
            Action::DeleteSession,
            "acme/s2",
            Some(Code::NotFound),
            String::new(),
        ))
        .await;
        // Reopened, the log keeps what it had.
        drop(log);
        let log = AuditLog::open(dir.path()).unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["action"], "unpin");
        assert_eq!(lines[0]["session_id"], "acme/s1");
        assert_eq!(lines[0]["tenant"], "acme");
        assert_eq!(lines[0]["token_id"], "ci-bot");
        assert_eq!(lines[0]["role"], "agent");
        assert_eq!(lines[0]["outcome"], "ok");
        assert_eq!(lines[1]["action"], "delete_session");
        assert_eq!(lines[1]["token_id"], serde_json::Value::Null);
        assert_eq!(lines[1]["role"], "operator");
        assert_eq!(lines[1]["outcome"], "NOT_FOUND");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(log.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
