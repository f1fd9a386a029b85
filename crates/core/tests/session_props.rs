//! Property (4): a [`Session`] driven through random sequences of
//! operations — admissions (bursts included), pins, unpins, plans and
//! commits with and without the caller's edits, stale plans, background and
//! staleness compactions, the passage of time, restarts — keeps the
//! invariants below after every step:
//!
//! 1. every constraint admitted or pinned and not unpinned is live, still a
//!    constraint, and verbatim or in a compressed form that satisfies its
//!    predicate against the form it was pinned in;
//! 2. live tokens never exceed the budget (nor the window), and the
//!    record's counters are the sums over the live spans;
//! 3. a refusal changes nothing but the marker count, and a committed
//!    compaction never evicts a constraint;
//! 7. a session that admitted nothing since its last compaction is never
//!    compacted, whatever the time.
//!
//! A second property takes passing plans of sessions reached the same way,
//! breaks one constraint in them, and checks that the verifier refuses the
//! result with the right kind of violation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::cell::Cell;
use std::collections::{BTreeMap, HashSet};

use ctxbroker_core::classify::classify;
use ctxbroker_core::config::{
    AnchorPolicy, ClassifierMode, SessionConfig, SessionMode, TriggerPolicy,
};
use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::plan::{CompressedForm, Eviction, EvictionReason, Plan, ViolationKind};
use ctxbroker_core::planner;
use ctxbroker_core::predicate::{check, derive, expresses};
use ctxbroker_core::session::{CallerEdits, Change, Incoming, PlanId, Rejection, Session};
use ctxbroker_core::span::{
    ClassSource, Classification, Modality, Predicate, Role, Span, SpanClass, SpanId,
};
use ctxbroker_core::summary::extract_anchors;
use ctxbroker_core::verify::verify;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use support::{constraint_text, narrative_text, tokens};

// ---------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------

/// A session configuration: a window of a few hundred to a few thousand
/// tokens, mostly AUTO, sometimes APPROVAL, sometimes CALLER_ONLY.
fn config() -> impl Strategy<Value = SessionConfig> {
    (
        (300u32..4_000, 0.6f64..0.95, 0.5f64..=1.0, 1u32..=5),
        (
            prop_oneof![2 => Just(0u32), 1 => 8u32..200],
            prop_oneof![2 => Just(0u32), 1 => 32u32..400],
            prop_oneof![
                Just(TriggerPolicy::TokenBudget),
                Just(TriggerPolicy::Hybrid)
            ],
            500u64..15_000,
        ),
        (
            prop_oneof![4 => Just(SessionMode::Auto), 1 => Just(SessionMode::Approval)],
            prop_oneof![Just(AnchorPolicy::Require), Just(AnchorPolicy::Warn)],
            prop_oneof![6 => Just(ClassifierMode::Rules), 1 => Just(ClassifierMode::CallerOnly)],
            0.0f64..0.2,
            0.0f64..0.1,
        ),
    )
        .prop_map(
            |(
                (window, alpha, soft, generations),
                (anchor_budget, summary_max, trigger, interval),
                (mode, anchor_policy, classifier, floor, overhead),
            )| {
                let mut c = SessionConfig::with_window(window);
                c.alpha = alpha;
                c.soft_watermark = soft;
                c.max_summary_generations = generations;
                c.anchor_budget_tokens = anchor_budget;
                c.summary_max_tokens = summary_max;
                c.trigger = trigger;
                if trigger == TriggerPolicy::Hybrid {
                    c.staleness_interval_ms = interval;
                }
                c.mode = mode;
                c.anchor_policy = anchor_policy;
                c.classifier = classifier;
                c.relevance_floor = floor;
                c.reserved_overhead_tokens = (overhead * f64::from(c.alpha_window_tokens())) as u32;
                c
            },
        )
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        "src/[a-z]{2,6}/[a-z]{2,6}_[0-9]{1,2}\\.rs",
        "k8s/[a-z]{2,6}/deploy\\.yaml",
        "/etc/[a-z]{2,6}/[a-z]{2,6}\\.conf",
    ]
}

/// A tool result: a command, sometimes an error line naming a path and an
/// identifier, and some narrative, repeated to vary its size.
fn tool_text() -> impl Strategy<Value = String> {
    (
        path(),
        prop::option::weighted(0.6, (400u32..500, "[a-z]{3,6}_[a-z]{2,5}")),
        narrative_text(30),
        1usize..6,
    )
        .prop_map(|(p, error, filler, reps)| {
            let mut t = format!("$ cargo check\n    Checking {p}\n");
            if let Some((code, name)) = error {
                t.push_str(&format!(
                    "error[E0{code}]: unresolved name `{name}` in {p}\n"
                ));
            }
            t.push_str(&vec![filler; reps].join("\n"));
            t
        })
}

fn assistant_text() -> impl Strategy<Value = String> {
    (path(), "[a-z]{3,6}_[a-z]{2,5}", narrative_text(20)).prop_map(|(p, name, filler)| {
        format!("I will open {p} next and look at `{name}`. {filler}")
    })
}

fn constraint() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just("Never write to the `prod` namespace; stage only.".to_string()),
        1 => path().prop_map(|p| format!("Do not touch {p} without asking first.")),
        4 => constraint_text(),
    ]
}

fn user_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => constraint(),
        2 => (path(), narrative_text(10))
            .prop_map(|(p, filler)| format!("Can you look at {p} again? {filler}")),
        1 => narrative_text(20),
    ]
}

/// One span of a turn, before it is counted.
#[derive(Debug, Clone)]
enum Piece {
    /// Tool output, narrative by the caller's word or by its role.
    Tool(String, bool),
    /// The model's turn, narrative by the caller's word or by its role.
    Assistant(String, bool),
    /// A constraint the caller classifies as such.
    Constraint(String),
    /// User text with no class: the rules decide.
    User(String),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        4 => (tool_text(), any::<bool>()).prop_map(|(t, c)| Piece::Tool(t, c)),
        2 => (assistant_text(), any::<bool>()).prop_map(|(t, c)| Piece::Assistant(t, c)),
        2 => constraint().prop_map(Piece::Constraint),
        2 => user_text().prop_map(Piece::User),
    ]
}

fn turn() -> impl Strategy<Value = Vec<Piece>> {
    prop::collection::vec(piece(), 1..=3)
}

/// What a caller adds to a plan it commits.
#[derive(Debug, Clone)]
enum Edit {
    /// Nothing: the draft as planned.
    Draft,
    /// A caller summary that is the draft's text.
    DraftText,
    /// A caller summary lacking one of the draft's anchors.
    DropAnchor(Index),
    /// A compressed form of a constraint that breaks its predicate.
    BadForm(Index, Breakage),
}

/// How a compressed form breaks its predicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breakage {
    /// One required term is missing.
    MissingTerm,
    /// The modality is lost.
    NoModality,
    /// Longer than the form the constraint was pinned in.
    Longer,
}

const BREAKAGES: &[Breakage] = &[
    Breakage::MissingTerm,
    Breakage::NoModality,
    Breakage::Longer,
];

#[derive(Debug, Clone)]
enum Op {
    Admit(Vec<Piece>),
    /// One tool result of `factor` times the budget.
    Burst(f64, String),
    Pin {
        pick: Index,
        modality: Option<Modality>,
        terms: bool,
    },
    /// Pin a summary, or a span that is not live: always refused.
    PinWrong(Index),
    Unpin(Index),
    /// Unpin something that is not a constraint: always refused.
    UnpinWrong(Index),
    PlanCommit {
        /// Room to leave, as a fraction of the budget.
        incoming: f64,
        /// The target, as a fraction of the budget.
        target: Option<f64>,
        edit: Edit,
    },
    /// Plan, admit a turn, then commit the plan: stale.
    PlanAdmitCommit(Vec<Piece>),
    Advance(u64),
    Soft,
    Staleness,
    Restart,
}

fn modality() -> impl Strategy<Value = Option<Modality>> {
    prop_oneof![
        3 => Just(None),
        1 => prop::sample::select(&[
            Modality::Prohibition,
            Modality::Requirement,
            Modality::Restriction,
            Modality::Correction,
        ][..])
        .prop_map(Some),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => Just(Edit::Draft),
        2 => Just(Edit::DraftText),
        2 => any::<Index>().prop_map(Edit::DropAnchor),
        2 => (any::<Index>(), prop::sample::select(BREAKAGES)).prop_map(|(i, b)| Edit::BadForm(i, b)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => turn().prop_map(Op::Admit),
        1 => (0.3f64..1.6, tool_text()).prop_map(|(f, t)| Op::Burst(f, t)),
        2 => (any::<Index>(), modality(), any::<bool>())
            .prop_map(|(pick, modality, terms)| Op::Pin { pick, modality, terms }),
        1 => any::<Index>().prop_map(Op::PinWrong),
        2 => any::<Index>().prop_map(Op::Unpin),
        1 => any::<Index>().prop_map(Op::UnpinWrong),
        4 => (
            prop_oneof![Just(0.0), 0.0f64..0.5],
            prop::option::of(0.0f64..1.0),
            edit(),
        )
            .prop_map(|(incoming, target, edit)| Op::PlanCommit { incoming, target, edit }),
        1 => turn().prop_map(Op::PlanAdmitCommit),
        3 => prop_oneof![0u64..5_000, 0u64..60_000].prop_map(Op::Advance),
        2 => Just(Op::Soft),
        2 => Just(Op::Staleness),
        1 => Just(Op::Restart),
    ]
}

/// Counts a text with the process's one tokenizer.
fn count(text: &str) -> u32 {
    tokens().count(text)
}

/// An incoming span as the server builds one (crates/server broker.rs):
/// counted, classified by the caller or by the rules, with a derived
/// predicate for a constraint.
fn incoming(role: Role, text: String, class: Option<SpanClass>) -> Incoming {
    let classification = match class {
        Some(SpanClass::Constraint) => Classification {
            class: SpanClass::Constraint,
            source: ClassSource::Caller,
            rule: String::new(),
        },
        Some(_) => Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Caller,
            rule: String::new(),
        },
        None => classify(role, &text),
    };
    let predicate = (classification.class == SpanClass::Constraint).then(|| derive(&text, None));
    Incoming {
        role,
        tokens: count(&text),
        text,
        classification,
        predicate,
        relevance_hint: None,
        unclassified: class.is_none(),
        attributes: None,
    }
}

fn incoming_turn(pieces: &[Piece]) -> Vec<Incoming> {
    pieces
        .iter()
        .map(|p| match p {
            Piece::Tool(t, caller) => incoming(
                Role::Tool,
                t.clone(),
                caller.then_some(SpanClass::Narrative),
            ),
            Piece::Assistant(t, caller) => incoming(
                Role::Assistant,
                t.clone(),
                caller.then_some(SpanClass::Narrative),
            ),
            Piece::Constraint(t) => incoming(Role::User, t.clone(), Some(SpanClass::Constraint)),
            Piece::User(t) => incoming(Role::User, t.clone(), None),
        })
        .collect()
}

// ---------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------

/// What a constraint was pinned as: its predicate and the text it was
/// pinned in.
#[derive(Debug, Clone)]
struct Pinned {
    predicate: Predicate,
    text: String,
}

/// How often each path was taken, over all cases: a generator that stops
/// reaching a path fails the test instead of passing vacuously.
#[derive(Debug, Default)]
struct Coverage {
    admitted: Cell<u32>,
    hard_compactions: Cell<u32>,
    compressed: Cell<u32>,
    refused_turns: Cell<u32>,
    approvals: Cell<u32>,
    manual_commits: Cell<u32>,
    caller_summaries: Cell<u32>,
    anchor_refusals: Cell<u32>,
    anchor_warnings: Cell<u32>,
    bad_forms: Cell<u32>,
    stale: Cell<u32>,
    soft: Cell<u32>,
    staleness: Cell<u32>,
    pins: Cell<u32>,
    unpins: Cell<u32>,
    restarts: Cell<u32>,
    mutations: Cell<u32>,
}

fn bump(c: &Cell<u32>) {
    c.set(c.get() + 1);
}

/// A session with the model the invariants are checked against.
struct Run<'a> {
    s: Session,
    now: u64,
    /// Every constraint admitted or pinned and not unpinned since.
    pinned: BTreeMap<SpanId, Pinned>,
    /// Markers written so far.
    markers: u64,
    /// Turns admitted so far.
    turns: u64,
    cov: &'a Coverage,
}

type Check = Result<(), TestCaseError>;

impl<'a> Run<'a> {
    fn new(config: SessionConfig, cov: &'a Coverage) -> Self {
        valid_config(config.validate());
        let now = 1_700_000_000_000;
        Run {
            s: Session::create("props", config, now),
            now,
            pinned: BTreeMap::new(),
            markers: 0,
            turns: 0,
            cov,
        }
    }

    fn budget(&self) -> u64 {
        u64::from(self.s.record.config.budget_tokens())
    }

    fn interval(&self) -> u64 {
        self.s.record.config.staleness_interval_ms.max(1)
    }

    /// Adopts a change the store would have acknowledged, checking what it
    /// says about itself first.
    fn apply(&mut self, change: Change) -> Check {
        prop_assert_eq!(change.expected_revision, self.s.record.revision);
        for id in &change.evict {
            prop_assert!(
                !self.pinned.contains_key(id),
                "a committed change evicts constraint {}",
                id
            );
        }
        if let Some(summary) = &change.summary {
            prop_assert_eq!(summary.class(), SpanClass::Summary);
            prop_assert!(!self.pinned.contains_key(&summary.id));
        }
        match &change.marker {
            Some(marker) => {
                self.markers += 1;
                prop_assert_eq!(marker.session_seq, self.markers);
                prop_assert_eq!(change.record.marker_count, self.markers);
                if marker.outcome == Outcome::Committed {
                    prop_assert!(
                        marker
                            .evicted
                            .iter()
                            .all(|id| !self.pinned.contains_key(id))
                    );
                    let appended: u64 = change.append.iter().map(|x| u64::from(x.tokens)).sum();
                    prop_assert_eq!(
                        u64::from(marker.tokens_after),
                        change.record.live_tokens - appended
                    );
                }
            }
            None => prop_assert_eq!(change.record.marker_count, self.markers),
        }
        self.s.apply(&change);
        Ok(())
    }

    /// Checks a refusal that records an ABORTED marker, and adopts it.
    fn escalation(&mut self, rejection: Rejection) -> Result<Vec<ViolationKind>, TestCaseError> {
        let Rejection::Escalation {
            sizes,
            violations,
            abort,
        } = rejection
        else {
            return Err(TestCaseError::fail(format!(
                "expected an escalation, got {rejection:?}"
            )));
        };
        prop_assert!(!violations.is_empty());
        prop_assert_eq!(sizes.budget, self.budget());
        prop_assert_eq!(sizes.window, u64::from(self.s.record.config.window_tokens));
        prop_assert_eq!(sizes.live, self.s.record.live_tokens);
        let mut aborted = self.s.clone();
        aborted.apply(&abort);
        prop_assert_eq!(&aborted.spans, &self.s.spans);
        let mut expected = self.s.record.clone();
        expected.marker_count += 1;
        prop_assert_eq!(&abort.record, &expected);
        prop_assert!(abort.append.is_empty() && abort.evict.is_empty());
        prop_assert!(abort.replace.is_empty() && abort.summary.is_none());
        let marker = abort.marker.as_ref().expect("an ABORTED marker");
        prop_assert_eq!(marker.outcome, Outcome::Aborted);
        prop_assert_eq!(&marker.violations, &violations);
        let before = self.s.clone();
        self.apply(*abort)?;
        prop_assert_eq!(&self.s.spans, &before.spans);
        let mut restored = self.s.record.clone();
        restored.marker_count -= 1;
        prop_assert_eq!(&restored, &before.record);
        Ok(violations.iter().map(|v| v.kind).collect())
    }

    /// Records the constraints a change wrote (admitted or pinned).
    fn learn_constraints(&mut self, spans: &[Span]) {
        for s in spans.iter().filter(|s| s.is_pinned()) {
            let text = s
                .original
                .as_ref()
                .map_or_else(|| s.text.clone(), |o| o.text.clone());
            self.pinned.insert(
                s.id,
                Pinned {
                    predicate: s.predicate.clone().expect("a constraint has a predicate"),
                    text,
                },
            );
        }
    }

    /// Checks a committed compaction and that nothing compacts right
    /// after it, then adopts it.
    fn compaction(&mut self, change: Change, trigger: CompactionTrigger) -> Check {
        let marker = change.marker.clone().expect("a compaction has a marker");
        prop_assert_eq!(marker.trigger, trigger);
        prop_assert_eq!(marker.outcome, Outcome::Committed);
        prop_assert!(!marker.evicted.is_empty() || !marker.compressed.is_empty());
        prop_assert_eq!(&marker.evicted, &change.evict);
        prop_assert_eq!(
            marker.summary_span_id,
            change.summary.as_ref().map(|s| s.id)
        );
        prop_assert!(marker.summary_generation <= self.s.record.config.max_summary_generations);
        if !marker.compressed.is_empty() {
            bump(&self.cov.compressed);
        }
        self.apply(change)?;
        prop_assert_eq!(self.s.record.turns, self.s.record.last_compaction_turn);
        self.idle_never_compacts()
    }

    /// Invariant 7: with nothing admitted since the last compaction, no
    /// compaction fires at any later time.
    fn idle_never_compacts(&self) -> Check {
        if self.s.record.turns != self.s.record.last_compaction_turn {
            return Ok(());
        }
        let c = tokens();
        let i = self.interval();
        for t in [
            self.now,
            self.now + 1,
            self.now + i,
            self.now + 3 * i + 7,
            self.now + 1_000 * i,
            u64::MAX / 2,
        ] {
            prop_assert!(
                !self.s.staleness_due(t),
                "staleness due at {} while idle",
                t
            );
            prop_assert!(
                self.s.clone().soft_compaction(t, c).is_none(),
                "soft compaction at {} while idle",
                t
            );
            prop_assert!(
                self.s.clone().staleness_compaction(t, c).is_none(),
                "staleness compaction at {} while idle",
                t
            );
        }
        Ok(())
    }

    /// Every invariant, after every step.
    fn invariants(&self) -> Check {
        let s = &self.s;
        let r = &s.record;
        let config = &r.config;
        let budget = self.budget();
        prop_assert!(budget <= u64::from(config.window_tokens));

        // (2) Counters, order, ids, counts.
        let live: u64 = s.spans.iter().map(|x| u64::from(x.tokens)).sum();
        let pinned: Vec<&Span> = s.spans.iter().filter(|x| x.is_pinned()).collect();
        prop_assert_eq!(r.live_tokens, live);
        prop_assert_eq!(r.live_spans, s.spans.len() as u64);
        prop_assert_eq!(
            r.pinned_tokens,
            pinned.iter().map(|x| u64::from(x.tokens)).sum::<u64>()
        );
        prop_assert_eq!(r.pinned_spans, pinned.len() as u64);
        prop_assert!(live <= budget, "live {} > budget {}", live, budget);
        prop_assert_eq!(r.marker_count, self.markers);
        prop_assert_eq!(r.turns, self.turns);
        prop_assert!(r.last_compaction_turn <= r.turns);
        let mut ids = HashSet::new();
        for w in s.spans.windows(2) {
            prop_assert!(
                w[0].position < w[1].position,
                "span {} at {} before span {} at {}",
                w[0].id,
                w[0].position,
                w[1].id,
                w[1].position
            );
        }
        for x in &s.spans {
            prop_assert!(ids.insert(x.id), "span {} twice", x.id);
            prop_assert!(x.id < r.next_span_id);
            prop_assert_eq!(x.tokens, count(&x.text), "span {} miscounted", x.id);
            match x.class() {
                SpanClass::Summary => {
                    prop_assert!(x.summary.is_some());
                    prop_assert!(x.generation >= 1);
                    prop_assert!(x.generation <= config.max_summary_generations);
                }
                _ => prop_assert_eq!(x.generation, 0),
            }
            if x.is_pinned() {
                prop_assert!(x.predicate.is_some());
            }
        }

        // (1) Every constraint of the model is live, pinned, and verbatim
        // or compressed within its predicate; no other span is pinned.
        let live_pinned: Vec<SpanId> = pinned.iter().map(|x| x.id).collect();
        let model: Vec<SpanId> = self.pinned.keys().copied().collect();
        prop_assert_eq!(
            &live_pinned,
            &model,
            "live constraints differ from the model"
        );
        for (id, p) in &self.pinned {
            let x = s.spans.iter().find(|x| x.id == *id).unwrap();
            prop_assert!(x.is_pinned());
            prop_assert_eq!(x.predicate.as_ref(), Some(&p.predicate));
            match &x.original {
                None => prop_assert_eq!(&x.text, &p.text, "constraint {} altered", id),
                Some(o) => {
                    prop_assert_eq!(&o.text, &p.text, "constraint {} lost its original", id);
                    prop_assert_eq!(o.tokens, count(&o.text));
                    let verdict = check(&x.text, x.tokens, o.tokens, &p.predicate);
                    prop_assert!(
                        verdict.is_ok(),
                        "constraint {} stands as {:?}, which fails {:?}: {:?}",
                        id,
                        x.text,
                        p.predicate,
                        verdict
                    );
                }
            }
        }

        // (7)
        self.idle_never_compacts()
    }

    /// Admits a turn, through an approval when the session needs one.
    /// Returns whether the turn was admitted.
    fn admit(&mut self, turn: Vec<Incoming>) -> Result<bool, TestCaseError> {
        let c = tokens();
        let n = turn.len();
        let unclassified = turn.iter().any(|i| i.unclassified);
        let config = self.s.record.config.clone();
        let needs_approval = config.mode == SessionMode::Approval
            || self.s.record.approval_required
            || (config.classifier == ClassifierMode::CallerOnly && unclassified);
        match self.s.admit(turn.clone(), self.now, c) {
            Ok(change) => {
                // A session that needs approval never compacts on its own.
                prop_assert!(
                    !(needs_approval && change.marker.is_some()),
                    "a session that needs approval compacted at admission"
                );
                self.admitted(change, n)?;
                Ok(true)
            }
            Err(e @ Rejection::Escalation { .. }) => {
                let kinds = self.escalation(e)?;
                // A turn is only refused when it cannot fit even next to
                // the constraints compressed as far as they go: the
                // planner always finds a valid plan otherwise.
                prop_assert!(
                    kinds.iter().all(|k| matches!(
                        k,
                        ViolationKind::PinnedExceedBudget | ViolationKind::TurnTooLarge
                    )),
                    "a feasible turn was refused: {:?}",
                    kinds
                );
                bump(&self.cov.refused_turns);
                Ok(false)
            }
            Err(Rejection::ApprovalRequired { plan_id, sizes }) => {
                prop_assert!(
                    needs_approval,
                    "approval required of a session that compacts on its own"
                );
                prop_assert!(sizes.live + sizes.incoming > sizes.budget);
                prop_assert_eq!(plan_id.revision, self.s.record.revision);
                prop_assert_eq!(plan_id.incoming_tokens, sizes.incoming);
                bump(&self.cov.approvals);
                let edits = CallerEdits {
                    actor: "approver".into(),
                    ..CallerEdits::default()
                };
                match self.s.commit(plan_id, &edits, self.now, c) {
                    Ok(change) => {
                        self.compaction(change, CompactionTrigger::Manual)?;
                        prop_assert!(self.s.record.live_tokens + sizes.incoming <= self.budget());
                    }
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "the approved plan {plan_id} does not commit: {e:?}"
                        )));
                    }
                }
                // It now fits without another compaction.
                match self.s.admit(turn, self.now, c) {
                    Ok(change) => {
                        prop_assert!(
                            change.marker.is_none(),
                            "the approved turn needed another compaction"
                        );
                        self.admitted(change, n)?;
                        Ok(true)
                    }
                    Err(e) => Err(TestCaseError::fail(format!(
                        "the approved turn is refused: {e:?}"
                    ))),
                }
            }
            Err(e) => Err(TestCaseError::fail(format!("unexpected refusal: {e:?}"))),
        }
    }

    fn admitted(&mut self, change: Change, n: usize) -> Check {
        prop_assert_eq!(change.append.len(), n);
        let first = self.s.record.next_span_id;
        for (k, x) in change.append.iter().enumerate() {
            prop_assert_eq!(x.id, first + k as u64);
            prop_assert_eq!(x.turn, self.s.record.turns + 1);
        }
        let append = change.append.clone();
        self.turns += 1;
        bump(&self.cov.admitted);
        if change.marker.is_some() {
            bump(&self.cov.hard_compactions);
            self.learn_constraints(&append);
            self.compaction(change, CompactionTrigger::HardBudget)?;
        } else {
            self.learn_constraints(&append);
            self.apply(change)?;
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Check {
        let c = tokens();
        match op {
            Op::Admit(pieces) => {
                self.admit(incoming_turn(pieces))?;
            }
            Op::Burst(factor, text) => {
                let unit = count(text).max(1);
                let want = (factor * self.budget() as f64) as u32;
                let reps = (want / unit).clamp(1, 400) as usize;
                let big = vec![text.as_str(); reps].join("\n");
                self.admit(vec![incoming(Role::Tool, big, None)])?;
            }
            Op::Pin {
                pick,
                modality,
                terms,
            } => {
                let candidates: Vec<&Span> = self
                    .s
                    .spans
                    .iter()
                    .filter(|x| x.class() != SpanClass::Summary)
                    .collect();
                if candidates.is_empty() {
                    return Ok(());
                }
                let target = candidates[pick.index(candidates.len())].clone();
                let required: Vec<String> = if *terms {
                    extract_anchors(&target.text).into_iter().take(2).collect()
                } else {
                    Vec::new()
                };
                match self.s.pin(target.id, *modality, required, self.now) {
                    Ok(change) => {
                        prop_assert!(change.marker.is_none());
                        prop_assert_eq!(change.replace.len(), 1);
                        let pinned = change.replace[0].clone();
                        prop_assert_eq!(pinned.id, target.id);
                        prop_assert!(pinned.is_pinned());
                        prop_assert_eq!(pinned.classification.source, ClassSource::Caller);
                        if let Some(m) = modality {
                            prop_assert_eq!(
                                pinned.predicate.as_ref().map(|p| p.modality),
                                Some(*m)
                            );
                        }
                        self.learn_constraints(&[pinned]);
                        self.apply(change)?;
                        bump(&self.cov.pins);
                    }
                    Err(Rejection::WrongClass { .. }) => {
                        // Only a compressed constraint whose original does
                        // not fit may be refused.
                        prop_assert!(target.original.is_some());
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("pin refused: {e:?}"))),
                }
            }
            Op::PinWrong(pick) => {
                let summaries: Vec<SpanId> = self
                    .s
                    .spans
                    .iter()
                    .filter(|x| x.class() == SpanClass::Summary)
                    .map(|x| x.id)
                    .collect();
                let (id, summary) = if summaries.is_empty() {
                    (self.s.record.next_span_id + pick.index(5) as u64, false)
                } else {
                    (summaries[pick.index(summaries.len())], true)
                };
                let got = self.s.pin(id, None, Vec::new(), self.now);
                if summary {
                    prop_assert!(
                        matches!(got, Err(Rejection::WrongClass { .. })),
                        "{:?}",
                        got
                    );
                } else {
                    prop_assert_eq!(got, Err(Rejection::SpanNotLive { span_id: id }));
                }
            }
            Op::Unpin(pick) => {
                let ids: Vec<SpanId> = self.pinned.keys().copied().collect();
                if ids.is_empty() {
                    return Ok(());
                }
                let id = ids[pick.index(ids.len())];
                let change = match self.s.unpin(id, "tester", "no longer binding", self.now) {
                    Ok(change) => change,
                    Err(e) => return Err(TestCaseError::fail(format!("unpin refused: {e:?}"))),
                };
                let marker = change.marker.clone().expect("an UNPIN marker");
                prop_assert_eq!(marker.trigger, CompactionTrigger::Unpin);
                prop_assert_eq!(marker.actor.as_str(), "tester");
                prop_assert_eq!(change.replace.len(), 1);
                prop_assert_eq!(change.replace[0].class(), SpanClass::Narrative);
                prop_assert!(change.replace[0].predicate.is_none());
                self.pinned.remove(&id);
                self.apply(change)?;
                bump(&self.cov.unpins);
            }
            Op::UnpinWrong(pick) => {
                let ids: Vec<SpanId> = self
                    .s
                    .spans
                    .iter()
                    .filter(|x| !x.is_pinned())
                    .map(|x| x.id)
                    .collect();
                if ids.is_empty() {
                    return Ok(());
                }
                let id = ids[pick.index(ids.len())];
                let got = self.s.unpin(id, "tester", "oops", self.now);
                prop_assert!(
                    matches!(got, Err(Rejection::WrongClass { .. })),
                    "{:?}",
                    got
                );
            }
            Op::PlanCommit {
                incoming,
                target,
                edit,
            } => {
                let budget = self.budget() as f64;
                self.plan_commit(
                    (incoming * budget) as u64,
                    target.map(|t| (t * budget) as u64),
                    edit,
                )?;
            }
            Op::PlanAdmitCommit(pieces) => {
                let planned = self.s.plan(0, None, self.now, c);
                let revision = self.s.record.revision;
                let other = PlanId {
                    session_tag: planned.plan_id.session_tag ^ 1,
                    ..planned.plan_id
                };
                let got = self.s.commit(other, &CallerEdits::default(), self.now, c);
                let stale = matches!(got, Err(Rejection::StalePlan { .. }));
                prop_assert!(stale, "a plan of another session commits: {:?}", got);
                self.admit(incoming_turn(pieces))?;
                if self.s.record.revision != revision {
                    let got = self
                        .s
                        .commit(planned.plan_id, &CallerEdits::default(), self.now, c);
                    prop_assert_eq!(
                        got,
                        Err(Rejection::StalePlan {
                            planned: revision,
                            current: self.s.record.revision,
                        })
                    );
                    bump(&self.cov.stale);
                }
            }
            Op::Advance(ms) => self.now += ms,
            Op::Soft => {
                if let Some(change) = self.s.soft_compaction(self.now, c) {
                    prop_assert!(change.record.live_tokens < self.s.record.live_tokens);
                    self.compaction(change, CompactionTrigger::SoftWatermark)?;
                    bump(&self.cov.soft);
                }
            }
            Op::Staleness => {
                let due = self.s.staleness_due(self.now);
                if let Some(change) = self.s.staleness_compaction(self.now, c) {
                    prop_assert!(due);
                    prop_assert!(change.record.live_tokens < self.s.record.live_tokens);
                    // Only original narrative older than one interval goes.
                    for id in &change.evict {
                        let x = self.s.spans.iter().find(|x| x.id == *id).unwrap();
                        prop_assert_eq!(x.class(), SpanClass::Narrative);
                        prop_assert!(x.turn != self.s.record.turns);
                        prop_assert!(self.now - x.admitted_at_ms > self.interval());
                    }
                    self.compaction(change, CompactionTrigger::Staleness)?;
                    bump(&self.cov.staleness);
                }
            }
            Op::Restart => {
                let mut restarted = Session::new(self.s.record.clone(), self.s.spans.clone());
                prop_assert_eq!(&restarted, &self.s);
                let room = self.budget() / 5;
                for (incoming, target) in [(0, None), (room, None), (0, Some(room)), (0, Some(0))] {
                    prop_assert_eq!(
                        restarted.plan(incoming, target, self.now, c),
                        self.s.plan(incoming, target, self.now, c)
                    );
                }
                self.s = restarted;
                bump(&self.cov.restarts);
            }
        }
        Ok(())
    }

    /// Plans, then commits the plan with the caller's edits, checking that
    /// the commit does what the plan and the edits say.
    fn plan_commit(&mut self, incoming: u64, target: Option<u64>, edit: &Edit) -> Check {
        let c = tokens();
        let config = self.s.record.config.clone();
        let out = self.s.plan(incoming, target, self.now, c);
        prop_assert_eq!(out.plan_id.revision, self.s.record.revision);
        // The verdict is the verifier's on that plan.
        let post = planner::apply(&self.s.spans, &out.plan);
        let verdict = verify(&self.s.spans, &out.plan, &post, incoming, &config, c);
        prop_assert_eq!(&verdict, &out.verdict);
        for e in &out.plan.evicted {
            prop_assert!(!self.pinned.contains_key(&e.span_id));
        }
        let draft = out.plan.summary.clone();
        let mut edits = CallerEdits {
            actor: "caller".into(),
            ..CallerEdits::default()
        };
        // What the commit must do.
        enum Expect {
            AsPlanned,
            AnchorMissing(usize),
            BadForm,
        }
        let mut expect = Expect::AsPlanned;
        match edit {
            Edit::Draft => {}
            Edit::DraftText => {
                if let Some(d) = &draft {
                    edits.summary = Some(d.text.clone());
                    bump(&self.cov.caller_summaries);
                }
            }
            Edit::DropAnchor(pick) => {
                let anchors = draft
                    .as_ref()
                    .and_then(|d| d.summary.as_ref())
                    .map(|i| i.anchors.clone())
                    .unwrap_or_default();
                if let (Some(d), false) = (&draft, anchors.is_empty()) {
                    let gone = &anchors[pick.index(anchors.len())];
                    let text = remove_all(&d.text, gone);
                    let missing = anchors
                        .iter()
                        .filter(|a| !text.contains(a.as_str()))
                        .count();
                    prop_assert!(missing >= 1);
                    edits.summary = Some(text);
                    expect = Expect::AnchorMissing(missing);
                }
            }
            Edit::BadForm(pick, breakage) => {
                let constraints: Vec<Span> = self
                    .s
                    .spans
                    .iter()
                    .filter(|x| x.is_pinned())
                    .cloned()
                    .collect();
                if !constraints.is_empty() {
                    let target = &constraints[pick.index(constraints.len())];
                    if let Some(form) = broken_form(target, *breakage) {
                        edits.compressed.push((target.id, form));
                        expect = Expect::BadForm;
                    }
                }
            }
        }

        let got = self.s.commit(out.plan_id, &edits, self.now, c);
        let nothing = out.plan.evicted.is_empty()
            && out.plan.compressed.is_empty()
            && edits.compressed.is_empty();
        if nothing {
            prop_assert_eq!(got, Err(Rejection::NothingToCommit));
            return Ok(());
        }
        match expect {
            Expect::BadForm => {
                let kinds = self.escalation(got.expect_err("a bad compressed form commits"))?;
                prop_assert!(
                    kinds.contains(&ViolationKind::PredicateUnsatisfied),
                    "a bad compressed form is refused with {:?}",
                    kinds
                );
                bump(&self.cov.bad_forms);
            }
            Expect::AnchorMissing(_) if config.anchor_policy == AnchorPolicy::Require => {
                let kinds = self.escalation(got.expect_err("a summary lacking anchors commits"))?;
                prop_assert!(kinds.contains(&ViolationKind::AnchorMissing), "{:?}", kinds);
                bump(&self.cov.anchor_refusals);
            }
            Expect::AnchorMissing(missing) => {
                if !out.verdict.passed() {
                    self.escalation(got.expect_err("a failing plan commits"))?;
                    return Ok(());
                }
                let change = match got {
                    Ok(change) => change,
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "a summary lacking anchors under WARN is refused: {e:?}"
                        )));
                    }
                };
                let marker = change.marker.clone().unwrap();
                prop_assert_eq!(
                    marker.anchors_dropped as usize,
                    out.plan.anchors_dropped as usize + missing,
                    "the marker does not count the caller's missing anchors"
                );
                prop_assert_eq!(
                    change.summary.as_ref().map(|s| s.text.as_str()),
                    edits.summary.as_deref().filter(|t| !t.trim().is_empty())
                );
                self.committed(change, &out.plan, incoming, false)?;
                bump(&self.cov.anchor_warnings);
            }
            Expect::AsPlanned => {
                if !out.verdict.passed() {
                    self.escalation(got.expect_err("a failing plan commits"))?;
                    return Ok(());
                }
                let change = match got {
                    Ok(change) => change,
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "a passing plan does not commit: {e:?}"
                        )));
                    }
                };
                // The commit re-derives the very plan it was given.
                prop_assert_eq!(&change.summary, &out.plan.summary);
                let marker = change.marker.clone().unwrap();
                prop_assert_eq!(marker.anchors_dropped, out.plan.anchors_dropped);
                prop_assert_eq!(marker.anchors_carried, out.plan.anchors_carried);
                prop_assert_eq!(marker.tokens_after as u64, out.plan.tokens_after);
                self.committed(change, &out.plan, incoming, true)?;
            }
        }
        Ok(())
    }

    fn committed(&mut self, change: Change, plan: &Plan, incoming: u64, same: bool) -> Check {
        let marker = change.marker.clone().unwrap();
        prop_assert_eq!(marker.actor.as_str(), "caller");
        let planned: Vec<SpanId> = plan.evicted.iter().map(|e| e.span_id).collect();
        prop_assert_eq!(&marker.evicted, &planned);
        if same {
            let compressed: Vec<SpanId> = plan.compressed.iter().map(|f| f.span_id).collect();
            prop_assert_eq!(&marker.compressed, &compressed);
        }
        self.compaction(change, CompactionTrigger::Manual)?;
        prop_assert!(self.s.record.live_tokens + incoming <= self.budget());
        bump(&self.cov.manual_commits);
        Ok(())
    }
}

fn valid_config<E: std::fmt::Debug>(r: Result<(), E>) {
    if let Err(e) = r {
        panic!("invalid configuration: {e:?}");
    }
}

/// `text` with every occurrence of `needle` removed (again, until none is
/// left).
fn remove_all(text: &str, needle: &str) -> String {
    let mut out = text.to_string();
    while let Some(at) = out.find(needle) {
        out.replace_range(at..at + needle.len(), "");
    }
    out
}

/// `text` with every occurrence of `needle` removed, ignoring ASCII case.
fn remove_all_ignoring_case(text: &str, needle: &str) -> String {
    let needle = needle.to_ascii_lowercase();
    let mut out = text.to_string();
    while let Some(at) = out.to_ascii_lowercase().find(&needle) {
        out.replace_range(at..at + needle.len(), "");
    }
    out
}

/// A form of a constraint broken as `breakage` says, or `None` when this
/// constraint cannot be broken that way (e.g. it requires no term). The
/// form is checked to fail the predicate, so that a pass is the
/// verifier's error.
fn broken_form(span: &Span, breakage: Breakage) -> Option<String> {
    let predicate = span.predicate.as_ref()?;
    let pinned = span
        .original
        .as_ref()
        .map_or(span.text.as_str(), |o| o.text.as_str());
    let pinned_tokens = span.original.as_ref().map_or(span.tokens, |o| o.tokens);
    let form = match breakage {
        Breakage::MissingTerm => {
            let term = predicate.required_terms.iter().find(|t| t.is_ascii())?;
            let form = remove_all_ignoring_case(pinned, term);
            let missing = check(&form, count(&form), pinned_tokens, predicate).err()?;
            if !missing.contains(term) {
                return None;
            }
            form
        }
        Breakage::NoModality => {
            let form = if predicate.required_terms.is_empty() {
                "ok".to_string()
            } else {
                predicate.required_terms.join(" ")
            };
            if expresses(&form, predicate.modality) {
                return None;
            }
            form
        }
        Breakage::Longer => format!("{pinned} {pinned}"),
    };
    check(&form, count(&form), pinned_tokens, predicate).err()?;
    Some(form)
}

// ---------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------

fn run_ops(run: &mut Run<'_>, ops: &[Op]) -> Check {
    run.invariants()?;
    for (k, op) in ops.iter().enumerate() {
        run.now += 37;
        run.step(op)
            .map_err(|e| TestCaseError::fail(format!("step {k} ({op:?}): {e}")))?;
        run.invariants()
            .map_err(|e| TestCaseError::fail(format!("after step {k} ({op:?}): {e}")))?;
    }
    Ok(())
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn every_step_keeps_the_invariants() {
    let cov = Coverage::default();
    let strategy = (config(), prop::collection::vec(op(), 20..60));
    runner(80)
        .run(&strategy, |(config, ops)| {
            let mut run = Run::new(config, &cov);
            run_ops(&mut run, &ops)
        })
        .unwrap();
    // Every path was taken at least a few times over the run.
    let paths = [
        ("admitted", &cov.admitted),
        ("hard compactions", &cov.hard_compactions),
        ("compressed constraints", &cov.compressed),
        ("refused turns", &cov.refused_turns),
        ("approvals", &cov.approvals),
        ("manual commits", &cov.manual_commits),
        ("caller summaries", &cov.caller_summaries),
        ("anchor refusals", &cov.anchor_refusals),
        ("anchor warnings", &cov.anchor_warnings),
        ("bad forms", &cov.bad_forms),
        ("stale plans", &cov.stale),
        ("soft compactions", &cov.soft),
        ("staleness compactions", &cov.staleness),
        ("pins", &cov.pins),
        ("unpins", &cov.unpins),
        ("restarts", &cov.restarts),
    ];
    let report: Vec<String> = paths
        .iter()
        .map(|(n, c)| format!("{n} {}", c.get()))
        .collect();
    eprintln!("coverage: {}", report.join(", "));
    for (name, c) in paths {
        assert!(
            c.get() >= 3,
            "{name} reached only {} times: {report:?}",
            c.get()
        );
    }
}

#[derive(Debug, Clone, Copy)]
enum Mutation {
    /// The plan evicts a live constraint as well.
    EvictConstraint,
    /// The plan compresses a constraint into a form lacking a term, its
    /// modality, or longer than the form it was pinned in.
    BreakForm(Breakage),
}

/// Breaks one constraint of a passing plan; the verifier must refuse the
/// result with the matching kind of violation.
fn mutate(pre: &[Span], plan: &Plan, target: &Span, m: Mutation, run: &Run<'_>) -> Check {
    let c = tokens();
    let config = &run.s.record.config;
    let mut p = plan.clone();
    let want = match m {
        Mutation::EvictConstraint => {
            p.evicted.push(Eviction {
                span_id: target.id,
                relevance: 0.0,
                reason: EvictionReason::Budget,
                tokens: target.tokens,
            });
            p.evicted.sort_by_key(|e| {
                pre.iter()
                    .find(|x| x.id == e.span_id)
                    .map_or(0, |x| x.position)
            });
            ViolationKind::PinnedMissing
        }
        Mutation::BreakForm(breakage) => {
            let Some(form) = broken_form(target, breakage) else {
                return Ok(());
            };
            p.compressed.retain(|f| f.span_id != target.id);
            p.compressed.push(CompressedForm {
                span_id: target.id,
                tokens: count(&form),
                text: form,
            });
            p.compressed.sort_by_key(|f| {
                pre.iter()
                    .find(|x| x.id == f.span_id)
                    .map_or(0, |x| x.position)
            });
            ViolationKind::PredicateUnsatisfied
        }
    };
    // The plan's own account is made consistent with what it now does,
    // so that only the broken constraint can fail it.
    let post = planner::apply(pre, &p);
    p.tokens_after = post.iter().map(|x| u64::from(x.tokens)).sum();
    let verdict = verify(pre, &p, &post, p.incoming_tokens, config, c);
    let kinds: Vec<ViolationKind> = verdict.violations.iter().map(|v| v.kind).collect();
    prop_assert!(
        kinds.contains(&want),
        "{:?} of constraint {}: expected {:?}, got {:?}",
        m,
        target.id,
        want,
        verdict.violations
    );
    if let Some(v) = verdict.violations.iter().find(|v| v.kind == want) {
        prop_assert_eq!(v.span_id, Some(target.id));
    }
    bump(&run.cov.mutations);
    Ok(())
}

#[test]
fn broken_plans_of_reached_sessions_are_refused() {
    let cov = Coverage::default();
    let strategy = (
        config(),
        prop::collection::vec(op(), 8..40),
        prop::collection::vec(
            (
                prop_oneof![Just(0.0), 0.0f64..0.4],
                prop::option::of(0.0f64..1.0),
            ),
            1..4,
        ),
    );
    runner(64)
        .run(&strategy, |(config, ops, plans)| {
            let mut run = Run::new(config, &cov);
            run_ops(&mut run, &ops)?;
            let budget = run.budget() as f64;
            let pre = run.s.spans.clone();
            let constraints: Vec<Span> = pre
                .iter()
                .filter(|x| x.is_pinned())
                .take(6)
                .cloned()
                .collect();
            for (incoming, target) in plans {
                let out = run.s.plan(
                    (incoming * budget) as u64,
                    target.map(|t| (t * budget) as u64),
                    run.now,
                    tokens(),
                );
                if !out.verdict.passed() {
                    continue;
                }
                for target in &constraints {
                    for m in [
                        Mutation::EvictConstraint,
                        Mutation::BreakForm(Breakage::MissingTerm),
                        Mutation::BreakForm(Breakage::NoModality),
                        Mutation::BreakForm(Breakage::Longer),
                    ] {
                        mutate(&pre, &out.plan, target, m, &run)?;
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    eprintln!("mutations checked: {}", cov.mutations.get());
    assert!(
        cov.mutations.get() >= 100,
        "only {} mutations checked",
        cov.mutations.get()
    );
}
