//! The built-in summariser: extractive and deterministic.
//!
//! A summary is what remains of evicted narrative in the prompt, so it must
//! keep what an agent cannot reconstruct: the exact file paths, error lines,
//! identifiers, URLs and quantities it was working with. Those are
//! *anchors*, carried verbatim from generation to generation. Prose is the
//! cheap part; a few salient sentences are kept when the budget allows.
//!
//! # Anchors
//!
//! [`extract_anchors`] takes, in order of first appearance, deduplicated:
//!
//! - error lines: a line containing `ERROR`, `FAILED`, `FATAL`, `PANIC`,
//!   `panicked` or `Traceback`; or `error`/`Error`/`fatal`/`failed`/
//!   `exception`/`panic` (any case of the first letter) directly followed by
//!   `:` or `[`; or a word ending in `Error`/`Exception` (`TypeError`,
//!   `NullPointerException`); or a line starting with the word `Error`. The
//!   line is trimmed and capped at [`MAX_ANCHOR_CHARS`] characters;
//! - inline code (between backticks, on one line), trimmed and capped;
//! - URLs (`scheme://...`);
//! - paths: with a `/` (absolute, relative, `~/`, a trailing `/`, two or
//!   more slashes, or one slash with a digit, `_`, `-` or `.` in it — not
//!   `and/or`), Windows paths, and file names with a known extension
//!   (`main.rs`, `Cargo.toml`);
//! - identifiers: `snake_case`, `camelCase`/`PascalCase` with an inner
//!   capital, dotted names (`os.path.join`, not `e.g.`), `a::b`, words
//!   mixing letters and digits (`k8s`, `sha256`, not `2nd`), versions
//!   (`1.2.3`), `--flags`, `$VARS`, `key=value`, kebab-case words with a
//!   digit (`eu-west-1`);
//! - numbers with units, attached (`30s`, `512MiB`, `99.9%`, `8080/tcp`)
//!   or after one space (`512 MiB`, `30 seconds`).
//!
//! Plain English words, plain numbers, acronyms and plain kebab-case
//! (`well-known`) are not anchors.
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

use crate::classify::{code_ranges, is_word_char};
use crate::fasthash::{self, FastSet};
use crate::span::{Span, SpanClass, SpanId};
use crate::tokens::TokenCounter;

/// The longest anchor, in characters; longer error lines and inline code
/// are cut (on a character boundary) to this many.
pub const MAX_ANCHOR_CHARS: usize = 200;

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

/// The anchors a span obliges the next summary to carry: a summary's
/// recorded anchors, or the anchors of an original span's text.
pub(crate) fn required_anchors(span: &Span) -> Vec<String> {
    match &span.summary {
        Some(info) => info.anchors.clone(),
        None => extract_anchors(&span.text),
    }
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
    let max_tokens = limits.max_tokens;
    let max_generation = max_generations.max(1);
    let highest = evicted.iter().map(|s| s.generation).max().unwrap_or(0);
    let generation = highest.saturating_add(1).min(max_generation);
    let covers: Vec<SpanId> = evicted.iter().map(|s| s.id).collect();

    let mut seen: FastSet<String> = fasthash::set(evicted.len());
    let mut candidates: Vec<String> = Vec::new();
    for span in evicted {
        for anchor in required_anchors(span) {
            if !anchor.is_empty() && !seen.contains(&anchor) {
                seen.insert(anchor.clone());
                candidates.push(anchor);
            }
        }
    }

    let writer = Writer {
        counter,
        spans: covers.len(),
        generation,
        max_tokens,
        anchor_tokens: limits.anchor_tokens.min(max_tokens),
    };
    let kept = writer.choose_anchors(&candidates);
    let mut rendered: Vec<String> = kept.iter().map(|&i| candidates[i].clone()).collect();
    let mut dropped = candidates.len() - carried(&candidates, &rendered, &[]).len();

    let originals: Vec<&Span> = evicted.iter().copied().filter(|s| !is_summary(s)).collect();
    let used = writer.measure(&rendered, &[], dropped);
    let prose_room = max_tokens.min(limits.prose_tokens).saturating_sub(used);
    let mut sentences = choose_sentences(&originals, &seen, prose_room, counter);

    // Pieces were counted one by one; the final text is what counts. Trim
    // from the end until it fits (sentences first, then anchors).
    let mut text = writer.render(&rendered, &sentences, dropped);
    let mut tokens = counter.count(&text);
    while tokens > max_tokens {
        let over = tokens - max_tokens;
        let mut freed = 0u32;
        while freed < over {
            if let Some(s) = sentences.pop() {
                freed = freed.saturating_add(counter.count(&s).saturating_add(2));
            } else if let Some(next) = least_valuable(&rendered) {
                let a = rendered.remove(next);
                dropped += 1;
                freed = freed.saturating_add(counter.count(&a).saturating_add(2));
            } else {
                break;
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
        return candidates
            .iter()
            .filter(|c| body.contains(c.as_str()))
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
    let a = &anchors[i];
    (
        anchor_rank(a),
        std::cmp::Reverse(a.len()),
        std::cmp::Reverse(i),
    )
}

/// The index of the anchor to drop next.
fn least_valuable(anchors: &[String]) -> Option<usize> {
    (0..anchors.len()).min_by_key(|&i| keep_key(anchors, i))
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
        if bytes <= 16 * u64::from(room) && self.counter.count(&candidates.join(" | ")) <= room {
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
            let cost = self.counter.count(&candidates[i]).saturating_add(2);
            if cost > room {
                // A shorter anchor further down may still fit.
                continue;
            }
            room -= cost;
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
        let cost = counter.count(&candidates[i].text).saturating_add(2);
        if cost <= left {
            left -= cost;
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
fn score_sentences(candidates: &mut [Candidate]) {
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
    for (c, set) in candidates.iter_mut().zip(&words) {
        let shared: f64 = set
            .iter()
            .map(|w| f64::from(df.get(w.as_str()).copied().unwrap_or(1) - 1).ln_1p())
            .sum();
        let n = c.text.split_whitespace().count() as f64;
        let code = chunks(&c.text).filter(|(_, w)| chunk_is_anchor(w)).count() as f64;
        let opening = if c.at.1 == 0 { 0.5 } else { 0.0 };
        c.score = shared / (n + 1.0).sqrt() + code + opening;
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
                return Some(cut_chars(&collapsed, MAX_SENTENCE_CHARS).to_string());
            }
        }
    })
}

/// At most `max` characters of `s`, cut on a character boundary.
pub(crate) fn cut_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The anchors of a text: strings that must survive summarisation
/// verbatim. Deduplicated, in order of first appearance; every anchor is a
/// substring of `text`.
pub fn extract_anchors(text: &str) -> Vec<String> {
    let mut found: Vec<(usize, &str)> = Vec::new();
    let mut offset = 0;
    let lines = if may_report_error(text) { text } else { "" };
    for line in lines.split('\n') {
        let trimmed = line.trim();
        if !trimmed.is_empty() && may_report_error(trimmed) && is_error_line(trimmed) {
            let lead = line.len() - line.trim_start().len();
            found.push((
                offset + lead,
                cut_chars(trimmed, MAX_ANCHOR_CHARS).trim_end(),
            ));
        }
        offset += line.len() + 1;
    }
    for (start, end) in code_ranges(text) {
        let inner = &text[start..end];
        if inner.starts_with("```") {
            continue;
        }
        let content = inner.trim_matches('`').trim();
        if !content.is_empty() {
            let at = start + inner.find(content).unwrap_or(0);
            found.push((at, cut_chars(content, MAX_ANCHOR_CHARS).trim_end()));
        }
    }
    let mut all = chunks(text).peekable();
    while let Some((at, word)) = all.next() {
        if chunk_is_anchor(word) {
            found.push((at, word));
        } else if is_plain_number(word)
            && let Some(&(next_at, unit)) = all.peek()
            && &text[at + word.len()..next_at] == " "
            && is_separate_unit(unit)
        {
            found.push((at, &text[at..next_at + unit.len()]));
        }
    }
    found.sort_by_key(|&(at, _)| at);
    found.retain(|(_, a)| !a.is_empty());
    let mut out: Vec<String> = Vec::with_capacity(found.len());
    if found.len() <= 16 {
        for (_, a) in found {
            if !out.iter().any(|o| o == a) {
                out.push(a.to_string());
            }
        }
    } else {
        let mut seen = fasthash::set(found.len());
        for (_, a) in found {
            if seen.insert(a) {
                out.push(a.to_string());
            }
        }
    }
    out
}

/// A cheap test that rules out most lines: an error line contains one of
/// these words, in some case.
fn may_report_error(line: &str) -> bool {
    let b = line.as_bytes();
    let at = |i: usize, stem: &[u8]| {
        b.get(i..i + stem.len())
            .is_some_and(|w| w.eq_ignore_ascii_case(stem))
    };
    // Only the stems that start with the byte's letter can match there.
    (0..b.len()).any(|i| match b[i] | 0x20 {
        b'e' => at(i, b"error") || at(i, b"exception"),
        b'f' => at(i, b"fail") || at(i, b"fatal"),
        b'p' => at(i, b"panic"),
        b't' => at(i, b"traceback"),
        _ => false,
    })
}

/// Whether a trimmed line reports an error.
fn is_error_line(line: &str) -> bool {
    let mut first = true;
    let mut rest = line;
    while let Some(start) = rest.find(is_word_char) {
        let after = &rest[start..];
        let len = after
            .find(|c: char| !is_word_char(c))
            .unwrap_or(after.len());
        let word = &after[..len];
        let next = after[len..].chars().next();
        if matches!(
            word,
            "ERROR" | "FAILED" | "FATAL" | "PANIC" | "panicked" | "Traceback"
        ) {
            return true;
        }
        let lower_first = word.len() > 1 && {
            let mut cs = word.chars();
            let head = cs.next().map(|c| c.to_ascii_lowercase());
            let tail = cs.as_str();
            matches!(
                (head, tail),
                (Some('e'), "rror")
                    | (Some('f'), "atal")
                    | (Some('f'), "ailed")
                    | (Some('e'), "xception")
                    | (Some('p'), "anic")
            )
        };
        if lower_first && matches!(next, Some(':' | '[')) {
            return true;
        }
        if (word.len() > 5 && word.ends_with("Error"))
            || (word.len() > 9 && word.ends_with("Exception"))
        {
            return true;
        }
        if first && word == "Error" {
            return true;
        }
        first = false;
        rest = &after[len..];
    }
    false
}

const LEADING_WRAP: &[char] = &[
    '(', '[', '{', '<', '"', '\'', '`', '\u{201c}', '\u{2018}', '*',
];
const TRAILING_WRAP: &[char] = &[
    ')', ']', '}', '>', '"', '\'', '`', '\u{201d}', '\u{2019}', ',', ';', ':', '.', '!', '?', '*',
];

/// The white-space separated chunks of a text, stripped of wrapping
/// punctuation, with their byte offsets.
pub(crate) fn chunks(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split_whitespace().filter_map(move |raw| {
        let at = raw.as_ptr() as usize - text.as_ptr() as usize;
        // Most chunks start and end with a letter or digit: then there is
        // nothing to strip, and no character needs decoding to tell.
        let stripped = match raw.as_bytes().first() {
            Some(&b) if b < 0x80 && !LEADING_ASCII[usize::from(b)] => raw,
            _ => raw.trim_start_matches(LEADING_WRAP),
        };
        let lead = raw.len() - stripped.len();
        let core = match stripped.as_bytes().last() {
            Some(&b) if b < 0x80 && !TRAILING_ASCII[usize::from(b)] => stripped,
            _ => stripped.trim_end_matches(TRAILING_WRAP),
        };
        (!core.is_empty()).then_some((at + lead, core))
    })
}

/// The ASCII characters of a wrap list, as a table by byte.
const fn ascii_table(chars: &[char]) -> [bool; 128] {
    let mut t = [false; 128];
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i] as u32;
        if c < 128 {
            t[c as usize] = true;
        }
        i += 1;
    }
    t
}

static LEADING_ASCII: [bool; 128] = ascii_table(LEADING_WRAP);
static TRAILING_ASCII: [bool; 128] = ascii_table(TRAILING_WRAP);

/// Whether a stripped chunk is an anchor on its own.
pub(crate) fn chunk_is_anchor(w: &str) -> bool {
    if plain_word(w) || !w.chars().any(char::is_alphanumeric) {
        return false;
    }
    is_url(w)
        || is_path(w)
        || is_number_with_unit(w)
        || is_version(w)
        || is_identifier(w)
        || is_file_name(w)
}

/// ASCII letters without an inner capital: an English word, never an
/// anchor. Most chunks are rejected here without further work.
fn plain_word(w: &str) -> bool {
    let mut prev_lower = false;
    for &b in w.as_bytes() {
        if !b.is_ascii_alphabetic() || (prev_lower && b.is_ascii_uppercase()) {
            return false;
        }
        prev_lower = b.is_ascii_lowercase();
    }
    true
}

fn is_url(w: &str) -> bool {
    match w.find("://") {
        Some(i) if i > 0 => {
            w[..i]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
                && w.len() > i + 3
        }
        _ => false,
    }
}

fn is_path(w: &str) -> bool {
    let b = w.as_bytes();
    if b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && b[2] == b'\\' {
        return true;
    }
    if !w.contains('/') || w.contains("://") {
        return false;
    }
    if w.len() < 2 {
        return false;
    }
    if w.starts_with('/') || w.starts_with("./") || w.starts_with("../") || w.starts_with("~/") {
        return true;
    }
    if let Some(dir) = w.strip_suffix('/') {
        return dir.chars().any(char::is_alphanumeric);
    }
    let slashes = w.matches('/').count();
    if slashes >= 2 {
        return true;
    }
    let (left, right) = w.split_once('/').unwrap_or((w, ""));
    if left.is_empty() || right.is_empty() {
        return false;
    }
    if w.chars().all(|c| c.is_ascii_digit() || c == '/') {
        return false;
    }
    let plain = |s: &str| s.chars().all(char::is_alphabetic);
    !(plain(left) && plain(right))
}

fn number_prefix(w: &str) -> usize {
    let b = w.as_bytes();
    let mut i = 0;
    let mut digits = 0;
    while i < b.len() {
        match b[i] {
            b'0'..=b'9' => {
                digits += 1;
                i += 1;
            }
            b',' | b'.' if digits > 0 && i + 1 < b.len() && b[i + 1].is_ascii_digit() => {
                i += 1;
            }
            _ => break,
        }
    }
    if digits == 0 { 0 } else { i }
}

pub(crate) fn is_plain_number(w: &str) -> bool {
    let n = number_prefix(w);
    n > 0 && n == w.len()
}

const UNITS: &[&str] = &[
    "ns", "us", "µs", "ms", "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute",
    "minutes", "h", "hr", "hrs", "hour", "hours", "d", "day", "days", "w", "wk", "week", "weeks",
    "b", "kb", "mb", "gb", "tb", "pb", "kib", "mib", "gib", "tib", "k", "byte", "bytes", "tok",
    "tokens", "%", "x", "rps", "qps", "hz", "khz", "mhz", "ghz", "px", "em", "rem", "kbps", "mbps",
    "gbps", "cpu", "cpus", "vcpu", "vcpus", "cores", "mi", "gi", "ki",
];

fn is_unit(u: &str) -> bool {
    UNITS.iter().any(|unit| unit.eq_ignore_ascii_case(u))
}

fn is_number_with_unit(w: &str) -> bool {
    let n = number_prefix(w);
    if n == 0 || n == w.len() {
        return false;
    }
    let rest = &w[n..];
    if is_unit(rest) {
        return true;
    }
    match rest.strip_prefix('/') {
        Some(proto) => !proto.is_empty() && proto.chars().all(|c| c.is_ascii_alphabetic()),
        None => false,
    }
}

pub(crate) fn is_separate_unit(u: &str) -> bool {
    (u.chars().count() >= 2 || u == "%") && is_unit(u)
}

fn is_version(w: &str) -> bool {
    let body = w.strip_prefix('v').unwrap_or(w);
    body.split('.').count() >= 3
        && body
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
}

const EXTENSIONS: &[&str] = &[
    "rs",
    "py",
    "js",
    "ts",
    "tsx",
    "jsx",
    "go",
    "java",
    "kt",
    "c",
    "h",
    "cc",
    "cpp",
    "hpp",
    "cs",
    "rb",
    "php",
    "swift",
    "scala",
    "sh",
    "bash",
    "zsh",
    "toml",
    "yaml",
    "yml",
    "json",
    "md",
    "txt",
    "conf",
    "cfg",
    "ini",
    "lock",
    "log",
    "sql",
    "proto",
    "html",
    "css",
    "xml",
    "tf",
    "env",
    "csv",
    "tsv",
    "ipynb",
    "gradle",
    "mk",
    "cmake",
    "dockerfile",
    "service",
    "pem",
    "crt",
    "key",
    "gz",
    "zip",
    "tar",
    "wasm",
    "so",
    "dll",
    "exe",
    "bin",
    "pdf",
    "png",
    "jpg",
];

fn is_file_name(w: &str) -> bool {
    match w.rsplit_once('.') {
        Some((name, ext)) => {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| is_word_char(c) || matches!(c, '-' | '.'))
                && EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str())
        }
        None => false,
    }
}

fn is_identifier(w: &str) -> bool {
    if w.len() <= 5 && !w.starts_with(|c: char| c.is_ascii_digit()) && is_unit(w) {
        return false;
    }
    if let Some(i) = w.find("::") {
        let (l, r) = (&w[..i], &w[i + 2..]);
        return l.chars().next_back().is_some_and(is_word_char)
            && r.chars().next().is_some_and(is_word_char);
    }
    if let Some(flag) = w.strip_prefix("--") {
        return flag.chars().next().is_some_and(char::is_alphabetic)
            && flag
                .chars()
                .all(|c| is_word_char(c) || matches!(c, '-' | '='));
    }
    if let Some(var) = w.strip_prefix('$') {
        let var = var.trim_start_matches('{').trim_end_matches('}');
        return var
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && var.chars().all(is_word_char);
    }
    if let Some((k, v)) = w.split_once('=') {
        return !k.is_empty()
            && !v.is_empty()
            && k.chars().all(|c| is_word_char(c) || c == '-')
            && k.chars().any(char::is_alphabetic);
    }
    if w.contains('.') {
        return w.split('.').all(|p| {
            p.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && p.chars().all(is_word_char)
        }) && w.split('.').any(|p| p.chars().count() >= 2);
    }
    if w.contains('-') {
        return w
            .split('-')
            .all(|p| !p.is_empty() && p.chars().all(char::is_alphanumeric))
            && w.chars().any(|c| c.is_ascii_digit())
            && w.chars().any(char::is_alphabetic);
    }
    if !w.chars().all(is_word_char) {
        return false;
    }
    if w.contains('_') {
        return w.chars().any(char::is_alphanumeric);
    }
    let has_digit = w.chars().any(|c| c.is_ascii_digit());
    let has_alpha = w.chars().any(char::is_alphabetic);
    if has_digit && has_alpha && w.chars().count() >= 2 {
        let lower = w.to_ascii_lowercase();
        let ordinal = ["st", "nd", "rd", "th"].iter().any(|s| {
            lower
                .strip_suffix(s)
                .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
        });
        return !ordinal;
    }
    // An inner capital after a lower-case letter: camelCase, PascalCase.
    let mut prev_lower = false;
    for c in w.chars() {
        if c.is_uppercase() && prev_lower {
            return true;
        }
        prev_lower = c.is_lowercase();
    }
    false
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
        }
    }

    #[test]
    fn anchors_by_table() {
        let cases: &[(&str, &[&str])] = &[
            ("edit src/main.rs now", &["src/main.rs"]),
            ("see /etc/x.conf.", &["/etc/x.conf"]),
            (
                "Refactor k8s/staging/deploy.yaml please",
                &["k8s/staging/deploy.yaml"],
            ),
            (
                "error: could not compile `ctxbroker`",
                &["error: could not compile `ctxbroker`", "ctxbroker"],
            ),
            (
                "thread 'main' panicked at src/lib.rs:10:5",
                &[
                    "thread 'main' panicked at src/lib.rs:10:5",
                    "src/lib.rs:10:5",
                ],
            ),
            (
                "call `fetch_all` then parse_rows and HashMap",
                &["fetch_all", "parse_rows", "HashMap"],
            ),
            ("use std::sync::Arc here", &["std::sync::Arc"]),
            (
                "docs at https://example.com/a?b=c).",
                &["https://example.com/a?b=c"],
            ),
            ("limit is 512 MiB and timeout 30s", &["512 MiB", "30s"]),
            (
                "open 8080/tcp and wait 5 minutes",
                &["8080/tcp", "5 minutes"],
            ),
            ("bump to v0.34.7 in Cargo.toml", &["v0.34.7", "Cargo.toml"]),
            ("region eu-west-1 on k8s", &["eu-west-1", "k8s"]),
            (
                "run with --force and $HOME set, RUST_LOG=debug",
                &["--force", "$HOME", "RUST_LOG=debug"],
            ),
            ("call os.path.join, e.g. for paths", &["os.path.join"]),
            ("The quick brown fox jumps over the lazy dog.", &[]),
            (
                "We tried and/or considered 3 options on the 2nd day, a well-known API.",
                &[],
            ),
            ("I think the error is in the parser", &[]),
            (
                "TypeError: x is undefined",
                &["TypeError: x is undefined", "TypeError"],
            ),
            ("", &[]),
        ];
        for (text, want) in cases {
            let got = extract_anchors(text);
            let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            assert_eq!(got, want, "{text:?}");
            for a in &got {
                assert!(text.contains(a.as_str()));
            }
        }
    }

    #[test]
    fn anchors_are_deduplicated_in_order() {
        let got = extract_anchors("a src/a.rs b src/b.rs c src/a.rs");
        assert_eq!(got, ["src/a.rs", "src/b.rs"]);
    }

    #[test]
    fn long_error_lines_are_cut_on_a_char_boundary() {
        let line = format!("ERROR {}", "é".repeat(500));
        let got = extract_anchors(&line);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].chars().count(), MAX_ANCHOR_CHARS);
        assert!(line.contains(&got[0]));
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

    /// The stripped chunks and the error-stem test as first written
    /// (generic character matching, every stem at every candidate byte),
    /// against the byte-level shortcuts.
    #[test]
    fn shortcuts_agree_with_the_plain_definitions() {
        fn plain_chunks(text: &str) -> Vec<(usize, &str)> {
            text.split_whitespace()
                .filter_map(|raw| {
                    let at = raw.as_ptr() as usize - text.as_ptr() as usize;
                    let stripped = raw.trim_start_matches(LEADING_WRAP);
                    let lead = raw.len() - stripped.len();
                    let core = stripped.trim_end_matches(TRAILING_WRAP);
                    (!core.is_empty()).then_some((at + lead, core))
                })
                .collect()
        }
        fn plain_may_report_error(line: &str) -> bool {
            const STEMS: [&[u8]; 6] = [
                b"error",
                b"fail",
                b"fatal",
                b"panic",
                b"traceback",
                b"exception",
            ];
            let b = line.as_bytes();
            (0..b.len()).any(|i| {
                STEMS.iter().any(|stem| {
                    b.get(i..i + stem.len())
                        .is_some_and(|w| w.eq_ignore_ascii_case(stem))
                })
            })
        }
        let texts = [
            "(see `src/main.rs`), then [retry] {twice}; <ok> \"quoted\" 'single' *bold*",
            "\u{201c}curly\u{201d} \u{2018}single\u{2019} ...!?, a. b: c;",
            "ERROR: Failed to start; FATAL panic! Traceback (most recent call last) TypeError",
            "eRRor FaIl fAtAl PaNiC tRaCeBaCk ExCePtIoN exceptio erro fai",
            "Ünïcödé «guillemets» — dash, 日本語。 🦀!",
            "",
            "   ",
            "((( ))) ``` *** ... ,,,",
            "E F P T e f p t",
        ];
        for text in texts {
            assert_eq!(
                chunks(text).collect::<Vec<_>>(),
                plain_chunks(text),
                "{text:?}"
            );
            assert_eq!(
                may_report_error(text),
                plain_may_report_error(text),
                "{text:?}"
            );
            for line in text.split(['\n', ' ']) {
                assert_eq!(
                    may_report_error(line),
                    plain_may_report_error(line),
                    "{line:?}"
                );
            }
        }
    }
}
