//! Relevance: which narrative goes first when room must be made.
//!
//! Relevance is topical and recent by construction, which is exactly why it
//! must never decide whether a constraint may go: an old, short,
//! off-topic constraint scores lowest of all (the compaction cliff) and is
//! still binding. The planner uses these scores only to order narrative and
//! summaries.
//!
//! # Formula
//!
//! For each span, with components in [0, 1]:
//!
//! - recency `r = 0.5^(age / half_life)`, age in turns
//!   (`current_turn − span.turn`, 0 for spans of the current turn or later);
//! - similarity `s`: BM25 (k1 = 1.2, b = 0.75) of the span against the
//!   query's distinct words, with IDF over the given spans, divided by the
//!   highest score among them (0 for all when nothing matches);
//! - length `l = ln(1 + tokens) / ln(1 + 1024)`, capped at 1: a span with
//!   substance ranks above a one-word acknowledgement;
//!
//! `base = (w_r·r + w_s·s + w_l·l) / (w_r + w_s + w_l)`, and when the
//! caller gave a hint `h`, `score = (1 − w_h)·base + w_h·h`.
//!
//! Words are maximal runs of letters, digits and `_`, lower-cased, of at
//! least two characters; a few function words are ignored. Every span's
//! text is scanned once and only the query's words are looked up, so the
//! cost is linear in the total text. A session keeps each live span's
//! words and their counts ([`crate::facts`]) and scores from those
//! instead ([`score_with`]): the same scores, summed in the same order,
//! at a cost linear in the spans' distinct words, with no text read.

use std::hash::{BuildHasher, Hasher};

use crate::facts::LiveFacts;
use crate::fasthash::{self, FastSet, FastState};
use crate::span::Span;

/// Lengths at or above this many tokens get the full length term.
pub const LENGTH_SATURATION_TOKENS: f64 = 1024.0;

/// Ages and lengths below this are computed once per call.
const MEMO: usize = 1024;

const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;

/// How the components of relevance are blended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RelevanceWeights {
    /// Weight of recency. Default 0.5: in a long-running agent, what was
    /// said a few turns ago is the best predictor of what matters now.
    pub recency: f64,
    /// Weight of lexical similarity to the incoming turn. Default 0.35: a
    /// span about what the turn is about should outlive one that is not.
    pub similarity: f64,
    /// Weight of the length term. Default 0.15: a tie-breaker that lets
    /// tiny acknowledgements go before spans with content.
    pub length: f64,
    /// How much a caller's hint replaces the computed score, in [0, 1].
    /// Default 0.5: the caller knows its task, but a hint alone should not
    /// override a span being recent and on topic.
    pub hint: f64,
    /// Turns after which recency halves. Default 8.
    pub recency_half_life_turns: f64,
}

impl Default for RelevanceWeights {
    fn default() -> Self {
        RelevanceWeights {
            recency: 0.5,
            similarity: 0.35,
            length: 0.15,
            hint: 0.5,
            recency_half_life_turns: 8.0,
        }
    }
}

/// One score in [0, 1] per span, in the same order.
pub fn score(
    spans: &[Span],
    query: &str,
    current_turn: u64,
    weights: &RelevanceWeights,
) -> Vec<f64> {
    blend(
        spans.iter().map(|s| (s.turn, s.tokens, s.relevance_hint)),
        similarity(spans, query),
        current_turn,
        weights,
    )
}

/// [`score`] of a session's live context from what the session keeps of
/// each span (`facts`, which must describe `spans`): the same scores,
/// without reading the spans' text.
pub(crate) fn score_with(
    spans: &[Span],
    facts: &LiveFacts,
    query: &str,
    current_turn: u64,
    weights: &RelevanceWeights,
) -> Vec<f64> {
    // The rows hold what the blend reads of each span.
    blend(
        facts.rows().iter().map(|r| (r.turn, r.tokens, r.hint())),
        facts.similarity(spans.len(), &query_terms(query)),
        current_turn,
        weights,
    )
}

/// Each span's score from its similarity, as the formula blends it, given
/// each span's turn, tokens and hint in order.
fn blend(
    spans: impl Iterator<Item = (u64, u32, Option<f64>)>,
    similarity: Vec<f64>,
    current_turn: u64,
    weights: &RelevanceWeights,
) -> Vec<f64> {
    let w_r = sane(weights.recency);
    let w_s = sane(weights.similarity);
    let w_l = sane(weights.length);
    let w_h = sane(weights.hint).min(1.0);
    let total = w_r + w_s + w_l;
    let half_life = weights.recency_half_life_turns;
    let recency = |age: u64| {
        if half_life.is_finite() && half_life > 0.0 {
            0.5f64.powf(age as f64 / half_life)
        } else if age == 0 {
            1.0
        } else {
            0.0
        }
    };
    let length =
        |tokens: u32| (f64::from(tokens).ln_1p() / LENGTH_SATURATION_TOKENS.ln_1p()).min(1.0);
    // Ages and lengths repeat across a session: compute each small value
    // once.
    let recency_memo: Vec<f64> = (0..MEMO).map(|a| recency(a as u64)).collect();
    let length_memo: Vec<f64> = (0..MEMO).map(|t| length(t as u32)).collect();
    // Each similarity becomes its span's score where it stands.
    let mut scores = similarity;
    let mut last_old: Option<(u64, f64)> = None;
    for ((turn, tokens, hint), slot) in spans.zip(scores.iter_mut()) {
        let s = *slot;
        *slot = {
            let age = current_turn.saturating_sub(turn);
            // Spans of one turn stand together: an older age than the
            // memo holds is computed once per run of them.
            let r = match usize::try_from(age).ok().and_then(|a| recency_memo.get(a)) {
                Some(&r) => r,
                None => match last_old {
                    Some((a, r)) if a == age => r,
                    _ => {
                        let r = recency(age);
                        last_old = Some((age, r));
                        r
                    }
                },
            };
            let l = length_memo
                .get(tokens as usize)
                .copied()
                .unwrap_or_else(|| length(tokens));
            let base = if total > 0.0 {
                (w_r * r + w_s * s + w_l * l) / total
            } else {
                0.0
            };
            let blended = match hint.filter(|h| h.is_finite()) {
                Some(h) => (1.0 - w_h) * base + w_h * h.clamp(0.0, 1.0),
                None => base,
            };
            if blended.is_finite() {
                blended.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
    }
    scores
}

fn sane(w: f64) -> f64 {
    if w.is_finite() && w > 0.0 { w } else { 0.0 }
}

/// Calls `f` with the byte range of each word of `text` (in its own case)
/// and whether the word is all ASCII. Bytes are scanned directly; only
/// non-ASCII characters are decoded.
fn for_each_word(text: &str, mut f: impl FnMut(usize, usize, bool)) {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // Skip to the start of a word.
        while i < b.len() && b[i] < 0x80 && !ASCII_WORD[usize::from(b[i])] {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        if b[i] >= 0x80 && !starts_word(text, i) {
            i += utf8_width(b[i]);
            continue;
        }
        let start = i;
        let mut ascii = true;
        loop {
            while i < b.len() && ASCII_WORD[usize::from(b[i])] {
                i += 1;
            }
            if i < b.len() && b[i] >= 0x80 && starts_word(text, i) {
                ascii = false;
                i += utf8_width(b[i]);
                continue;
            }
            break;
        }
        f(start, i, ascii);
    }
}

/// [`for_each_word`] for a text known to be ASCII: nothing to decode,
/// every word is ASCII. The text is read 64 bytes at a time into a mask of
/// its word bytes, and words are found where the mask changes. `f` gets
/// each word and the offset it starts at.
fn for_each_ascii_word(b: &[u8], mut f: impl FnMut(&[u8], usize)) {
    // The start of the word that runs into the current block.
    let mut open: Option<usize> = None;
    // Whether the byte before the block belongs to a word.
    let mut carry = 0u64;
    for (k, block) in b.chunks(64).enumerate() {
        let base = k * 64;
        let m = word_mask(block);
        let before = (m << 1) | carry;
        let mut starts = m & !before;
        // A byte outside words right after a word byte: the word ends
        // there (past the text's end, the mask is clear).
        let mut ends = !m & before;
        carry = m >> 63;
        while starts | ends != 0 {
            let at = (starts | ends).trailing_zeros();
            let bit = 1u64 << at;
            let at = base + at as usize;
            if ends & bit != 0 {
                ends &= !bit;
                if let Some(start) = open.take() {
                    f(&b[start..at.min(b.len())], start);
                }
            } else {
                starts &= !bit;
                open = Some(at);
            }
        }
    }
    if let Some(start) = open {
        f(&b[start..], start);
    }
}

/// One bit per byte of an ASCII block of at most 64 bytes, set where the
/// byte belongs to a word.
fn word_mask(block: &[u8]) -> u64 {
    let mut m = 0u64;
    for (c, chunk) in block.chunks(8).enumerate() {
        let x = if chunk.len() == 8 {
            load64(chunk, 0)
        } else {
            let mut a = [0u8; 8];
            a[..chunk.len()].copy_from_slice(chunk);
            u64::from_le_bytes(a)
        };
        m |= word_bits8(x) << (8 * c);
    }
    m
}

/// Bit `k` set where byte `k` of eight ASCII bytes is a letter, a digit
/// or `_` (zero bytes are not).
fn word_bits8(x: u64) -> u64 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Bit 7 of each byte: at least `lo` and at most `hi`. No sum carries
    // into the next byte, as every byte is below 0x80.
    let in_range = |v: u64, lo: u8, hi: u8| {
        (v + ONES * u64::from(0x80 - lo)) & !(v + ONES * u64::from(0x7f - hi)) & HIGH
    };
    let letter = in_range(x | (ONES * 0x20), b'a', b'z');
    let digit = in_range(x, b'0', b'9');
    let t = x ^ (ONES * u64::from(b'_'));
    let underscore = !(t + ONES * 0x7f) & HIGH;
    // Gather bit 7 of byte k into bit k.
    (((letter | digit | underscore) >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56
}

/// ASCII bytes that belong to words: letters, digits, `_`.
pub(crate) static ASCII_WORD: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b == b'_';
        c += 1;
    }
    t
};

/// Whether the (non-ASCII) character at byte `i` is alphanumeric.
fn starts_word(text: &str, i: usize) -> bool {
    text.get(i..)
        .and_then(|rest| rest.chars().next())
        .is_some_and(char::is_alphanumeric)
}

/// The length of the UTF-8 sequence a leading byte starts.
fn utf8_width(lead: u8) -> usize {
    match lead {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// Lower-cases a word into `buf`.
fn lower_into(word: &str, ascii: bool, buf: &mut String) {
    buf.clear();
    if ascii {
        buf.push_str(word);
        buf.make_ascii_lowercase();
    } else {
        buf.extend(word.chars().flat_map(char::to_lowercase));
    }
}

/// A word lower-cased: the word itself when it has nothing to lower-case
/// (an ASCII word without capitals, the most common), else its lower-cased
/// form written into `buf`.
pub(crate) fn lowered<'a>(word: &'a str, ascii: bool, buf: &'a mut String) -> &'a str {
    if ascii && !word.bytes().any(|b| b.is_ascii_uppercase()) {
        return word;
    }
    lower_into(word, ascii, buf);
    buf
}

/// Calls `f` with each word of `text` (a word, its start and end) and
/// whether it is all ASCII: [`for_each_word`], read a block at a time when
/// the text is ASCII.
fn for_each_word_of(text: &str, mut f: impl FnMut(&str, usize, usize, bool)) {
    if text.is_ascii() {
        for_each_ascii_word(text.as_bytes(), |w, start| {
            let end = start + w.len();
            if let Some(word) = text.get(start..end) {
                f(word, start, end, true);
            }
        });
    } else {
        for_each_word(text, |start, end, ascii| {
            if let Some(word) = text.get(start..end) {
                f(word, start, end, ascii);
            }
        });
    }
}

/// Calls `f` with each word of `text` that search indexes, lower-cased,
/// and the byte range it came from: the words the similarity counts, and
/// single digits besides, so that `web-1` and `web-2` differ.
pub(crate) fn for_each_term(text: &str, mut f: impl FnMut(&str, usize, usize)) {
    let mut buf = String::new();
    for_each_word_of(text, |word, start, end, ascii| {
        let word = lowered(word, ascii, &mut buf);
        if counts(word) || (word.len() == 1 && word.as_bytes()[0].is_ascii_digit()) {
            f(word, start, end);
        }
    });
}

fn counts(word: &str) -> bool {
    word.len() >= 2 && !is_ignored(word)
}

/// Whether `word` is never used for similarity: too common to tell spans
/// apart, and numerous enough to cost lookups. Matched by length first, so
/// most words are ruled out without a comparison.
fn is_ignored(word: &str) -> bool {
    match word.len() {
        2 => matches!(
            word,
            "to" | "of"
                | "in"
                | "on"
                | "at"
                | "is"
                | "it"
                | "be"
                | "as"
                | "by"
                | "or"
                | "an"
                | "we"
                | "if"
                | "so"
                | "do"
        ),
        3 => matches!(
            word,
            "the" | "and" | "for" | "are" | "was" | "you" | "not" | "but"
        ),
        4 => matches!(word, "this" | "that" | "with" | "from"),
        _ => false,
    }
}

/// The query's distinct terms, looked up by a seeded hash of a word's
/// length and its first and last eight bytes (ASCII letters folded to
/// lower case), so that a span's word is hashed in constant time without
/// being copied or lower-cased first, and most words are rejected by one
/// probe.
struct Terms {
    /// The terms, lower-cased, in order of first appearance.
    words: Vec<String>,
    /// Per first byte, a bit per length (63 for 63 and more) that some
    /// term has: rules out most words before they are hashed.
    shapes: [u64; 256],
    /// Open addressing: (tag, term index + 1), 0 for an empty slot.
    slots: Vec<(u32, u32)>,
    mask: usize,
    /// The per-process seeded hasher of the crate's maps: the terms come
    /// from client text, so colliding words cannot be precomputed.
    state: FastState,
}

impl Terms {
    fn new(words: Vec<String>) -> Terms {
        let size = (words.len() * 4).next_power_of_two().max(16);
        let mut terms = Terms {
            slots: vec![(0, 0); size],
            mask: size - 1,
            words: Vec::new(),
            shapes: [0; 256],
            state: FastState::default(),
        };
        for (i, w) in words.iter().enumerate() {
            if let Some(&first) = w.as_bytes().first() {
                // Under both cases of an ASCII letter, so that a word is
                // looked up by its first byte as it stands.
                let bit = 1 << w.len().min(63);
                terms.shapes[usize::from(first)] |= bit;
                terms.shapes[usize::from(first.to_ascii_uppercase())] |= bit;
            }
            let h = terms.hash(w.as_bytes());
            let mut at = (h as usize) & terms.mask;
            while terms.slots[at].1 != 0 {
                at = (at + 1) & terms.mask;
            }
            terms.slots[at] = ((h >> 32) as u32, i as u32 + 1);
        }
        terms.words = words;
        terms
    }

    /// The index of the term equal to `word` once lower-cased: ASCII
    /// case is folded in the comparison when `fold` is set (the word is
    /// ASCII and not lower-cased yet), otherwise bytes compare exactly.
    #[inline(always)]
    fn find(&self, word: &[u8], fold: bool) -> Option<u32> {
        let first = usize::from(*word.first()?);
        if self.shapes[first] & (1 << word.len().min(63)) == 0 {
            return None;
        }
        self.probe(word, fold)
    }

    /// [`Terms::find`] past the shape filter.
    #[inline(never)]
    fn probe(&self, word: &[u8], fold: bool) -> Option<u32> {
        let h = self.hash(word);
        let tag = (h >> 32) as u32;
        let mut at = (h as usize) & self.mask;
        loop {
            let (t, i) = self.slots[at];
            if i == 0 {
                return None;
            }
            if t == tag {
                let term = self.words[i as usize - 1].as_bytes();
                let equal = if fold {
                    folds_to(word, term)
                } else {
                    term == word
                };
                if equal {
                    return Some(i - 1);
                }
            }
            at = (at + 1) & self.mask;
        }
    }

    /// A seeded hash of a word's length and bytes (all of them up to 16
    /// bytes, the first and last eight beyond), each byte with bit 0x20
    /// set: an ASCII capital hashes like its lower case, so a word and its
    /// lower-cased form hash alike. Constant time, no copy.
    fn hash(&self, w: &[u8]) -> u64 {
        const FOLD: u64 = 0x2020_2020_2020_2020;
        let n = w.len();
        let (head, tail) = if n >= 8 {
            (load64(w, 0), load64(w, n - 8))
        } else if n >= 4 {
            (load32(w, 0), load32(w, n - 4))
        } else if n > 0 {
            let three = u64::from(w[0]) | (u64::from(w[n / 2]) << 8) | (u64::from(w[n - 1]) << 16);
            (three, 0)
        } else {
            (0, 0)
        };
        let mut h = self.state.build_hasher();
        h.write_u64(head | FOLD);
        h.write_u64(tail | FOLD);
        h.write_usize(n);
        h.finish()
    }
}

/// Whether the ASCII `word`, with its capitals lower-cased, is `term`.
fn folds_to(word: &[u8], term: &[u8]) -> bool {
    if word.len() != term.len() {
        return false;
    }
    let n = word.len();
    if (4..=16).contains(&n) {
        // Two overlapping loads from each end cover every byte.
        let (a, b) = if n >= 8 { (0, n - 8) } else { (0, n - 4) };
        let load = |s: &[u8], at: usize| {
            if n >= 8 { load64(s, at) } else { load32(s, at) }
        };
        lower_ascii(load(word, a)) == load(term, a) && lower_ascii(load(word, b)) == load(term, b)
    } else {
        word.eq_ignore_ascii_case(term)
    }
}

/// ASCII capitals lower-cased in eight bytes that are all ASCII.
fn lower_ascii(x: u64) -> u64 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Bit 7 of a byte is set when the byte is at least b'A', and, in the
    // second sum, when it is above b'Z'; no sum carries into the next byte
    // as every byte is below 0x80.
    let at_least_a = x + ONES * (0x80 - u64::from(b'A'));
    let above_z = x + ONES * (0x7f - u64::from(b'Z'));
    let upper = at_least_a & !above_z & HIGH;
    x | (upper >> 2)
}

/// Eight bytes from `at` as a little-endian word.
fn load64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map_or(0, u64::from_le_bytes)
}

/// Four bytes from `at` as a little-endian word.
fn load32(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map_or(0, |a| u64::from(u32::from_le_bytes(a)))
}

/// Calls `f` with each word of `text` that similarity can match,
/// lower-cased, in order, and returns how many words `text` has in all:
/// its length, as BM25 measures it.
pub(crate) fn for_each_counted_word(text: &str, mut f: impl FnMut(&str)) -> u32 {
    for_each_counted_word_at(text, |w, _, _| f(w))
}

/// [`for_each_counted_word`], with the byte range of `text` each word
/// was lower-cased from.
pub(crate) fn for_each_counted_word_at(text: &str, mut f: impl FnMut(&str, usize, usize)) -> u32 {
    let mut len = 0u32;
    let mut buf = String::new();
    for_each_word_of(text, |word, start, end, ascii| {
        len = len.saturating_add(1);
        // Lower-casing ASCII keeps the length: shorter words never count.
        if ascii && word.len() < 2 {
            return;
        }
        let word = lowered(word, ascii, &mut buf);
        if counts(word) {
            f(word, start, end);
        }
    });
    len
}

/// The word `for_each_counted_word_at` gave for the range `start..end` of
/// `text`, lower-cased into `buf`; `false`, with `buf` unspecified, when
/// the range is not one it could give (out of the text, off a character
/// boundary, or a word similarity does not count).
pub(crate) fn counted_word_in(text: &str, start: usize, end: usize, buf: &mut String) -> bool {
    let Some(word) = text.get(start..end) else {
        return false;
    };
    lower_into(word, word.is_ascii(), buf);
    counts(buf)
}

/// The query's distinct words that similarity counts, lower-cased, in
/// order of first appearance.
fn query_terms(query: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut known: FastSet<String> = fasthash::set(16);
    let mut buf = String::new();
    for_each_word(query, |start, end, ascii| {
        lower_into(&query[start..end], ascii, &mut buf);
        if counts(&buf) && !known.contains(buf.as_str()) {
            known.insert(buf.clone());
            words.push(buf.clone());
        }
    });
    words
}

/// BM25's inverse document frequency of a term in `d` of `n` spans.
pub(crate) fn idf(n: f64, d: u32) -> f64 {
    (1.0 + (n - f64::from(d) + 0.5) / (f64::from(d) + 0.5)).ln()
}

/// BM25's term weight: a term `f` times in a span whose length norm is
/// `norm`, of inverse document frequency `idf`.
pub(crate) fn term_weight(idf: f64, f: u32, norm: f64) -> f64 {
    let f = f64::from(f);
    idf * f * (BM25_K1 + 1.0) / (f + BM25_K1 * norm)
}

/// BM25's length norm of a span of `len` words among spans of `avg`
/// words on average.
pub(crate) fn length_norm(len: u32, avg: f64) -> f64 {
    1.0 - BM25_B + BM25_B * f64::from(len) / avg
}

/// BM25 of each span against the query, normalised by the best.
fn similarity(spans: &[Span], query: &str) -> Vec<f64> {
    let words = query_terms(query);
    let mut buf = String::new();
    if words.is_empty() || spans.is_empty() {
        return vec![0.0; spans.len()];
    }
    let terms = Terms::new(words);
    let mut df = vec![0u32; terms.words.len()];
    let mut tf = vec![0u32; terms.words.len()];
    let mut touched: Vec<u32> = Vec::new();
    // (span index, term, frequency) for every match, and each span's length.
    let mut matches: Vec<(u32, u32, u32)> = Vec::new();
    let mut lengths: Vec<u32> = Vec::with_capacity(spans.len());
    for (i, span) in spans.iter().enumerate() {
        let mut len = 0u32;
        let text = span.text.as_str();
        let mut count = |t: u32| {
            if tf[t as usize] == 0 {
                touched.push(t);
            }
            tf[t as usize] += 1;
        };
        if text.is_ascii() {
            for_each_ascii_word(text.as_bytes(), |w, _| {
                len = len.saturating_add(1);
                if let Some(t) = terms.find(w, true) {
                    count(t);
                }
            });
        } else {
            for_each_word(text, |start, end, ascii| {
                len = len.saturating_add(1);
                let found = if ascii {
                    terms.find(&text.as_bytes()[start..end], true)
                } else {
                    lower_into(&text[start..end], false, &mut buf);
                    terms.find(buf.as_bytes(), false)
                };
                if let Some(t) = found {
                    count(t);
                }
            });
        }
        for &t in &touched {
            df[t as usize] += 1;
            matches.push((i as u32, t, tf[t as usize]));
            tf[t as usize] = 0;
        }
        touched.clear();
        lengths.push(len);
    }
    let n = spans.len() as f64;
    let avg = (lengths.iter().map(|&l| f64::from(l)).sum::<f64>() / n).max(1.0);
    let idf: Vec<f64> = df.iter().map(|&d| idf(n, d)).collect();
    let mut raw = vec![0.0f64; spans.len()];
    for &(i, t, f) in &matches {
        let norm = length_norm(lengths[i as usize], avg);
        raw[i as usize] += term_weight(idf[t as usize], f, norm);
    }
    normalise(&mut raw);
    raw
}

/// Divides every score by the best, when there is one.
pub(crate) fn normalise(raw: &mut [f64]) {
    let best = raw.iter().copied().fold(0.0f64, f64::max);
    if best > 0.0 {
        raw.iter_mut().for_each(|s| *s /= best);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words [`is_ignored`] ignores.
    const IGNORED: &[&str] = &[
        "the", "and", "to", "of", "in", "on", "at", "for", "is", "it", "be", "as", "by", "or",
        "an", "this", "that", "with", "from", "are", "was", "we", "you", "if", "so", "do", "not",
        "but",
    ];

    #[test]
    fn the_ignored_words_are_the_list() {
        for word in IGNORED {
            assert!(is_ignored(word), "{word}");
        }
        let kept = ["a", "th", "thee", "these", "andy", "form", "xx", "THE"];
        assert!(kept.iter().all(|w| !is_ignored(w)));
        // Every two- to four-letter word of the list's letters: only the
        // list's own are ignored.
        let letters: Vec<char> = IGNORED.iter().flat_map(|w| w.chars()).collect();
        let mut seen = std::collections::HashSet::new();
        for &a in &letters {
            for &b in &letters {
                for tail in ["", "e", "s", "is", "om", "at"] {
                    let word = format!("{a}{b}{tail}");
                    if seen.insert(word.clone()) {
                        assert_eq!(
                            is_ignored(&word),
                            IGNORED.contains(&word.as_str()),
                            "{word}"
                        );
                    }
                }
            }
        }
    }
    use crate::span::{ClassSource, Classification, Role, SpanClass};

    fn span(id: u64, turn: u64, text: &str, tokens: u32) -> Span {
        Span {
            id,
            position: id,
            role: Role::User,
            classification: Classification {
                class: SpanClass::Narrative,
                source: ClassSource::Caller,
                rule: String::new(),
            },
            text: text.into(),
            tokens,
            generation: 0,
            turn,
            predicate: None,
            summary: None,
            relevance_hint: None,
            admitted_at_ms: 0,
            original: None,
            attributes: None,
        }
    }

    #[test]
    fn components_order_as_documented() {
        let w = RelevanceWeights::default();
        let spans = [
            span(1, 1, "kustomize overlays for staging", 50),
            span(2, 9, "kustomize overlays for staging", 50),
            span(3, 9, "the weather is nice today", 50),
            span(4, 9, "the weather is nice today", 1),
        ];
        let s = score(&spans, "staging kustomize", 10, &w);
        assert!(s[1] > s[0], "recency: {s:?}");
        assert!(s[1] > s[2], "similarity: {s:?}");
        assert!(s[2] > s[3], "length: {s:?}");
        assert!(s.iter().all(|x| (0.0..=1.0).contains(x)));
    }

    #[test]
    fn hints_blend_in() {
        let w = RelevanceWeights::default();
        let mut a = span(1, 1, "x", 1);
        let plain = score(std::slice::from_ref(&a), "", 100, &w)[0];
        a.relevance_hint = Some(1.0);
        let hinted = score(std::slice::from_ref(&a), "", 100, &w)[0];
        assert!(hinted >= 0.5 && hinted > plain);
        a.relevance_hint = Some(f64::NAN);
        assert_eq!(score(std::slice::from_ref(&a), "", 100, &w)[0], plain);
        a.relevance_hint = Some(7.0);
        assert!(score(std::slice::from_ref(&a), "", 100, &w)[0] <= 1.0);
    }

    #[test]
    fn degenerate_weights_stay_in_range() {
        let spans = [span(1, 1, "a b c", 3), span(2, 5, "Ünïcödé ÄÖÜ 🦀", 9)];
        for w in [
            RelevanceWeights {
                recency: 0.0,
                similarity: 0.0,
                length: 0.0,
                hint: 0.0,
                recency_half_life_turns: 0.0,
            },
            RelevanceWeights {
                recency: f64::NAN,
                similarity: f64::INFINITY,
                length: -1.0,
                hint: 9.0,
                recency_half_life_turns: f64::NAN,
            },
        ] {
            let s = score(&spans, "ünïcödé c", 3, &w);
            assert!(s.iter().all(|x| (0.0..=1.0).contains(x)), "{s:?}");
        }
        assert!(score(&[], "query", 1, &RelevanceWeights::default()).is_empty());
    }

    #[test]
    fn similarity_is_normalised_and_idf_weighted() {
        let spans = [
            span(1, 1, "deploy deploy deploy", 3),
            span(2, 1, "prod", 1),
            span(3, 1, "deploy", 1),
            span(4, 1, "deploy", 1),
            span(5, 1, "nothing", 1),
        ];
        let s = similarity(&spans, "deploy prod");
        assert_eq!(s.iter().copied().fold(0.0, f64::max), 1.0);
        assert_eq!(s[4], 0.0);
        // The rare term outweighs the common one.
        assert!(s[1] > s[2], "{s:?}");
    }

    /// BM25 as the formula says, with every word lower-cased into a
    /// string and looked up in a plain map: what the hashed lookup must
    /// reproduce exactly.
    fn reference_similarity(spans: &[Span], query: &str) -> Vec<f64> {
        let words = |text: &str| {
            let mut out = Vec::new();
            let mut buf = String::new();
            for_each_word(text, |start, end, ascii| {
                lower_into(&text[start..end], ascii, &mut buf);
                out.push(buf.clone());
            });
            out
        };
        let mut terms: Vec<String> = Vec::new();
        for w in words(query) {
            if counts(&w) && !terms.contains(&w) {
                terms.push(w);
            }
        }
        if terms.is_empty() || spans.is_empty() {
            return vec![0.0; spans.len()];
        }
        let docs: Vec<Vec<String>> = spans.iter().map(|s| words(&s.text)).collect();
        let n = spans.len() as f64;
        let avg = (docs.iter().map(|d| d.len() as f64).sum::<f64>() / n).max(1.0);
        let df: Vec<f64> = terms
            .iter()
            .map(|t| docs.iter().filter(|d| d.contains(t)).count() as f64)
            .collect();
        let mut raw: Vec<f64> = docs
            .iter()
            .map(|d| {
                // Terms in the order the span first uses them, as the
                // scores are summed.
                let mut order: Vec<usize> = Vec::new();
                for w in d {
                    if let Some(t) = terms.iter().position(|t| t == w)
                        && !order.contains(&t)
                    {
                        order.push(t);
                    }
                }
                order
                    .into_iter()
                    .map(|t| {
                        let f = d.iter().filter(|w| **w == terms[t]).count() as f64;
                        let idf = (1.0 + (n - df[t] + 0.5) / (df[t] + 0.5)).ln();
                        let norm = 1.0 - BM25_B + BM25_B * d.len() as f64 / avg;
                        idf * f * (BM25_K1 + 1.0) / (f + BM25_K1 * norm)
                    })
                    .sum()
            })
            .collect();
        let best = raw.iter().copied().fold(0.0f64, f64::max);
        if best > 0.0 {
            raw.iter_mut().for_each(|s| *s /= best);
        }
        raw
    }

    #[test]
    fn hashed_lookup_matches_the_plain_formula() {
        let texts = [
            "Deploy the STAGING overlay; deploy again if it fails.",
            "src/planner.rs:42: error[E0308]: mismatched types in Planner::plan",
            "the quick brown fox_jumps over 12 lazy dogs 12 times",
            "Ünïcödé ÄÖÜ straße STRASSE naïve café ΣΊΣΥΦΟΣ",
            "a b c d e f g aa bb cc",
            "\u{212a}elvin and kelvin and KELVIN",
            "averyveryverylongidentifier_with_many_parts averyveryverylongidentifier_with_many_partz",
            "x",
            "",
            "12345678 123456789 1234567 1234 123 12",
        ];
        let spans: Vec<Span> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| span(i as u64 + 1, 1, t, 9))
            .collect();
        let facts = LiveFacts::of(&spans);
        for query in [
            "deploy staging",
            "DEPLOY Staging fails",
            "Planner::plan mismatched E0308 src planner rs",
            "STRASSE straße naïve ÄÖÜ σίσυφος",
            "\u{212a}ELVIN",
            "averyveryverylongidentifier_with_many_parts 12345678 1234 aa",
            "the and of",
            "",
        ] {
            let got = similarity(&spans, query);
            let want = reference_similarity(&spans, query);
            assert_eq!(got, want, "query {query:?}");
            let read = facts.similarity(spans.len(), &query_terms(query));
            assert_eq!(read, want, "query {query:?}, from the facts");
        }
    }

    #[test]
    fn folding_compares_like_the_standard_library() {
        let alphabet = b"aAzZ09_@[`{\x7f";
        let mut words: Vec<Vec<u8>> = Vec::new();
        for n in 0..=18 {
            for k in 0..alphabet.len() {
                words.push(
                    (0..n)
                        .map(|i| alphabet[(i * 7 + k) % alphabet.len()])
                        .collect(),
                );
            }
        }
        for w in &words {
            let lower = w.to_ascii_lowercase();
            assert!(folds_to(w, &lower), "{w:?}");
            for t in &words {
                let t = t.to_ascii_lowercase();
                assert_eq!(folds_to(w, &t), w.eq_ignore_ascii_case(&t), "{w:?} {t:?}");
            }
            let mut high = lower.clone();
            if let Some(b) = high.last_mut() {
                *b = 0xc3;
                assert!(!folds_to(w, &high), "{w:?}");
            }
        }
    }

    #[test]
    fn the_ascii_scanner_finds_the_same_words() {
        let mut texts: Vec<String> = vec![
            String::new(),
            "a".into(),
            "_".into(),
            " ".into(),
            "Hello, world_2! x".into(),
            "a".repeat(64),
            "a".repeat(65),
            format!("{} {}", "b".repeat(63), "c".repeat(70)),
            "@[`{/:\x7f\t\n~ Zz09_".repeat(9),
        ];
        let mut x = 0x1234_5678_u64;
        for len in [7usize, 63, 64, 65, 127, 128, 129, 300] {
            let text: String = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    char::from(b" aZ9_.-/@`{[~"[(x % 13) as usize])
                })
                .collect();
            texts.push(text);
        }
        for text in &texts {
            let mut general = Vec::new();
            for_each_word(text, |s, e, _| general.push(text[s..e].to_owned()));
            let mut fast = Vec::new();
            for_each_ascii_word(text.as_bytes(), |w, start| {
                assert_eq!(text.as_bytes().get(start..start + w.len()), Some(w));
                fast.push(String::from_utf8_lossy(w).into_owned())
            });
            assert_eq!(fast, general, "{text:?}");
        }
    }
}
