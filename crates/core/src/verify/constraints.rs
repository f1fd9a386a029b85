//! What binds the agent: every pinned constraint retained as a
//! constraint, compressed only once nothing evictable is left, and then
//! only by a form that satisfies its predicate.

use std::collections::BTreeSet;

use super::{ABSENT, Pre, Report, UNPINNED};
use crate::plan::{Plan, ViolationKind};
use crate::predicate::check;
use crate::span::{Span, SpanClass, SpanId};

/// Compressed forms are for when nothing evictable is left: a plan that
/// compresses a constraint while narrative or an earlier summary stays
/// live shortens what binds the agent instead of what does not. Spans of
/// a tool exchange that may not go (one the incoming turn, in `held`,
/// continues, or one holding a span of another class than narrative) are
/// not evictable.
pub(super) fn check_compression_timing(v: &mut Report, plan: &Plan, post: &[&Span], held: &[&str]) {
    if !plan.compressed.is_empty() {
        let summary_id = plan.summary.as_ref().map(|s| s.id);
        let stuck: BTreeSet<&str> = post
            .iter()
            .filter_map(|s| {
                let id = s.tool_call_id()?;
                (held.contains(&id) || s.class() != SpanClass::Narrative).then_some(id)
            })
            .collect();
        let evictable: Vec<SpanId> = post
            .iter()
            .filter(|s| !s.is_pinned() && Some(s.id) != summary_id)
            .filter(|s| s.tool_call_id().is_none_or(|id| !stuck.contains(id)))
            .map(|s| s.id)
            .collect();
        if let Some(&first) = evictable.first() {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(first),
                format!(
                    "the plan compresses {} constraints while {} evictable spans stay live (first: span {first}); constraints are compressed only when narrative is exhausted",
                    plan.compressed.len(),
                    evictable.len()
                ),
            );
        }
    }
}

/// Every pinned constraint of pre is in post, as a constraint; `state`
/// says, per pre span, whether post holds it and as what.
pub(super) fn check_pinned_retained(v: &mut Report, pre: &Pre<'_>, state: &[u8]) {
    for &i in &pre.index.pinned {
        let Some(s) = pre.spans.get(i) else {
            continue;
        };
        let detail = if pre.is_evicted[i] {
            Some(format!("constraint {} is evicted by the plan", s.id))
        } else {
            match state[i] {
                ABSENT => Some(format!("constraint {} is missing after compaction", s.id)),
                UNPINNED => Some(format!(
                    "constraint {} is no longer a constraint after compaction",
                    s.id
                )),
                _ => None,
            }
        };
        if let Some(detail) = detail {
            v.push(ViolationKind::PinnedMissing, Some(s.id), detail);
        }
    }
}

/// A constraint retained by a text other than its own must satisfy its
/// predicate, and be no longer than the form it was pinned in (its
/// original, when it already stood compressed); one without a predicate
/// cannot be checked and so fails.
pub(super) fn check_form(v: &mut Report, original: &Span, text: &str, tokens: u32) {
    let Some(predicate) = &original.predicate else {
        v.push(
            ViolationKind::PredicateUnsatisfied,
            Some(original.id),
            format!(
                "constraint {} has no predicate to check its compressed form against",
                original.id
            ),
        );
        return;
    };
    let pinned_tokens = original
        .original
        .as_ref()
        .map_or(original.tokens, |o| o.tokens);
    if let Err(missing) = check(text, tokens, pinned_tokens, predicate) {
        v.push_terms(
            ViolationKind::PredicateUnsatisfied,
            Some(original.id),
            format!(
                "compressed form of constraint {} does not satisfy its predicate: missing {}",
                original.id,
                missing.join(", ")
            ),
            missing,
        );
    }
}
