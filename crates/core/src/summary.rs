//! The built-in summariser: extractive and deterministic.
//!
//! A summary is what remains of evicted narrative in the prompt, so it must
//! keep what an agent cannot reconstruct: the exact file paths, error lines,
//! identifiers, URLs and quantities it was working with. Those are
//! *anchors*, carried verbatim from generation to generation. Prose is the
//! cheap part; a few salient sentences are kept when the budget allows.
//!
//! The anchors are those of [`extract_anchors`], whose rules the
//! [`text`](crate::text) module defines.
//!
//! # Format
//!
//! ```text
//! [summary of 12 spans, generation 1]
//! anchors: src/main.rs | error: could not compile `x` | 512 MiB
//! - The deploy failed twice on the staging cluster.
//! ```
//!
//! When anchors do not all fit, the header says how many were dropped
//! (`[summary of 12 spans, generation 2; 3 anchors dropped]`). What goes
//! first is what an agent can best do without: numbers and versions, then
//! identifiers, then paths and URLs, and error lines last — the strings
//! that decay first under repeated summarising are the ones kept longest.
//! Within a rank the longest goes first (so that as many as possible
//! survive), and among equally long ones the newest.

use std::borrow::Cow;

use crate::classify::is_word_char;
use crate::fasthash::{self, FastMap, FastSet};
use crate::span::{Span, SpanClass, SpanId};
use crate::text::{
    OwedAnchors, chunk_is_anchor, chunks, cut_chars, is_error_line, is_file_name,
    is_number_with_unit, is_path, is_url, is_version, required_anchors,
};
use crate::tokens::TokenCounter;

pub use crate::text::{MAX_ANCHOR_CHARS, extract_anchors};

/// The most sentences considered for a summary, whatever was evicted:
/// bounds the summariser's work when a compaction evicts thousands of
/// spans.
pub const MAX_CANDIDATE_SENTENCES: usize = 2048;

/// Sentences considered per evicted span.
const SENTENCES_PER_SPAN: usize = 4;

/// A kept sentence is cut to this many characters.
const MAX_SENTENCE_CHARS: usize = 240;

/// A summary as the summariser wrote it, before it becomes a span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryDraft {
    /// The text to put in the prompt.
    pub text: String,
    /// Its tokens, counted on the final text.
    pub tokens: u32,
    /// The anchors it carries verbatim, in the order they appear in it.
    pub anchors: Vec<String>,
    /// Anchors of the inputs this summary had to leave out (this
    /// compaction only; earlier drops are recorded in the inputs).
    pub anchors_dropped: u32,
    /// 1 + the highest generation summarised, at most the session's max.
    pub generation: u32,
    /// The ids of the spans it replaces, in the order given.
    pub covers: Vec<SpanId>,
}

/// Whether a span is a summary (its sentences are never re-summarised; only
/// its anchors are carried).
pub(crate) fn is_summary(span: &Span) -> bool {
    span.summary.is_some() || span.class() == SpanClass::Summary || span.generation > 0
}

/// Writes one summary of `evicted` (in prompt order) within `max_tokens`.
///
/// The anchors of original spans and the anchors recorded by evicted
/// summaries come first; then the most salient sentences of the original
/// (generation 0) spans. Summary sentences are never summarised again: a
/// summary at the session's last generation merges into the next one by its
/// anchors alone, which keeps the generation at the maximum instead of
/// letting detail decay further. The returned `tokens` is the count of the
/// final text, never above `max_tokens`.
pub fn summarize(
    evicted: &[&Span],
    max_tokens: u32,
    max_generations: u32,
    counter: &dyn TokenCounter,
) -> SummaryDraft {
    summarize_bounded(evicted, max_tokens, max_tokens, max_generations, counter)
}

/// [`summarize`] with a separate, softer limit for prose: anchors may use
/// up to `max_tokens`, but sentences are only added while the text stays
/// within `prose_tokens`.
///
/// The planner gives anchors all the room the budget allows (dropping one
/// is a loss the marker must report) while sentences only get the share
/// that keeps the session at its target.
pub fn summarize_bounded(
    evicted: &[&Span],
    max_tokens: u32,
    prose_tokens: u32,
    max_generations: u32,
    counter: &dyn TokenCounter,
) -> SummaryDraft {
    let limits = SummaryLimits {
        max_tokens,
        prose_tokens,
        anchor_tokens: max_tokens,
    };
    summarize_limited(evicted, limits, max_generations, counter)
}

/// The limits one summary is written within.
///
/// Three limits rather than one because they protect different things:
/// the whole text must fit the room the budget leaves, prose is only worth
/// the share that keeps the session at its target, and a session may cap
/// its anchors so that summaries of summaries do not grow without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryLimits {
    /// The most tokens the whole text may take, counted on the final text.
    pub max_tokens: u32,
    /// Sentences are added only while the text stays within this many.
    pub prose_tokens: u32,
    /// The most tokens the anchors may take (the session's anchor budget);
    /// anchors past it are dropped and counted.
    pub anchor_tokens: u32,
}

/// [`summarize_bounded`] with the anchors capped separately, at
/// `limits.anchor_tokens`.
///
/// # Accounting
///
/// An anchor of the inputs counts as carried exactly when it stands in the
/// text verbatim: in the anchors line, inside another anchor kept there
/// (the path in an error line costs nothing more), or inside a kept
/// sentence. All other anchors of the inputs are counted as dropped, so
/// `anchors.len() + anchors_dropped` is the number of distinct input
/// anchors, and what a marker reports as dropped is what is gone.
pub fn summarize_limited(
    evicted: &[&Span],
    limits: SummaryLimits,
    max_generations: u32,
    counter: &dyn TokenCounter,
) -> SummaryDraft {
    let mut owed = OwedAnchors::with_capacity(evicted.len());
    for span in evicted {
        for anchor in required_anchors(span) {
            owed.add(&anchor);
        }
    }
    summarize_owing(evicted, owed, limits, max_generations, counter)
}

/// [`summarize_limited`] of `evicted`, whose anchors, as
/// [`required_anchors`] gives them span by span, are `owed`: a session
/// reads them from what it keeps of its spans instead of extracting them
/// again.
pub(crate) fn summarize_owing(
    evicted: &[&Span],
    owed: OwedAnchors,
    limits: SummaryLimits,
    max_generations: u32,
    counter: &dyn TokenCounter,
) -> SummaryDraft {
    let max_tokens = limits.max_tokens;
    let max_generation = max_generations.max(1);
    let highest = evicted.iter().map(|s| s.generation).max().unwrap_or(0);
    let generation = highest.saturating_add(1).min(max_generation);
    let covers: Vec<SpanId> = evicted.iter().map(|s| s.id).collect();
    let OwedAnchors {
        seen,
        list: candidates,
    } = owed;

    let writer = Writer {
        counter,
        spans: covers.len(),
        generation,
        max_tokens,
        anchor_tokens: limits.anchor_tokens.min(max_tokens),
    };
    let kept = writer.choose_anchors(&candidates);
    let mut rendered: Vec<String> = kept.iter().map(|&i| candidates[i].clone()).collect();
    let carried_by_anchors = carried(&candidates, &rendered, &[]);
    let mut dropped = candidates.len() - carried_by_anchors.len();

    let originals: Vec<&Span> = evicted.iter().copied().filter(|s| !is_summary(s)).collect();
    let used = writer.measure(&rendered, &[], dropped);
    let prose_room = max_tokens.min(limits.prose_tokens).saturating_sub(used);
    let mut sentences = choose_sentences(&originals, &seen, prose_room, counter);

    // Pieces were counted one by one; the final text is what counts. Trim
    // from the end until it fits (sentences first, then anchors).
    let mut text = writer.render(&rendered, &sentences, dropped);
    // Without sentences the text is the one just measured.
    let mut tokens = if sentences.is_empty() {
        used
    } else {
        counter.count(&text)
    };
    // Whether anything rendered was taken out again.
    let mut trimmed = false;
    // The rendered anchors' ranks, once an anchor has to be dropped.
    let mut ranks: Option<Vec<u8>> = None;
    while tokens > max_tokens {
        trimmed = true;
        let over = tokens - max_tokens;
        let mut freed = 0u32;
        while freed < over {
            if let Some(s) = sentences.pop() {
                freed = freed.saturating_add(counter.count(&s).saturating_add(2));
            } else {
                let ranks =
                    ranks.get_or_insert_with(|| rendered.iter().map(|a| anchor_rank(a)).collect());
                let Some(next) = least_valuable(&rendered, ranks) else {
                    break;
                };
                ranks.remove(next);
                let a = rendered.remove(next);
                dropped += 1;
                freed = freed.saturating_add(counter.count(&a).saturating_add(2));
            }
        }
        text = writer.render(&rendered, &sentences, dropped);
        tokens = counter.count(&text);
        if sentences.is_empty() && rendered.is_empty() && tokens > max_tokens {
            text = String::new();
            tokens = 0;
        }
    }

    // What the final text carries decides the account; the header is only
    // rewritten when its count changes and the new one still fits.
    let anchors = if text.is_empty() {
        Vec::new()
    } else if sentences.is_empty() && !trimmed {
        // The same pieces as when the drop count was first taken.
        carried_by_anchors
    } else {
        carried(&candidates, &rendered, &sentences)
    };
    let final_dropped = candidates.len() - anchors.len();
    if !text.is_empty() && final_dropped != dropped {
        let rewritten = writer.render(&rendered, &sentences, final_dropped);
        let n = counter.count(&rewritten);
        if n <= max_tokens {
            text = rewritten;
            tokens = n;
        }
    }
    SummaryDraft {
        text,
        tokens,
        anchors,
        anchors_dropped: u32::try_from(final_dropped).unwrap_or(u32::MAX),
        generation,
        covers,
    }
}

/// Above this many byte comparisons, [`carried`] looks candidates up among
/// the anchors of the kept pieces instead of searching the text for each.
const EXACT_SEARCH_BUDGET: usize = 4 << 20;

/// The candidates (in their order) that stand verbatim in a summary made
/// of `rendered` anchors and `sentences`.
///
/// Searching the text for every candidate is exact; when that would cost
/// too much (thousands of candidates), a candidate counts as carried when
/// it is one of the rendered anchors or one of the anchors found in a kept
/// piece. Either way nothing is claimed that is not in the text.
fn carried(candidates: &[String], rendered: &[String], sentences: &[String]) -> Vec<String> {
    let pieces_len: usize = rendered.iter().chain(sentences).map(|p| p.len() + 3).sum();
    if candidates.len().saturating_mul(pieces_len) <= EXACT_SEARCH_BUDGET {
        let body = rendered
            .iter()
            .chain(sentences)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n");
        // A rendered anchor stands in the text as it is: only the others
        // are searched for.
        let shown: FastSet<&str> = rendered.iter().map(String::as_str).collect();
        return candidates
            .iter()
            .filter(|c| shown.contains(c.as_str()) || body.contains(c.as_str()))
            .cloned()
            .collect();
    }
    let inner: Vec<Vec<String>> = rendered
        .iter()
        .chain(sentences)
        .map(|p| extract_anchors(p))
        .collect();
    let mut present: FastSet<&str> = fasthash::set(rendered.len() + inner.len() * 4);
    present.extend(rendered.iter().map(String::as_str));
    present.extend(inner.iter().flatten().map(String::as_str));
    candidates
        .iter()
        .filter(|c| present.contains(c.as_str()))
        .cloned()
        .collect()
}

/// How much an anchor is worth keeping: lower ranks are dropped first.
fn anchor_rank(anchor: &str) -> u8 {
    if is_error_line(anchor) {
        3
    } else if is_path(anchor) || is_url(anchor) || is_file_name(anchor) {
        2
    } else if is_number_with_unit(anchor) || is_version(anchor) {
        0
    } else {
        1
    }
}

/// The order in which anchors are dropped: lowest rank, then longest,
/// then newest first. The key sorts the first to drop last.
fn keep_key(
    anchors: &[String],
    i: usize,
) -> (u8, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>) {
    ranked_key(anchors, anchor_rank(&anchors[i]), i)
}

/// [`keep_key`], with the anchor's rank already known.
fn ranked_key(
    anchors: &[String],
    rank: u8,
    i: usize,
) -> (u8, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>) {
    (
        rank,
        std::cmp::Reverse(anchors[i].len()),
        std::cmp::Reverse(i),
    )
}

/// The index of the anchor to drop next; `ranks` holds each anchor's
/// [`anchor_rank`].
fn least_valuable(anchors: &[String], ranks: &[u8]) -> Option<usize> {
    (0..anchors.len().min(ranks.len())).min_by_key(|&i| ranked_key(anchors, ranks[i], i))
}

struct Writer<'a> {
    counter: &'a dyn TokenCounter,
    spans: usize,
    generation: u32,
    max_tokens: u32,
    /// The most the anchors may take, at most `max_tokens`.
    anchor_tokens: u32,
}

impl Writer<'_> {
    fn header(&self, dropped: usize) -> String {
        let s = if self.spans == 1 { "" } else { "s" };
        if dropped == 0 {
            format!(
                "[summary of {} span{s}, generation {}]",
                self.spans, self.generation
            )
        } else {
            let a = if dropped == 1 { "" } else { "s" };
            format!(
                "[summary of {} span{s}, generation {}; {dropped} anchor{a} dropped]",
                self.spans, self.generation
            )
        }
    }

    fn render(&self, anchors: &[String], sentences: &[String], dropped: usize) -> String {
        let mut text = self.header(dropped);
        if !anchors.is_empty() {
            text.push_str("\nanchors: ");
            text.push_str(&anchors.join(" | "));
        }
        for s in sentences {
            text.push_str("\n- ");
            text.push_str(s);
        }
        text
    }

    fn measure(&self, anchors: &[String], sentences: &[String], dropped: usize) -> u32 {
        self.counter
            .count(&self.render(anchors, sentences, dropped))
    }

    /// The indices of the anchors to render, in order: all of them when
    /// they fit, otherwise the most valuable first (see [`anchor_rank`])
    /// until the anchor budget is spent. An anchor found inside one already
    /// chosen (the path in an error line) is carried by it and costs
    /// nothing.
    fn choose_anchors(&self, candidates: &[String]) -> Vec<usize> {
        if candidates.is_empty() {
            return Vec::new();
        }
        // A pessimistic header: the drop count can only be this long.
        let header = self
            .counter
            .count(&self.header(candidates.len()))
            .saturating_add(3);
        let mut room = self
            .max_tokens
            .saturating_sub(header)
            .min(self.anchor_tokens);
        // Tokens never exceed bytes in a byte-level BPE, and rarely fall
        // below a sixteenth of them: count the whole list only when it
        // might fit.
        let bytes: u64 = candidates.iter().map(|a| a.len() as u64 + 3).sum();
        if bytes <= u64::from(room) {
            return (0..candidates.len()).collect();
        }
        // Counting stops where the list stops fitting.
        if bytes <= 16 * u64::from(room)
            && self
                .counter
                .count_within(&candidates.join(" | "), room)
                .is_some()
        {
            return (0..candidates.len()).collect();
        }
        // Each key classifies its anchor (error line, path, ...): compute
        // it once per anchor, not twice per comparison. Keys are distinct
        // (they end with the index), so the order is the same either way.
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.sort_by_cached_key(|&i| std::cmp::Reverse(keep_key(candidates, i)));
        let mut kept = Vec::new();
        let mut inside: FastSet<String> = fasthash::set(candidates.len());
        for i in order {
            if inside.contains(&candidates[i]) {
                continue;
            }
            // An anchor costs its tokens and a separator's two; one that
            // does not fit is not counted to its end. A shorter anchor
            // further down may still fit.
            let Some(tokens) = room
                .checked_sub(2)
                .and_then(|left| self.counter.count_within(&candidates[i], left))
            else {
                continue;
            };
            room -= tokens + 2;
            kept.push(i);
            inside.extend(extract_anchors(&candidates[i]));
        }
        kept.sort_unstable();
        kept
    }
}

/// One sentence that may go into a summary.
struct Candidate {
    text: String,
    /// (span index in prompt order, sentence index): the output order.
    at: (usize, usize),
    score: f64,
}

/// The most salient sentences of the original spans, in prompt order,
/// within `room` tokens.
fn choose_sentences(
    originals: &[&Span],
    anchors: &FastSet<String>,
    room: u32,
    counter: &dyn TokenCounter,
) -> Vec<String> {
    if room < 4 {
        return Vec::new();
    }
    let mut candidates: Vec<Candidate> = Vec::new();
    'spans: for (si, span) in originals.iter().enumerate().rev() {
        for (k, sentence) in sentences(&span.text).take(SENTENCES_PER_SPAN).enumerate() {
            if candidates.len() >= MAX_CANDIDATE_SENTENCES {
                break 'spans;
            }
            if anchors.contains(&sentence) {
                continue;
            }
            candidates.push(Candidate {
                text: sentence,
                at: (si, k),
                score: 0.0,
            });
        }
    }
    score_sentences(&mut candidates);
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        candidates[b]
            .score
            .total_cmp(&candidates[a].score)
            .then(candidates[a].at.cmp(&candidates[b].at))
    });
    let mut left = room;
    let mut misses = 0;
    let mut chosen = Vec::new();
    for i in order {
        // A sentence costs its tokens and two for its line's marker.
        let fits = left
            .checked_sub(2)
            .and_then(|room| counter.count_within(&candidates[i].text, room));
        if let Some(tokens) = fits {
            left -= tokens + 2;
            chosen.push(i);
            misses = 0;
        } else {
            misses += 1;
            if misses >= 32 || left < 4 {
                break;
            }
        }
    }
    chosen.sort_by_key(|&i| candidates[i].at);
    chosen
        .into_iter()
        .map(|i| std::mem::take(&mut candidates[i].text))
        .collect()
}

/// Salience: sentences sharing the evicted text's recurring words, naming
/// code-like things, or opening their span rank first; long sentences are
/// not favoured for length alone.
///
/// Each sentence's distinct words are kept sorted, so that the sum of
/// their weights is taken in one order: a float sum in hash order would
/// differ in its last bits from one call to the next, break ties between
/// equally salient sentences differently, and make the same plan come out
/// with another summary when it is re-derived to be committed.
///
/// The words of all sentences stand in one list, each sentence's a range
/// of it, and each distinct word is numbered once: its weight is then
/// computed once and looked up by number, summed in the same order.
fn score_sentences(candidates: &mut [Candidate]) {
    // Each sentence's distinct words, sorted, one after the other.
    let mut words: Vec<Cow<'_, str>> = Vec::new();
    let mut ends: Vec<usize> = Vec::with_capacity(candidates.len());
    let mut scratch: Vec<Cow<'_, str>> = Vec::new();
    for c in candidates.iter() {
        scratch.clear();
        salient_words(&c.text, |w| scratch.push(lowered(w)));
        scratch.sort_unstable();
        scratch.dedup();
        words.append(&mut scratch);
        ends.push(words.len());
    }
    // Each distinct word's number, and how many sentences use it. The
    // fast hasher: the sums are taken in each sentence's sorted order, so
    // the table's order does not matter.
    let mut numbers: FastMap<&str, u32> = fasthash::map(words.len());
    let mut df: Vec<u32> = Vec::new();
    let ids: Vec<u32> = words
        .iter()
        .map(|w| {
            let next = u32::try_from(df.len()).unwrap_or(u32::MAX);
            let id = *numbers.entry(w.as_ref()).or_insert(next);
            if id == next {
                df.push(0);
            }
            if let Some(d) = df.get_mut(id as usize) {
                *d += 1;
            }
            id
        })
        .collect();
    let weight: Vec<f64> = df
        .iter()
        .map(|&d| f64::from(d.max(1) - 1).ln_1p())
        .collect();
    let mut start = 0;
    for (c, &end) in candidates.iter_mut().zip(&ends) {
        let shared: f64 = ids[start..end]
            .iter()
            .map(|&id| weight.get(id as usize).copied().unwrap_or(0.0))
            .sum();
        start = end;
        let n = c.text.split_whitespace().count() as f64;
        let code = chunks(&c.text).filter(|(_, w)| chunk_is_anchor(w)).count() as f64;
        let opening = if c.at.1 == 0 { 0.5 } else { 0.0 };
        c.score = shared / (n + 1.0).sqrt() + code + opening;
    }
}

/// A word in lower case: borrowed when it is in lower case already, so
/// that the same words are compared and sorted without being copied.
fn lowered(w: &str) -> Cow<'_, str> {
    if w.is_ascii() && !w.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Borrowed(w)
    } else {
        Cow::Owned(w.to_lowercase())
    }
}

/// Calls `f` with each word of `text` that salience counts: the maximal
/// runs of word characters (letters, digits, `_`) of at least four
/// characters, in order. An ASCII text is split byte by byte.
fn salient_words<'t>(text: &'t str, mut f: impl FnMut(&'t str)) {
    if !text.is_ascii() {
        text.split(|ch: char| !is_word_char(ch))
            .filter(|w| w.chars().count() >= 4)
            .for_each(f);
        return;
    }
    let b = text.as_bytes();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        if !(c.is_ascii_alphanumeric() || c == b'_') {
            if i - start >= 4 {
                f(&text[start..i]);
            }
            start = i + 1;
        }
    }
    if b.len() - start >= 4 {
        f(&text[start..]);
    }
}

/// The sentences of a text: split at newlines and at `.`, `!`, `?`
/// followed by white space; white space collapsed; fragments shorter than
/// two words dropped; long ones cut.
fn sentences(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut rest = text;
    std::iter::from_fn(move || {
        loop {
            if rest.is_empty() {
                return None;
            }
            // The ends are ASCII, never inside another character: the
            // bytes are scanned, and only the character after a `.`,
            // `!` or `?` is decoded.
            let bytes = rest.as_bytes();
            let mut end = rest.len();
            for (i, &c) in bytes.iter().enumerate() {
                if c == b'\n' {
                    end = i;
                    break;
                }
                if matches!(c, b'.' | b'!' | b'?')
                    && rest
                        .get(i + 1..)
                        .and_then(|after| after.chars().next())
                        .is_none_or(char::is_whitespace)
                {
                    end = i + 1;
                    break;
                }
            }
            let piece = &rest[..end];
            rest = rest[end..].trim_start_matches(['\n', ' ', '\t', '\r']);
            let mut collapsed = String::with_capacity(piece.len());
            let mut words = 0usize;
            for w in piece.split_whitespace() {
                if words > 0 {
                    collapsed.push(' ');
                }
                collapsed.push_str(w);
                words += 1;
            }
            if words >= 2 {
                let cut = cut_chars(&collapsed, MAX_SENTENCE_CHARS).len();
                collapsed.truncate(cut);
                return Some(collapsed);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::{ClassSource, Classification, Role, SummaryInfo};
    use crate::tokens::ByteLength;

    fn span(id: SpanId, text: &str) -> Span {
        Span {
            id,
            position: id,
            role: Role::Tool,
            classification: Classification {
                class: SpanClass::Narrative,
                source: ClassSource::Rules,
                rule: "role:tool".into(),
            },
            text: text.into(),
            tokens: ByteLength.count(text),
            generation: 0,
            turn: id,
            predicate: None,
            summary: None,
            relevance_hint: None,
            admitted_at_ms: 0,
            original: None,
            attributes: None,
        }
    }

    #[test]
    fn summary_format_and_budget() {
        let a = span(
            1,
            "Edit src/main.rs to fix the build. The build broke after the upgrade.",
        );
        let b = span(
            2,
            "error: linker `cc` not found\nThe build needs a C toolchain installed.",
        );
        let d = summarize(&[&a, &b], 1000, 3, &ByteLength);
        assert!(
            d.text
                .starts_with("[summary of 2 spans, generation 1]\nanchors: ")
        );
        assert!(d.text.contains("\n- "));
        assert_eq!(d.tokens, ByteLength.count(&d.text));
        assert_eq!(d.covers, vec![1, 2]);
        assert_eq!(d.anchors_dropped, 0);
        for a in ["src/main.rs", "error: linker `cc` not found", "cc"] {
            assert!(d.anchors.iter().any(|x| x == a), "{a}");
            assert!(d.text.contains(a));
        }
    }

    #[test]
    fn tight_budget_drops_longest_anchors_first() {
        let a = span(
            1,
            "src/a.rs and src/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.rs",
        );
        let full = summarize(&[&a], 10_000, 3, &ByteLength);
        assert_eq!(full.anchors.len(), 2);
        let d = summarize(&[&a], 70, 3, &ByteLength);
        assert!(d.tokens <= 70);
        assert_eq!(d.anchors, vec!["src/a.rs".to_string()]);
        assert_eq!(d.anchors_dropped, 1);
        assert!(d.text.contains("1 anchor dropped"));
    }

    #[test]
    fn error_lines_and_paths_outlive_numbers_and_identifiers() {
        let error = "error: connection refused by db-primary:5432";
        let a = span(
            1,
            &format!("took 30s with max_retries set\n{error}\nsee k8s/staging/db.yaml"),
        );
        let full = summarize(&[&a], 10_000, 3, &ByteLength);
        for want in ["30s", "max_retries", error, "k8s/staging/db.yaml"] {
            assert!(
                full.anchors.iter().any(|x| x == want),
                "{want} in {:?}",
                full.anchors
            );
        }
        // Room for about two of the four: the error line and the path stay,
        // although they are the longest.
        let d = summarize(&[&a], 130, 3, &ByteLength);
        assert!(d.tokens <= 130, "{}", d.text);
        assert!(d.anchors.iter().any(|x| x == error), "{:?}", d.anchors);
        assert!(!d.anchors.iter().any(|x| x == "30s"), "{:?}", d.anchors);
        assert_eq!(
            d.anchors_dropped as usize + d.anchors.len(),
            full.anchors.len()
        );
        assert_eq!(anchor_rank(error), 3);
        assert_eq!(anchor_rank("k8s/staging/db.yaml"), 2);
        assert_eq!(anchor_rank("max_retries"), 1);
        assert_eq!(anchor_rank("30s"), 0);
    }

    #[test]
    fn tiny_budgets_yield_empty_text() {
        let a = span(1, "src/a.rs");
        let d = summarize(&[&a], 3, 3, &ByteLength);
        assert_eq!(d.text, "");
        assert_eq!(d.tokens, 0);
        assert_eq!(d.anchors_dropped, 1);
    }

    #[test]
    fn generations_are_capped_and_anchors_merged() {
        let mut s = span(5, "[summary]\nanchors: src/old.rs");
        s.classification.class = SpanClass::Summary;
        s.generation = 3;
        s.summary = Some(SummaryInfo {
            covers: vec![1, 2],
            anchors: vec!["src/old.rs".into(), "only carried".into()],
            anchors_dropped: 2,
        });
        let n = span(6, "Now look at src/new.rs. It compiles.");
        let d = summarize(&[&s, &n], 1000, 3, &ByteLength);
        assert_eq!(d.generation, 3);
        for a in ["src/old.rs", "only carried", "src/new.rs"] {
            assert!(d.text.contains(a), "{a}");
        }
        let d = summarize(&[&n], 1000, 3, &ByteLength);
        assert_eq!(d.generation, 1);
        s.generation = 1;
        let d = summarize(&[&s, &n], 1000, 3, &ByteLength);
        assert_eq!(d.generation, 2);
    }

    #[test]
    fn sentences_split_and_collapse() {
        let got: Vec<String> = sentences("One two.  Three\n\nfour  five!six ok").collect();
        assert_eq!(got, ["One two.", "four five!six ok"]);
    }

    /// The scores as first written: a map of every sentence's words,
    /// each weight computed where it is summed.
    fn plain_scores(candidates: &[Candidate]) -> Vec<f64> {
        let words: Vec<Vec<String>> = candidates
            .iter()
            .map(|c| {
                let mut words: Vec<String> = c
                    .text
                    .split(|ch: char| !is_word_char(ch))
                    .filter(|w| w.chars().count() >= 4)
                    .map(str::to_lowercase)
                    .collect();
                words.sort_unstable();
                words.dedup();
                words
            })
            .collect();
        let mut df: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        for set in &words {
            for w in set {
                *df.entry(w.as_str()).or_insert(0) += 1;
            }
        }
        candidates
            .iter()
            .zip(&words)
            .map(|(c, set)| {
                let shared: f64 = set
                    .iter()
                    .map(|w| f64::from(df[w.as_str()] - 1).ln_1p())
                    .sum();
                let n = c.text.split_whitespace().count() as f64;
                let code = chunks(&c.text).filter(|(_, w)| chunk_is_anchor(w)).count() as f64;
                let opening = if c.at.1 == 0 { 0.5 } else { 0.0 };
                shared / (n + 1.0).sqrt() + code + opening
            })
            .collect()
    }

    /// The sentences as first split: character by character, collapsed
    /// through a list of words.
    fn plain_sentences(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut end = rest.len();
            let mut iter = rest.char_indices().peekable();
            while let Some((i, c)) = iter.next() {
                let next_space = iter.peek().is_none_or(|&(_, n)| n.is_whitespace());
                if c == '\n' {
                    end = i;
                    break;
                }
                if matches!(c, '.' | '!' | '?') && next_space {
                    end = i + c.len_utf8();
                    break;
                }
            }
            let piece = &rest[..end];
            rest = rest[end..].trim_start_matches(['\n', ' ', '\t', '\r']);
            let collapsed = piece.split_whitespace().collect::<Vec<_>>().join(" ");
            if collapsed.split(' ').count() >= 2 {
                out.push(cut_chars(&collapsed, MAX_SENTENCE_CHARS).to_string());
            }
        }
        out
    }

    /// Random texts of words, code, punctuation, odd white space and
    /// non-ASCII letters.
    fn random_text(rng: &mut crate::testing::Rng) -> String {
        const PIECES: &[&str] = &[
            "Deploy",
            "deploy",
            "the",
            "STAGING",
            "cluster",
            "src/main.rs",
            "error[E0308]:",
            "Grüße",
            "ÉTAT",
            "straße",
            "naïve",
            "x",
            "ok",
            "retry_policy",
            "42",
            "512 MiB",
            ".",
            "!",
            "?",
            ". ",
            "! ",
            "? ",
            "\n",
            "\n\n",
            "\t",
            "\r",
            "\u{a0}",
            "\u{3000}",
            "  ",
            "é.",
            "a.b",
            "v1.2.3",
            "`cargo test`",
            "over-long",
            "İstanbul",
            "ΣΑΣ",
        ];
        let n = rng.index(40);
        let mut t = String::new();
        for _ in 0..n {
            t.push_str(PIECES[rng.index(PIECES.len())]);
            if rng.below(3) != 0 {
                t.push(' ');
            }
        }
        if rng.below(10) == 0 {
            t.push_str(&"long words repeat ".repeat(30));
        }
        t
    }

    #[test]
    fn sentences_and_scores_are_those_first_computed() {
        let mut rng = crate::testing::Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..400 {
            let texts: Vec<String> = (0..rng.index(12)).map(|_| random_text(&mut rng)).collect();
            let mut candidates = Vec::new();
            for (si, t) in texts.iter().enumerate() {
                let got: Vec<String> = sentences(t).collect();
                assert_eq!(got, plain_sentences(t), "round {round}: {t:?}");
                for (k, text) in got.into_iter().enumerate() {
                    candidates.push(Candidate {
                        text,
                        at: (si, k),
                        score: 0.0,
                    });
                }
            }
            let want = plain_scores(&candidates);
            score_sentences(&mut candidates);
            let got: Vec<u64> = candidates.iter().map(|c| c.score.to_bits()).collect();
            let want: Vec<u64> = want.iter().map(|s| s.to_bits()).collect();
            assert_eq!(got, want, "round {round}");
        }
    }

    #[test]
    fn odd_text_does_not_panic() {
        for t in [
            "`", "```", "://", "a::", "::b", "--", "$", "=", "1,", "1.", "/", "é/é", "\u{0301}",
        ] {
            let _ = extract_anchors(t);
            let s = span(1, t);
            let d = summarize(&[&s], 50, 1, &ByteLength);
            assert!(d.tokens <= 50);
        }
    }
}
