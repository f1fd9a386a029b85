//! The stored messages, one per kind of record.

use prost::Message;

/// A session record.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct SessionRow {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) config: Option<ConfigRow>,
    #[prost(uint64, tag = "3")]
    pub(crate) created_at_ms: u64,
    #[prost(uint64, tag = "4")]
    pub(crate) updated_at_ms: u64,
    #[prost(uint64, tag = "5")]
    pub(crate) revision: u64,
    #[prost(uint64, tag = "6")]
    pub(crate) next_span_id: u64,
    #[prost(uint64, tag = "7")]
    pub(crate) turns: u64,
    #[prost(uint64, tag = "8")]
    pub(crate) marker_count: u64,
    #[prost(uint64, tag = "9")]
    pub(crate) compactions: u64,
    #[prost(uint64, tag = "10")]
    pub(crate) archived_spans: u64,
    #[prost(uint64, tag = "11")]
    pub(crate) live_tokens: u64,
    #[prost(uint64, tag = "12")]
    pub(crate) pinned_tokens: u64,
    #[prost(uint64, tag = "13")]
    pub(crate) live_spans: u64,
    #[prost(uint64, tag = "14")]
    pub(crate) pinned_spans: u64,
    #[prost(bool, tag = "15")]
    pub(crate) approval_required: bool,
    #[prost(uint64, tag = "16")]
    pub(crate) last_compaction_turn: u64,
    #[prost(uint64, tag = "17")]
    pub(crate) last_admit_ms: u64,
    #[prost(uint64, tag = "18")]
    pub(crate) last_compaction_ms: u64,
    /// The commit epoch of the batch that wrote this record, when that
    /// batch carried its epoch here instead of in the meta tree (see
    /// `record::stamp_epoch`); 0 otherwise.
    #[prost(uint64, tag = "19")]
    pub(crate) commit_epoch: u64,
}

/// The commit epoch a session's record may carry (field 19 of
/// [`SessionRow`]), read and written without the rest of the record.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct SessionEpochRow {
    #[prost(uint64, tag = "19")]
    pub(crate) commit_epoch: u64,
}

/// A session configuration.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ConfigRow {
    #[prost(uint32, tag = "1")]
    pub(crate) window_tokens: u32,
    #[prost(double, tag = "2")]
    pub(crate) alpha: f64,
    #[prost(double, tag = "3")]
    pub(crate) soft_watermark: f64,
    #[prost(uint32, tag = "4")]
    pub(crate) reserved_overhead_tokens: u32,
    #[prost(double, tag = "5")]
    pub(crate) relevance_floor: f64,
    #[prost(uint32, tag = "6")]
    pub(crate) trigger: u32,
    #[prost(uint64, tag = "7")]
    pub(crate) staleness_interval_ms: u64,
    #[prost(uint32, tag = "8")]
    pub(crate) tokenizer: u32,
    #[prost(uint32, tag = "9")]
    pub(crate) classifier: u32,
    #[prost(uint32, tag = "10")]
    pub(crate) max_summary_generations: u32,
    #[prost(uint32, tag = "11")]
    pub(crate) anchor_policy: u32,
    #[prost(uint32, tag = "12")]
    pub(crate) mode: u32,
    #[prost(uint32, tag = "13")]
    pub(crate) summary_max_tokens: u32,
    #[prost(message, optional, tag = "14")]
    pub(crate) workload: Option<WorkloadRow>,
    /// Absent in records written before relevance was configurable: the
    /// defaults then apply.
    #[prost(message, optional, tag = "15")]
    pub(crate) relevance: Option<RelevanceRow>,
    #[prost(uint32, tag = "16")]
    pub(crate) anchor_budget_tokens: u32,
    /// Absent in records written before the classifier was tunable: the
    /// model's own threshold and no phrases then apply.
    #[prost(message, optional, tag = "17")]
    pub(crate) classifier_tuning: Option<TuningRow>,
    /// 0 (system) in records written before summaries could be presented
    /// otherwise.
    #[prost(uint32, tag = "18")]
    pub(crate) summary_presentation: u32,
    /// Empty: the default prefix.
    #[prost(string, tag = "19")]
    pub(crate) summary_prefix: String,
}

/// A session's adjustments to the classifier.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TuningRow {
    #[prost(double, optional, tag = "1")]
    pub(crate) pin_threshold: Option<f64>,
    #[prost(string, repeated, tag = "2")]
    pub(crate) pin_phrases: Vec<String>,
    /// Absent in records written before the standing-instructions tier:
    /// the default share then applies.
    #[prost(double, optional, tag = "3")]
    pub(crate) protected_fraction: Option<f64>,
}

/// A session's relevance weights.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RelevanceRow {
    #[prost(double, tag = "1")]
    pub(crate) recency: f64,
    #[prost(double, tag = "2")]
    pub(crate) similarity: f64,
    #[prost(double, tag = "3")]
    pub(crate) length: f64,
    #[prost(double, tag = "4")]
    pub(crate) hint: f64,
    #[prost(double, tag = "5")]
    pub(crate) recency_half_life_turns: f64,
}

/// The admitted form of a compressed constraint.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct OriginalRow {
    #[prost(string, tag = "1")]
    pub(crate) text: String,
    #[prost(uint32, tag = "2")]
    pub(crate) tokens: u32,
}

/// A declared workload.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct WorkloadRow {
    #[prost(uint32, tag = "1")]
    pub(crate) window_tokens: u32,
    #[prost(double, tag = "2")]
    pub(crate) alpha: f64,
    #[prost(uint32, tag = "3")]
    pub(crate) reserved_overhead_tokens: u32,
    #[prost(uint64, tag = "4")]
    pub(crate) cadence_ms: u64,
    #[prost(uint32, tag = "5")]
    pub(crate) max_single_injection_tokens: u32,
    #[prost(uint32, tag = "6")]
    pub(crate) max_interval_accumulation_tokens: u32,
    #[prost(bool, tag = "7")]
    pub(crate) idle_gaps: bool,
}

/// A span.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct SpanRow {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) position: u64,
    #[prost(uint32, tag = "3")]
    pub(crate) role: u32,
    #[prost(message, optional, tag = "4")]
    pub(crate) classification: Option<ClassificationRow>,
    #[prost(string, tag = "5")]
    pub(crate) text: String,
    #[prost(uint32, tag = "6")]
    pub(crate) tokens: u32,
    #[prost(uint32, tag = "7")]
    pub(crate) generation: u32,
    #[prost(uint64, tag = "8")]
    pub(crate) turn: u64,
    #[prost(message, optional, tag = "9")]
    pub(crate) predicate: Option<PredicateRow>,
    #[prost(message, optional, tag = "10")]
    pub(crate) summary: Option<SummaryRow>,
    #[prost(double, optional, tag = "11")]
    pub(crate) relevance_hint: Option<f64>,
    #[prost(uint64, tag = "12")]
    pub(crate) admitted_at_ms: u64,
    #[prost(message, optional, tag = "13")]
    pub(crate) original: Option<OriginalRow>,
    #[prost(message, optional, tag = "14")]
    pub(crate) attributes: Option<AttributesRow>,
    /// The span's term vector for search, packed (see
    /// `ctxbroker_core::search::codec`), derived once when the span was
    /// stored. Absent in rows written before term vectors lived in the
    /// span's own row, which read as "derive it from the text".
    #[prost(bytes = "vec", optional, tag = "15")]
    pub(crate) terms: Option<Vec<u8>>,
    /// The span's facts as a seed (see `ctxbroker_core::facts::seed`),
    /// derived when the span was admitted, so that a session read back
    /// takes its facts from here rather than from the text. Absent in rows
    /// written before seeds, for a span rewritten in place and for a row
    /// re-encoded from its span (an archived one, a migrated one): the
    /// facts are then derived from the text. A seed written under other
    /// rules is not read.
    #[prost(bytes = "vec", optional, tag = "16")]
    pub(crate) facts: Option<Vec<u8>>,
}

/// What search reads of a span's row: its id and term vector. Decoding
/// it skips the text and everything else without copying them.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct SpanTermsView {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) position: u64,
    #[prost(bytes = "vec", optional, tag = "15")]
    pub(crate) terms: Option<Vec<u8>>,
}

/// What search reads of an archived span's row (see [`SpanTermsView`]).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ArchivedTermsView {
    #[prost(message, optional, tag = "1")]
    pub(crate) span: Option<SpanTermsView>,
}

/// What a caller attached to a span. Absent in records written before
/// spans carried attributes, which read as none.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct AttributesRow {
    #[prost(string, tag = "1")]
    pub(crate) tool_call_id: String,
    #[prost(string, tag = "2")]
    pub(crate) tool_name: String,
    #[prost(btree_map = "string, string", tag = "3")]
    pub(crate) metadata: std::collections::BTreeMap<String, String>,
}

/// A span's classification.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ClassificationRow {
    #[prost(uint32, tag = "1")]
    pub(crate) class: u32,
    #[prost(uint32, tag = "2")]
    pub(crate) source: u32,
    #[prost(string, tag = "3")]
    pub(crate) rule: String,
}

/// A constraint's predicate.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct PredicateRow {
    #[prost(uint32, tag = "1")]
    pub(crate) modality: u32,
    #[prost(string, repeated, tag = "2")]
    pub(crate) required_terms: Vec<String>,
    #[prost(uint32, tag = "3")]
    pub(crate) source: u32,
}

/// What a summary stands for.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct SummaryRow {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) covers: Vec<u64>,
    #[prost(string, repeated, tag = "2")]
    pub(crate) anchors: Vec<String>,
    #[prost(uint32, tag = "3")]
    pub(crate) anchors_dropped: u32,
}

/// An archived span.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ArchivedRow {
    #[prost(message, optional, tag = "1")]
    pub(crate) span: Option<SpanRow>,
    #[prost(uint64, tag = "2")]
    pub(crate) archived_by_seq: u64,
}

/// The span a caller's idempotency key admitted.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct KeyRow {
    #[prost(uint64, tag = "1")]
    pub(crate) span_id: u64,
}

/// A span's term vector, packed (see `ctxbroker_core::search::codec`), as
/// stores of format 1 kept it in a tree of its own; read only to migrate
/// them.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TermRow {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) packed: Vec<u8>,
}

/// An entry of a pin set.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct PinRow {
    #[prost(uint64, tag = "1")]
    pub(crate) span_id: u64,
    #[prost(message, optional, tag = "2")]
    pub(crate) predicate: Option<PredicateRow>,
}

/// A marker.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct MarkerRow {
    #[prost(uint64, tag = "1")]
    pub(crate) seq: u64,
    #[prost(string, tag = "2")]
    pub(crate) session_id: String,
    #[prost(uint64, tag = "3")]
    pub(crate) session_seq: u64,
    #[prost(uint32, tag = "4")]
    pub(crate) trigger: u32,
    #[prost(uint32, tag = "5")]
    pub(crate) outcome: u32,
    #[prost(uint32, tag = "6")]
    pub(crate) tokens_before: u32,
    #[prost(uint32, tag = "7")]
    pub(crate) tokens_after: u32,
    #[prost(uint32, tag = "8")]
    pub(crate) incoming_tokens: u32,
    #[prost(uint32, tag = "9")]
    pub(crate) window_tokens: u32,
    #[prost(uint32, tag = "10")]
    pub(crate) budget_tokens: u32,
    #[prost(uint32, tag = "11")]
    pub(crate) pinned_tokens: u32,
    #[prost(uint64, repeated, tag = "12")]
    pub(crate) evicted: Vec<u64>,
    #[prost(uint64, repeated, tag = "13")]
    pub(crate) compressed: Vec<u64>,
    #[prost(uint64, optional, tag = "14")]
    pub(crate) summary_span_id: Option<u64>,
    #[prost(uint32, tag = "15")]
    pub(crate) summary_generation: u32,
    #[prost(uint32, tag = "16")]
    pub(crate) pinned_retained: u32,
    #[prost(uint32, tag = "17")]
    pub(crate) pinned_total: u32,
    #[prost(uint32, tag = "18")]
    pub(crate) anchors_carried: u32,
    #[prost(uint32, tag = "19")]
    pub(crate) anchors_dropped: u32,
    #[prost(message, repeated, tag = "20")]
    pub(crate) violations: Vec<ViolationRow>,
    #[prost(uint64, tag = "21")]
    pub(crate) at_ms: u64,
    #[prost(uint64, tag = "22")]
    pub(crate) session_revision: u64,
    #[prost(string, tag = "23")]
    pub(crate) actor: String,
    #[prost(string, tag = "24")]
    pub(crate) detail: String,
    /// Empty in markers written before the standing-instructions tier.
    #[prost(uint64, repeated, tag = "25")]
    pub(crate) tier_evicted: Vec<u64>,
    /// 0 in markers written before markers carried their turn.
    #[prost(uint64, tag = "26")]
    pub(crate) turn: u64,
}

/// A verification violation inside an aborted marker.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ViolationRow {
    #[prost(uint32, tag = "1")]
    pub(crate) kind: u32,
    #[prost(uint64, optional, tag = "2")]
    pub(crate) span_id: Option<u64>,
    #[prost(string, tag = "3")]
    pub(crate) detail: String,
    #[prost(string, repeated, tag = "4")]
    pub(crate) missing_terms: Vec<String>,
}

/// The marker log's bounds, kept in meta so that neither end has to be
/// found by scanning.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct MarkerLogRow {
    #[prost(uint64, tag = "1")]
    pub(crate) next_seq: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) oldest_seq: u64,
}
