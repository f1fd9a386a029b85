//! Text primitives that define the rules: what an anchor is, the chunks a
//! text is read in, and a character-safe cut. The summariser, predicates
//! and the verifier all read text through these, so they agree on it.
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

use crate::classify::{code_ranges, is_word_char};
use crate::fasthash::{self, FastSet};
use crate::span::Span;

/// The longest anchor, in characters; longer error lines and inline code
/// are cut (on a character boundary) to this many.
pub const MAX_ANCHOR_CHARS: usize = 200;

/// The anchors a span obliges the next summary to carry: a summary's
/// recorded anchors, or the anchors of an original span's text.
pub(crate) fn required_anchors(span: &Span) -> Vec<String> {
    match &span.summary {
        Some(info) => info.anchors.clone(),
        None => extract_anchors(&span.text),
    }
}

/// The anchors a set of spans owes a summary: each distinct non-empty
/// anchor once, in order of first appearance.
#[derive(Debug, Default)]
pub(crate) struct OwedAnchors {
    /// The anchors, as a set.
    pub(crate) seen: FastSet<String>,
    /// The anchors, in order.
    pub(crate) list: Vec<String>,
}

impl OwedAnchors {
    pub(crate) fn with_capacity(n: usize) -> OwedAnchors {
        OwedAnchors {
            seen: fasthash::set(n),
            list: Vec::with_capacity(n),
        }
    }

    /// Adds `anchor` unless it is empty or already owed.
    pub(crate) fn add(&mut self, anchor: &str) {
        if !anchor.is_empty() && !self.seen.contains(anchor) {
            self.seen.insert(anchor.to_owned());
            self.list.push(anchor.to_owned());
        }
    }
}

/// At most `max` characters of `s`, cut on a character boundary.
pub(crate) fn cut_chars(s: &str, max: usize) -> &str {
    // A text of at most `max` bytes has at most `max` characters.
    if s.len() <= max {
        return s;
    }
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The anchors of a text: strings that must survive summarisation
/// verbatim. Deduplicated, in order of first appearance; every anchor is a
/// substring of `text`.
pub fn extract_anchors(text: &str) -> Vec<String> {
    anchor_ranges(text)
        .into_iter()
        .filter_map(|(start, end)| text.get(start..end))
        .map(str::to_owned)
        .collect()
}

/// [`extract_anchors`] as byte ranges of `text`, each the first
/// occurrence of its anchor: what a session keeps of every live span, so
/// that a compaction reads the anchors instead of extracting them again.
pub(crate) fn anchor_ranges(text: &str) -> Vec<(usize, usize)> {
    let mut found: Vec<(usize, &str)> = Vec::new();
    // Only a line with an error stem in it can report an error: the text
    // is read once for stems, and each line holding one is read whole.
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(hit) = error_stem_at(bytes, from) {
        let start = bytes[..hit]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let end = bytes[hit..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |i| hit + i);
        let Some(line) = text.get(start..end) else {
            break;
        };
        let trimmed = line.trim();
        if is_error_line(trimmed) {
            let lead = line.len() - line.trim_start().len();
            found.push((
                start + lead,
                cut_chars(trimmed, MAX_ANCHOR_CHARS).trim_end(),
            ));
        }
        from = end + 1;
    }
    for (start, end) in code_ranges(text) {
        let inner = &text[start..end];
        if inner.starts_with("```") {
            continue;
        }
        let content = inner.trim_matches('`').trim();
        if !content.is_empty() {
            // `content` is a slice of `inner`: where it starts there.
            let at = start + (content.as_ptr() as usize).wrapping_sub(inner.as_ptr() as usize);
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
    // Every anchor is a slice of `text`: its range is where the slice
    // starts.
    let range = |a: &str| {
        let start = (a.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
        (start, start + a.len())
    };
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(found.len());
    if found.len() <= 16 {
        let mut kept: Vec<&str> = Vec::with_capacity(found.len());
        for (_, a) in found {
            if !kept.contains(&a) {
                kept.push(a);
                out.push(range(a));
            }
        }
    } else {
        let mut seen = fasthash::set(found.len());
        for (_, a) in found {
            if seen.insert(a) {
                out.push(range(a));
            }
        }
    }
    out
}

/// A cheap test that rules out most lines: an error line contains one of
/// these words, in some case. The offset, at or after `from`, where the
/// first of them starts in `b`.
fn error_stem_at(b: &[u8], from: usize) -> Option<usize> {
    let at = |i: usize, stem: &[u8]| {
        b.get(i..i + stem.len())
            .is_some_and(|w| w.eq_ignore_ascii_case(stem))
    };
    // Only the stems that start with the byte's letter can match there.
    (from..b.len()).find(|&i| match b[i] | 0x20 {
        b'e' => at(i, b"error") || at(i, b"exception"),
        b'f' => at(i, b"fail") || at(i, b"fatal"),
        b'p' => at(i, b"panic"),
        b't' => at(i, b"traceback"),
        _ => false,
    })
}

/// The character that starts at byte `at` of `text`; `None` at the end or
/// off a character boundary. ASCII is read without decoding.
#[inline]
pub(crate) fn char_at(text: &str, at: usize) -> Option<char> {
    match text.as_bytes().get(at) {
        Some(&b) if b.is_ascii() => Some(char::from(b)),
        Some(_) => text.get(at..).and_then(|rest| rest.chars().next()),
        None => None,
    }
}

/// The byte range of the first word of `text` that starts at or after
/// `from`: a maximal run of [`is_word_char`] characters. ASCII bytes are
/// told by a table; only other characters are decoded.
fn next_word(text: &str, from: usize) -> Option<(usize, usize)> {
    // Whether the character at `i` is a word character, and its width.
    let is_word_at = |i: usize| {
        let c = char_at(text, i)?;
        Some((is_word_char(c), c.len_utf8()))
    };
    let mut start = from;
    loop {
        match is_word_at(start)? {
            (true, _) => break,
            (false, width) => start += width,
        }
    }
    let mut end = start;
    while let Some((true, width)) = is_word_at(end) {
        end += width;
    }
    Some((start, end))
}

/// Whether a trimmed line reports an error.
pub(crate) fn is_error_line(line: &str) -> bool {
    let mut first = true;
    let mut from = 0;
    while let Some((start, end)) = next_word(line, from) {
        let word = &line[start..end];
        let next = line[end..].chars().next();
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
        from = end;
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
    Pieces { text, at: 0 }.filter_map(move |raw| {
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

/// The runs of a text between white space, as `str::split_whitespace`
/// reads them, with ASCII bytes read without decoding a character.
struct Pieces<'a> {
    text: &'a str,
    /// Where the next run may start.
    at: usize,
}

impl<'a> Pieces<'a> {
    /// The length of the character at byte `i` when it is not white
    /// space; `None` when it is, or at the end.
    fn visible_at(&self, i: usize) -> Option<usize> {
        let c = char_at(self.text, i)?;
        (!c.is_whitespace()).then_some(c.len_utf8())
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let b = self.text.as_bytes();
        let mut i = self.at;
        // Past the white space: ASCII blanks in a tight loop.
        loop {
            match b.get(i) {
                None => {
                    self.at = i;
                    return None;
                }
                Some(&(b'\t'..=b'\r' | b' ')) => i += 1,
                Some(&x) if x < 0x80 => break,
                Some(_) => match char_at(self.text, i) {
                    Some(c) if c.is_whitespace() => i += c.len_utf8(),
                    _ => break,
                },
            }
        }
        let start = i;
        // To the next white space: ASCII visible bytes in a tight loop.
        loop {
            match b.get(i) {
                Some(&x) if x > b' ' && x < 0x80 => i += 1,
                Some(_) => match self.visible_at(i) {
                    Some(len) => i += len,
                    None => break,
                },
                None => break,
            }
        }
        self.at = i;
        self.text.get(start..i)
    }
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
    if plain_word(w) {
        return false;
    }
    let shape = Shape::of(w);
    if !shape.has_alphanumeric(w) {
        return false;
    }
    // Each kind is tried only when the chunk has the bytes it needs.
    (shape.has(COLON) && is_url(w))
        || (shape.has(SLASH | COLON) && is_path(w))
        || (shape.has(DIGIT_FIRST) && is_number_with_unit(w))
        || (shape.has(DOT) && (is_version(w) || is_file_name(w)))
        || is_identifier(w, shape)
}

/// What one pass over a chunk's bytes finds: which of the bytes the
/// anchor rules look for it has, as bits.
#[derive(Clone, Copy)]
struct Shape(u16);

/// An ASCII letter.
const ALPHA: u16 = 1;
/// An ASCII digit.
const DIGIT: u16 = 1 << 1;
/// An ASCII digit first.
const DIGIT_FIRST: u16 = 1 << 2;
/// A byte of a non-ASCII character.
const WIDE: u16 = 1 << 3;
const SLASH: u16 = 1 << 4;
const COLON: u16 = 1 << 5;
const DOT: u16 = 1 << 6;
const DASH: u16 = 1 << 7;
const EQUALS: u16 = 1 << 8;
const UNDERSCORE: u16 = 1 << 9;
/// Any other ASCII byte: not a letter, digit or `_`.
const OTHER: u16 = 1 << 10;

impl Shape {
    fn of(w: &str) -> Shape {
        let b = w.as_bytes();
        let mut bits = match b.first() {
            Some(c) if c.is_ascii_digit() => DIGIT_FIRST,
            _ => 0,
        };
        for &c in b {
            bits |= match c {
                b'a'..=b'z' | b'A'..=b'Z' => ALPHA,
                b'0'..=b'9' => DIGIT,
                b'_' => UNDERSCORE,
                0x80.. => WIDE,
                b'/' => SLASH | OTHER,
                b':' => COLON | OTHER,
                b'.' => DOT | OTHER,
                b'-' => DASH | OTHER,
                b'=' => EQUALS | OTHER,
                _ => OTHER,
            };
        }
        Shape(bits)
    }

    /// Whether the chunk has any of `bits`.
    fn has(self, bits: u16) -> bool {
        self.0 & bits != 0
    }

    /// Whether chunk `w`, of this shape, has an alphanumeric character.
    fn has_alphanumeric(self, w: &str) -> bool {
        self.has(ALPHA | DIGIT) || (self.has(WIDE) && w.chars().any(char::is_alphanumeric))
    }

    /// Whether chunk `w`, of this shape, has an alphabetic character.
    fn has_alphabetic(self, w: &str) -> bool {
        self.has(ALPHA) || (self.has(WIDE) && w.chars().any(char::is_alphabetic))
    }

    /// Whether chunk `w`, of this shape, is all [`is_word_char`]s.
    fn all_word_chars(self, w: &str) -> bool {
        !self.has(OTHER) && (!self.has(WIDE) || w.chars().all(is_word_char))
    }
}

/// The first offset of `needle` (not empty) in `hay`.
fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    loop {
        let at = from + hay.get(from..)?.iter().position(|&c| c == first)?;
        if hay.get(at + 1..at + needle.len()) == Some(rest) {
            return Some(at);
        }
        from = at + 1;
    }
}

/// `s` with its ASCII letters lower-cased into `buf`, when it fits.
fn ascii_lowered<'a>(s: &str, buf: &'a mut [u8; 16]) -> Option<&'a [u8]> {
    let out = buf.get_mut(..s.len())?;
    out.copy_from_slice(s.as_bytes());
    out.make_ascii_lowercase();
    Some(out)
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

pub(crate) fn is_url(w: &str) -> bool {
    let b = w.as_bytes();
    match find_bytes(b, b"://") {
        Some(i) if i > 0 => {
            b[..i]
                .iter()
                .all(|&c| c.is_ascii_alphanumeric() || c == b'+')
                && b.len() > i + 3
        }
        _ => false,
    }
}

pub(crate) fn is_path(w: &str) -> bool {
    let b = w.as_bytes();
    if b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && b[2] == b'\\' {
        return true;
    }
    if !b.contains(&b'/') || find_bytes(b, b"://").is_some() {
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

/// Whether `u` is a unit, in any ASCII case: `ns`, `us`, `µs`, `ms`, `s`,
/// `sec(s)`, `second(s)`, `m`, `min(s)`, `minute(s)`, `h`, `hr(s)`,
/// `hour(s)`, `d`, `day(s)`, `w`, `wk`, `week(s)`, `b`, `kb` to `pb`, `kib`
/// to `tib`, `k`, `byte(s)`, `tok`, `tokens`, `%`, `x`, `rps`, `qps`, `hz`
/// to `ghz`, `px`, `em`, `rem`, `kbps` to `gbps`, `cpu(s)`, `vcpu(s)`,
/// `cores`, `mi`, `gi`, `ki`.
fn is_unit(u: &str) -> bool {
    let mut buf = [0u8; 16];
    let Some(lower) = ascii_lowered(u, &mut buf) else {
        return false;
    };
    matches!(
        lower,
        b"ns"
            | b"us"
            | b"\xc2\xb5s"
            | b"ms"
            | b"s"
            | b"sec"
            | b"secs"
            | b"second"
            | b"seconds"
            | b"m"
            | b"min"
            | b"mins"
            | b"minute"
            | b"minutes"
            | b"h"
            | b"hr"
            | b"hrs"
            | b"hour"
            | b"hours"
            | b"d"
            | b"day"
            | b"days"
            | b"w"
            | b"wk"
            | b"week"
            | b"weeks"
            | b"b"
            | b"kb"
            | b"mb"
            | b"gb"
            | b"tb"
            | b"pb"
            | b"kib"
            | b"mib"
            | b"gib"
            | b"tib"
            | b"k"
            | b"byte"
            | b"bytes"
            | b"tok"
            | b"tokens"
            | b"%"
            | b"x"
            | b"rps"
            | b"qps"
            | b"hz"
            | b"khz"
            | b"mhz"
            | b"ghz"
            | b"px"
            | b"em"
            | b"rem"
            | b"kbps"
            | b"mbps"
            | b"gbps"
            | b"cpu"
            | b"cpus"
            | b"vcpu"
            | b"vcpus"
            | b"cores"
            | b"mi"
            | b"gi"
            | b"ki"
    )
}

pub(crate) fn is_number_with_unit(w: &str) -> bool {
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

pub(crate) fn is_version(w: &str) -> bool {
    let body = w.strip_prefix('v').unwrap_or(w);
    // At least three parts between dots, each of digits, none empty.
    let mut parts = 1;
    let mut empty = true;
    for &c in body.as_bytes() {
        match c {
            b'0'..=b'9' => empty = false,
            b'.' if !empty => {
                parts += 1;
                empty = true;
            }
            _ => return false,
        }
    }
    !empty && parts >= 3
}

pub(crate) fn is_file_name(w: &str) -> bool {
    match w.rsplit_once('.') {
        Some((name, ext)) => {
            !name.is_empty()
                && is_extension(ext)
                && name
                    .chars()
                    .all(|c| is_word_char(c) || matches!(c, '-' | '.'))
        }
        None => false,
    }
}

/// Whether `ext` is a known file extension, in any ASCII case.
fn is_extension(ext: &str) -> bool {
    let mut buf = [0u8; 16];
    let Some(lower) = ascii_lowered(ext, &mut buf) else {
        return false;
    };
    matches!(
        lower,
        b"rs"
            | b"py"
            | b"js"
            | b"ts"
            | b"tsx"
            | b"jsx"
            | b"go"
            | b"java"
            | b"kt"
            | b"c"
            | b"h"
            | b"cc"
            | b"cpp"
            | b"hpp"
            | b"cs"
            | b"rb"
            | b"php"
            | b"swift"
            | b"scala"
            | b"sh"
            | b"bash"
            | b"zsh"
            | b"toml"
            | b"yaml"
            | b"yml"
            | b"json"
            | b"md"
            | b"txt"
            | b"conf"
            | b"cfg"
            | b"ini"
            | b"lock"
            | b"log"
            | b"sql"
            | b"proto"
            | b"html"
            | b"css"
            | b"xml"
            | b"tf"
            | b"env"
            | b"csv"
            | b"tsv"
            | b"ipynb"
            | b"gradle"
            | b"mk"
            | b"cmake"
            | b"dockerfile"
            | b"service"
            | b"pem"
            | b"crt"
            | b"key"
            | b"gz"
            | b"zip"
            | b"tar"
            | b"wasm"
            | b"so"
            | b"dll"
            | b"exe"
            | b"bin"
            | b"pdf"
            | b"png"
            | b"jpg"
    )
}

/// Whether chunk `w`, of shape `shape`, is an identifier.
fn is_identifier(w: &str, shape: Shape) -> bool {
    if w.len() <= 5 && !shape.has(DIGIT_FIRST) && is_unit(w) {
        return false;
    }
    if shape.has(COLON)
        && let Some(i) = find_bytes(w.as_bytes(), b"::")
    {
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
    if shape.has(EQUALS)
        && let Some((k, v)) = w.split_once('=')
    {
        return !k.is_empty()
            && !v.is_empty()
            && k.chars().all(|c| is_word_char(c) || c == '-')
            && k.chars().any(char::is_alphabetic);
    }
    if shape.has(DOT) {
        return w.split('.').all(|p| {
            p.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && p.chars().all(is_word_char)
        }) && w.split('.').any(|p| p.chars().count() >= 2);
    }
    if shape.has(DASH) {
        return w
            .split('-')
            .all(|p| !p.is_empty() && p.chars().all(char::is_alphanumeric))
            && w.chars().any(|c| c.is_ascii_digit())
            && w.chars().any(char::is_alphabetic);
    }
    if !shape.all_word_chars(w) {
        return false;
    }
    if shape.has(UNDERSCORE) {
        return shape.has_alphanumeric(w);
    }
    if shape.has(DIGIT) && shape.has_alphabetic(w) && w.chars().count() >= 2 {
        // Digits then `st`, `nd`, `rd` or `th`, in any ASCII case.
        let ordinal = match w.as_bytes() {
            [digits @ .., a, b] => {
                !digits.is_empty()
                    && digits.iter().all(u8::is_ascii_digit)
                    && matches!(
                        [a.to_ascii_lowercase(), b.to_ascii_lowercase()],
                        [b's', b't'] | [b'n', b'd'] | [b'r', b'd'] | [b't', b'h']
                    )
            }
            _ => false,
        };
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
    fn pieces_are_the_runs_between_white_space() {
        for text in [
            "",
            " ",
            "a",
            "  two  words ",
            "tab\there\nline\x0bvt\x0cff\rcr",
            "nbsp\u{a0}and\u{2003}em\u{3000}ideographic",
            "naïve café\u{85}next",
            "\u{200b}zero-width is not space",
            "\u{1}control\u{7f} bytes\u{1f}",
        ] {
            let ours: Vec<&str> = Pieces { text, at: 0 }.collect();
            let std: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(ours, std, "{text:?}");
        }
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
    fn characters_are_read_at_their_boundaries_only() {
        let text = "aé’\u{1F600}";
        assert_eq!(char_at(text, 0), Some('a'));
        assert_eq!(char_at(text, 1), Some('é'));
        assert_eq!(char_at(text, 2), None);
        assert_eq!(char_at(text, 3), Some('’'));
        assert_eq!(char_at(text, 6), Some('\u{1F600}'));
        assert_eq!(char_at(text, 7), None);
        assert_eq!(char_at(text, text.len()), None);
    }

    /// The words an error line holds one of (see `error_stem_at`).
    const STEMS: [&[u8]; 6] = [
        b"error",
        b"fail",
        b"fatal",
        b"panic",
        b"traceback",
        b"exception",
    ];

    /// The offset, at or after `from`, of the first of the error stems
    /// in `b`, in any case, read at every offset: the plain definition.
    fn first_stem(b: &[u8], from: usize) -> Option<usize> {
        (from..b.len()).find(|&i| {
            STEMS.iter().any(|stem| {
                b.get(i..i + stem.len())
                    .is_some_and(|w| w.eq_ignore_ascii_case(stem))
            })
        })
    }

    /// The error-stem search finds the first stem's exact offset, from any
    /// start, on random texts made mostly of the stems, their letters and
    /// their pieces.
    #[test]
    fn error_stems_are_found_where_they_start() {
        let pieces: [&[u8]; 12] = [
            b"er",
            b"ERR",
            b"Fa",
            b"fai",
            b"pAn",
            b"tr",
            b"x",
            b"ception",
            b"ror",
            b"l",
            b" ",
            "\u{e9}".as_bytes(),
        ];
        let mut rng = crate::testing::Rng(0x5eed_e220_0001);
        let mut found = 0;
        for _ in 0..20_000 {
            let mut b = Vec::new();
            for _ in 0..rng.index(12) {
                match rng.index(4) {
                    0 => b.extend_from_slice(STEMS[rng.index(STEMS.len())]),
                    1 => {
                        let letters = b"eEfFpPtTaArRxX\n@`";
                        b.push(letters[rng.index(letters.len())]);
                    }
                    _ => b.extend_from_slice(pieces[rng.index(pieces.len())]),
                }
            }
            if rng.index(3) == 0 {
                for byte in &mut b {
                    if rng.index(2) == 0 {
                        *byte = byte.to_ascii_uppercase();
                    }
                }
            }
            for from in 0..=b.len() {
                let expected = first_stem(&b, from);
                found += usize::from(expected.is_some());
                assert_eq!(
                    error_stem_at(&b, from),
                    expected,
                    "{:?} from {from}",
                    String::from_utf8_lossy(&b)
                );
            }
        }
        assert!(found > 10_000, "only {found} stems found");
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
            first_stem(line.as_bytes(), 0).is_some()
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
                error_stem_at(text.as_bytes(), 0).is_some(),
                plain_may_report_error(text),
                "{text:?}"
            );
            for line in text.split(['\n', ' ']) {
                assert_eq!(
                    error_stem_at(line.as_bytes(), 0).is_some(),
                    plain_may_report_error(line),
                    "{line:?}"
                );
            }
        }
    }
}
