//! Whether the plan makes sense against the pre-state: ids unique,
//! evictions and compressed forms of live spans, each once, with the
//! tokens they claim, and a post-state that is exactly what the plan makes
//! of the pre-state, in prompt order.

use super::index::PreIndex;
use super::{Pre, Report};
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
    pre: &[Span],
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

/// The post-state must be exactly what the plan makes of the pre-state,
/// with positions strictly increasing.
pub(super) fn check_post_order(v: &mut Report, pre: &Pre<'_>, plan: &Plan, post: &[&Span]) {
    let mut expected: Vec<(u64, SpanId)> = pre
        .spans
        .iter()
        .zip(&pre.is_evicted)
        .filter(|&(_, &gone)| !gone)
        .map(|(s, _)| (s.position, s.id))
        .collect();
    // Pre is in prompt order, so this is sorted but for the summary: find
    // its place rather than sort (the same list either way, as the
    // entries are totally ordered).
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
    if let Some(w) = post.windows(2).find(|w| w[0].position >= w[1].position) {
        v.push(
            ViolationKind::PlanInconsistent,
            Some(w[1].id),
            format!(
                "positions are not strictly increasing: span {} at {} follows span {} at {}",
                w[1].id, w[1].position, w[0].id, w[0].position
            ),
        );
    }
}
