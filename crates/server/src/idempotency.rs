//! What a session in memory knows of its idempotency keys, so that a
//! turn with new keys — every turn the clients send — is admitted without
//! a store read.
//!
//! The filter holds a 64-bit hash of each key the session admitted a span
//! with. A key whose hash it does not hold was never admitted: the turn
//! is new, and no read is needed. A key whose hash it holds may have been
//! (or may share a hash with one that was, or may have been taken back
//! since): the store is asked, as before. The filter can thus answer
//! "new" wrongly only if it misses a key the store holds, which the broker
//! prevents by building it from the store and adding every key it writes
//! after; keys the store has dropped since (a retracted turn, a reset)
//! cost a read, never a wrong answer.
//!
//! Hashes are keyed per process ([`RandomState`]), so a client cannot
//! choose keys that collide.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// The hashes of a session's idempotency keys.
#[derive(Debug, Clone, Default)]
pub struct KeyFilter {
    hashes: HashSet<u64>,
    state: RandomState,
}

impl KeyFilter {
    /// A filter holding `keys`.
    pub fn of<'a>(keys: impl IntoIterator<Item = &'a str>) -> KeyFilter {
        let mut filter = KeyFilter::default();
        for key in keys {
            filter.insert(key);
        }
        filter
    }

    /// Notes that a span was admitted with `key`.
    pub fn insert(&mut self, key: &str) {
        let hash = self.hash(key);
        self.hashes.insert(hash);
    }

    /// Whether `key` may have been admitted before: false only when it
    /// certainly was not.
    pub fn may_hold(&self, key: &str) -> bool {
        self.hashes.contains(&self.hash(key))
    }

    /// The heap the filter holds, about: a hash and a control byte per
    /// slot.
    pub fn heap_bytes(&self) -> u64 {
        (self.hashes.capacity() * (size_of::<u64>() + 1)) as u64
    }

    fn hash(&self, key: &str) -> u64 {
        self.state.hash_one(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_not_noted_is_new_and_a_noted_one_may_not_be() {
        let mut filter = KeyFilter::of(["turn-1/a", "turn-1/b"]);
        assert!(filter.may_hold("turn-1/a"));
        assert!(filter.may_hold("turn-1/b"));
        assert!(!filter.may_hold("turn-2/a"));
        assert!(!filter.may_hold(""));
        filter.insert("turn-2/a");
        assert!(filter.may_hold("turn-2/a"));
        assert_eq!(filter.hashes.len(), 3);
        assert!(filter.heap_bytes() >= 3 * 9);
    }

    #[test]
    fn many_keys_leave_new_ones_new() {
        let filter = KeyFilter::of(
            (0..10_000)
                .map(|i| format!("old-{i}"))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        );
        assert_eq!(filter.hashes.len(), 10_000);
        assert!((0..10_000).all(|i| filter.may_hold(&format!("old-{i}"))));
        let false_hits = (0..10_000)
            .filter(|i| filter.may_hold(&format!("new-{i}")))
            .count();
        assert_eq!(
            false_hits, 0,
            "64-bit hashes of 10,000 keys should not collide"
        );
    }
}
