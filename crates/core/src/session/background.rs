//! Compaction nobody asked for: background pre-compaction above the soft
//! watermark and the staleness guard, committed only when verified and
//! worth it.

use super::markers::Committing;
use super::{Change, Session};
use crate::facts::LiveRow;
use crate::marker::CompactionTrigger;
use crate::plan::{Eviction, EvictionReason, Plan};
use crate::planner::{self, PlanInput, SummaryRoom, SummarySlot};
use crate::span::{Span, SpanClass};
use crate::tokens::TokenCounter;
use crate::trigger;
use crate::verify::{IncomingTurn, verify_refs};

impl Session {
    /// Background pre-compaction (trigger SOFT_WATERMARK): when live is above the soft watermark, plans down to
    /// [`SessionConfig::soft_target_tokens`] with no incoming turn, so that
    /// the next admissions find room already made.
    ///
    /// `None` unless the session compacts on its own (mode AUTO, no
    /// approval pending) and admitted something since its last compaction
    /// — an idle session is never compacted — and unless the verified plan
    /// makes the context smaller.
    ///
    /// [`SessionConfig::soft_target_tokens`]: crate::config::SessionConfig::soft_target_tokens
    pub fn soft_compaction(&mut self, now_ms: u64, counter: &dyn TokenCounter) -> Option<Change> {
        if !trigger::compacts_on_its_own(&self.record) {
            return None;
        }
        let live: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
        if live <= u64::from(self.record.config.soft_watermark_tokens()) {
            return None;
        }
        self.derive_facts();
        let config = &self.record.config;
        let query = self.latest_query();
        let plan = planner::plan_described(
            &PlanInput {
                config,
                live: &self.spans,
                incoming_tokens: 0,
                query: &query,
                turn: self.record.turns,
                next_span_id: self.record.next_span_id,
                now_ms,
                target_tokens: Some(u64::from(config.soft_target_tokens())),
                held_tool_calls: &[],
            },
            self.current_facts(),
            counter,
        );
        let detail = format!(
            "background compaction above the soft watermark {}: evicted {} spans ({} -> {} live tokens)",
            config.soft_watermark_tokens(),
            plan.evicted.len(),
            plan.tokens_before,
            plan.tokens_after
        );
        self.background(
            plan,
            CompactionTrigger::SoftWatermark,
            detail,
            now_ms,
            counter,
        )
    }

    /// Whether the staleness guard is due ([`crate::trigger::staleness_due`]).
    /// An idle session is never due, however long it sits.
    pub fn staleness_due(&self, now_ms: u64) -> bool {
        trigger::staleness_due(&self.record, now_ms)
    }

    /// The staleness compaction (trigger STALENESS), when due: evicts the
    /// original narrative admitted more than one interval before `now_ms`
    /// into one summary. The latest turn, constraints and existing
    /// summaries are never touched, so a cadence cannot make summaries
    /// climb generations. `None` when not due, when nothing is stale, or
    /// when the verified result would not be smaller.
    pub fn staleness_compaction(
        &mut self,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> Option<Change> {
        if !self.staleness_due(now_ms) {
            return None;
        }
        let interval = self.record.config.staleness_interval_ms;
        let latest = self.record.turns;
        let stale: Vec<usize> = (0..self.spans.len())
            .filter(|&i| {
                let s = &self.spans[i];
                s.class() == SpanClass::Narrative
                    && s.generation == 0
                    && s.summary.is_none()
                    && s.turn != latest
                    && now_ms.saturating_sub(s.admitted_at_ms) > interval
            })
            .collect();
        if stale.is_empty() {
            return None;
        }
        let relevance = self.relevance();
        let config = &self.record.config;
        let before: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
        let evicted_tokens: u64 = stale.iter().map(|&i| u64::from(self.spans[i].tokens)).sum();
        let kept = before - evicted_tokens;
        let budget = u64::from(config.budget_tokens());
        let cap = u64::from(config.effective_summary_max_tokens());
        let room = budget.saturating_sub(kept).min(cap);
        let prose = room.min(evicted_tokens / 4 + planner::SUMMARY_HEADER_RESERVE);
        let evicted: Vec<&Span> = stale.iter().map(|&i| &self.spans[i]).collect();
        let written = planner::write_summary(
            &evicted,
            SummaryRoom {
                tokens: room,
                prose_tokens: prose,
            },
            config,
            SummarySlot {
                id: self.record.next_span_id,
                turn: latest,
                now_ms,
            },
            counter,
        );
        let summary_tokens = written.span.as_ref().map_or(0, |s| u64::from(s.tokens));
        let plan = Plan {
            evicted: stale
                .iter()
                .map(|&i| Eviction {
                    span_id: self.spans[i].id,
                    relevance: relevance[i],
                    reason: if relevance[i] < config.relevance_floor {
                        EvictionReason::BelowFloor
                    } else {
                        EvictionReason::Budget
                    },
                    tokens: self.spans[i].tokens,
                })
                .collect(),
            summary: written.span,
            compressed: Vec::new(),
            tokens_before: before,
            tokens_after: kept + summary_tokens,
            incoming_tokens: 0,
            target_tokens: kept + prose,
            anchors_carried: written.anchors_carried,
            anchors_dropped: written.anchors_dropped,
        };
        let detail = format!(
            "staleness guard: evicted {} spans admitted more than {interval} ms ago ({} -> {} live tokens)",
            plan.evicted.len(),
            plan.tokens_before,
            plan.tokens_after
        );
        self.background(plan, CompactionTrigger::Staleness, detail, now_ms, counter)
    }

    /// A background compaction's change, when its plan is worth
    /// committing and passes verification (a plan that fails is not
    /// committed; nothing asked for it, so there is no one to refuse).
    fn background(
        &self,
        plan: Plan,
        trigger: CompactionTrigger,
        detail: String,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> Option<Change> {
        if plan.evicted.is_empty() || plan.tokens_after >= plan.tokens_before {
            return None;
        }
        let made = planner::made_spans(&self.spans, &plan);
        let rows = LiveRow::of_spans(None, &self.spans);
        let post = planner::apply_refs(&self.spans, &rows, &plan, &made);
        if !verify_refs(
            &self.spans,
            self.current_facts(),
            &plan,
            &post,
            IncomingTurn::tokens(0),
            &self.record.config,
            counter,
        )
        .passed()
        {
            return None;
        }
        Some(self.compaction(
            &plan,
            &post,
            Committing {
                trigger,
                actor: "",
                detail,
                turn: None,
                rows: None,
            },
            now_ms,
        ))
    }
}
