//! Reading lower-cased words out of a text without copying them.
//!
//! The sentence cutter ([`super::features`]) and the modal rules' word
//! reader ([`super::modal`]) both read a text a character at a time and
//! lower-case its words. Most words are already lower case, so a word is
//! borrowed from the text, and copied out only from the first character
//! that lower-casing (or a typographic apostrophe) changes.

use std::borrow::Cow;

/// A word being read: where it starts in the text, and its lower-cased
/// form once that differs from the text.
#[derive(Debug)]
pub(super) struct Pending {
    start: usize,
    owned: Option<String>,
}

impl Pending {
    /// A word whose first character is at byte `start`.
    pub(super) fn at(start: usize) -> Pending {
        Pending { start, owned: None }
    }

    /// Adds `c`, the character at byte `at`, lower-cased.
    #[inline]
    pub(super) fn push(&mut self, text: &str, at: usize, c: char) {
        if let Some(owned) = self.owned.as_mut() {
            if c.is_ascii() {
                owned.push(c.to_ascii_lowercase());
            } else {
                owned.extend(c.to_lowercase());
            }
            return;
        }
        let unchanged = if c.is_ascii() {
            !c.is_ascii_uppercase()
        } else {
            let mut lower = c.to_lowercase();
            lower.len() == 1 && lower.next() == Some(c)
        };
        if !unchanged {
            let mut owned = text.get(self.start..at).unwrap_or_default().to_owned();
            owned.extend(c.to_lowercase());
            self.owned = Some(owned);
        }
    }

    /// Adds `run`, the ASCII bytes of the text at byte `at`, lower-cased.
    #[inline]
    pub(super) fn push_ascii(&mut self, text: &str, at: usize, run: &str) {
        match self.owned.as_mut() {
            Some(owned) => {
                let from = owned.len();
                owned.push_str(run);
                owned[from..].make_ascii_lowercase();
            }
            None if run.bytes().any(|b| b.is_ascii_uppercase()) => {
                let mut owned = text.get(self.start..at).unwrap_or_default().to_owned();
                let from = owned.len();
                owned.push_str(run);
                owned[from..].make_ascii_lowercase();
                self.owned = Some(owned);
            }
            None => {}
        }
    }

    /// Adds an apostrophe: `c` (`'`, `‘` or `’`), at byte `at`, read as
    /// `'`.
    #[inline]
    pub(super) fn push_apostrophe(&mut self, text: &str, at: usize, c: char) {
        match self.owned.as_mut() {
            Some(owned) => owned.push('\''),
            None if c != '\'' => {
                let mut owned = text.get(self.start..at).unwrap_or_default().to_owned();
                owned.push('\'');
                self.owned = Some(owned);
            }
            None => {}
        }
    }

    /// The word, which ends before byte `end`.
    pub(super) fn finish(self, text: &str, end: usize) -> Cow<'_, str> {
        match self.owned {
            Some(owned) => Cow::Owned(owned),
            None => Cow::Borrowed(text.get(self.start..end).unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::char_at;

    /// Reads `text` as one word: ASCII letters in runs, other characters
    /// one at a time, `'`, `‘` and `’` as apostrophes.
    fn read(text: &str) -> Cow<'_, str> {
        let mut word = Pending::at(0);
        let mut at = 0;
        while let Some(c) = char_at(text, at) {
            if c.is_ascii_alphanumeric() {
                let run = text[at..]
                    .bytes()
                    .take_while(u8::is_ascii_alphanumeric)
                    .count();
                word.push_ascii(text, at, &text[at..at + run]);
                at += run;
                continue;
            }
            match c {
                '\'' | '‘' | '’' => word.push_apostrophe(text, at, c),
                _ => word.push(text, at, c),
            }
            at += c.len_utf8();
        }
        word.finish(text, text.len())
    }

    #[test]
    fn a_word_is_borrowed_until_lowering_changes_it() {
        for (text, lowered, borrowed) in [
            ("deploy", "deploy", true),
            ("don't", "don't", true),
            ("package.json", "package.json", true),
            ("straße", "straße", true),
            ("Deploy", "deploy", false),
            ("deployED", "deployed", false),
            ("don’t", "don't", false),
            ("DON’T", "don't", false),
            ("ÉTÉ", "été", false),
            ("İ", "i̇", false),
            ("", "", true),
        ] {
            let word = read(text);
            assert_eq!(word, lowered, "{text}");
            assert_eq!(matches!(word, Cow::Borrowed(_)), borrowed, "{text}");
        }
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
}
