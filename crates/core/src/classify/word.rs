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

    /// Adds the run of ASCII letters, digits and underscores that starts
    /// at byte `at` (possibly empty), lower-cased; returns where it ends.
    #[inline]
    pub(super) fn push_ascii_run(&mut self, text: &str, at: usize) -> usize {
        let run = text.as_bytes()[at.min(text.len())..]
            .iter()
            .take_while(|&&b| crate::relevance::ASCII_WORD[usize::from(b)])
            .count();
        let end = at + run;
        let Some(letters) = text.get(at..end) else {
            return at;
        };
        if self.owned.is_none() && letters.bytes().any(|b| b.is_ascii_uppercase()) {
            self.owned = Some(text.get(self.start..at).unwrap_or_default().to_owned());
        }
        if let Some(owned) = self.owned.as_mut() {
            let from = owned.len();
            owned.push_str(letters);
            owned[from..].make_ascii_lowercase();
        }
        end
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
                at = word.push_ascii_run(text, at);
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
}
