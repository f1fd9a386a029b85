//! The modal phrase rules: which modality (prohibition, restriction,
//! requirement, correction) a text expresses. A constraint's predicate
//! takes its modality from here, and a compressed form must still express
//! it. (Whether a span is a standing instruction at all is the model's
//! decision, in the parent module.)
//!
//! # What fires
//!
//! A phrase fires when it occurs in prose, matched case-insensitively on
//! whole words (typographic apostrophes count as `'`). Text inside
//! backticks and fenced code blocks is not prose.
//!
//! | modality | phrases |
//! |---|---|
//! | prohibition | never, do not, don't, dont, must not, mustn't, must never, shall not, shan't, should not, shouldn't, should never, may not, you cannot, you can't, you can not, not allowed, not permitted, forbidden, prohibited, disallowed, forbid, under no circumstances, refrain from, avoid |
//! | restriction | only, exclusively, solely, nothing but, nothing except, restricted to, limited to, at most, no more than, at least, no less than, no fewer than |
//! | requirement | always, must, ensure, make sure, be sure to, remember to, required, mandatory, shall, you need to, you have to, you should |
//! | correction | actually, instead, correction, i said, i meant, scratch that, rather than, not X but Y (within six words), X, not Y |
//!
//! When phrases of several modalities occur, the text's modality is the
//! first of prohibition, restriction, requirement, correction that has a
//! hit. At one position the longest phrase wins and consumes its words,
//! which is what makes "must not" a prohibition rather than a requirement.
//!
//! A few patterns never express a modality: idioms ("never mind", "not
//! only", "if only", "only just"), report clauses (a subject pronoun other
//! than "you", up to three adverbs, then a verb reporting an observation:
//! "I never saw this", "it only fails on CI"), and "X, not Y" where "not"
//! starts an idiom ("not sure", "not yet").

use std::borrow::Cow;
use std::sync::OnceLock;

use super::lexicon::FnvMap;
use super::word::Pending;
use crate::span::Modality;
use crate::text::char_at;

/// The modality a text expresses; `None` when no rule fires.
///
/// Used to derive a predicate's modality from a constraint's text, and to
/// check that a compressed form still expresses it.
pub fn modality_of(text: &str) -> Option<Modality> {
    analyse(text).primary().map(|hit| hit.modality)
}

/// The lower-case name of a modality, as used in rule names and in
/// `modality:...` entries of a failed predicate check.
pub fn modality_name(modality: Modality) -> &'static str {
    match modality {
        Modality::Prohibition => "prohibition",
        Modality::Restriction => "restriction",
        Modality::Requirement => "requirement",
        Modality::Correction => "correction",
    }
}

/// The modalities in order of precedence.
pub(crate) const PRECEDENCE: [Modality; 4] = [
    Modality::Prohibition,
    Modality::Restriction,
    Modality::Requirement,
    Modality::Correction,
];

/// A whole word of prose, lower-cased, with where it stands.
#[derive(Debug, Clone)]
pub(crate) struct Word<'a> {
    /// Lower-cased, typographic apostrophes replaced by `'`; borrowed from
    /// the text when that leaves it unchanged.
    pub(crate) text: Cow<'a, str>,
    /// Index of the clause (split at `;`, newlines, and `.`/`!`/`?`/`:`
    /// followed by white space).
    pub(crate) clause: u32,
    /// Whether a comma stands between this word and the previous one.
    pub(crate) after_comma: bool,
}

/// One fired rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hit {
    pub(crate) modality: Modality,
    /// The phrase, as it appears in rule names.
    pub(crate) rule: &'static str,
    /// Index of the first word of the hit.
    pub(crate) first: usize,
    /// Index of the last word of the hit.
    pub(crate) last: usize,
}

/// A text's prose words and the rules that fired on them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Analysis<'a> {
    pub(crate) words: Vec<Word<'a>>,
    pub(crate) hits: Vec<Hit>,
}

impl Analysis<'_> {
    /// The deciding hit: the first hit of the highest-precedence modality.
    pub(crate) fn primary(&self) -> Option<&Hit> {
        PRECEDENCE
            .iter()
            .find_map(|m| self.hits.iter().find(|h| h.modality == *m))
    }

    /// Whether any rule of `modality` fired.
    pub(crate) fn has(&self, modality: Modality) -> bool {
        self.hits.iter().any(|h| h.modality == modality)
    }
}

struct Phrase {
    modality: Modality,
    words: &'static [&'static str],
    rule: &'static str,
}

macro_rules! phrases {
    ($($m:ident [$($w:literal),+] $rule:literal;)*) => {
        &[$(Phrase { modality: Modality::$m, words: &[$($w),+], rule: $rule }),*]
    };
}

/// Every phrase rule; longer phrases are tried first at each position.
static PHRASES: &[Phrase] = phrases! {
    Prohibition ["under", "no", "circumstances"] "under no circumstances";
    Prohibition ["you", "can", "not"] "you can not";
    Prohibition ["must", "not"] "must not";
    Prohibition ["must", "never"] "must never";
    Prohibition ["do", "not"] "do not";
    Prohibition ["shall", "not"] "shall not";
    Prohibition ["should", "not"] "should not";
    Prohibition ["should", "never"] "should never";
    Prohibition ["may", "not"] "may not";
    Prohibition ["you", "cannot"] "you cannot";
    Prohibition ["you", "can't"] "you can't";
    Prohibition ["not", "allowed"] "not allowed";
    Prohibition ["not", "permitted"] "not permitted";
    Prohibition ["refrain", "from"] "refrain from";
    Prohibition ["never"] "never";
    Prohibition ["don't"] "don't";
    Prohibition ["dont"] "dont";
    Prohibition ["mustn't"] "mustn't";
    Prohibition ["shan't"] "shan't";
    Prohibition ["shouldn't"] "shouldn't";
    Prohibition ["forbidden"] "forbidden";
    Prohibition ["prohibited"] "prohibited";
    Prohibition ["disallowed"] "disallowed";
    Prohibition ["forbid"] "forbid";
    Prohibition ["avoid"] "avoid";
    Restriction ["no", "more", "than"] "no more than";
    Restriction ["no", "less", "than"] "no less than";
    Restriction ["no", "fewer", "than"] "no fewer than";
    Restriction ["nothing", "but"] "nothing but";
    Restriction ["nothing", "except"] "nothing except";
    Restriction ["restricted", "to"] "restricted to";
    Restriction ["limited", "to"] "limited to";
    Restriction ["at", "most"] "at most";
    Restriction ["at", "least"] "at least";
    Restriction ["only"] "only";
    Restriction ["exclusively"] "exclusively";
    Restriction ["solely"] "solely";
    Requirement ["be", "sure", "to"] "be sure to";
    Requirement ["you", "need", "to"] "you need to";
    Requirement ["you", "have", "to"] "you have to";
    Requirement ["make", "sure"] "make sure";
    Requirement ["remember", "to"] "remember to";
    Requirement ["you", "should"] "you should";
    Requirement ["always"] "always";
    Requirement ["must"] "must";
    Requirement ["ensure"] "ensure";
    Requirement ["required"] "required";
    Requirement ["mandatory"] "mandatory";
    Requirement ["shall"] "shall";
    Correction ["scratch", "that"] "scratch that";
    Correction ["rather", "than"] "rather than";
    Correction ["i", "said"] "i said";
    Correction ["i", "meant"] "i meant";
    Correction ["actually"] "actually";
    Correction ["instead"] "instead";
    Correction ["correction"] "correction";
};

/// Subjects whose report of what happened binds no one.
const REPORT_SUBJECTS: &[&str] = &[
    "i", "we", "it", "he", "she", "they", "this", "that", "which", "there",
];

/// Adverbs that may stand between a report's subject and its verb.
const REPORT_ADVERBS: &[&str] = &[
    "never", "only", "always", "actually", "really", "even", "ever", "just", "also", "still",
    "once",
];

/// Irregular past tenses and participles of a report.
pub(super) const IRREGULAR_PAST: &[&str] = &[
    "saw",
    "seen",
    "was",
    "were",
    "been",
    "had",
    "got",
    "gotten",
    "did",
    "went",
    "came",
    "knew",
    "thought",
    "found",
    "ran",
    "broke",
    "forgot",
    "heard",
    "felt",
    "lost",
    "understood",
    "became",
    "began",
];

/// Verbs that report observed behaviour rather than prescribe it.
const BEHAVIOUR_VERBS: &[&str] = &[
    "fails",
    "fail",
    "happens",
    "happen",
    "occurs",
    "occur",
    "crashes",
    "crash",
    "breaks",
    "break",
    "hangs",
    "hang",
    "panics",
    "panic",
    "flakes",
    "flake",
    "works",
    "appears",
    "appear",
    "seems",
    "seem",
    "shows",
    "passes",
    "returns",
    "reproduces",
    "reproduce",
    "errors",
    "succeeds",
    "times",
    "triggers",
    "matters",
    "see",
];

/// Words after "X, not" that make an idiom rather than a correction.
const COMMA_NOT_IDIOMS: &[&str] = &[
    "sure",
    "yet",
    "really",
    "quite",
    "that",
    "just",
    "so",
    "necessarily",
    "to",
    "only",
    "even",
    "bad",
    "much",
    "exactly",
    "always",
    "entirely",
    "all",
    "too",
    "least",
];

fn is_report_verb(word: &str) -> bool {
    if IRREGULAR_PAST.contains(&word) || BEHAVIOUR_VERBS.contains(&word) {
        return true;
    }
    word.len() >= 4 && word.ends_with("ed") && !word.ends_with("eed")
}

/// Splits a text into prose words and fires the rules on them.
pub(crate) fn analyse(text: &str) -> Analysis<'_> {
    analyse_in(text, &code_ranges(text))
}

/// [`analyse`], for a caller that has the text's [`code_ranges`] already.
pub(crate) fn analyse_in<'t>(text: &'t str, code: &[(usize, usize)]) -> Analysis<'t> {
    let words = prose_words(text, code);
    let suppressed = report_clauses(&words);
    let mut hits = Vec::new();
    let mut consumed = vec![false; words.len()];
    let mut i = 0;
    while i < words.len() {
        if consumed[i] || suppressed[i] {
            i += 1;
            continue;
        }
        if let Some((phrase, len)) = match_phrase(&words, i, &consumed)
            && !excluded(&words, i, phrase)
        {
            hits.push(Hit {
                modality: phrase.modality,
                rule: phrase.rule,
                first: i,
                last: i + len - 1,
            });
            for c in consumed.iter_mut().skip(i).take(len) {
                *c = true;
            }
            i += len;
            continue;
        }
        i += 1;
    }
    correction_patterns(&words, &consumed, &mut hits);
    Analysis { words, hits }
}

/// The phrases by their first word, each word's in the order of
/// [`PHRASES`]: most words start none, and are rejected with one hash
/// look-up; a word that starts some is tried against those alone.
type FirstWordIndex = FnvMap<&'static str, Vec<&'static Phrase>>;

fn by_first_word() -> &'static FirstWordIndex {
    static INDEX: OnceLock<FirstWordIndex> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut index = FirstWordIndex::default();
        for phrase in PHRASES {
            if let Some(&first) = phrase.words.first() {
                index.entry(first).or_default().push(phrase);
            }
        }
        index
    })
}

fn match_phrase<'p>(words: &[Word], i: usize, consumed: &[bool]) -> Option<(&'p Phrase, usize)> {
    let starting = by_first_word().get(words[i].text.as_ref())?;
    let mut best: Option<(&Phrase, usize)> = None;
    for &phrase in starting {
        let n = phrase.words.len();
        if i + n > words.len() || best.is_some_and(|(_, len)| len >= n) {
            continue;
        }
        let fits = phrase
            .words
            .iter()
            .enumerate()
            .all(|(k, w)| words[i + k].text == *w && !consumed[i + k])
            && words[i..i + n]
                .windows(2)
                .all(|p| p[0].clause == p[1].clause);
        if fits {
            best = Some((phrase, n));
        }
    }
    best
}

/// The narrow idiom exclusions of single-word hits.
fn excluded(words: &[Word], i: usize, phrase: &Phrase) -> bool {
    let prev = i
        .checked_sub(1)
        .map(|p| &words[p])
        .filter(|p| p.clause == words[i].clause)
        .map(|p| p.text.as_ref());
    let next = words
        .get(i + phrase.words.len())
        .filter(|n| n.clause == words[i].clause)
        .map(|n| n.text.as_ref());
    match phrase.rule {
        "never" => next == Some("mind"),
        "only" => matches!(prev, Some("not" | "if")) || next == Some("just"),
        _ => false,
    }
}

/// Marks the adverbs of report clauses ("I never saw", "it only fails").
fn report_clauses(words: &[Word]) -> Vec<bool> {
    let mut suppressed = vec![false; words.len()];
    for (p, subject) in words.iter().enumerate() {
        if !REPORT_SUBJECTS.contains(&subject.text.as_ref()) {
            continue;
        }
        let mut k = p + 1;
        while k < words.len()
            && k - p <= 3
            && words[k].clause == subject.clause
            && REPORT_ADVERBS.contains(&words[k].text.as_ref())
        {
            k += 1;
        }
        if k == p + 1 || k - p > 3 {
            continue;
        }
        if let Some(verb) = words.get(k)
            && verb.clause == subject.clause
            && is_report_verb(&verb.text)
        {
            for s in suppressed.iter_mut().take(k).skip(p + 1) {
                *s = true;
            }
        }
    }
    suppressed
}

/// "not X but Y" and "X, not Y".
fn correction_patterns(words: &[Word], consumed: &[bool], hits: &mut Vec<Hit>) {
    for (i, w) in words.iter().enumerate() {
        if w.text != "not" || consumed[i] {
            continue;
        }
        let next = words
            .get(i + 1)
            .filter(|n| n.clause == w.clause)
            .map(|n| n.text.as_ref());
        if next == Some("only") {
            continue;
        }
        let but = (i + 2..words.len().min(i + 8))
            .take_while(|&j| words[j].clause == w.clause)
            .find(|&j| words[j].text == "but");
        if let Some(j) = but {
            hits.push(Hit {
                modality: Modality::Correction,
                rule: "not X but Y",
                first: i,
                last: j,
            });
        } else if w.after_comma && next.is_some_and(|n| !COMMA_NOT_IDIOMS.contains(&n)) {
            hits.push(Hit {
                modality: Modality::Correction,
                rule: "X, not Y",
                first: i,
                last: i,
            });
        }
    }
}

/// Whether a character belongs to a word of prose: a letter, a digit or
/// `_`. ASCII is answered from a table.
#[inline]
pub(crate) fn is_word_char(c: char) -> bool {
    match u8::try_from(c) {
        Ok(b) if b.is_ascii() => crate::relevance::ASCII_WORD[usize::from(b)],
        _ => c.is_alphanumeric(),
    }
}

fn is_apostrophe(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}' | '\u{2018}')
}

/// The byte ranges of code in a text: fenced blocks (from a run of three
/// backticks to the next, or to the end) and inline code (from a backtick
/// to the next one on the same line; an unmatched backtick is prose).
pub(crate) fn code_ranges(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    if !bytes.contains(&b'`') {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut i = 0;
    // `i` is always a character boundary: a backtick, or just after one.
    // The next backtick is found by a byte search, not byte by byte.
    while let Some(found) = text.get(i..).and_then(|rest| rest.find('`')) {
        i += found;
        if bytes[i..].starts_with(b"```") {
            let body = i + 3;
            let end = find(bytes, body, b"```").map_or(bytes.len(), |e| e + 3);
            out.push((i, end));
            i = end;
            continue;
        }
        let close = bytes[i + 1..]
            .iter()
            .position(|&b| b == b'`' || b == b'\n')
            .map(|p| p + i + 1);
        match close {
            Some(c) if bytes[c] == b'`' => {
                out.push((i, c + 1));
                i = c + 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// Tells whether byte offsets, asked in increasing order, fall inside the
/// code ranges of [`code_ranges`]; amortised O(1) per question.
#[derive(Debug)]
pub(crate) struct CodeCursor<'a> {
    ranges: &'a [(usize, usize)],
    next: usize,
}

impl<'a> CodeCursor<'a> {
    pub(crate) fn new(ranges: &'a [(usize, usize)]) -> Self {
        CodeCursor { ranges, next: 0 }
    }

    /// Whether `at` is inside code; `at` must not decrease between calls.
    pub(crate) fn contains(&mut self, at: usize) -> bool {
        while self.next < self.ranges.len() && self.ranges[self.next].1 <= at {
            self.next += 1;
        }
        self.ranges
            .get(self.next)
            .is_some_and(|&(start, _)| start <= at)
    }
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The prose words of a text, skipping `code` (its [`code_ranges`]).
///
/// A word is borrowed from the text when lower-casing leaves it as it is,
/// and a run of ASCII word bytes is taken in one step.
fn prose_words<'t>(text: &'t str, code: &[(usize, usize)]) -> Vec<Word<'t>> {
    let mut in_code = CodeCursor::new(code);
    let bytes = text.as_bytes();
    let mut words = Vec::new();
    let mut clause = 0u32;
    let mut after_comma = false;
    let mut current: Option<Pending> = None;
    let mut at = 0;
    while let Some(c) = char_at(text, at) {
        let len = c.len_utf8();
        if in_code.contains(at) {
            if let Some(w) = current.take() {
                push_word(&mut words, w.finish(text, at), clause, &mut after_comma);
            }
            at += len;
            continue;
        }
        let next_at = at + len;
        if is_word_char(c) {
            let word = current.get_or_insert_with(|| Pending::at(at));
            word.push(text, at, c);
            // The rest of a run of ASCII word bytes: no code starts inside
            // it (code starts at a backtick).
            at = word.push_ascii_run(text, next_at);
            continue;
        }
        let next = char_at(text, next_at);
        if is_apostrophe(c)
            && next.is_some_and(is_word_char)
            && let Some(word) = current.as_mut()
        {
            word.push_apostrophe(text, at, c);
            at = next_at;
            continue;
        }
        if let Some(w) = current.take() {
            push_word(&mut words, w.finish(text, at), clause, &mut after_comma);
        }
        let followed_by_space = next.is_none_or(char::is_whitespace);
        match c {
            '\n' | ';' => clause += 1,
            '.' | '!' | '?' | ':' if followed_by_space => clause += 1,
            ',' => after_comma = true,
            _ => {}
        }
        at = next_at;
    }
    if let Some(w) = current.take() {
        push_word(
            &mut words,
            w.finish(text, bytes.len()),
            clause,
            &mut after_comma,
        );
    }
    words
}

fn push_word<'a>(
    words: &mut Vec<Word<'a>>,
    text: Cow<'a, str>,
    clause: u32,
    after_comma: &mut bool,
) {
    words.push(Word {
        text,
        clause,
        after_comma: std::mem::take(after_comma),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modalities_by_table() {
        let cases: &[(&str, &str)] = &[
            (
                "Never write to the `prod` namespace; stage only.",
                "prohibition:never",
            ),
            ("NEVER push to main.", "prohibition:never"),
            ("Do not delete the migrations.", "prohibition:do not"),
            ("don't touch the CI config", "prohibition:don't"),
            ("Don\u{2019}t touch the CI config", "prohibition:don't"),
            (
                "You must not run `terraform apply`.",
                "prohibition:must not",
            ),
            ("You mustn't commit secrets.", "prohibition:mustn't"),
            ("Force pushes are forbidden.", "prohibition:forbidden"),
            ("Writes to prod are not allowed.", "prohibition:not allowed"),
            (
                "Under no circumstances email customers.",
                "prohibition:under no circumstances",
            ),
            ("You cannot use sudo here.", "prohibition:you cannot"),
            ("Avoid network calls in tests.", "prohibition:avoid"),
            ("Use the staging cluster only.", "restriction:only"),
            ("Use at most 4 threads.", "restriction:at most"),
            (
                "Keep it to no more than 3 retries.",
                "restriction:no more than",
            ),
            (
                "Always run `cargo fmt` before committing.",
                "requirement:always",
            ),
            ("Ensure every handler has a timeout.", "requirement:ensure"),
            ("You need to sign every commit.", "requirement:you need to"),
            ("Actually, use port 8080.", "correction:actually"),
            ("Use Postgres instead of MySQL.", "correction:instead"),
            ("I said the staging namespace.", "correction:i said"),
            ("Use not the v1 API but v2.", "correction:not X but Y"),
            ("Deploy to stage, not prod.", "correction:X, not Y"),
            ("Actually, never use prod.", "prohibition:never"),
        ];
        for (text, rule) in cases {
            let analysis = analyse(text);
            let Some(hit) = analysis.primary() else {
                panic!("no modal phrase in {text:?}");
            };
            assert_eq!(
                format!("{}:{}", modality_name(hit.modality), hit.rule),
                *rule,
                "{text:?}"
            );
        }
    }

    #[test]
    fn reports_and_idioms_express_no_modality() {
        for text in [
            "I never saw this error before the upgrade.",
            "It only fails on CI.",
            "They only crash on arm64.",
            "Never mind, the build is green now.",
            "This is not only slow but also flaky.",
            "If only it were that simple.",
            "The job only just finished.",
            "It works, not sure why.",
            "Rename the `must_have` flag to `required_flag`.",
            "Run ```\nnever_do_this()\n``` to reproduce.",
            "",
        ] {
            assert_eq!(modality_of(text), None, "{text:?}");
        }
    }

    #[test]
    fn modality_by_table() {
        let cases: &[(&str, Option<Modality>)] = &[
            ("must not", Some(Modality::Prohibition)),
            ("must", Some(Modality::Requirement)),
            ("only", Some(Modality::Restriction)),
            ("instead", Some(Modality::Correction)),
            ("hello world", None),
            ("mustard only", Some(Modality::Restriction)),
            ("mustard", None),
            ("nevertheless", None),
        ];
        for (text, m) in cases {
            assert_eq!(modality_of(text), *m, "{text:?}");
        }
    }

    #[test]
    fn phrases_do_not_cross_clauses() {
        assert_eq!(modality_of("do. Not this"), None);
        assert_eq!(modality_of("I must; not"), Some(Modality::Requirement));
    }

    #[test]
    fn words_and_code() {
        let text = "Don’t use `x y`; a.b\n```\ncode\n``` z";
        let words = prose_words(text, &code_ranges(text));
        let texts: Vec<&str> = words.iter().map(|w| w.text.as_ref()).collect();
        assert_eq!(texts, ["don't", "use", "a", "b", "z"]);
        assert_eq!(words[2].clause, words[3].clause);
        assert!(words[4].clause > words[3].clause);
        assert_eq!(code_ranges("a ` b\n` c"), Vec::<(usize, usize)>::new());
        assert_eq!(code_ranges("```open"), vec![(0, 7)]);
    }

    #[test]
    fn words_are_borrowed_unless_lowering_changes_them() {
        let text = "use don't Don’t NEVER naïve ÉTÉ İx straße a_1";
        let words = prose_words(text, &code_ranges(text));
        let texts: Vec<&str> = words.iter().map(|w| w.text.as_ref()).collect();
        assert_eq!(
            texts,
            [
                "use",
                "don't",
                "don't",
                "never",
                "naïve",
                "été",
                "i\u{307}x",
                "straße",
                "a_1"
            ]
        );
        let borrowed: Vec<bool> = words
            .iter()
            .map(|w| matches!(w.text, Cow::Borrowed(_)))
            .collect();
        assert_eq!(
            borrowed,
            [true, true, false, false, true, false, false, true, true]
        );
    }

    #[test]
    fn no_panic_on_odd_text() {
        for text in [
            "`",
            "``",
            "```",
            "'",
            "’",
            "a’",
            "İstanbul ONLY",
            "\u{0301}only",
            "x,not",
        ] {
            let _ = modality_of(text);
        }
    }
}
