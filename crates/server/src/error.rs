//! The server's error type and its one exhaustive mapping to `tonic::Status`
//! with google.rpc details: adding a variant without deciding its status
//! code does not compile.

use std::collections::HashMap;
use std::time::Duration;

use ctxbroker_core::plan::{Sizes, Violation};
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::StoreError;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, PreconditionViolation, QuotaViolation, StatusExt};

use crate::quota::QuotaKind;

use crate::tenant::Scope;

/// The `ErrorInfo.domain` of every error the server returns.
pub const ERROR_DOMAIN: &str = "ctxbroker.v1";

/// Stable machine-readable reasons, as in `ErrorInfo.reason`.
pub mod reason {
    /// A request field is malformed or past a limit.
    pub const INVALID_ARGUMENT: &str = "INVALID_ARGUMENT";
    /// The session does not exist.
    pub const SESSION_NOT_FOUND: &str = "SESSION_NOT_FOUND";
    /// The span does not exist in the session.
    pub const SPAN_NOT_FOUND: &str = "SPAN_NOT_FOUND";
    /// The session id is taken.
    pub const SESSION_EXISTS: &str = "SESSION_EXISTS";
    /// A compaction could not be made valid (escalation).
    pub const COMPACTION_INVARIANT: &str = "COMPACTION_INVARIANT";
    /// A compaction is needed but the session requires approval.
    pub const APPROVAL_REQUIRED: &str = "APPROVAL_REQUIRED";
    /// A plan was made against an earlier revision or another session.
    pub const STALE_PLAN: &str = "STALE_PLAN";
    /// The span is archived, not live.
    pub const SPAN_NOT_LIVE: &str = "SPAN_NOT_LIVE";
    /// The span's class does not allow the operation.
    pub const WRONG_CLASS: &str = "WRONG_CLASS";
    /// The plan changes nothing.
    pub const NOTHING_TO_COMMIT: &str = "NOTHING_TO_COMMIT";
    /// The spans asked to be taken back cannot be (a summary among them,
    /// or fewer live spans than asked for).
    pub const NOT_RETRACTABLE: &str = "NOT_RETRACTABLE";
    /// A configuration change would leave live above the new budget.
    pub const CONFIG_BELOW_LIVE: &str = "CONFIG_BELOW_LIVE";
    /// The session changed since the request was prepared.
    pub const STALE_REVISION: &str = "STALE_REVISION";
    /// A watch asked for markers older than retention.
    pub const MARKER_OUT_OF_RANGE: &str = "MARKER_OUT_OF_RANGE";
    /// The server holds its maximum number of sessions.
    pub const MAX_SESSIONS: &str = "MAX_SESSIONS";
    /// The server holds its maximum number of streams.
    pub const MAX_STREAMS: &str = "MAX_STREAMS";
    /// A tenant is at one of its quotas (the metadata's `quota` names it).
    pub const QUOTA_EXCEEDED: &str = "QUOTA_EXCEEDED";
    /// An exported session would not fit in an ImportSession request.
    pub const SNAPSHOT_TOO_LARGE: &str = "SNAPSHOT_TOO_LARGE";
    /// The RPC is part of the contract but not served by this build.
    pub const NOT_IMPLEMENTED: &str = "NOT_IMPLEMENTED";
    /// The server is shutting down; retry elsewhere or later.
    pub const SHUTTING_DOWN: &str = "SHUTTING_DOWN";
    /// No credentials, or unknown ones.
    pub const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    /// The caller's role does not allow the RPC.
    pub const PERMISSION_DENIED: &str = "PERMISSION_DENIED";
    /// A stored record failed its checksum or did not decode.
    pub const CORRUPT_RECORD: &str = "CORRUPT_RECORD";
    /// The storage engine failed.
    pub const STORAGE: &str = "STORAGE";
    /// A defect in the server.
    pub const INTERNAL: &str = "INTERNAL";
}

/// One bad field of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadField {
    /// The field's path in the request, e.g. `spans[2].text`.
    pub field: String,
    /// What is wrong, with the limit.
    pub description: String,
}

impl BadField {
    /// A bad field.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        BadField {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// A refused admission: the sizes at stake, every violation found, and the
/// ABORTED marker that records it.
#[derive(Debug, Clone)]
pub struct Escalation {
    /// The session.
    pub session_id: String,
    /// Live, incoming, pinned, budget and window.
    pub sizes: Sizes,
    /// What made the compaction impossible or invalid.
    pub violations: Vec<Violation>,
    /// The ABORTED marker's sequence.
    pub marker_seq: u64,
    /// What was refused, for the message: an admission or a commit.
    pub refused: Refused,
}

/// What an escalation refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A turn (with the compaction it needed).
    Turn,
    /// A caller's commit of a plan.
    Commit,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Turn => "the turn cannot be admitted",
            Refused::Commit => "the compaction cannot be committed",
        })
    }
}

/// What went wrong, in the caller's terms.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// One or more request fields are bad; nothing was changed.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<BadField>),
    /// The session does not exist.
    #[error("session {0:?} not found")]
    SessionNotFound(String),
    /// The span does not exist in the session.
    #[error("span {span_id} not found in session {session_id:?}")]
    SpanNotFound {
        /// The session.
        session_id: String,
        /// The span.
        span_id: u64,
    },
    /// The session id is taken.
    #[error("session {0:?} already exists")]
    SessionExists(String),
    /// A compaction could not be made valid; nothing was committed.
    #[error(
        "compaction invariant: {} (live {} + incoming {} tokens, pinned {}, budget {}, window {}): {}",
        .0.refused, .0.sizes.live, .0.sizes.incoming, .0.sizes.pinned, .0.sizes.budget, .0.sizes.window,
        violations(&.0.violations)
    )]
    Escalation(Box<Escalation>),
    /// The turn needs a compaction but the session requires approval.
    #[error(
        "session {session_id:?} requires approval for compactions: live {live} + incoming {incoming} tokens exceed the budget {budget}; review and commit plan {plan_id}, then admit the turn again"
    )]
    ApprovalRequired {
        /// The session.
        session_id: String,
        /// Live tokens.
        live: u64,
        /// Incoming tokens.
        incoming: u64,
        /// The budget.
        budget: u64,
        /// A plan that makes room for the turn, ready to commit.
        plan_id: String,
    },
    /// A plan made against an earlier revision, or for another session.
    #[error(
        "plan is stale: session {session_id:?} is at revision {current}, the plan was made at {planned}; plan again"
    )]
    StalePlan {
        /// The session.
        session_id: String,
        /// The revision the plan was made against.
        planned: u64,
        /// The session's revision now.
        current: u64,
    },
    /// The span exists but is not in the live context.
    #[error("span {span_id} is not in the live context of session {session_id:?}")]
    SpanNotLive {
        /// The session.
        session_id: String,
        /// The span.
        span_id: u64,
    },
    /// The span's class does not allow the operation.
    #[error("span {span_id} of session {session_id:?}: {detail}")]
    WrongClass {
        /// The session.
        session_id: String,
        /// The span.
        span_id: u64,
        /// What is wrong.
        detail: String,
    },
    /// The plan would change nothing.
    #[error("nothing to commit: the plan for session {session_id:?} evicts and compresses nothing")]
    NothingToCommit {
        /// The session.
        session_id: String,
    },
    /// Spans asked to be taken back cannot be.
    #[error("cannot take back spans of session {session_id:?}: {detail}")]
    NotRetractable {
        /// The session.
        session_id: String,
        /// The span at fault, when one is.
        span_id: Option<u64>,
        /// What is wrong.
        detail: String,
    },
    /// A configuration change would leave live above the new budget.
    #[error(
        "the new configuration's budget of {budget} tokens is below the session's {live} live tokens; compact first"
    )]
    ConfigBelowLive {
        /// Live tokens now.
        live: u64,
        /// The new budget.
        budget: u64,
    },
    /// The session changed under the request.
    #[error("session {session_id:?} changed (revision {actual}, expected {expected}); retry")]
    StaleRevision {
        /// The session.
        session_id: String,
        /// The revision the request was prepared against.
        expected: u64,
        /// The revision now.
        actual: u64,
    },
    /// A watch asked for markers older than retention.
    #[error("marker {requested} is older than retention; the oldest available is {oldest}")]
    MarkerOutOfRange {
        /// The requested start.
        requested: u64,
        /// The oldest marker retained.
        oldest: u64,
    },
    /// The server holds its maximum number of sessions.
    #[error("the server holds its maximum of {max} sessions")]
    SessionLimit {
        /// The limit.
        max: u64,
    },
    /// The server holds its maximum number of streams.
    #[error("the server holds its maximum of {max} concurrent streams")]
    StreamLimit {
        /// The limit.
        max: usize,
    },
    /// A session exports to a snapshot an `ImportSession` request could
    /// not carry under `max_request_bytes`.
    #[error(
        "session {session_id:?} exports to a snapshot of {snapshot_bytes} bytes: an ImportSession request carrying it ({request_bytes} bytes) would exceed max_request_bytes = {max}; raise max_request_bytes on both servers (and the client's receive limit) to move it"
    )]
    SnapshotTooLarge {
        /// The session.
        session_id: String,
        /// The snapshot's encoded size.
        snapshot_bytes: usize,
        /// The size of the ImportSession request carrying it.
        request_bytes: usize,
        /// The limit it exceeds.
        max: usize,
    },
    /// A tenant is at one of its quotas; nothing was changed. Retry after
    /// `retry_after` (or once the tenant has freed what it holds).
    #[error(
        "tenant {tenant:?} is at its {} quota of {limit}: {detail}; retry in {} ms",
        quota.key(), retry_after.as_millis()
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Which quota.
        quota: QuotaKind,
        /// The quota's limit, in its unit (sessions, bytes, admissions a
        /// second, streams).
        limit: String,
        /// When a retry may succeed.
        retry_after: Duration,
        /// What the request would have taken.
        detail: String,
    },
    /// Part of the contract that this build does not serve yet.
    #[error("{rpc} is not implemented yet: {missing}")]
    NotImplemented {
        /// The RPC.
        rpc: &'static str,
        /// What is missing.
        missing: &'static str,
    },
    /// The request carries no credentials, or credentials no token file
    /// entry matches.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller's role does not allow the RPC.
    #[error("permission denied: {detail}")]
    PermissionDenied {
        /// The caller's role.
        role: &'static str,
        /// The RPC refused.
        rpc: String,
        /// What is wrong.
        detail: String,
    },
    /// The server is shutting down. `resume_from_seq` tells a watcher where
    /// to resume.
    #[error("the server is shutting down")]
    ShuttingDown {
        /// For watchers: the next marker they have not received.
        resume_from_seq: Option<u64>,
    },
    /// A stored record is corrupt; it is never served.
    #[error("corrupt record {key} in {tree}{}: {detail}", session_suffix(.session_id))]
    Corrupt {
        /// The tree.
        tree: String,
        /// The key, printable.
        key: String,
        /// The session it belongs to.
        session_id: Option<String>,
        /// What failed.
        detail: String,
    },
    /// The storage engine failed.
    #[error("storage failure: {0}")]
    Storage(String),
    /// A defect in the server: a state it should never reach. Logged and
    /// reported, never hidden.
    #[error("internal error: {0}")]
    Internal(String),
}

fn describe(fields: &[BadField]) -> String {
    fields
        .iter()
        .map(|f| format!("{}: {}", f.field, f.description))
        .collect::<Vec<_>>()
        .join("; ")
}

fn violations(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| v.detail.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

fn session_suffix(session: &Option<String>) -> String {
    session
        .as_deref()
        .map(|s| format!(" (session {s:?})"))
        .unwrap_or_default()
}

/// A status with its parts kept apart, so that AdmitStream can put the same
/// information in an inline `TurnError` as unary Admit puts in a `Status`.
#[derive(Debug, Clone)]
pub struct ErrorParts {
    /// The gRPC code.
    pub code: Code,
    /// The human-readable message.
    pub message: String,
    /// The stable reason.
    pub reason: &'static str,
    /// The ErrorInfo metadata.
    pub metadata: HashMap<String, String>,
    /// BadRequest field violations.
    pub fields: Vec<BadField>,
    /// PreconditionFailure violations: (type, subject, description).
    pub preconditions: Vec<(String, String, String)>,
    /// The QuotaFailure violation: (subject, description).
    pub quota_failure: Option<(String, String)>,
    /// The RetryInfo delay.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// The error as a caller in `scope` should read it: every session it
    /// names by the id the caller knows it by. Ids outside the scope are
    /// left as they are (the service only serves sessions inside it).
    pub fn localized(mut self, scope: &Scope) -> ApiError {
        if scope.tenant_name().is_none() {
            return self;
        }
        let id = match &mut self {
            ApiError::SessionNotFound(id) | ApiError::SessionExists(id) => Some(id),
            ApiError::Escalation(esc) => Some(&mut esc.session_id),
            ApiError::SpanNotFound { session_id, .. }
            | ApiError::ApprovalRequired { session_id, .. }
            | ApiError::StalePlan { session_id, .. }
            | ApiError::SpanNotLive { session_id, .. }
            | ApiError::WrongClass { session_id, .. }
            | ApiError::NothingToCommit { session_id }
            | ApiError::NotRetractable { session_id, .. }
            | ApiError::StaleRevision { session_id, .. }
            | ApiError::SnapshotTooLarge { session_id, .. } => Some(session_id),
            ApiError::Corrupt { session_id, .. } => session_id.as_mut(),
            _ => None,
        };
        if let Some(id) = id
            && let Some(local) = scope.local_id(id)
        {
            *id = local.to_owned();
        }
        self
    }

    /// The error's code, reason, metadata and violations.
    pub fn parts(&self) -> ErrorParts {
        let message = self.to_string();
        let mut metadata = HashMap::new();
        let mut fields = Vec::new();
        let mut preconditions = Vec::new();
        let mut quota_failure = None;
        let mut retry = None;
        let (code, reason) = match self {
            ApiError::InvalidArgument(bad) => {
                fields.clone_from(bad);
                (Code::InvalidArgument, reason::INVALID_ARGUMENT)
            }
            ApiError::SessionNotFound(id) => {
                metadata.insert("session_id".into(), id.clone());
                (Code::NotFound, reason::SESSION_NOT_FOUND)
            }
            ApiError::SpanNotFound {
                session_id,
                span_id,
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("span_id".into(), span_id.to_string());
                (Code::NotFound, reason::SPAN_NOT_FOUND)
            }
            ApiError::SessionExists(id) => {
                metadata.insert("session_id".into(), id.clone());
                (Code::AlreadyExists, reason::SESSION_EXISTS)
            }
            ApiError::Escalation(esc) => {
                let s = esc.sizes;
                metadata.insert("session_id".into(), esc.session_id.clone());
                metadata.insert("live_tokens".into(), s.live.to_string());
                metadata.insert("incoming_tokens".into(), s.incoming.to_string());
                metadata.insert("pinned_tokens".into(), s.pinned.to_string());
                metadata.insert("budget_tokens".into(), s.budget.to_string());
                metadata.insert("window_tokens".into(), s.window.to_string());
                metadata.insert("marker_seq".into(), esc.marker_seq.to_string());
                let kinds: Vec<&str> = esc
                    .violations
                    .iter()
                    .map(|v| crate::convert::violation_kind_name(v.kind))
                    .collect();
                metadata.insert("violations".into(), kinds.join(","));
                for v in &esc.violations {
                    preconditions.push((
                        crate::convert::violation_kind_name(v.kind).to_owned(),
                        v.span_id
                            .map(|id| format!("span/{id}"))
                            .unwrap_or_else(|| format!("session/{}", esc.session_id)),
                        v.detail.clone(),
                    ));
                }
                (Code::FailedPrecondition, reason::COMPACTION_INVARIANT)
            }
            ApiError::ApprovalRequired {
                session_id,
                live,
                incoming,
                budget,
                plan_id,
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("live_tokens".into(), live.to_string());
                metadata.insert("incoming_tokens".into(), incoming.to_string());
                metadata.insert("budget_tokens".into(), budget.to_string());
                metadata.insert("plan_id".into(), plan_id.clone());
                (Code::FailedPrecondition, reason::APPROVAL_REQUIRED)
            }
            ApiError::StalePlan {
                session_id,
                planned,
                current,
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("planned_revision".into(), planned.to_string());
                metadata.insert("current_revision".into(), current.to_string());
                (Code::Aborted, reason::STALE_PLAN)
            }
            ApiError::SpanNotLive {
                session_id,
                span_id,
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("span_id".into(), span_id.to_string());
                (Code::FailedPrecondition, reason::SPAN_NOT_LIVE)
            }
            ApiError::WrongClass {
                session_id,
                span_id,
                ..
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("span_id".into(), span_id.to_string());
                (Code::FailedPrecondition, reason::WRONG_CLASS)
            }
            ApiError::NotRetractable {
                session_id,
                span_id,
                ..
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                if let Some(span_id) = span_id {
                    metadata.insert("span_id".into(), span_id.to_string());
                }
                (Code::FailedPrecondition, reason::NOT_RETRACTABLE)
            }
            ApiError::NothingToCommit { session_id } => {
                metadata.insert("session_id".into(), session_id.clone());
                (Code::FailedPrecondition, reason::NOTHING_TO_COMMIT)
            }
            ApiError::ConfigBelowLive { live, budget } => {
                metadata.insert("live_tokens".into(), live.to_string());
                metadata.insert("budget_tokens".into(), budget.to_string());
                (Code::FailedPrecondition, reason::CONFIG_BELOW_LIVE)
            }
            ApiError::StaleRevision {
                session_id,
                expected,
                actual,
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("expected_revision".into(), expected.to_string());
                metadata.insert("actual_revision".into(), actual.to_string());
                (Code::Aborted, reason::STALE_REVISION)
            }
            ApiError::MarkerOutOfRange { requested, oldest } => {
                metadata.insert("requested_seq".into(), requested.to_string());
                metadata.insert("oldest_seq".into(), oldest.to_string());
                (Code::OutOfRange, reason::MARKER_OUT_OF_RANGE)
            }
            ApiError::SessionLimit { max } => {
                metadata.insert("max_sessions".into(), max.to_string());
                (Code::ResourceExhausted, reason::MAX_SESSIONS)
            }
            ApiError::StreamLimit { max } => {
                metadata.insert("max_concurrent_streams".into(), max.to_string());
                (Code::ResourceExhausted, reason::MAX_STREAMS)
            }
            ApiError::SnapshotTooLarge {
                session_id,
                snapshot_bytes,
                request_bytes,
                max,
            } => {
                metadata.insert("session_id".into(), session_id.clone());
                metadata.insert("snapshot_bytes".into(), snapshot_bytes.to_string());
                metadata.insert("request_bytes".into(), request_bytes.to_string());
                metadata.insert("max_request_bytes".into(), max.to_string());
                (Code::ResourceExhausted, reason::SNAPSHOT_TOO_LARGE)
            }
            ApiError::QuotaExceeded {
                tenant,
                quota,
                limit,
                retry_after,
                ..
            } => {
                metadata.insert("tenant".into(), tenant.clone());
                metadata.insert("quota".into(), quota.key().to_owned());
                metadata.insert("limit".into(), limit.clone());
                // For AdmitStream's inline error, which has no RetryInfo.
                metadata.insert("retry_after_ms".into(), retry_after.as_millis().to_string());
                quota_failure = Some((
                    tenant.clone(),
                    format!("quota {} of {limit} exceeded", quota.key()),
                ));
                retry = Some(*retry_after);
                (Code::ResourceExhausted, reason::QUOTA_EXCEEDED)
            }
            ApiError::NotImplemented { rpc, .. } => {
                metadata.insert("rpc".into(), (*rpc).to_owned());
                (Code::Unimplemented, reason::NOT_IMPLEMENTED)
            }
            ApiError::Unauthenticated(_) => (Code::Unauthenticated, reason::UNAUTHENTICATED),
            ApiError::PermissionDenied { role, rpc, .. } => {
                metadata.insert("role".into(), (*role).to_owned());
                metadata.insert("rpc".into(), rpc.clone());
                (Code::PermissionDenied, reason::PERMISSION_DENIED)
            }
            ApiError::ShuttingDown { resume_from_seq } => {
                if let Some(seq) = resume_from_seq {
                    metadata.insert("resume_from_seq".into(), seq.to_string());
                }
                (Code::Unavailable, reason::SHUTTING_DOWN)
            }
            ApiError::Corrupt {
                tree,
                key,
                session_id,
                ..
            } => {
                metadata.insert("tree".into(), tree.clone());
                metadata.insert("key".into(), key.clone());
                if let Some(id) = session_id {
                    metadata.insert("session_id".into(), id.clone());
                }
                (Code::DataLoss, reason::CORRUPT_RECORD)
            }
            ApiError::Storage(_) => (Code::Unavailable, reason::STORAGE),
            ApiError::Internal(_) => (Code::Internal, reason::INTERNAL),
        };
        ErrorParts {
            code,
            message,
            reason,
            metadata,
            fields,
            preconditions,
            quota_failure,
            retry_after: retry,
        }
    }

    /// The inline error of an AdmitStream reply.
    pub fn to_turn_error(&self) -> pb::TurnError {
        let parts = self.parts();
        pb::TurnError {
            code: parts.code as i32,
            message: parts.message,
            reason: parts.reason.to_owned(),
            metadata: parts.metadata,
            field_violations: parts
                .fields
                .into_iter()
                .map(|f| pb::FieldViolation {
                    field: f.field,
                    description: f.description,
                })
                .collect(),
        }
    }
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Status {
        let parts = err.parts();
        let mut details =
            ErrorDetails::with_error_info(parts.reason, ERROR_DOMAIN, parts.metadata.clone());
        if !parts.fields.is_empty() {
            details.set_bad_request(
                parts
                    .fields
                    .iter()
                    .map(|f| FieldViolation::new(f.field.clone(), f.description.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        if !parts.preconditions.is_empty() {
            details.set_precondition_failure(
                parts
                    .preconditions
                    .iter()
                    .map(|(kind, subject, description)| {
                        PreconditionViolation::new(
                            kind.clone(),
                            subject.clone(),
                            description.clone(),
                        )
                    })
                    .collect::<Vec<_>>(),
            );
        }
        if let Some((subject, description)) = &parts.quota_failure {
            details.set_quota_failure(vec![QuotaViolation::new(
                subject.clone(),
                description.clone(),
            )]);
        }
        if let Some(delay) = parts.retry_after {
            details.set_retry_info(Some(delay));
        }
        let mut status = Status::with_error_details(parts.code, parts.message, details);
        // A watcher reads where to resume without decoding the details.
        if let Some(seq) = parts
            .metadata
            .get("resume_from_seq")
            .or_else(|| parts.metadata.get("oldest_seq"))
            && let Ok(value) = seq.parse()
        {
            let key = if parts.metadata.contains_key("resume_from_seq") {
                "resume-from-seq"
            } else {
                "oldest-seq"
            };
            status.metadata_mut().insert(key, value);
        }
        status
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        match err {
            StoreError::SessionExists { id } => ApiError::SessionExists(id),
            StoreError::SessionNotFound { id } => ApiError::SessionNotFound(id),
            StoreError::StaleRevision {
                session,
                expected,
                actual,
            } => ApiError::StaleRevision {
                session_id: session,
                expected,
                actual,
            },
            StoreError::Corrupt {
                tree,
                key,
                session,
                detail,
            } => ApiError::Corrupt {
                tree,
                key,
                session_id: session,
                detail,
            },
            StoreError::MarkersTrimmed { from_seq, oldest } => ApiError::MarkerOutOfRange {
                requested: from_seq,
                oldest,
            },
            StoreError::Closed => ApiError::ShuttingDown {
                resume_from_seq: None,
            },
            // Both mean the server built a write the store cannot take: a
            // defect here, never the caller's input (validated before).
            err @ (StoreError::InvalidSessionId { .. } | StoreError::InvalidWrite { .. }) => {
                ApiError::Internal(err.to_string())
            }
            err @ (StoreError::UnsupportedFormat { .. }
            | StoreError::Io(_)
            | StoreError::Engine(_)) => ApiError::Storage(err.to_string()),
        }
    }
}
