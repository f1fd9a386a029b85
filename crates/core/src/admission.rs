//! Admission: whether a turn fits, needs a compaction, or must be refused.
//!
//! The decision is pure; [`crate::session::Session::admit`] builds the
//! turn's spans around it and turns it into a change to write. A
//! compaction is only ever returned together with a passing verdict of the
//! independent verifier: the planner's output is never trusted on its own,
//! and a plan that fails verification is a refusal (fail closed), never a
//! partial admission.
//!
//! A turn is refused without planning when it cannot fit even after the
//! most a valid compaction can do: every narrative span and summary
//! evicted and every constraint in its shortest built-in compressed form.
//! Those sizes are only computed when the plain ones do not fit.

use crate::config::SessionConfig;
use crate::facts::{LiveFacts, LiveRow};
use crate::plan::{Plan, Sizes, Verdict, Violation, ViolationKind};
use crate::planner::{PlanInput, apply_refs, compressed_pinned_tokens, made_spans, plan_described};
use crate::span::{
    ClassSource, Classification, Modality, Predicate, PredicateSource, Role, Span, SpanClass,
    SpanId,
};
use crate::tokens::TokenCounter;
use crate::verify::{IncomingTurn, verify_refs};

/// What an admission needs to know.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionInput<'a> {
    /// The session's configuration, relevance weights included.
    pub config: &'a SessionConfig,
    /// The live context, in prompt order.
    pub live: &'a [Span],
    /// The turn's spans, with ids, positions, classes, tokens and
    /// predicates already assigned.
    pub incoming: &'a [Span],
    /// The first free id after the incoming spans: a summary's id.
    pub next_span_id: SpanId,
    /// The turn being admitted.
    pub turn: u64,
    /// The admission time (the core reads no clock).
    pub now_ms: u64,
}

/// The outcome of an admission. `C` is what was made of a verified
/// compaction: a [`Compaction`] from [`decide`].
// Made once per admission and matched at once: boxing the refusal would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<C = Compaction> {
    /// Live + incoming is within the budget: append the turn.
    Fits,
    /// A verified compaction makes room: commit it with the turn.
    Compact(C),
    /// The turn cannot be admitted; nothing changes.
    Refuse(Refusal),
}

/// A compaction that passed verification.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// The plan to commit.
    pub plan: Plan,
    /// The live context after it, before the incoming spans are appended.
    pub post: Vec<Span>,
    /// The verifier's verdict (passed).
    pub verdict: Verdict,
}

/// Why a turn was refused, with everything the caller needs to act on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The sizes that decided it.
    pub sizes: Sizes,
    /// What is wrong: a size violation, or every violation of a failed
    /// plan.
    pub violations: Vec<Violation>,
    /// The plan that failed verification, when one was made.
    pub plan: Option<Plan>,
}

/// Decides whether the incoming turn fits, needs a compaction, or must be
/// refused. Relevance is weighted as `input.config.relevance` says.
pub fn decide(input: &AdmissionInput<'_>, counter: &dyn TokenCounter) -> Decision {
    decide_with(
        input,
        None,
        || None,
        counter,
        |plan, post, verdict| Compaction {
            plan,
            post: post.iter().map(|&s| s.clone()).collect(),
            verdict,
        },
    )
}

/// Whether a turn of `incoming` tokens fits beside a live context of
/// `live` tokens within `config`'s budget, as they stand: no compaction is
/// needed.
pub(crate) fn fits(config: &SessionConfig, live: u64, incoming: u64) -> bool {
    live + incoming <= u64::from(config.budget_tokens())
}

/// [`decide`], handing a verified compaction to `compact` with the
/// post-state as references (the kept spans where they stand in
/// `input.live`), so that a caller that needs no copy of the live context
/// makes none. A caller that keeps the live context's totals gives them as
/// `live_totals` (tokens, pinned tokens), and a turn that fits then costs
/// the size of the turn, not of the live context; one that keeps the live
/// spans' facts gives a way to them as `facts`, called only when a
/// compaction is planned, which then reads them instead of the live text.
/// `facts` must give only facts that describe `input.live` (see
/// [`LiveFacts::describes`]), as [`Session::facts`] does: they are not
/// checked again.
///
/// [`Session::facts`]: crate::session::Session::facts
pub(crate) fn decide_with<'f, T>(
    input: &AdmissionInput<'_>,
    live_totals: Option<(u64, u64)>,
    facts: impl FnOnce() -> Option<&'f LiveFacts>,
    counter: &dyn TokenCounter,
    compact: impl FnOnce(Plan, &[&Span], Verdict) -> T,
) -> Decision<T> {
    let config = input.config;
    let total = |spans: &[Span], pinned_only: bool| -> u64 {
        spans
            .iter()
            .filter(|s| !pinned_only || s.is_pinned())
            .map(|s| u64::from(s.tokens))
            .sum()
    };
    let (live, live_pinned) =
        live_totals.unwrap_or_else(|| (total(input.live, false), total(input.live, true)));
    let incoming = total(input.incoming, false);
    let incoming_pinned = total(input.incoming, true);
    let budget = u64::from(config.budget_tokens());
    let sizes = Sizes {
        live,
        incoming,
        pinned: live_pinned + incoming_pinned,
        budget,
        window: u64::from(config.window_tokens),
    };
    if fits(config, live, incoming) {
        return Decision::Fits;
    }
    // The least the live constraints can be brought to; only computed
    // when they do not leave room as they stand.
    let least_pinned =
        if live_pinned + incoming_pinned > budget || incoming > budget - live_pinned.min(budget) {
            compressed_pinned_tokens(input.live, counter)
        } else {
            live_pinned
        };
    let named = format!(
        "live {live}, incoming {incoming}, pinned {} (live {live_pinned} + incoming {incoming_pinned}; live compressible to {least_pinned}), budget {budget}, window {}",
        sizes.pinned, sizes.window
    );
    if least_pinned + incoming_pinned > budget {
        return refuse(
            sizes,
            ViolationKind::PinnedExceedBudget,
            format!("pinned constraints alone exceed the budget, even compressed: {named}"),
        );
    }
    if incoming > budget - least_pinned {
        return refuse(
            sizes,
            ViolationKind::TurnTooLarge,
            format!(
                "the turn is larger than budget - pinned = {} (pinned compressed as far as their predicates allow): {named}",
                budget - least_pinned
            ),
        );
    }

    let query = input
        .incoming
        .iter()
        .map(|s| s.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let held: Vec<&str> = input
        .incoming
        .iter()
        .filter_map(Span::tool_call_id)
        .collect();
    let plan_input = PlanInput {
        config,
        live: input.live,
        incoming_tokens: incoming,
        query: &query,
        turn: input.turn,
        next_span_id: input.next_span_id,
        now_ms: input.now_ms,
        target_tokens: None,
        held_tool_calls: &held,
    };
    let facts = facts();
    let plan = plan_described(&plan_input, facts, counter);
    let made = made_spans(input.live, &plan);
    let rows = LiveRow::of_spans(facts, input.live);
    let post = apply_refs(input.live, &rows, &plan, &made);
    let turn = IncomingTurn {
        tokens: incoming,
        tool_calls: &held,
    };
    let verdict = verify_refs(input.live, facts, &plan, &post, turn, config, counter);
    if verdict.passed() {
        Decision::Compact(compact(plan, &post, verdict))
    } else {
        Decision::Refuse(Refusal {
            sizes,
            violations: verdict.violations,
            plan: Some(plan),
        })
    }
}

fn refuse<T>(sizes: Sizes, kind: ViolationKind, detail: String) -> Decision<T> {
    Decision::Refuse(Refusal {
        sizes,
        violations: vec![Violation {
            kind,
            span_id: None,
            detail,
            missing_terms: Vec::new(),
        }],
        plan: None,
    })
}

/// A predicate as a caller gave it: parts left unset are derived.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallerPredicate {
    /// The modality; `None` when unspecified.
    pub modality: Option<Modality>,
    /// Terms every form of the constraint must keep.
    pub required_terms: Vec<String>,
}

/// The class of an incoming span, and its predicate when it is a
/// constraint, before its session sees it. The caller's class stands
/// (SUMMARY is compaction's: a caller's counts as narrative); unlabelled
/// tool and assistant output is classified by role and text now; an
/// unlabelled user or system span stays narrative until the session's
/// classifier mode and tuning decide it at admission.
pub fn label(
    role: Role,
    text: &str,
    class: Option<SpanClass>,
    given: Option<&CallerPredicate>,
) -> (Classification, Option<Predicate>) {
    let by = |class, source| Classification {
        class,
        source,
        rule: String::new(),
    };
    let classification = match (class, role) {
        (Some(SpanClass::Summary), _) => by(SpanClass::Narrative, ClassSource::Caller),
        (Some(class), _) => by(class, ClassSource::Caller),
        (None, Role::User | Role::System) => by(SpanClass::Narrative, ClassSource::Rules),
        (None, Role::Tool | Role::Assistant) => crate::classify::classify(role, text),
    };
    let predicate = (classification.class == SpanClass::Constraint).then(|| {
        // The caller's predicate where given, its unset parts derived.
        let modality = given.and_then(|p| p.modality);
        let derived = crate::predicate::derive(text, modality);
        match given {
            Some(p) if !p.required_terms.is_empty() => Predicate {
                modality: derived.modality,
                required_terms: p.required_terms.clone(),
                source: PredicateSource::Caller,
            },
            Some(_) if modality.is_some() => Predicate {
                source: PredicateSource::Caller,
                ..derived
            },
            _ => derived,
        }
    });
    (classification, predicate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::ByteLength;

    fn span(id: u64, role: Role, text: &str) -> Span {
        crate::testing::admitted(id, id, role, text)
    }

    fn decide_for(config: &SessionConfig, live: &[Span], incoming: &[Span]) -> Decision {
        let next = incoming.iter().chain(live).map(|s| s.id).max().unwrap_or(0) + 1;
        let input = AdmissionInput {
            config,
            live,
            incoming,
            next_span_id: next,
            turn: next,
            now_ms: 5,
        };
        decide(&input, &ByteLength)
    }

    fn session() -> Vec<Span> {
        let mut live = vec![span(
            1,
            Role::User,
            "Never write to the `prod` namespace; stage only.",
        )];
        for id in 2..=20 {
            live.push(span(
                id,
                Role::Tool,
                &format!(
                    "output {id} of kubectl diff for k8s/staging/app-{id}.yaml {}",
                    "y".repeat(150)
                ),
            ));
        }
        live
    }

    #[test]
    fn fits_when_within_budget() {
        let config = SessionConfig::with_window(100_000);
        let incoming = [span(21, Role::User, "next")];
        assert_eq!(decide_for(&config, &session(), &incoming), Decision::Fits);
    }

    #[test]
    fn compacts_and_keeps_the_constraint() {
        let live = session();
        let total: u64 = live.iter().map(|s| u64::from(s.tokens)).sum();
        let config = SessionConfig::with_window((total as f64 / 0.85) as u32);
        let incoming = [span(
            21,
            Role::User,
            &format!("Apply the staging overlays now. {}", "w".repeat(400)),
        )];
        let Decision::Compact(c) = decide_for(&config, &live, &incoming) else {
            panic!("expected a compaction");
        };
        assert!(c.verdict.passed());
        assert!(c.post.iter().any(|s| s.id == 1 && s.text == live[0].text));
        let post: u64 = c.post.iter().map(|s| u64::from(s.tokens)).sum();
        assert!(post + u64::from(incoming[0].tokens) <= u64::from(config.budget_tokens()));
        assert_eq!(c.plan.summary.as_ref().unwrap().id, 22);
    }

    #[test]
    fn refuses_when_pinned_exceed_the_budget() {
        let live = session();
        let config = SessionConfig::with_window(100);
        let incoming = [span(
            21,
            Role::User,
            &format!("Always keep {}", "q".repeat(100)),
        )];
        let Decision::Refuse(r) = decide_for(&config, &live, &incoming) else {
            panic!("expected a refusal");
        };
        assert_eq!(r.violations[0].kind, ViolationKind::PinnedExceedBudget);
        assert!(r.plan.is_none());
        assert_eq!(r.sizes.budget, 85);
        assert_eq!(r.sizes.window, 100);
        for n in [r.sizes.live, r.sizes.incoming, r.sizes.pinned, 85, 100] {
            assert!(
                r.violations[0].detail.contains(&n.to_string()),
                "{}",
                r.violations[0].detail
            );
        }
    }

    #[test]
    fn refuses_a_turn_too_large() {
        let live = session();
        let config = SessionConfig::with_window(1_000);
        let incoming = [span(21, Role::Tool, &"t".repeat(2_000))];
        let Decision::Refuse(r) = decide_for(&config, &live, &incoming) else {
            panic!("expected a refusal");
        };
        assert_eq!(r.violations.len(), 1);
        assert_eq!(r.violations[0].kind, ViolationKind::TurnTooLarge);
        assert_eq!(r.sizes.incoming, 2_000);
        assert_eq!(r.sizes.pinned, u64::from(live[0].tokens));
        assert!(r.violations[0].detail.contains("live "));
        assert!(r.violations[0].detail.contains("window 1000"));
    }

    #[test]
    fn a_caller_label_stands_and_its_predicate_keeps_the_callers_terms() {
        let text = "Never deploy to prod on Fridays.";
        let given = CallerPredicate {
            modality: None,
            required_terms: vec!["prod".into()],
        };
        let (class, predicate) = label(Role::User, text, Some(SpanClass::Constraint), Some(&given));
        assert_eq!(
            (class.class, class.source),
            (SpanClass::Constraint, ClassSource::Caller)
        );
        let predicate = predicate.unwrap();
        assert_eq!(predicate.required_terms, ["prod"]);
        assert_eq!(predicate.source, PredicateSource::Caller);

        let (class, predicate) = label(Role::User, text, None, None);
        assert_eq!(
            (class.class, class.source),
            (SpanClass::Narrative, ClassSource::Rules)
        );
        assert!(predicate.is_none());
        let (class, _) = label(Role::Tool, text, Some(SpanClass::Summary), None);
        assert_eq!(
            (class.class, class.source),
            (SpanClass::Narrative, ClassSource::Caller)
        );
    }
}
