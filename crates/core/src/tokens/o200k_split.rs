//! The o200k_base pre-tokenizer, written out by hand.
//!
//! Before byte-pair encoding, o200k_base cuts text into pieces with a
//! regular expression: the alternatives
//!
//! 1. `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//! 2. `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//! 3. `\p{N}{1,3}`
//! 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
//! 5. `\s*[\r\n]+`
//! 6. `\s+$`
//! 7. `\s+(?!\S)`, which bpe-openai runs as `\s+\s` minus its last character
//! 8. `\s+`
//!
//! tried in that order at the end of the previous piece, the first that
//! matches winning with its greedy quantifiers taking as much as lets the
//! rest of the alternative match. A general regex engine spends a large
//! share of o200k_base's counting time there; [`split`] yields the same pieces
//! as `bpe_openai::o200k_base().split`, in one pass that reads each byte a
//! bounded number of times, so it stays linear on any input.
//!
//! The character classes are taken from the `regex-syntax` crate, the
//! parser behind the reference expression, on first use, so that both
//! agree on every code point of the Unicode version that crate implements.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex_syntax::hir::{Class, HirKind};

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`: may start or continue a capitalised
/// word.
const UPPER: u8 = 1;
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`: may end a word.
const LOWER: u8 = 1 << 1;
/// `[^\r\n\p{L}\p{N}]`: the optional character before a word.
const PREFIX: u8 = 1 << 2;
/// `[^\s\p{L}\p{N}]`: punctuation, symbols, marks.
const PUNCT: u8 = 1 << 3;
/// `\p{N}`.
const NUMBER: u8 = 1 << 4;
/// `\s`: Unicode White_Space.
const SPACE: u8 = 1 << 5;
/// `[\r\n]`.
const NEWLINE: u8 = 1 << 6;

/// Each class bit with the expression, as the reference spells it, that
/// defines it.
const CLASSES: [(u8, &str); 7] = [
    (UPPER, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"),
    (LOWER, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"),
    (PREFIX, r"[^\r\n\p{L}\p{N}]"),
    (PUNCT, r"[^\s\p{L}\p{N}]"),
    (NUMBER, r"\p{N}"),
    (SPACE, r"\s"),
    (NEWLINE, r"[\r\n]"),
];

/// Code points per block of the two-level table.
const BLOCK_BITS: u32 = 7;
const BLOCK: usize = 1 << BLOCK_BITS;
/// Blocks the index covers: every value 21 bits can hold, so that any
/// decoded code point indexes it without a check.
const INDEX_LEN: usize = 1 << (21 - BLOCK_BITS);

/// The class bits of every code point.
///
/// Every character has at least one bit (it is a letter, a number, a line
/// break or a prefix character), so 0 stands for the end of the text.
struct Classes {
    ascii: [u8; 128],
    /// Block number of each run of [`BLOCK`] code points.
    index: Box<[u16; INDEX_LEN]>,
    /// The distinct blocks, one after the other.
    blocks: Vec<u8>,
}

impl Classes {
    /// Builds the table from `regex-syntax`'s classes; `None` if one of
    /// them does not parse to a class (which a build without its Unicode
    /// tables would do).
    fn build() -> Option<Classes> {
        let mut flat = vec![0u8; INDEX_LEN << BLOCK_BITS];
        for (bit, pattern) in CLASSES {
            let hir = regex_syntax::Parser::new().parse(pattern).ok()?;
            let HirKind::Class(Class::Unicode(class)) = hir.kind() else {
                return None;
            };
            for range in class.ranges() {
                let (start, end) = (range.start() as usize, range.end() as usize);
                for slot in flat.get_mut(start..=end)? {
                    *slot |= bit;
                }
            }
        }
        let mut ascii = [0u8; 128];
        ascii.copy_from_slice(flat.get(..128)?);
        let mut index = Box::new([0u16; INDEX_LEN]);
        let mut blocks = Vec::new();
        let mut seen: HashMap<&[u8], u16> = HashMap::new();
        for (slot, block) in index.iter_mut().zip(flat.chunks_exact(BLOCK)) {
            let next = u16::try_from(seen.len()).ok()?;
            *slot = *seen.entry(block).or_insert_with(|| {
                blocks.extend_from_slice(block);
                next
            });
        }
        Some(Classes {
            ascii,
            index,
            blocks,
        })
    }

    /// The class bits of the character at byte `i` of `text` and its
    /// length in bytes; `(0, 0)` at the end. `i` must be a character
    /// boundary.
    #[inline(always)]
    fn at(&self, text: &[u8], i: usize) -> (u8, usize) {
        let Some(&b0) = text.get(i) else {
            return (0, 0);
        };
        if b0 < 0x80 {
            return (self.ascii[usize::from(b0)], 1);
        }
        let (cp, len) = decode(text, i, b0);
        let block = usize::from(self.index[(cp >> BLOCK_BITS) as usize & (INDEX_LEN - 1)]);
        let bits = self
            .blocks
            .get((block << BLOCK_BITS) | (cp as usize & (BLOCK - 1)))
            .copied()
            .unwrap_or(0);
        (bits, len)
    }

    /// The end of the run of characters with one of `bits` from `i`.
    #[inline(always)]
    fn run(&self, text: &[u8], mut i: usize, bits: u8) -> usize {
        loop {
            let (class, len) = self.at(text, i);
            if class & bits == 0 {
                return i;
            }
            i += len;
        }
    }

    /// The end of the piece that starts at `s`, before the end of `text`.
    fn piece_end(&self, text: &[u8], s: usize) -> usize {
        let (first, first_len) = self.at(text, s);
        if let Some(end) = ascii_word(text, s, first) {
            return end;
        }
        if first & (UPPER | LOWER | PREFIX) != 0 {
            if let Some(end) = self.word(text, s, first, first_len, Self::lower_word) {
                return end;
            }
            if let Some(end) = self.word(text, s, first, first_len, Self::upper_word) {
                return end;
            }
        }
        if first & NUMBER != 0 {
            let mut end = s + first_len;
            for _ in 0..2 {
                let (class, len) = self.at(text, end);
                if class & NUMBER == 0 {
                    break;
                }
                end += len;
            }
            return end;
        }
        if let Some(end) = self.punctuation(text, s, first) {
            return end;
        }
        if first & SPACE != 0 {
            return self.spaces(text, s);
        }
        // Every character is matched above; this only guarantees progress.
        s + first_len.max(1)
    }

    /// Alternatives 1 and 2: `word` after the prefix character if there is
    /// one, else from `s`.
    #[inline(always)]
    fn word(
        &self,
        text: &[u8],
        s: usize,
        first: u8,
        first_len: usize,
        word: fn(&Self, &[u8], usize) -> Option<usize>,
    ) -> Option<usize> {
        if first & PREFIX != 0
            && let Some(end) = word(self, text, s + first_len)
        {
            return Some(end);
        }
        if first & (UPPER | LOWER) != 0 {
            return word(self, text, s);
        }
        None
    }

    /// `[UPPER]*[LOWER]+` and a contraction from `p`: the upper run as long
    /// as a lower character still follows it.
    #[inline(always)]
    fn lower_word(&self, text: &[u8], p: usize) -> Option<usize> {
        let mut i = p;
        let mut last_lower_end = None;
        loop {
            let (class, len) = self.at(text, i);
            if class & UPPER == 0 {
                if class & LOWER != 0 {
                    let end = self.run(text, i + len, LOWER);
                    return Some(contraction(text, end));
                }
                // The last character of the upper run that is also lower
                // ends the word: none after it is.
                return last_lower_end.map(|end| contraction(text, end));
            }
            i += len;
            if class & LOWER != 0 {
                last_lower_end = Some(i);
            }
        }
    }

    /// `[UPPER]+[LOWER]*` and a contraction from `p`.
    #[inline(always)]
    fn upper_word(&self, text: &[u8], p: usize) -> Option<usize> {
        let upper_end = self.run(text, p, UPPER);
        if upper_end == p {
            return None;
        }
        let end = self.run(text, upper_end, LOWER);
        Some(contraction(text, end))
    }

    /// Alternative 4: ` ?[^\s\p{L}\p{N}]+[\r\n/]*`.
    fn punctuation(&self, text: &[u8], s: usize, first: u8) -> Option<usize> {
        let start = if first & PUNCT != 0 {
            s
        } else if text.get(s) == Some(&b' ') && self.at(text, s + 1).0 & PUNCT != 0 {
            s + 1
        } else {
            return None;
        };
        let mut end = self.run(text, start, PUNCT);
        while matches!(text.get(end), Some(b'\r' | b'\n' | b'/')) {
            end += 1;
        }
        Some(end)
    }

    /// Alternatives 5 to 8 on the whitespace run from `s`: up to its last
    /// line break if it has one, else all of it at the end of the text,
    /// else all but its last character if it has more than one (which
    /// then starts the next piece), else that one character.
    fn spaces(&self, text: &[u8], s: usize) -> usize {
        let mut i = s;
        let mut last_start = s;
        let mut newline_end = None;
        loop {
            let (class, len) = self.at(text, i);
            if class & SPACE == 0 {
                break;
            }
            last_start = i;
            i += len;
            if class & NEWLINE != 0 {
                newline_end = Some(i);
            }
        }
        match newline_end {
            Some(end) => end,
            None if i == text.len() || last_start == s => i,
            None => last_start,
        }
    }
}

/// Alternatives 1 and 2 when the word is ASCII, the common case: `first`
/// is the class of the ASCII byte at `s`.
///
/// ASCII letters are upper or lower case, never both, so both
/// alternatives come down to `[A-Z]*[a-z]*`, not empty, after the prefix
/// character if there is one, and an ASCII prefix character cannot start
/// a word itself. `None` when there is no such word, and when the letters
/// run into a non-ASCII character, which the general path then decides.
#[inline(always)]
fn ascii_word(text: &[u8], s: usize, first: u8) -> Option<usize> {
    let &b0 = text.get(s)?;
    let p = if b0.is_ascii_alphabetic() {
        s
    } else if b0.is_ascii() && first & PREFIX != 0 {
        s + 1
    } else {
        return None;
    };
    let mut end = p;
    while text.get(end).is_some_and(u8::is_ascii_uppercase) {
        end += 1;
    }
    while text.get(end).is_some_and(u8::is_ascii_lowercase) {
        end += 1;
    }
    if end == p || text.get(end).is_some_and(|b| !b.is_ascii()) {
        return None;
    }
    Some(contraction(text, end))
}

/// The code point of the multi-byte character that starts with `b0` at
/// byte `i` of valid UTF-8, and its length.
#[inline(always)]
fn decode(text: &[u8], i: usize, b0: u8) -> (u32, usize) {
    let cont = |k: usize| text.get(i + k).map_or(0, |&b| u32::from(b & 0x3f));
    let b0 = u32::from(b0);
    if b0 < 0xe0 {
        (((b0 & 0x1f) << 6) | cont(1), 2)
    } else if b0 < 0xf0 {
        (((b0 & 0x0f) << 12) | (cont(1) << 6) | cont(2), 3)
    } else {
        (
            ((b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3),
            4,
        )
    }
}

/// `end` past `(?i:'s|'t|'re|'ve|'m|'ll|'d)` if one starts there. Case
/// folding makes `ſ` (U+017F) an `s` too; no other character folds to one
/// of these letters.
#[inline(always)]
fn contraction(text: &[u8], end: usize) -> usize {
    if text.get(end) != Some(&b'\'') {
        return end;
    }
    let second = |c: u8| {
        text.get(end + 2)
            .is_some_and(|b| b.eq_ignore_ascii_case(&c))
    };
    match text.get(end + 1).map(u8::to_ascii_lowercase) {
        Some(b's' | b't' | b'm' | b'd') => end + 2,
        Some(b'r' | b'v') if second(b'e') => end + 3,
        Some(b'l') if second(b'l') => end + 3,
        // ſ is C5 BF in UTF-8.
        Some(0xc5) if text.get(end + 2) == Some(&0xbf) => end + 3,
        _ => end,
    }
}

static CLASSES_TABLE: LazyLock<Option<Classes>> = LazyLock::new(Classes::build);

/// The pieces o200k_base encodes `text` as, one after the other.
///
/// `None` when the character table cannot be built from `regex-syntax`'s
/// Unicode classes (a build without them); the caller then splits with
/// bpe-openai's expression.
pub fn split(text: &str) -> Option<Pieces<'_>> {
    let classes = CLASSES_TABLE.as_ref()?;
    Some(Pieces {
        classes,
        text,
        pos: 0,
    })
}

/// The iterator [`split`] returns.
pub struct Pieces<'a> {
    classes: &'a Classes,
    text: &'a str,
    pos: usize,
}

impl std::fmt::Debug for Pieces<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pieces")
            .field("rest", &self.text.get(self.pos..))
            .finish_non_exhaustive()
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let start = self.pos;
        if start >= self.text.len() {
            return None;
        }
        let end = self.classes.piece_end(self.text.as_bytes(), start);
        self.pos = end;
        self.text.get(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The letters of the contractions match case-insensitively what
    /// [`contraction`] accepts, and nothing else.
    #[test]
    fn contraction_letters_fold_as_the_reference_folds_them() {
        for (letter, expected) in [
            ('s', "Ssſ"),
            ('t', "Tt"),
            ('r', "Rr"),
            ('e', "Ee"),
            ('v', "Vv"),
            ('m', "Mm"),
            ('l', "Ll"),
            ('d', "Dd"),
        ] {
            let hir = regex_syntax::Parser::new()
                .parse(&format!("(?i:{letter})"))
                .unwrap();
            let HirKind::Class(Class::Unicode(class)) = hir.kind() else {
                panic!("(?i:{letter}) is not a class: {hir:?}");
            };
            let folded: String = class
                .ranges()
                .iter()
                .flat_map(|r| r.start()..=r.end())
                .collect();
            assert_eq!(folded, expected);
        }
        for (text, end) in [
            ("'s", 2),
            ("'S", 2),
            ("'ſ", 3),
            ("'re", 3),
            ("'rE", 3),
            ("'r", 0),
            ("'LL", 3),
            ("'l", 0),
            ("'x", 0),
            ("s", 0),
        ] {
            assert_eq!(contraction(text.as_bytes(), 0), end, "{text:?}");
        }
    }

    /// Every character has a class bit, so that 0 can stand for the end.
    #[test]
    fn every_character_has_a_class() {
        let classes = CLASSES_TABLE.as_ref().unwrap();
        let mut buf = [0u8; 4];
        for c in (0..=0x10_ffff).filter_map(char::from_u32) {
            let encoded = c.encode_utf8(&mut buf);
            let (bits, len) = classes.at(encoded.as_bytes(), 0);
            assert_ne!(bits, 0, "{c:?}");
            assert_eq!(len, c.len_utf8(), "{c:?}");
        }
        assert_eq!(classes.at(b"a", 1), (0, 0));
    }
}
