//! Admitting a turn: the incoming spans are settled (classified under the
//! session's mode), given ids, and admitted as they are or with the
//! compaction admission decided they need.

use std::cell::Cell;

use super::markers::Committing;
use super::{Change, Rejection, Session, Totals};
use crate::admission::{self, AdmissionInput, Decision};
use crate::config::{ClassifierMode, SessionConfig, SessionMode};
use crate::facts::{LiveFacts, LiveRow};
use crate::marker::CompactionTrigger;
use crate::plan::Plan;
use crate::predicate;
use crate::span::{Role, Span, SpanClass, SpanId};
use crate::tokens::TokenCounter;

/// A span counted and classified, ready to be admitted: everything but its
/// id, position and turn, which the session gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// Who produced it.
    pub role: crate::span::Role,
    /// The content.
    pub text: String,
    /// Its tokens in the session's tokenizer (or the caller's count).
    pub tokens: u32,
    /// Its class and where the class came from.
    pub classification: crate::span::Classification,
    /// For constraints: its predicate.
    pub predicate: Option<crate::span::Predicate>,
    /// The caller's relevance hint.
    pub relevance_hint: Option<f64>,
    /// The caller left the class unspecified: the session's classifier
    /// mode and tuning decide it at admission (and it matters under
    /// CALLER_ONLY).
    pub unclassified: bool,
    /// What the caller attached to it (see [`crate::span::Attributes`]).
    pub attributes: Option<Box<crate::span::Attributes>>,
}

impl Incoming {
    /// Decides the class of an unlabelled user or system span under the
    /// session's classifier mode and tuning, deriving a predicate when it
    /// becomes a constraint; other spans are unchanged. The one place such
    /// a span is classified: the wire leaves it narrative until here.
    /// [`Session::admit`] settles every span it is given; settling one
    /// again decides the same.
    pub fn settle(mut self, config: &SessionConfig) -> Incoming {
        if !self.unclassified || !matches!(self.role, Role::User | Role::System) {
            return self;
        }
        let tuning = &config.classifier_tuning;
        let decided = match config.classifier {
            ClassifierMode::Model => crate::classify::classify_with(self.role, &self.text, tuning),
            ClassifierMode::Rules | ClassifierMode::CallerOnly => {
                crate::classify::by_phrase(&self.text, tuning)
                    .unwrap_or_else(|| crate::classify::classify(self.role, &self.text))
            }
        };
        if decided.class != self.classification.class {
            self.predicate = (decided.class == SpanClass::Constraint)
                .then(|| predicate::derive(&self.text, None));
        }
        self.classification = decided;
        self
    }
}

impl Session {
    /// Admits one turn: gives its spans ids,
    /// positions and the next turn number, decides with
    /// [`admission::decide`], and returns the change that appends the turn
    /// together with the compaction it needed.
    ///
    /// Refusals: [`Rejection::Escalation`] when the turn cannot fit even
    /// after a valid compaction or the plan fails verification (its
    /// `abort` records the ABORTED marker); [`Rejection::ApprovalRequired`]
    /// when a compaction is needed but the session is in APPROVAL mode or
    /// has seen an unclassified span under CALLER_ONLY, with a plan id
    /// that makes room for exactly this turn: commit it, admit the turn
    /// again, and it fits without another compaction.
    pub fn admit(
        &mut self,
        incoming: Vec<Incoming>,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> Result<Change, Rejection> {
        let config = &self.record.config;
        let turn = self.record.turns + 1;
        let unclassified = config.classifier == ClassifierMode::CallerOnly
            && incoming.iter().any(|i| i.unclassified);
        let first_id = self.record.next_span_id;
        let spans: Vec<Span> = incoming
            .into_iter()
            .map(|i| i.settle(config))
            .zip(first_id..)
            .map(|(i, id)| admitted_span(i, id, turn, now_ms))
            .collect();
        let next_span_id = first_id + spans.len() as u64;
        // A turn that fits needs no plan, and so no facts: those of the
        // turns appended since the last compaction stay underived.
        let incoming_tokens = spans.iter().map(|s| u64::from(s.tokens)).sum();
        if !admission::fits(config, self.record.live_tokens, incoming_tokens) {
            self.derive_facts();
        }
        let config = &self.record.config;
        let needs_approval =
            config.mode == SessionMode::Approval || self.record.approval_required || unclassified;
        // The change is made from the verified plan and the kept spans
        // where they stand: no copy of the live context is made. The facts
        // the plan read, checked against the spans, give the change the
        // rows of the live spans.
        let checked: Cell<Option<&LiveFacts>> = Cell::new(None);
        let decision = admission::decide_with(
            &AdmissionInput {
                config,
                live: &self.spans,
                incoming: &spans,
                next_span_id,
                turn,
                now_ms,
            },
            Some((self.record.live_tokens, self.record.pinned_tokens)),
            || {
                checked.set(self.current_facts());
                checked.get()
            },
            counter,
            |plan, post, _verdict| {
                (!needs_approval).then(|| {
                    let rows = checked.get().map(LiveFacts::rows);
                    self.compacted_admission(&plan, post, rows, spans.clone(), unclassified, now_ms)
                })
            },
        );
        match decision {
            Decision::Fits => Ok(self.admission(spans, unclassified, now_ms)),
            Decision::Refuse(refusal) => Err(self.escalation(
                CompactionTrigger::HardBudget,
                refusal.sizes,
                refusal.violations,
                "",
                now_ms,
            )),
            Decision::Compact(Some(change)) => Ok(change),
            Decision::Compact(None) => {
                let sizes = self.sizes(&spans);
                let outcome = self.plan(sizes.incoming, None, now_ms, counter);
                if outcome.verdict.passed() {
                    Err(Rejection::ApprovalRequired {
                        plan_id: outcome.plan_id,
                        sizes,
                    })
                } else {
                    Err(self.escalation(
                        CompactionTrigger::HardBudget,
                        sizes,
                        outcome.verdict.violations,
                        "",
                        now_ms,
                    ))
                }
            }
        }
    }

    /// The change that admits `turn` with the compaction it needed: the
    /// verified `plan` and the live context after it, `post`.
    fn compacted_admission(
        &self,
        plan: &Plan,
        post: &[&Span],
        rows: Option<&[LiveRow]>,
        turn: Vec<Span>,
        unclassified: bool,
        now_ms: u64,
    ) -> Change {
        let detail = format!(
            "evicted {} spans, compressed {} constraints ({} -> {} live tokens) to admit {} tokens",
            plan.evicted.len(),
            plan.compressed.len(),
            plan.tokens_before,
            plan.tokens_after,
            plan.incoming_tokens
        );
        let mut change = self.compaction(
            plan,
            post,
            Committing {
                trigger: CompactionTrigger::HardBudget,
                actor: "",
                detail,
                turn: Some(turn),
                rows,
            },
            now_ms,
        );
        change.record.approval_required |= unclassified;
        change
    }

    /// The change that admits `turn` as it is. The record's totals grow by
    /// the turn's, so the cost is the turn's size, not the live context's.
    fn admission(&self, turn: Vec<Span>, unclassified: bool, now_ms: u64) -> Change {
        let mut record = self.record.clone();
        Totals::of(&turn).add_to(&mut record);
        debug_assert_eq!(
            (record.live_tokens, record.pinned_tokens),
            {
                let all = Totals::of(self.spans.iter().chain(&turn));
                (all.live_tokens, all.pinned_tokens)
            },
            "the record's totals follow the live context"
        );
        record.revision += 1;
        record.updated_at_ms = now_ms;
        record.turns += 1;
        record.next_span_id += turn.len() as u64;
        record.last_admit_ms = now_ms;
        record.approval_required |= unclassified;
        Change {
            expected_revision: self.record.revision,
            record,
            append: turn,
            evict: Vec::new(),
            summary: None,
            replace: Vec::new(),
            marker: None,
        }
    }
}

/// An incoming span as admitted: id and position `id`, turn `turn`,
/// generation 0. A constraint without a predicate gets a derived one
/// (every constraint must be checkable); a caller cannot admit a summary,
/// so a span claiming that class is narrative.
fn admitted_span(incoming: Incoming, id: SpanId, turn: u64, now_ms: u64) -> Span {
    let mut classification = incoming.classification;
    if classification.class == SpanClass::Summary {
        classification.class = SpanClass::Narrative;
    }
    let predicate = if classification.class == SpanClass::Constraint {
        Some(
            incoming
                .predicate
                .unwrap_or_else(|| predicate::derive(&incoming.text, None)),
        )
    } else {
        None
    };
    Span {
        id,
        position: id,
        role: incoming.role,
        classification,
        text: incoming.text,
        tokens: incoming.tokens,
        generation: 0,
        turn,
        predicate,
        summary: None,
        relevance_hint: incoming.relevance_hint,
        admitted_at_ms: now_ms,
        original: None,
        attributes: incoming.attributes,
    }
}
