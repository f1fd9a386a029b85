//! o200k_base's vocabulary in a flat table, and the byte-pair merge that
//! counts a piece with it.
//!
//! The table is written by the build script from bpe-openai's encoder and
//! read in place: the tokens' bytes by rank, and a hash index over them
//! built on first use with the core's fast hasher (8 MiB: each slot holds
//! a token's first 12 bytes, so that most look-ups read nothing else).
//! The whole vocabulary then costs about 10 MiB of memory, where
//! bpe-openai's encoder holds about 35 MB of search automata, and touches
//! about as much of the binary again while it loads them.
//!
//! A piece is counted as tiktoken encodes it: starting from its bytes, the
//! adjacent pair whose joined bytes have the lowest rank is merged, the
//! leftmost of equal ranks first, until no adjacent pair joins into a
//! token. Short pieces scan for that pair, as tiktoken does; longer ones
//! keep the candidate pairs in a heap, so the work grows as `n log n`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use crate::fasthash::FastState;

/// The table the build script writes (see `build.rs`).
static TABLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.tokens"));

/// Pieces of at most this many bytes scan for the lowest-ranked pair;
/// longer ones use a heap.
const SCAN: usize = 32;

/// A rank that no pair has: the pair does not join into a token.
const NONE: u32 = u32::MAX;

/// The bytes of a token held in its slot: a token of at most this many
/// bytes is found, or not, with one read of the index.
const HEAD: usize = 12;

/// The longest token a slot can describe (its length has 8 bits).
const LONGEST: usize = u8::MAX as usize;

/// One entry of the index: a token's first [`HEAD`] bytes (zero after
/// its end), and its rank plus one (0 for an empty slot) in the low 24
/// bits beside its length in the high 8.
#[derive(Clone, Copy, Default)]
struct Slot {
    head: [u8; HEAD],
    meta: u32,
}

impl Slot {
    fn new(token: &[u8], rank: u32) -> Option<Slot> {
        let len = u32::try_from(token.len())
            .ok()
            .filter(|&l| l as usize <= LONGEST)?;
        let rank = rank.checked_add(1).filter(|&r| r < 1 << 24)?;
        Some(Slot {
            head: head(token),
            meta: rank | (len << 24),
        })
    }

    #[inline]
    fn is_empty(self) -> bool {
        self.meta == 0
    }

    #[inline]
    fn rank(self) -> u32 {
        (self.meta & 0x00ff_ffff) - 1
    }

    #[inline]
    fn len(self) -> usize {
        (self.meta >> 24) as usize
    }
}

/// The first [`HEAD`] bytes of `bytes`, zero after its end.
///
/// Every copy has a fixed length, so none becomes a call: a shorter
/// piece is copied as two overlapping fixed-size parts.
#[inline]
fn head(bytes: &[u8]) -> [u8; HEAD] {
    if let Some(first) = bytes.first_chunk::<HEAD>() {
        return *first;
    }
    let mut head = [0u8; HEAD];
    let n = bytes.len();
    match n {
        8.. => {
            head[..8].copy_from_slice(&bytes[..8]);
            head[n - 4..n].copy_from_slice(&bytes[n - 4..]);
        }
        4.. => {
            head[..4].copy_from_slice(&bytes[..4]);
            head[n - 4..n].copy_from_slice(&bytes[n - 4..]);
        }
        _ => {
            for (h, b) in head.iter_mut().zip(bytes) {
                *h = *b;
            }
        }
    }
    head
}

/// A vocabulary's tokens by rank, and an index from bytes to rank.
pub(crate) struct Vocabulary {
    /// The tokens' offsets (`n + 1`, little-endian u32) in the table.
    offsets: &'static [u8],
    /// Every token's bytes, in rank order.
    bytes: &'static [u8],
    /// Open addressing by `state`'s hash, at most half full.
    slots: Box<[Slot]>,
    /// The core's fast hasher, seeded per process.
    state: FastState,
}

impl Vocabulary {
    /// o200k_base's vocabulary; `None` if the table is malformed, which
    /// the build script never writes.
    pub(crate) fn o200k_base() -> Option<Vocabulary> {
        Vocabulary::read(TABLE)
    }

    fn read(table: &'static [u8]) -> Option<Vocabulary> {
        let n = u32::from_le_bytes(table.get(..4)?.try_into().ok()?) as usize;
        let offsets_len = (n + 1).checked_mul(4)?;
        let offsets = table.get(4..4 + offsets_len)?;
        let bytes = table.get(4 + offsets_len..)?;
        let slots_len = (n * 2).next_power_of_two().max(2);
        let mut vocabulary = Vocabulary {
            offsets,
            bytes,
            slots: vec![Slot::default(); slots_len].into_boxed_slice(),
            state: FastState::default(),
        };
        let mut previous = 0;
        for rank in 0..n {
            let end = vocabulary.offset(rank + 1);
            if end < previous || end > bytes.len() {
                return None;
            }
            previous = end;
        }
        let mask = slots_len - 1;
        for rank in 0..n {
            let token = vocabulary.token(rank as u32);
            let mut slot = vocabulary.state.hash_one(token) as usize & mask;
            while !vocabulary.slots[slot].is_empty() {
                slot = (slot + 1) & mask;
            }
            vocabulary.slots[slot] = Slot::new(token, rank as u32)?;
        }
        Some(vocabulary)
    }

    /// The number of tokens.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() / 4 - 1
    }

    #[inline]
    fn offset(&self, index: usize) -> usize {
        let at = index * 4;
        match self.offsets.get(at..at + 4) {
            Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]) as usize,
            _ => 0,
        }
    }

    /// The bytes of the token of rank `rank` (empty past the last).
    #[inline]
    pub(crate) fn token(&self, rank: u32) -> &'static [u8] {
        let rank = rank as usize;
        let (start, end) = (self.offset(rank), self.offset(rank + 1));
        self.bytes.get(start..end).unwrap_or_default()
    }

    /// The rank of the token whose bytes are `bytes`.
    #[inline]
    pub(crate) fn rank(&self, bytes: &[u8]) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut slot = self.state.hash_one(bytes) as usize & mask;
        let wanted = head(bytes);
        loop {
            let entry = self.slots[slot];
            if entry.is_empty() {
                return None;
            }
            if entry.len() == bytes.len()
                && entry.head == wanted
                && (bytes.len() <= HEAD || self.token(entry.rank())[HEAD..] == bytes[HEAD..])
            {
                return Some(entry.rank());
            }
            slot = (slot + 1) & mask;
        }
    }

    #[inline]
    fn pair_rank(&self, bytes: &[u8]) -> u32 {
        self.rank(bytes).unwrap_or(NONE)
    }

    /// The number of tokens tiktoken encodes `piece` into.
    pub(crate) fn count(&self, piece: &[u8]) -> usize {
        if piece.len() < 2 || self.rank(piece).is_some() {
            return usize::from(!piece.is_empty());
        }
        if piece.len() <= SCAN {
            self.count_scanning(piece)
        } else {
            self.count_with_heap(piece)
        }
    }

    /// tiktoken's own merge: `parts[i]` is the start of a part and the rank
    /// of the part joined with the next one.
    fn count_scanning(&self, piece: &[u8]) -> usize {
        let n = piece.len();
        let mut parts = [(0u8, NONE); SCAN + 1];
        for (i, part) in parts.iter_mut().enumerate().take(n + 1) {
            part.0 = i as u8;
            if i + 1 < n {
                part.1 = self.pair_rank(&piece[i..i + 2]);
            }
        }
        let mut len = n + 1;
        // The rank of part `i` joined with the next, once they are one.
        let joined = |parts: &[(u8, u32)], len: usize, i: usize| -> u32 {
            if i + 3 < len {
                self.pair_rank(&piece[parts[i].0 as usize..parts[i + 3].0 as usize])
            } else {
                NONE
            }
        };
        while len > 2 {
            let mut best = (NONE, 0);
            for (i, &(_, rank)) in parts[..len - 1].iter().enumerate() {
                if rank < best.0 {
                    best = (rank, i);
                }
            }
            if best.0 == NONE {
                break;
            }
            let i = best.1;
            parts[i].1 = joined(&parts, len, i);
            if i > 0 {
                parts[i - 1].1 = joined(&parts, len, i - 1);
            }
            parts.copy_within(i + 2..len, i + 1);
            len -= 1;
        }
        len - 1
    }

    /// The same merges, with every adjacent pair that joins into a token
    /// in a heap ordered by rank, then position. A part is named by its
    /// first byte, which never changes: merging keeps the left part and
    /// drops the right one. A heap entry whose part has since merged, or
    /// whose pair has changed, no longer matches the part's rank and is
    /// skipped.
    fn count_with_heap(&self, piece: &[u8]) -> usize {
        let n = piece.len();
        // `next[i]`: the first byte of the part after part `i` (n past
        // the last part); `prev[i]`: that of the part before it.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut rank: Vec<u32> = vec![NONE; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            let r = self.pair_rank(&piece[i..i + 2]);
            rank[i] = r;
            if r != NONE {
                heap.push(Reverse((r, i)));
            }
        }
        let mut parts = n;
        let end_of_next = |next: &[usize], i: usize| -> Option<usize> {
            let j = next[i];
            (j < n).then(|| next[j])
        };
        while let Some(Reverse((r, i))) = heap.pop() {
            if rank[i] != r {
                continue;
            }
            // Part `i` takes in the part after it.
            let j = next[i];
            next[i] = next[j];
            if next[j] < n {
                prev[next[j]] = i;
            }
            rank[j] = NONE;
            parts -= 1;
            rank[i] = match end_of_next(&next, i) {
                Some(end) => self.pair_rank(&piece[i..end]),
                None => NONE,
            };
            if rank[i] != NONE {
                heap.push(Reverse((rank[i], i)));
            }
            let p = prev[i];
            if p < n {
                rank[p] = self.pair_rank(&piece[p..next[i]]);
                if rank[p] != NONE {
                    heap.push(Reverse((rank[p], p)));
                }
            }
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocabulary() -> &'static Vocabulary {
        static V: std::sync::LazyLock<Vocabulary> =
            std::sync::LazyLock::new(|| Vocabulary::o200k_base().expect("the built table"));
        &V
    }

    #[test]
    fn a_head_is_the_first_bytes_then_zeros_at_every_length() {
        let bytes: Vec<u8> = (1..=40).collect();
        for n in 0..=bytes.len() {
            let mut expected = [0u8; HEAD];
            for (i, e) in expected.iter_mut().enumerate().take(n) {
                *e = bytes[i];
            }
            assert_eq!(head(&bytes[..n]), expected, "{n} bytes");
        }
    }

    #[test]
    fn holds_every_token_of_the_encoder_at_its_rank() {
        let bpe = &bpe_openai::o200k_base().bpe;
        let v = vocabulary();
        assert_eq!(v.len(), bpe.num_tokens());
        for rank in 0..bpe.num_tokens() as u32 {
            let bytes = bpe.token_bytes(rank);
            assert_eq!(v.token(rank), bytes, "{rank}");
            assert_eq!(v.rank(bytes), Some(rank), "{bytes:?}");
            // The same length and head, another tail: found only as the
            // token it is.
            if bytes.len() > HEAD {
                let mut other = bytes.to_vec();
                *other.last_mut().unwrap() ^= 0x20;
                if let Some(found) = v.rank(&other) {
                    assert_eq!(v.token(found), &other[..], "{other:?}");
                }
            }
        }
        for absent in [&b" hellohello"[..], b"", b"zzzzzzzzzzzzzzzzzzzzzzzzzzz"] {
            assert_eq!(v.rank(absent), None, "{absent:?}");
        }
    }

    /// A table in the build script's layout, for the given tokens.
    fn table_of(tokens: &[Vec<u8>]) -> &'static [u8] {
        let mut table = (tokens.len() as u32).to_le_bytes().to_vec();
        let mut end = 0u32;
        table.extend_from_slice(&end.to_le_bytes());
        for token in tokens {
            end += token.len() as u32;
            table.extend_from_slice(&end.to_le_bytes());
        }
        for token in tokens {
            table.extend_from_slice(token);
        }
        Box::leak(table.into_boxed_slice())
    }

    #[test]
    fn tokens_that_share_their_head_and_length_are_told_apart() {
        let tokens: Vec<Vec<u8>> = (b'A'..=b'P')
            .map(|last| [&b"abcdefghijklmn"[..], &[last]].concat())
            .collect();
        let v = Vocabulary::read(table_of(&tokens)).expect("a valid table");
        for (rank, token) in tokens.iter().enumerate() {
            assert_eq!(v.rank(token), Some(rank as u32), "{token:?}");
        }
        assert_eq!(v.rank(b"abcdefghijklmnZ"), None);
        assert_eq!(v.rank(b"abcdefghijklmn"), None);
    }

    #[test]
    fn a_malformed_table_is_refused() {
        assert!(Vocabulary::read(&[]).is_none());
        assert!(Vocabulary::read(&[5, 0, 0, 0, 0, 0]).is_none());
        // Offsets past the bytes, and offsets that go back.
        for (second, third) in [(9u32, 4u32), (3, 2)] {
            let mut table = table_of(&[b"ab".to_vec(), b"cd".to_vec()]).to_vec();
            table[8..12].copy_from_slice(&second.to_le_bytes());
            table[12..16].copy_from_slice(&third.to_le_bytes());
            assert!(Vocabulary::read(Box::leak(table.into_boxed_slice())).is_none());
        }
        // A token longer than a slot can describe.
        assert!(Vocabulary::read(table_of(&[vec![b'x'; LONGEST + 1]])).is_none());
    }

    #[test]
    fn both_merges_count_as_the_encoder() {
        let bpe = &bpe_openai::o200k_base().bpe;
        let v = vocabulary();
        let pieces: Vec<Vec<u8>> = vec![
            b"a".to_vec(),
            b"hellohello".to_vec(),
            b"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz".to_vec(),
            b"=+-*/".repeat(30),
            b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".to_vec(),
            "────────────────────".as_bytes().to_vec(),
            b"Supercalifragilisticexpialidocious".to_vec(),
            vec![0xff, 0xfe, 0x00, 0x41, 0x80, 0x80],
            (0u8..=255).collect(),
        ];
        for piece in &pieces {
            let want = bpe.count(piece);
            assert_eq!(v.count(piece), want, "{piece:?}");
            if piece.len() >= 2 && piece.len() <= SCAN && v.rank(piece).is_none() {
                assert_eq!(v.count_with_heap(piece), want, "heap, {piece:?}");
            }
        }
    }
}
