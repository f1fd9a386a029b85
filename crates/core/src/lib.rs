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
pub mod verify;

#[cfg(test)]
mod testing;

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
