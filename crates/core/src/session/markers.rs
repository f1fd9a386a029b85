//! The changes that carry a marker: a committed compaction's (admission,
//! manual or background) and an abort's, and the fields every marker
//! records.

use super::{Change, Rejection, Session, SessionRecord, Totals, first_indices, t32};
use crate::facts::LiveRow;
use crate::fasthash::{self, FastSet};
use crate::marker::{CompactionTrigger, Marker, Outcome};
use crate::plan::{Plan, Sizes, Violation};
use crate::span::{Span, SpanClass, SpanId};

/// What a compaction is committed for, for its record and marker.
pub(super) struct Committing<'a> {
    pub(super) trigger: CompactionTrigger,
    pub(super) actor: &'a str,
    pub(super) detail: String,
    /// The turn admitted with the compaction, if any.
    pub(super) turn: Option<Vec<Span>>,
    /// The rows of the live spans (see [`LiveRow`]), when the caller holds
    /// facts it checked against them: read instead of the spans.
    pub(super) rows: Option<&'a [LiveRow]>,
}

impl Session {
    /// The change that commits a verified plan (and appends the turn it
    /// made room for, if any), with its marker.
    pub(super) fn compaction(
        &self,
        plan: &Plan,
        post: &[&Span],
        committing: Committing<'_>,
        now_ms: u64,
    ) -> Change {
        let compacted = match committing.rows {
            Some(rows) => Totals::of_post(&self.spans, rows, post),
            None => Totals::of(post.iter().copied()),
        };
        let replace: Vec<Span> = if plan.compressed.is_empty() {
            Vec::new()
        } else {
            // For each compressed form, in the plan's order, the first span
            // of post with its id: one pass over post, not one per form.
            let first = first_indices(
                plan.compressed.iter().map(|f| f.span_id),
                post.iter().map(|s| s.id),
            );
            plan.compressed
                .iter()
                .filter_map(|f| first.get(&f.span_id).copied().flatten())
                .map(|i| post[i].clone())
                .collect()
        };
        let summary = plan.summary.clone();
        let turn = committing.turn.unwrap_or_default();
        let admitted = !turn.is_empty() || committing.trigger == CompactionTrigger::HardBudget;
        // The record's counters: post's, counted once above, and the turn's.
        let mut record = self.record.clone();
        compacted.write_to(&mut record);
        Totals::of(&turn).add_to(&mut record);
        record.revision += 1;
        record.updated_at_ms = now_ms;
        if admitted {
            record.turns += 1;
            record.next_span_id += turn.len() as u64;
            record.last_admit_ms = now_ms;
        }
        if let Some(s) = &summary {
            record.next_span_id = record.next_span_id.max(s.id + 1);
        }
        record.compactions += 1;
        record.archived_spans += plan.evicted.len() as u64;
        record.marker_count += 1;
        record.last_compaction_turn = record.turns;
        record.last_compaction_ms = now_ms;
        let (pinned_total, tier_evicted) = self.pinned_and_tier_evicted(plan, committing.rows);
        let marker = Marker {
            tokens_after: t32(compacted.live_tokens),
            incoming_tokens: t32(plan.incoming_tokens),
            pinned_tokens: t32(compacted.pinned_tokens),
            evicted: plan.evicted.iter().map(|e| e.span_id).collect(),
            tier_evicted,
            compressed: plan.compressed.iter().map(|f| f.span_id).collect(),
            summary_span_id: summary.as_ref().map(|s| s.id),
            summary_generation: summary.as_ref().map_or(0, |s| s.generation),
            pinned_retained: t32(compacted.pinned_spans),
            pinned_total: t32(pinned_total),
            anchors_carried: plan.anchors_carried,
            anchors_dropped: plan.anchors_dropped,
            detail: committing.detail,
            ..self.marker(
                &record,
                committing.trigger,
                Outcome::Committed,
                committing.actor,
                now_ms,
            )
        };
        Change {
            expected_revision: self.record.revision,
            record,
            append: turn,
            evict: plan.evicted.iter().map(|e| e.span_id).collect(),
            summary,
            replace,
            marker: Some(marker),
        }
    }

    /// A refusal that records an ABORTED marker: the abort change differs
    /// from the current state only in the record's marker count.
    pub(super) fn escalation(
        &self,
        trigger: CompactionTrigger,
        sizes: Sizes,
        violations: Vec<Violation>,
        actor: &str,
        now_ms: u64,
    ) -> Rejection {
        let mut record = self.record.clone();
        record.marker_count += 1;
        let live = Totals::of(&self.spans);
        let kinds: Vec<String> = violations.iter().map(|v| format!("{:?}", v.kind)).collect();
        let marker = Marker {
            tokens_after: t32(live.live_tokens),
            incoming_tokens: t32(sizes.incoming),
            pinned_tokens: t32(sizes.pinned),
            pinned_retained: t32(live.pinned_spans),
            pinned_total: t32(live.pinned_spans),
            violations: violations.clone(),
            detail: format!(
                "compaction aborted ({}): live {} + incoming {} tokens, pinned {}, budget {}, window {}",
                kinds.join(", "),
                sizes.live,
                sizes.incoming,
                sizes.pinned,
                sizes.budget,
                sizes.window
            ),
            ..self.marker(&record, trigger, Outcome::Aborted, actor, now_ms)
        };
        Rejection::Escalation {
            sizes,
            violations,
            abort: Box::new(self.in_place(record, Vec::new(), Some(marker))),
        }
    }

    /// A marker of this session with what every marker records: its
    /// place in the session's sequence and revision (from `record`, the
    /// record it is written with), the budget, who and when, and the live
    /// tokens before; the caller fills in what the operation did.
    pub(super) fn marker(
        &self,
        record: &SessionRecord,
        trigger: CompactionTrigger,
        outcome: Outcome,
        actor: &str,
        now_ms: u64,
    ) -> Marker {
        let config = &self.record.config;
        Marker {
            seq: 0,
            session_id: self.record.id.clone(),
            session_seq: record.marker_count,
            trigger,
            outcome,
            tokens_before: t32(self.record.live_tokens),
            tokens_after: 0,
            incoming_tokens: 0,
            window_tokens: config.window_tokens,
            budget_tokens: config.budget_tokens(),
            pinned_tokens: 0,
            evicted: Vec::new(),
            tier_evicted: Vec::new(),
            compressed: Vec::new(),
            summary_span_id: None,
            summary_generation: 0,
            pinned_retained: 0,
            pinned_total: 0,
            anchors_carried: 0,
            anchors_dropped: 0,
            violations: Vec::new(),
            at_ms: now_ms,
            session_revision: record.revision,
            turn: record.turns,
            actor: actor.to_owned(),
            detail: String::new(),
        }
    }

    /// How many live spans are constraints, and the spans of the
    /// standing-instructions tier that `plan` evicts, in prompt order: both
    /// found in one pass over the live spans.
    /// `rows`, when given, are the rows of the live spans, read instead.
    fn pinned_and_tier_evicted(&self, plan: &Plan, rows: Option<&[LiveRow]>) -> (u64, Vec<SpanId>) {
        let mut pinned = 0u64;
        let mut tier: FastSet<SpanId> = fasthash::set(0);
        let mut count = |class: SpanClass, id: SpanId| match class {
            SpanClass::Constraint => pinned += 1,
            SpanClass::Protected => {
                tier.insert(id);
            }
            _ => {}
        };
        match rows {
            Some(rows) => rows.iter().for_each(|r| count(r.class, r.id)),
            None => self.spans.iter().for_each(|s| count(s.class(), s.id)),
        }
        if tier.is_empty() {
            return (pinned, Vec::new());
        }
        let evicted = plan
            .evicted
            .iter()
            .map(|e| e.span_id)
            .filter(|id| tier.contains(id))
            .collect();
        (pinned, evicted)
    }
}
