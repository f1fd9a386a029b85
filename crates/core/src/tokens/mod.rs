//! Token counting.
//!
//! Budgets are only as good as the counts behind them: a count that is low
//! by a few percent lets a prompt overflow the model's window. The two
//! OpenAI encodings are therefore counted exactly (the vocabularies are
//! compiled into the binary, so nothing is downloaded at run time), and
//! CLIENT sessions, whose tokenizer the broker does not know, count the
//! text the broker writes itself by its UTF-8 length, which no byte-level
//! BPE can exceed.
//!
//! o200k_base cuts text into pieces with [`o200k_split`], which yields
//! the pieces of bpe-openai's pre-tokenisation expression at a fraction of
//! its cost, and merges each piece with its own flat table of the
//! vocabulary (`vocabulary`, about 13 MiB), so that bpe-openai's encoder
//! (about 70 MiB resident once loaded) is only loaded for a piece longer
//! than [`MERGED_MAX`] bytes, which it encodes in linear time;
//! cl100k_base counts through bpe-openai alone.

use std::sync::LazyLock;

use crate::config::TokenizerKind;

pub mod o200k_split;
mod vocabulary;

use vocabulary::Vocabulary;

/// The longest o200k_base piece counted with [`Vocabulary`]'s merge,
/// whose work grows as `n log n`; a longer one, which ordinary text does
/// not hold (a run of one character, a blob without spaces), goes to
/// bpe-openai's linear encoder.
pub const MERGED_MAX: usize = 4096;

/// Counts the tokens of a text in one session's tokenizer.
///
/// The planner, the summariser and the verifier take a counter as an
/// argument rather than a tokenizer kind so that tests can substitute a
/// counter with known arithmetic, and so that the core never decides on its
/// own which vocabulary a session uses.
pub trait TokenCounter: Send + Sync + std::fmt::Debug {
    /// The number of tokens of `text`, saturating at `u32::MAX`.
    fn count(&self, text: &str) -> u32;

    /// [`TokenCounter::count`] when it is at most `limit`, else `None`:
    /// whether a text fits, answered without counting past the limit
    /// where the counter can stop early.
    fn count_within(&self, text: &str, limit: u32) -> Option<u32> {
        let n = self.count(text);
        (n <= limit).then_some(n)
    }
}

/// Exact counts for one of the embedded OpenAI encodings.
///
/// Counting is linear in the input, also on adversarial text (long runs
/// without spaces), which matters because span texts come from tools the
/// broker does not control: a piece is merged in `n log n` at most, and
/// one longer than [`MERGED_MAX`] goes to the linear encoder.
pub struct BpeCounter {
    kind: TokenizerKind,
    tokenizer: fn() -> &'static bpe_openai::Tokenizer,
    pieces: Pieces,
}

/// How a [`BpeCounter`] cuts text into pieces and encodes them.
#[derive(Debug, Clone, Copy)]
enum Pieces {
    /// bpe-openai's normalisation, pre-tokenisation expression and
    /// encoder.
    Tokenizer,
    /// [`o200k_split`], for an encoding without normalisation, and the
    /// merge of [`Vocabulary`] (bpe-openai's encoder past
    /// [`MERGED_MAX`] bytes).
    O200k,
}

impl std::fmt::Debug for BpeCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpeCounter")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl BpeCounter {
    /// The encoding this counter implements.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// The tokens of one o200k_base piece: merged with `vocabulary` up to
    /// [`MERGED_MAX`] bytes, by the linear encoder past it.
    fn piece_count(&self, vocabulary: &Vocabulary, bytes: &[u8]) -> usize {
        if bytes.len() <= MERGED_MAX {
            vocabulary.count(bytes)
        } else {
            (self.tokenizer)().bpe.count(bytes)
        }
    }
}

impl TokenCounter for BpeCounter {
    fn count(&self, text: &str) -> u32 {
        // With no limit, the bounded count is the count (saturated).
        self.count_within(text, u32::MAX).unwrap_or(u32::MAX)
    }

    fn count_within(&self, text: &str, limit: u32) -> Option<u32> {
        if text.is_empty() {
            return Some(0);
        }
        let o200k = match self.pieces {
            Pieces::O200k => o200k_split::split(text).zip(O200K_VOCABULARY.as_ref()),
            Pieces::Tokenizer => None,
        };
        let Some((pieces, vocabulary)) = o200k else {
            let n = saturate((self.tokenizer)().count(text));
            return (n <= limit).then_some(n);
        };
        // Pieces are counted one by one, so the count stops at the first
        // piece that takes it past the limit.
        let mut n = 0u32;
        for piece in pieces {
            n = n.saturating_add(saturate(self.piece_count(vocabulary, piece.as_bytes())));
            if n > limit {
                return None;
            }
        }
        Some(n)
    }
}

/// Counts UTF-8 bytes: an upper bound on the tokens of any byte-level BPE.
///
/// Used for text the broker writes in CLIENT sessions, where the real
/// tokenizer is unknown: overestimating costs budget, underestimating could
/// overflow the window.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteLength;

impl TokenCounter for ByteLength {
    fn count(&self, text: &str) -> u32 {
        saturate(text.len())
    }
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

static O200K_BASE: BpeCounter = BpeCounter {
    kind: TokenizerKind::O200kBase,
    tokenizer: bpe_openai::o200k_base,
    pieces: Pieces::O200k,
};

static CL100K_BASE: BpeCounter = BpeCounter {
    kind: TokenizerKind::Cl100kBase,
    tokenizer: bpe_openai::cl100k_base,
    pieces: Pieces::Tokenizer,
};

static BYTE_LENGTH: ByteLength = ByteLength;

/// o200k_base's vocabulary, indexed on the first o200k_base count.
static O200K_VOCABULARY: LazyLock<Option<Vocabulary>> = LazyLock::new(Vocabulary::o200k_base);

/// The counter for a session's tokenizer.
///
/// The OpenAI tables are built lazily on first use (that takes a noticeable
/// moment); call [`warm_up`] at start-up for the encodings sessions are
/// likely to use, so that their first admission does not pay for it.
pub fn counter(kind: TokenizerKind) -> &'static dyn TokenCounter {
    match kind {
        TokenizerKind::O200kBase => &O200K_BASE,
        TokenizerKind::Cl100kBase => &CL100K_BASE,
        TokenizerKind::Client => &BYTE_LENGTH,
    }
}

/// Builds the tables of `kind` now rather than on the first count.
pub fn warm_up(kind: TokenizerKind) {
    // Counting a short text forces the lazy construction of the
    // vocabulary and of the pre-tokeniser's tables.
    let _ = counter(kind).count("warm up");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_length_counts_utf8_bytes() {
        let c = counter(TokenizerKind::Client);
        for (text, n) in [("", 0), ("abc", 3), ("é", 2), ("日本", 6), ("🦀", 4)] {
            assert_eq!(c.count(text), n, "{text:?}");
        }
    }

    #[test]
    fn bpe_counts_are_plausible() {
        for kind in [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase] {
            let c = counter(kind);
            assert_eq!(c.count(""), 0);
            assert_eq!(c.count("hello"), 1);
            let n = c.count("Never write to the `prod` namespace; stage only.");
            assert!((8..=16).contains(&n), "{kind:?}: {n}");
        }
    }

    #[test]
    fn counters_know_their_kind() {
        assert_eq!(O200K_BASE.kind(), TokenizerKind::O200kBase);
        assert_eq!(CL100K_BASE.kind(), TokenizerKind::Cl100kBase);
        assert!(format!("{:?}", counter(TokenizerKind::O200kBase)).contains("O200kBase"));
    }

    #[test]
    fn saturates() {
        assert_eq!(saturate(usize::MAX), u32::MAX);
        assert_eq!(saturate(7), 7);
    }
}
