//! Property (2): take a valid plan (the planner's, with compressed forms
//! added), break it in one of many ways, and the verifier always rejects it
//! with the right kind of violation — whatever the planner did.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use ctxbroker_core::plan::{CompressedForm, Eviction, EvictionReason, Plan, ViolationKind};
use ctxbroker_core::planner::{PlanInput, apply, plan};
use ctxbroker_core::predicate::{check, compress};
use ctxbroker_core::span::{Span, SpanClass};
use ctxbroker_core::verify::verify;
use proptest::prelude::*;
use support::{Session, session, tokens};

/// A session with a valid plan that evicts something, and whose constraints
/// fit the budget with the turn.
#[derive(Debug)]
struct Valid {
    s: Session,
    plan: Plan,
    /// The incoming tokens the plan makes room for.
    incoming: u64,
}

fn valid(s: Session, compress_mask: u64) -> Option<Valid> {
    let c = tokens();
    let incoming = s.incoming_tokens().min(s.budget() / 4);
    let pinned = Session::pinned(&s.live);
    if pinned + incoming > s.budget() || !s.live.iter().any(|x| !x.is_pinned()) {
        return None;
    }
    let query = s.query();
    let input = PlanInput {
        config: &s.config,
        live: &s.live,
        incoming_tokens: incoming,
        query: &query,
        turn: s.turn,
        next_span_id: s.next_span_id,
        now_ms: 1,
        // Aim at half the narrative, so that something is evicted.
        target_tokens: Some(pinned + incoming + (s.live_tokens() - pinned) / 2),
        held_tool_calls: &[],
    };
    let mut p = plan(&input, c);
    // Compress some constraints with the built-in compressor — allowed only
    // when the plan leaves nothing evictable live.
    let evicted: Vec<u64> = p.evicted.iter().map(|e| e.span_id).collect();
    let exhausted = s
        .live
        .iter()
        .all(|x| x.is_pinned() || evicted.contains(&x.id));
    for (k, span) in s.live.iter().filter(|x| x.is_pinned()).enumerate() {
        if !exhausted {
            break;
        }
        if p.compressed.iter().any(|f| f.span_id == span.id) {
            continue;
        }
        if compress_mask >> (k % 64) & 1 == 0 {
            continue;
        }
        if let Some(form) = compress(&span.text, span.predicate.as_ref().unwrap(), c) {
            let tokens = c.count(&form);
            p.tokens_after -= u64::from(span.tokens - tokens);
            p.compressed.push(CompressedForm {
                span_id: span.id,
                text: form,
                tokens,
            });
        }
    }
    Some(Valid {
        s,
        plan: p,
        incoming,
    })
}

fn run(v: &Valid, plan: &Plan, post: &[Span]) -> Vec<ViolationKind> {
    let verdict = verify(&v.s.live, plan, post, v.incoming, &v.s.config, tokens());
    verdict.violations.iter().map(|x| x.kind).collect()
}

#[derive(Debug, Clone, Copy)]
enum Mutation {
    EvictConstraint,
    RemoveConstraintFromPost,
    UnpinConstraintInPost,
    CorruptCompressedForm,
    InflateSummaryStale,
    InflateSummaryOverBudget,
    DuplicateEviction,
    DuplicatePostSpan,
    SummaryGenerationTooHigh,
    DropAnchorFromSummary,
    SummaryIdCollides,
    SwapPostSpans,
    EvictUnknownSpan,
    AlterNarrative,
    CompressNarrative,
}

const MUTATIONS: &[Mutation] = &[
    Mutation::EvictConstraint,
    Mutation::RemoveConstraintFromPost,
    Mutation::UnpinConstraintInPost,
    Mutation::CorruptCompressedForm,
    Mutation::InflateSummaryStale,
    Mutation::InflateSummaryOverBudget,
    Mutation::DuplicateEviction,
    Mutation::DuplicatePostSpan,
    Mutation::SummaryGenerationTooHigh,
    Mutation::DropAnchorFromSummary,
    Mutation::SummaryIdCollides,
    Mutation::SwapPostSpans,
    Mutation::EvictUnknownSpan,
    Mutation::AlterNarrative,
    Mutation::CompressNarrative,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_broken_plan_is_rejected(
        s in session(),
        mask in any::<u64>(),
        m in prop::sample::select(MUTATIONS),
        pick in any::<prop::sample::Index>(),
        corruption in 0usize..3,
    ) {
        let Some(v) = valid(s, mask) else { return Ok(()); };
        let post = apply(&v.s.live, &v.plan);
        let base = verify(&v.s.live, &v.plan, &post, v.incoming, &v.s.config, tokens());
        prop_assert!(base.passed(), "the valid plan fails: {:?}", base.violations);
        mutate(&v, m, pick, corruption)?;
    }
}

fn mutate(
    v: &Valid,
    m: Mutation,
    pick: prop::sample::Index,
    corruption: usize,
) -> Result<(), TestCaseError> {
    let c = tokens();
    let live = &v.s.live;
    let constraints: Vec<&Span> = live.iter().filter(|x| x.is_pinned()).collect();
    let mut p = v.plan.clone();
    let expect = |kinds: Vec<ViolationKind>, want: ViolationKind| -> Result<(), TestCaseError> {
        prop_assert!(
            kinds.contains(&want),
            "{m:?}: expected {want:?}, got {kinds:?}"
        );
        Ok(())
    };
    match m {
        Mutation::EvictConstraint => {
            let Some(target) = constraints.get(pick.index(constraints.len().max(1))) else {
                return Ok(());
            };
            p.evicted.push(Eviction {
                span_id: target.id,
                relevance: 0.0,
                reason: EvictionReason::Budget,
                tokens: target.tokens,
            });
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PinnedMissing)
        }
        Mutation::RemoveConstraintFromPost => {
            let Some(target) = constraints.get(pick.index(constraints.len().max(1))) else {
                return Ok(());
            };
            let mut post = apply(live, &p);
            post.retain(|x| x.id != target.id);
            expect(run(v, &p, &post), ViolationKind::PinnedMissing)
        }
        Mutation::UnpinConstraintInPost => {
            let Some(target) = constraints.get(pick.index(constraints.len().max(1))) else {
                return Ok(());
            };
            let mut post = apply(live, &p);
            let x = post.iter_mut().find(|x| x.id == target.id).unwrap();
            x.classification.class = SpanClass::Narrative;
            expect(run(v, &p, &post), ViolationKind::PinnedMissing)
        }
        Mutation::CorruptCompressedForm => {
            let Some(target) = constraints.get(pick.index(constraints.len().max(1))) else {
                return Ok(());
            };
            let predicate = target.predicate.as_ref().unwrap();
            let text = match corruption {
                // Neither modality nor terms.
                0 => "ok".to_string(),
                // Longer than the original.
                1 => format!("{} {}", target.text, "and then some more words".repeat(3)),
                // A required term broken everywhere (or no modality, when
                // there is no term to break).
                _ => match predicate.required_terms.first() {
                    Some(term) => target
                        .text
                        .to_lowercase()
                        .replace(&term.to_lowercase(), "~"),
                    None => "ok".to_string(),
                },
            };
            let tokens = c.count(&text);
            prop_assume!(check(&text, tokens, target.tokens, predicate).is_err());
            p.compressed.retain(|f| f.span_id != target.id);
            p.compressed.push(CompressedForm {
                span_id: target.id,
                text,
                tokens,
            });
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PredicateUnsatisfied)
        }
        Mutation::InflateSummaryStale => {
            let Some(s) = p.summary.as_mut() else {
                return Ok(());
            };
            s.text.push_str("\n- padding that was never counted");
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::InflateSummaryOverBudget => {
            let Some(s) = p.summary.as_mut() else {
                return Ok(());
            };
            let pad = "- more padding\n".repeat(v.s.config.budget_tokens() as usize / 3 + 2);
            s.text.push_str(&pad);
            let before = s.tokens;
            s.tokens = c.count(&s.text);
            p.tokens_after += u64::from(s.tokens - before);
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::OverBudget)
        }
        Mutation::DuplicateEviction => {
            let Some(e) = p.evicted.get(pick.index(p.evicted.len().max(1))).cloned() else {
                return Ok(());
            };
            p.evicted.push(e);
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::DuplicatePostSpan => {
            let mut post = apply(live, &p);
            let at = pick.index(post.len().max(1));
            let Some(x) = post.get(at).cloned() else {
                return Ok(());
            };
            post.insert(at, x);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::SummaryGenerationTooHigh => {
            let Some(s) = p.summary.as_mut() else {
                return Ok(());
            };
            s.generation = v.s.config.max_summary_generations + 1 + (corruption as u32);
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::GenerationExceeded)
        }
        Mutation::DropAnchorFromSummary => {
            let Some(s) = p.summary.as_mut() else {
                return Ok(());
            };
            let anchors = s.summary.as_ref().unwrap().anchors.clone();
            let Some(anchor) = anchors.get(pick.index(anchors.len().max(1))) else {
                return Ok(());
            };
            s.text = s.text.replace(anchor.as_str(), "");
            let before = s.tokens;
            s.tokens = c.count(&s.text);
            p.tokens_after = p.tokens_after + u64::from(s.tokens) - u64::from(before);
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::AnchorMissing)
        }
        Mutation::SummaryIdCollides => {
            let post0 = apply(live, &p);
            let kept: Vec<u64> = post0
                .iter()
                .filter(|x| p.summary.as_ref().is_some_and(|s| s.id != x.id))
                .map(|x| x.id)
                .collect();
            let Some(&id) = kept.get(pick.index(kept.len().max(1))) else {
                return Ok(());
            };
            let Some(s) = p.summary.as_mut() else {
                return Ok(());
            };
            s.id = id;
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::SwapPostSpans => {
            let mut post = apply(live, &p);
            if post.len() < 2 {
                return Ok(());
            }
            let i = pick.index(post.len() - 1);
            post.swap(i, i + 1);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::EvictUnknownSpan => {
            let id = live.iter().map(|x| x.id).max().unwrap_or(0) + 7_777;
            p.evicted.push(Eviction {
                span_id: id,
                relevance: 0.5,
                reason: EvictionReason::Budget,
                tokens: 3,
            });
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::AlterNarrative => {
            let mut post = apply(live, &p);
            let summary_id = p.summary.as_ref().map(|s| s.id);
            let narrative: Vec<usize> = (0..post.len())
                .filter(|&i| !post[i].is_pinned() && Some(post[i].id) != summary_id)
                .collect();
            let Some(&i) = narrative.get(pick.index(narrative.len().max(1))) else {
                return Ok(());
            };
            post[i].text.push_str(" (edited)");
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
        Mutation::CompressNarrative => {
            let evicted: Vec<u64> = p.evicted.iter().map(|e| e.span_id).collect();
            let narrative: Vec<&Span> = live
                .iter()
                .filter(|x| !x.is_pinned() && !evicted.contains(&x.id))
                .collect();
            let Some(target) = narrative.get(pick.index(narrative.len().max(1))) else {
                return Ok(());
            };
            p.compressed.push(CompressedForm {
                span_id: target.id,
                text: "x".into(),
                tokens: c.count("x"),
            });
            let post = apply(live, &p);
            expect(run(v, &p, &post), ViolationKind::PlanInconsistent)
        }
    }
}
