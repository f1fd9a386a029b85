//! Tool exchanges: the live spans of a session that share a
//! `tool_call_id` (a call and its result, see [`Attributes`]). The model
//! providers refuse a tool result whose call is missing, and a call whose
//! result is missing, so a compaction evicts an exchange whole or not at
//! all: the planner orders its spans as one candidate, and the verifier
//! refuses a plan that splits one.
//!
//! An exchange is evictable only when every span of it is narrative and
//! none of it is held by the turn being admitted (a result arriving for a
//! call already live holds the call). Spans of other classes in an
//! exchange (a constraint the caller labelled, a doubtful user line) keep
//! the whole exchange.
//!
//! [`Attributes`]: crate::span::Attributes

use crate::facts::LiveRow;
use crate::fasthash::{self, FastMap};
use crate::span::{Span, SpanClass};

/// The exchanges among a live context, by the index of their spans.
#[derive(Debug, Default)]
pub(crate) struct Exchanges<'a> {
    /// Each exchange's id and the indices of its live spans, ascending.
    groups: Vec<(&'a str, Vec<usize>)>,
    /// For each index in an exchange, its group.
    group_of: FastMap<usize, usize>,
    /// Per group, whether a compaction may evict it.
    evictable: Vec<bool>,
}

impl<'a> Exchanges<'a> {
    /// The exchanges of `live` (whose rows are `rows`); `held` are the
    /// tool call ids of the turn being admitted. Reads only the spans
    /// whose row says they belong to one, so that a context without tool
    /// exchanges costs one pass over its rows.
    pub(crate) fn of(live: &'a [Span], rows: &[LiveRow], held: &[&str]) -> Exchanges<'a> {
        let mut out = Exchanges::default();
        let mut by_id: FastMap<&'a str, usize> = fasthash::map(0);
        for (i, row) in rows.iter().enumerate() {
            if !row.exchange {
                continue;
            }
            let Some(id) = live.get(i).and_then(Span::tool_call_id) else {
                continue;
            };
            let g = *by_id.entry(id).or_insert_with(|| {
                out.groups.push((id, Vec::new()));
                out.evictable.push(!held.contains(&id));
                out.groups.len() - 1
            });
            out.groups[g].1.push(i);
            out.group_of.insert(i, g);
            if row.class != SpanClass::Narrative {
                out.evictable[g] = false;
            }
        }
        out
    }

    /// Whether there is no exchange at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The group of the span at index `i`, when it is in an exchange.
    pub(crate) fn group(&self, i: usize) -> Option<usize> {
        self.group_of.get(&i).copied()
    }

    /// Whether the span at `i` may be evicted as far as exchanges go: it
    /// is in none, or in one that may go whole.
    pub(crate) fn may_evict(&self, i: usize) -> bool {
        self.group(i).is_none_or(|g| self.evictable[g])
    }

    /// Every group: its id, its members, and whether it may go.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'a str, &[usize], bool)> + '_ {
        self.groups
            .iter()
            .zip(&self.evictable)
            .map(|((id, m), &e)| (*id, m.as_slice(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::{Attributes, Role};
    use crate::testing::admitted;

    fn with_call(mut s: Span, id: &str) -> Span {
        s.attributes = Some(Box::new(Attributes {
            tool_call_id: id.into(),
            ..Default::default()
        }));
        s
    }

    #[test]
    fn groups_by_id_and_holds_what_the_turn_or_a_class_holds() {
        let live = vec![
            with_call(admitted(1, 1, Role::Assistant, "call a"), "a"),
            admitted(2, 1, Role::Tool, "plain"),
            with_call(admitted(3, 1, Role::Tool, "result a"), "a"),
            with_call(admitted(4, 2, Role::Assistant, "call b"), "b"),
            with_call(admitted(5, 2, Role::Assistant, "call c"), "c"),
            with_call(admitted(6, 2, Role::User, "Never touch prod."), "c"),
        ];
        let rows: Vec<LiveRow> = live.iter().map(LiveRow::of).collect();
        let ex = Exchanges::of(&live, &rows, &["b"]);
        assert_eq!(ex.group(0), ex.group(2));
        assert!(ex.group(1).is_none());
        let members: Vec<&[usize]> = ex.iter().map(|(_, m, _)| m).collect();
        assert_eq!(members[0], &[0, 2]);
        assert!(ex.may_evict(0) && ex.may_evict(1) && ex.may_evict(2));
        assert!(!ex.may_evict(3), "held by the incoming turn");
        let pinned = live[5].is_pinned();
        assert!(pinned, "the rules pin the constraint");
        assert!(
            !ex.may_evict(4) && !ex.may_evict(5),
            "a constraint keeps its exchange"
        );
        assert_eq!(ex.iter().count(), 3);
        let none = Exchanges::of(&live[1..2], &rows[1..2], &[]);
        assert!(none.is_empty());
    }
}
