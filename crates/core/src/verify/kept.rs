//! Every span of the post-state: what it holds and the tokens it counts,
//! kept as it was or changed only by the plan's compressed form.

use super::constraints::check_form;
use super::{ABSENT, PINNED, Pre, Report, UNPINNED};
use crate::fasthash::FastMap;
use crate::plan::{Plan, ViolationKind};
use crate::span::{OriginalForm, Span, SpanId};
use crate::tokens::TokenCounter;

/// Every span of post: its content and its tokens, as far as they can be
/// trusted. Returns, per pre span, whether post holds it and as what
/// ([`ABSENT`], [`PINNED`] or [`UNPINNED`]), and post's tokens.
pub(super) fn count_post(
    v: &mut Report,
    pre: &Pre<'_>,
    plan: &Plan,
    post: &[&Span],
    forms: &FastMap<SpanId, (&str, u32)>,
    summary_tokens: Option<u32>,
    counter: &dyn TokenCounter,
) -> (Vec<u8>, u64) {
    let mut state = vec![ABSENT; pre.spans.len()];
    let mut summary_seen = false;
    let mut post_tokens: u64 = 0;
    // Post follows pre's order: look where the last kept span ended first.
    let mut next = 0;
    let summary_id = plan.summary.as_ref().map(|m| m.id);
    for &s in post {
        // The very span of pre that comes next, kept as it was: what the
        // checks below find of it is in its row, and the span is not read.
        while next < pre.spans.len() && pre.is_evicted[next] {
            next += 1;
        }
        if pre.index.repeated.is_empty()
            && let (Some(p), Some(row)) = (pre.spans.get(next), pre.rows.get(next))
            && std::ptr::eq(p, s)
            && Some(row.id) != summary_id
            && (forms.is_empty() || !forms.contains_key(&row.id))
        {
            if state[next] != ABSENT {
                v.push(
                    ViolationKind::PlanInconsistent,
                    Some(row.id),
                    format!(
                        "span {} appears twice in the post-compaction context",
                        row.id
                    ),
                );
            }
            state[next] = if row.is_pinned() { PINNED } else { UNPINNED };
            post_tokens += u64::from(row.tokens);
            next += 1;
            continue;
        }
        if let Some(summary) = plan.summary.as_ref().filter(|p| p.id == s.id) {
            if summary_seen {
                v.push(
                    ViolationKind::PlanInconsistent,
                    Some(s.id),
                    format!("summary span {} appears twice", s.id),
                );
            }
            summary_seen = true;
            if s.text != summary.text {
                v.push(
                    ViolationKind::PlanInconsistent,
                    Some(s.id),
                    format!("summary span {} differs from the plan's summary", s.id),
                );
                post_tokens += u64::from(counter.count(&s.text));
            } else {
                post_tokens += u64::from(summary_tokens.unwrap_or(s.tokens));
            }
            continue;
        }
        while next < pre.spans.len() && pre.is_evicted[next] {
            next += 1;
        }
        let found =
            if pre.index.repeated.is_empty() && pre.spans.get(next).is_some_and(|p| p.id == s.id) {
                Some(next)
            } else {
                pre.index.get(s.id)
            };
        let Some(i) = found else {
            // Already reported as inconsistent; still count it.
            post_tokens += u64::from(counter.count(&s.text));
            continue;
        };
        if state[i] != ABSENT {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(s.id),
                format!("span {} appears twice in the post-compaction context", s.id),
            );
        }
        next = i + 1;
        state[i] = if s.is_pinned() { PINNED } else { UNPINNED };
        post_tokens += u64::from(kept_tokens(v, &pre.spans[i], s, forms, counter));
    }
    (state, post_tokens)
}

/// The tokens a kept span contributes, checking that the plan did not alter
/// it except by a compressed form, and that a compressed constraint still
/// satisfies its predicate.
fn kept_tokens(
    v: &mut Report,
    original: &Span,
    s: &Span,
    forms: &FastMap<SpanId, (&str, u32)>,
    counter: &dyn TokenCounter,
) -> u32 {
    // The very span of pre, kept as it was: every check below compares it
    // with itself.
    if std::ptr::eq(original, s) && !forms.contains_key(&s.id) {
        return original.tokens;
    }
    if s.is_pinned() && original.is_pinned() && s.predicate != original.predicate {
        v.push(
            ViolationKind::PlanInconsistent,
            Some(s.id),
            format!("constraint {} has another predicate after compaction", s.id),
        );
    }
    // The form a constraint was pinned in stays with it: recorded on its
    // first compression, never altered after.
    let expected_original = match (forms.contains_key(&s.id), &original.original) {
        (_, Some(first)) => Some(first.clone()),
        (true, None) => Some(OriginalForm {
            text: original.text.clone(),
            tokens: original.tokens,
        }),
        (false, None) => None,
    };
    if s.original != expected_original {
        v.push(
            ViolationKind::PlanInconsistent,
            Some(s.id),
            format!("span {} does not keep the form it was admitted in", s.id),
        );
    }
    match forms.get(&s.id) {
        Some(&(text, tokens)) => {
            if s.text != text {
                v.push(
                    ViolationKind::PlanInconsistent,
                    Some(s.id),
                    format!("span {} differs from its compressed form in the plan", s.id),
                );
            }
            let tokens = if s.text == text {
                tokens
            } else {
                counter.count(&s.text)
            };
            check_form(v, original, &s.text, tokens);
            tokens
        }
        None if s.text == original.text => {
            if s.tokens != original.tokens {
                v.push(
                    ViolationKind::PlanInconsistent,
                    Some(s.id),
                    format!(
                        "span {} claims {} tokens after compaction, {} before",
                        s.id, s.tokens, original.tokens
                    ),
                );
            }
            original.tokens
        }
        None => {
            v.push(
                ViolationKind::PlanInconsistent,
                Some(s.id),
                format!(
                    "span {} is altered without a compressed form in the plan",
                    s.id
                ),
            );
            let tokens = counter.count(&s.text);
            if original.is_pinned() {
                check_form(v, original, &s.text, tokens);
            }
            tokens
        }
    }
}
