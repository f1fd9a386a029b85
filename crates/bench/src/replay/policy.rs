//! The policies a trace is replayed through, and the measurements they
//! share (one [`Recorder`], so every column is measured the same way for
//! all of them).

use std::collections::HashMap;

use ctxbroker_core::classify::classify;
use ctxbroker_core::config::SessionConfig;
use ctxbroker_core::marker::Outcome;
use ctxbroker_core::planner::{self, PlanInput, SummaryRoom, SummarySlot, write_summary};
use ctxbroker_core::predicate::{self, contains_term, expresses};
use ctxbroker_core::session::{Change, Incoming, Rejection, Session};
use ctxbroker_core::span::{ClassSource, Classification, Role, Span, SpanClass, SpanId};
use ctxbroker_core::tokens::TokenCounter;

use super::trace::{Constraint, Hold, Trace, Turn, TurnKind};
use super::{Event, Point, PolicyKind, Stats};

/// The cadence of policy (a).
pub(crate) const CADENCE_MS: u64 = 90_000;
/// The share of live tokens policy (a) summarises at each tick, in tenths.
pub(crate) const CADENCE_TENTHS: u64 = 6;

/// Replays `trace` through one policy and measures it.
pub(crate) fn replay(
    kind: PolicyKind,
    trace: &Trace,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
    session: usize,
) -> (Stats, Vec<Point>) {
    let mut rec = Recorder::new(trace, config.window_tokens);
    let spans = match kind {
        PolicyKind::Cadence => cadence(trace, &baseline_config(config), counter, &mut rec),
        PolicyKind::Relevance => relevance(trace, &baseline_config(config), counter, &mut rec),
        PolicyKind::Broker => broker(trace, config, counter, &mut rec, session, Labels::Caller),
        PolicyKind::Unlabelled => broker(
            trace,
            config,
            counter,
            &mut rec,
            session,
            Labels::Unspecified,
        ),
    };
    rec.finish(&spans);
    (rec.stats, rec.points)
}

/// The baselines' configuration: the session's, with no cap on summary
/// generations (neither baseline has one; the cap is part of ctxbroker's
/// policy, not of the summariser).
fn baseline_config(config: &SessionConfig) -> SessionConfig {
    SessionConfig {
        max_summary_generations: u32::MAX,
        ..config.clone()
    }
}

/// A turn as a baseline admits it: narrative whatever it says, since
/// neither baseline tells constraints from narrative.
fn narrative(id: SpanId, turn_no: u64, turn: &Turn) -> Span {
    Span {
        id,
        position: id,
        role: turn.role,
        classification: Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Caller,
            rule: String::new(),
        },
        text: turn.text.clone(),
        tokens: turn.tokens,
        generation: 0,
        turn: turn_no,
        predicate: None,
        summary: None,
        relevance_hint: None,
        admitted_at_ms: turn.at_ms,
        original: None,
        attributes: None,
    }
}

fn total(spans: &[Span]) -> u64 {
    spans.iter().map(|s| u64::from(s.tokens)).sum()
}

/// (a) The seed's baseline: every 90 s of simulated time, whether or not
/// anything was admitted since, the oldest 60% of live tokens become one
/// summary; nothing is pinned; a turn that does not fit in W is lost.
fn cadence(
    trace: &Trace,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
    rec: &mut Recorder<'_>,
) -> Vec<Span> {
    let window = u64::from(config.window_tokens);
    let mut spans: Vec<Span> = Vec::new();
    let mut live = 0u64;
    let mut next_id: SpanId = 1;
    let mut admitted = 0u64;
    let mut next_tick = CADENCE_MS;
    for (i, turn) in trace.turns.iter().enumerate() {
        while next_tick <= turn.at_ms {
            let slot = SummarySlot {
                id: next_id,
                turn: admitted,
                now_ms: next_tick,
            };
            if let Some(generation) = tick(&mut spans, &mut next_id, slot, config, counter) {
                live = total(&spans);
                rec.compacted(next_tick, live, generation);
                rec.check_constraints(&spans, i);
            }
            next_tick += CADENCE_MS;
        }
        rec.arrive();
        let demand = live + u64::from(turn.tokens);
        if demand > window {
            rec.lost(turn.at_ms, live, demand);
            continue;
        }
        admitted += 1;
        spans.push(narrative(next_id, admitted, turn));
        next_id += 1;
        live = demand;
        rec.admitted(turn.at_ms, live, demand);
    }
    spans
}

/// One tick of (a): the shortest prefix (in prompt order) holding at
/// least 60% of live tokens, replaced by one summary written by core's
/// summariser within the session's summary cap, with prose up to a quarter
/// of what it replaces (the rule of core's staleness compaction). Returns
/// the summary's generation, or `None` when nothing is live.
fn tick(
    spans: &mut Vec<Span>,
    next_id: &mut SpanId,
    slot: SummarySlot,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Option<u32> {
    if spans.is_empty() {
        return None;
    }
    let goal = (total(spans) * CADENCE_TENTHS).div_ceil(10);
    let mut k = 0;
    let mut taken = 0u64;
    while k < spans.len() && (taken < goal || k == 0) {
        taken += u64::from(spans[k].tokens);
        k += 1;
    }
    let cap = u64::from(config.effective_summary_max_tokens());
    let written = {
        let evicted: Vec<&Span> = spans[..k].iter().collect();
        write_summary(
            &evicted,
            SummaryRoom {
                tokens: cap,
                prose_tokens: cap.min(taken / 4 + planner::SUMMARY_HEADER_RESERVE),
            },
            config,
            slot,
            counter,
        )
    };
    let rest = spans.split_off(k);
    let generation = written.span.as_ref().map_or(0, |s| s.generation);
    if written.span.is_some() {
        *next_id += 1;
    }
    *spans = written.span.into_iter().chain(rest).collect();
    Some(generation)
}

/// (b) Relevance-only eviction: at admission, when the turn would take
/// live over the budget, core's planner evicts the least relevant spans
/// (core's relevance scoring against the incoming turn) and summarises
/// them with core's summariser — but every span is narrative, so nothing
/// is pinned, and no verifier, generation cap or background
/// pre-compaction stands behind it. A turn that does not fit in W even
/// then is lost.
fn relevance(
    trace: &Trace,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
    rec: &mut Recorder<'_>,
) -> Vec<Span> {
    let window = u64::from(config.window_tokens);
    let budget = u64::from(config.budget_tokens());
    let mut spans: Vec<Span> = Vec::new();
    let mut live = 0u64;
    let mut next_id: SpanId = 1;
    let mut admitted = 0u64;
    for (i, turn) in trace.turns.iter().enumerate() {
        rec.arrive();
        let tokens = u64::from(turn.tokens);
        let demand = live + tokens;
        let id = next_id;
        let turn_no = admitted + 1;
        let mut compacted = false;
        if demand > budget {
            let plan = planner::plan(
                &PlanInput {
                    config,
                    live: &spans,
                    incoming_tokens: tokens,
                    query: &turn.text,
                    turn: turn_no,
                    next_span_id: id + 1,
                    now_ms: turn.at_ms,
                    target_tokens: None,
                    held_tool_calls: &[],
                },
                counter,
            );
            let post = planner::apply(&spans, &plan);
            let after = total(&post);
            if after + tokens > window {
                rec.lost(turn.at_ms, live, demand);
                continue;
            }
            if !plan.evicted.is_empty() {
                if plan.summary.is_some() {
                    next_id += 1;
                }
                let generation = plan.summary.as_ref().map_or(0, |s| s.generation);
                spans = post;
                live = after;
                rec.compacted(turn.at_ms, live, generation);
                compacted = true;
            }
        }
        admitted = turn_no;
        spans.push(narrative(id, turn_no, turn));
        next_id += 1;
        live += tokens;
        rec.admitted(turn.at_ms, live, demand);
        if compacted {
            rec.check_constraints(&spans, i + 1);
        }
    }
    spans
}

/// How the driver of ctxbroker's session labels a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Labels {
    /// As a caller that classifies every turn by the rules and sends the
    /// class (SPAN_CLASS_CONSTRAINT with a derived predicate, or
    /// SPAN_CLASS_NARRATIVE): the session keeps it.
    Caller,
    /// As a caller that sends SPAN_CLASS_UNSPECIFIED: what the daemon
    /// passes to the session for such a span, so that the session's
    /// classifier mode decides a user or system turn at admission.
    Unspecified,
}

/// A turn as the daemon hands it to the session under `labels`.
fn incoming(turn: &Turn, labels: Labels) -> Incoming {
    let (classification, unclassified) = match (labels, turn.role) {
        (Labels::Caller, _) => (classify(turn.role, &turn.text), false),
        // The daemon leaves an unlabelled user or system span narrative
        // for the session to settle; tool and assistant output is
        // narrative by role.
        (Labels::Unspecified, Role::User | Role::System) => (
            Classification {
                class: SpanClass::Narrative,
                source: ClassSource::Rules,
                rule: String::new(),
            },
            true,
        ),
        (Labels::Unspecified, Role::Tool | Role::Assistant) => {
            (classify(turn.role, &turn.text), true)
        }
    };
    let pinned = classification.class == SpanClass::Constraint;
    Incoming {
        role: turn.role,
        text: turn.text.clone(),
        tokens: turn.tokens,
        predicate: pinned.then(|| predicate::derive(&turn.text, None)),
        classification,
        relevance_hint: None,
        unclassified,
        attributes: None,
    }
}

/// (c) and (d) ctxbroker: core's `Session`, driven the way the daemon
/// drives it. Each turn is labelled as `labels` says (the rules' class
/// given by the caller for (c), no class for (d)), and
/// `Session::admit` compacts at admission by the token budget with class
/// pinning and verification. The class the session gave each admitted
/// turn is recorded. When live ends above the soft watermark, the
/// background pre-compaction the daemon queues runs right after, at the
/// same simulated time. A refused turn is lost.
///
/// Every 90 s of simulated time (the cadence of (a)) the session is also
/// offered its background work, as a daemon's sweep could offer it at any
/// moment: the soft-watermark pre-compaction and the staleness guard. Both
/// must decline on a session that admitted nothing since its last
/// compaction (invariant 7), and the pre-compaction after an admission
/// that compacted is asked without checking that first, so the idle
/// column tests the session's own rule, not this driver's.
fn broker(
    trace: &Trace,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
    rec: &mut Recorder<'_>,
    session: usize,
    labels: Labels,
) -> Vec<Span> {
    rec.classifies();
    let mut s = Session::create(&format!("replay-{session}"), config.clone(), 0);
    let soft = u64::from(config.soft_watermark_tokens());
    let mut next_sweep = CADENCE_MS;
    for (i, turn) in trace.turns.iter().enumerate() {
        while next_sweep <= turn.at_ms {
            if background(&mut s, next_sweep, counter, rec) {
                rec.check_constraints(&s.spans, i);
            }
            next_sweep += CADENCE_MS;
        }
        rec.arrive();
        let id = s.record.next_span_id;
        let live = s.record.live_tokens;
        let demand = live + u64::from(turn.tokens);
        match s.admit(vec![incoming(turn, labels)], turn.at_ms, counter) {
            Ok(change) => {
                if let Some(span) = change.append.iter().find(|span| span.id == id) {
                    rec.classified(i, span.class());
                }
                let compaction = change
                    .marker
                    .as_ref()
                    .filter(|m| m.outcome == Outcome::Committed)
                    .map(|m| (u64::from(m.tokens_after), m.summary_generation));
                s.apply(&change);
                if let Some((after, generation)) = compaction {
                    rec.compacted(turn.at_ms, after, generation);
                }
                rec.admitted(turn.at_ms, s.record.live_tokens, demand);
                let mut checked = compaction.is_some();
                if s.record.live_tokens > soft
                    && let Some(change) = s.soft_compaction(turn.at_ms, counter)
                {
                    commit_background(&mut s, &change, turn.at_ms, rec);
                    checked = true;
                }
                if checked {
                    rec.check_constraints(&s.spans, i + 1);
                }
            }
            Err(Rejection::Escalation { abort, .. }) => {
                // The ABORTED marker is written; nothing else changes.
                s.apply(&abort);
                rec.lost(turn.at_ms, live, demand);
            }
            Err(_) => rec.lost(turn.at_ms, live, demand),
        }
    }
    s.spans
}

/// Offers the session its background work at `now_ms`; true when it
/// compacted.
fn background(
    s: &mut Session,
    now_ms: u64,
    counter: &dyn TokenCounter,
    rec: &mut Recorder<'_>,
) -> bool {
    let change = s
        .soft_compaction(now_ms, counter)
        .or_else(|| s.staleness_compaction(now_ms, counter));
    match change {
        Some(change) => {
            commit_background(s, &change, now_ms, rec);
            true
        }
        None => false,
    }
}

fn commit_background(s: &mut Session, change: &Change, now_ms: u64, rec: &mut Recorder<'_>) {
    let generation = change.marker.as_ref().map_or(0, |m| m.summary_generation);
    s.apply(change);
    rec.compacted(now_ms, s.record.live_tokens, generation);
}

/// What every policy's replay is measured with.
#[derive(Debug)]
pub(crate) struct Recorder<'a> {
    trace: &'a Trace,
    stats: Stats,
    points: Vec<Point>,
    /// A turn arrived since the previous compaction (or the start).
    arrived: bool,
    /// Per constraint: found missing at some check.
    missing: Vec<bool>,
    /// Per live span (id, text length): the constraints it holds. A span's
    /// text never changes under the same id and length.
    held: HashMap<(SpanId, usize), Bits>,
}

impl<'a> Recorder<'a> {
    fn new(trace: &'a Trace, window: u32) -> Recorder<'a> {
        Recorder {
            trace,
            stats: Stats {
                window: u64::from(window),
                constraints: trace.constraints.len() as u64,
                anchors: trace.anchors.len() as u64,
                ..Stats::default()
            },
            points: Vec::new(),
            arrived: false,
            missing: vec![false; trace.constraints.len()],
            held: HashMap::new(),
        }
    }

    fn arrive(&mut self) {
        self.arrived = true;
        self.stats.turns += 1;
    }

    /// The policy classifies what it admits: its classes are measured.
    fn classifies(&mut self) {
        self.stats.classifies = true;
        self.stats.distractors = self.trace.distractors.len() as u64;
        self.stats.tasks = self
            .trace
            .turns
            .iter()
            .filter(|t| t.kind == TurnKind::Task)
            .count() as u64;
    }

    /// Turn `turn` was admitted with class `class`. A constraint is kept
    /// when pinned or put in the standing-instructions tier; a distractor
    /// or a task so classified is a false pin.
    fn classified(&mut self, turn: usize, class: SpanClass) {
        let kept = matches!(class, SpanClass::Constraint | SpanClass::Protected);
        let Some(t) = self.trace.turns.get(turn) else {
            return;
        };
        match t.kind {
            TurnKind::Constraint(k) => {
                if kept {
                    self.stats.constraints_kept += 1;
                } else if let Some(source) = self
                    .trace
                    .constraints
                    .get(k)
                    .and_then(|c| c.source.as_ref())
                {
                    self.stats
                        .not_kept
                        .push((source.category.clone(), source.id.clone()));
                }
            }
            TurnKind::Distractor(k) if kept => {
                self.stats.false_pins += 1;
                if let Some(source) = self.trace.distractors.get(k) {
                    self.stats
                        .false_pinned
                        .push((source.category.clone(), source.id.clone()));
                }
            }
            TurnKind::Task if kept => self.stats.task_pins += 1,
            _ => {}
        }
    }

    fn point(&mut self, t_ms: u64, live: u64, demand: u64, event: Event, generation: u32) {
        self.stats.peak_live = self.stats.peak_live.max(live);
        self.points.push(Point {
            t_ms,
            live,
            demand,
            event,
            generation,
        });
    }

    fn admitted(&mut self, t_ms: u64, live: u64, demand: u64) {
        self.point(t_ms, live, demand, Event::Admit, 0);
    }

    fn lost(&mut self, t_ms: u64, live: u64, demand: u64) {
        self.stats.turns_lost += 1;
        self.point(t_ms, live, demand, Event::Lost, 0);
    }

    /// A committed compaction leaving `live` tokens. It is idle when no
    /// turn arrived since the previous one.
    fn compacted(&mut self, t_ms: u64, live: u64, generation: u32) {
        self.stats.compactions += 1;
        let event = if self.arrived {
            Event::Compact
        } else {
            self.stats.idle_compactions += 1;
            Event::CompactIdle
        };
        self.arrived = false;
        self.stats.max_generation = self.stats.max_generation.max(generation);
        self.point(t_ms, live, live, event, generation);
    }

    /// Marks missing every constraint stated before turn `stated` that no
    /// span of `spans` holds. Live text only changes by compaction (an
    /// admission only appends, and no other turn holds a constraint), so
    /// checking after every compaction and at the end sees every loss.
    fn check_constraints(&mut self, spans: &[Span], stated: usize) {
        let constraints = &self.trace.constraints;
        let mut pending = Bits::with_len(constraints.len());
        for (k, c) in constraints.iter().enumerate() {
            if c.turn < stated && !self.missing[k] {
                pending.insert(k);
            }
        }
        if pending.is_empty() {
            return;
        }
        let mut held = Bits::with_len(constraints.len());
        for span in spans {
            held.union(
                self.held
                    .entry((span.id, span.text.len()))
                    .or_insert_with(|| held_mask(&span.text, constraints)),
            );
            if held.covers(&pending) {
                return;
            }
        }
        for (k, missing) in self.missing.iter_mut().enumerate() {
            if pending.contains(k) && !held.contains(k) {
                *missing = true;
            }
        }
    }

    /// The end of the session: the last constraint check, and the anchors.
    fn finish(&mut self, spans: &[Span]) {
        self.check_constraints(spans, usize::MAX);
        self.stats.constraints_lost = self.missing.iter().filter(|m| **m).count() as u64;
        for (c, missing) in self.trace.constraints.iter().zip(&self.missing) {
            if let (true, Some(source)) = (*missing, &c.source) {
                self.stats
                    .lost
                    .push((source.category.clone(), source.id.clone()));
            }
        }
        self.stats.anchors_lost = self
            .trace
            .anchors
            .iter()
            .filter(|a| !spans.iter().any(|s| s.text.contains(a.as_str())))
            .count() as u64;
    }
}

/// A set of constraint indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bits(Vec<u64>);

impl Bits {
    /// The empty set of indices below `n`.
    pub(crate) fn with_len(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }

    fn insert(&mut self, k: usize) {
        if let Some(word) = self.0.get_mut(k / 64) {
            *word |= 1 << (k % 64);
        }
    }

    pub(crate) fn contains(&self, k: usize) -> bool {
        self.0.get(k / 64).is_some_and(|w| w & (1 << (k % 64)) != 0)
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    fn union(&mut self, other: &Bits) {
        for (w, o) in self.0.iter_mut().zip(&other.0) {
            *w |= o;
        }
    }

    /// Whether every index of `other` is in this set.
    fn covers(&self, other: &Bits) -> bool {
        self.0.iter().zip(&other.0).all(|(w, o)| w & o == *o)
    }
}

/// The constraints that `text` holds. A constraint held by its terms is
/// held when some unit of the text — a line, or a part of a line between
/// ` | ` (a summary's anchor separator) — contains every required term
/// (core's whole-word, case-insensitive match) and expresses the
/// constraint's modality (core's classifier rules). A constraint held
/// verbatim is held when the text contains the constraint's text as it
/// was stated, byte for byte.
pub(crate) fn held_mask(text: &str, constraints: &[Constraint]) -> Bits {
    let mut lowered: Option<String> = None;
    let mut mask = Bits::with_len(constraints.len());
    for (k, c) in constraints.iter().enumerate() {
        let holds = match &c.hold {
            Hold::Verbatim(stated) => text.contains(stated.as_str()),
            Hold::Terms { modality, terms } => {
                let lowered = lowered.get_or_insert_with(|| text.to_lowercase());
                terms
                    .iter()
                    .all(|t| lowered.contains(t.to_lowercase().as_str()))
                    && text.split('\n').flat_map(|l| l.split(" | ")).any(|unit| {
                        terms.iter().all(|t| contains_term(unit, t)) && expresses(unit, *modality)
                    })
            }
        };
        if holds {
            mask.insert(k);
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::trace::Source;
    use ctxbroker_core::config::TokenizerKind;
    use ctxbroker_core::span::Modality;
    use ctxbroker_core::tokens::counter;

    fn terms(turn: usize, modality: Modality, term: &str) -> Constraint {
        Constraint {
            turn,
            hold: Hold::Terms {
                modality,
                terms: vec![term.into()],
            },
            source: None,
        }
    }

    fn never_prod() -> Vec<Constraint> {
        vec![
            terms(1, Modality::Prohibition, "prod"),
            terms(2, Modality::Restriction, "sqlx"),
        ]
    }

    /// The first 64 indices of a set, as bits.
    fn low(bits: Bits) -> u64 {
        (0..64)
            .filter(|&k| bits.contains(k))
            .fold(0, |m, k| m | (1 << k))
    }

    #[test]
    fn a_unit_holds_a_constraint_only_with_its_terms_and_modality() {
        let c = never_prod();
        assert_eq!(
            low(held_mask(
                "Never write to the `prod` namespace; stage first.",
                &c
            )),
            0b01
        );
        assert_eq!(low(held_mask("Never: write `prod`.", &c)), 0b01);
        assert_eq!(
            low(held_mask(
                "[summary]\n- Use only the `sqlx` client.\n- other",
                &c
            )),
            0b10
        );
        // The term alone, or the modality on another line or across an
        // anchors separator, holds nothing.
        assert_eq!(low(held_mask("anchors: prod | sqlx | never", &c)), 0);
        assert_eq!(low(held_mask("deploy to prod\nnever mind that", &c)), 0);
        assert_eq!(
            low(held_mask("Never write to the production namespace.", &c)),
            0
        );
    }

    fn verbatim(turn: usize, text: &str) -> Constraint {
        Constraint {
            turn,
            hold: Hold::Verbatim(text.into()),
            source: Some(Source {
                id: format!("ho-{turn}"),
                category: "ban_noun_phrase".into(),
            }),
        }
    }

    #[test]
    fn a_verbatim_constraint_is_held_only_by_its_whole_text() {
        let mut c: Vec<Constraint> = (0..70)
            .map(|k| verbatim(k, &format!("rule number {k:02} holds.")))
            .collect();
        c.push(verbatim(70, "No force pushes."));
        let text = "[summary]\n- rule number 03 holds.\n- no force pushes.\nrule number 66 holds.";
        let held = held_mask(text, &c);
        let found: Vec<usize> = (0..c.len()).filter(|&k| held.contains(k)).collect();
        // Case matters, and indices past 64 are tracked.
        assert_eq!(found, vec![3, 66]);
        assert!(held_mask("No force pushes.", &c).contains(70));
        assert!(!held_mask("No force pushes", &c).contains(70));
    }

    fn turn(at_ms: u64, text: &str) -> Turn {
        Turn {
            at_ms,
            role: Role::Tool,
            kind: TurnKind::Tool,
            text: text.to_owned(),
            tokens: counter(TokenizerKind::O200kBase).count(text),
        }
    }

    fn trace(turns: Vec<Turn>) -> Trace {
        Trace {
            turns,
            constraints: Vec::new(),
            distractors: Vec::new(),
            anchors: vec!["src/net/retry.rs".into()],
            burst_episodes: 0,
            burst_outputs: 0,
            idle_gaps: 0,
        }
    }

    #[test]
    fn the_cadence_compacts_while_idle_and_climbs_generations() {
        let text = "$ cat src/net/retry.rs\n    let delay = backoff_cap.min();";
        // Three turns in the first minute, then nothing for ten minutes.
        let t = trace(vec![
            turn(1_000, text),
            turn(2_000, text),
            turn(3_000, text),
            turn(700_000, text),
        ]);
        let config = SessionConfig::with_window(200_000);
        let c = counter(TokenizerKind::O200kBase);
        let (stats, points) = replay(PolicyKind::Cadence, &t, &config, c, 0);
        // Ticks at 90 s, 180 s, ..., 630 s: seven, the first after turns.
        assert_eq!(stats.compactions, 7, "{points:?}");
        assert_eq!(stats.idle_compactions, 6);
        assert_eq!(stats.max_generation, 7);
        assert_eq!(stats.turns_lost, 0);
        assert_eq!(stats.anchors_lost, 0);
        let (broker, _) = replay(PolicyKind::Broker, &t, &config, c, 0);
        assert_eq!(broker.compactions, 0);
        let (relevance, _) = replay(PolicyKind::Relevance, &t, &config, c, 0);
        assert_eq!(relevance.compactions, 0);
    }

    #[test]
    fn a_turn_over_the_window_is_lost_to_the_cadence_only() {
        let c = counter(TokenizerKind::O200kBase);
        let big = "test net::delay::case_0001 ... ok\n".repeat(400);
        let t = trace(vec![turn(1_000, &big), turn(2_000, &big)]);
        let tokens = u64::from(t.turns[0].tokens);
        // W fits one output but not two; the budget still fits one.
        let config = SessionConfig::with_window((tokens * 3 / 2) as u32);
        let (cadence, points) = replay(PolicyKind::Cadence, &t, &config, c, 0);
        assert_eq!(cadence.turns_lost, 1);
        assert_eq!(points[1].event, Event::Lost);
        assert_eq!(points[1].demand, 2 * tokens);
        for kind in [PolicyKind::Relevance, PolicyKind::Broker] {
            let (stats, _) = replay(kind, &t, &config, c, 0);
            assert_eq!(stats.turns_lost, 0, "{kind:?}");
            assert_eq!(stats.compactions, 1, "{kind:?}");
            assert!(stats.peak_live <= u64::from(config.budget_tokens()));
        }
    }

    fn user(at_ms: u64, kind: TurnKind, text: &str) -> Turn {
        Turn {
            role: Role::User,
            kind,
            ..turn(at_ms, text)
        }
    }

    #[test]
    fn unlabelled_turns_are_classified_by_the_session_and_measured() {
        // A standing rule without a modal phrase, a modal rule, a question
        // and a task. The session's own phrases pin the first and the
        // question whatever the model's weights, but only for a span the
        // session classifies.
        let rule = "zero emojis, anywhere. commit msgs, comments, docs, nothing";
        let modal = "Never write to the `prod` namespace; stage every change first.";
        let question = "should we actually use postgres instead?";
        let task = "Please look into the flaky test.";
        let mut t = trace(vec![
            user(1_000, TurnKind::Task, task),
            user(2_000, TurnKind::Constraint(0), rule),
            user(3_000, TurnKind::Constraint(1), modal),
            user(4_000, TurnKind::Distractor(0), question),
        ]);
        t.constraints = vec![verbatim(1, rule), verbatim(2, modal)];
        t.distractors = vec![Source {
            id: "ho-q".into(),
            category: "question".into(),
        }];
        let mut config = SessionConfig::with_window(200_000);
        config.classifier_tuning.pin_phrases = vec!["emojis".into(), "postgres".into()];
        let c = counter(TokenizerKind::O200kBase);
        let measured = |s: &Stats| {
            (
                s.classifies,
                s.distractors,
                s.tasks,
                s.constraints_kept,
                s.false_pins,
                s.task_pins,
            )
        };

        // The caller's classes are the rules': the modal rule is pinned,
        // the rule without a modal phrase is narrative, and the session
        // does not classify again (its phrases do not apply).
        let by_rules =
            |text: &str| u64::from(classify(Role::User, text).class == SpanClass::Constraint);
        assert_eq!((by_rules(rule), by_rules(modal)), (0, 1));
        let (caller, _) = replay(PolicyKind::Broker, &t, &config, c, 0);
        assert_eq!(
            measured(&caller),
            (true, 1, 1, 1, by_rules(question), by_rules(task)),
            "{caller:?}"
        );
        assert_eq!(
            caller.not_kept,
            vec![("ban_noun_phrase".to_owned(), "ho-1".to_owned())]
        );

        // Unlabelled, the session's classifier decides each user turn:
        // the phrases pin the rule and the question; the model decides
        // the modal rule and the task.
        let (unlabelled, _) = replay(PolicyKind::Unlabelled, &t, &config, c, 0);
        let kept = |text: &str| {
            u64::from(matches!(
                ctxbroker_core::classify::classify_with(
                    Role::User,
                    text,
                    &config.classifier_tuning
                )
                .class,
                SpanClass::Constraint | SpanClass::Protected
            ))
        };
        assert_eq!(
            measured(&unlabelled),
            (true, 1, 1, 1 + kept(modal), 1, kept(task)),
            "{unlabelled:?}"
        );
        assert_eq!(
            unlabelled.false_pinned,
            vec![("question".to_owned(), "ho-q".to_owned())]
        );
        // Nothing was compacted, so nothing was lost.
        assert_eq!(unlabelled.constraints_lost, 0);
        // The baselines classify nothing.
        let (cadence, _) = replay(PolicyKind::Cadence, &t, &config, c, 0);
        assert!(!cadence.classifies);
        assert_eq!(cadence.constraints_kept, 0);
    }
}
