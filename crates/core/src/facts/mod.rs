//! What a compaction reads of every live span, derived once per span.
//!
//! A compaction orders the whole live context by relevance, which needs
//! each span's words, and its summary and the verifier's check of it need
//! the anchors of every span it evicts. Both depend only on the span's
//! text, so a session derives them once, when a span joins the live
//! context (admitted, written as a summary or a compressed form, or read
//! from the store when the session is loaded), and keeps them next to the
//! spans in [`LiveFacts`]: a plan then reads them instead of scanning the
//! text of every live span again.
//!
//! The facts are rebuilt whenever a session is constructed: from each
//! span's seed when the store kept one beside the span ([`seed`]: the
//! span's words and anchors as byte ranges of its text, written when the
//! span was admitted), else from the text. A reader that finds them out of
//! step with the spans it is given derives what it needs from the text
//! instead.
//!
//! # What is kept
//!
//! Per span, in prompt order: its id and text length (to recognise it),
//! its length in words and its distinct matchable words with their counts
//! in order of first appearance (for BM25, see [`crate::relevance`]), and
//! the byte ranges of its anchors (see [`crate::text`]) unless it is a
//! summary, whose recorded anchors are read from the span. Words are
//! interned per session; each word's document frequency and the total
//! length are kept up to date, and a word no live span uses is forgotten.
//!
//! Beside them, per span, a [`LiveRow`]: the few fields of the span that a
//! compaction reads of every live span (id, position, tokens, turn, hint,
//! class), copied into one compact array, so that the planner's, the
//! admission's and the verifier's walks over the whole live context read
//! 40 bytes per span instead of the span itself. The rows are facts like
//! the others: [`LiveFacts::describes`] holds each of them to the span it
//! copies, so a span changed outside the session's operations makes the
//! facts unused rather than wrong.

use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::fasthash::{self, FastMap, FastState};
use crate::relevance::{self, for_each_counted_word};
use crate::span::{Span, SpanClass, SpanId};
use crate::text::{OwedAnchors, anchor_ranges, required_anchors};

mod seed;
pub use seed::{SEED_MIN_BYTES, SEED_RULES, seed};

/// What is derived once from one live span.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SpanFacts {
    id: SpanId,
    text_len: usize,
    /// Words in all, matchable or not: the span's length for BM25.
    words: u32,
    /// How many of `data`'s pairs are words; the rest are anchors.
    terms: u32,
    /// (word id, count) of each distinct matchable word, in order of
    /// first appearance (the order BM25 sums a span's terms in), then
    /// the byte range (start, end) of each anchor of the text: one
    /// allocation per span. No anchors for a span that records its
    /// anchors as a summary, nor for a text too long for 32-bit offsets,
    /// whose anchors are extracted when asked for (`anchors_in_text`).
    data: Box<[(u32, u32)]>,
    anchors_in_text: bool,
}

impl SpanFacts {
    fn terms(&self) -> &[(u32, u32)] {
        self.data.get(..self.terms as usize).unwrap_or(&[])
    }

    fn anchors(&self) -> &[(u32, u32)] {
        self.data.get(self.terms as usize..).unwrap_or(&[])
    }
}

/// The fields of one live span that a compaction reads of every span: a
/// copy, compared with the span by [`LiveFacts::describes`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveRow {
    /// The span's id.
    pub(crate) id: SpanId,
    /// Its position.
    pub(crate) position: u64,
    /// The turn that admitted it.
    pub(crate) turn: u64,
    /// The caller's relevance hint when it is finite, else NaN: relevance
    /// reads a hint that is not finite as no hint.
    hint: f64,
    /// Its tokens.
    pub(crate) tokens: u32,
    /// Its class.
    pub(crate) class: SpanClass,
    /// Whether it records what it summarises (`Span::summary`).
    pub(crate) summarises: bool,
    /// Whether it belongs to a tool exchange (`Span::tool_call_id`).
    pub(crate) exchange: bool,
}

impl LiveRow {
    /// The row of `span`.
    pub(crate) fn of(span: &Span) -> LiveRow {
        LiveRow {
            id: span.id,
            position: span.position,
            turn: span.turn,
            hint: span
                .relevance_hint
                .filter(|h| h.is_finite())
                .unwrap_or(f64::NAN),
            tokens: span.tokens,
            class: span.class(),
            summarises: span.summary.is_some(),
            exchange: span.tool_call_id().is_some(),
        }
    }

    /// The caller's hint, when it is finite.
    pub(crate) fn hint(&self) -> Option<f64> {
        Some(self.hint).filter(|h| h.is_finite())
    }

    /// Whether the span is a pinned constraint.
    pub(crate) fn is_pinned(&self) -> bool {
        self.class == SpanClass::Constraint
    }

    /// Whether the span is in the standing-instructions tier.
    pub(crate) fn is_protected(&self) -> bool {
        self.class == SpanClass::Protected
    }

    /// Whether this is the row of `span`, field by field (the hint by its
    /// bits).
    pub(crate) fn copies(&self, span: &Span) -> bool {
        let fresh = LiveRow::of(span);
        self.id == fresh.id
            && self.position == fresh.position
            && self.turn == fresh.turn
            && self.hint.to_bits() == fresh.hint.to_bits()
            && self.tokens == fresh.tokens
            && self.class == fresh.class
            && self.summarises == fresh.summarises
            && self.exchange == fresh.exchange
    }

    /// The rows of `spans`: those `facts` keep when given (the caller
    /// checked that they describe `spans`), else copied now.
    pub(crate) fn of_spans<'a>(facts: Option<&'a LiveFacts>, spans: &[Span]) -> Cow<'a, [LiveRow]> {
        match facts {
            Some(f) => Cow::Borrowed(&f.rows),
            None => Cow::Owned(spans.iter().map(LiveRow::of).collect()),
        }
    }
}

/// The words of a session's live spans: each distinct lower-cased word
/// once, with the number of live spans using it.
///
/// A word's text is held once, in `names`; the index finds a word's id by
/// hashing its text and comparing it with the name of each id it holds,
/// so a word costs one allocation, not one for the index and one by id.
#[derive(Clone, Default)]
struct Words {
    /// Ids of the words interned, found by their names' hash.
    ids: HashTable<u32>,
    hasher: FastState,
    /// By id: the word ("" once forgotten) and its document frequency.
    names: Vec<Box<str>>,
    df: Vec<u32>,
    /// Ids of forgotten words, to reuse.
    free: Vec<u32>,
    /// The bytes of the words interned, kept as they come and go.
    name_bytes: usize,
}

impl Words {
    /// The id of `word`, if it is interned.
    fn id(&self, word: &str) -> Option<u32> {
        self.find(self.hasher.hash_one(word), word)
    }

    /// The id of `word`, whose hash is `hash`, if it is interned.
    fn find(&self, hash: u64, word: &str) -> Option<u32> {
        let names = &self.names;
        self.ids
            .find(hash, |&id| name_of(names, id) == word)
            .copied()
    }

    fn intern(&mut self, word: &str) -> u32 {
        let hash = self.hasher.hash_one(word);
        if let Some(id) = self.find(hash, word) {
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.names[id as usize] = word.into();
                id
            }
            None => {
                self.names.push(word.into());
                self.df.push(0);
                u32::try_from(self.names.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let (names, hasher) = (&self.names, &self.hasher);
        self.ids
            .insert_unique(hash, id, |&id| hasher.hash_one(name_of(names, id)));
        self.name_bytes += word.len();
        id
    }

    /// One fewer live span uses word `id`; forgotten when none does.
    fn release(&mut self, id: u32) {
        let at = id as usize;
        // A word no span uses was forgotten already: its id is free.
        let Some(df) = self.df.get_mut(at).filter(|df| **df > 0) else {
            return;
        };
        *df -= 1;
        if *df == 0 {
            let name = std::mem::take(&mut self.names[at]);
            self.name_bytes = self.name_bytes.saturating_sub(name.len());
            if let Ok(entry) = self
                .ids
                .find_entry(self.hasher.hash_one(&*name), |&i| i == id)
            {
                entry.remove();
            }
            self.free.push(id);
        }
    }
}

/// The name of word `id` in `names` ("" for an id it does not hold, or a
/// forgotten word's).
fn name_of(names: &[Box<str>], id: u32) -> &str {
    names.get(id as usize).map_or("", |n| n)
}

/// What is derived once from each of a session's live spans, in prompt
/// order, with the totals relevance needs. See the module documentation.
#[derive(Clone, Default)]
pub struct LiveFacts {
    spans: Vec<SpanFacts>,
    /// Each span's row, in the same order.
    rows: Vec<LiveRow>,
    words: Words,
    /// Sum of every live span's length in words.
    total_words: u64,
    /// Sum of the spans' `data` lengths, kept as they come and go, so that
    /// [`LiveFacts::heap_bytes`] costs nothing per span.
    data_pairs: usize,
}

impl fmt::Debug for LiveFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveFacts")
            .field("spans", &self.spans.len())
            .field("words", &self.words.ids.len())
            .field("total_words", &self.total_words)
            .finish()
    }
}

impl LiveFacts {
    /// The facts of `spans`, derived from their text.
    pub fn of(spans: &[Span]) -> LiveFacts {
        LiveFacts::of_seeded(spans, &[])
    }

    /// The facts of `spans`, each read from its seed (`seeds[k]` for
    /// `spans[k]`, see [`seed`]) where it has one that fits its text,
    /// else derived from its text.
    pub fn of_seeded(spans: &[Span], seeds: &[Option<Box<[u8]>>]) -> LiveFacts {
        let mut facts = LiveFacts::default();
        facts.spans.reserve(spans.len());
        facts.rows.reserve(spans.len());
        for (k, s) in spans.iter().enumerate() {
            let seed = seeds.get(k).and_then(Option::as_deref);
            let f = facts.derive_from(s, seed);
            facts.spans.push(f);
            facts.rows.push(LiveRow::of(s));
        }
        facts
    }

    /// How many spans these are the facts of.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether these are the facts of no span.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The bytes these facts hold on the heap, about: what a session's
    /// memory bound should count next to its spans. Kept as spans and
    /// words come and go: it costs nothing per span.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let spans = self.spans.capacity() * size_of::<SpanFacts>()
            + self.rows.capacity() * size_of::<LiveRow>()
            + self.data_pairs * size_of::<(u32, u32)>();
        spans + self.words_heap_bytes(self.words.name_bytes)
    }

    /// [`LiveFacts::heap_bytes`] counted afresh, span by span and word by
    /// word: what the kept counts must equal.
    #[cfg(test)]
    fn heap_bytes_recounted(&self) -> usize {
        use std::mem::size_of;
        let spans = self.spans.capacity() * size_of::<SpanFacts>()
            + self.rows.capacity() * size_of::<LiveRow>()
            + self
                .spans
                .iter()
                .map(|f| f.data.len() * size_of::<(u32, u32)>())
                .sum::<usize>();
        let names: usize = self.words.names.iter().map(|n| n.len()).sum();
        spans + self.words_heap_bytes(names)
    }

    /// The words' share of [`LiveFacts::heap_bytes`], given the bytes of
    /// their names.
    fn words_heap_bytes(&self, names: usize) -> usize {
        use std::mem::size_of;
        // Each word is held once (by id), with its index entry, id and
        // document frequency.
        names
            + self.words.ids.capacity() * (size_of::<u32>() + 1)
            + self.words.names.capacity() * size_of::<Box<str>>()
            + self.words.df.capacity() * size_of::<u32>()
            + self.words.free.capacity() * size_of::<u32>()
    }

    /// Whether these are the facts of `spans`: the same spans, by id and
    /// text length, in the same order, each row a copy of its span. Costs
    /// one comparison per span.
    pub fn describes(&self, spans: &[Span]) -> bool {
        self.spans.len() == spans.len()
            && self.rows.len() == spans.len()
            && self
                .spans
                .iter()
                .zip(&self.rows)
                .zip(spans)
                .all(|((f, r), s)| f.id == s.id && f.text_len == s.text.len() && r.copies(s))
    }

    /// Each span's row, in prompt order.
    pub(crate) fn rows(&self) -> &[LiveRow] {
        &self.rows
    }

    /// Derives the facts of `span`, counting its words in the totals.
    fn derive(&mut self, span: &Span) -> SpanFacts {
        // About one distinct counted word per eight bytes of a short text,
        // so the list is rarely moved as it grows; a long text repeats its
        // words, and its list grows past the cap as it needs.
        let mut terms: Vec<(u32, u32)> = Vec::with_capacity((span.text.len() / 8).clamp(4, 512));
        let mut at: FastMap<u32, usize> = fasthash::map(0);
        let words = for_each_counted_word(&span.text, |w| {
            let id = self.words.intern(w);
            // Few spans have many distinct words: look them up in a map
            // only past a handful.
            let found = if terms.len() <= 16 {
                terms.iter().position(|&(t, _)| t == id)
            } else {
                at.get(&id).copied()
            };
            match found {
                Some(k) => terms[k].1 = terms[k].1.saturating_add(1),
                None => {
                    if terms.len() == 16 {
                        at.extend(terms.iter().enumerate().map(|(k, &(t, _))| (t, k)));
                    }
                    if terms.len() >= 16 {
                        at.insert(id, terms.len());
                    }
                    terms.push((id, 1));
                }
            }
        });
        for &(id, _) in &terms {
            if let Some(df) = self.words.df.get_mut(id as usize) {
                *df = df.saturating_add(1);
            }
        }
        self.total_words += u64::from(words);
        let count = u32::try_from(terms.len()).unwrap_or(u32::MAX);
        let addressable = u32::try_from(span.text.len()).is_ok();
        if span.summary.is_none() && addressable {
            terms.extend(
                anchor_ranges(&span.text)
                    .into_iter()
                    .filter_map(|(a, b)| Some((u32::try_from(a).ok()?, u32::try_from(b).ok()?))),
            );
        }
        self.data_pairs += terms.len();
        SpanFacts {
            id: span.id,
            text_len: span.text.len(),
            words,
            terms: count,
            data: terms.into_boxed_slice(),
            anchors_in_text: span.summary.is_none() && !addressable,
        }
    }

    /// The facts of `span`, read from `seed` when it has one that fits
    /// its text, else derived from the text; counted in the totals.
    fn derive_from(&mut self, span: &Span, seed: Option<&[u8]>) -> SpanFacts {
        match seed.and_then(|seed| seed::read(seed, span)) {
            Some(read) => self.derive_read(span, read),
            None => self.derive(span),
        }
    }

    /// The facts of `span` from its seed, read: what [`LiveFacts::derive`]
    /// finds in the text, without reading it again.
    fn derive_read(&mut self, span: &Span, read: seed::Read) -> SpanFacts {
        let mut data: Vec<(u32, u32)> = Vec::with_capacity(read.terms.len() + read.anchors.len());
        let mut from = 0;
        for &(end, count) in &read.terms {
            let id = self
                .words
                .intern(read.names.get(from..end).unwrap_or_default());
            from = end;
            data.push((id, count));
            if let Some(df) = self.words.df.get_mut(id as usize) {
                *df = df.saturating_add(1);
            }
        }
        self.total_words += u64::from(read.words);
        let terms = u32::try_from(data.len()).unwrap_or(u32::MAX);
        data.extend(read.anchors);
        self.data_pairs += data.len();
        SpanFacts {
            id: span.id,
            text_len: span.text.len(),
            words: read.words,
            terms,
            data: data.into_boxed_slice(),
            anchors_in_text: false,
        }
    }

    /// Takes a span's facts out of the totals.
    fn forget(words: &mut Words, total_words: &mut u64, data_pairs: &mut usize, f: &SpanFacts) {
        *total_words = total_words.saturating_sub(u64::from(f.words));
        *data_pairs = data_pairs.saturating_sub(f.data.len());
        for &(id, _) in f.terms() {
            words.release(id);
        }
    }

    /// Span `span` joins the live context at index `at`, with its seed
    /// when it has one.
    pub(crate) fn insert(&mut self, at: usize, span: &Span, seed: Option<&[u8]>) {
        let f = self.derive_from(span, seed);
        self.spans.insert(at.min(self.spans.len()), f);
        self.rows.insert(at.min(self.rows.len()), LiveRow::of(span));
    }

    /// Span `span` joins the live context at its end, with its seed when
    /// it has one.
    pub(crate) fn push(&mut self, span: &Span, seed: Option<&[u8]>) {
        let f = self.derive_from(span, seed);
        self.spans.push(f);
        self.rows.push(LiveRow::of(span));
    }

    /// The span at index `at` now stands as `span`.
    pub(crate) fn replace(&mut self, at: usize, span: &Span) {
        let f = self.derive(span);
        if let Some(row) = self.rows.get_mut(at) {
            *row = LiveRow::of(span);
        }
        if let Some(old) = self.spans.get_mut(at) {
            let old = std::mem::replace(old, f);
            LiveFacts::forget(
                &mut self.words,
                &mut self.total_words,
                &mut self.data_pairs,
                &old,
            );
        }
    }

    /// Keeps the facts of the spans for which `keep` (by index) is true.
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        for (f, &kept) in self.spans.iter().zip(keep) {
            if !kept {
                LiveFacts::forget(
                    &mut self.words,
                    &mut self.total_words,
                    &mut self.data_pairs,
                    f,
                );
            }
        }
        crate::retain_kept(&mut self.spans, keep);
        crate::retain_kept(&mut self.rows, keep);
    }

    /// Calls `f` with each anchor span `live[at]` obliges a summary to
    /// carry, as [`required_anchors`] gives them: a summary's recorded
    /// anchors, or the anchors of an original span's text, read from the
    /// facts.
    pub(crate) fn for_each_anchor(&self, live: &[Span], at: usize, mut f: impl FnMut(&str)) {
        let Some(span) = live.get(at) else {
            return;
        };
        match (&span.summary, self.spans.get(at)) {
            (Some(info), _) => info.anchors.iter().for_each(|a| f(a)),
            (None, Some(facts)) if facts.id == span.id && !facts.anchors_in_text => {
                for &(start, end) in facts.anchors() {
                    if let Some(a) = span.text.get(start as usize..end as usize) {
                        f(a);
                    }
                }
            }
            (None, _) => required_anchors(span).iter().for_each(|a| f(a)),
        }
    }

    /// The anchors the spans `live[at]`, for each `at` in turn, owe a
    /// summary: read from `facts` when they describe `live`, else
    /// extracted from the text.
    pub(crate) fn owed_anchors(
        facts: Option<&LiveFacts>,
        live: &[Span],
        at: impl ExactSizeIterator<Item = usize>,
    ) -> OwedAnchors {
        let mut owed = OwedAnchors::with_capacity(at.len());
        for i in at {
            match facts {
                Some(f) => f.for_each_anchor(live, i, |a| owed.add(a)),
                None => {
                    if let Some(span) = live.get(i) {
                        for a in required_anchors(span) {
                            owed.add(&a);
                        }
                    }
                }
            }
        }
        owed
    }

    /// BM25 of each of the `n` live spans against the query's distinct
    /// `terms` (lower-cased, in order of first appearance), normalised by
    /// the best: what [`relevance::score`] computes from the text, from
    /// the facts alone.
    pub(crate) fn similarity(&self, n: usize, terms: &[String]) -> Vec<f64> {
        let mut raw = vec![0.0f64; n];
        if terms.is_empty() || n == 0 || self.spans.len() != n {
            return raw;
        }
        // Each query term's index, by word id; words no span uses match
        // nothing.
        const NONE: u32 = u32::MAX;
        let mut query = vec![NONE; self.words.names.len()];
        let count = n as f64;
        let mut idf = Vec::with_capacity(terms.len());
        for t in terms {
            if let Some(id) = self.words.id(t.as_str()) {
                let df = self.words.df.get(id as usize).copied().unwrap_or(0);
                query[id as usize] = u32::try_from(idf.len()).unwrap_or(NONE);
                idf.push(relevance::idf(count, df));
            }
        }
        if idf.is_empty() {
            return raw;
        }
        let avg = (self.total_words as f64 / count).max(1.0);
        for (score, f) in raw.iter_mut().zip(&self.spans) {
            let mut norm = None;
            for &(id, tf) in f.terms() {
                let q = query.get(id as usize).copied().unwrap_or(NONE);
                if q == NONE {
                    continue;
                }
                let norm = *norm.get_or_insert_with(|| relevance::length_norm(f.words, avg));
                *score += relevance::term_weight(idf[q as usize], tf, norm);
            }
        }
        relevance::normalise(&mut raw);
        raw
    }

    /// The facts in a form that does not depend on the order words were
    /// interned in: per span its id, text length, length, words with
    /// counts and anchor ranges; each interned word's document frequency
    /// (a forgotten word is not listed, one still interned that no span
    /// uses is listed with 0), and the total length. Facts kept up to date
    /// compare equal this way to facts derived afresh from the same spans.
    #[cfg(test)]
    pub(crate) fn canonical(&self) -> Canonical {
        let name = |id: u32| self.words.names[id as usize].to_string();
        let spans = self
            .spans
            .iter()
            .map(|f| {
                (
                    f.id,
                    f.text_len,
                    f.words,
                    f.terms().iter().map(|&(t, c)| (name(t), c)).collect(),
                    f.anchors()
                        .iter()
                        .map(|&(a, b)| (a as usize, b as usize))
                        .collect(),
                )
            })
            .collect();
        let mut df: Vec<(String, u32)> = self
            .words
            .ids
            .iter()
            .map(|&id| (name(id), self.words.df[id as usize]))
            .collect();
        df.sort();
        Canonical {
            spans,
            rows: self.rows.iter().map(CanonicalRow::of).collect(),
            df,
            total_words: self.total_words,
        }
    }
}

/// [`LiveFacts::canonical`].
#[cfg(test)]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Canonical {
    pub(crate) spans: Vec<CanonicalSpan>,
    pub(crate) rows: Vec<CanonicalRow>,
    pub(crate) df: Vec<(String, u32)>,
    pub(crate) total_words: u64,
}

/// One span of [`Canonical`]: id, text length, length in words, words
/// with counts, anchor ranges.
#[cfg(test)]
pub(crate) type CanonicalSpan = (SpanId, usize, u32, Vec<(String, u32)>, Vec<(usize, usize)>);

/// One row of [`Canonical`], field by field, the hint by its bits.
#[cfg(test)]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CanonicalRow {
    id: SpanId,
    position: u64,
    turn: u64,
    hint: u64,
    tokens: u32,
    class: SpanClass,
    summarises: bool,
}

#[cfg(test)]
impl CanonicalRow {
    fn of(r: &LiveRow) -> CanonicalRow {
        CanonicalRow {
            id: r.id,
            position: r.position,
            turn: r.turn,
            hint: r.hint.to_bits(),
            tokens: r.tokens,
            class: r.class,
            summarises: r.summarises,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;
    use crate::planner::{PlanInput, apply, plan, plan_with};
    use crate::relevance::{RelevanceWeights, score, score_with};
    use crate::session::{Change, Incoming, Session};
    use crate::span::{ClassSource, Classification, Role, SummaryInfo};
    use crate::tokens::{ByteLength, TokenCounter};
    use crate::verify::{verify, verify_with};

    use crate::testing::Rng;

    const WORDS: &[&str] = &[
        "deploy",
        "Deploy",
        "STAGING",
        "staging",
        "the",
        "a",
        "x",
        "src/main.rs",
        "error[E0308]: mismatched types",
        "`cargo test`",
        "30s",
        "512 MiB",
        "v1.2.3",
        "straße",
        "STRASSE",
        "ÄÖÜ",
        "\u{212a}elvin",
        "kelvin",
        "naïve",
        "12",
        "7",
        "retry_policy",
        "FAILED: connection refused",
        "eu-west-1",
        "and",
        "🦀",
    ];

    fn text(rng: &mut Rng) -> String {
        let n = 1 + rng.index(24);
        let mut out = String::new();
        for k in 0..n {
            if k > 0 {
                out.push_str(if rng.index(6) == 0 { "\n" } else { " " });
            }
            out.push_str(WORDS[rng.index(WORDS.len())]);
        }
        out
    }

    fn incoming(rng: &mut Rng) -> Incoming {
        let text = text(rng);
        let constraint = rng.index(8) == 0;
        let (role, class) = match rng.index(4) {
            0 if constraint => (Role::User, SpanClass::Constraint),
            0 => (Role::User, SpanClass::Narrative),
            1 => (Role::Assistant, SpanClass::Narrative),
            _ => (Role::Tool, SpanClass::Narrative),
        };
        Incoming {
            role,
            tokens: ByteLength.count(&text),
            classification: Classification {
                class,
                source: ClassSource::Caller,
                rule: String::new(),
            },
            text,
            predicate: None,
            relevance_hint: (rng.index(5) == 0).then(|| rng.index(100) as f64 / 100.0),
            unclassified: false,
            attributes: (rng.index(6) == 0).then(|| {
                Box::new(crate::span::Attributes {
                    tool_call_id: format!("call_{}", rng.index(4)),
                    ..Default::default()
                })
            }),
        }
    }

    /// A change that does what the store would adopt, whatever its
    /// counters: evicts `evict`, rewrites `replace`.
    fn edit(session: &Session, evict: Vec<SpanId>, replace: Vec<Span>) -> Change {
        Change {
            expected_revision: session.record.revision,
            record: session.record.clone(),
            append: Vec::new(),
            evict,
            summary: None,
            replace,
            marker: None,
        }
    }

    /// The record's totals made to follow the live context again after an
    /// [`edit`].
    fn retotal(session: &mut Session) {
        let r = &mut session.record;
        r.live_spans = session.spans.len() as u64;
        r.live_tokens = session.spans.iter().map(|s| u64::from(s.tokens)).sum();
        let pinned = session.spans.iter().filter(|s| s.is_pinned());
        r.pinned_spans = pinned.clone().count() as u64;
        r.pinned_tokens = pinned.map(|s| u64::from(s.tokens)).sum();
    }

    /// Evicts one to `most` random live spans outright (an id drawn twice
    /// is evicted once), the totals made to follow.
    fn evict_some(session: &mut Session, rng: &mut Rng, most: usize) {
        let evict: Vec<SpanId> = (0..1 + rng.index(most))
            .map(|_| session.spans[rng.index(session.spans.len())].id)
            .collect();
        let change = edit(session, evict, Vec::new());
        session.apply(&change);
        retotal(session);
    }

    /// Rewrites a random live span in place with a new text, as a
    /// compressed form is, the totals made to follow.
    fn rewrite_one(session: &mut Session, rng: &mut Rng) {
        let mut span = session.spans[rng.index(session.spans.len())].clone();
        span.text = text(rng);
        span.tokens = ByteLength.count(&span.text);
        let change = edit(session, Vec::new(), vec![span]);
        session.apply(&change);
        retotal(session);
    }

    fn check(session: &mut Session, rng: &mut Rng, step: usize) {
        assert!(session.facts().is_some(), "step {step}: not derived");
        let kept = session
            .current_facts()
            .expect("the facts describe the spans");
        let fresh = LiveFacts::of(&session.spans);
        let canonical = kept.canonical();
        assert_eq!(canonical, fresh.canonical(), "step {step}");
        assert_eq!(
            kept.heap_bytes(),
            kept.heap_bytes_recounted(),
            "step {step}"
        );
        assert!(
            canonical.df.iter().all(|&(_, df)| df > 0),
            "step {step}: a word no live span uses is still interned"
        );
        // Relevance from the facts is relevance from the text, bit for bit.
        let query = text(rng);
        let weights = RelevanceWeights::default();
        let turn = session.record.turns + 1;
        let from_text = score(&session.spans, &query, turn, &weights);
        let from_facts = score_with(&session.spans, kept, &query, turn, &weights);
        assert_eq!(
            from_text.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
            from_facts.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
            "step {step}, query {query:?}"
        );
        assert_eq!(session.clone().relevance(), {
            let mut latest = Session::new(session.record.clone(), session.spans.clone());
            latest.relevance()
        });
        // A plan made with the facts is the plan made from the text, and
        // so is its verdict.
        let mut config = session.record.config.clone();
        config.window_tokens = config
            .window_tokens
            .min(u32::try_from(session.record.live_tokens / 2 + 64).unwrap_or(u32::MAX));
        let input = PlanInput {
            config: &config,
            live: &session.spans,
            incoming_tokens: 40,
            query: &query,
            turn,
            next_span_id: session.record.next_span_id,
            now_ms: 99,
            target_tokens: None,
            held_tool_calls: &[],
        };
        let with = plan_with(&input, Some(kept), &ByteLength);
        let without = plan(&input, &ByteLength);
        assert_eq!(with, without, "step {step}");
        let post = apply(&session.spans, &with);
        assert_eq!(
            verify_with(
                &session.spans,
                Some(kept),
                &with,
                &post,
                40,
                &config,
                &ByteLength
            ),
            verify(&session.spans, &with, &post, 40, &config, &ByteLength),
            "step {step}"
        );
        // The anchors each span owes, read or extracted.
        let all = 0..session.spans.len();
        let read = LiveFacts::owed_anchors(Some(kept), &session.spans, all.clone());
        let extracted = LiveFacts::owed_anchors(None, &session.spans, all);
        assert_eq!(read.list, extracted.list, "step {step}");
        for (i, span) in session.spans.iter().enumerate() {
            let mut one = Vec::new();
            kept.for_each_anchor(&session.spans, i, |a| one.push(a.to_owned()));
            assert_eq!(one, required_anchors(span), "step {step}, span {}", span.id);
        }
    }

    /// After random admissions (compacting as the budget requires),
    /// evictions and rewrites, the facts a session keeps up to date are the
    /// facts derived afresh from its spans, and relevance and anchors read
    /// from them are those computed from the text.
    #[test]
    fn kept_facts_equal_facts_derived_afresh() {
        let mut rng = Rng(0x5eed_cafe_f00d_0001);
        let config = SessionConfig::with_window(2_500);
        let mut session = Session::create("facts", config, 1);
        let mut compactions = 0;
        for step in 0..400 {
            let now = 10 + step as u64;
            match rng.index(10) {
                // Evict a few spans outright.
                0 if !session.spans.is_empty() => evict_some(&mut session, &mut rng, 3),
                // Rewrite a span in place, as a compressed form is.
                1 if !session.spans.is_empty() => rewrite_one(&mut session, &mut rng),
                _ => {
                    let turn: Vec<Incoming> =
                        (0..1 + rng.index(3)).map(|_| incoming(&mut rng)).collect();
                    if let Ok(change) = session.admit(turn, now, &ByteLength) {
                        compactions += usize::from(change.summary.is_some());
                        session.apply(&change);
                    }
                }
            }
            check(&mut session, &mut rng, step);
        }
        assert!(compactions >= 5, "only {compactions} compactions");
        assert!(
            session.spans.iter().any(|s| s.summary.is_some()),
            "a summary stands among the live spans"
        );
    }

    /// A session loaded from its stored state derives no facts while its
    /// turns fit; the first turn that must be compacted derives them, and
    /// from then on they are kept up to date as they were derived afresh.
    #[test]
    fn a_loaded_session_derives_its_facts_when_a_compaction_needs_them() {
        let mut rng = Rng(0x5eed_cafe_f00d_0002);
        let mut built = Session::create("lazy", SessionConfig::with_window(2_500), 1);
        for step in 0..30 {
            let turn = vec![incoming(&mut rng)];
            if let Ok(change) = built.admit(turn, 10 + step, &ByteLength) {
                built.apply(&change);
            }
        }
        let mut session = Session::new(built.record.clone(), built.spans.clone());
        assert!(session.derived_facts().is_none(), "derived at load");
        let mut step = 100;
        while session.derived_facts().is_none() {
            step += 1;
            assert!(step < 1_000, "no turn ever needed a compaction");
            let turn = vec![incoming(&mut rng)];
            let change = session.admit(turn, step, &ByteLength).expect("admitted");
            let compacted = change.summary.is_some() || !change.evict.is_empty();
            assert_eq!(
                session.derived_facts().is_some(),
                compacted,
                "turn {step}: facts derived for a turn that fits, or not for a compaction"
            );
            session.apply(&change);
        }
        for _ in 0..20 {
            step += 1;
            let change = session
                .admit(vec![incoming(&mut rng)], step, &ByteLength)
                .expect("admitted");
            session.apply(&change);
            check(&mut session, &mut rng, step as usize);
        }
    }

    /// Once derived, the facts take in the turns that fit only when a
    /// compaction next needs them: admitting such a turn derives nothing.
    /// Whatever comes in between — long turns with their seeds, the
    /// newest spans taken back, evictions and rewrites — the facts then
    /// derived are those derived from the text, the facts are never out
    /// of step (which would drop them), and the seeds waiting are counted
    /// as they come and go.
    #[test]
    fn the_facts_of_turns_that_fit_wait_for_the_next_compaction() {
        let mut rng = Rng(0x5eed_cafe_f00d_0007);
        let mut session = Session::create("tail", SessionConfig::with_window(6_000), 1);
        let (mut waited, mut compactions, mut long, mut held) = (0, 0, 0, 0);
        for step in 0..600u64 {
            let derived = session.derived_facts().map_or(0, LiveFacts::len);
            match rng.index(12) {
                0 if session.spans.len() > 2 => {
                    let back = session
                        .retract(1 + rng.index(2), 10 + step)
                        .expect("the newest spans can be taken back");
                    session.apply_retraction(&back);
                }
                1 if !session.spans.is_empty() => evict_some(&mut session, &mut rng, 2),
                2 if !session.spans.is_empty() => rewrite_one(&mut session, &mut rng),
                3 => check(&mut session, &mut rng, step as usize),
                _ => {
                    let mut turn = incoming(&mut rng);
                    if rng.index(5) == 0 {
                        while turn.text.len() < SEED_MIN_BYTES {
                            turn.text = format!("{} {}", turn.text, text(&mut rng));
                        }
                        turn.tokens = ByteLength.count(&turn.text);
                        long += 1;
                    }
                    let Ok(change) = session.admit(vec![turn], 10 + step, &ByteLength) else {
                        continue;
                    };
                    let fits = change.summary.is_none() && change.evict.is_empty();
                    if fits {
                        assert_eq!(
                            session.derived_facts().map_or(0, LiveFacts::len),
                            derived,
                            "step {step}: a turn that fits derived facts"
                        );
                        waited += usize::from(session.spans.len() > derived);
                    } else {
                        compactions += 1;
                    }
                    session.apply_seeded(&change, &seeds_of(&change));
                }
            }
            assert_eq!(
                session.seed_bytes(),
                session.seed_bytes_recounted(),
                "step {step}"
            );
            // Kept in step throughout: never dropped to be derived afresh.
            assert!(session.derived_facts().is_some(), "step {step}: dropped");
            held += usize::from(session.seed_bytes() > 0);
        }
        check(&mut session, &mut rng, 600);
        assert!(
            waited > 100 && compactions > 5 && long > 20 && held > 20,
            "{waited} waited, {compactions} compactions, {long} long turns, {held} steps with seeds waiting"
        );
    }

    /// The seeds of a change's new spans, as the store keeps them.
    fn seeds_of(change: &Change) -> Vec<(SpanId, Vec<u8>)> {
        change
            .summary
            .iter()
            .chain(&change.append)
            .filter_map(|s| Some((s.id, seed::seed_of(s)?)))
            .collect()
    }

    /// A session loaded with its spans' seeds reads its facts from them:
    /// through turns that fit, evictions and rewrites applied before the
    /// facts are derived, and through compactions after, the facts equal
    /// those derived from the text. A span's seed is read rather than its
    /// text (a seed of another text that fits shows through), and a
    /// rewritten span's text is read rather than its old seed.
    #[test]
    fn a_session_loaded_with_seeds_reads_its_facts_from_them() {
        let mut rng = Rng(0x5eed_cafe_f00d_0004);
        let mut built = Session::create("seeded", SessionConfig::with_window(2_500), 1);
        for step in 0..30 {
            if let Ok(change) = built.admit(vec![incoming(&mut rng)], 10 + step, &ByteLength) {
                built.apply(&change);
            }
        }
        let seeds: Vec<Option<Box<[u8]>>> = built
            .spans
            .iter()
            .map(|s| seed::seed_of(s).map(Vec::into_boxed_slice))
            .collect();
        // Without a seed among them, a session keeps no slot per span.
        let none = vec![None; built.spans.len()];
        let unseeded = Session::with_seeds(built.record.clone(), built.spans.clone(), none);
        assert_eq!(unseeded.seed_bytes(), 0);
        let mut session = Session::with_seeds(built.record.clone(), built.spans.clone(), seeds);
        assert!(session.seed_bytes() > 0);
        let mut step = 100;
        // Turns that fit, an eviction and a rewrite, before any derivation.
        for _ in 0..3 {
            step += 1;
            let change = session
                .admit(vec![incoming(&mut rng)], step, &ByteLength)
                .expect("admitted");
            session.apply_seeded(&change, &seeds_of(&change));
            assert_eq!(session.seed_bytes(), session.seed_bytes_recounted());
        }
        assert!(session.derived_facts().is_none() && session.spans.len() > 3);
        let evict = vec![session.spans[1].id];
        session.apply(&edit(&session, evict, Vec::new()));
        retotal(&mut session);
        let mut span = session.spans[2].clone();
        span.text = "rewritten: Deploy to STAGING from /srv/app/release.tar".to_owned();
        span.tokens = ByteLength.count(&span.text);
        session.apply(&edit(&session, Vec::new(), vec![span]));
        retotal(&mut session);
        assert!(
            session.derived_facts().is_none(),
            "derived before any compaction"
        );
        assert!(session.seed_bytes() > 0);
        check(&mut session, &mut rng, step as usize);
        assert_eq!(
            session.seed_bytes(),
            0,
            "seeds counted once the facts are derived"
        );
        for _ in 0..40 {
            step += 1;
            let change = session
                .admit(vec![incoming(&mut rng)], step, &ByteLength)
                .expect("admitted");
            session.apply_seeded(&change, &seeds_of(&change));
            check(&mut session, &mut rng, step as usize);
        }
        // A seed that fits its span but was made from another text is
        // what the facts hold: the seed is read, not the text.
        let mut spans = vec![crate::testing::admitted(1, 1, Role::User, "alpha beta")];
        let other = crate::testing::admitted(1, 1, Role::User, "alpha alpha");
        let seeds = vec![seed::seed_of(&other).map(Vec::into_boxed_slice)];
        let mut spoofed = Session::with_seeds(session.record.clone(), spans.clone(), seeds);
        let read = spoofed.facts().expect("facts").canonical();
        assert_eq!(read.spans[0].3, vec![("alpha".to_owned(), 2)]);
        // Rewritten in place, the span's own text is read.
        spans[0].text = "gamma beta".to_owned();
        let mut rewritten = spoofed.clone();
        let change = edit(&rewritten, Vec::new(), spans.clone());
        rewritten.apply(&change);
        let read = rewritten.facts().expect("facts").canonical();
        assert_eq!(
            read.spans[0].3,
            vec![("gamma".to_owned(), 1), ("beta".to_owned(), 1)]
        );
    }

    /// The rows a session keeps, through random admissions (hints not
    /// finite among them, the tier's class too), compactions, evictions
    /// and rewrites, are the rows copied afresh from its spans.
    #[test]
    fn kept_rows_equal_rows_copied_afresh() {
        let mut rng = Rng(0x5eed_cafe_f00d_0003);
        let mut session = Session::create("rows", SessionConfig::with_window(2_000), 1);
        let mut compactions = 0;
        let mut met = [false; 3];
        for step in 0..600 {
            let now = 10 + step as u64;
            match rng.index(8) {
                0 if !session.spans.is_empty() => evict_some(&mut session, &mut rng, 4),
                1 if !session.spans.is_empty() => rewrite_one(&mut session, &mut rng),
                _ => {
                    let turn: Vec<Incoming> = (0..1 + rng.index(3))
                        .map(|_| {
                            let mut i = incoming(&mut rng);
                            match rng.index(6) {
                                0 => i.relevance_hint = Some(f64::NAN),
                                1 => i.relevance_hint = Some(f64::INFINITY),
                                2 if i.role == Role::User => {
                                    i.classification.class = SpanClass::Protected;
                                }
                                _ => {}
                            }
                            i
                        })
                        .collect();
                    if let Ok(change) = session.admit(turn, now, &ByteLength) {
                        compactions += usize::from(change.summary.is_some());
                        session.apply(&change);
                    }
                }
            }
            met[0] |= session.spans.iter().any(|s| s.summary.is_some());
            met[1] |= session.spans.iter().any(|s| s.is_protected());
            met[2] |= session
                .spans
                .iter()
                .any(|s| s.relevance_hint == Some(f64::INFINITY));
            assert!(session.facts().is_some(), "step {step}: not derived");
            let kept = session
                .current_facts()
                .expect("the facts describe the spans");
            let fresh = LiveFacts::of(&session.spans);
            assert_eq!(kept.canonical().rows, fresh.canonical().rows, "step {step}");
            assert_eq!(kept.rows().len(), session.spans.len(), "step {step}");
            for (row, span) in kept.rows().iter().zip(&session.spans) {
                assert!(row.copies(span), "step {step}: span {}", span.id);
                assert_eq!(row.hint(), span.relevance_hint.filter(|h| h.is_finite()));
            }
        }
        assert!(compactions >= 5, "only {compactions} compactions");
        assert_eq!(
            met, [true; 3],
            "the rows met summaries, the tier and hints that are not finite"
        );
    }

    /// A span changed outside the session's operations in any field its
    /// row copies makes the facts unused.
    #[test]
    fn facts_whose_rows_differ_from_a_span_are_not_used() {
        let mut spans: Vec<Span> = (1..=4)
            .map(|id| crate::testing::admitted(id, id, Role::Tool, "src/a.rs deploy"))
            .collect();
        spans[2].relevance_hint = Some(0.25);
        type Change = fn(&mut Span);
        let changes: [(&str, Change); 8] = [
            ("id", |s| s.id += 100),
            ("position", |s| s.position += 100),
            ("turn", |s| s.turn += 1),
            ("tokens", |s| s.tokens += 1),
            ("class", |s| s.classification.class = SpanClass::Protected),
            ("summary", |s| s.summary = Some(SummaryInfo::default())),
            ("hint", |s| s.relevance_hint = Some(0.5)),
            ("no hint", |s| s.relevance_hint = None),
        ];
        let facts = LiveFacts::of(&spans);
        assert!(facts.describes(&spans));
        for (what, change) in changes {
            let mut changed = spans.clone();
            change(&mut changed[2]);
            assert!(!facts.describes(&changed), "{what}");
        }
        // A hint that is not finite reads as none, as relevance reads it.
        let mut changed = spans.clone();
        changed[0].relevance_hint = Some(f64::NAN);
        assert!(facts.describes(&changed));
    }

    #[test]
    fn words_no_span_uses_leave_the_index_and_their_ids_are_reused() {
        let spans: Vec<Span> = [(1, "alpha beta"), (2, "beta gamma"), (3, "delta")]
            .into_iter()
            .map(|(id, text)| crate::testing::admitted(id, id, Role::User, text))
            .collect();
        let mut facts = LiveFacts::of(&spans);
        let interned = |f: &LiveFacts| {
            let mut words: Vec<String> = f
                .words
                .ids
                .iter()
                .map(|&id| f.words.names[id as usize].to_string())
                .collect();
            words.sort();
            words
        };
        assert_eq!(interned(&facts), ["alpha", "beta", "delta", "gamma"]);
        // Span 1 goes: "alpha" is forgotten, "beta" stays (span 2 uses it).
        facts.retain(&[false, true, true]);
        assert_eq!(interned(&facts), ["beta", "delta", "gamma"]);
        assert_eq!(facts.words.id("alpha"), None);
        assert_eq!(facts.words.free.len(), 1);
        // A new word takes the forgotten id, and is found by its name.
        let id = facts.words.intern("epsilon");
        assert!(facts.words.free.is_empty());
        assert_eq!(facts.words.id("epsilon"), Some(id));
        assert_eq!(facts.words.ids.len(), 4);
        assert_eq!(facts.heap_bytes(), facts.heap_bytes_recounted());
    }

    #[test]
    fn heap_bytes_grow_with_the_spans() {
        let spans: Vec<Span> = (1..=50)
            .map(|id| crate::testing::admitted(id, id, Role::Tool, "src/a.rs deploy 30s"))
            .collect();
        let few = LiveFacts::of(&spans[..5]).heap_bytes();
        let all = LiveFacts::of(&spans).heap_bytes();
        assert!(few > 0 && all > few, "{few} {all}");
        assert_eq!(LiveFacts::default().heap_bytes(), 0);
    }

    /// Facts out of step with the spans (changed outside `apply`) are not
    /// used, and the next change adopted derives them afresh.
    #[test]
    fn facts_out_of_step_are_not_used() {
        let spans: Vec<Span> = (1..=4)
            .map(|id| crate::testing::admitted(id, id, Role::Tool, "src/a.rs deploy"))
            .collect();
        let mut session = Session::new(
            crate::session::SessionRecord::new("x", SessionConfig::with_window(1_000), 0),
            spans,
        );
        assert!(session.facts().is_some());
        session.spans.pop();
        assert!(session.facts().is_none());
        let change = edit(&session, vec![1], Vec::new());
        session.apply(&change);
        let facts = session.facts().expect("derived afresh");
        assert_eq!(facts.canonical(), LiveFacts::of(&session.spans).canonical());
    }

    /// A span's terms are its words, lower-cased, in the order of their
    /// first appearance, each with the number of its occurrences, and its
    /// length counts every word, whatever the case or script of the
    /// repeats and however many distinct words it has (past 16, a term's
    /// place is found by a map instead of a scan).
    #[test]
    fn terms_are_the_words_by_first_appearance_with_their_counts() {
        let mut rng = Rng(0x5eed_cafe_f00d_0004);
        for case in 0..400 {
            let mut text = text(&mut rng);
            if case % 2 == 0 {
                // Repeats of the same words, as tool output has, and more
                // distinct words than a scan is used for.
                let numbered: Vec<String> = (0..rng.index(40)).map(|k| format!("w{k}")).collect();
                text = format!(
                    "{text}\n{text} {} {}",
                    text.to_uppercase(),
                    numbered.join(" ")
                );
            }
            let span = crate::testing::admitted(1, 1, Role::Tool, &text);
            let facts = LiveFacts::of(std::slice::from_ref(&span));
            let derived = &facts.spans[0];
            let got: Vec<(String, u32)> = derived
                .terms()
                .iter()
                .map(|&(id, n)| (facts.words.names[id as usize].to_string(), n))
                .collect();
            let mut want: Vec<(String, u32)> = Vec::new();
            let length = for_each_counted_word(&text, |word| {
                match want.iter_mut().find(|(w, _)| w == word) {
                    Some((_, n)) => *n += 1,
                    None => want.push((word.to_owned(), 1)),
                }
            });
            assert_eq!(got, want, "{text:?}");
            assert_eq!(derived.words, length, "{text:?}");
        }
    }
}
