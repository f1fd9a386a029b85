//! The tokens of a vocabulary as a set of byte strings.
//!
//! Most pre-tokenizer pieces of ordinary text (a word with its leading
//! space, a run of punctuation) are one token of the vocabulary. The
//! byte-pair encoder needs a few allocations and an automaton search to
//! find that out; a hash lookup finds it in a fraction of the time. The
//! answer is the encoder's: bpe's encoder starts from the longest token
//! that begins the piece and keeps it when it spans the piece, and
//! tiktoken returns a piece that is a token as that one token.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

use bpe_openai::byte_pair_encoding::BytePairEncoding;

/// The longest token kept: a key holds its bytes and its length in 16
/// bytes. Longer pieces, rare in text, go to the encoder.
const LONGEST: usize = 15;

/// The tokens of one vocabulary of at most [`LONGEST`] bytes.
pub(crate) struct TokenSet {
    keys: HashSet<u128, BuildHasherDefault<KeyHasher>>,
}

impl TokenSet {
    /// The tokens of `bpe`.
    pub(crate) fn new(bpe: &BytePairEncoding) -> TokenSet {
        let n = u32::try_from(bpe.num_tokens()).unwrap_or(u32::MAX);
        let keys = (0..n).filter_map(|id| key(bpe.token_bytes(id))).collect();
        TokenSet { keys }
    }

    /// Whether `piece` is one token (`false` for tokens longer than
    /// [`LONGEST`]).
    #[inline]
    pub(crate) fn contains(&self, piece: &[u8]) -> bool {
        key(piece).is_some_and(|k| self.keys.contains(&k))
    }
}

/// `bytes` packed with their length, if they fit.
#[inline]
fn key(bytes: &[u8]) -> Option<u128> {
    if bytes.len() > LONGEST {
        return None;
    }
    let mut packed = [0u8; 16];
    packed[..bytes.len()].copy_from_slice(bytes);
    packed[LONGEST] = bytes.len() as u8;
    Some(u128::from_le_bytes(packed))
}

/// A folded multiply of a key's two halves: one multiplication that
/// spreads every input bit over both the bits that pick a bucket and
/// those that tag it. The set is fixed, so an unkeyed hash is enough.
#[derive(Default)]
struct KeyHasher {
    hash: u64,
}

impl Hasher for KeyHasher {
    #[inline]
    fn write_u128(&mut self, key: u128) {
        let (lo, hi) = (key as u64, (key >> 64) as u64);
        let product =
            u128::from(lo ^ 0x243f_6a88_85a3_08d3) * u128::from(hi ^ 0x1319_8a2e_0370_7344);
        self.hash = (product as u64) ^ ((product >> 64) as u64);
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.hash =
                (self.hash.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_every_short_token_each_of_which_counts_one() {
        let bpe = &bpe_openai::o200k_base().bpe;
        let set = TokenSet::new(bpe);
        let short = (0..bpe.num_tokens() as u32)
            .filter(|&id| bpe.token_bytes(id).len() <= LONGEST)
            .count();
        assert_eq!(set.keys.len(), short);
        assert!(short > bpe.num_tokens() * 9 / 10, "{short}");
        for id in 0..bpe.num_tokens() as u32 {
            let bytes = bpe.token_bytes(id);
            assert_eq!(set.contains(bytes), bytes.len() <= LONGEST, "{bytes:?}");
            assert_eq!(bpe.count(bytes), 1, "{bytes:?}");
        }
        for piece in [
            &b" hellohello"[..],
            b"a\0",
            b"\0a",
            b"",
            b"zzzzzzzzzzzzzzzz",
        ] {
            assert_eq!(set.contains(piece), bpe.count(piece) == 1, "{piece:?}");
        }
    }
}
