//! Relevance: which narrative goes first when room must be made (DESIGN
//! §5.4).
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
//! cost is linear in the total text.

use crate::fasthash::{self, FastMap};
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

/// Words never used for similarity: too common to tell spans apart, and
/// numerous enough to cost lookups.
const IGNORED: &[&str] = &[
    "the", "and", "to", "of", "in", "on", "at", "for", "is", "it", "be", "as", "by", "or", "an",
    "this", "that", "with", "from", "are", "was", "we", "you", "if", "so", "do", "not", "but",
];

/// One score in [0, 1] per span, in the same order.
pub fn score(
    spans: &[Span],
    query: &str,
    current_turn: u64,
    weights: &RelevanceWeights,
) -> Vec<f64> {
    let similarity = similarity(spans, query);
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
    spans
        .iter()
        .zip(similarity)
        .map(|(span, s)| {
            let age = current_turn.saturating_sub(span.turn);
            let r = usize::try_from(age)
                .ok()
                .and_then(|a| recency_memo.get(a).copied())
                .unwrap_or_else(|| recency(age));
            let l = length_memo
                .get(span.tokens as usize)
                .copied()
                .unwrap_or_else(|| length(span.tokens));
            let base = if total > 0.0 {
                (w_r * r + w_s * s + w_l * l) / total
            } else {
                0.0
            };
            let blended = match span.relevance_hint.filter(|h| h.is_finite()) {
                Some(h) => (1.0 - w_h) * base + w_h * h.clamp(0.0, 1.0),
                None => base,
            };
            if blended.is_finite() {
                blended.clamp(0.0, 1.0)
            } else {
                0.0
            }
        })
        .collect()
}

fn sane(w: f64) -> f64 {
    if w.is_finite() && w > 0.0 { w } else { 0.0 }
}

/// Calls `f` with each word of `text` (a slice of it, in its own case) and
/// whether the word is all ASCII. Bytes are scanned directly; only non-ASCII
/// characters are decoded.
fn for_each_word(text: &str, mut f: impl FnMut(&str, bool)) {
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
        f(&text[start..i], ascii);
    }
}

/// ASCII bytes that belong to words: letters, digits, `_`.
static ASCII_WORD: [bool; 256] = {
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

fn counts(word: &str) -> bool {
    word.len() >= 2 && !IGNORED.contains(&word)
}

/// BM25 of each span against the query, normalised by the best.
fn similarity(spans: &[Span], query: &str) -> Vec<f64> {
    let mut terms: FastMap<String, u32> = fasthash::map(16);
    let mut buf = String::new();
    for_each_word(query, |w, ascii| {
        lower_into(w, ascii, &mut buf);
        if counts(&buf) && !terms.contains_key(buf.as_str()) {
            let next = terms.len() as u32;
            terms.insert(buf.clone(), next);
        }
    });
    if terms.is_empty() || spans.is_empty() {
        return vec![0.0; spans.len()];
    }
    // A cheap pre-filter on (first byte, length) spares most lookups.
    let mut filter = [0u64; 256];
    for t in terms.keys() {
        filter[usize::from(t.as_bytes()[0])] |= 1 << t.len().min(63);
    }
    let passes = |first: u8, len: usize| filter[usize::from(first)] & (1u64 << len.min(63)) != 0;
    let mut df = vec![0u32; terms.len()];
    let mut tf = vec![0u32; terms.len()];
    let mut touched: Vec<u32> = Vec::new();
    // (span index, term, frequency) for every match, and each span's length.
    let mut matches: Vec<(u32, u32, u32)> = Vec::new();
    let mut lengths: Vec<u32> = Vec::with_capacity(spans.len());
    for (i, span) in spans.iter().enumerate() {
        let mut len = 0u32;
        for_each_word(&span.text, |w, ascii| {
            len = len.saturating_add(1);
            let key = if ascii {
                if !passes(w.as_bytes()[0].to_ascii_lowercase(), w.len()) {
                    return;
                }
                if w.bytes().any(|b| b.is_ascii_uppercase()) {
                    lower_into(w, true, &mut buf);
                    buf.as_str()
                } else {
                    w
                }
            } else {
                lower_into(w, false, &mut buf);
                if buf.is_empty() || !passes(buf.as_bytes()[0], buf.len()) {
                    return;
                }
                buf.as_str()
            };
            if let Some(&t) = terms.get(key) {
                if tf[t as usize] == 0 {
                    touched.push(t);
                }
                tf[t as usize] += 1;
            }
        });
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
    let idf: Vec<f64> = df
        .iter()
        .map(|&d| (1.0 + (n - f64::from(d) + 0.5) / (f64::from(d) + 0.5)).ln())
        .collect();
    let mut raw = vec![0.0f64; spans.len()];
    for &(i, t, f) in &matches {
        let f = f64::from(f);
        let norm = 1.0 - BM25_B + BM25_B * f64::from(lengths[i as usize]) / avg;
        raw[i as usize] += idf[t as usize] * f * (BM25_K1 + 1.0) / (f + BM25_K1 * norm);
    }
    let best = raw.iter().copied().fold(0.0f64, f64::max);
    if best > 0.0 {
        raw.iter_mut().for_each(|s| *s /= best);
    }
    raw
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
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
}
