//! The planner: proposes a compaction.
//!
//! Narrative and earlier summaries are evicted first: every span whose
//! relevance is below the session's floor, then more by ascending
//! relevance (weighted as the session's configuration says) until the live
//! context plus the incoming turn fits the target. Everything evicted
//! becomes one summary span where the first evicted span stood. A
//! constraint is never evicted; only when evicting every candidate still
//! leaves no room are constraints compressed. A plan is a proposal: the
//! verifier decides whether it may be committed.
//!
//! # Target and summary room
//!
//! The target is the caller's, or the soft watermark, never above the
//! budget. A summary needs room too, so eviction continues until
//! `kept + incoming + reserve ≤ target`, where the reserve for `E` evicted
//! tokens is `min(summary cap, E/4 + 32)`: a summary gets about a quarter
//! of what it replaces. Its anchors must also fit under the budget:
//! `kept + incoming + min(summary cap, A + 32) ≤ budget`, where `A` is the
//! tokens of the anchors the evicted summaries carry (at most the anchor
//! budget). Those anchors are carried verbatim, so evicting a summary frees
//! its prose only; without this condition a summary could be evicted alone
//! and its anchors dropped for want of room while anchor-free narrative
//! stays live. When the target cannot be reached even by evicting
//! every candidate, the budget is the target instead. The summary's anchors
//! may then use `min(anchor budget, summary cap, budget − kept − incoming)`
//! — dropping an anchor is a loss, exceeding the soft target by a few
//! anchors is not — while its sentences stop at `target − kept − incoming`.
//!
//! # Compression
//!
//! When the live context and the turn exceed the budget and even evicting
//! every candidate does not make room for the turn and the summary's
//! reserve, constraints are compressed with [`crate::predicate::compress`],
//! largest saving first, until they do or none is left. A compressed span
//! keeps its id and position; its text becomes the form, and the form it
//! was admitted in is kept in [`Span::original`] (the first one, when it
//! was compressed before), so every later check compares against what the
//! caller pinned. When that still leaves no room for the turn the plan is
//! over budget and the verifier refuses it: an escalation.
//!
//! # Cost
//!
//! One relevance pass over the live spans (over their text, or, with the
//! session's [`LiveFacts`], over the words each span was found to have
//! when it was admitted) and one that gathers the candidates, a selection
//! and sort of about as many candidates as the plan reads (as many as
//! the deficit needs at their average size, doubling when more are
//! read), a linear scan over their prefix sums, and a summary
//! of the evicted spans whose sentence work is bounded and whose anchors
//! are read from the facts; kept spans are never re-tokenised.
//! Compression, when needed, costs one pass of the compressor over each
//! constraint and one sort.

use crate::config::{SessionConfig, SummaryPresentation};
use crate::exchange::Exchanges;
use crate::facts::{LiveFacts, LiveRow};
use crate::fasthash::{self, FastMap, IdSet};
use crate::plan::{CompressedForm, Eviction, EvictionReason, Plan};
use crate::predicate::{check, compress};
use crate::relevance::{score, score_with};
use crate::span::{
    ClassSource, Classification, OriginalForm, Span, SpanClass, SpanId, SummaryInfo,
};
use crate::summary::{SummaryLimits, summarize_owing};
use crate::text::{OwedAnchors, required_anchors};
use crate::tokens::TokenCounter;

/// Tokens reserved for a summary's header on top of its share of the
/// evicted text.
pub const SUMMARY_HEADER_RESERVE: u64 = 32;

/// What the planner needs to know about one session at one moment.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The session's configuration (budget, floor, relevance weights,
    /// summary limits).
    pub config: &'a SessionConfig,
    /// The live context, in prompt order.
    pub live: &'a [Span],
    /// Tokens of the turn that needs room (0 for a background compaction).
    pub incoming_tokens: u64,
    /// The text relevance is measured against: the incoming turn.
    pub query: &'a str,
    /// The current turn, for recency and for the summary span.
    pub turn: u64,
    /// The id the summary span takes.
    pub next_span_id: SpanId,
    /// The time the summary is admitted at (the core reads no clock).
    pub now_ms: u64,
    /// A live total to aim at instead of the soft watermark; capped at the
    /// budget.
    pub target_tokens: Option<u64>,
    /// The tool call ids of the turn being admitted: the live spans of
    /// those exchanges are kept (see [`crate::exchange`]).
    pub held_tool_calls: &'a [&'a str],
}

/// The tokens a constraint was pinned with: its original form's, when it
/// stands compressed, else its own. Every compressed form is checked
/// against these, so that compressing twice can never lengthen what the
/// caller pinned.
pub fn original_tokens(span: &Span) -> u32 {
    span.original.as_ref().map_or(span.tokens, |o| o.tokens)
}

/// The built-in compressed form of every live constraint that has one
/// strictly shorter than its current text and satisfying its predicate
/// against its original tokens, largest saving first (ties in prompt
/// order).
pub fn compressions(live: &[Span], counter: &dyn TokenCounter) -> Vec<CompressedForm> {
    ranked_compressions(live, counter)
        .into_iter()
        .map(|c| c.form)
        .collect()
}

/// A compressed form with what it saves and where its span stands.
struct Ranked {
    form: CompressedForm,
    saves: u32,
    position: u64,
}

fn ranked_compressions(live: &[Span], counter: &dyn TokenCounter) -> Vec<Ranked> {
    let mut forms: Vec<Ranked> = live
        .iter()
        .filter(|s| s.is_pinned())
        .filter_map(|s| {
            let predicate = s.predicate.as_ref()?;
            let text = compress(&s.text, predicate, counter)?;
            let tokens = counter.count(&text);
            if tokens >= s.tokens || check(&text, tokens, original_tokens(s), predicate).is_err() {
                return None;
            }
            Some(Ranked {
                saves: s.tokens - tokens,
                position: s.position,
                form: CompressedForm {
                    span_id: s.id,
                    text,
                    tokens,
                },
            })
        })
        .collect();
    forms.sort_unstable_by(|a, b| b.saves.cmp(&a.saves).then(a.position.cmp(&b.position)));
    forms
}

/// The least the live constraints can take: their tokens with every
/// built-in compressed form applied. Admission refuses a turn only when it
/// does not fit even next to this.
pub fn compressed_pinned_tokens(live: &[Span], counter: &dyn TokenCounter) -> u64 {
    let pinned: u64 = live
        .iter()
        .filter(|s| s.is_pinned())
        .map(|s| u64::from(s.tokens))
        .sum();
    let saved: u64 = ranked_compressions(live, counter)
        .iter()
        .map(|c| u64::from(c.saves))
        .sum();
    pinned.saturating_sub(saved)
}

/// Proposes a compaction of `input.live` that leaves room for the incoming
/// turn.
pub fn plan(input: &PlanInput<'_>, counter: &dyn TokenCounter) -> Plan {
    plan_with(input, None, counter)
}

/// [`plan`], reading what it needs of each live span from `facts` (the
/// session's, see [`LiveFacts`]) instead of deriving it from the text:
/// the same plan. Facts that do not describe `input.live` are not used.
pub fn plan_with(
    input: &PlanInput<'_>,
    facts: Option<&LiveFacts>,
    counter: &dyn TokenCounter,
) -> Plan {
    let facts = facts.filter(|f| f.describes(input.live));
    plan_described(input, facts, counter)
}

/// [`plan_with`] of `facts` the caller checked: they describe
/// `input.live` (see [`LiveFacts::describes`]).
pub(crate) fn plan_described(
    input: &PlanInput<'_>,
    facts: Option<&LiveFacts>,
    counter: &dyn TokenCounter,
) -> Plan {
    let config = input.config;
    let live = input.live;
    let budget = u64::from(config.budget_tokens());
    let soft = u64::from(config.soft_watermark_tokens());
    let target = input.target_tokens.unwrap_or(soft).min(budget);
    let incoming = input.incoming_tokens;
    let cap = u64::from(config.effective_summary_max_tokens());

    let relevance = match facts {
        Some(f) => score_with(live, f, input.query, input.turn, &config.relevance),
        None => score(live, input.query, input.turn, &config.relevance),
    };
    // What the passes below read of every live span, kept by the session
    // beside the spans or copied here.
    let rows = LiveRow::of_spans(facts, live);
    let rows = &rows[..];
    let floor = config.relevance_floor;
    // Relevance is in [0, 1], so its bits order like its value: order plain
    // integer keys (relevance, position) of narrative and summaries rather
    // than compare floats. The standing-instructions tier, oldest first,
    // goes after every other candidate, except the oldest that its cap
    // obliges to go at once. One pass over the live spans finds both, and
    // their tokens.
    let mut keys: Vec<(u64, u64, usize)> = Vec::with_capacity(live.len());
    let mut tier: Vec<usize> = Vec::new();
    let mut below_floor = 0;
    let mut before: u64 = 0;
    let mut key_tokens: u64 = 0;
    // The spans of a tool exchange go together: each takes the exchange's
    // key (its highest relevance, its first position), so that they stand
    // side by side in the order, and an exchange that may not go is kept.
    let exchanges = Exchanges::of(live, rows, input.held_tool_calls);
    let exchange_key: Vec<(f64, u64)> = exchanges
        .iter()
        .map(|(_, members, _)| {
            let rel = members.iter().map(|&i| relevance[i]).fold(0.0, f64::max);
            let pos = members.iter().map(|&i| rows[i].position).min().unwrap_or(0);
            (rel, pos)
        })
        .collect();
    for (i, s) in rows.iter().enumerate() {
        before += u64::from(s.tokens);
        // A span of an exchange that may not go is kept, whatever its
        // class (such an exchange holds a span that is not narrative).
        if s.is_pinned() || !exchanges.may_evict(i) {
            continue;
        }
        if s.is_protected() {
            tier.push(i);
        } else {
            let (rel, pos) = match exchanges.group(i) {
                Some(g) => exchange_key[g],
                None => (relevance[i], s.position),
            };
            keys.push((rel.to_bits(), pos, i));
            below_floor += usize::from(rel < floor);
            key_tokens += u64::from(s.tokens);
        }
    }
    let over_cap = tier_overflow(rows, &tier, protected_cap_tokens(config));
    // About how many keys the plan will read: those that free what the
    // live context and the turn exceed the target by, at the keys'
    // average size, and a quarter more. Sorting that many at once spares
    // selecting again from all the keys each time the prefix doubles; the
    // order read is the same whatever is sorted ahead.
    let deficit = before.saturating_add(incoming).saturating_sub(target);
    let likely = match u64::try_from(keys.len()) {
        Ok(n) if n > 0 && key_tokens > 0 && deficit > 0 => {
            let average = (key_tokens / n).max(1);
            let wanted = (deficit / average).saturating_add(deficit / average / 4 + 1);
            usize::try_from(wanted).unwrap_or(usize::MAX)
        }
        _ => 0,
    };
    let mut order = Order::new(keys, tier, below_floor, over_cap);
    order.sort_to(likely);
    let candidates = order.len();
    let mandatory = below_floor + over_cap;
    let reason_at = |k: usize| {
        if k < below_floor {
            EvictionReason::BelowFloor
        } else if k < mandatory {
            EvictionReason::TierFull
        } else {
            EvictionReason::Budget
        }
    };

    let reserve = |evicted: u64| {
        if evicted == 0 {
            0
        } else {
            cap.min(evicted / 4 + SUMMARY_HEADER_RESERVE)
        }
    };
    // prefix[k] = tokens of the first k candidates; carried[k] = tokens
    // of the anchors the summaries among them oblige the next summary to
    // carry. Both grow only as far as the search for a fit reads them.
    let mut prefix = vec![0u64];
    let mut carried = vec![0u64];
    let mut extend_to = |k: usize, order: &mut Order| {
        while prefix.len() <= k {
            let i = order.get(prefix.len() - 1);
            let last = prefix.last().copied().unwrap_or(0);
            prefix.push(last + u64::from(rows[i].tokens));
            let last = carried.last().copied().unwrap_or(0);
            let anchors = if rows[i].summarises {
                carried_anchor_tokens(&live[i], counter)
            } else {
                0
            };
            carried.push(last + anchors);
        }
        (prefix[k], carried[k])
    };
    // The least room the summary of the first k candidates needs under
    // the budget: the anchors it must carry, as far as the anchor budget
    // and the summary cap let it carry them.
    let anchor_cap = u64::from(config.effective_anchor_budget_tokens());
    let anchor_room = |evicted: u64, carried: u64| {
        if evicted == 0 {
            0
        } else {
            cap.min(carried.min(anchor_cap) + SUMMARY_HEADER_RESERVE)
        }
    };
    let mut first_fit = |goal: u64, order: &mut Order| {
        (mandatory..=candidates).find(|&k| {
            let (evicted, carried) = extend_to(k, order);
            let kept = before - evicted;
            let needed = kept.saturating_add(incoming);
            needed.saturating_add(reserve(evicted)) <= goal
                && needed.saturating_add(anchor_room(evicted, carried)) <= budget
        })
    };
    let (mut count, goal, exhausted) = match first_fit(target, &mut order) {
        Some(k) => (k, target, false),
        None => match first_fit(budget, &mut order) {
            Some(k) => (k, budget, false),
            None => (candidates, budget, true),
        },
    };
    // An exchange the fit would cut goes whole: its spans are next in the
    // order, and evicting more only leaves more room.
    if !exchanges.is_empty() {
        while count > 0 && count < candidates {
            let last = exchanges.group(order.get(count - 1));
            if last.is_none() || last != exchanges.group(order.get(count)) {
                break;
            }
            count += 1;
        }
    }
    let evicted_tokens = extend_to(count, &mut order).0;

    let mut chosen: Vec<(usize, EvictionReason)> =
        (0..count).map(|k| (order.get(k), reason_at(k))).collect();
    chosen.sort_unstable_by_key(|&(i, _)| rows[i].position);
    let mut kept = before - evicted_tokens;

    let mut compressed = Vec::new();
    if exhausted && before.saturating_add(incoming) > budget {
        let room_needed = incoming.saturating_add(reserve(evicted_tokens));
        let mut ranked = Vec::new();
        for c in ranked_compressions(live, counter) {
            if kept.saturating_add(room_needed) <= budget {
                break;
            }
            kept -= u64::from(c.saves);
            ranked.push(c);
        }
        ranked.sort_unstable_by_key(|c| c.position);
        compressed = ranked.into_iter().map(|c| c.form).collect();
    }

    let evictions: Vec<Eviction> = chosen
        .iter()
        .map(|&(i, reason)| Eviction {
            span_id: rows[i].id,
            relevance: relevance[i],
            reason,
            tokens: rows[i].tokens,
        })
        .collect();

    let mut summary = None;
    let mut anchors_carried = 0;
    let mut anchors_dropped = 0;
    if !chosen.is_empty() {
        // Anchors may use all the room under the budget; prose only what
        // keeps the session at its goal.
        let room = budget
            .saturating_sub(kept.saturating_add(incoming))
            .min(cap);
        let prose = goal.saturating_sub(kept.saturating_add(incoming)).min(room);
        let evicted: Vec<&Span> = chosen.iter().map(|&(i, _)| &live[i]).collect();
        let owed = LiveFacts::owed_anchors(facts, live, chosen.iter().map(|&(i, _)| i));
        let written = write_summary_owing(
            &evicted,
            owed,
            SummaryRoom {
                tokens: room,
                prose_tokens: prose,
            },
            config,
            SummarySlot {
                id: input.next_span_id,
                turn: input.turn,
                now_ms: input.now_ms,
            },
            counter,
        );
        anchors_carried = written.anchors_carried;
        anchors_dropped = written.anchors_dropped;
        summary = written.span;
    }
    let summary_tokens = summary.as_ref().map_or(0, |s| u64::from(s.tokens));
    Plan {
        evicted: evictions,
        summary,
        compressed,
        tokens_before: before,
        tokens_after: kept + summary_tokens,
        incoming_tokens: incoming,
        target_tokens: goal,
        anchors_carried,
        anchors_dropped,
    }
}

/// The order candidates are evicted in: the keys (relevance, position,
/// index) of narrative and summaries below the floor, the tier's oldest
/// past its cap, the other keys, the rest of the tier. The keys are sorted
/// only as far as they are read: a compaction that evicts a few thousand
/// of a hundred thousand candidates selects and sorts those, and the
/// order it reads is the one a full sort gives (keys are distinct: they
/// end with the index).
struct Order {
    keys: Vec<(u64, u64, usize)>,
    /// `keys[..sorted]` are the smallest keys, in order.
    sorted: usize,
    tier: Vec<usize>,
    below_floor: usize,
    over_cap: usize,
}

impl Order {
    /// Keys sorted at least this far at once: a small compaction sorts
    /// no more than it would have.
    const FIRST_SORT: usize = 1024;

    fn new(
        keys: Vec<(u64, u64, usize)>,
        tier: Vec<usize>,
        below_floor: usize,
        over_cap: usize,
    ) -> Order {
        let mut order = Order {
            keys,
            sorted: 0,
            tier,
            below_floor,
            over_cap,
        };
        order.sort_to(below_floor);
        order
    }

    fn len(&self) -> usize {
        self.keys.len() + self.tier.len()
    }

    /// Sorts the keys at least `m` far, doubling what is sorted so that
    /// reading the order to its end costs one full sort.
    fn sort_to(&mut self, m: usize) {
        if m <= self.sorted {
            return;
        }
        let end = m
            .max(self.sorted.saturating_mul(2))
            .max(Order::FIRST_SORT)
            .min(self.keys.len());
        let rest = &mut self.keys[self.sorted..];
        let want = end - self.sorted;
        if want < rest.len() && want > 0 {
            rest.select_nth_unstable(want - 1);
            rest[..want].sort_unstable();
        } else {
            rest.sort_unstable();
        }
        self.sorted = end;
    }

    /// The live index of the `k`-th candidate to go (`k < len`).
    fn get(&mut self, k: usize) -> usize {
        let (floor, cap, n) = (self.below_floor, self.over_cap, self.keys.len());
        let at = if k < floor {
            k
        } else if k < floor + cap {
            return self.tier[k - floor];
        } else if k < n + cap {
            k - cap
        } else {
            return self.tier[k - n];
        };
        self.sort_to(at + 1);
        self.keys[at].2
    }
}

/// The most tokens the session's standing-instructions tier may hold: its
/// share of the window.
pub fn protected_cap_tokens(config: &SessionConfig) -> u64 {
    let fraction = config.classifier_tuning.effective_protected_fraction();
    (f64::from(config.window_tokens) * fraction).floor() as u64
}

/// How many of the tier's oldest spans must go for the rest to fit under
/// `cap` tokens.
fn tier_overflow(rows: &[LiveRow], tier: &[usize], cap: u64) -> usize {
    let mut held: u64 = tier.iter().map(|&i| u64::from(rows[i].tokens)).sum();
    let mut k = 0;
    while held > cap && k < tier.len() {
        held -= u64::from(rows[tier[k]].tokens);
        k += 1;
    }
    k
}

/// The tokens of the anchors a live span obliges the summary that replaces
/// it to carry, as far as the reserve for that summary must count them: a
/// summary's recorded anchors (carried verbatim, never shortened), 0 for
/// an original span (its anchors are a part of its text that the quarter
/// share covers).
fn carried_anchor_tokens(span: &Span, counter: &dyn TokenCounter) -> u64 {
    match &span.summary {
        Some(info) if !info.anchors.is_empty() => {
            u64::from(counter.count(&info.anchors.join(" | ")))
        }
        _ => 0,
    }
}

/// The room a summary is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryRoom {
    /// The most tokens the summary may take in all (anchors are further
    /// capped by the session's anchor budget).
    pub tokens: u64,
    /// The most its prose may bring it to.
    pub prose_tokens: u64,
}

/// Where a summary span goes: its id, and the turn and time that stamp it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummarySlot {
    /// The id the summary takes.
    pub id: SpanId,
    /// The turn that compacts.
    pub turn: u64,
    /// When it is written.
    pub now_ms: u64,
}

/// A summary written for a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct WrittenSummary {
    /// The span, or `None` when not even a header fits.
    pub span: Option<Span>,
    /// Anchors it carries verbatim.
    pub anchors_carried: u32,
    /// Anchors of the evicted spans it could not carry (this compaction
    /// only).
    pub anchors_dropped: u32,
}

/// Writes the summary span of `evicted` (in prompt order): the one place
/// that turns a draft into a span, so that every compaction, whatever its
/// trigger, records generation, covers and anchors the same way.
pub fn write_summary(
    evicted: &[&Span],
    room: SummaryRoom,
    config: &SessionConfig,
    slot: SummarySlot,
    counter: &dyn TokenCounter,
) -> WrittenSummary {
    let mut owed = OwedAnchors::with_capacity(evicted.len());
    for span in evicted {
        for anchor in required_anchors(span) {
            owed.add(&anchor);
        }
    }
    write_summary_owing(evicted, owed, room, config, slot, counter)
}

/// [`write_summary`] of `evicted`, whose anchors are `owed` (see
/// [`summarize_owing`]).
fn write_summary_owing(
    evicted: &[&Span],
    owed: OwedAnchors,
    room: SummaryRoom,
    config: &SessionConfig,
    slot: SummarySlot,
    counter: &dyn TokenCounter,
) -> WrittenSummary {
    // A summary presented as a user span starts with the session's
    // prefix, on a line of its own: its tokens come out of the room.
    let prefix = match config.summary_presentation {
        SummaryPresentation::System => None,
        SummaryPresentation::User => Some(format!("{}\n", config.effective_summary_prefix())),
    };
    let prefix_tokens = prefix.as_deref().map_or(0, |p| u64::from(counter.count(p)));
    let max = u32::try_from(room.tokens.saturating_sub(prefix_tokens)).unwrap_or(u32::MAX);
    let limits = SummaryLimits {
        max_tokens: max,
        prose_tokens: u32::try_from(room.prose_tokens.saturating_sub(prefix_tokens))
            .unwrap_or(u32::MAX),
        anchor_tokens: config.effective_anchor_budget_tokens().min(max),
    };
    let draft = summarize_owing(
        evicted,
        owed,
        limits,
        config.max_summary_generations,
        counter,
    );
    if draft.text.is_empty() || evicted.is_empty() {
        return WrittenSummary {
            span: None,
            anchors_carried: 0,
            anchors_dropped: draft.anchors_dropped,
        };
    }
    let earlier_drops = evicted
        .iter()
        .filter_map(|s| s.summary.as_ref())
        .fold(0u32, |n, info| n.saturating_add(info.anchors_dropped));
    let anchors_carried = u32::try_from(draft.anchors.len()).unwrap_or(u32::MAX);
    let (text, tokens) = match prefix {
        None => (draft.text, draft.tokens),
        Some(mut text) => {
            text.push_str(&draft.text);
            let tokens = counter.count(&text);
            (text, tokens)
        }
    };
    let span = Span {
        id: slot.id,
        position: evicted.iter().map(|s| s.position).min().unwrap_or(0),
        role: config.summary_role(),
        classification: Classification {
            class: SpanClass::Summary,
            source: ClassSource::Broker,
            rule: String::new(),
        },
        text,
        tokens,
        generation: draft.generation,
        turn: slot.turn,
        predicate: None,
        summary: Some(SummaryInfo {
            covers: draft.covers,
            anchors: draft.anchors,
            anchors_dropped: draft.anchors_dropped.saturating_add(earlier_drops),
        }),
        relevance_hint: None,
        admitted_at_ms: slot.now_ms,
        original: None,
        attributes: None,
    };
    WrittenSummary {
        span: Some(span),
        anchors_carried,
        anchors_dropped: draft.anchors_dropped,
    }
}

/// The live context after `plan`: evicted spans removed, compressed forms
/// substituted (each keeping the form it was first admitted in), the
/// summary inserted at its position, in prompt order.
pub fn apply(pre: &[Span], plan: &Plan) -> Vec<Span> {
    let made = made_spans(pre, plan);
    let rows: Vec<LiveRow> = pre.iter().map(LiveRow::of).collect();
    apply_refs(pre, &rows, plan, &made)
        .into_iter()
        .cloned()
        .collect()
}

/// The spans a plan writes: each compressed constraint it keeps, in its
/// new form and in prompt order, then the summary. [`apply_refs`] takes
/// them from here.
pub(crate) fn made_spans(pre: &[Span], plan: &Plan) -> Vec<Span> {
    let mut made = Vec::with_capacity(plan.compressed.len() + 1);
    if !plan.compressed.is_empty() {
        let compressed: FastMap<SpanId, &CompressedForm> = {
            let mut m = fasthash::map(plan.compressed.len());
            m.extend(plan.compressed.iter().map(|c| (c.span_id, c)));
            m
        };
        let evicted = evicted_ids(plan);
        // In the order of pre, as `apply_refs` meets them; the last form
        // given for a span wins, as a map built from the list keeps it.
        for s in pre.iter().filter(|s| !evicted.contains(s.id)) {
            if let Some(form) = compressed.get(&s.id) {
                made.push(compressed_span(s, &form.text, form.tokens));
            }
        }
    }
    made.extend(plan.summary.iter().cloned());
    made
}

/// The ids a plan evicts, asked about once per live span.
fn evicted_ids(plan: &Plan) -> IdSet {
    let ids: Vec<SpanId> = plan.evicted.iter().map(|e| e.span_id).collect();
    IdSet::of(&ids)
}

/// [`apply`] without copying the spans it keeps: the post-state as
/// references into `pre` and into `made` (from [`made_spans`] of the same
/// `pre` and `plan`), in the same order as [`apply`] returns them. `rows`
/// are the rows of `pre` ([`LiveRow::of_spans`]), which the walk over pre
/// reads instead of the spans.
pub(crate) fn apply_refs<'a>(
    pre: &'a [Span],
    rows: &[LiveRow],
    plan: &Plan,
    made: &'a [Span],
) -> Vec<&'a Span> {
    let evicted = evicted_ids(plan);
    let summary = plan.summary.as_ref().and(made.last());
    let mut forms = made[..made.len() - usize::from(summary.is_some())].iter();
    let mut post: Vec<&Span> = Vec::with_capacity(pre.len() + 1);
    let compressing = !plan.compressed.is_empty();
    // Stable, as `apply` has always sorted: spans sharing a position keep
    // the order of pre, and the summary, added last, follows them. A live
    // context is in prompt order already, and the summary then goes where
    // that sort puts it: before the first span past its position, placed
    // while the spans are gathered. Should post turn out not to be in
    // order, it is sorted as before.
    let mut in_order = true;
    let mut last_position = None;
    let mut pending = summary;
    for (s, row) in pre.iter().zip(rows) {
        if !evicted.is_empty() && evicted.contains(row.id) {
            continue;
        }
        let (kept, position) = if compressing
            && forms.as_slice().first().is_some_and(|f| f.id == row.id)
            && let Some(form) = forms.next()
        {
            (form, form.position)
        } else {
            (s, row.position)
        };
        if last_position.is_some_and(|p| p > position) {
            in_order = false;
        }
        last_position = Some(position);
        if in_order && let Some(summary) = pending.filter(|m| position > m.position) {
            post.push(summary);
            pending = None;
        }
        post.push(kept);
    }
    if in_order {
        post.extend(pending);
    } else {
        if pending.is_none()
            && let Some(summary) = summary
        {
            post.retain(|s| !std::ptr::eq(*s, summary));
        }
        post.extend(summary);
        post.sort_by_key(|s| s.position);
    }
    post
}

/// `span` standing as `text`: same id, position, class and predicate, and
/// the form it was first admitted in kept as its original.
pub fn compressed_span(span: &Span, text: &str, tokens: u32) -> Span {
    let original = span.original.clone().unwrap_or_else(|| OriginalForm {
        text: span.text.clone(),
        tokens: span.tokens,
    });
    Span {
        text: text.to_owned(),
        tokens,
        original: Some(original),
        ..span.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ViolationKind;
    use crate::relevance::RelevanceWeights;
    use crate::span::Role;
    use crate::tokens::ByteLength;

    fn span(id: u64, turn: u64, role: Role, text: &str) -> Span {
        crate::testing::admitted(id, turn, role, text)
    }

    fn filler(id: u64, turn: u64, n: usize) -> Span {
        let text = format!(
            "Build log line {id} for src/module_{id}.rs: compiled ok. {}",
            "x".repeat(n)
        );
        span(id, turn, Role::Tool, &text)
    }

    /// The compaction cliff: the old, short, off-topic constraint is the
    /// least relevant span of its session, and the planner keeps it anyway.
    #[test]
    fn the_cliff_constraint_scores_lowest_and_is_kept() {
        let mut live = vec![span(
            1,
            1,
            Role::User,
            "Never write to the `prod` namespace; stage only.",
        )];
        for id in 2..40 {
            let text = format!(
                "Refactor step {id}: kustomize overlays for the staging deploy.yaml, patch {id} applied and verified."
            );
            live.push(span(id, id, Role::Assistant, &text));
        }
        let query = "Apply the kustomize overlays to deploy.yaml for staging now.";
        let rel = score(&live, query, 40, &RelevanceWeights::default());
        let lowest = (0..live.len())
            .min_by(|&a, &b| rel[a].total_cmp(&rel[b]))
            .unwrap();
        assert_eq!(lowest, 0, "{rel:?}");
        assert!(live[0].is_pinned());

        let total: u64 = live.iter().map(|s| u64::from(s.tokens)).sum();
        let mut config = SessionConfig::with_window(1_000);
        config.window_tokens = (total as f64 / 0.85) as u32;
        config.relevance_floor = 0.0;
        let input = PlanInput {
            config: &config,
            live: &live,
            incoming_tokens: 200,
            query,
            turn: 40,
            next_span_id: 100,
            now_ms: 7,
            target_tokens: None,
            held_tool_calls: &[],
        };
        let plan = plan(&input, &ByteLength);
        assert!(!plan.evicted.is_empty());
        assert!(plan.evicted.iter().all(|e| e.span_id != 1));
        let post = apply(&live, &plan);
        assert_eq!(post[0].id, 1);
        assert_eq!(post[0].text, live[0].text);
        assert!(plan.tokens_after + plan.incoming_tokens <= u64::from(config.budget_tokens()));
    }

    fn protected(id: u64, turn: u64, text: &str) -> Span {
        let mut s = span(id, turn, Role::User, text);
        s.classification.class = SpanClass::Protected;
        s.predicate = None;
        s
    }

    /// A session of `doubtful` tier spans (ids 1..) followed by narrative
    /// filler, planned for an incoming turn of `incoming` tokens.
    fn tier_session(doubtful: u64, fillers: u64) -> Vec<Span> {
        let mut live: Vec<Span> = (1..=doubtful)
            .map(|id| protected(id, id, &format!("tabs {id} nowhere in the repo, thanks")))
            .collect();
        live.extend((doubtful + 1..=doubtful + fillers).map(|id| filler(id, id, 200)));
        live
    }

    fn plan_for(live: &[Span], config: &SessionConfig, incoming: u64) -> Plan {
        let input = PlanInput {
            config,
            live,
            incoming_tokens: incoming,
            query: "tabs nowhere",
            turn: 100,
            next_span_id: 1_000,
            now_ms: 7,
            target_tokens: None,
            held_tool_calls: &[],
        };
        plan(&input, &ByteLength)
    }

    /// A live context of tool exchanges (a call, then its result, some in
    /// the same turn, some a few spans apart), plain tool outputs between
    /// them, and a constraint, drawn at random.
    fn exchange_session(rng: &mut crate::testing::Rng, n: u64) -> Vec<Span> {
        let mut live = vec![span(
            1,
            1,
            Role::User,
            "Never write to the `prod` namespace.",
        )];
        let mut open: Vec<String> = Vec::new();
        for id in 2..n {
            let body = format!("step {id} output {}", "x".repeat(20 + rng.index(200)));
            let mut s = span(id, id / 3, Role::Tool, &body);
            match rng.index(4) {
                0 => {
                    s.role = Role::Assistant;
                    let call = format!("call_{id}");
                    s.attributes = Some(Box::new(crate::span::Attributes {
                        tool_call_id: call.clone(),
                        tool_name: "shell".into(),
                        ..Default::default()
                    }));
                    open.push(call);
                }
                1 if !open.is_empty() => {
                    let call = open.remove(rng.index(open.len()));
                    s.attributes = Some(Box::new(crate::span::Attributes {
                        tool_call_id: call,
                        ..Default::default()
                    }));
                }
                _ => {}
            }
            if rng.index(7) == 0 {
                s.relevance_hint = Some(rng.index(100) as f64 / 100.0);
            }
            live.push(s);
        }
        live
    }

    /// Every id's live spans are evicted all or none.
    fn split_exchanges(live: &[Span], plan: &Plan) -> Vec<String> {
        let evicted = evicted_ids(plan);
        let mut state: std::collections::BTreeMap<&str, (bool, bool)> = Default::default();
        for s in live {
            if let Some(id) = s.tool_call_id() {
                let e = state.entry(id).or_default();
                if evicted.contains(s.id) {
                    e.0 = true;
                } else {
                    e.1 = true;
                }
            }
        }
        state
            .into_iter()
            .filter(|(_, (gone, kept))| *gone && *kept)
            .map(|(id, _)| id.to_owned())
            .collect()
    }

    /// The verifier's verdict on `plan` applied to `live`, for a turn of
    /// `incoming` tokens continuing the exchanges `held`.
    fn verdict_of(
        live: &[Span],
        plan: &Plan,
        incoming: u64,
        held: &[&str],
        config: &SessionConfig,
    ) -> crate::plan::Verdict {
        let post = apply(live, plan);
        let refs: Vec<&Span> = post.iter().collect();
        let turn = crate::verify::IncomingTurn {
            tokens: incoming,
            tool_calls: held,
        };
        crate::verify::verify_refs(live, None, plan, &refs, turn, config, &ByteLength)
    }

    /// On random contexts and budgets, the plans never split an exchange,
    /// keep the exchanges the incoming turn holds, still fit, and pass
    /// the verifier; the verifier refuses the same plans with one span of
    /// an evicted exchange put back.
    #[test]
    fn tool_exchanges_go_whole_or_stay() {
        let mut rng = crate::testing::Rng(0xe8c4_a11e_0000_0001);
        let (mut evicting, mut caught) = (0, 0);
        for round in 0..300 {
            let n = 20 + rng.below(80);
            let live = exchange_session(&mut rng, n);
            let total: u64 = live.iter().map(|s| u64::from(s.tokens)).sum();
            let mut config = SessionConfig::with_window(1_000);
            config.window_tokens = (total as f64 / 0.85) as u32 + rng.below(50) as u32;
            let calls: Vec<&str> = live.iter().filter_map(Span::tool_call_id).collect();
            let held: Vec<&str> = calls
                .iter()
                .copied()
                .filter(|_| rng.below(5) == 0)
                .collect();
            let incoming = 50 + rng.below(total / 2);
            let input = PlanInput {
                config: &config,
                live: &live,
                incoming_tokens: incoming,
                query: "step output",
                turn: 100,
                next_span_id: 1_000,
                now_ms: 7,
                target_tokens: None,
                held_tool_calls: &held,
            };
            let plan = plan(&input, &ByteLength);
            assert!(split_exchanges(&live, &plan).is_empty(), "round {round}");
            let evicted = evicted_ids(&plan);
            for s in &live {
                if let Some(id) = s.tool_call_id() {
                    assert!(
                        !(held.contains(&id) && evicted.contains(s.id)),
                        "round {round}: held exchange {id} evicted"
                    );
                }
            }
            let verdict = verdict_of(&live, &plan, incoming, &held, &config);
            let fits = plan.tokens_after + incoming <= u64::from(config.budget_tokens());
            if fits {
                assert!(verdict.passed(), "round {round}: {:?}", verdict.violations);
            }
            // Put back one evicted span of an exchange: the plan now
            // splits it, and the verifier must say so.
            let Some(at) = plan.evicted.iter().position(|e| {
                live.iter()
                    .any(|s| s.id == e.span_id && s.tool_call_id().is_some())
            }) else {
                continue;
            };
            evicting += 1;
            let mut cut = plan.clone();
            let back = cut.evicted.remove(at);
            let exchange = live
                .iter()
                .find(|s| s.id == back.span_id)
                .and_then(Span::tool_call_id);
            let whole = live.iter().filter(|s| s.tool_call_id() == exchange).count();
            if whole < 2 {
                continue;
            }
            cut.tokens_after += u64::from(back.tokens);
            let verdict = verdict_of(&live, &cut, incoming, &held, &config);
            assert!(
                verdict
                    .violations
                    .iter()
                    .any(|v| v.kind == ViolationKind::ToolExchangeSplit
                        && v.span_id == Some(back.span_id)),
                "round {round}: {:?}",
                verdict.violations
            );
            caught += 1;
        }
        assert!(evicting > 100 && caught > 50, "{evicting} {caught}");
    }

    /// The verifier refuses a plan that evicts an exchange the incoming
    /// turn continues, even whole.
    #[test]
    fn an_exchange_the_turn_holds_may_not_go() {
        let mut call = span(2, 1, Role::Assistant, "call the shell");
        call.attributes = Some(Box::new(crate::span::Attributes {
            tool_call_id: "c1".into(),
            ..Default::default()
        }));
        let live = vec![span(1, 1, Role::Tool, "plain output"), call];
        let config = SessionConfig::with_window(1_000);
        let evicted = vec![Eviction {
            span_id: 2,
            relevance: 0.0,
            reason: EvictionReason::Budget,
            tokens: live[1].tokens,
        }];
        let plan = crate::testing::plan(evicted, None, Vec::new());
        let verdict = verdict_of(&live, &plan, 0, &["c1"], &config);
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| v.kind == ViolationKind::ToolExchangeSplit),
            "{:?}",
            verdict.violations
        );
        let verdict = verdict_of(&live, &plan, 0, &[], &config);
        assert!(
            verdict
                .violations
                .iter()
                .all(|v| v.kind != ViolationKind::ToolExchangeSplit)
        );
    }

    /// The tier outlives every narrative span, even the most relevant: the
    /// query names the doubtful spans' words, and they still go last.
    #[test]
    fn the_tier_is_evicted_only_after_all_narrative() {
        let live = tier_session(3, 20);
        let mut config = SessionConfig::with_window(6_000);
        config.relevance_floor = 0.0;
        let plan = plan_for(&live, &config, 2_000);
        let evicted: Vec<u64> = plan.evicted.iter().map(|e| e.span_id).collect();
        assert!(!evicted.is_empty());
        assert!(evicted.iter().all(|&id| id > 3), "{evicted:?}");

        // A turn so large that all narrative is not enough: the tier's
        // oldest go next, for the budget, before any constraint would be
        // compressed.
        let everything: u64 = live.iter().map(|s| u64::from(s.tokens)).sum();
        let incoming = u64::from(config.budget_tokens()) - 40;
        assert!(incoming < everything);
        let plan = plan_for(&live, &config, incoming);
        let tier: Vec<&Eviction> = plan.evicted.iter().filter(|e| e.span_id <= 3).collect();
        assert!(!tier.is_empty(), "{:?}", plan.evicted);
        assert!(tier.iter().all(|e| e.reason == EvictionReason::Budget));
        assert_eq!(
            plan.evicted.len() - tier.len(),
            20,
            "all narrative went first"
        );
        assert_eq!(tier[0].span_id, 1, "oldest first");
    }

    /// A tier past its share of the window loses its oldest spans first,
    /// while narrative stays when the budget does not need it.
    #[test]
    fn a_full_tier_evicts_its_oldest_first() {
        let live = tier_session(10, 4);
        let tier_tokens: u64 = live[..10].iter().map(|s| u64::from(s.tokens)).sum();
        let mut config = SessionConfig::with_window(6_000);
        config.relevance_floor = 0.0;
        // A share that holds a little more than half of the tier.
        let share = (tier_tokens / 2 + 5) as f64 / 6_000.0;
        config.classifier_tuning.protected_fraction = Some(share);
        let cap = protected_cap_tokens(&config);
        let plan = plan_for(&live, &config, 10);
        let full: Vec<u64> = plan
            .evicted
            .iter()
            .filter(|e| e.reason == EvictionReason::TierFull)
            .map(|e| e.span_id)
            .collect();
        assert!(!full.is_empty() && full.len() < 10, "{:?}", plan.evicted);
        assert_eq!(
            full,
            (1..=full.len() as u64).collect::<Vec<_>>(),
            "oldest first"
        );
        let held: u64 = live[full.len()..10]
            .iter()
            .map(|s| u64::from(s.tokens))
            .sum();
        assert!(held <= cap, "{held} > {cap}");
        let one_fewer: u64 = held + u64::from(live[full.len() - 1].tokens);
        assert!(one_fewer > cap, "no more than needed was evicted");
        assert!(
            plan.evicted.iter().all(|e| e.span_id <= 10),
            "narrative was not needed"
        );

        // Share 0: the tier holds nothing past the next compaction.
        config.classifier_tuning.protected_fraction = Some(0.0);
        let plan = plan_for(&live, &config, 10);
        let full = plan
            .evicted
            .iter()
            .filter(|e| e.reason == EvictionReason::TierFull)
            .count();
        assert_eq!(full, 10);
    }

    #[test]
    fn evicts_by_ascending_relevance_into_one_summary() {
        let live: Vec<Span> = (1..=20).map(|id| filler(id, id, 200)).collect();
        let config = SessionConfig::with_window(6_000);
        let before: u64 = live.iter().map(|s| u64::from(s.tokens)).sum();
        let input = PlanInput {
            config: &config,
            live: &live,
            incoming_tokens: 500,
            query: "",
            turn: 21,
            next_span_id: 21,
            now_ms: 99,
            target_tokens: None,
            held_tool_calls: &[],
        };
        let p = plan(&input, &ByteLength);
        assert_eq!(p.tokens_before, before);
        assert_eq!(p.incoming_tokens, 500);
        assert_eq!(p.target_tokens, u64::from(config.soft_watermark_tokens()));
        assert!(p.tokens_after + 500 <= p.target_tokens, "{p:?}");
        // Oldest first (recency decides with no query), in prompt order.
        let ids: Vec<u64> = p.evicted.iter().map(|e| e.span_id).collect();
        let expected: Vec<u64> = (1..=ids.len() as u64).collect();
        assert_eq!(ids, expected);
        assert!(p.evicted.iter().all(|e| e.reason == EvictionReason::Budget));
        let s = p.summary.as_ref().unwrap();
        assert_eq!(
            (s.id, s.position, s.turn, s.admitted_at_ms),
            (21, 1, 21, 99)
        );
        assert_eq!(s.class(), SpanClass::Summary);
        assert_eq!(s.classification.source, ClassSource::Broker);
        assert_eq!(s.role, Role::System);
        assert_eq!(s.generation, 1);
        assert_eq!(s.tokens, ByteLength.count(&s.text));
        let info = s.summary.as_ref().unwrap();
        assert_eq!(info.covers, ids);
        assert_eq!(p.anchors_carried as usize, info.anchors.len());
        assert!(s.tokens <= config.effective_summary_max_tokens());
        let post = apply(&live, &p);
        assert_eq!(post[0].id, 21);
        assert_eq!(post.len(), live.len() - ids.len() + 1);
        let after: u64 = post.iter().map(|s| u64::from(s.tokens)).sum();
        assert_eq!(after, p.tokens_after);
    }

    #[test]
    fn below_floor_goes_even_when_not_needed() {
        let mut live: Vec<Span> = (1..=5).map(|id| filler(id, 100, 10)).collect();
        live[2].relevance_hint = Some(0.0);
        let mut config = SessionConfig::with_window(100_000);
        config.relevance_floor = 0.45;
        config.relevance = RelevanceWeights {
            hint: 1.0,
            ..RelevanceWeights::default()
        };
        let input = PlanInput {
            config: &config,
            live: &live,
            incoming_tokens: 0,
            query: "",
            turn: 100,
            next_span_id: 6,
            now_ms: 0,
            target_tokens: None,
            held_tool_calls: &[],
        };
        let p = plan(&input, &ByteLength);
        assert_eq!(p.evicted.len(), 1);
        assert_eq!(p.evicted[0].span_id, 3);
        assert_eq!(p.evicted[0].reason, EvictionReason::BelowFloor);
        assert_eq!(p.evicted[0].relevance, 0.0);
    }

    #[test]
    fn nothing_to_do_is_an_empty_plan() {
        let live: Vec<Span> = (1..=3).map(|id| filler(id, id, 10)).collect();
        let config = SessionConfig::with_window(100_000);
        let input = PlanInput {
            config: &config,
            live: &live,
            incoming_tokens: 10,
            query: "x",
            turn: 4,
            next_span_id: 4,
            now_ms: 0,
            target_tokens: None,
            held_tool_calls: &[],
        };
        let p = plan(&input, &ByteLength);
        assert!(p.evicted.is_empty() && p.summary.is_none());
        assert_eq!(p.tokens_after, p.tokens_before);
        assert_eq!(apply(&live, &p), live);
    }

    #[test]
    fn unreachable_soft_target_falls_back_to_the_budget() {
        let c = span(
            1,
            1,
            Role::User,
            &format!("Never touch prod. {}", "a ".repeat(2000)),
        );
        let mut live = vec![c];
        live.extend((2..=6).map(|id| filler(id, id, 100)));
        let config = SessionConfig::with_window(6_000);
        let input = PlanInput {
            config: &config,
            live: &live,
            incoming_tokens: 600,
            query: "",
            turn: 7,
            next_span_id: 7,
            now_ms: 0,
            target_tokens: Some(100),
            held_tool_calls: &[],
        };
        let p = plan(&input, &ByteLength);
        assert_eq!(p.target_tokens, u64::from(config.budget_tokens()));
        assert!(p.tokens_after + 600 <= u64::from(config.budget_tokens()));
    }

    #[test]
    fn apply_substitutes_compressed_forms() {
        let live = vec![span(
            1,
            1,
            Role::User,
            "Never, ever write to the prod namespace.",
        )];
        let p = Plan {
            evicted: vec![],
            summary: None,
            compressed: vec![CompressedForm {
                span_id: 1,
                text: "Never write prod namespace.".into(),
                tokens: 27,
            }],
            tokens_before: 40,
            tokens_after: 27,
            incoming_tokens: 0,
            target_tokens: 0,
            anchors_carried: 0,
            anchors_dropped: 0,
        };
        let post = apply(&live, &p);
        assert_eq!(post[0].text, "Never write prod namespace.");
        assert_eq!(post[0].tokens, 27);
        assert_eq!(post[0].predicate, live[0].predicate);
    }

    /// The order read lazily is the order of one full sort, whatever is
    /// read first and however far.
    #[test]
    fn the_lazy_order_is_the_sorted_order() {
        let mut rng = crate::testing::Rng(0x2545_f491_4f6c_dd1d_u64);
        let mut next = |n: u64| rng.below(n);
        for len in [0usize, 1, 5, 1_000, 1_025, 5_000] {
            let keys: Vec<(u64, u64, usize)> =
                (0..len).map(|i| (next(50), next(1_000), i)).collect();
            let tier: Vec<usize> = (len..len + next(6) as usize).collect();
            let over_cap = next(tier.len() as u64 + 1) as usize;
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            let below_floor = next(len as u64 + 1) as usize;
            let mut want: Vec<usize> = Vec::new();
            want.extend(sorted[..below_floor].iter().map(|k| k.2));
            want.extend_from_slice(&tier[..over_cap]);
            want.extend(sorted[below_floor..].iter().map(|k| k.2));
            want.extend_from_slice(&tier[over_cap..]);
            // Read in order, and from the far end back.
            let mut order = Order::new(keys.clone(), tier.clone(), below_floor, over_cap);
            let got: Vec<usize> = (0..order.len()).map(|k| order.get(k)).collect();
            assert_eq!(got, want, "{len}");
            let mut order = Order::new(keys, tier, below_floor, over_cap);
            let mut back: Vec<usize> = (0..order.len()).rev().map(|k| order.get(k)).collect();
            back.reverse();
            assert_eq!(back, want, "{len}");
        }
    }

    /// `apply` as first written: a copy of every kept span, the forms
    /// looked up in a map, one stable sort by position.
    fn plain_apply(pre: &[Span], plan: &Plan) -> Vec<Span> {
        let evicted: std::collections::HashSet<SpanId> =
            plan.evicted.iter().map(|e| e.span_id).collect();
        let compressed: std::collections::HashMap<SpanId, _> =
            plan.compressed.iter().map(|c| (c.span_id, c)).collect();
        let mut post: Vec<Span> = pre
            .iter()
            .filter(|s| !evicted.contains(&s.id))
            .map(|s| match compressed.get(&s.id) {
                Some(form) => compressed_span(s, &form.text, form.tokens),
                None => s.clone(),
            })
            .collect();
        if let Some(summary) = &plan.summary {
            post.push(summary.clone());
        }
        post.sort_by_key(|s| s.position);
        post
    }

    #[test]
    fn apply_without_copies_keeps_the_plain_result() {
        let mut live: Vec<Span> = (1..=12).map(|id| filler(id, id, 5)).collect();
        for id in [2, 5, 9] {
            live[id - 1] = span(
                id as u64,
                id as u64,
                Role::User,
                "Never touch the prod namespace.",
            );
        }
        // A summary standing first with a higher id, and a duplicate id
        // and position, as only a corrupt context would have.
        live[0].id = 40;
        live[11].id = 11;
        live[11].position = 11;
        let form = |id: u64, text: &str| CompressedForm {
            span_id: id,
            text: text.into(),
            tokens: text.len() as u32,
        };
        let eviction = |id: u64| Eviction {
            span_id: id,
            relevance: 0.1,
            reason: EvictionReason::Budget,
            tokens: 1,
        };
        let mut summary = filler(50, 13, 1);
        summary.position = 3;
        let plan = crate::testing::plan;
        let plans = [
            plan(
                vec![eviction(3), eviction(4), eviction(9)],
                Some(summary.clone()),
                vec![form(5, "Never touch prod."), form(2, "Never prod.")],
            ),
            // A form for an evicted span and two forms for one span.
            plan(
                vec![eviction(3), eviction(5)],
                Some(summary),
                vec![form(5, "Never."), form(9, "No prod."), form(9, "No.")],
            ),
            plan(vec![], None, vec![form(11, "Eleven.")]),
        ];
        for p in &plans {
            assert_eq!(apply(&live, p), plain_apply(&live, p), "{p:?}");
        }
    }

    #[test]
    fn apply_places_the_summary_as_the_sort_did_on_random_contexts() {
        let mut rng = crate::testing::Rng(0x853c_49e6_748f_ea9b_u64);
        let mut next = |n: u64| rng.below(n);
        for round in 0..3_000 {
            let len = next(10);
            // In prompt order, or (a context changed outside the session's
            // own operations) positions out of order and shared.
            let shuffled = round % 2 == 1;
            let live: Vec<Span> = (1..=len)
                .map(|id| {
                    let mut s = filler(id, id, 1);
                    if shuffled {
                        s.position = next(6);
                    }
                    s
                })
                .collect();
            let evicted: Vec<Eviction> = (1..=len)
                .filter(|_| next(3) == 0)
                .map(|id| Eviction {
                    span_id: id,
                    relevance: 0.0,
                    reason: EvictionReason::Budget,
                    tokens: 1,
                })
                .collect();
            let summary = (next(4) != 0).then(|| {
                let mut m = filler(100, 13, 1);
                m.position = next(len + 2);
                m
            });
            let p = crate::testing::plan(evicted, summary, Vec::new());
            assert_eq!(
                apply(&live, &p),
                plain_apply(&live, &p),
                "round {round}: {p:?}"
            );
        }
    }
}
