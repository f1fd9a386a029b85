//! Full-text search over a session's spans, live and archived.
//!
//! An agent that reads "anchor dropped" in a marker must be able to find
//! the turn that held it without knowing its id. Every span is indexed
//! once, when it is stored, under its terms: the words relevance scores
//! by (maximal runs of letters, digits and `_`, lower-cased, at least two
//! characters, a few function words left out) and single digits, each cut
//! to [`MAX_TERM_BYTES`]. A path such as `src/store/writer.rs` is indexed
//! as `src`, `store`, `writer`, `rs`; `web-1` as `web`, `1`; an error
//! code `E0308` as `e0308`.
//!
//! What is kept per span is its [`TermVector`]: each distinct term as a
//! 20-bit key ([`term_key`], a fixed hash, the same in every build) with
//! its frequency, and the span's length, stored in about two bytes a term
//! ([`codec`]). Two terms may share a key; the store confirms the terms of
//! the spans it returns against their text, so a shared key can only
//! reorder, never invent, a hit.
//!
//! A query is ranked by BM25 (k1 = 1.2, b = 0.75) over the session's
//! indexed spans: the rarer a query term in the session and the more
//! often it appears in a span, relative to the span's length, the higher
//! the span. Ties go to the newer span. Filters (role, class, turn range,
//! live or archived) then keep the hits the caller asked for, in rank
//! order, and the page is cut from them.
//!
//! This module decides; the store keeps the index and reads it.

use std::collections::BTreeMap;

use crate::relevance;

pub mod codec;
use crate::span::{Role, Span, SpanClass, SpanId};

/// Terms are cut to this many bytes (at a character boundary): longer
/// runs are hashes and encoded blobs, found by their start as well as by
/// their whole.
pub const MAX_TERM_BYTES: usize = 64;

/// A query's terms beyond this many are ignored.
pub const MAX_QUERY_TERMS: usize = 32;

const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;

/// What a span is indexed under.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexedText {
    /// Each distinct term and how often it appears, in term order.
    pub terms: Vec<(String, u32)>,
    /// The number of terms in the text, repeats included: the length
    /// BM25 normalises by.
    pub length: u32,
}

/// The terms `text` is indexed under.
pub fn index_terms(text: &str) -> IndexedText {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut length = 0u32;
    relevance::for_each_term(text, |word, _, _| {
        length = length.saturating_add(1);
        let term = cut(word);
        match counts.get_mut(term) {
            Some(n) => *n = n.saturating_add(1),
            None => {
                counts.insert(term.to_owned(), 1);
            }
        }
    });
    IndexedText {
        terms: counts.into_iter().collect(),
        length,
    }
}

/// A query's distinct terms, in the order they first appear, at most
/// [`MAX_QUERY_TERMS`].
pub fn query_terms(query: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    relevance::for_each_term(query, |word, _, _| {
        let term = cut(word);
        if terms.len() < MAX_QUERY_TERMS && !terms.iter().any(|t| t == term) {
            terms.push(term.to_owned());
        }
    });
    terms
}

/// Term keys are below this.
pub const TERM_KEYS: u32 = 1 << 20;

/// The 20-bit key a term is kept under: FNV-1a (64-bit) of its bytes,
/// folded. Fixed across builds and processes, since it is stored.
pub fn term_key(term: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in term.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let folded = (h ^ (h >> 24) ^ (h >> 48)) as u32;
    folded % TERM_KEYS
}

/// A span's terms as the index keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TermVector {
    /// The span's length in terms, repeats included.
    pub length: u32,
    /// One entry per distinct key, ascending: the key in the upper 24
    /// bits (below [`TERM_KEYS`]), the frequency (at most 255) in the
    /// lower 8.
    pub entries: Vec<u32>,
}

impl TermVector {
    /// The vector of `text`: the terms of [`index_terms`] under their
    /// keys, counts of terms sharing a key added up, each at most 255.
    /// One pass over the text: each occurrence's key is taken as it is
    /// met, and the keys are sorted and counted after, so no term is
    /// copied.
    pub fn of(text: &str) -> TermVector {
        // A term is two bytes or more, or a digit, and a separator: a
        // text holds fewer than a third of its length unless digits
        // stand alone, so the keys are rarely moved as they grow; the
        // entries never are.
        let mut keys: Vec<u32> = Vec::with_capacity(text.len() / 3 + 1);
        relevance::for_each_term(text, |word, _, _| keys.push(term_key(cut(word))));
        let length = u32::try_from(keys.len()).unwrap_or(u32::MAX);
        keys.sort_unstable();
        let mut entries: Vec<u32> = Vec::with_capacity(keys.len());
        for key in keys {
            match entries.last_mut() {
                Some(last) if *last >> 8 == key => {
                    if *last & 0xff < 255 {
                        *last += 1;
                    }
                }
                _ => entries.push((key << 8) | 1),
            }
        }
        TermVector { length, entries }
    }

    /// How often a term of `key` appears: 0 when none does.
    pub fn frequency(&self, key: u32) -> u32 {
        match self.entries.binary_search_by(|e| (e >> 8).cmp(&key)) {
            Ok(i) => self.entries[i] & 0xff,
            Err(_) => 0,
        }
    }

    /// Whether the entries are ascending by key, every key below
    /// [`TERM_KEYS`], with no frequency 0: what [`TermVector::of`] makes,
    /// and what a stored vector must be.
    pub fn is_well_formed(&self) -> bool {
        self.entries.windows(2).all(|w| w[0] >> 8 < w[1] >> 8)
            && self
                .entries
                .iter()
                .all(|e| e & 0xff != 0 && e >> 8 < TERM_KEYS)
    }
}

/// Whether `text` holds at least one of `terms` (as [`query_terms`]
/// gives them).
pub fn holds_any(text: &str, terms: &[String]) -> bool {
    let mut found = false;
    relevance::for_each_term(text, |word, _, _| {
        found = found || terms.iter().any(|t| t == cut(word));
    });
    found
}

/// A term cut to [`MAX_TERM_BYTES`] at a character boundary.
fn cut(word: &str) -> &str {
    if word.len() <= MAX_TERM_BYTES {
        return word;
    }
    let mut end = MAX_TERM_BYTES;
    while !word.is_char_boundary(end) {
        end -= 1;
    }
    &word[..end]
}

/// The indexed spans of a session, in total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CorpusStats {
    /// Spans indexed.
    pub spans: u64,
    /// Their lengths, summed.
    pub total_length: u64,
}

/// One span that holds a term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posting {
    /// The span.
    pub span_id: SpanId,
    /// How often the term appears in it.
    pub frequency: u32,
    /// The span's length in terms.
    pub length: u32,
}

/// Every span that holds at least one query term, with its BM25 score,
/// best first; equal scores newest first. `postings` holds, per query
/// term, the spans that hold it.
pub fn rank(stats: CorpusStats, postings: &[Vec<Posting>]) -> Vec<(SpanId, f64)> {
    // The index may hold fewer spans than postings name only if it is
    // inconsistent; never divide by less than what was seen.
    let seen = postings.iter().map(Vec::len).max().unwrap_or(0) as f64;
    let n = (stats.spans as f64).max(seen).max(1.0);
    let average = if stats.spans > 0 {
        (stats.total_length as f64 / stats.spans as f64).max(1.0)
    } else {
        1.0
    };
    let mut scores: BTreeMap<SpanId, f64> = BTreeMap::new();
    for holders in postings {
        let df = holders.len() as f64;
        if df == 0.0 {
            continue;
        }
        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
        for p in holders {
            let tf = f64::from(p.frequency);
            let norm = 1.0 - BM25_B + BM25_B * f64::from(p.length) / average;
            let s = idf * tf * (BM25_K1 + 1.0) / (tf + BM25_K1 * norm);
            *scores.entry(p.span_id).or_insert(0.0) += s;
        }
    }
    let mut ranked: Vec<(SpanId, f64)> = scores.into_iter().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    ranked
}

/// Where a span stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// In the live context.
    Live,
    /// Evicted by a compaction, kept in the archive.
    Archived,
}

/// Which spans a search or a listing keeps. Empty lists and absent bounds
/// keep everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpanFilter {
    /// Keep only these roles.
    pub roles: Vec<Role>,
    /// Keep only these classes.
    pub classes: Vec<SpanClass>,
    /// Keep only spans of this turn or later.
    pub from_turn: Option<u64>,
    /// Keep only spans of this turn or earlier.
    pub to_turn: Option<u64>,
    /// Keep only live or only archived spans.
    pub standing: Option<Standing>,
}

impl SpanFilter {
    /// Whether the filter keeps `span`.
    pub fn keeps(&self, span: &Span, standing: Standing) -> bool {
        (self.roles.is_empty() || self.roles.contains(&span.role))
            && (self.classes.is_empty() || self.classes.contains(&span.class()))
            && self.from_turn.is_none_or(|t| span.turn >= t)
            && self.to_turn.is_none_or(|t| span.turn <= t)
            && self.standing.is_none_or(|s| s == standing)
    }
}

/// The part of `text`, at most about `max_chars` characters, that holds
/// the most distinct query terms (the earliest such part on a tie), with
/// `…` where it was cut. Without a match, the text's start.
pub fn snippet(text: &str, terms: &[String], max_chars: usize) -> String {
    let max_chars = max_chars.max(1);
    // The byte ranges of the first matches, each with its term's index.
    const MAX_MATCHES: usize = 256;
    let mut matches: Vec<(usize, usize, usize)> = Vec::new();
    if !terms.is_empty() {
        relevance::for_each_term(text, |word, start, end| {
            if matches.len() < MAX_MATCHES {
                let term = cut(word);
                if let Some(i) = terms.iter().position(|t| t == term) {
                    matches.push((start, end, i));
                }
            }
        });
    }
    // The window starts a little before the best match, measured in
    // characters, so that the match reads in context.
    let lead = max_chars / 4;
    let start = match best_window(text, &matches, max_chars, terms.len()) {
        Some(at) => back_chars(text, at, lead),
        None => 0,
    };
    let end = forward_chars(text, start, max_chars);
    let mut out = String::with_capacity(end - start + 8);
    if start > 0 {
        out.push('…');
    }
    out.push_str(text[start..end].trim());
    if end < text.len() {
        out.push('…');
    }
    out
}

/// The byte offset of the match that opens the window of `max_chars`
/// holding the most distinct terms.
fn best_window(
    text: &str,
    matches: &[(usize, usize, usize)],
    max_chars: usize,
    term_count: usize,
) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    let mut seen = vec![false; term_count];
    for (k, &(start, _, _)) in matches.iter().enumerate() {
        let limit = forward_chars(text, start, max_chars);
        seen.iter_mut().for_each(|s| *s = false);
        let mut distinct = 0;
        for &(s, e, t) in &matches[k..] {
            if e > limit || s >= limit {
                break;
            }
            if let Some(flag) = seen.get_mut(t)
                && !*flag
            {
                *flag = true;
                distinct += 1;
            }
        }
        if best.is_none_or(|(_, d)| distinct > d) {
            best = Some((start, distinct));
        }
    }
    best.map(|(start, _)| start)
}

/// The byte offset `n` characters after `from` (or the text's end).
fn forward_chars(text: &str, from: usize, n: usize) -> usize {
    text[from..]
        .char_indices()
        .nth(n)
        .map_or(text.len(), |(i, _)| from + i)
}

/// The byte offset up to `n` characters before `at`.
fn back_chars(text: &str, at: usize, n: usize) -> usize {
    text[..at]
        .char_indices()
        .rev()
        .take(n)
        .last()
        .map_or(at, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(span_id: SpanId, frequency: u32, length: u32) -> Posting {
        Posting {
            span_id,
            frequency,
            length,
        }
    }

    #[test]
    fn a_path_is_indexed_by_its_parts_lower_cased() {
        let indexed = index_terms("Error in SRC/store/writer.rs: writer failed E0308");
        let terms: Vec<&str> = indexed.terms.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            terms,
            ["e0308", "error", "failed", "rs", "src", "store", "writer"]
        );
        let writer = indexed.terms.iter().find(|(t, _)| t == "writer");
        assert_eq!(writer.map(|(_, n)| *n), Some(2));
        // "in" is a function word: it is neither counted nor indexed.
        assert_eq!(indexed.length, 8);
        // A single digit tells numbered names apart; a single letter is noise.
        assert_eq!(query_terms("web-1 a x"), ["web", "1"]);
    }

    #[test]
    fn long_terms_are_cut_at_a_character_boundary() {
        let word = "é".repeat(40);
        let indexed = index_terms(&word);
        assert_eq!(indexed.terms.len(), 1);
        assert!(indexed.terms[0].0.len() <= MAX_TERM_BYTES);
        assert_eq!(query_terms(&word), vec![indexed.terms[0].0.clone()]);
    }

    #[test]
    fn a_vector_keeps_each_term_once_with_its_frequency() {
        let v = TermVector::of("writer writer WRITER rs src/lib.rs");
        assert!(v.is_well_formed());
        assert_eq!(v.length, 7);
        assert_eq!(v.frequency(term_key("writer")), 3);
        assert_eq!(v.frequency(term_key("rs")), 2);
        assert_eq!(v.frequency(term_key("lib")), 1);
        assert_eq!(v.frequency(term_key("absent")), 0);
        assert_eq!(v.entries.len(), 4);
        // Counts saturate at 255.
        let many = TermVector::of(&"word ".repeat(300));
        assert_eq!(many.frequency(term_key("word")), 255);
        assert_eq!(many.length, 300);
        assert!(TermVector::default().is_well_formed());
        let unsorted = TermVector {
            length: 2,
            entries: vec![(5 << 8) | 1, (3 << 8) | 1],
        };
        assert!(!unsorted.is_well_formed());
    }

    /// The vector as [`TermVector::of`] defines it: the distinct terms of
    /// [`index_terms`], each keyed, counts of one key added up and capped.
    fn vector_of_distinct_terms(text: &str) -> TermVector {
        let indexed = index_terms(text);
        let mut keyed: Vec<(u32, u32)> = indexed
            .terms
            .iter()
            .map(|(term, n)| (term_key(term), *n))
            .collect();
        keyed.sort_unstable();
        let mut entries: Vec<u32> = Vec::new();
        for (key, n) in keyed {
            match entries.last_mut() {
                Some(last) if *last >> 8 == key => {
                    *last = (key << 8) | ((*last & 0xff) + n).min(255);
                }
                _ => entries.push((key << 8) | n.clamp(1, 255)),
            }
        }
        TermVector {
            length: indexed.length,
            entries,
        }
    }

    #[test]
    fn the_one_pass_vector_is_the_vector_of_the_distinct_terms() {
        let mut rng = crate::testing::Rng(7);
        let long = ["x".repeat(80), "é".repeat(40)];
        let mut pieces = vec![
            "writer",
            "Writer",
            "WRITER",
            "src/store/writer.rs",
            "E0308",
            "web-1",
            "a",
            "in",
            "the",
            "é",
            "Ünïcödé",
            "日本語",
            "𝔘𝔫𝔦",
            " ",
            "\n",
            "::",
            "--",
            "1",
            "42",
            "_under_score",
            "don't",
            "\u{200b}",
        ];
        pieces.extend(long.iter().map(String::as_str));
        for case in 0..400 {
            let words = rng.index(if case % 10 == 0 { 700 } else { 40 });
            let mut text = String::new();
            for _ in 0..words {
                text.push_str(pieces[rng.index(pieces.len())]);
                if rng.below(3) > 0 {
                    text.push(' ');
                }
            }
            let fast = TermVector::of(&text);
            assert_eq!(fast, vector_of_distinct_terms(&text), "{text:?}");
            assert!(fast.is_well_formed());
        }
        // Counts past 255 and terms of colliding keys add up the same way.
        let many = "word ".repeat(300) + &"other ".repeat(200);
        assert_eq!(TermVector::of(&many), vector_of_distinct_terms(&many));
    }

    #[test]
    fn term_keys_are_fixed_and_spread() {
        // Stored keys must not change between builds.
        assert_eq!(term_key("writer"), 836_414);
        assert!(term_key("writer") < TERM_KEYS);
        let keys: std::collections::BTreeSet<u32> =
            (0..10_000).map(|n| term_key(&format!("t{n}"))).collect();
        assert!(keys.len() > 9_900, "{} distinct of 10000", keys.len());
    }

    #[test]
    fn query_terms_are_distinct_and_bounded() {
        assert_eq!(query_terms("Writer writer WRITER rs"), ["writer", "rs"]);
        let many: String = (0..100).map(|n| format!("w{n} ")).collect();
        assert_eq!(query_terms(&many).len(), MAX_QUERY_TERMS);
        assert!(query_terms("a . !").is_empty());
    }

    #[test]
    fn a_rare_term_outranks_a_common_one() {
        let stats = CorpusStats {
            spans: 100,
            total_length: 1000,
        };
        // "rs" is in many spans; "e0308" only in span 7.
        let common: Vec<Posting> = (1..=60).map(|id| p(id, 1, 10)).collect();
        let rare = vec![p(7, 1, 10)];
        let ranked = rank(stats, &[common, rare]);
        assert_eq!(ranked[0].0, 7);
        assert!(ranked[0].1 > ranked[1].1 * 2.0);
        assert_eq!(ranked.len(), 60);
    }

    #[test]
    fn shorter_spans_and_more_occurrences_rank_higher_and_ties_go_to_the_newest() {
        let stats = CorpusStats {
            spans: 10,
            total_length: 100,
        };
        let ranked = rank(stats, &[vec![p(1, 1, 100), p(2, 1, 5), p(3, 3, 5)]]);
        let order: Vec<SpanId> = ranked.iter().map(|(id, _)| *id).collect();
        assert_eq!(order, [3, 2, 1]);
        let tie = rank(stats, &[vec![p(4, 1, 10), p(9, 1, 10)]]);
        assert_eq!(tie[0].0, 9);
        assert!(rank(stats, &[vec![], vec![]]).is_empty());
    }

    #[test]
    fn an_inconsistent_count_never_yields_a_negative_or_infinite_score() {
        let stats = CorpusStats::default();
        let ranked = rank(stats, &[vec![p(1, 1, 0), p(2, 2, 0)]]);
        assert!(ranked.iter().all(|(_, s)| s.is_finite() && *s > 0.0));
    }

    #[test]
    fn the_snippet_shows_the_part_with_the_most_terms() {
        let text = format!(
            "{} the build failed in src/lib.rs with E0308 mismatched types {}",
            "filler ".repeat(50),
            "tail ".repeat(50)
        );
        let terms = query_terms("e0308 lib.rs");
        let s = snippet(&text, &terms, 60);
        assert!(s.contains("E0308"), "{s}");
        assert!(s.contains("src/lib.rs"), "{s}");
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
        assert!(s.chars().count() <= 64, "{s}");
        // No match: the start of the text.
        assert!(holds_any(&text, &terms));
        assert!(!holds_any(&text, &query_terms("absent")));
        let none = snippet("short text", &query_terms("absent"), 60);
        assert_eq!(none, "short text");
        // Multi-byte text is cut at character boundaries.
        let wide = snippet(&"ü".repeat(500), &[], 10);
        assert_eq!(wide.chars().count(), 11);
    }

    #[test]
    fn the_filter_keeps_what_it_names() {
        let span = Span {
            id: 3,
            position: 3,
            role: Role::Tool,
            classification: crate::span::Classification {
                class: SpanClass::Narrative,
                source: crate::span::ClassSource::Caller,
                rule: String::new(),
            },
            text: "x".into(),
            tokens: 1,
            generation: 0,
            turn: 5,
            predicate: None,
            summary: None,
            relevance_hint: None,
            admitted_at_ms: 0,
            original: None,
            attributes: None,
        };
        assert!(SpanFilter::default().keeps(&span, Standing::Archived));
        let only = |f: SpanFilter| f.keeps(&span, Standing::Archived);
        assert!(only(SpanFilter {
            roles: vec![Role::User, Role::Tool],
            ..Default::default()
        }));
        assert!(!only(SpanFilter {
            roles: vec![Role::User],
            ..Default::default()
        }));
        assert!(!only(SpanFilter {
            classes: vec![SpanClass::Constraint],
            ..Default::default()
        }));
        assert!(only(SpanFilter {
            from_turn: Some(5),
            to_turn: Some(5),
            ..Default::default()
        }));
        assert!(!only(SpanFilter {
            from_turn: Some(6),
            ..Default::default()
        }));
        assert!(!only(SpanFilter {
            to_turn: Some(4),
            ..Default::default()
        }));
        assert!(!only(SpanFilter {
            standing: Some(Standing::Live),
            ..Default::default()
        }));
    }
}
