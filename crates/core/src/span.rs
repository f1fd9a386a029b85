//! Spans: the units of content in a session's context.

use std::collections::BTreeMap;

/// A span's id, unique within its session, assigned on admission in
/// increasing order.
pub type SpanId = u64;

/// Who produced a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The human user of the agent.
    User,
    /// The model's own turn.
    Assistant,
    /// The output of a tool call.
    Tool,
    /// A system or developer instruction.
    System,
}

/// What a span is, for compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanClass {
    /// Evictable, lowest relevance first.
    Narrative,
    /// Pinned: compressed at most, never dropped until unpinned.
    Constraint,
    /// Written by compaction in place of evicted narrative.
    Summary,
    /// A user turn that reads like a standing instruction but is not sure
    /// enough to pin: kept verbatim in the session's bounded
    /// standing-instructions tier, evicted only after all narrative and
    /// summaries (oldest first), or when the tier outgrows its share of
    /// the window.
    Protected,
}

/// Who decided a span's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClassSource {
    /// The caller said so.
    Caller,
    /// The rule classifier decided.
    Rules,
    /// The broker wrote the span itself (summaries).
    Broker,
}

/// A span's class with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The class.
    pub class: SpanClass,
    /// Who decided it.
    pub source: ClassSource,
    /// The rule that fired, when the rules decided ("prohibition:never",
    /// "role:tool", "default:narrative"); empty otherwise.
    pub rule: String,
}

/// What a constraint demands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Modality {
    /// An action is forbidden.
    Prohibition,
    /// An invariant is required.
    Requirement,
    /// The allowed set is narrowed ("only ...").
    Restriction,
    /// Earlier text is overridden.
    Correction,
}

/// Who wrote a predicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PredicateSource {
    /// Derived from the constraint's text.
    Derived,
    /// Given by the caller.
    Caller,
}

/// A constraint's demand in checkable form: any form of the constraint (its
/// text, or a compressed text) must keep the modality and contain every
/// required term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Predicate {
    /// The kind of demand.
    pub modality: Modality,
    /// Terms every form must contain, case-insensitively, as whole words.
    pub required_terms: Vec<String>,
    /// Who wrote it.
    pub source: PredicateSource,
}

/// What a summary span stands for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SummaryInfo {
    /// The ids of the spans it replaced (summaries it replaced included).
    pub covers: Vec<SpanId>,
    /// The anchors it carries verbatim, in the order they appear in it.
    pub anchors: Vec<String>,
    /// Anchors that had to be left out, this generation and before.
    pub anchors_dropped: u32,
}

/// The admitted form of a constraint that now stands in the context in a
/// compressed form: kept with the span so that nothing is silently lost and
/// every later check can compare against the original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginalForm {
    /// The text as admitted.
    pub text: String,
    /// Its tokens.
    pub tokens: u32,
}

/// What a caller attached to a span besides its text, kept and returned
/// as given. Of it the policy reads only `tool_call_id`: the live spans of
/// a session sharing one form a tool exchange (a call and its result),
/// which a compaction evicts whole or not at all, since a result without
/// its call, or a call without its result, is refused by the model
/// providers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    /// The tool exchange the span belongs to; empty for none.
    pub tool_call_id: String,
    /// The tool's name, on a call or a result.
    pub tool_name: String,
    /// The caller's own attributes, in key order.
    pub metadata: BTreeMap<String, String>,
}

impl Attributes {
    /// Whether there is nothing to keep.
    pub fn is_empty(&self) -> bool {
        self.tool_call_id.is_empty() && self.tool_name.is_empty() && self.metadata.is_empty()
    }

    /// The bytes of text held: what a storage quota counts.
    pub fn text_bytes(&self) -> usize {
        self.tool_call_id.len()
            + self.tool_name.len()
            + self
                .metadata
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// One unit of content in a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// Unique within the session.
    pub id: SpanId,
    /// The span's sort key within the live context: admitted spans take
    /// their id; a summary takes the position of the first span it
    /// replaced, so it stands where that span stood. Unique among live
    /// spans.
    pub position: u64,
    /// Who produced it.
    pub role: Role,
    /// Its class and where the class came from.
    pub classification: Classification,
    /// The content (for a compressed constraint, the compressed form).
    pub text: String,
    /// Tokens of `text` in the session's tokenizer.
    pub tokens: u32,
    /// 0 for admitted spans; a summary's is 1 + the highest it replaced.
    pub generation: u32,
    /// The turn that admitted it (a summary: the turn that compacted).
    pub turn: u64,
    /// For constraints: what it demands.
    pub predicate: Option<Predicate>,
    /// For summaries: what it stands for.
    pub summary: Option<SummaryInfo>,
    /// The caller's relevance hint in [0, 1].
    pub relevance_hint: Option<f64>,
    /// When it was admitted, in milliseconds since the Unix epoch (given by
    /// the caller of the policy: the core reads no clock).
    pub admitted_at_ms: u64,
    /// For a compressed constraint: the form it was admitted in.
    pub original: Option<OriginalForm>,
    /// What the caller attached to it, when anything (boxed: most spans
    /// carry none).
    pub attributes: Option<Box<Attributes>>,
}

impl Span {
    /// The span's class.
    pub fn class(&self) -> SpanClass {
        self.classification.class
    }

    /// Whether the span is a pinned constraint.
    pub fn is_pinned(&self) -> bool {
        self.classification.class == SpanClass::Constraint
    }

    /// Whether the span is in the standing-instructions tier.
    pub fn is_protected(&self) -> bool {
        self.classification.class == SpanClass::Protected
    }

    /// The tool exchange the span belongs to, when it belongs to one.
    pub fn tool_call_id(&self) -> Option<&str> {
        self.attributes
            .as_deref()
            .map(|a| a.tool_call_id.as_str())
            .filter(|id| !id.is_empty())
    }
}
