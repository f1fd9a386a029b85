//! Manual compaction by an operator: a dry-run plan with its handle, and
//! the commit of that plan with the caller's own summary and compressed
//! forms, verified again.

use super::markers::Committing;
use super::{Change, Rejection, Session};
use crate::config::AnchorPolicy;
use crate::facts::LiveRow;
use crate::marker::CompactionTrigger;
use crate::plan::{CompressedForm, Plan, Verdict, Violation, ViolationKind};
use crate::planner::{self, PlanInput};
use crate::span::{ClassSource, Classification, Span, SpanClass, SpanId, SummaryInfo};
use crate::tokens::TokenCounter;
use crate::verify::{IncomingTurn, verify_refs};

/// A plan's handle: a plan is a pure function of the session's state at a
/// revision and of the request, so the handle holds the request and the
/// revision, and committing re-derives the very same plan. Nothing needs
/// to be kept between plan and commit, and a restart loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId {
    /// The session revision planned against.
    pub revision: u64,
    /// The tokens the plan leaves room for.
    pub incoming_tokens: u64,
    /// The live total aimed at.
    pub target_tokens: u64,
    /// A checksum of the session id, so a plan cannot be committed to
    /// another session whose revision happens to match.
    pub session_tag: u32,
}

impl PlanId {
    /// The tag of a session id.
    pub fn tag(session_id: &str) -> u32 {
        // FNV-1a: stable across builds and platforms.
        let mut hash: u32 = 0x811c_9dc5;
        for byte in session_id.as_bytes() {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        hash
    }

    /// Parses the text form `p1.<revision>.<incoming>.<target>.<tag hex>`.
    pub fn parse(text: &str) -> Option<PlanId> {
        let mut parts = text.split('.');
        if parts.next()? != "p1" {
            return None;
        }
        let revision = parts.next()?.parse().ok()?;
        let incoming_tokens = parts.next()?.parse().ok()?;
        let target_tokens = parts.next()?.parse().ok()?;
        let session_tag = u32::from_str_radix(parts.next()?, 16).ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(PlanId {
            revision,
            incoming_tokens,
            target_tokens,
            session_tag,
        })
    }
}

impl std::fmt::Display for PlanId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p1.{}.{}.{}.{:08x}",
            self.revision, self.incoming_tokens, self.target_tokens, self.session_tag
        )
    }
}

/// What a caller adds to a plan when committing it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallerEdits {
    /// A caller-written summary to use instead of the draft.
    pub summary: Option<String>,
    /// Caller-written compressed forms: (constraint id, text).
    pub compressed: Vec<(crate::span::SpanId, String)>,
    /// Who commits, for the marker.
    pub actor: String,
}

/// A dry run of a manual compaction: the plan, its verdict, and the handle
/// that commits it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOutcome {
    /// The handle to commit the plan with.
    pub plan_id: PlanId,
    /// The plan.
    pub plan: Plan,
    /// The independent verifier's verdict on it.
    pub verdict: Verdict,
    /// The ids of the live context after the plan, in prompt order.
    pub kept: Vec<SpanId>,
}

impl Session {
    /// A dry run of a manual compaction that leaves room for
    /// `incoming_tokens` and aims at `target_tokens` (default: the soft
    /// watermark; never above the budget), with relevance measured against
    /// the latest turn.
    ///
    /// The plan is a function of the session's state and the arguments
    /// alone — `now_ms` only stamps the summary — so [`Session::commit`]
    /// re-derives it from the plan id and nothing is kept in between.
    pub fn plan(
        &mut self,
        incoming_tokens: u64,
        target_tokens: Option<u64>,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> PlanOutcome {
        self.derive_facts();
        let config = &self.record.config;
        let budget = u64::from(config.budget_tokens());
        let target = target_tokens
            .unwrap_or_else(|| u64::from(config.soft_watermark_tokens()))
            .min(budget);
        let plan_id = PlanId {
            revision: self.record.revision,
            incoming_tokens,
            target_tokens: target,
            session_tag: PlanId::tag(&self.record.id),
        };
        let plan = self.manual_plan(&plan_id, now_ms, counter);
        let made = planner::made_spans(&self.spans, &plan);
        let rows = LiveRow::of_spans(None, &self.spans);
        let post = planner::apply_refs(&self.spans, &rows, &plan, &made);
        let verdict = verify_refs(
            &self.spans,
            self.current_facts(),
            &plan,
            &post,
            IncomingTurn::tokens(incoming_tokens),
            config,
            counter,
        );
        PlanOutcome {
            plan_id,
            plan,
            verdict,
            kept: post.iter().map(|s| s.id).collect(),
        }
    }

    /// Commits a plan made by [`Session::plan`] at the current revision,
    /// with the caller's edits, after verifying the result again.
    ///
    /// - A caller summary replaces the draft's text. It carries the draft's
    ///   anchors it contains verbatim; the others are missing. Under
    ///   [`AnchorPolicy::Require`] that is an escalation with one
    ///   `AnchorMissing` violation listing them; under
    ///   [`AnchorPolicy::Warn`] they are counted as dropped.
    /// - A caller's compressed form replaces (or adds to) the plan's form
    ///   of that constraint and is checked like the built-in ones: against
    ///   the constraint's predicate and the tokens it was pinned with, and
    ///   only where the plan leaves no narrative live.
    ///
    /// Refusals: [`Rejection::StalePlan`] for another revision or another
    /// session; [`Rejection::NothingToCommit`] when the plan evicts and
    /// compresses nothing and the caller adds no compressed form (a
    /// summary of nothing cannot be written); [`Rejection::Escalation`]
    /// when the result fails verification.
    pub fn commit(
        &mut self,
        plan_id: PlanId,
        edits: &CallerEdits,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> Result<Change, Rejection> {
        if plan_id.session_tag != PlanId::tag(&self.record.id)
            || plan_id.revision != self.record.revision
        {
            return Err(Rejection::StalePlan {
                planned: plan_id.revision,
                current: self.record.revision,
            });
        }
        self.derive_facts();
        let config = &self.record.config;
        let mut plan = self.manual_plan(&plan_id, now_ms, counter);
        if plan.evicted.is_empty() && plan.compressed.is_empty() && edits.compressed.is_empty() {
            return Err(Rejection::NothingToCommit);
        }
        let mut violations = Vec::new();
        if let Some(text) = &edits.summary
            && !plan.evicted.is_empty()
        {
            let missing = self.use_caller_summary(&mut plan, text, now_ms, counter);
            if !missing.is_empty() && config.anchor_policy == AnchorPolicy::Require {
                violations.push(Violation {
                    kind: ViolationKind::AnchorMissing,
                    span_id: plan.summary.as_ref().map(|s| s.id),
                    detail: format!(
                        "the caller's summary lacks {} of the draft's anchors (policy REQUIRE): {}",
                        missing.len(),
                        missing.join(" | ")
                    ),
                    missing_terms: missing,
                });
            }
        }
        for (span_id, text) in &edits.compressed {
            plan.compressed.retain(|f| f.span_id != *span_id);
            plan.compressed.push(CompressedForm {
                span_id: *span_id,
                text: text.clone(),
                tokens: counter.count(text),
            });
        }
        let position = |id: SpanId| {
            self.spans
                .iter()
                .find(|s| s.id == id)
                .map_or(u64::MAX, |s| s.position)
        };
        plan.compressed
            .sort_by_key(|f| (position(f.span_id), f.span_id));
        let made = planner::made_spans(&self.spans, &plan);
        let rows = LiveRow::of_spans(None, &self.spans);
        let post = planner::apply_refs(&self.spans, &rows, &plan, &made);
        plan.tokens_after = post.iter().map(|s| u64::from(s.tokens)).sum();
        let verdict = verify_refs(
            &self.spans,
            self.current_facts(),
            &plan,
            &post,
            IncomingTurn::tokens(plan_id.incoming_tokens),
            config,
            counter,
        );
        violations.extend(verdict.violations);
        if !violations.is_empty() {
            let mut sizes = self.sizes(&[]);
            sizes.incoming = plan_id.incoming_tokens;
            return Err(self.escalation(
                CompactionTrigger::Manual,
                sizes,
                violations,
                &edits.actor,
                now_ms,
            ));
        }
        let detail = format!(
            "manual compaction by {}: evicted {} spans, compressed {} constraints ({} -> {} live tokens), room for {} incoming tokens",
            if edits.actor.is_empty() {
                "an unnamed caller"
            } else {
                edits.actor.as_str()
            },
            plan.evicted.len(),
            plan.compressed.len(),
            plan.tokens_before,
            plan.tokens_after,
            plan.incoming_tokens
        );
        Ok(self.compaction(
            &plan,
            &post,
            Committing {
                trigger: CompactionTrigger::Manual,
                actor: &edits.actor,
                detail,
                turn: None,
                rows: None,
            },
            now_ms,
        ))
    }

    /// The plan a plan id stands for.
    fn manual_plan(&self, plan_id: &PlanId, now_ms: u64, counter: &dyn TokenCounter) -> Plan {
        let query = self.latest_query();
        planner::plan_described(
            &PlanInput {
                config: &self.record.config,
                live: &self.spans,
                incoming_tokens: plan_id.incoming_tokens,
                query: &query,
                turn: self.record.turns,
                next_span_id: self.record.next_span_id,
                now_ms,
                target_tokens: Some(plan_id.target_tokens),
                held_tool_calls: &[],
            },
            self.current_facts(),
            counter,
        )
    }

    /// Puts a caller's summary in the plan in place of the draft; returns
    /// the draft's anchors it lacks (already counted as dropped).
    fn use_caller_summary(
        &self,
        plan: &mut Plan,
        text: &str,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> Vec<String> {
        let draft_anchors: Vec<String> = plan
            .summary
            .as_ref()
            .and_then(|s| s.summary.as_ref())
            .map(|info| info.anchors.clone())
            .unwrap_or_default();
        let (carried, missing): (Vec<String>, Vec<String>) = draft_anchors
            .into_iter()
            .partition(|a| text.contains(a.as_str()));
        let lost = u32::try_from(missing.len()).unwrap_or(u32::MAX);
        plan.anchors_dropped = plan.anchors_dropped.saturating_add(lost);
        if text.trim().is_empty() {
            plan.summary = None;
            plan.anchors_carried = 0;
            return missing;
        }
        plan.anchors_carried = u32::try_from(carried.len()).unwrap_or(u32::MAX);
        let tokens = counter.count(text);
        match plan.summary.as_mut() {
            Some(summary) => {
                summary.text = text.to_owned();
                summary.tokens = tokens;
                if let Some(info) = summary.summary.as_mut() {
                    info.anchors = carried;
                    info.anchors_dropped = info.anchors_dropped.saturating_add(lost);
                }
            }
            None => {
                // The draft had no room even for a header; the caller's
                // text stands for the evicted spans instead.
                let evicted: Vec<&Span> = plan
                    .evicted
                    .iter()
                    .filter_map(|e| self.spans.iter().find(|s| s.id == e.span_id))
                    .collect();
                let max = self.record.config.max_summary_generations.max(1);
                let highest = evicted.iter().map(|s| s.generation).max().unwrap_or(0);
                let earlier = evicted
                    .iter()
                    .filter_map(|s| s.summary.as_ref())
                    .fold(0u32, |n, info| n.saturating_add(info.anchors_dropped));
                plan.summary = Some(Span {
                    id: self.record.next_span_id,
                    position: evicted.iter().map(|s| s.position).min().unwrap_or(0),
                    role: self.record.config.summary_role(),
                    classification: Classification {
                        class: SpanClass::Summary,
                        source: ClassSource::Caller,
                        rule: String::new(),
                    },
                    text: text.to_owned(),
                    tokens,
                    generation: highest.saturating_add(1).min(max),
                    turn: self.record.turns,
                    predicate: None,
                    summary: Some(SummaryInfo {
                        covers: evicted.iter().map(|s| s.id).collect(),
                        anchors: carried,
                        anchors_dropped: plan.anchors_dropped.saturating_add(earlier),
                    }),
                    relevance_hint: None,
                    admitted_at_ms: now_ms,
                    original: None,
                    attributes: None,
                });
            }
        }
        missing
    }
}
