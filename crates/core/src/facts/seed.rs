//! A span's facts in the coordinates of its own text, packed: what the
//! store keeps in the span's row, so that a session read back from the
//! store takes its facts from there instead of deriving them again.
//!
//! A seed holds what deriving the facts reads the whole text for: the
//! span's length in words, the byte range of the first appearance of each
//! distinct matchable word with its count (in order of first appearance),
//! and the byte ranges of the text's anchors (none for a summary, whose
//! anchors are recorded in the span). Word ids are the session's, so
//! they are not kept: reading a seed lower-cases each word's first
//! appearance and interns it, one lookup per distinct word where deriving
//! costs one per word, and no anchor rule runs at all.
//!
//! Layout: [`SEED_RULES`] (one byte), then varints: the length in words,
//! the count of distinct words, per word the gap from the previous word's
//! start and its length in bytes times two, plus one when the word appears
//! more than once, then followed by its count (most words appear once: a
//! short span's seed is then two bytes a word); the count of anchors, per
//! anchor the signed (zigzag) gap from the previous anchor's start and
//! its length.
//!
//! A seed is read only if it was written under the same rules and fits
//! its text (every range inside it, on character boundaries, each a word
//! the rules count); otherwise the facts are derived from the text, as
//! for a span stored without one.

use std::borrow::Cow;

use crate::fasthash::{self, FastMap};
use crate::relevance::{counted_word_in, for_each_counted_word_at};
use crate::span::Span;
use crate::text::anchor_ranges;
use crate::varint;

/// The version of the rules a seed's words and anchors were found by.
/// A seed written under other rules is not read. Raise it whenever the
/// word rules of [`crate::relevance`] or the anchor rules of
/// [`crate::text`] change what they find in some text: the test
/// `seeds_of_a_fixed_corpus_are_pinned` fails until it is raised (and
/// its digest updated).
pub const SEED_RULES: u8 = 1;

/// Distinct words found by a linear scan before a map is built.
const LINEAR: usize = 16;

/// Texts shorter than this get no seed: their facts are derived again
/// when a session is read back. Reading a short span's seed saves about
/// 2 µs per span at a reload, against seeds of about 29 % of the text's
/// bytes written for every span and derived at every admission; a tool
/// output's saves about 30 ns per byte of text for 11 % (see
/// docs/benchmarks.md, Facts read from the store).
pub const SEED_MIN_BYTES: usize = 1024;

/// The seed `span` is stored with: derived from its text when the text
/// is at least [`SEED_MIN_BYTES`] long (and short enough for 32-bit
/// offsets), else `None` (its facts are derived when needed).
pub fn seed(span: &Span) -> Option<Vec<u8>> {
    match span.text.len() >= SEED_MIN_BYTES {
        true => seed_of(span),
        false => None,
    }
}

/// The seed of `span`, whatever its length: `None` for a text too long
/// for 32-bit offsets (its facts are always derived).
pub(crate) fn seed_of(span: &Span) -> Option<Vec<u8>> {
    let text = span.text.as_str();
    u32::try_from(text.len()).ok()?;
    // Each distinct word's first range and count, found by name: a slice
    // of the text when it is already lower-case, else the lowered copy.
    let mut firsts: Vec<(usize, usize, u32)> = Vec::new();
    let mut few: Vec<Cow<'_, str>> = Vec::new();
    let mut many: FastMap<Cow<'_, str>, usize> = fasthash::map(0);
    let words = for_each_counted_word_at(text, |w, start, end| {
        let found = match firsts.len() <= LINEAR {
            true => few.iter().position(|n| n == w),
            false => many.get(w).copied(),
        };
        if let Some(k) = found {
            firsts[k].2 = firsts[k].2.saturating_add(1);
            return;
        }
        let name = match text.get(start..end) {
            Some(slice) if slice == w => Cow::Borrowed(slice),
            _ => Cow::Owned(w.to_owned()),
        };
        if firsts.len() == LINEAR {
            many.extend(few.drain(..).enumerate().map(|(k, n)| (n, k)));
        }
        match firsts.len() >= LINEAR {
            true => {
                many.insert(name, firsts.len());
            }
            false => few.push(name),
        }
        firsts.push((start, end, 1));
    });
    let anchors = match span.summary {
        Some(_) => Vec::new(),
        None => anchor_ranges(text),
    };
    let mut out = Vec::with_capacity(8 + 4 * firsts.len() + 4 * anchors.len());
    out.push(SEED_RULES);
    varint::put(&mut out, u64::from(words));
    varint::put(&mut out, firsts.len() as u64);
    let mut previous = 0usize;
    for &(start, end, count) in &firsts {
        varint::put(&mut out, start.checked_sub(previous)? as u64);
        let len = end.checked_sub(start)? as u64;
        varint::put(&mut out, len << 1 | u64::from(count > 1));
        if count > 1 {
            varint::put(&mut out, u64::from(count));
        }
        previous = start;
    }
    varint::put(&mut out, anchors.len() as u64);
    let mut previous = 0i64;
    for &(start, end) in &anchors {
        let at = i64::try_from(start).ok()?;
        varint::put(&mut out, zigzag(at - previous));
        varint::put(&mut out, end.checked_sub(start)? as u64);
        previous = at;
    }
    Some(out)
}

/// A seed read back against its span's text.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Read {
    /// The span's length in words.
    pub(super) words: u32,
    /// Every distinct word, lower-cased, one after the other.
    pub(super) names: String,
    /// Per distinct word, in order of first appearance: where its name
    /// ends in `names`, and its count.
    pub(super) terms: Vec<(usize, u32)>,
    /// The anchors' byte ranges.
    pub(super) anchors: Vec<(u32, u32)>,
}

/// Reads `seed` against `span`'s text; `None` when it was written under
/// other rules or does not fit the text (see the module documentation).
pub(super) fn read(seed: &[u8], span: &Span) -> Option<Read> {
    let text = span.text.as_str();
    if seed.first() != Some(&SEED_RULES) {
        return None;
    }
    let mut at = 1;
    let mut next = || varint::get(seed, &mut at);
    let words = u32::try_from(next()?).ok()?;
    // A counted word is at least two bytes long: a larger count cannot
    // fit the text, and is not allocated for.
    let n = usize::try_from(next()?)
        .ok()
        .filter(|&n| n <= text.len() / 2)?;
    let mut read = Read {
        words,
        names: String::new(),
        terms: Vec::with_capacity(n),
        anchors: Vec::new(),
    };
    let mut buf = String::new();
    let mut previous = 0usize;
    let mut counted = 0u64;
    for k in 0..n {
        let gap = usize::try_from(next()?).ok()?;
        if k > 0 && gap == 0 {
            return None;
        }
        let start = previous.checked_add(gap)?;
        let len = next()?;
        let end = start.checked_add(usize::try_from(len >> 1).ok()?)?;
        let count = match len & 1 {
            0 => 1,
            _ => u32::try_from(next()?).ok().filter(|&c| c > 1)?,
        };
        if !counted_word_in(text, start, end, &mut buf) {
            return None;
        }
        read.names.push_str(&buf);
        read.terms.push((read.names.len(), count));
        counted += u64::from(count);
        previous = start;
    }
    if counted > u64::from(words) {
        return None;
    }
    let anchors = usize::try_from(next()?).ok().filter(|&a| a <= text.len())?;
    if anchors > 0 && span.summary.is_some() {
        return None;
    }
    read.anchors.reserve(anchors);
    let mut previous = 0i64;
    for _ in 0..anchors {
        let start = previous.checked_add(unzigzag(next()?))?;
        let end = start.checked_add(i64::try_from(next()?).ok()?)?;
        let (start32, end32) = (u32::try_from(start).ok()?, u32::try_from(end).ok()?);
        text.get(start32 as usize..end32 as usize)?;
        read.anchors.push((start32, end32));
        previous = start;
    }
    (at == seed.len()).then_some(read)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::LiveFacts;
    use crate::span::Role;
    use crate::testing::{Rng, admitted};

    fn span(id: u64, text: &str) -> Span {
        admitted(id, id, Role::Tool, text)
    }

    /// Texts of every kind the rules treat apart: ASCII and not, mixed
    /// case, words the rules skip, paths, errors, numbers and units.
    fn corpus() -> Vec<String> {
        let mut texts: Vec<String> = [
            "",
            "a",
            "Never write to the `prod` namespace.",
            "Error: connection refused at /var/run/app.sock (errno 111); retried 3 times",
            "DEPLOY deploy Deploy dEpLoY web-1 web-2 web-10 WEB-1",
            "Straße STRASSE straße İstanbul ıi Ǆemal ǅ ǆ — München, Zürich, Ürün",
            "src/store/writer.rs:412: thread 'main' panicked at 'index out of bounds'",
            "https://example.com/a/b?c=d#e and 192.168.0.1:8080, 250ms, 3.5GiB, v1.2.3",
            "日本語のテキストと English words 混在 mixed 123 ４５６",
            "the of in on at is it be as by or an we if so do",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        let mut rng = Rng(0x5eed);
        let pieces = [
            "Word",
            "word",
            "WORD",
            "über",
            "ÜBER",
            "x",
            "id_42",
            "E0308",
            "/tmp/x.log",
            "ß",
            "Σίσυφος",
            "ΣΊΣΥΦΟΣ",
            "k8s",
            "--force",
            "\n",
            " ",
            ", ",
            "...",
            "🙂",
            "ERROR",
            "warning:",
            "0x7ffd",
            "café",
            "CAFÉ",
            "naïve",
            "`prod`",
            "must",
            "never",
        ];
        for _ in 0..200 {
            let n = rng.index(60);
            let mut t = String::new();
            for _ in 0..n {
                t.push_str(pieces[rng.index(pieces.len())]);
                if rng.below(3) > 0 {
                    t.push(' ');
                }
            }
            texts.push(t);
        }
        texts
    }

    #[test]
    fn facts_read_from_seeds_equal_facts_derived_from_the_text() {
        let spans: Vec<Span> = corpus()
            .iter()
            .enumerate()
            .map(|(k, t)| span(k as u64 + 1, t))
            .collect();
        let seeds: Vec<Option<Box<[u8]>>> = spans
            .iter()
            .map(|s| seed_of(s).map(Vec::into_boxed_slice))
            .collect();
        // Every seed is read, none falls back to the text.
        for (s, seed) in spans.iter().zip(&seeds) {
            assert!(
                seed.as_deref().and_then(|seed| read(seed, s)).is_some(),
                "{:?}",
                s.text
            );
        }
        let from_text = LiveFacts::of(&spans);
        let from_seeds = LiveFacts::of_seeded(&spans, &seeds);
        assert_eq!(from_seeds.canonical(), from_text.canonical());
        assert_eq!(from_seeds.heap_bytes(), from_text.heap_bytes());
    }

    #[test]
    fn a_seed_that_does_not_fit_its_text_is_not_read() {
        let s = span(
            1,
            "Deploy web-1 to staging; never touch prod. See /etc/app.yaml",
        );
        let good = seed_of(&s).unwrap_or_default();
        assert!(read(&good, &s).is_some());
        // Other rules.
        let mut other = good.clone();
        other[0] = SEED_RULES.wrapping_add(1);
        assert_eq!(read(&other, &s), None);
        // Cut short, or with bytes past its end.
        assert_eq!(read(&good[..good.len() - 1], &s), None);
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(read(&longer, &s), None);
        // Another text: ranges off the words, or past the end.
        assert_eq!(read(&good, &span(1, "deploy")), None);
        assert_eq!(read(&good, &span(1, "Ünïcode everywhere, ünïcode")), None);
        // A summary records its anchors: a seed with anchors is not its.
        let mut summary = s.clone();
        summary.summary = Some(Default::default());
        assert_eq!(read(&good, &summary), None);
        // Every single byte changed: refused or read, never a panic, and
        // the span gets facts either way (the row's checksum is what
        // stops a damaged seed from being read at all).
        for k in 0..good.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[k] = v;
                let mut facts = LiveFacts::default();
                facts.push(&s, Some(&bad));
                assert_eq!(facts.len(), 1);
            }
        }
    }

    #[test]
    fn seeds_of_a_fixed_corpus_are_pinned() {
        // The seeds of the corpus, hashed (FNV-1a). When this fails, the
        // word or anchor rules changed what they find: raise SEED_RULES
        // so that seeds already stored are derived again, then update
        // the digest here.
        let mut digest = 0xcbf2_9ce4_8422_2325u64;
        for (k, t) in corpus().iter().enumerate() {
            for b in seed_of(&span(k as u64 + 1, t)).unwrap_or_default() {
                digest = (digest ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        assert_eq!(
            (SEED_RULES, digest),
            (1, 0x5529_4f30_6021_a16d),
            "the seeds of the fixed corpus changed"
        );
    }

    #[test]
    fn only_texts_of_the_threshold_or_longer_are_seeded() {
        let short = span(1, &"word ".repeat(SEED_MIN_BYTES / 5 - 1));
        assert!(short.text.len() < SEED_MIN_BYTES);
        assert_eq!(seed(&short), None);
        assert!(seed_of(&short).is_some());
        let long = span(2, &"word ".repeat(SEED_MIN_BYTES / 5 + 1));
        assert_eq!(seed(&long), seed_of(&long));
        assert!(seed(&long).is_some());
    }

    #[test]
    fn zigzag_round_trips() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            i64::from(u32::MAX),
            -i64::from(u32::MAX),
        ] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }
}
