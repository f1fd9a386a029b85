#![doc = "ctxbroker's policy, pure: no I/O, no clock, no async."]
//!
//! Everything that decides what a session's context holds lives here as
//! plain functions over plain types, so that every invariant can be
//! property-tested in milliseconds.
//!
//! The admission path is [`admission::decide`]: it plans a compaction with
//! [`planner::plan`] when a turn does not fit, and returns it only when the
//! independent [`verify::verify`] passes it.

pub mod admission;
pub mod classify;
pub mod config;
mod exchange;
pub mod facts;
pub mod marker;
pub mod plan;
pub mod planner;
pub mod predicate;
pub mod relevance;
pub mod search;
pub mod session;
pub mod span;
pub mod summary;
pub mod text;
pub mod tokens;
pub mod trigger;
mod varint;
pub mod verify;

#[cfg(test)]
mod testing;

/// Keeps the items of `items` whose index is true in `keep` (an index
/// past its end is kept): how the spans of a session and everything held
/// beside them by index leave together.
pub(crate) fn retain_kept<T>(items: &mut Vec<T>, keep: &[bool]) {
    let mut k = 0;
    items.retain(|_| {
        let kept = keep.get(k).copied().unwrap_or(true);
        k += 1;
        kept
    });
}

/// Hash maps for the core's internal indexes.
///
/// The default SipHash costs more than the rest of a planning pass over a
/// large session; this multiply-rotate hash is several times cheaper. Its
/// seed comes from the standard library's per-process random keys, so
/// colliding keys cannot be precomputed from span text. No output depends
/// on a map's iteration order.
pub(crate) mod fasthash {
    use std::collections::hash_map::RandomState;
    use std::collections::{HashMap, HashSet};
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;

    const K: u64 = 0x9e37_79b9_7f4a_7c15;

    /// The hasher: one multiply per 8 bytes.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct FastHasher(u64);

    impl FastHasher {
        fn add(&mut self, v: u64) {
            self.0 = (self.0.rotate_left(23) ^ v).wrapping_mul(K);
        }
    }

    impl Hasher for FastHasher {
        fn finish(&self) -> u64 {
            self.0 ^ (self.0 >> 29)
        }

        fn write(&mut self, bytes: &[u8]) {
            let mut chunks = bytes.chunks_exact(8);
            for c in &mut chunks {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                self.add(u64::from_le_bytes(a));
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let mut a = [0u8; 8];
                a[..rest.len()].copy_from_slice(rest);
                self.add(u64::from_le_bytes(a) ^ ((rest.len() as u64) << 59));
            }
        }

        fn write_u64(&mut self, v: u64) {
            self.add(v);
        }

        fn write_u8(&mut self, v: u8) {
            self.add(u64::from(v));
        }

        fn write_usize(&mut self, v: usize) {
            self.add(v as u64);
        }
    }

    /// Builds seeded [`FastHasher`]s.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct FastState(u64);

    impl Default for FastState {
        fn default() -> Self {
            static SEED: OnceLock<u64> = OnceLock::new();
            FastState(*SEED.get_or_init(|| RandomState::new().hash_one(0x5eed_u64) | 1))
        }
    }

    impl BuildHasher for FastState {
        type Hasher = FastHasher;

        fn build_hasher(&self) -> FastHasher {
            FastHasher(self.0)
        }
    }

    /// A map with the fast hasher.
    pub(crate) type FastMap<K, V> = HashMap<K, V, FastState>;
    /// A set with the fast hasher.
    pub(crate) type FastSet<K> = HashSet<K, FastState>;

    /// An empty map with room for `n` entries.
    pub(crate) fn map<K, V>(n: usize) -> FastMap<K, V> {
        HashMap::with_capacity_and_hasher(n, FastState::default())
    }

    /// An empty set with room for `n` entries.
    pub(crate) fn set<K>(n: usize) -> FastSet<K> {
        HashSet::with_capacity_and_hasher(n, FastState::default())
    }

    /// A set of ids asked about once per live span: one bit per id
    /// between the least and the greatest when they lie close enough
    /// together (a session numbers its spans in order, so the ids a plan
    /// names mostly do), otherwise the fast hash set. The same answers
    /// either way; the bits cost a shift and a mask, no hashing.
    #[derive(Debug, Clone)]
    pub(crate) enum IdSet {
        /// Bit `id - least` of the words is set for each id.
        Dense { least: u64, words: Vec<u64> },
        /// Ids too far apart for bits.
        Sparse(FastSet<u64>),
    }

    impl IdSet {
        /// Bits per id at most before the hash set is the cheaper.
        const BITS_PER_ID: u64 = 256;

        /// The set of `ids` (repeats allowed).
        pub(crate) fn of(ids: &[u64]) -> IdSet {
            let (Some(&least), Some(&most)) = (ids.iter().min(), ids.iter().max()) else {
                return IdSet::Dense {
                    least: 0,
                    words: Vec::new(),
                };
            };
            let span = most - least;
            let bound = (ids.len() as u64)
                .saturating_mul(IdSet::BITS_PER_ID)
                .max(4096);
            if span >= bound {
                let mut set = set(ids.len());
                set.extend(ids.iter().copied());
                return IdSet::Sparse(set);
            }
            // span < bound, which fits in memory as bits: it is at most
            // 256 bits per id given.
            let mut words = vec![0u64; (span / 64 + 1) as usize];
            for &id in ids {
                let at = id - least;
                if let Some(w) = words.get_mut((at / 64) as usize) {
                    *w |= 1 << (at % 64);
                }
            }
            IdSet::Dense { least, words }
        }

        /// Whether `id` is in the set.
        #[inline]
        pub(crate) fn contains(&self, id: u64) -> bool {
            match self {
                IdSet::Dense { least, words } => id.checked_sub(*least).is_some_and(|at| {
                    usize::try_from(at / 64)
                        .ok()
                        .and_then(|k| words.get(k))
                        .is_some_and(|w| (w >> (at % 64)) & 1 == 1)
                }),
                IdSet::Sparse(set) => set.contains(&id),
            }
        }

        /// Whether the set holds no id.
        pub(crate) fn is_empty(&self) -> bool {
            match self {
                IdSet::Dense { words, .. } => words.is_empty(),
                IdSet::Sparse(set) => set.is_empty(),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::IdSet;
        use std::collections::HashSet;

        #[test]
        fn an_id_set_answers_like_a_hash_set() {
            let mut rng = crate::testing::Rng(0x6a09_e667_f3bc_c908);
            for round in 0..500 {
                let n = rng.index(200);
                let base = match round % 4 {
                    0 => 0,
                    1 => rng.below(1_000_000),
                    2 => u64::MAX - 10_000,
                    _ => 1 << 40,
                };
                let spread = match round % 3 {
                    0 => 100,
                    1 => 100_000,
                    _ => u64::MAX / 4,
                };
                let ids: Vec<u64> = (0..n)
                    .map(|_| base.saturating_add(rng.below(spread)))
                    .collect();
                let set = IdSet::of(&ids);
                let plain: HashSet<u64> = ids.iter().copied().collect();
                assert_eq!(set.is_empty(), plain.is_empty());
                let probes = ids
                    .iter()
                    .flat_map(|&id| [id, id.wrapping_sub(1), id.wrapping_add(1), id ^ 64])
                    .chain([0, 1, u64::MAX, base, base.wrapping_sub(1)]);
                for probe in probes {
                    assert_eq!(set.contains(probe), plain.contains(&probe), "{probe}");
                }
            }
        }
    }
}

pub use admission::{AdmissionInput, Compaction, Decision, Refusal, decide};
pub use classify::{classify, modality_of};
pub use config::SessionConfig;
pub use marker::Marker;
pub use plan::{Plan, Verdict};
pub use planner::{PlanInput, apply};
pub use relevance::RelevanceWeights;
pub use span::{Span, SpanId};
pub use summary::{SummaryDraft, summarize};
pub use text::extract_anchors;
pub use tokens::{TokenCounter, counter, warm_up};
pub use trigger::{TriggerAssessment, assess};
pub use verify::verify;
