//! What the inspector shows, as plain data: each page is rendered from one
//! of these, and its JSON twin is the same value serialised. Built from
//! the domain's types (never the wire's), with session ids as the caller
//! knows them.

use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::plan::Violation;
use ctxbroker_core::span::{ClassSource, Role, SpanClass};
use ctxbroker_core::{Marker, Span};
use ctxbroker_store::SessionRecord;
use serde::Serialize;

use crate::tenant::{self, Scope};

/// The most characters of a span's text a page shows; the span's own page
/// shows it whole.
pub(crate) const TEXT_CHARS: usize = 2_000;

/// The sessions list.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SessionList {
    /// One page of sessions, in id order.
    pub(crate) sessions: Vec<SessionItem>,
    /// The id to pass as `after` for the next page; `None` on the last.
    pub(crate) next_after: Option<String>,
}

/// One session, as the list and the session's page head show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SessionItem {
    /// The id as the caller names it.
    pub(crate) id: String,
    /// The tenant that owns it; `None` for a session created without one.
    pub(crate) tenant: Option<String>,
    /// Tokens in the live context.
    pub(crate) live_tokens: u64,
    /// The most live tokens the session may hold.
    pub(crate) budget_tokens: u32,
    /// The model's window, W.
    pub(crate) window_tokens: u32,
    /// Where background compaction starts.
    pub(crate) soft_watermark_tokens: u32,
    /// Spans in the live context.
    pub(crate) live_spans: u64,
    /// Live pinned constraints.
    pub(crate) pinned_spans: u64,
    /// Their tokens.
    pub(crate) pinned_tokens: u64,
    /// Turns admitted.
    pub(crate) turns: u64,
    /// The session's revision.
    pub(crate) revision: u64,
    /// Committed compactions.
    pub(crate) compactions: u64,
    /// Spans in the archive.
    pub(crate) archived_spans: u64,
    /// The session's own number of its latest marker (0: none yet).
    pub(crate) last_marker: u64,
    /// When the latest committed compaction happened, ms since the Unix
    /// epoch (0: none yet).
    pub(crate) last_compaction_ms: u64,
    /// When the session last changed, ms since the Unix epoch.
    pub(crate) last_activity_ms: u64,
    /// Whether automatic compaction waits for a caller's approval.
    pub(crate) approval_required: bool,
}

impl SessionItem {
    /// A session record as `scope` sees it.
    pub(crate) fn of(record: &SessionRecord, scope: &Scope) -> SessionItem {
        let config = &record.config;
        SessionItem {
            id: local(scope, &record.id),
            tenant: tenant::tenant_of(&record.id).map(str::to_owned),
            live_tokens: record.live_tokens,
            budget_tokens: config.budget_tokens(),
            window_tokens: config.window_tokens,
            soft_watermark_tokens: config.soft_watermark_tokens(),
            live_spans: record.live_spans,
            pinned_spans: record.pinned_spans,
            pinned_tokens: record.pinned_tokens,
            turns: record.turns,
            revision: record.revision,
            compactions: record.compactions,
            archived_spans: record.archived_spans,
            last_marker: record.marker_count,
            last_compaction_ms: record.last_compaction_ms,
            last_activity_ms: record.updated_at_ms,
            approval_required: record.approval_required,
        }
    }
}

/// A session's page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SessionView {
    /// The session.
    pub(crate) session: SessionItem,
    /// The window's composition.
    pub(crate) window: WindowBar,
    /// One page of the live spans, in prompt order.
    pub(crate) spans: SpanPage,
    /// One page of the session's markers, newest first.
    pub(crate) markers: MarkerPage,
    /// The marker sequence live updates start from: every marker below it
    /// was committed when the page was read.
    pub(crate) next_seq: u64,
}

/// The live context's tokens by class, against the window.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WindowBar {
    /// W.
    pub(crate) window_tokens: u32,
    /// The budget: W less the reserved overhead.
    pub(crate) budget_tokens: u32,
    /// The soft watermark.
    pub(crate) soft_watermark_tokens: u32,
    /// All live tokens.
    pub(crate) live_tokens: u64,
    /// Each class present, in the order the bar stacks them.
    pub(crate) classes: Vec<ClassShare>,
}

/// One class's share of the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ClassShare {
    /// The class's name.
    pub(crate) class: &'static str,
    /// Its tokens.
    pub(crate) tokens: u64,
    /// Its spans.
    pub(crate) spans: u64,
}

/// The order the bar stacks classes in: what may never go first.
const STACKED: [SpanClass; 4] = [
    SpanClass::Constraint,
    SpanClass::Protected,
    SpanClass::Summary,
    SpanClass::Narrative,
];

impl WindowBar {
    /// The bar of a session's record and live spans. Pinned constraints,
    /// summaries and narrative always have a row; the standing
    /// instructions only when the session holds some.
    pub(crate) fn of<'a>(
        record: &SessionRecord,
        spans: impl Iterator<Item = &'a Span>,
    ) -> WindowBar {
        let mut shares: Vec<ClassShare> = STACKED
            .iter()
            .map(|&class| ClassShare {
                class: class_name(class),
                tokens: 0,
                spans: 0,
            })
            .collect();
        for span in spans {
            if let Some(i) = STACKED.iter().position(|&c| c == span.class()) {
                shares[i].tokens += u64::from(span.tokens);
                shares[i].spans += 1;
            }
        }
        shares.retain(|s| s.class != class_name(SpanClass::Protected) || s.spans > 0);
        let config = &record.config;
        WindowBar {
            window_tokens: config.window_tokens,
            budget_tokens: config.budget_tokens(),
            soft_watermark_tokens: config.soft_watermark_tokens(),
            live_tokens: record.live_tokens,
            classes: shares,
        }
    }
}

/// A page of spans.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SpanPage {
    /// The index of the first span shown among all of them.
    pub(crate) from: usize,
    /// The most spans a page of this view shows.
    pub(crate) limit: usize,
    /// All the spans there are.
    pub(crate) total: usize,
    /// The spans shown.
    pub(crate) items: Vec<SpanItem>,
    /// The `from` of the next page; `None` on the last.
    pub(crate) next_from: Option<usize>,
}

/// One span.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SpanItem {
    /// Its id in the session.
    pub(crate) id: u64,
    /// Its sort key in the live context.
    pub(crate) position: u64,
    /// The turn that admitted it (a summary: the turn that compacted).
    pub(crate) turn: u64,
    /// Who produced it.
    pub(crate) role: &'static str,
    /// Its class.
    pub(crate) class: &'static str,
    /// Who decided the class.
    pub(crate) source: &'static str,
    /// The rule that decided it, when the rules did.
    pub(crate) rule: String,
    /// Its tokens.
    pub(crate) tokens: u32,
    /// Its relevance at the latest turn, for live spans.
    pub(crate) relevance: Option<f64>,
    /// A summary's generation (0 for admitted spans).
    pub(crate) generation: u32,
    /// The text, cut to `TEXT_CHARS` characters on pages of many spans.
    pub(crate) text: String,
    /// The text's whole length in characters.
    pub(crate) text_chars: usize,
    /// Whether `text` was cut.
    pub(crate) truncated: bool,
    /// A compressed constraint's text as admitted, when it was compressed.
    pub(crate) original: Option<String>,
    /// The tool exchange it belongs to, when any.
    pub(crate) tool_call_id: Option<String>,
    /// For an archived span: the marker that evicted it.
    pub(crate) archived_by_seq: Option<u64>,
}

impl SpanItem {
    /// A span, its text cut to `max_chars` characters.
    pub(crate) fn of(span: &Span, relevance: Option<f64>, max_chars: usize) -> SpanItem {
        let (text, truncated) = cut(&span.text, max_chars);
        SpanItem {
            id: span.id,
            position: span.position,
            turn: span.turn,
            role: role_name(span.role),
            class: class_name(span.class()),
            source: source_name(span.classification.source),
            rule: span.classification.rule.clone(),
            tokens: span.tokens,
            relevance: relevance.filter(|r| r.is_finite()),
            generation: span.generation,
            text,
            text_chars: span.text.chars().count(),
            truncated,
            original: span.original.as_ref().map(|o| cut(&o.text, max_chars).0),
            tool_call_id: span.tool_call_id().map(str::to_owned),
            archived_by_seq: None,
        }
    }
}

/// A page of markers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MarkerPage {
    /// Markers, newest first.
    pub(crate) items: Vec<MarkerItem>,
    /// Pass as `markers_before` for older ones; `None` when none are left.
    pub(crate) before: Option<u64>,
}

/// One compaction marker.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MarkerItem {
    /// The global sequence.
    pub(crate) seq: u64,
    /// The session's own count.
    pub(crate) session_seq: u64,
    /// The session, as the caller names it.
    pub(crate) session_id: String,
    /// The turn count after it (0 in markers older than the field).
    pub(crate) turn: u64,
    /// When, ms since the Unix epoch.
    pub(crate) at_ms: u64,
    /// Why it ran.
    pub(crate) trigger: &'static str,
    /// Committed or aborted.
    pub(crate) outcome: &'static str,
    /// Live tokens before.
    pub(crate) tokens_before: u32,
    /// Live tokens after.
    pub(crate) tokens_after: u32,
    /// The turn that needed room.
    pub(crate) incoming_tokens: u32,
    /// W at the time.
    pub(crate) window_tokens: u32,
    /// The budget at the time.
    pub(crate) budget_tokens: u32,
    /// Pinned tokens at the time.
    pub(crate) pinned_tokens: u32,
    /// Spans moved to the archive.
    pub(crate) evicted: Vec<u64>,
    /// Those of them from the standing-instructions tier.
    pub(crate) tier_evicted: Vec<u64>,
    /// Constraints compressed.
    pub(crate) compressed: Vec<u64>,
    /// The summary written, if any.
    pub(crate) summary_span_id: Option<u64>,
    /// Its generation.
    pub(crate) summary_generation: u32,
    /// Pinned constraints live after.
    pub(crate) pinned_retained: u32,
    /// Pinned constraints held.
    pub(crate) pinned_total: u32,
    /// Anchors the summary carries.
    pub(crate) anchors_carried: u32,
    /// Anchors dropped.
    pub(crate) anchors_dropped: u32,
    /// Why an aborted compaction was refused.
    pub(crate) violations: Vec<ViolationItem>,
    /// Who asked, for manual compactions and unpins.
    pub(crate) actor: String,
    /// A human-readable account.
    pub(crate) detail: String,
}

/// One reason a compaction was refused.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ViolationItem {
    /// The kind, in snake case.
    pub(crate) kind: String,
    /// The span concerned.
    pub(crate) span_id: Option<u64>,
    /// What was wrong.
    pub(crate) detail: String,
    /// The predicate's terms a form lacked.
    pub(crate) missing_terms: Vec<String>,
}

impl MarkerItem {
    /// A marker as `scope` sees it.
    pub(crate) fn of(marker: &Marker, scope: &Scope) -> MarkerItem {
        MarkerItem {
            seq: marker.seq,
            session_seq: marker.session_seq,
            session_id: local(scope, &marker.session_id),
            turn: marker.turn,
            at_ms: marker.at_ms,
            trigger: trigger_name(marker.trigger),
            outcome: match marker.outcome {
                Outcome::Committed => "committed",
                Outcome::Aborted => "aborted",
            },
            tokens_before: marker.tokens_before,
            tokens_after: marker.tokens_after,
            incoming_tokens: marker.incoming_tokens,
            window_tokens: marker.window_tokens,
            budget_tokens: marker.budget_tokens,
            pinned_tokens: marker.pinned_tokens,
            evicted: marker.evicted.clone(),
            tier_evicted: marker.tier_evicted.clone(),
            compressed: marker.compressed.clone(),
            summary_span_id: marker.summary_span_id,
            summary_generation: marker.summary_generation,
            pinned_retained: marker.pinned_retained,
            pinned_total: marker.pinned_total,
            anchors_carried: marker.anchors_carried,
            anchors_dropped: marker.anchors_dropped,
            violations: marker.violations.iter().map(ViolationItem::of).collect(),
            actor: marker.actor.clone(),
            detail: marker.detail.clone(),
        }
    }

    /// Whether it was refused.
    pub(crate) fn aborted(&self) -> bool {
        self.outcome == "aborted"
    }
}

impl ViolationItem {
    fn of(v: &Violation) -> ViolationItem {
        ViolationItem {
            kind: snake_case(&format!("{:?}", v.kind)),
            span_id: v.span_id,
            detail: v.detail.clone(),
            missing_terms: v.missing_terms.clone(),
        }
    }
}

/// A page of a session's archived spans.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ArchiveView {
    /// The session, as the caller names it.
    pub(crate) session_id: String,
    /// Only spans of this turn, when asked.
    pub(crate) turn: Option<u64>,
    /// The spans, by id.
    pub(crate) items: Vec<SpanItem>,
    /// Pass as `after` for the next page; `None` on the last.
    pub(crate) next_after: Option<u64>,
}

/// One span's page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SpanView {
    /// The session, as the caller names it.
    pub(crate) session_id: String,
    /// Whether it is in the live context.
    pub(crate) live: bool,
    /// The span, its text whole.
    pub(crate) span: SpanItem,
}

/// The id a caller in `scope` knows a session by.
fn local(scope: &Scope, full_id: &str) -> String {
    scope.local_id(full_id).unwrap_or(full_id).to_owned()
}

/// `text` cut to `max` characters, and whether it was.
fn cut(text: &str, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (text[..at].to_owned(), true),
        None => (text.to_owned(), false),
    }
}

/// `CamelCase` as `camel_case`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A class's name on the pages.
pub(crate) fn class_name(class: SpanClass) -> &'static str {
    match class {
        SpanClass::Constraint => "constraint",
        SpanClass::Protected => "protected",
        SpanClass::Summary => "summary",
        SpanClass::Narrative => "narrative",
    }
}

/// What the pages call a class's share of the window.
pub(crate) fn class_label(class: &str) -> &'static str {
    match class {
        "constraint" => "Pinned constraints",
        "protected" => "Standing instructions",
        "summary" => "Summaries",
        _ => "Narrative",
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::System => "system",
    }
}

fn source_name(source: ClassSource) -> &'static str {
    match source {
        ClassSource::Caller => "caller",
        ClassSource::Rules => "rules",
        ClassSource::Broker => "broker",
    }
}

fn trigger_name(trigger: CompactionTrigger) -> &'static str {
    match trigger {
        CompactionTrigger::HardBudget => "hard_budget",
        CompactionTrigger::SoftWatermark => "soft_watermark",
        CompactionTrigger::Staleness => "staleness",
        CompactionTrigger::Manual => "manual",
        CompactionTrigger::Unpin => "unpin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_counts_characters_not_bytes() {
        assert_eq!(cut("héllo", 2), ("hé".to_owned(), true));
        assert_eq!(cut("héllo", 5), ("héllo".to_owned(), false));
        assert_eq!(cut("", 0), (String::new(), false));
    }

    #[test]
    fn violation_kinds_read_in_snake_case() {
        assert_eq!(snake_case("PinnedExceedBudget"), "pinned_exceed_budget");
        assert_eq!(snake_case("OverBudget"), "over_budget");
    }
}
