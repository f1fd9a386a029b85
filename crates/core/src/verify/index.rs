//! Where each id of the pre-state stands, for lookups that cost little
//! when asked in prompt order.

use crate::facts::LiveRow;
use crate::span::SpanId;

/// Where each id of the pre-state stands: the ids sorted with their
/// indices, by a stable sort, which costs one pass over the few increasing
/// runs a live context's ids form. A repeated id answers with its last
/// index. The pass that reads the ids also totals the tokens and lists
/// the constraints, which other checks read instead of walking pre again.
pub(super) struct PreIndex {
    by_id: Vec<(SpanId, usize)>,
    /// The indices of every span whose id an earlier span has, in prompt
    /// order.
    pub(super) repeated: Vec<usize>,
    /// The tokens of every span of pre.
    pub(super) tokens: u64,
    /// The indices of the constraints of pre, in prompt order.
    pub(super) pinned: Vec<usize>,
}

impl PreIndex {
    pub(super) fn new(pre: &[LiveRow]) -> PreIndex {
        // One pass over pre's rows gathers what the checks read of every
        // span: ids, tokens, and which spans are constraints.
        let mut by_id: Vec<(SpanId, usize)> = Vec::with_capacity(pre.len());
        let mut tokens: u64 = 0;
        let mut pinned: Vec<usize> = Vec::new();
        for (i, s) in pre.iter().enumerate() {
            by_id.push((s.id, i));
            tokens += u64::from(s.tokens);
            if s.is_pinned() {
                pinned.push(i);
            }
        }
        by_id.sort_by_key(|&(id, _)| id);
        let mut repeated: Vec<usize> = by_id
            .windows(2)
            .filter(|w| w[0].0 == w[1].0)
            .map(|w| w[1].1)
            .collect();
        repeated.sort_unstable();
        PreIndex {
            by_id,
            repeated,
            tokens,
            pinned,
        }
    }

    /// The index of `id` in pre.
    pub(super) fn get(&self, id: SpanId) -> Option<usize> {
        let p = self.by_id.partition_point(|&(k, _)| k <= id);
        p.checked_sub(1)
            .map(|at| self.by_id[at])
            .filter(|&(k, _)| k == id)
            .map(|(_, i)| i)
    }

    /// [`PreIndex::get`], searching onwards from where the previous search
    /// ended (`hint`), so that ids asked in increasing order cost little.
    pub(super) fn get_near(&self, id: SpanId, hint: &mut usize) -> Option<usize> {
        let v = &self.by_id;
        let start = match v.get(*hint) {
            Some(&(k, _)) if k <= id => *hint,
            _ => 0,
        };
        // Gallop to an entry above `id`, then search between.
        let mut end = start + 1;
        let mut step = 1;
        while end < v.len() && v[end].0 <= id {
            step *= 2;
            end = start + step;
        }
        let end = end.min(v.len());
        let p = start + v[start..end].partition_point(|&(k, _)| k <= id);
        *hint = p.saturating_sub(1);
        p.checked_sub(1)
            .map(|at| v[at])
            .filter(|&(k, _)| k == id)
            .map(|(_, i)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::Span;

    #[test]
    fn the_pre_index_answers_like_a_map_filled_in_order() {
        let mut x = 0x9e37_79b9_u64;
        for len in [0usize, 1, 2, 7, 64, 300] {
            // Increasing runs, as a live context's ids form, with repeats.
            let ids: Vec<u64> = (0..len)
                .map(|k| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (k as u64 % 97) * 3 + x % 4
                })
                .collect();
            let pre: Vec<Span> = ids
                .iter()
                .map(|&id| crate::testing::admitted(id, 1, crate::span::Role::Tool, "x"))
                .collect();
            let rows: Vec<LiveRow> = pre.iter().map(LiveRow::of).collect();
            let index = PreIndex::new(&rows);
            let mut map = std::collections::HashMap::new();
            let mut repeated = Vec::new();
            for (i, s) in pre.iter().enumerate() {
                if map.insert(s.id, i).is_some() {
                    repeated.push(i);
                }
            }
            assert_eq!(index.repeated, repeated);
            let mut hint = 0;
            for probe in (0..320u64).chain((0..320).rev()).chain(ids.iter().copied()) {
                assert_eq!(index.get(probe), map.get(&probe).copied(), "{probe}");
                assert_eq!(
                    index.get_near(probe, &mut hint),
                    map.get(&probe).copied(),
                    "{probe}"
                );
            }
        }
    }
}
