//! A session's state as the policy sees it: its record (configuration and
//! counters) and, around it, the operations that change it.
//!
//! [`Session`] and what every operation shares live here: adopting an
//! acknowledged change, the live totals, relevance against the latest
//! turn. Each operation is in the submodule named after it: admitting a
//! turn (`admit`), an operator's plan and commit (`manual`), pins and
//! unpins (`pins`), taking spans back (`undo`), background compaction
//! (`background`), and the
//! marker-bearing changes they share (`markers`); `change` holds the
//! record and change types they return.

mod admit;
mod background;
mod change;
mod manual;
mod markers;
mod pins;
mod undo;

pub use admit::Incoming;
pub use change::{Change, Rejection, SessionRecord};
pub use manual::{CallerEdits, PlanId, PlanOutcome};
pub use undo::Retraction;

use crate::config::SessionConfig;
use crate::facts::{LiveFacts, LiveRow};
use crate::fasthash::{self, FastMap, IdSet};
use crate::marker::Marker;
use crate::plan::Sizes;
use crate::relevance;
use crate::span::{Span, SpanClass, SpanId};

/// A session as the policy sees it: its record and its live context, in
/// prompt order.
///
/// Every operation is a pure function of this state (and of the time and
/// token counter it is given) that returns a [`Change`] or a [`Rejection`];
/// nothing changes until [`Session::apply`] adopts a change the store has
/// acknowledged. A session rebuilt with [`Session::new`] from what the
/// store holds behaves exactly like the one that wrote it: nothing lives
/// outside the record and the spans, plans included. What it derives from
/// its spans ([`LiveFacts`]) is rebuilt from them and kept up to date by
/// [`Session::apply`]; `spans` should change only through it (a session
/// whose spans were changed otherwise still plans correctly, deriving
/// what it needs from the text at each plan). The operations that may
/// plan (admitting, planning and committing, the background compactions,
/// relevance) take the session mutably for that alone: they derive the
/// facts a plan reads as far as they are not yet, which changes no
/// outcome.
#[derive(Debug, Clone)]
pub struct Session {
    /// The configuration and counters.
    pub record: SessionRecord,
    /// The live context, in prompt order.
    pub spans: Vec<Span>,
    /// What each live span's text gives a compaction, derived once, when a
    /// compaction first needs it: `None` until then (a session loaded to
    /// admit turns that fit never derives it). Once derived, the facts
    /// describe the spans up to the turns appended since the last
    /// compaction that needed them, which are derived when the next one
    /// does: a turn that fits costs no derivation.
    facts: Option<LiveFacts>,
    /// The seeds the store kept (see [`crate::facts::seed`]) of the spans
    /// whose facts are not derived yet, in order: of every span while
    /// `facts` is `None` (or none at all, when the session was built
    /// without seeds), else of the spans appended since.
    seeds: Seeds,
}

/// The seeds of a session's spans, by index, with the bytes they hold,
/// kept as they come and go.
#[derive(Debug, Clone, Default)]
struct Seeds {
    by_index: Vec<Option<Box<[u8]>>>,
    bytes: usize,
}

impl Seeds {
    fn of(by_index: Vec<Option<Box<[u8]>>>) -> Seeds {
        let bytes = by_index.iter().flatten().map(|s| s.len()).sum();
        Seeds { by_index, bytes }
    }

    fn len(&self) -> usize {
        self.by_index.len()
    }

    fn held(seed: &Option<Box<[u8]>>) -> usize {
        seed.as_ref().map_or(0, |s| s.len())
    }

    /// Keeps the seeds for which `keep` (by index) is true.
    fn retain(&mut self, keep: &[bool]) {
        let dropped: usize = (self.by_index.iter().zip(keep))
            .filter(|(_, kept)| !**kept)
            .map(|(seed, _)| Seeds::held(seed))
            .sum();
        self.bytes = self.bytes.saturating_sub(dropped);
        crate::retain_kept(&mut self.by_index, keep);
    }

    /// The span at `at` has no seed any more.
    fn clear(&mut self, at: usize) {
        if let Some(slot) = self.by_index.get_mut(at) {
            self.bytes = self.bytes.saturating_sub(Seeds::held(slot));
            *slot = None;
        }
    }

    fn insert(&mut self, at: usize, seed: Option<&[u8]>) {
        self.bytes += seed.map_or(0, <[u8]>::len);
        self.by_index
            .insert(at.min(self.by_index.len()), seed.map(Box::from));
    }

    fn push(&mut self, seed: Option<&[u8]>) {
        self.insert(self.by_index.len(), seed);
    }
}

/// Sessions are equal when their records and spans are: the facts follow
/// from the spans.
impl PartialEq for Session {
    fn eq(&self, other: &Session) -> bool {
        self.record == other.record && self.spans == other.spans
    }
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

    /// [`Totals::of`] a post-state `post` made of the spans of `pre`
    /// (whose rows are `rows`) and spans written for it: a span of pre,
    /// found by where it stands in memory, is counted from its row unread.
    fn of_post(pre: &[Span], rows: &[LiveRow], post: &[&Span]) -> Totals {
        let mut t = Totals {
            live_tokens: 0,
            live_spans: 0,
            pinned_tokens: 0,
            pinned_spans: 0,
        };
        for &s in post {
            let (tokens, pinned) = match index_in(pre, s).and_then(|i| rows.get(i)) {
                Some(r) => (r.tokens, r.is_pinned()),
                None => (s.tokens, s.is_pinned()),
            };
            t.live_spans += 1;
            t.live_tokens += u64::from(tokens);
            if pinned {
                t.pinned_tokens += u64::from(tokens);
                t.pinned_spans += 1;
            }
        }
        t
    }

    fn add_to(&self, record: &mut SessionRecord) {
        record.live_tokens += self.live_tokens;
        record.live_spans += self.live_spans;
        record.pinned_tokens += self.pinned_tokens;
        record.pinned_spans += self.pinned_spans;
    }

    fn write_to(&self, record: &mut SessionRecord) {
        record.live_tokens = self.live_tokens;
        record.live_spans = self.live_spans;
        record.pinned_tokens = self.pinned_tokens;
        record.pinned_spans = self.pinned_spans;
    }
}

/// The index of `span` in `spans` when it is one of them: the very span,
/// by its address, not an equal one.
fn index_in(spans: &[Span], span: &Span) -> Option<usize> {
    let size = std::mem::size_of::<Span>();
    let offset = (span as *const Span as usize).checked_sub(spans.as_ptr() as usize)?;
    let at = offset / size;
    (offset % size == 0 && at < spans.len()).then_some(at)
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
    /// A session from its stored state. The facts of its spans (see
    /// [`LiveFacts`]), linear in the text of the live context, are derived
    /// when first needed: a session loaded to admit turns that fit costs
    /// the reading of its spans alone.
    pub fn new(record: SessionRecord, spans: Vec<Span>) -> Session {
        Session::with_seeds(record, spans, Vec::new())
    }

    /// [`Session::new`], with the seed the store kept of each span
    /// (`seeds[k]` for `spans[k]`; ignored unless there is one entry per
    /// span): the facts, when first needed, are read from them instead of
    /// derived from the text (for the spans without one, derived).
    pub fn with_seeds(
        record: SessionRecord,
        spans: Vec<Span>,
        seeds: Vec<Option<Box<[u8]>>>,
    ) -> Session {
        // Without a seed among them, nothing is kept: a session of short
        // spans holds no slot per span.
        let seeds = match seeds.len() == spans.len() && seeds.iter().any(Option::is_some) {
            true => Seeds::of(seeds),
            false => Seeds::default(),
        };
        Session {
            record,
            spans,
            facts: None,
            seeds,
        }
    }

    /// A session just created at `now_ms`: revision 1, no spans.
    pub fn create(id: &str, config: SessionConfig, now_ms: u64) -> Session {
        Session {
            record: SessionRecord::new(id, config, now_ms),
            spans: Vec::new(),
            facts: Some(LiveFacts::default()),
            seeds: Seeds::default(),
        }
    }

    /// What the session derived from its live spans, derived now as far
    /// as it was not yet, when it still describes them (see [`Session`]).
    pub fn facts(&mut self) -> Option<&LiveFacts> {
        self.derive_facts();
        self.current_facts()
    }

    /// The facts, when they describe every live span as they stand:
    /// `None` while some are not derived yet (see [`Session::facts`]) or
    /// the spans were changed outside [`Session::apply`].
    pub(crate) fn current_facts(&self) -> Option<&LiveFacts> {
        self.facts.as_ref().filter(|f| f.describes(&self.spans))
    }

    /// Derives the facts as far as they are not yet: all of them, read
    /// from the seeds the session was built with where it has them, the
    /// first time; then those of the spans appended since, from their
    /// seeds. Facts out of step with the spans are left as they are (and
    /// not used).
    fn derive_facts(&mut self) {
        match &mut self.facts {
            None => {
                self.facts = Some(LiveFacts::of_seeded(&self.spans, self.pending_seeds()));
                self.seeds = Seeds::default();
            }
            Some(facts) if facts.len() + self.seeds.len() == self.spans.len() => {
                let from = facts.len();
                let tail = std::mem::take(&mut self.seeds);
                for (span, seed) in self.spans[from..].iter().zip(tail.by_index) {
                    facts.push(span, seed.as_deref());
                }
            }
            Some(_) => {}
        }
    }

    /// The seeds the facts are to be read from when none are derived yet,
    /// one per span; none when they are out of step with the spans.
    fn pending_seeds(&self) -> &[Option<Box<[u8]>>] {
        match self.facts.is_none() && self.seeds.len() == self.spans.len() {
            true => &self.seeds.by_index,
            false => &[],
        }
    }

    /// The bytes the seeds held for facts not yet derived take, about:
    /// kept as they come and go, so it costs nothing per span.
    pub fn seed_bytes(&self) -> usize {
        let seeds = &self.seeds.by_index[..];
        match seeds.is_empty() {
            true => 0,
            false => std::mem::size_of_val(seeds) + self.seeds.bytes,
        }
    }

    /// [`Session::seed_bytes`] counted afresh, seed by seed.
    #[cfg(test)]
    pub(crate) fn seed_bytes_recounted(&self) -> usize {
        let seeds = &self.seeds.by_index[..];
        match seeds.is_empty() {
            true => 0,
            false => {
                std::mem::size_of_val(seeds)
                    + seeds.iter().flatten().map(|s| s.len()).sum::<usize>()
            }
        }
    }

    /// The facts as far as they were derived: `None` when nothing asked
    /// for them since the session was loaded. What the session holds in
    /// memory, without deriving anything.
    pub fn derived_facts(&self) -> Option<&LiveFacts> {
        self.facts.as_ref()
    }

    /// Adopts a change once the store has acknowledged it, the way the
    /// store applies it: evicted spans leave, rewritten ones are replaced
    /// in place, the summary stands at its position, the turn is appended.
    /// Costs what the change touches, not the size of the live context,
    /// when nothing is evicted.
    pub fn apply(&mut self, change: &Change) {
        self.apply_seeded(change, &[]);
    }

    /// [`Session::apply`], with the seeds of the change's new spans (its
    /// summary and appended spans) by span id, as the store kept them: the
    /// facts of those spans are read from them rather than derived again.
    pub fn apply_seeded(&mut self, change: &Change, seeds: &[(SpanId, Vec<u8>)]) {
        let seed_of = |id: SpanId| {
            seeds
                .iter()
                .find(|(of, _)| *of == id)
                .map(|(_, seed)| seed.as_slice())
        };
        self.record = change.record.clone();
        let appends_only =
            change.evict.is_empty() && change.replace.is_empty() && change.summary.is_none();
        if !appends_only && self.facts.is_some() {
            // Spans move or are rewritten: the facts of those appended
            // since are derived first, so that they move with them.
            self.derive_facts();
        }
        // Facts out of step with the spans (which only a change of `spans`
        // outside this method makes) are dropped, to be derived afresh
        // when next needed; the check costs nothing per span, so that a
        // change that evicts nothing still costs only what it touches.
        let spans_before = self.spans.len();
        if self
            .facts
            .as_ref()
            .is_some_and(|f| f.len() + self.seeds.len() != spans_before)
        {
            self.facts = None;
            self.seeds = Seeds::default();
        }
        // Facts not derived yet stay so, and the seeds they will be read
        // from follow the spans; derived ones follow them too, but for the
        // appended spans', which wait for the next compaction with their
        // seeds.
        let mut facts = self.facts.as_mut();
        let mut pending = None;
        if facts.is_none() {
            // Seeds out of step with the spans are never read: let go.
            let seeds = std::mem::take(&mut self.seeds);
            pending = (seeds.len() == spans_before).then_some(seeds);
        }
        if !change.evict.is_empty() {
            let evicted = IdSet::of(&change.evict);
            let keep: Vec<bool> = self.spans.iter().map(|s| !evicted.contains(s.id)).collect();
            crate::retain_kept(&mut self.spans, &keep);
            if let Some(facts) = facts.as_deref_mut() {
                facts.retain(&keep);
            }
            if let Some(pending) = pending.as_mut() {
                pending.retain(&keep);
            }
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
                    if let Some(facts) = facts.as_deref_mut() {
                        facts.replace(i, span);
                    }
                    // A rewritten text has no seed: derived from it.
                    if let Some(pending) = pending.as_mut() {
                        pending.clear(i);
                    }
                }
            }
        }
        if let Some(summary) = &change.summary {
            let at = self
                .spans
                .partition_point(|s| s.position < summary.position);
            self.spans.insert(at, summary.clone());
            if let Some(facts) = facts.as_deref_mut() {
                facts.insert(at, summary, seed_of(summary.id));
            }
            if let Some(pending) = pending.as_mut() {
                pending.insert(at, seed_of(summary.id));
            }
        }
        self.spans.extend(change.append.iter().cloned());
        // The seeds, in step again, take in the appended spans': they
        // wait with the facts not derived yet, or behind the derived ones.
        let in_step = facts.is_some() || pending.is_some();
        if let Some(pending) = pending {
            self.seeds = pending;
        }
        if in_step {
            for span in &change.append {
                self.seeds.push(seed_of(span.id));
            }
        }
    }

    /// Each live span's relevance as of the latest turn (the query is that
    /// turn's non-summary text), weighted as the session's configuration
    /// says: what GetContext reports next to every span.
    pub fn relevance(&mut self) -> Vec<f64> {
        self.derive_facts();
        let query = self.latest_query();
        let (turn, weights) = (self.record.turns, &self.record.config.relevance);
        match self.current_facts() {
            Some(facts) => relevance::score_with(&self.spans, facts, &query, turn, weights),
            None => relevance::score(&self.spans, &query, turn, weights),
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::Role;
    use crate::testing::{Rng, admitted};

    fn totals(t: &Totals) -> (u64, u64, u64, u64) {
        (t.live_tokens, t.live_spans, t.pinned_tokens, t.pinned_spans)
    }

    /// A span is found where it stands, and a copy of it is not.
    #[test]
    fn index_in_finds_the_very_span() {
        let spans: Vec<Span> = (1..=5).map(|id| admitted(id, 1, Role::Tool, "x")).collect();
        for (i, s) in spans.iter().enumerate() {
            assert_eq!(index_in(&spans, s), Some(i));
            assert_eq!(index_in(&spans, &s.clone()), None);
        }
        assert_eq!(index_in(&spans[1..3], &spans[0]), None);
        assert_eq!(index_in(&spans[1..3], &spans[3]), None);
        assert_eq!(index_in(&spans[1..3], &spans[2]), Some(1));
        assert_eq!(index_in(&[], &spans[0]), None);
    }

    /// The totals of a post-state counted from the rows of the spans it
    /// keeps are its totals counted from the spans, whatever it holds of
    /// pre, in whatever order, and whatever spans written for it.
    #[test]
    fn totals_of_a_post_state_from_the_rows_are_its_totals() {
        let mut rng = Rng(0x0dd_ba11_5eed_0004);
        let mut pinned_rounds = 0;
        for round in 0..500 {
            let pre: Vec<Span> = (1..=rng.below(20))
                .map(|id| {
                    let role = if rng.below(3) == 0 {
                        Role::User
                    } else {
                        Role::Tool
                    };
                    let text = if role == Role::User {
                        "Never touch prod."
                    } else {
                        "ok"
                    };
                    let mut s = admitted(id, 1, role, text);
                    s.tokens = rng.below(50) as u32;
                    s
                })
                .collect();
            let rows: Vec<LiveRow> = pre.iter().map(LiveRow::of).collect();
            let made: Vec<Span> = (0..rng.below(3))
                .map(|k| admitted(100 + k, 2, Role::User, "Never touch prod."))
                .collect();
            let mut post: Vec<&Span> = pre.iter().filter(|_| rng.below(3) != 0).collect();
            for m in &made {
                let at = rng.index(post.len() + 1);
                post.insert(at, m);
            }
            if rng.below(4) == 0 && !post.is_empty() {
                let at = rng.index(post.len());
                post.push(post[at]);
            }
            let counted = totals(&Totals::of(post.iter().copied()));
            pinned_rounds += usize::from(counted.3 > 0);
            assert_eq!(
                totals(&Totals::of_post(&pre, &rows, &post)),
                counted,
                "round {round}"
            );
        }
        assert!(pinned_rounds > 100, "{pinned_rounds}");
    }
}
