//! Plans (proposed compactions) and verdicts (their verification).

use crate::span::{Span, SpanId};

/// Why a span was chosen for eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EvictionReason {
    /// Its relevance was below the session's relevance floor.
    BelowFloor,
    /// It was among the least relevant narrative when room had to be made
    /// (or, once no narrative was left, among the oldest of the
    /// standing-instructions tier).
    Budget,
    /// It was among the oldest of the standing-instructions tier when the
    /// tier held more than its share of the window.
    TierFull,
}

/// A span a plan evicts.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// The span.
    pub span_id: SpanId,
    /// Its relevance when planned, in [0, 1].
    pub relevance: f64,
    /// Why it was chosen.
    pub reason: EvictionReason,
    /// Its tokens.
    pub tokens: u32,
}

/// A shorter form of a constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressedForm {
    /// The constraint.
    pub span_id: SpanId,
    /// The compressed text.
    pub text: String,
    /// Its tokens.
    pub tokens: u32,
}

/// A proposed compaction of one session's live context.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Spans to move to the archive, in prompt order.
    pub evicted: Vec<Eviction>,
    /// The summary span to write in their place (its `position` is that of
    /// the first evicted span).
    pub summary: Option<Span>,
    /// Constraints to replace by compressed forms.
    pub compressed: Vec<CompressedForm>,
    /// Live tokens before.
    pub tokens_before: u64,
    /// Live tokens after.
    pub tokens_after: u64,
    /// Tokens of the turn the plan makes room for.
    pub incoming_tokens: u64,
    /// The live total the plan aimed at.
    pub target_tokens: u64,
    /// Anchors the summary carries.
    pub anchors_carried: u32,
    /// Anchors this compaction had to drop.
    pub anchors_dropped: u32,
}

/// What a verification found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// A pinned constraint is missing after the compaction.
    PinnedMissing,
    /// A compressed constraint does not satisfy its predicate.
    PredicateUnsatisfied,
    /// Post-compaction live + incoming exceeds the budget.
    OverBudget,
    /// The pinned constraints alone leave no room for the turn.
    PinnedExceedBudget,
    /// The turn alone is larger than budget − pinned.
    TurnTooLarge,
    /// A summary exceeds the session's max generation.
    GenerationExceeded,
    /// A required anchor is missing from the summary.
    AnchorMissing,
    /// The post-state does not follow from the pre-state and the plan.
    PlanInconsistent,
    /// A tool exchange is evicted in part, or evicted while the turn
    /// being admitted holds it.
    ToolExchangeSplit,
}

/// One thing wrong with a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What is wrong.
    pub kind: ViolationKind,
    /// The span concerned.
    pub span_id: Option<SpanId>,
    /// A human-readable account, with the sizes at stake.
    pub detail: String,
    /// Missing terms or anchors.
    pub missing_terms: Vec<String>,
}

/// The result of verifying a plan: every violation, not only the first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    /// Empty when the plan is valid.
    pub violations: Vec<Violation>,
}

impl Verdict {
    /// Whether the plan may be committed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The sizes that decide whether a turn can be admitted; an escalation
/// names all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    /// Live tokens now.
    pub live: u64,
    /// Tokens of the incoming turn.
    pub incoming: u64,
    /// Tokens held by pinned constraints (live ones plus incoming ones).
    pub pinned: u64,
    /// The budget.
    pub budget: u64,
    /// W.
    pub window: u64,
}
