//! What an operation hands the store: the session record it leaves, the
//! change to write atomically, or the rejection that says why not.

use super::PlanId;
use crate::config::SessionConfig;

/// A session's configuration and the counters kept up to date with its
/// live context, so that reading a session never needs a scan of its
/// spans.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// The caller-chosen id, 1 to 128 bytes.
    pub id: String,
    /// The effective configuration.
    pub config: SessionConfig,
    /// When the session was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// When its content or configuration last changed.
    pub updated_at_ms: u64,
    /// Bumped by the caller on every content or configuration change;
    /// writes carry the revision they were planned against, and a stale
    /// one is refused.
    pub revision: u64,
    /// The first span id not yet given out; new spans take ids from here.
    pub next_span_id: u64,
    /// Turns admitted so far.
    pub turns: u64,
    /// The `session_seq` of the session's latest marker.
    pub marker_count: u64,
    /// Committed compactions.
    pub compactions: u64,
    /// Spans moved to the archive so far.
    pub archived_spans: u64,
    /// Tokens in the live context.
    pub live_tokens: u64,
    /// Tokens held by live pinned constraints.
    pub pinned_tokens: u64,
    /// Spans in the live context.
    pub live_spans: u64,
    /// Live pinned constraints.
    pub pinned_spans: u64,
    /// Whether automatic compaction is suspended until a caller approves
    /// one (an unclassified span arrived under `CALLER_ONLY`).
    pub approval_required: bool,
    /// The turn of the latest committed compaction; with `turns` it tells
    /// whether anything was admitted since (no compaction on an idle
    /// session).
    pub last_compaction_turn: u64,
    /// When the latest admission happened; the staleness guard reads it.
    pub last_admit_ms: u64,
    /// When the latest committed compaction happened (0 before the first):
    /// the staleness guard measures its interval from here.
    pub last_compaction_ms: u64,
}

impl SessionRecord {
    /// The record of a session just created at `now_ms`: revision 1, no
    /// spans, no markers.
    pub fn new(id: impl Into<String>, config: SessionConfig, now_ms: u64) -> Self {
        SessionRecord {
            id: id.into(),
            config,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            revision: 1,
            next_span_id: 1,
            turns: 0,
            marker_count: 0,
            compactions: 0,
            archived_spans: 0,
            live_tokens: 0,
            pinned_tokens: 0,
            live_spans: 0,
            pinned_spans: 0,
            approval_required: false,
            last_compaction_turn: 0,
            last_admit_ms: 0,
            last_compaction_ms: 0,
        }
    }
}

/// What one operation changes, to be written atomically: the store applies
/// it, and once it is acknowledged the session applies it to itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The revision the change was computed against; the store refuses it
    /// if the session has moved on.
    pub expected_revision: u64,
    /// The record after the change.
    pub record: SessionRecord,
    /// New spans, at their positions.
    pub append: Vec<crate::span::Span>,
    /// Live spans moved to the archive.
    pub evict: Vec<crate::span::SpanId>,
    /// The summary written in their place.
    pub summary: Option<crate::span::Span>,
    /// Live spans rewritten in place (same id and position): compressed,
    /// pinned or unpinned constraints.
    pub replace: Vec<crate::span::Span>,
    /// The marker, with `seq` 0 (the store assigns it). `Aborted` for a
    /// refusal, in which case nothing else changes but the record's marker
    /// count.
    pub marker: Option<crate::marker::Marker>,
}

/// Why an operation was not carried out.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// A compaction could not be made valid (escalation, or a caller's
    /// edits failed verification). `abort` records the ABORTED marker and
    /// must be written before answering; nothing else changes.
    Escalation {
        /// Live, incoming, pinned, budget, window.
        sizes: crate::plan::Sizes,
        /// Every violation found.
        violations: Vec<crate::plan::Violation>,
        /// The change that records the ABORTED marker.
        abort: Box<Change>,
    },
    /// The turn needs a compaction but the session requires approval:
    /// nothing is written; the caller reviews the plan and commits it.
    ApprovalRequired {
        /// The plan ready to commit.
        plan_id: PlanId,
        /// The sizes at stake.
        sizes: crate::plan::Sizes,
    },
    /// A plan id for another revision (the session moved on) or another
    /// session.
    StalePlan {
        /// The revision the plan was made against.
        planned: u64,
        /// The session's revision now.
        current: u64,
    },
    /// The span does not exist in the live context.
    SpanNotLive {
        /// The span.
        span_id: crate::span::SpanId,
    },
    /// Unpin of a span that is not a constraint, or pin of a summary.
    WrongClass {
        /// The span.
        span_id: crate::span::SpanId,
        /// What is wrong.
        detail: String,
    },
    /// Nothing to do: the plan evicts and compresses nothing.
    NothingToCommit,
    /// The spans asked to be taken back cannot be: fewer live spans than
    /// asked for, or a summary among them.
    NotRetractable {
        /// The span at fault, when one is.
        span_id: Option<crate::span::SpanId>,
        /// What is wrong.
        detail: String,
    },
}
