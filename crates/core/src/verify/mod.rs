//! The verifier: an independent pre-commit check of a plan.
//!
//! The verifier shares no code with the planner beyond the primitives that
//! define the rules (a predicate's check, what an anchor is), so a bug in the
//! planner cannot also blind the check. It trusts nothing the plan says
//! about itself: it recounts every text the plan wrote, recomputes the
//! post-state it must lead to, and reports every violation it finds, not
//! the first. A plan it cannot make sense of is rejected (fail closed).
//!
//! Each check is in the submodule named after what it checks: the plan
//! against the pre-state (`consistency`), the summary and its anchors
//! (`summary`), the constraints (`constraints`), every span kept
//! (`kept`), tool exchanges evicted whole or kept whole (`exchanges`),
//! and the sizes (`budget`); `index` finds pre-state spans by
//! id. `verify_refs` runs them in order and reports what they all find.

mod budget;
mod consistency;
mod constraints;
mod exchanges;
mod index;
mod kept;
mod summary;

use crate::config::SessionConfig;
use crate::facts::{LiveFacts, LiveRow};
use crate::plan::{Plan, Verdict, Violation, ViolationKind};
use crate::span::{Span, SpanId};
use crate::tokens::TokenCounter;
use index::PreIndex;

/// Checks that `post` is what `plan` makes of `pre`, and that it keeps
/// every invariant: pinned constraints retained (verbatim or by a form that
/// satisfies their predicate, measured against the form they were pinned
/// in), compressed forms only once no evictable span is left, post +
/// incoming within the budget, summary generation within the session's
/// limit, anchors carried or accounted for.
pub fn verify(
    pre: &[Span],
    plan: &Plan,
    post: &[Span],
    incoming_tokens: u64,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Verdict {
    verify_with(pre, None, plan, post, incoming_tokens, config, counter)
}

/// [`verify`] reading the anchors the evicted spans owe from `facts`
/// (the session's, see [`LiveFacts`]) instead of extracting them from
/// the text: the same verdict. Facts that do not describe `pre` are not
/// used.
pub fn verify_with(
    pre: &[Span],
    facts: Option<&LiveFacts>,
    plan: &Plan,
    post: &[Span],
    incoming_tokens: u64,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Verdict {
    let post: Vec<&Span> = post.iter().collect();
    let facts = facts.filter(|f| f.describes(pre));
    verify_refs(
        pre,
        facts,
        plan,
        &post,
        IncomingTurn::tokens(incoming_tokens),
        config,
        counter,
    )
}

/// [`verify_with`] of a post-state given by reference: the admission path
/// checks the spans it keeps where they stand rather than copies of them.
/// The caller checked that `facts` describe `pre`.
pub(crate) fn verify_refs(
    pre: &[Span],
    facts: Option<&LiveFacts>,
    plan: &Plan,
    post: &[&Span],
    incoming: IncomingTurn<'_>,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Verdict {
    let IncomingTurn {
        tokens: incoming_tokens,
        tool_calls: held_tool_calls,
    } = incoming;
    let mut v = Report::default();
    // What the walks over pre read of each span: the rows the session
    // keeps (which `facts` hold to the spans), or copied here.
    let rows = LiveRow::of_spans(facts, pre);
    let pre_index = PreIndex::new(&rows);
    consistency::check_repeated_ids(&mut v, pre, &pre_index);
    let (is_evicted, evicted_at) = consistency::check_evictions(&mut v, &rows, &pre_index, plan);
    let evicted: Vec<&Span> = evicted_at.iter().map(|&i| &pre[i]).collect();
    exchanges::check_exchanges_whole(&mut v, pre, &rows, &is_evicted, held_tool_calls);
    // The anchors are the text's, by the rules of `text`: derived once
    // per span by the session, or here.
    let owed = LiveFacts::owed_anchors(facts, pre, evicted_at.iter().copied());
    let pre = Pre {
        spans: pre,
        rows: &rows,
        index: pre_index,
        is_evicted,
    };
    let forms = consistency::check_forms(&mut v, &pre, plan, counter);
    let summary_tokens = summary::check_summary_and_anchors(
        &mut v, plan, &pre.index, &evicted, owed.list, config, counter,
    );
    consistency::check_post_order(&mut v, &pre, plan, post);
    constraints::check_compression_timing(&mut v, plan, post, held_tool_calls);
    let (state, post_tokens) =
        kept::count_post(&mut v, &pre, plan, post, &forms, summary_tokens, counter);
    constraints::check_pinned_retained(&mut v, &pre, &state);
    budget::check_budget(&mut v, post_tokens, incoming_tokens, config);
    budget::check_account(&mut v, plan, pre.index.tokens, post_tokens, incoming_tokens);
    Verdict {
        violations: v.violations,
    }
}

/// What the turn a compaction makes room for brings: its tokens, and the
/// tool call ids of its spans (the exchanges it continues, which must stay
/// whole).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IncomingTurn<'a> {
    pub(crate) tokens: u64,
    pub(crate) tool_calls: &'a [&'a str],
}

impl IncomingTurn<'_> {
    /// A turn of `tokens` that continues no tool exchange.
    pub(crate) fn tokens(tokens: u64) -> Self {
        IncomingTurn {
            tokens,
            tool_calls: &[],
        }
    }
}

/// The pre-state as the checks read it: its spans, where each id stands,
/// and which spans the plan evicts, by index.
struct Pre<'a> {
    spans: &'a [Span],
    /// The row of each span (see [`LiveRow`]).
    rows: &'a [LiveRow],
    index: PreIndex,
    is_evicted: Vec<bool>,
}

/// Post does not hold the pre span.
const ABSENT: u8 = 0;
/// Post holds the pre span as a constraint.
const PINNED: u8 = 1;
/// Post holds the pre span, not as a constraint.
const UNPINNED: u8 = 2;

/// The violations found so far, in the order the checks found them.
#[derive(Default)]
struct Report {
    violations: Vec<Violation>,
}

impl Report {
    fn push(&mut self, kind: ViolationKind, span_id: Option<SpanId>, detail: String) {
        self.push_terms(kind, span_id, detail, Vec::new());
    }

    fn push_terms(
        &mut self,
        kind: ViolationKind,
        span_id: Option<SpanId>,
        detail: String,
        missing_terms: Vec<String>,
    ) {
        self.violations.push(Violation {
            kind,
            span_id,
            detail,
            missing_terms,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{CompressedForm, Eviction, EvictionReason};
    use crate::planner::{PlanInput, apply, plan};
    use crate::predicate::compress;
    use crate::span::Role;
    use crate::tokens::ByteLength;

    fn span(id: u64, role: Role, text: &str) -> Span {
        crate::testing::admitted(id, id, role, text)
    }

    struct Case {
        config: SessionConfig,
        pre: Vec<Span>,
        plan: Plan,
        incoming: u64,
    }

    fn case() -> Case {
        let mut pre = vec![span(
            1,
            Role::User,
            "Please never write to the `prod` namespace; stage only.",
        )];
        for id in 2..=12 {
            pre.push(span(
                id,
                Role::Tool,
                &format!(
                    "step {id}: edited src/mod_{id}.rs and ran the tests; all passed in 30s. {}",
                    "z".repeat(100)
                ),
            ));
        }
        let config = SessionConfig::with_window(2_000);
        let incoming = 300;
        let input = PlanInput {
            config: &config,
            live: &pre,
            incoming_tokens: incoming,
            query: "next step",
            turn: 13,
            next_span_id: 13,
            now_ms: 0,
            target_tokens: None,
            held_tool_calls: &[],
        };
        let plan = plan(&input, &ByteLength);
        Case {
            config,
            pre,
            plan,
            incoming,
        }
    }

    fn kinds(verdict: &Verdict) -> Vec<ViolationKind> {
        verdict.violations.iter().map(|v| v.kind).collect()
    }

    fn run(c: &Case, plan: &Plan, post: &[Span]) -> Verdict {
        verify(&c.pre, plan, post, c.incoming, &c.config, &ByteLength)
    }

    #[test]
    fn a_planned_compaction_passes() {
        let c = case();
        assert!(!c.plan.evicted.is_empty());
        let post = apply(&c.pre, &c.plan);
        let verdict = run(&c, &c.plan, &post);
        assert!(verdict.passed(), "{verdict:?}");
    }

    #[test]
    fn an_evicted_constraint_is_pinned_missing() {
        let c = case();
        let mut p = c.plan.clone();
        p.evicted.insert(
            0,
            Eviction {
                span_id: 1,
                relevance: 0.0,
                reason: EvictionReason::Budget,
                tokens: c.pre[0].tokens,
            },
        );
        let post = apply(&c.pre, &p);
        let verdict = run(&c, &p, &post);
        assert!(
            kinds(&verdict).contains(&ViolationKind::PinnedMissing),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_constraint_missing_from_post_is_pinned_missing() {
        let c = case();
        let mut post = apply(&c.pre, &c.plan);
        post.retain(|s| s.id != 1);
        let verdict = run(&c, &c.plan, &post);
        let k = kinds(&verdict);
        assert!(k.contains(&ViolationKind::PinnedMissing), "{verdict:?}");
        assert!(k.contains(&ViolationKind::PlanInconsistent), "{verdict:?}");
    }

    #[test]
    fn compressed_forms_must_satisfy_the_predicate() {
        // Constraints are compressed only once no narrative is left: a
        // session of the constraint alone.
        let mut c = case();
        c.pre.truncate(1);
        c.incoming = 0;
        c.plan = plan(
            &PlanInput {
                config: &c.config,
                live: &c.pre,
                incoming_tokens: 0,
                query: "next step",
                turn: 13,
                next_span_id: 13,
                now_ms: 0,
                target_tokens: None,
                held_tool_calls: &[],
            },
            &ByteLength,
        );
        assert!(c.plan.evicted.is_empty());
        let good = compress(
            &c.pre[0].text,
            c.pre[0].predicate.as_ref().unwrap(),
            &ByteLength,
        )
        .unwrap();
        let mut p = c.plan.clone();
        p.compressed.push(CompressedForm {
            span_id: 1,
            tokens: ByteLength.count(&good),
            text: good,
        });
        p.tokens_after -= u64::from(c.pre[0].tokens - p.compressed[0].tokens);
        let post = apply(&c.pre, &p);
        assert!(run(&c, &p, &post).passed(), "{:?}", run(&c, &p, &post));

        let mut bad = p.clone();
        bad.compressed[0].text = "Please write to the `prod` namespace; stage only.".into();
        bad.compressed[0].tokens = ByteLength.count(&bad.compressed[0].text);
        let post = apply(&c.pre, &bad);
        let verdict = run(&c, &bad, &post);
        let v = verdict
            .violations
            .iter()
            .find(|v| v.kind == ViolationKind::PredicateUnsatisfied)
            .expect("predicate violation");
        assert_eq!(v.span_id, Some(1));
        assert_eq!(v.missing_terms, ["modality:prohibition"]);
    }

    #[test]
    fn an_inflated_summary_is_caught_by_recounting() {
        let c = case();
        let mut p = c.plan.clone();
        let s = p.summary.as_mut().unwrap();
        s.text.push_str(&" padding".repeat(400));
        let post = apply(&c.pre, &p);
        let k = kinds(&run(&c, &p, &post));
        assert!(k.contains(&ViolationKind::OverBudget), "{k:?}");
        assert!(k.contains(&ViolationKind::PlanInconsistent), "{k:?}");
    }

    #[test]
    fn generation_and_anchor_violations() {
        let c = case();
        let mut p = c.plan.clone();
        let s = p.summary.as_mut().unwrap();
        s.generation = c.config.max_summary_generations + 1;
        let anchor = s.summary.as_ref().unwrap().anchors[0].clone();
        s.text = s.text.replace(&anchor, "");
        s.tokens = ByteLength.count(&s.text);
        p.tokens_after = apply(&c.pre, &p).iter().map(|s| u64::from(s.tokens)).sum();
        let post = apply(&c.pre, &p);
        let verdict = run(&c, &p, &post);
        let k = kinds(&verdict);
        assert!(k.contains(&ViolationKind::GenerationExceeded), "{k:?}");
        assert!(k.contains(&ViolationKind::AnchorMissing), "{k:?}");
        let missing = verdict
            .violations
            .iter()
            .filter(|v| v.kind == ViolationKind::AnchorMissing)
            .flat_map(|v| v.missing_terms.iter())
            .collect::<Vec<_>>();
        assert!(missing.contains(&&anchor), "{missing:?}");
    }

    #[test]
    fn duplicates_and_unknown_ids_are_inconsistent() {
        let c = case();
        let mut p = c.plan.clone();
        let first = p.evicted[0].clone();
        p.evicted.push(first);
        let post = apply(&c.pre, &p);
        assert!(kinds(&run(&c, &p, &post)).contains(&ViolationKind::PlanInconsistent));

        let mut p = c.plan.clone();
        p.evicted.push(Eviction {
            span_id: 999,
            relevance: 0.0,
            reason: EvictionReason::Budget,
            tokens: 1,
        });
        let post = apply(&c.pre, &p);
        assert!(kinds(&run(&c, &p, &post)).contains(&ViolationKind::PlanInconsistent));

        let mut post = apply(&c.pre, &c.plan);
        let dup = post[1].clone();
        post.insert(1, dup);
        assert!(kinds(&run(&c, &c.plan, &post)).contains(&ViolationKind::PlanInconsistent));
    }

    #[test]
    fn every_violation_is_reported() {
        let c = case();
        let mut p = c.plan.clone();
        p.evicted.insert(
            0,
            Eviction {
                span_id: 1,
                relevance: 0.0,
                reason: EvictionReason::Budget,
                tokens: c.pre[0].tokens,
            },
        );
        let s = p.summary.as_mut().unwrap();
        s.generation = 99;
        s.text.push_str(&"x".repeat(5_000));
        let post = apply(&c.pre, &p);
        let k = kinds(&run(&c, &p, &post));
        for want in [
            ViolationKind::PinnedMissing,
            ViolationKind::GenerationExceeded,
            ViolationKind::OverBudget,
            ViolationKind::PlanInconsistent,
        ] {
            assert!(k.contains(&want), "{want:?} in {k:?}");
        }
    }

    #[test]
    fn a_plan_for_another_turn_is_rejected() {
        let c = case();
        let post = apply(&c.pre, &c.plan);
        let verdict = verify(
            &c.pre,
            &c.plan,
            &post,
            c.incoming + 1,
            &c.config,
            &ByteLength,
        );
        assert!(kinds(&verdict).contains(&ViolationKind::PlanInconsistent));
    }
}
