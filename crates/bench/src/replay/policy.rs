//! The three policies a trace is replayed through, and the measurements
//! they share (one [`Recorder`], so every column is measured the same way
//! for all three).

use std::collections::HashMap;

use ctxbroker_core::classify::classify;
use ctxbroker_core::config::SessionConfig;
use ctxbroker_core::marker::Outcome;
use ctxbroker_core::planner::{self, PlanInput, SummaryRoom, SummarySlot, write_summary};
use ctxbroker_core::predicate::{self, contains_term, expresses};
use ctxbroker_core::session::{Change, Incoming, Rejection, Session};
use ctxbroker_core::span::{ClassSource, Classification, Span, SpanClass, SpanId};
use ctxbroker_core::tokens::TokenCounter;

use super::trace::{Constraint, Trace, Turn};
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
        PolicyKind::Broker => broker(trace, config, counter, &mut rec, session),
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

/// (c) ctxbroker: core's `Session`, driven the way the daemon drives it.
/// Each turn is classified by the rules (the caller leaves the class
/// unspecified), constraints get derived predicates, and `Session::admit`
/// compacts at admission by the token budget with class pinning and
/// verification. When live ends above the soft watermark, the background
/// pre-compaction the daemon queues runs right after, at the same
/// simulated time. A refused turn is lost.
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
) -> Vec<Span> {
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
        let classification = classify(turn.role, &turn.text);
        let pinned = classification.class == SpanClass::Constraint;
        let incoming = Incoming {
            role: turn.role,
            text: turn.text.clone(),
            tokens: turn.tokens,
            predicate: pinned.then(|| predicate::derive(&turn.text, None)),
            classification,
            relevance_hint: None,
            unclassified: true,
        };
        let live = s.record.live_tokens;
        let demand = live + u64::from(turn.tokens);
        match s.admit(vec![incoming], turn.at_ms, counter) {
            Ok(change) => {
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
    /// Per live span (id, text length): the constraints one of its lines
    /// holds. A span's text never changes under the same id and length.
    held: HashMap<(SpanId, usize), u64>,
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
    /// line of `spans` holds. Live text only changes by compaction (an
    /// admission only appends, and no other text expresses a constraint),
    /// so checking after every compaction and at the end sees every loss.
    fn check_constraints(&mut self, spans: &[Span], stated: usize) {
        let constraints = &self.trace.constraints;
        let mut pending = 0u64;
        for (k, c) in constraints.iter().enumerate().take(64) {
            if c.turn < stated && !self.missing[k] {
                pending |= 1 << k;
            }
        }
        if pending == 0 {
            return;
        }
        let mut held = 0u64;
        for span in spans {
            held |= *self
                .held
                .entry((span.id, span.text.len()))
                .or_insert_with(|| held_mask(&span.text, constraints));
            if held & pending == pending {
                return;
            }
        }
        for (k, missing) in self.missing.iter_mut().enumerate().take(64) {
            if pending & !held & (1 << k) != 0 {
                *missing = true;
            }
        }
    }

    /// The end of the session: the last constraint check, and the anchors.
    fn finish(&mut self, spans: &[Span]) {
        self.check_constraints(spans, usize::MAX);
        self.stats.constraints_lost = self.missing.iter().filter(|m| **m).count() as u64;
        self.stats.anchors_lost = self
            .trace
            .anchors
            .iter()
            .filter(|a| !spans.iter().any(|s| s.text.contains(a.as_str())))
            .count() as u64;
    }
}

/// The constraints (bit k for constraint k) that some unit of `text`
/// holds. A unit is a line, or a part of a line between ` | ` (a
/// summary's anchor separator); it holds a constraint when it contains
/// every required term (core's whole-word, case-insensitive match) and
/// expresses the constraint's modality (core's classifier rules).
pub(crate) fn held_mask(text: &str, constraints: &[Constraint]) -> u64 {
    let lowered = text.to_lowercase();
    let mut mask = 0u64;
    for (k, c) in constraints.iter().enumerate().take(64) {
        if !c
            .terms
            .iter()
            .all(|t| lowered.contains(t.to_lowercase().as_str()))
        {
            continue;
        }
        let holds = text.split('\n').flat_map(|l| l.split(" | ")).any(|unit| {
            c.terms.iter().all(|t| contains_term(unit, t)) && expresses(unit, c.modality)
        });
        if holds {
            mask |= 1 << k;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::replay::trace::TurnKind;
    use ctxbroker_core::config::TokenizerKind;
    use ctxbroker_core::span::{Modality, Role};
    use ctxbroker_core::tokens::counter;

    fn never_prod() -> Vec<Constraint> {
        vec![
            Constraint {
                turn: 1,
                modality: Modality::Prohibition,
                terms: vec!["prod".into()],
            },
            Constraint {
                turn: 2,
                modality: Modality::Restriction,
                terms: vec!["sqlx".into()],
            },
        ]
    }

    #[test]
    fn a_unit_holds_a_constraint_only_with_its_terms_and_modality() {
        let c = never_prod();
        assert_eq!(
            held_mask("Never write to the `prod` namespace; stage first.", &c),
            0b01
        );
        assert_eq!(held_mask("Never: write `prod`.", &c), 0b01);
        assert_eq!(
            held_mask("[summary]\n- Use only the `sqlx` client.\n- other", &c),
            0b10
        );
        // The term alone, or the modality on another line or across an
        // anchors separator, holds nothing.
        assert_eq!(held_mask("anchors: prod | sqlx | never", &c), 0);
        assert_eq!(held_mask("deploy to prod\nnever mind that", &c), 0);
        assert_eq!(held_mask("Never write to the production namespace.", &c), 0);
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
}
