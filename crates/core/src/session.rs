//! A session's state as the policy sees it: its record (configuration and
//! counters) and, around it, the operations that change it.

use crate::admission::{self, AdmissionInput, Decision};
use crate::config::{AnchorPolicy, ClassifierMode, SessionConfig, SessionMode, TriggerPolicy};
use crate::fasthash::{self, FastMap, FastSet};
use crate::marker::{CompactionTrigger, Marker, Outcome};
use crate::plan::{
    CompressedForm, Eviction, EvictionReason, Plan, Sizes, Verdict, Violation, ViolationKind,
};
use crate::planner::{self, PlanInput, SummaryRoom, SummarySlot};
use crate::predicate;
use crate::relevance;
use crate::span::{
    ClassSource, Classification, Modality, Role, Span, SpanClass, SpanId, SummaryInfo,
};
use crate::tokens::TokenCounter;
use crate::verify::verify_refs;

/// A session's configuration and the counters kept up to date with its
/// live context, so that reading a session never needs a scan of its
/// spans.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// The caller-chosen id, 1 to 128 bytes.
    pub id: String,
    /// The effective configuration.
    pub config: SessionConfig,
    /// When the session was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// When its content or configuration last changed.
    pub updated_at_ms: u64,
    /// Bumped by the caller on every content or configuration change;
    /// writes carry the revision they were planned against, and a stale
    /// one is refused.
    pub revision: u64,
    /// The first span id not yet given out; new spans take ids from here.
    pub next_span_id: u64,
    /// Turns admitted so far.
    pub turns: u64,
    /// The `session_seq` of the session's latest marker.
    pub marker_count: u64,
    /// Committed compactions.
    pub compactions: u64,
    /// Spans moved to the archive so far.
    pub archived_spans: u64,
    /// Tokens in the live context.
    pub live_tokens: u64,
    /// Tokens held by live pinned constraints.
    pub pinned_tokens: u64,
    /// Spans in the live context.
    pub live_spans: u64,
    /// Live pinned constraints.
    pub pinned_spans: u64,
    /// Whether automatic compaction is suspended until a caller approves
    /// one (an unclassified span arrived under `CALLER_ONLY`).
    pub approval_required: bool,
    /// The turn of the latest committed compaction; with `turns` it tells
    /// whether anything was admitted since (no compaction on an idle
    /// session).
    pub last_compaction_turn: u64,
    /// When the latest admission happened; the staleness guard reads it.
    pub last_admit_ms: u64,
    /// When the latest committed compaction happened (0 before the first):
    /// the staleness guard measures its interval from here.
    pub last_compaction_ms: u64,
}

impl SessionRecord {
    /// The record of a session just created at `now_ms`: revision 1, no
    /// spans, no markers.
    pub fn new(id: impl Into<String>, config: SessionConfig, now_ms: u64) -> Self {
        SessionRecord {
            id: id.into(),
            config,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            revision: 1,
            next_span_id: 1,
            turns: 0,
            marker_count: 0,
            compactions: 0,
            archived_spans: 0,
            live_tokens: 0,
            pinned_tokens: 0,
            live_spans: 0,
            pinned_spans: 0,
            approval_required: false,
            last_compaction_turn: 0,
            last_admit_ms: 0,
            last_compaction_ms: 0,
        }
    }
}

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
}

impl Incoming {
    /// Decides the class of an unlabelled user or system span under the
    /// session's classifier mode and tuning, deriving a predicate when it
    /// becomes a constraint; other spans are unchanged. The one place such
    /// a span is classified: the wire leaves it narrative until here.
    fn settle(mut self, config: &SessionConfig) -> Incoming {
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

/// What one operation changes, to be written atomically: the store applies
/// it, and once it is acknowledged the session applies it to itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The revision the change was computed against; the store refuses it
    /// if the session has moved on.
    pub expected_revision: u64,
    /// The record after the change.
    pub record: SessionRecord,
    /// New spans, at their positions.
    pub append: Vec<crate::span::Span>,
    /// Live spans moved to the archive.
    pub evict: Vec<crate::span::SpanId>,
    /// The summary written in their place.
    pub summary: Option<crate::span::Span>,
    /// Live spans rewritten in place (same id and position): compressed,
    /// pinned or unpinned constraints.
    pub replace: Vec<crate::span::Span>,
    /// The marker, with `seq` 0 (the store assigns it). `Aborted` for a
    /// refusal, in which case nothing else changes but the record's marker
    /// count.
    pub marker: Option<crate::marker::Marker>,
}

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

/// Why an operation was not carried out.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// A compaction could not be made valid (escalation, or a caller's
    /// edits failed verification). `abort` records the ABORTED marker and
    /// must be written before answering; nothing else changes.
    Escalation {
        /// Live, incoming, pinned, budget, window.
        sizes: crate::plan::Sizes,
        /// Every violation found.
        violations: Vec<crate::plan::Violation>,
        /// The change that records the ABORTED marker.
        abort: Box<Change>,
    },
    /// The turn needs a compaction but the session requires approval:
    /// nothing is written; the caller reviews the plan and commits it.
    ApprovalRequired {
        /// The plan ready to commit.
        plan_id: PlanId,
        /// The sizes at stake.
        sizes: crate::plan::Sizes,
    },
    /// A plan id for another revision (the session moved on) or another
    /// session.
    StalePlan {
        /// The revision the plan was made against.
        planned: u64,
        /// The session's revision now.
        current: u64,
    },
    /// The span does not exist in the live context.
    SpanNotLive {
        /// The span.
        span_id: crate::span::SpanId,
    },
    /// Unpin of a span that is not a constraint, or pin of a summary.
    WrongClass {
        /// The span.
        span_id: crate::span::SpanId,
        /// What is wrong.
        detail: String,
    },
    /// Nothing to do: the plan evicts and compresses nothing.
    NothingToCommit,
}

/// A session as the policy sees it: its record and its live context, in
/// prompt order.
///
/// Every operation is a pure function of this state (and of the time and
/// token counter it is given) that returns a [`Change`] or a [`Rejection`];
/// nothing changes until [`Session::apply`] adopts a change the store has
/// acknowledged. A session rebuilt with [`Session::new`] from what the
/// store holds behaves exactly like the one that wrote it: nothing lives
/// outside the record and the spans, plans included.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// The configuration and counters.
    pub record: SessionRecord,
    /// The live context, in prompt order.
    pub spans: Vec<Span>,
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

/// The live context's totals, which a record keeps up to date.
struct Totals {
    live_tokens: u64,
    live_spans: u64,
    pinned_tokens: u64,
    pinned_spans: u64,
}

impl Totals {
    fn of<'a>(spans: impl IntoIterator<Item = &'a Span>) -> Totals {
        let mut t = Totals {
            live_tokens: 0,
            live_spans: 0,
            pinned_tokens: 0,
            pinned_spans: 0,
        };
        for s in spans {
            t.live_spans += 1;
            t.live_tokens += u64::from(s.tokens);
            if s.is_pinned() {
                t.pinned_tokens += u64::from(s.tokens);
                t.pinned_spans += 1;
            }
        }
        t
    }

    fn write_to(&self, record: &mut SessionRecord) {
        record.live_tokens = self.live_tokens;
        record.live_spans = self.live_spans;
        record.pinned_tokens = self.pinned_tokens;
        record.pinned_spans = self.pinned_spans;
    }
}

/// What a compaction is committed for, for its record and marker.
struct Committing<'a> {
    trigger: CompactionTrigger,
    actor: &'a str,
    detail: String,
    /// The turn admitted with the compaction, if any.
    turn: Option<Vec<Span>>,
}

/// A count for a marker field, saturating.
fn t32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// For each `wanted` id, the index in `ids` of its first occurrence
/// (`None` when it does not occur): one pass over `ids`, not one per
/// wanted id. A wanted id listed twice has one entry.
fn first_indices(
    wanted: impl ExactSizeIterator<Item = SpanId>,
    ids: impl Iterator<Item = SpanId>,
) -> FastMap<SpanId, Option<usize>> {
    let mut first: FastMap<SpanId, Option<usize>> = fasthash::map(wanted.len());
    first.extend(wanted.map(|id| (id, None)));
    for (i, id) in ids.enumerate() {
        if let Some(slot @ None) = first.get_mut(&id) {
            *slot = Some(i);
        }
    }
    first
}

impl Session {
    /// A session from its stored state.
    pub fn new(record: SessionRecord, spans: Vec<Span>) -> Session {
        Session { record, spans }
    }

    /// A session just created at `now_ms`: revision 1, no spans.
    pub fn create(id: &str, config: SessionConfig, now_ms: u64) -> Session {
        Session {
            record: SessionRecord::new(id, config, now_ms),
            spans: Vec::new(),
        }
    }

    /// Adopts a change once the store has acknowledged it, the way the
    /// store applies it: evicted spans leave, rewritten ones are replaced
    /// in place, the summary stands at its position, the turn is appended.
    /// Costs what the change touches, not the size of the live context,
    /// when nothing is evicted.
    pub fn apply(&mut self, change: &Change) {
        self.record = change.record.clone();
        if !change.evict.is_empty() {
            let mut evicted: FastSet<SpanId> = fasthash::set(change.evict.len());
            evicted.extend(change.evict.iter().copied());
            self.spans.retain(|s| !evicted.contains(&s.id));
        }
        if !change.replace.is_empty() {
            // Each replacement goes to the first live span with its id.
            let first = first_indices(
                change.replace.iter().map(|s| s.id),
                self.spans.iter().map(|s| s.id),
            );
            for span in &change.replace {
                if let Some(&Some(i)) = first.get(&span.id) {
                    self.spans[i] = span.clone();
                }
            }
        }
        if let Some(summary) = &change.summary {
            let at = self
                .spans
                .partition_point(|s| s.position < summary.position);
            self.spans.insert(at, summary.clone());
        }
        self.spans.extend(change.append.iter().cloned());
    }

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
        &self,
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
        let needs_approval =
            config.mode == SessionMode::Approval || self.record.approval_required || unclassified;
        // The change is made from the verified plan and the kept spans
        // where they stand: no copy of the live context is made.
        let decision = admission::decide_with(
            &AdmissionInput {
                config,
                live: &self.spans,
                incoming: &spans,
                next_span_id,
                turn,
                now_ms,
            },
            counter,
            |plan, post, _verdict| {
                (!needs_approval).then(|| {
                    self.compacted_admission(&plan, post, spans.clone(), unclassified, now_ms)
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

    /// A dry run of a manual compaction that leaves room for
    /// `incoming_tokens` and aims at `target_tokens` (default: the soft
    /// watermark; never above the budget), with relevance measured against
    /// the latest turn.
    ///
    /// The plan is a function of the session's state and the arguments
    /// alone — `now_ms` only stamps the summary — so [`Session::commit`]
    /// re-derives it from the plan id and nothing is kept in between.
    pub fn plan(
        &self,
        incoming_tokens: u64,
        target_tokens: Option<u64>,
        now_ms: u64,
        counter: &dyn TokenCounter,
    ) -> PlanOutcome {
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
        let post = planner::apply_refs(&self.spans, &plan, &made);
        let verdict = verify_refs(&self.spans, &plan, &post, incoming_tokens, config, counter);
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
        &self,
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
        let post = planner::apply_refs(&self.spans, &plan, &made);
        plan.tokens_after = post.iter().map(|s| u64::from(s.tokens)).sum();
        let verdict = verify_refs(
            &self.spans,
            &plan,
            &post,
            plan_id.incoming_tokens,
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
            },
            now_ms,
        ))
    }

    /// Pins a live span: it becomes a constraint (class source CALLER)
    /// with a predicate made of the caller's modality and terms where
    /// given and derived from its text otherwise. Re-pinning a constraint
    /// replaces its predicate.
    ///
    /// A span standing in a compressed form keeps that form only if the
    /// form satisfies the new predicate; otherwise its original form is
    /// restored, which is refused as [`Rejection::WrongClass`] when the
    /// original does not fit the budget. Summaries cannot be pinned: they
    /// are the broker's account of evicted spans, not the caller's words.
    pub fn pin(
        &self,
        span_id: SpanId,
        modality: Option<Modality>,
        required_terms: Vec<String>,
        now_ms: u64,
    ) -> Result<Change, Rejection> {
        let at = self.live_index(span_id)?;
        let span = &self.spans[at];
        if span.class() == SpanClass::Summary {
            return Err(Rejection::WrongClass {
                span_id,
                detail: format!(
                    "span {span_id} is a summary written by compaction; pin the spans it stands for instead"
                ),
            });
        }
        let admitted_text = span
            .original
            .as_ref()
            .map_or(span.text.as_str(), |o| o.text.as_str());
        let predicate = predicate::with_caller_parts(admitted_text, modality, required_terms);
        let mut pinned = span.clone();
        pinned.classification = Classification {
            class: SpanClass::Constraint,
            source: ClassSource::Caller,
            rule: String::new(),
        };
        if let Some(original) = &span.original
            && predicate::check(&span.text, span.tokens, original.tokens, &predicate).is_err()
        {
            let live: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
            let restored = live - u64::from(span.tokens) + u64::from(original.tokens);
            let budget = u64::from(self.record.config.budget_tokens());
            if restored > budget {
                return Err(Rejection::WrongClass {
                    span_id,
                    detail: format!(
                        "span {span_id} stands compressed in a form that does not satisfy the new predicate, and its original form ({} tokens) would bring the live context to {restored} tokens, over the budget {budget}",
                        original.tokens
                    ),
                });
            }
            pinned.text = original.text.clone();
            pinned.tokens = original.tokens;
            pinned.original = None;
        }
        pinned.predicate = Some(predicate);
        let record = self.content_record(self.with_span(at, &pinned), now_ms);
        Ok(self.in_place(record, vec![pinned], None))
    }

    /// Releases a constraint: it becomes narrative (class source CALLER),
    /// its predicate is dropped, and it is evictable from now on. The
    /// release is recorded in an UNPIN marker naming who and why.
    ///
    /// A constraint standing compressed gets its original form back when
    /// that fits the budget; otherwise it keeps the compressed text, with
    /// the original still recorded alongside (so the archive holds it when
    /// the span is evicted).
    pub fn unpin(
        &self,
        span_id: SpanId,
        actor: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<Change, Rejection> {
        let at = self.live_index(span_id)?;
        let span = &self.spans[at];
        if !span.is_pinned() {
            return Err(Rejection::WrongClass {
                span_id,
                detail: format!(
                    "span {span_id} is not a constraint; only constraints are unpinned"
                ),
            });
        }
        let live: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
        let budget = u64::from(self.record.config.budget_tokens());
        let mut released = span.clone();
        released.classification = Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Caller,
            rule: String::new(),
        };
        released.predicate = None;
        if let Some(original) = &span.original
            && live - u64::from(span.tokens) + u64::from(original.tokens) <= budget
        {
            released.text = original.text.clone();
            released.tokens = original.tokens;
            released.original = None;
        }
        let after = Totals::of(self.with_span(at, &released));
        let mut record = self.content_record(self.with_span(at, &released), now_ms);
        record.marker_count += 1;
        let marker = Marker {
            tokens_after: t32(after.live_tokens),
            pinned_tokens: t32(after.pinned_tokens),
            pinned_retained: t32(after.pinned_spans),
            pinned_total: t32(after.pinned_spans),
            detail: format!("span {span_id} unpinned: {reason}"),
            ..self.marker(
                &record,
                CompactionTrigger::Unpin,
                Outcome::Committed,
                actor,
                now_ms,
            )
        };
        Ok(self.in_place(record, vec![released], Some(marker)))
    }

    /// Background pre-compaction (trigger SOFT_WATERMARK): when live is above the soft watermark, plans down to
    /// [`SessionConfig::soft_target_tokens`] with no incoming turn, so that
    /// the next admissions find room already made.
    ///
    /// `None` unless the session compacts on its own (mode AUTO, no
    /// approval pending) and admitted something since its last compaction
    /// — an idle session is never compacted — and unless the verified plan
    /// makes the context smaller.
    pub fn soft_compaction(&self, now_ms: u64, counter: &dyn TokenCounter) -> Option<Change> {
        if !self.compacts_on_its_own() {
            return None;
        }
        let config = &self.record.config;
        let live: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
        if live <= u64::from(config.soft_watermark_tokens()) {
            return None;
        }
        let query = self.latest_query();
        let plan = planner::plan(
            &PlanInput {
                config,
                live: &self.spans,
                incoming_tokens: 0,
                query: &query,
                turn: self.record.turns,
                next_span_id: self.record.next_span_id,
                now_ms,
                target_tokens: Some(u64::from(config.soft_target_tokens())),
            },
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

    /// Whether the staleness guard is due (HYBRID and TIME_BASED): the
    /// session compacts on its own, admitted something since its last
    /// compaction, and one staleness interval has passed since that
    /// compaction (or since its creation). An idle session is never due,
    /// however long it sits.
    pub fn staleness_due(&self, now_ms: u64) -> bool {
        let config = &self.record.config;
        let interval = config.staleness_interval_ms;
        matches!(
            config.trigger,
            TriggerPolicy::Hybrid | TriggerPolicy::TimeBased
        ) && interval > 0
            && self.compacts_on_its_own()
            && now_ms.saturating_sub(
                self.record
                    .last_compaction_ms
                    .max(self.record.created_at_ms),
            ) >= interval
    }

    /// The staleness compaction (trigger STALENESS), when due: evicts the
    /// original narrative admitted more than one interval before `now_ms`
    /// into one summary. The latest turn, constraints and existing
    /// summaries are never touched, so a cadence cannot make summaries
    /// climb generations. `None` when not due, when nothing is stale, or
    /// when the verified result would not be smaller.
    pub fn staleness_compaction(&self, now_ms: u64, counter: &dyn TokenCounter) -> Option<Change> {
        if !self.staleness_due(now_ms) {
            return None;
        }
        let config = &self.record.config;
        let interval = config.staleness_interval_ms;
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
        let relevance =
            relevance::score(&self.spans, &self.latest_query(), latest, &config.relevance);
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

    /// Each live span's relevance as of the latest turn (the query is that
    /// turn's non-summary text), weighted as the session's configuration
    /// says: what GetContext reports next to every span.
    pub fn relevance(&self) -> Vec<f64> {
        relevance::score(
            &self.spans,
            &self.latest_query(),
            self.record.turns,
            &self.record.config.relevance,
        )
    }

    /// The text of the latest turn's admitted spans: what relevance is
    /// measured against when no turn is incoming.
    fn latest_query(&self) -> String {
        let latest = self.record.turns;
        self.spans
            .iter()
            .filter(|s| s.turn == latest && s.class() != SpanClass::Summary)
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether automatic compaction may run now: the session is in AUTO
    /// mode, no unclassified span has suspended it, and it admitted
    /// something since its last compaction (invariant 7).
    fn compacts_on_its_own(&self) -> bool {
        self.record.config.mode == SessionMode::Auto
            && !self.record.approval_required
            && self.record.turns > self.record.last_compaction_turn
    }

    /// A marker of this session with what every marker records: its
    /// place in the session's sequence and revision (from `record`, the
    /// record it is written with), the budget, who and when, and the live
    /// tokens before; the caller fills in what the operation did.
    fn marker(
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
            actor: actor.to_owned(),
            detail: String::new(),
        }
    }

    /// The spans of the standing-instructions tier that `plan` evicts, in
    /// prompt order.
    fn tier_evicted(&self, plan: &Plan) -> Vec<SpanId> {
        let tier: FastSet<SpanId> = self
            .spans
            .iter()
            .filter(|s| s.is_protected())
            .map(|s| s.id)
            .collect();
        if tier.is_empty() {
            return Vec::new();
        }
        plan.evicted
            .iter()
            .map(|e| e.span_id)
            .filter(|id| tier.contains(id))
            .collect()
    }

    /// A change that rewrites live spans in place (or nothing, for an
    /// ABORTED marker): no span comes or goes.
    fn in_place(
        &self,
        record: SessionRecord,
        replace: Vec<Span>,
        marker: Option<Marker>,
    ) -> Change {
        Change {
            expected_revision: self.record.revision,
            record,
            append: Vec::new(),
            evict: Vec::new(),
            summary: None,
            replace,
            marker,
        }
    }

    /// The live context with the span at `at` standing as `span`.
    fn with_span<'a>(&'a self, at: usize, span: &'a Span) -> impl Iterator<Item = &'a Span> {
        self.spans
            .iter()
            .enumerate()
            .map(move |(i, s)| if i == at { span } else { s })
    }

    fn live_index(&self, span_id: SpanId) -> Result<usize, Rejection> {
        self.spans
            .iter()
            .position(|s| s.id == span_id)
            .ok_or(Rejection::SpanNotLive { span_id })
    }

    /// The plan a plan id stands for.
    fn manual_plan(&self, plan_id: &PlanId, now_ms: u64, counter: &dyn TokenCounter) -> Plan {
        let query = self.latest_query();
        planner::plan(
            &PlanInput {
                config: &self.record.config,
                live: &self.spans,
                incoming_tokens: plan_id.incoming_tokens,
                query: &query,
                turn: self.record.turns,
                next_span_id: self.record.next_span_id,
                now_ms,
                target_tokens: Some(plan_id.target_tokens),
            },
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
                    role: Role::System,
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
                });
            }
        }
        missing
    }

    /// The sizes at stake for a turn of `incoming` spans.
    fn sizes(&self, incoming: &[Span]) -> Sizes {
        let live = Totals::of(&self.spans);
        let turn = Totals::of(incoming);
        let config = &self.record.config;
        Sizes {
            live: live.live_tokens,
            incoming: turn.live_tokens,
            pinned: live.pinned_tokens + turn.pinned_tokens,
            budget: u64::from(config.budget_tokens()),
            window: u64::from(config.window_tokens),
        }
    }

    /// The record after a change of content or configuration: counters
    /// recomputed from the live context after it, revision bumped.
    fn content_record<'a>(
        &self,
        spans_after: impl IntoIterator<Item = &'a Span>,
        now_ms: u64,
    ) -> SessionRecord {
        let mut record = self.record.clone();
        Totals::of(spans_after).write_to(&mut record);
        record.revision += 1;
        record.updated_at_ms = now_ms;
        record
    }

    /// The change that admits `turn` with the compaction it needed: the
    /// verified `plan` and the live context after it, `post`.
    fn compacted_admission(
        &self,
        plan: &Plan,
        post: &[&Span],
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
            },
            now_ms,
        );
        change.record.approval_required |= unclassified;
        change
    }

    /// The change that admits `turn` as it is.
    fn admission(&self, turn: Vec<Span>, unclassified: bool, now_ms: u64) -> Change {
        let mut record = self.content_record(self.spans.iter().chain(&turn), now_ms);
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
        let post = planner::apply_refs(&self.spans, &plan, &made);
        if !verify_refs(&self.spans, &plan, &post, 0, &self.record.config, counter).passed() {
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
            },
            now_ms,
        ))
    }

    /// The change that commits a verified plan (and appends the turn it
    /// made room for, if any), with its marker.
    fn compaction(
        &self,
        plan: &Plan,
        post: &[&Span],
        committing: Committing<'_>,
        now_ms: u64,
    ) -> Change {
        let compacted = Totals::of(post.iter().copied());
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
        let mut record = self.content_record(post.iter().copied().chain(&turn), now_ms);
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
        let pinned_total = self.spans.iter().filter(|s| s.is_pinned()).count() as u64;
        let marker = Marker {
            tokens_after: t32(compacted.live_tokens),
            incoming_tokens: t32(plan.incoming_tokens),
            pinned_tokens: t32(compacted.pinned_tokens),
            evicted: plan.evicted.iter().map(|e| e.span_id).collect(),
            tier_evicted: self.tier_evicted(plan),
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
    fn escalation(
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
    }
}
