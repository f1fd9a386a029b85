//! A session's state as the policy sees it: its record (configuration and
//! counters) and, around it, the operations that change it.

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
