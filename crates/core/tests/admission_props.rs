//! Property (1): whatever the live context and the incoming turn,
//! `decide` never returns a compaction that overflows the budget, never
//! drops or alters a constraint, only returns verified compactions, and
//! refuses only when the sizes or the verdict say so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use ctxbroker_core::admission::{AdmissionInput, Decision, decide};
use ctxbroker_core::plan::ViolationKind;
use ctxbroker_core::planner::{apply, compressed_pinned_tokens};
use ctxbroker_core::predicate;
use ctxbroker_core::relevance::RelevanceWeights;
use ctxbroker_core::span::SpanClass;
use ctxbroker_core::verify::verify;
use proptest::prelude::*;
use support::{Session, session, tokens};

fn weights() -> impl Strategy<Value = RelevanceWeights> {
    prop_oneof![
        3 => Just(RelevanceWeights::default()),
        1 => (0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0, 0.0f64..=1.0, 0.0f64..20.0).prop_map(
            |(recency, similarity, length, hint, half)| RelevanceWeights {
                recency,
                similarity,
                length,
                hint,
                recency_half_life_turns: half,
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn decide_keeps_every_invariant(s in session(), w in weights()) {
        check(&s, &w)?;
    }
}

fn check(s: &Session, w: &RelevanceWeights) -> Result<(), TestCaseError> {
    let c = tokens();
    let mut config = s.config.clone();
    config.relevance = *w;
    let input = AdmissionInput {
        config: &config,
        live: &s.live,
        incoming: &s.incoming,
        next_span_id: s.next_span_id,
        turn: s.turn,
        now_ms: 42,
    };
    let live = s.live_tokens();
    let incoming = s.incoming_tokens();
    let budget = s.budget();
    let live_pinned = Session::pinned(&s.live);
    let pinned = live_pinned + Session::pinned(&s.incoming);
    match decide(&input, c) {
        Decision::Fits => prop_assert!(live + incoming <= budget),
        Decision::Compact(x) => {
            prop_assert!(live + incoming > budget);
            prop_assert!(x.verdict.passed(), "{:?}", x.verdict);
            // Verified again, independently of what decide reported.
            prop_assert!(verify(&s.live, &x.plan, &x.post, incoming, &s.config, c).passed());
            prop_assert_eq!(&x.post, &apply(&s.live, &x.plan));
            let summary_id = x.plan.summary.as_ref().map(|s| s.id);
            let post_tokens: u64 = x
                .post
                .iter()
                .map(|p| {
                    if Some(p.id) == summary_id {
                        c.count(&p.text)
                    } else {
                        p.tokens
                    }
                })
                .map(u64::from)
                .sum();
            prop_assert!(
                post_tokens + incoming <= budget,
                "{post_tokens} + {incoming} > {budget}"
            );
            prop_assert!(post_tokens + incoming <= u64::from(s.config.window_tokens));
            // Every constraint is kept: verbatim, or — only when no
            // narrative is left to evict — in a compressed form that
            // satisfies its predicate against the tokens it was pinned with.
            let narrative_left = x.post.iter().any(|p| p.class() == SpanClass::Narrative);
            for pinned in s.live.iter().filter(|p| p.is_pinned()) {
                let kept = x.post.iter().find(|p| p.id == pinned.id);
                prop_assert!(kept.is_some(), "constraint {} dropped", pinned.id);
                let kept = kept.unwrap();
                prop_assert!(x.plan.evicted.iter().all(|e| e.span_id != pinned.id));
                if kept == pinned {
                    continue;
                }
                prop_assert!(
                    !narrative_left,
                    "constraint {} compressed before narrative ran out",
                    pinned.id
                );
                prop_assert_eq!(kept.position, pinned.position);
                prop_assert_eq!(&kept.predicate, &pinned.predicate);
                let original = kept
                    .original
                    .as_ref()
                    .expect("a compressed span keeps its original");
                prop_assert_eq!(&original.text, &pinned.text);
                let wanted = pinned
                    .predicate
                    .as_ref()
                    .expect("a constraint has a predicate");
                prop_assert!(
                    predicate::check(&kept.text, kept.tokens, original.tokens, wanted).is_ok(),
                    "compressed form {:?} does not satisfy {:?}",
                    kept.text,
                    wanted
                );
            }
            if let Some(summary) = &x.plan.summary {
                prop_assert!(summary.tokens <= s.config.effective_summary_max_tokens());
                prop_assert!(summary.generation <= s.config.max_summary_generations);
            }
        }
        Decision::Refuse(r) => {
            prop_assert!(live + incoming > budget);
            prop_assert_eq!(r.sizes.live, live);
            prop_assert_eq!(r.sizes.incoming, incoming);
            prop_assert_eq!(r.sizes.pinned, pinned);
            prop_assert_eq!(r.sizes.budget, budget);
            prop_assert_eq!(r.sizes.window, u64::from(s.config.window_tokens));
            let kinds: Vec<ViolationKind> = r.violations.iter().map(|v| v.kind).collect();
            // Refused by size only when the turn does not fit even beside
            // every constraint in its shortest valid form.
            let least_pinned = compressed_pinned_tokens(&s.live, c);
            let incoming_pinned = pinned - live_pinned;
            if least_pinned + incoming_pinned > budget {
                prop_assert_eq!(kinds, vec![ViolationKind::PinnedExceedBudget]);
                prop_assert!(r.plan.is_none());
            } else if incoming > budget - least_pinned {
                prop_assert_eq!(kinds, vec![ViolationKind::TurnTooLarge]);
                prop_assert!(r.plan.is_none());
            } else {
                // A refusal by verdict must be the verifier's, on that plan...
                let plan = r.plan.as_ref().expect("a refused plan");
                let verdict = verify(&s.live, plan, &apply(&s.live, plan), incoming, &s.config, c);
                prop_assert_eq!(&verdict.violations, &r.violations);
                // ...and with sizes that allow a turn, the planner must
                // always find a valid plan.
                prop_assert!(false, "a feasible turn was refused: {:?}", r.violations);
            }
            for v in &r.violations {
                if matches!(
                    v.kind,
                    ViolationKind::PinnedExceedBudget | ViolationKind::TurnTooLarge
                ) {
                    for n in [
                        live,
                        incoming,
                        pinned,
                        budget,
                        u64::from(s.config.window_tokens),
                    ] {
                        prop_assert!(v.detail.contains(&n.to_string()), "{} lacks {n}", v.detail);
                    }
                }
            }
        }
    }
    Ok(())
}
