//! Compaction markers: the durable record of every compaction, committed or
//! aborted.

use crate::plan::Violation;
use crate::span::SpanId;

/// Why a marker was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompactionTrigger {
    /// An admission would have exceeded the budget.
    HardBudget,
    /// Background pre-compaction above the soft watermark.
    SoftWatermark,
    /// The staleness guard.
    Staleness,
    /// A caller's commit of a plan.
    Manual,
    /// A caller released a constraint.
    Unpin,
}

/// Whether a marker's compaction took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The live context changed as the marker says.
    Committed,
    /// Nothing was committed; the marker's violations say why.
    Aborted,
}

/// A compaction record.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// Global sequence, from 1, gapless. 0 until the store assigns it.
    pub seq: u64,
    /// The session compacted.
    pub session_id: String,
    /// The session's own marker count, from 1.
    pub session_seq: u64,
    /// Why it ran.
    pub trigger: CompactionTrigger,
    /// Committed or aborted.
    pub outcome: Outcome,
    /// Live tokens before.
    pub tokens_before: u32,
    /// Live tokens after (equal to before when aborted).
    pub tokens_after: u32,
    /// Tokens of the turn that needed room.
    pub incoming_tokens: u32,
    /// W at the time.
    pub window_tokens: u32,
    /// The budget at the time.
    pub budget_tokens: u32,
    /// Tokens held by pinned constraints at the time.
    pub pinned_tokens: u32,
    /// Spans moved to the archive.
    pub evicted: Vec<SpanId>,
    /// The evicted spans that were in the standing-instructions tier
    /// (doubtful instructions): a subset of `evicted`.
    pub tier_evicted: Vec<SpanId>,
    /// Constraints replaced by a compressed form.
    pub compressed: Vec<SpanId>,
    /// The summary span written, if any.
    pub summary_span_id: Option<SpanId>,
    /// That summary's generation (0 when none).
    pub summary_generation: u32,
    /// Pinned constraints in the context after.
    pub pinned_retained: u32,
    /// Pinned constraints the session holds.
    pub pinned_total: u32,
    /// Anchors the summary carries verbatim.
    pub anchors_carried: u32,
    /// Anchors dropped by this compaction.
    pub anchors_dropped: u32,
    /// For an aborted marker: every violation.
    pub violations: Vec<Violation>,
    /// When it was written, ms since the Unix epoch.
    pub at_ms: u64,
    /// The session revision after the marker (unchanged when aborted).
    pub session_revision: u64,
    /// The session's turn count after the marker: for a compaction at
    /// admission, the turn it admitted; for an aborted one, the turns
    /// admitted before the refused one. 0 in markers written before the
    /// field existed.
    pub turn: u64,
    /// Who asked, for UNPIN and MANUAL.
    pub actor: String,
    /// A human-readable account.
    pub detail: String,
}
