//! Predicates: what a constraint demands, in a form a compressed text can be
//! checked against.
//!
//! A pinned constraint may be replaced by a shorter form only when the form
//! still says the same thing. "Same" is made checkable: the form must keep
//! the modality (a prohibition still negates, a restriction still says
//! "only") and contain every required term.
//!
//! # Required terms
//!
//! [`derive`] picks, in this order and without duplicates
//! (case-insensitively):
//!
//! 1. inline code and fenced code contents, and double-quoted strings
//!    (straight or curly quotes), verbatim;
//! 2. code-like words of the prose: paths, URLs, identifiers, file names,
//!    versions, numbers with their units (`512 MiB`), and plain numbers —
//!    at most [`MAX_STRUCTURED_TERMS`] from 1 and 2 together;
//! 3. the phrases of every *other* modality the text uses ("Never write to
//!    prod; stage only" is a prohibition that must keep "only");
//! 4. logic words that flip a demand when lost (without, except, unless,
//!    until, before, after, no, not, nor) in the clauses that carry a
//!    modal phrase;
//! 5. key words: content words (not function words, at least three
//!    letters or with a digit) of those clauses, nearest to the modal phrase
//!    first, at most [`MAX_KEY_WORDS`]. With no modal phrase at all, the
//!    first content words of the text.
//!
//! This keeps the list short enough that a meaningful compressed form can
//! exist, while naming what makes the constraint binding: for "Never write
//! to the `prod` namespace; stage only." the terms are `prod`, `only`,
//! `write`, `stage`, `namespace`.

use std::collections::HashSet;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::classify::{CodeCursor, analyse, analyse_in, code_ranges, is_word_char, modality_name};
use crate::fasthash::{self, FastMap, FastState};
use crate::span::{Modality, Predicate, PredicateSource};
use crate::text::{char_at, chunk_is_anchor, chunks, cut_chars, is_plain_number, is_separate_unit};
use crate::tokens::TokenCounter;

/// The most verbatim and code-like terms a derived predicate requires.
pub const MAX_STRUCTURED_TERMS: usize = 16;

/// The most key words a derived predicate requires.
pub const MAX_KEY_WORDS: usize = 6;

/// Quoted strings longer than this are not taken as terms.
const MAX_QUOTED_CHARS: usize = 200;

/// Logic words that must survive any compression: without, except,
/// unless, until, before, after, no, not, nor.
fn is_logic_word(w: &str) -> bool {
    matches!(
        w,
        "without" | "except" | "unless" | "until" | "before" | "after" | "no" | "not" | "nor"
    )
}

/// Function words: never key words.
fn is_function_word(w: &str) -> bool {
    matches!(
        w,
        "the"
            | "and"
            | "but"
            | "for"
            | "from"
            | "with"
            | "into"
            | "onto"
            | "upon"
            | "over"
            | "under"
            | "are"
            | "was"
            | "were"
            | "been"
            | "being"
            | "its"
            | "this"
            | "that"
            | "these"
            | "those"
            | "there"
            | "here"
            | "our"
            | "you"
            | "your"
            | "yours"
            | "his"
            | "her"
            | "they"
            | "them"
            | "their"
            | "what"
            | "which"
            | "who"
            | "whom"
            | "when"
            | "where"
            | "why"
            | "how"
            | "all"
            | "any"
            | "each"
            | "every"
            | "some"
            | "such"
            | "than"
            | "too"
            | "very"
            | "can"
            | "could"
            | "will"
            | "would"
            | "should"
            | "may"
            | "might"
            | "does"
            | "did"
            | "done"
            | "have"
            | "has"
            | "had"
            | "please"
            | "just"
            | "also"
            | "use"
            | "using"
            | "used"
            | "make"
            | "let"
            | "get"
            | "one"
            | "thing"
            | "things"
            | "way"
            | "then"
            | "else"
            | "even"
            | "ever"
            | "about"
            | "again"
            | "via"
            | "per"
            | "like"
            | "want"
            | "need"
            | "sure"
            | "okay"
            | "yes"
            | "now"
            | "anything"
            | "something"
            | "everything"
            | "nothing"
            | "anyone"
            | "someone"
            | "it's"
            | "i'm"
            | "we're"
            | "you're"
            | "that's"
            | "there's"
            | "let's"
            | "able"
            | "keep"
            | "going"
            | "kindly"
    )
}

/// Words the built-in compressor drops when nothing requires them.
const FILLER: &[&str] = &[
    "a",
    "an",
    "the",
    "please",
    "kindly",
    "just",
    "really",
    "basically",
    "simply",
    "very",
    "also",
    "literally",
    "definitely",
    "you",
    "we",
    "i",
];

/// Phrases that frame or soften a constraint without changing what it
/// demands, dropped whole by [`compress`] (as lower-case words). Nothing
/// here may weaken or widen a demand: "if possible" and "when you can"
/// change what is asked and stay; "under no circumstances" is itself a
/// prohibition and stays.
const FILLER_PHRASES: &[&[&str]] = &[
    &["remember", "that"],
    &["keep", "in", "mind", "that"],
    &["bear", "in", "mind", "that"],
    &["note", "that"],
    &["as", "a", "general", "rule"],
    &["for", "the", "rest", "of", "this", "session"],
    &["for", "the", "rest", "of", "the", "session"],
    &["whatever", "the", "task", "turns", "out", "to", "be"],
    &["under", "any", "circumstances"],
    &["no", "matter", "what"],
    &["at", "all"],
    &["as", "we", "agreed"],
    &["as", "agreed"],
    &["as", "discussed"],
    &["earlier", "in", "the", "week"],
    &["of", "course"],
    &["to", "be", "clear"],
    &["for", "the", "record"],
    &["going", "forward"],
    &["it", "is", "important", "that"],
];

/// Derives a constraint's predicate from its text.
///
/// `modality` is the class's modality when known (e.g. from the rule that
/// classified the span); otherwise it is read from the text, and a text
/// without any modal phrase is taken as a requirement — something pinned
/// by the caller is at least an invariant to keep.
pub fn derive(text: &str, modality: Option<Modality>) -> Predicate {
    let code = code_ranges(text);
    let analysis = analyse_in(text, &code);
    let modality = modality
        .or_else(|| analysis.primary().map(|h| h.modality))
        .unwrap_or(Modality::Requirement);
    let mut terms = Terms::for_text(text);

    // 1. Verbatim code and quotes.
    for &(start, end) in &code {
        let content = text[start..end].trim_matches('`').trim();
        terms.push_structured(content);
    }
    for quoted in quoted_strings(text, &code) {
        terms.push_structured(quoted);
    }
    // 2. Code-like words and numbers of the prose.
    let mut in_code = CodeCursor::new(&code);
    let prose_chunks = chunks(text)
        .filter(|(at, _)| !in_code.contains(*at))
        .collect::<Vec<_>>();
    for (k, &(at, word)) in prose_chunks.iter().enumerate() {
        if chunk_is_anchor(word) {
            terms.push_structured(word);
        } else if is_plain_number(word) {
            // A plain number, with its unit when one follows.
            let with_unit = prose_chunks.get(k + 1).and_then(|&(next_at, unit)| {
                let gap = &text[at + word.len()..next_at];
                (gap == " " && is_separate_unit(unit)).then(|| &text[at..next_at + unit.len()])
            });
            terms.push_structured(with_unit.unwrap_or(word));
        }
    }
    // 3. Phrases of the other modalities.
    let primary = analysis.primary().map(|h| h.modality);
    for hit in &analysis.hits {
        if Some(hit.modality) == primary {
            continue;
        }
        let phrase = match hit.rule {
            "not X but Y" | "X, not Y" => "not",
            phrase => phrase,
        };
        terms.push(phrase);
    }
    // 4 and 5. Logic words and key words of the modal clauses. Words of a
    // framing phrase ("keep in mind that", "for the rest of this
    // session") are never key words: they say nothing the constraint
    // demands.
    let words = &analysis.words;
    let framing = mark_phrases(
        words.len(),
        |i| words.get(i).map(|w| w.text.as_ref()),
        |_, _| true,
    );
    let mut in_hit = vec![false; words.len()];
    // Per clause, the word ranges of its hits, sorted.
    let mut clause_hits: FastMap<u32, Vec<(usize, usize)>> = fasthash::map(analysis.hits.len());
    for h in &analysis.hits {
        for flag in in_hit.iter_mut().take(h.last + 1).skip(h.first) {
            *flag = true;
        }
        clause_hits
            .entry(words[h.first].clause)
            .or_default()
            .push((h.first, h.last));
    }
    for ranges in clause_hits.values_mut() {
        ranges.sort_unstable();
    }
    let mut keys: Vec<(usize, usize)> = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let ranges = clause_hits.get(&w.clause);
        let in_modal = ranges.is_some();
        if in_modal && is_logic_word(&w.text) && !in_hit[i] {
            terms.push(&w.text);
            continue;
        }
        if in_hit[i]
            || framing[i]
            || !is_content_word(&w.text)
            || (!in_modal && !clause_hits.is_empty())
        {
            continue;
        }
        let distance = match ranges {
            None => i,
            Some(ranges) => nearest(ranges, i),
        };
        keys.push((distance, i));
    }
    keys.sort_unstable();
    // At most a few are chosen: a word already chosen is found among
    // them.
    let mut chosen: Vec<usize> = Vec::new();
    for &(_, i) in &keys {
        if chosen.len() >= MAX_KEY_WORDS {
            break;
        }
        let text: &str = &words[i].text;
        if !terms.covers(text) && !chosen.iter().any(|&c| words[c].text == text) {
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    for i in chosen {
        terms.push(&words[i].text);
    }

    Predicate {
        modality,
        required_terms: terms.list,
        source: PredicateSource::Derived,
    }
}

/// Terms and words a predicate's sets hold before they grow, and the
/// bytes of their lower-cased text.
const TERMS_ROOM: usize = 48;
const TERM_BYTES_ROOM: usize = 512;

#[derive(Default)]
struct Terms {
    list: Vec<String>,
    /// The terms so far, lower-cased.
    seen: LoweredSet,
    /// The lower-cased words of every term so far.
    words: LoweredSet,
    structured: usize,
}

impl Terms {
    /// Room for the terms of a predicate of `text` at most a few dozen
    /// terms long, without growing.
    fn for_text(text: &str) -> Terms {
        Terms {
            seen: LoweredSet::with_room(TERMS_ROOM, text.len().min(TERM_BYTES_ROOM)),
            words: LoweredSet::with_room(TERMS_ROOM, text.len().min(TERM_BYTES_ROOM)),
            ..Terms::default()
        }
    }

    /// Whether a word is already required, alone or inside a term.
    fn covers(&self, word: &str) -> bool {
        self.words.contains(word)
    }

    fn push(&mut self, term: &str) -> bool {
        let term = term.trim();
        if term.is_empty() || !self.seen.insert_lowered(term) {
            return false;
        }
        for w in term.split(|c: char| !is_word_char(c) && c != '\'') {
            if !w.is_empty() {
                self.words.insert_lowered(w);
            }
        }
        self.list.push(term.to_string());
        true
    }

    fn push_structured(&mut self, term: &str) {
        if self.structured < MAX_STRUCTURED_TERMS && self.push(term) {
            self.structured += 1;
        }
    }
}

/// Lower-cased strings, written one after another into one buffer and
/// found by their hash: a predicate's few dozen terms and words cost no
/// allocation each.
#[derive(Default)]
struct LoweredSet {
    /// Every member's lower-cased bytes, in the order added.
    bytes: String,
    /// Each member's byte range in `bytes`, by the hash of its text.
    members: HashTable<(u32, u32)>,
    hasher: FastState,
}

impl LoweredSet {
    fn with_room(members: usize, bytes: usize) -> LoweredSet {
        LoweredSet {
            bytes: String::with_capacity(bytes),
            members: HashTable::with_capacity(members),
            hasher: FastState::default(),
        }
    }

    fn member(bytes: &str, (start, end): (u32, u32)) -> &str {
        bytes.get(start as usize..end as usize).unwrap_or_default()
    }

    /// Whether `lowered`, already lower-cased, is a member.
    fn contains(&self, lowered: &str) -> bool {
        let hash = self.hasher.hash_one(lowered);
        self.members
            .find(hash, |&m| Self::member(&self.bytes, m) == lowered)
            .is_some()
    }

    /// Adds `s` lower-cased (by `str::to_lowercase` when it is not ASCII,
    /// which knows a final sigma); whether it was new.
    fn insert_lowered(&mut self, s: &str) -> bool {
        let start = self.bytes.len();
        if s.is_ascii() {
            self.bytes.push_str(s);
            self.bytes[start..].make_ascii_lowercase();
        } else {
            self.bytes.push_str(&s.to_lowercase());
        }
        // A predicate's terms come from one span's text: far below 4 GiB.
        let (Ok(first), Ok(end)) = (u32::try_from(start), u32::try_from(self.bytes.len())) else {
            self.bytes.truncate(start);
            return false;
        };
        let lowered = &self.bytes[start..];
        let hash = self.hasher.hash_one(lowered);
        let bytes = &self.bytes;
        if self
            .members
            .find(hash, |&m| Self::member(bytes, m) == lowered)
            .is_some()
        {
            self.bytes.truncate(start);
            return false;
        }
        let (bytes, hasher) = (&self.bytes, &self.hasher);
        self.members.insert_unique(hash, (first, end), |&m| {
            hasher.hash_one(Self::member(bytes, m))
        });
        true
    }
}

/// The distance in words from `i` to the nearest of sorted, disjoint word
/// ranges (none of which contains `i`).
fn nearest(ranges: &[(usize, usize)], i: usize) -> usize {
    let after = ranges.partition_point(|&(first, _)| first <= i);
    let right = ranges.get(after).map(|&(first, _)| first - i);
    let left = after
        .checked_sub(1)
        .and_then(|k| ranges.get(k))
        .map(|&(_, last)| i.saturating_sub(last));
    match (left, right) {
        (Some(l), Some(r)) => l.min(r),
        (Some(d), None) | (None, Some(d)) => d,
        (None, None) => usize::MAX,
    }
}

fn is_content_word(w: &str) -> bool {
    (w.chars().count() >= 3 || w.chars().any(|c| c.is_ascii_digit()))
        && !is_function_word(w)
        && !is_logic_word(w)
}

/// Double-quoted strings outside code, on one line, not too long.
fn quoted_strings<'a>(text: &'a str, code: &[(usize, usize)]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut open: Option<(usize, char)> = None;
    let mut in_code = CodeCursor::new(code);
    // Only line breaks and quotes matter: the straight quote is ASCII, the
    // curly ones start with byte 0xE2, which starts a character.
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if !matches!(b, b'\n' | b'"' | 0xe2) {
            continue;
        }
        let Some(c) = char_at(text, i) else {
            continue;
        };
        if in_code.contains(i) {
            continue;
        }
        match (open, c) {
            (_, '\n') => open = None,
            (None, '"' | '\u{201c}') => open = Some((i + c.len_utf8(), c)),
            (Some((start, opener)), '"' | '\u{201d}')
                if opener == '"' && c == '"' || opener == '\u{201c}' && c == '\u{201d}' =>
            {
                let inner = text[start..i].trim();
                if !inner.is_empty() && inner.chars().count() <= MAX_QUOTED_CHARS {
                    out.push(inner);
                }
                open = None;
            }
            _ => {}
        }
    }
    out
}

/// A constraint's predicate from what a caller gave (on admission or on
/// `Pin`): the caller's modality and required terms where given, the rest
/// derived from `text`. Blank terms are ignored: they would be satisfied
/// by any form and so demand nothing.
pub fn with_caller_parts(
    text: &str,
    modality: Option<Modality>,
    required_terms: Vec<String>,
) -> Predicate {
    let derived = derive(text, modality);
    let terms: Vec<String> = required_terms
        .into_iter()
        .filter(|t| !t.trim().is_empty())
        .collect();
    if !terms.is_empty() {
        Predicate {
            modality: derived.modality,
            required_terms: terms,
            source: PredicateSource::Caller,
        }
    } else if modality.is_some() {
        Predicate {
            source: PredicateSource::Caller,
            ..derived
        }
    } else {
        derived
    }
}

/// Whether `hay` contains `term` case-insensitively as a whole word: not
/// preceded or followed by a word character, where the term's own edge is a
/// word character.
pub fn contains_term(hay: &str, term: &str) -> bool {
    contains_lowered(&hay.to_lowercase(), term)
}

/// [`contains_term`] on a haystack already lower-cased.
fn contains_lowered(hay: &str, term: &str) -> bool {
    let term = term.trim().to_lowercase();
    if term.is_empty() {
        return true;
    }
    let starts_word = term.chars().next().is_some_and(is_word_char);
    let ends_word = term.chars().next_back().is_some_and(is_word_char);
    hay.match_indices(term.as_str()).any(|(at, m)| {
        let before_ok = !starts_word || !hay[..at].chars().next_back().is_some_and(is_word_char);
        let after_ok = !ends_word || !hay[at + m.len()..].chars().next().is_some_and(is_word_char);
        before_ok && after_ok
    })
}

/// Whether a text expresses `modality`: some phrase of that modality fires
/// on it (after the same precedence and exclusions as classification).
pub fn expresses(text: &str, modality: Modality) -> bool {
    analyse(text).has(modality)
}

/// Checks a (compressed) form of a constraint against its predicate.
///
/// `Ok` iff the form is not longer in tokens than the original, keeps the
/// modality, and contains every required term. `Err` lists every failure:
/// `length:N>M`, `modality:<name>`, and each missing term verbatim.
pub fn check(
    form: &str,
    form_tokens: u32,
    original_tokens: u32,
    predicate: &Predicate,
) -> Result<(), Vec<String>> {
    let mut missing = Vec::new();
    if form_tokens > original_tokens {
        missing.push(format!("length:{form_tokens}>{original_tokens}"));
    }
    if !expresses(form, predicate.modality) {
        missing.push(format!("modality:{}", modality_name(predicate.modality)));
    }
    let lowered = form.to_lowercase();
    for term in &predicate.required_terms {
        if !contains_lowered(&lowered, term) {
            missing.push(term.clone());
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}

/// The built-in compressor: drops filler words (articles, politeness,
/// intensifiers, subject pronouns) and collapses white space, keeping modal
/// phrases, logic words, required terms and code intact. When the result no
/// longer expresses the modality (a caller's predicate may name one the
/// text only implies), a canonical word is put in front ("Never:",
/// "Only:", "Must:", "Correction:").
///
/// Returns a form that passes [`check`] and is strictly shorter in tokens,
/// or `None` when there is no such form; deterministic.
pub fn compress(text: &str, predicate: &Predicate, counter: &dyn TokenCounter) -> Option<String> {
    let original_tokens = counter.count(text);
    let code = code_ranges(text);
    let analysis = analyse_in(text, &code);
    let mut protected: HashSet<String> = HashSet::new();
    for hit in &analysis.hits {
        for w in &analysis.words[hit.first..=hit.last] {
            protected.insert(w.text.to_string());
        }
    }
    for term in &predicate.required_terms {
        if term.chars().all(is_word_char) {
            protected.insert(term.to_lowercase());
        }
    }
    let pieces = pieces(text, &code);
    let mut kept_ranges: Vec<(usize, usize)> = Vec::new();
    // A first pass protects single-word terms; a term of several words
    // that the first pass broke has its occurrences protected in a second.
    for attempt in 0..3 {
        // The first attempt also drops framing phrases; should that break
        // a term of several words, the next ones drop single words only
        // and protect the broken terms.
        let phrases = attempt == 0;
        let form = drop_filler(
            &pieces,
            &protected,
            &kept_ranges,
            predicate.modality,
            phrases,
        );
        let tokens = counter.count(&form);
        if tokens >= original_tokens {
            return None;
        }
        match check(&form, tokens, original_tokens, predicate) {
            Ok(()) => return Some(form),
            Err(missing) => {
                let before = kept_ranges.len();
                let lower = text.to_ascii_lowercase();
                for term in predicate
                    .required_terms
                    .iter()
                    .filter(|t| missing.contains(t))
                {
                    let needle = term.trim().to_ascii_lowercase();
                    if needle.is_empty() {
                        continue;
                    }
                    for (at, m) in lower.match_indices(needle.as_str()) {
                        kept_ranges.push((at, at + m.len()));
                    }
                }
                // Without the phrases, a form may pass unchanged; after
                // that, only newly protected terms can make a difference.
                if kept_ranges.len() == before && !phrases {
                    return None;
                }
            }
        }
    }
    None
}

fn drop_filler(
    pieces: &[(usize, &str)],
    protected: &HashSet<String>,
    kept_ranges: &[(usize, usize)],
    modality: Modality,
    phrases: bool,
) -> String {
    // The protected ranges, sorted and merged, are walked alongside the
    // pieces (which come in text order).
    let mut ranges = kept_ranges.to_vec();
    ranges.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut next = 0;
    let pinned: Vec<bool> = pieces
        .iter()
        .map(|&(at, piece)| {
            while next < merged.len() && merged[next].1 <= at {
                next += 1;
            }
            merged.get(next).is_some_and(|&(s, _)| s < at + piece.len())
        })
        .collect();
    let in_phrase = if phrases {
        filler_phrases(pieces, &pinned, protected)
    } else {
        vec![false; pieces.len()]
    };
    let mut kept: Vec<&str> = Vec::with_capacity(pieces.len());
    for (i, &(_, piece)) in pieces.iter().enumerate() {
        // A filler word may carry the comma of its clause ("Also,").
        let word = piece.trim_end_matches([',', ';', ':']);
        let filler = in_phrase[i]
            || !word.is_empty() && word.chars().all(is_word_char) && {
                let lower = word.to_lowercase();
                FILLER.contains(&lower.as_str()) && !protected.contains(&lower)
            };
        if pinned[i] || !filler {
            kept.push(piece);
        }
    }
    let form = kept.join(" ");
    if expresses(&form, modality) {
        return form;
    }
    let lead = match modality {
        Modality::Prohibition => "Never:",
        Modality::Restriction => "Only:",
        Modality::Requirement => "Must:",
        Modality::Correction => "Correction:",
    };
    format!("{lead} {form}")
}

/// Which pieces belong to a [`FILLER_PHRASES`] occurrence that holds no
/// pinned or protected word. A phrase matches words with trailing
/// punctuation (the comma after a framing clause goes with it), but not
/// a piece with anything else in it (code, paths).
fn filler_phrases(
    pieces: &[(usize, &str)],
    pinned: &[bool],
    protected: &HashSet<String>,
) -> Vec<bool> {
    let words: Vec<Option<String>> = pieces
        .iter()
        .map(|&(_, piece)| {
            let word = piece.trim_end_matches([',', ';', ':', '.']);
            (!word.is_empty() && word.chars().all(is_word_char)).then(|| word.to_lowercase())
        })
        .collect();
    mark_phrases(
        words.len(),
        |i| words.get(i).and_then(Option::as_deref),
        |i, word| !pinned[i] && !protected.contains(word),
    )
}

/// Marks the `len` words (`word(i)` for each index `i`; `None` for a
/// piece that is no word) that stand in a [`FILLER_PHRASES`] occurrence,
/// left to right, each word in at most one; `usable(i, word)` may veto a
/// word.
fn mark_phrases<'a>(
    len: usize,
    word: impl Fn(usize) -> Option<&'a str>,
    usable: impl Fn(usize, &str) -> bool,
) -> Vec<bool> {
    let mut out = vec![false; len];
    let mut i = 0;
    while i < len {
        // Most words open no phrase: the phrases are tried only at those
        // that do.
        let found = match word(i) {
            Some(first) if opens_filler_phrase(first) => FILLER_PHRASES.iter().find(|phrase| {
                i + phrase.len() <= len
                    && phrase
                        .iter()
                        .enumerate()
                        .all(|(k, want)| word(i + k) == Some(*want) && usable(i + k, want))
            }),
            _ => None,
        };
        match found {
            Some(phrase) => {
                out[i..i + phrase.len()].iter_mut().for_each(|d| *d = true);
                i += phrase.len();
            }
            None => i += 1,
        }
    }
    out
}

/// Whether `word` is the first word of some [`FILLER_PHRASES`] entry.
fn opens_filler_phrase(word: &str) -> bool {
    matches!(
        word,
        "remember"
            | "keep"
            | "bear"
            | "note"
            | "as"
            | "for"
            | "whatever"
            | "under"
            | "no"
            | "at"
            | "of"
            | "to"
            | "earlier"
            | "going"
            | "it"
    )
}

/// White-space separated pieces of a text, where code spans (which may hold
/// white space) stay inside one piece.
fn pieces<'a>(text: &'a str, code: &[(usize, usize)]) -> Vec<(usize, &'a str)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut code_end = 0usize;
    let mut next_code = code.iter().peekable();
    for (i, c) in text.char_indices() {
        while let Some(&&(s, e)) = next_code.peek() {
            if s > i {
                break;
            }
            code_end = code_end.max(e);
            next_code.next();
        }
        let inside_code = i < code_end;
        if c.is_whitespace() && !inside_code {
            if let Some(s) = start.take() {
                out.push((s, &text[s..i]));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out
}

/// A short, stable rendering of a predicate for logs and details.
pub fn describe(predicate: &Predicate) -> String {
    let terms = predicate.required_terms.join(", ");
    format!(
        "{}[{}]",
        modality_name(predicate.modality),
        cut_chars(&terms, 300)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filler_phrase_opens_with_a_word_that_opens_one() {
        for phrase in FILLER_PHRASES {
            assert!(opens_filler_phrase(phrase[0]), "{phrase:?}");
        }
    }
    use crate::config::TokenizerKind;
    use crate::tokens::{ByteLength, counter};

    const PROD: &str = "Never write to the `prod` namespace; stage only.";

    #[test]
    fn the_prod_predicate() {
        let p = derive(PROD, None);
        assert_eq!(p.modality, Modality::Prohibition);
        assert_eq!(p.source, PredicateSource::Derived);
        assert_eq!(
            p.required_terms,
            ["prod", "only", "write", "namespace", "stage"]
        );
        assert!(check(PROD, 10, 10, &p).is_ok());
    }

    #[test]
    fn derive_by_table() {
        let cases: &[(&str, Modality, &[&str])] = &[
            (
                "Always run `cargo fmt --all` before committing.",
                Modality::Requirement,
                &["cargo fmt --all", "before", "run", "committing"],
            ),
            (
                "Use at most 4 threads and 512 MiB.",
                Modality::Restriction,
                &["4", "512 MiB", "threads"],
            ),
            (
                "Never deploy without approval from @ops.",
                Modality::Prohibition,
                &["without", "deploy", "approval", "ops"],
            ),
            (
                "Do not edit \"generated.rs\" or src/gen/.",
                Modality::Prohibition,
                &["generated.rs", "src/gen/", "edit"],
            ),
            (
                "Actually, use port 8080 instead of 80.",
                Modality::Correction,
                &["8080", "80", "port"],
            ),
        ];
        for (text, modality, terms) in cases {
            let p = derive(text, None);
            assert_eq!(p.modality, *modality, "{text:?}");
            assert_eq!(p.required_terms, *terms, "{text:?}");
            assert!(
                check(text, 1, 1, &p).is_ok(),
                "{text:?}: {:?}",
                check(text, 1, 1, &p)
            );
        }
    }

    #[test]
    fn a_text_without_modality_is_a_requirement() {
        let text = "The API key lives in vault/secret/api.";
        let p = derive(text, None);
        assert_eq!(p.modality, Modality::Requirement);
        assert_eq!(p.required_terms, ["vault/secret/api", "key", "lives"]);
        // Its own text does not express the requirement; a compressed form
        // must (compress puts "Must:" in front).
        assert_eq!(check(text, 1, 1, &p).unwrap_err(), ["modality:requirement"]);
    }

    #[test]
    fn given_modality_wins() {
        let p = derive("Stage only.", Some(Modality::Prohibition));
        assert_eq!(p.modality, Modality::Prohibition);
    }

    #[test]
    fn check_reports_everything_missing() {
        let p = derive(PROD, None);
        let err = check("write to stage", 20, 10, &p).unwrap_err();
        assert_eq!(
            err,
            [
                "length:20>10",
                "modality:prohibition",
                "prod",
                "only",
                "namespace"
            ]
        );
        // Whole words, case-insensitive.
        let err = check("NEVER write PRODuction namespace; stage ONLY", 1, 10, &p).unwrap_err();
        assert_eq!(err, ["prod"]);
        assert!(check("NEVER write `PROD` namespace; stage ONLY", 1, 10, &p).is_ok());
    }

    #[test]
    fn a_restriction_must_still_restrict() {
        let p = derive("Deploy to stage only.", None);
        assert_eq!(p.modality, Modality::Restriction);
        assert_eq!(
            check("Deploy stage", 1, 5, &p).unwrap_err(),
            ["modality:restriction"]
        );
        // Any phrase of the modality keeps it.
        assert!(check("Deploy stage exclusively", 1, 5, &p).is_ok());
        assert!(check("only deploy stage", 1, 5, &p).is_ok());
    }

    #[test]
    fn whole_word_terms() {
        let cases: &[(&str, &str, bool)] = &[
            ("write to prod", "prod", true),
            ("write to production", "prod", false),
            ("write to `prod`.", "prod", true),
            ("use src/main.rs:10", "src/main.rs", true),
            ("use xsrc/main.rs", "src/main.rs", false),
            ("at most 4", "at most", true),
            ("", "x", false),
            ("x", "", true),
            ("İstanbul prod", "prod", true),
        ];
        for (hay, term, want) in cases {
            assert_eq!(contains_term(hay, term), *want, "{hay:?} {term:?}");
        }
    }

    #[test]
    fn compress_keeps_the_demand() {
        for kind in [
            TokenizerKind::O200kBase,
            TokenizerKind::Cl100kBase,
            TokenizerKind::Client,
        ] {
            let c = counter(kind);
            let text =
                "Please, you must really never write to the `prod` namespace; just stage only.";
            let p = derive(text, None);
            let form = compress(text, &p, c).expect("compressible");
            assert!(c.count(&form) < c.count(text), "{form}");
            assert!(check(&form, c.count(&form), c.count(text), &p).is_ok());
            assert!(!form.contains("the "), "{form}");
            assert!(form.contains("`prod`"), "{form}");
        }
    }

    #[test]
    fn compress_drops_framing_phrases_but_not_what_changes_the_demand() {
        let c = counter(TokenizerKind::O200kBase);
        let text = "Please remember that, whatever the task turns out to be, you must never write anything at all to the `prod` namespace; stage only.";
        let p = derive(text, None);
        let form = compress(text, &p, c).expect("compressible");
        assert!(check(&form, c.count(&form), c.count(text), &p).is_ok());
        for gone in ["remember that", "whatever the task", "at all"] {
            assert!(!form.contains(gone), "{gone:?} in {form:?}");
        }
        assert!(form.contains("must never write"), "{form}");
        // Qualifiers that change what is asked stay.
        let text =
            "If possible, always run the linter before you push under no circumstances to main.";
        let p = derive(text, None);
        let form = compress(text, &p, c).unwrap_or_else(|| text.to_owned());
        assert!(form.contains("If possible"), "{form}");
        assert!(form.contains("under no circumstances"), "{form}");
        // A phrase word the predicate requires is kept.
        let text = "Keep in mind that the session token must never be logged.";
        let mut p = derive(text, None);
        p.required_terms.push("mind".into());
        let form = compress(text, &p, c).expect("compressible");
        assert!(form.contains("mind"), "{form}");
        assert!(check(&form, c.count(&form), c.count(text), &p).is_ok());
    }

    #[test]
    fn compress_declines_when_nothing_can_go() {
        let text = "Never write prod.";
        let p = derive(text, None);
        assert_eq!(compress(text, &p, &ByteLength), None);
        // An unsatisfiable predicate cannot be met by any form.
        let mut p = derive(PROD, None);
        p.required_terms.push("absent".into());
        assert_eq!(compress(PROD, &p, &ByteLength), None);
    }

    #[test]
    fn compress_adds_a_lost_modality() {
        let text = "Keep the secrets in the vault at vault/secret/api for the team.";
        let p = derive(text, Some(Modality::Requirement));
        let form = compress(text, &p, &ByteLength).expect("compressible");
        assert!(form.starts_with("Must: "), "{form}");
        assert!(check(&form, ByteLength.count(&form), ByteLength.count(text), &p).is_ok());
    }

    #[test]
    fn compress_protects_words_of_broken_terms() {
        let text = "Never push the main branch to the remote.";
        let mut p = derive(text, None);
        p.required_terms.push("the main branch".into());
        let form = compress(text, &p, &ByteLength).expect("compressible");
        assert!(form.contains("the main branch"), "{form}");
        assert!(!form.contains("to the remote"), "{form}");
    }

    #[test]
    fn compress_keeps_code_spans_whole() {
        let text = "Always run `cargo test --all  -- the x` on the CI box.";
        let p = derive(text, None);
        let form = compress(text, &p, &ByteLength).expect("compressible");
        assert!(form.contains("`cargo test --all  -- the x`"), "{form}");
    }

    #[test]
    fn describe_is_short() {
        let p = derive(PROD, None);
        assert_eq!(
            describe(&p),
            "prohibition[prod, only, write, namespace, stage]"
        );
    }
}
