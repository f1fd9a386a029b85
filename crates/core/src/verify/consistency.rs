//! Whether the plan makes sense against the pre-state: ids unique,
//! evictions and compressed forms of live spans, each once, with the
//! tokens they claim, and a post-state that is exactly what the plan makes
//! of the pre-state, in prompt order.

use std::cell::Cell;

use super::index::PreIndex;
use super::{Pre, Report};
use crate::facts::LiveRow;
use crate::fasthash::{self, FastMap};
use crate::plan::{Plan, ViolationKind};
use crate::span::{Span, SpanId};
use crate::tokens::TokenCounter;

/// The pre-state: ids must be unique for anything below to mean much.
pub(super) fn check_repeated_ids(v: &mut Report, pre: &[Span], pre_index: &PreIndex) {
    for &i in &pre_index.repeated {
        let s = &pre[i];
        v.push(
            ViolationKind::PlanInconsistent,
            Some(s.id),
            format!("span {} appears twice in the pre-compaction context", s.id),
        );
    }
}

/// Evictions: of live spans, once each, with their tokens. Returns which
/// pre spans are evicted, by index, and the indices of the evicted spans
/// in plan order.
pub(super) fn check_evictions(
    v: &mut Report,
    pre: &[LiveRow],
    pre_index: &PreIndex,
    plan: &Plan,
) -> (Vec<bool>, Vec<usize>) {
    let mut is_evicted = vec![false; pre.len()];
    let mut evicted: Vec<usize> = Vec::with_capacity(plan.evicted.len());
    let mut hint = 0;
    for e in &plan.evicted {
        let Some(i) = pre_index.get_near(e.span_id, &mut hint) else {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(e.span_id),
                format!("evicted span {} is not in the live context", e.span_id),
            );
            continue;
        };
        if is_evicted[i] {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(e.span_id),
                format!("span {} is evicted twice", e.span_id),
            );
            continue;
        }
        is_evicted[i] = true;
        let s = &pre[i];
        if e.tokens != s.tokens {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(s.id),
                format!(
                    "eviction of span {} claims {} tokens, the span has {}",
                    s.id, e.tokens, s.tokens
                ),
            );
        }
        evicted.push(i);
    }
    (is_evicted, evicted)
}

/// Compressed forms: only of constraints, once each, recounted. Returns
/// each form's text and recounted tokens by span id.
pub(super) fn check_forms<'p>(
    v: &mut Report,
    pre: &Pre<'_>,
    plan: &'p Plan,
    counter: &dyn TokenCounter,
) -> FastMap<SpanId, (&'p str, u32)> {
    let mut forms: FastMap<SpanId, (&str, u32)> = fasthash::map(plan.compressed.len());
    for form in &plan.compressed {
        let tokens = counter.count(&form.text);
        if tokens != form.tokens {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(form.span_id),
                format!(
                    "compressed form of span {} claims {} tokens, counts {}",
                    form.span_id, form.tokens, tokens
                ),
            );
        }
        if forms
            .insert(form.span_id, (form.text.as_str(), tokens))
            .is_some()
        {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(form.span_id),
                format!("span {} has two compressed forms", form.span_id),
            );
        }
        match pre.index.get(form.span_id).map(|i| (i, &pre.spans[i])) {
            None => v.push(
                ViolationKind::PlanInconsistent,
                Some(form.span_id),
                format!(
                    "compressed span {} is not in the live context",
                    form.span_id
                ),
            ),
            Some((_, s)) if !s.is_pinned() => v.push(
                ViolationKind::PlanInconsistent,
                Some(s.id),
                format!("span {} is compressed but is not a constraint", s.id),
            ),
            Some((i, s)) if pre.is_evicted[i] => v.push(
                ViolationKind::PlanInconsistent,
                Some(s.id),
                format!("span {} is both compressed and evicted", s.id),
            ),
            Some(_) => {}
        }
    }
    forms
}

/// An entry of the expected post-state: (position, id), and the span of
/// pre it is the entry of, when it is one.
type Entry<'a> = ((u64, SpanId), Option<&'a Span>);

/// Walks the expected list beside post: its length, the first index where
/// post differs from it (a post shorter or longer differs where the
/// shorter ends), and the expected id at that index. A post span that is
/// the very span of pre an entry was made from is that entry without
/// being read: the entry holds its row's position and id, and the rows
/// copy the spans.
fn first_difference<'a, I: Iterator<Item = Entry<'a>>>(
    expected: impl Fn() -> I,
    post: &[&Span],
) -> (usize, Option<usize>, Option<SpanId>) {
    let mut len = 0;
    let mut differs_at = None;
    for (at, ((position, id), from)) in expected().enumerate() {
        len += 1;
        if differs_at.is_none()
            && !post.get(at).is_some_and(|&s| {
                from.is_some_and(|f| std::ptr::eq(f, s)) || (s.position == position && s.id == id)
            })
        {
            differs_at = Some(at);
        }
    }
    if differs_at.is_none() && post.len() != len {
        differs_at = Some(len.min(post.len()));
    }
    let id = differs_at
        .and_then(|at| expected().nth(at))
        .map(|((_, id), _)| id);
    (len, differs_at, id)
}

/// The post-state must be exactly what the plan makes of the pre-state,
/// with positions strictly increasing.
pub(super) fn check_post_order(v: &mut Report, pre: &Pre<'_>, plan: &Plan, post: &[&Span]) {
    // What post must be, by (position, id): the spans pre keeps, with the
    // summary's entry, in order.
    let kept = || {
        pre.rows
            .iter()
            .zip(pre.spans)
            .zip(&pre.is_evicted)
            .filter(|&(_, &gone)| !gone)
            .map(|((r, s), _)| ((r.position, r.id), Some(s)))
    };
    let summary: Option<Entry<'_>> = plan.summary.as_ref().map(|s| ((s.position, s.id), None));
    // Pre is in prompt order, so the kept entries are sorted: the summary's
    // entry then goes before the first one above it, read in one walk
    // beside post, with nothing copied; the same walk finds whether they
    // are sorted indeed. Otherwise they are sorted first and compared
    // again (the same list either way, as the entries are totally
    // ordered).
    let sorted = Cell::new(true);
    let ascending = &sorted;
    let checked = || {
        let mut previous = None;
        kept().inspect(move |&(e, _)| {
            if previous.is_some_and(|p| p >= e) {
                ascending.set(false);
            }
            previous = Some(e);
        })
    };
    let merged = || {
        let mut rest = summary;
        let mut kept = checked().peekable();
        std::iter::from_fn(move || match (rest, kept.peek()) {
            (Some((m, _)), Some(&(e, _))) if m < e => rest.take(),
            (Some(_), None) => rest.take(),
            _ => kept.next(),
        })
    };
    let walked = first_difference(merged, post);
    let in_order = sorted.get();
    let (expected_len, differs_at, expected_id) = if in_order {
        walked
    } else {
        let mut expected: Vec<Entry<'_>> = kept().chain(summary).collect();
        expected.sort_unstable_by_key(|&(e, _)| e);
        first_difference(|| expected.iter().copied(), post)
    };
    if let Some(at) = differs_at {
        v.push(
            ViolationKind::PlanInconsistent,
            post.get(at).map(|s| s.id).or(expected_id),
            format!(
                "post-compaction context does not follow from the plan: {expected_len} spans expected, {} given, first difference at index {at}",
                post.len()
            ),
        );
    }
    if differs_at.is_none() && in_order {
        // Post is the merged list, entry for entry: its positions are the
        // entries', read from the rows rather than from post's spans.
        let mut previous = None;
        let at = merged().enumerate().find_map(|(k, ((position, _), _))| {
            let out_of_order = previous.is_some_and(|p| p >= position);
            previous = Some(position);
            out_of_order.then_some(k)
        });
        if let Some(k) = at
            && let (Some(a), Some(b)) = (post.get(k.wrapping_sub(1)), post.get(k))
        {
            report_not_increasing(v, a, b);
        }
    } else {
        check_positions_increase(v, post);
    }
}

/// The post-state's positions must be strictly increasing.
fn check_positions_increase(v: &mut Report, post: &[&Span]) {
    if let Some(w) = post.windows(2).find(|w| w[0].position >= w[1].position) {
        report_not_increasing(v, w[0], w[1]);
    }
}

/// Span `b` follows span `a` in post at a position not above `a`'s.
fn report_not_increasing(v: &mut Report, a: &Span, b: &Span) {
    v.push(
        ViolationKind::PlanInconsistent,
        Some(b.id),
        format!(
            "positions are not strictly increasing: span {} at {} follows span {} at {}",
            b.id, b.position, a.id, a.position
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Eviction, EvictionReason};
    use crate::span::Role;

    /// The check as it was first written: the expected list copied out,
    /// the summary inserted into it, then compared with post.
    fn check_post_order_by_copy(v: &mut Report, pre: &Pre<'_>, plan: &Plan, post: &[&Span]) {
        let mut expected: Vec<(u64, SpanId)> = pre
            .spans
            .iter()
            .zip(&pre.is_evicted)
            .filter(|&(_, &gone)| !gone)
            .map(|(s, _)| (s.position, s.id))
            .collect();
        let sorted = expected.windows(2).all(|w| w[0] < w[1]);
        if let Some(s) = &plan.summary {
            let entry = (s.position, s.id);
            if sorted {
                let at = expected.partition_point(|e| *e < entry);
                expected.insert(at, entry);
            } else {
                expected.push(entry);
            }
        }
        if !sorted {
            expected.sort_unstable();
        }
        let differs_at = expected
            .iter()
            .zip(post)
            .position(|(&(position, id), s)| s.position != position || s.id != id)
            .or((expected.len() != post.len()).then(|| expected.len().min(post.len())));
        if let Some(at) = differs_at {
            v.push(
                ViolationKind::PlanInconsistent,
                post.get(at).map(|s| s.id).or(expected.get(at).map(|&(_, id)| id)),
                format!(
                    "post-compaction context does not follow from the plan: {} spans expected, {} given, first difference at index {at}",
                    expected.len(),
                    post.len()
                ),
            );
        }
        check_positions_increase(v, post);
    }

    use crate::testing::Rng;

    #[test]
    fn the_post_order_walk_reports_what_the_copied_list_does() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for round in 0..4_000 {
            let len = rng.below(12) as usize;
            // Mostly in prompt order; sometimes shuffled, with repeats.
            let mut pre: Vec<Span> = (0..len as u64)
                .map(|k| crate::testing::admitted(k + 1, 1, Role::Tool, "x"))
                .collect();
            if round % 3 == 0 {
                for s in &mut pre {
                    s.position = rng.below(8);
                    if rng.below(4) == 0 {
                        s.id = rng.below(6);
                    }
                }
            }
            let is_evicted: Vec<bool> = pre.iter().map(|_| rng.below(3) == 0).collect();
            let mut plan = crate::testing::plan(Vec::new(), None, Vec::new());
            plan.evicted = pre
                .iter()
                .zip(&is_evicted)
                .filter(|&(_, &gone)| gone)
                .map(|(s, _)| Eviction {
                    span_id: s.id,
                    relevance: 0.0,
                    reason: EvictionReason::Budget,
                    tokens: s.tokens,
                })
                .collect();
            let mut summary = crate::testing::admitted(100 + rng.below(3), 1, Role::System, "s");
            summary.position = rng.below(len as u64 + 2);
            if rng.below(4) != 0 {
                plan.summary = Some(summary.clone());
            }
            // Post: what the plan makes of pre, then perhaps broken.
            let mut post: Vec<&Span> = pre
                .iter()
                .zip(&is_evicted)
                .filter(|&(_, &gone)| !gone)
                .map(|(s, _)| s)
                .collect();
            if let Some(m) = &plan.summary {
                let at = post.partition_point(|s| s.position <= m.position);
                post.insert(at, m);
            }
            match rng.below(5) {
                0 if !post.is_empty() => {
                    let at = rng.below(post.len() as u64) as usize;
                    post.remove(at);
                }
                1 => post.push(&summary),
                2 if post.len() > 1 => {
                    let last = post.len() - 1;
                    post.swap(0, last);
                }
                3 => post.clear(),
                _ => {}
            }
            let rows: Vec<LiveRow> = pre.iter().map(LiveRow::of).collect();
            let pre = Pre {
                index: crate::verify::index::PreIndex::new(&rows),
                spans: &pre,
                rows: &rows,
                is_evicted,
            };
            let (mut walked, mut copied) = (Report::default(), Report::default());
            check_post_order(&mut walked, &pre, &plan, &post);
            check_post_order_by_copy(&mut copied, &pre, &plan, &post);
            assert_eq!(walked.violations, copied.violations, "round {round}");
        }
    }
}
