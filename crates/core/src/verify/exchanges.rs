//! Tool exchanges (live spans sharing a `tool_call_id`): evicted whole or
//! kept whole, and kept whenever the turn being admitted holds them.
//! Grouped here from the spans themselves, apart from the planner's
//! grouping, so that a fault in one is caught by the other.

use std::collections::BTreeMap;

use super::Report;
use crate::facts::LiveRow;
use crate::plan::ViolationKind;
use crate::span::Span;

/// Reports each exchange of `pre` that the plan (`is_evicted`, by index)
/// splits, naming a span it keeps, and each evicted one the incoming turn
/// holds (`held`).
pub(super) fn check_exchanges_whole(
    v: &mut Report,
    pre: &[Span],
    rows: &[LiveRow],
    is_evicted: &[bool],
    held: &[&str],
) {
    // id → (evicted count, a kept span, members).
    let mut groups: BTreeMap<&str, (usize, Option<u64>, usize)> = BTreeMap::new();
    for (i, row) in rows.iter().enumerate() {
        if !row.exchange {
            continue;
        }
        let Some(id) = pre.get(i).and_then(Span::tool_call_id) else {
            continue;
        };
        let entry = groups.entry(id).or_insert((0, None, 0));
        entry.2 += 1;
        if is_evicted.get(i).copied().unwrap_or(false) {
            entry.0 += 1;
        } else if entry.1.is_none() {
            entry.1 = Some(row.id);
        }
    }
    for (id, (evicted, kept, members)) in groups {
        if evicted == 0 {
            continue;
        }
        if let Some(kept) = kept {
            v.push(
                ViolationKind::ToolExchangeSplit,
                Some(kept),
                format!(
                    "tool exchange {id:?}: {evicted} of its {members} live spans evicted, span {kept} kept"
                ),
            );
        } else if held.contains(&id) {
            v.push(
                ViolationKind::ToolExchangeSplit,
                None,
                format!(
                    "tool exchange {id:?}: its {members} live spans evicted while the incoming turn continues it"
                ),
            );
        }
    }
}
