//! The verifier: an independent pre-commit check of a plan.
//!
//! The verifier shares no code with the planner beyond the primitives that
//! define the rules (a predicate's check, what an anchor is), so a bug in the
//! planner cannot also blind the check. It trusts nothing the plan says
//! about itself: it recounts every text the plan wrote, recomputes the
//! post-state it must lead to, and reports every violation it finds, not
//! the first. A plan it cannot make sense of is rejected (fail closed).

use crate::config::SessionConfig;
use crate::fasthash::{self, FastMap, FastSet};
use crate::plan::{Plan, Verdict, Violation, ViolationKind};
use crate::predicate::check;
use crate::span::{Span, SpanClass, SpanId};
use crate::summary::extract_anchors;
use crate::tokens::TokenCounter;

/// Checks that `post` is what `plan` makes of `pre`, and that it keeps
/// every invariant: pinned constraints retained (verbatim or by a form that
/// satisfies their predicate, measured against the form they were pinned
/// in), compressed forms only once no evictable span is left, post +
/// incoming within the budget, summary generation within the session's
/// limit, anchors carried or accounted for.
pub fn verify(
    pre: &[Span],
    plan: &Plan,
    post: &[Span],
    incoming_tokens: u64,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Verdict {
    let post: Vec<&Span> = post.iter().collect();
    verify_refs(pre, plan, &post, incoming_tokens, config, counter)
}

/// [`verify`] of a post-state given by reference: the admission path
/// checks the spans it keeps where they stand rather than copies of them.
pub(crate) fn verify_refs(
    pre: &[Span],
    plan: &Plan,
    post: &[&Span],
    incoming_tokens: u64,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Verdict {
    let mut v = Report::default();

    // The pre-state: ids must be unique for anything below to mean much.
    let pre_index = PreIndex::new(pre);
    for &i in &pre_index.repeated {
        let s = &pre[i];
        v.push(
            ViolationKind::PlanInconsistent,
            Some(s.id),
            format!("span {} appears twice in the pre-compaction context", s.id),
        );
    }

    // Evictions.
    let mut is_evicted = vec![false; pre.len()];
    let mut evicted: Vec<&Span> = Vec::with_capacity(plan.evicted.len());
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
        evicted.push(s);
    }

    // Compressed forms: only of constraints, once each, recounted.
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
        match pre_index.get(form.span_id).map(|i| (i, &pre[i])) {
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
            Some((i, s)) if is_evicted[i] => v.push(
                ViolationKind::PlanInconsistent,
                Some(s.id),
                format!("span {} is both compressed and evicted", s.id),
            ),
            Some(_) => {}
        }
    }

    // The summary, recounted.
    let summary_tokens = plan.summary.as_ref().map(|s| {
        let tokens = counter.count(&s.text);
        check_summary(&mut v, s, tokens, &pre_index, &evicted, plan, config);
        tokens
    });
    if plan.summary.is_none() && plan.anchors_carried != 0 {
        v.push(
            ViolationKind::PlanInconsistent,
            None,
            format!(
                "plan claims {} anchors carried without a summary",
                plan.anchors_carried
            ),
        );
    }
    check_anchors(&mut v, plan, &evicted);

    // The post-state must be exactly what the plan makes of the pre-state.
    let mut expected: Vec<(u64, SpanId)> = pre
        .iter()
        .zip(&is_evicted)
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

    // Compressed forms are for when nothing evictable is left: a plan that
    // compresses a constraint while narrative or an earlier summary stays
    // live shortens what binds the agent instead of what does not.
    if !plan.compressed.is_empty() {
        let summary_id = plan.summary.as_ref().map(|s| s.id);
        let evictable: Vec<SpanId> = post
            .iter()
            .filter(|s| !s.is_pinned() && Some(s.id) != summary_id)
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

    // Every span of post: its content and its tokens, as far as they can
    // be trusted. `state` records, per pre span, whether post holds it and
    // as what.
    const ABSENT: u8 = 0;
    const PINNED: u8 = 1;
    const UNPINNED: u8 = 2;
    let mut state = vec![ABSENT; pre.len()];
    let mut summary_seen = false;
    let mut post_tokens: u64 = 0;
    // Post follows pre's order: look where the last kept span ended first.
    let mut next = 0;
    for &s in post {
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
        while next < pre.len() && is_evicted[next] {
            next += 1;
        }
        let found = if pre_index.repeated.is_empty() && pre.get(next).is_some_and(|p| p.id == s.id)
        {
            Some(next)
        } else {
            pre_index.get(s.id)
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
        post_tokens += u64::from(kept_tokens(&mut v, &pre[i], s, &forms, counter));
    }

    // Every pinned constraint of pre is in post, as a constraint.
    for (i, s) in pre.iter().enumerate().filter(|(_, s)| s.is_pinned()) {
        let detail = if is_evicted[i] {
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

    // The budget.
    let budget = u64::from(config.budget_tokens());
    let total = post_tokens.saturating_add(incoming_tokens);
    if total > budget {
        v.push(
            ViolationKind::OverBudget,
            None,
            format!(
                "post-compaction live {post_tokens} + incoming {incoming_tokens} = {total} tokens exceeds the budget {budget} (window {})",
                config.window_tokens
            ),
        );
    }

    // The plan's own account must match.
    let pre_tokens: u64 = pre.iter().map(|s| u64::from(s.tokens)).sum();
    if plan.tokens_before != pre_tokens {
        v.push(
            ViolationKind::PlanInconsistent,
            None,
            format!(
                "plan says {} tokens before, the live context has {pre_tokens}",
                plan.tokens_before
            ),
        );
    }
    if plan.tokens_after != post_tokens {
        v.push(
            ViolationKind::PlanInconsistent,
            None,
            format!(
                "plan says {} tokens after, the post-compaction context counts {post_tokens}",
                plan.tokens_after
            ),
        );
    }
    if plan.incoming_tokens != incoming_tokens {
        v.push(
            ViolationKind::PlanInconsistent,
            None,
            format!(
                "plan was made for {} incoming tokens, the turn has {incoming_tokens}",
                plan.incoming_tokens
            ),
        );
    }

    Verdict {
        violations: v.violations,
    }
}

/// Where each id of the pre-state stands: the ids sorted with their
/// indices, by a stable sort, which costs one pass over the few increasing
/// runs a live context's ids form. A repeated id answers with its last
/// index.
struct PreIndex {
    by_id: Vec<(SpanId, usize)>,
    /// The indices of every span whose id an earlier span has, in prompt
    /// order.
    repeated: Vec<usize>,
}

impl PreIndex {
    fn new(pre: &[Span]) -> PreIndex {
        let mut by_id: Vec<(SpanId, usize)> =
            pre.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
        by_id.sort_by_key(|&(id, _)| id);
        let mut repeated: Vec<usize> = by_id
            .windows(2)
            .filter(|w| w[0].0 == w[1].0)
            .map(|w| w[1].1)
            .collect();
        repeated.sort_unstable();
        PreIndex { by_id, repeated }
    }

    /// The index of `id` in pre.
    fn get(&self, id: SpanId) -> Option<usize> {
        let p = self.by_id.partition_point(|&(k, _)| k <= id);
        p.checked_sub(1)
            .map(|at| self.by_id[at])
            .filter(|&(k, _)| k == id)
            .map(|(_, i)| i)
    }

    /// [`PreIndex::get`], searching onwards from where the previous search
    /// ended (`hint`), so that ids asked in increasing order cost little.
    fn get_near(&self, id: SpanId, hint: &mut usize) -> Option<usize> {
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

#[derive(Default)]
struct Report {
    violations: Vec<Violation>,
}

impl Report {
    fn push(&mut self, kind: ViolationKind, span_id: Option<SpanId>, detail: String) {
        self.push_terms(kind, span_id, detail, Vec::new());
    }

    fn push_terms(
        &mut self,
        kind: ViolationKind,
        span_id: Option<SpanId>,
        detail: String,
        missing_terms: Vec<String>,
    ) {
        self.violations.push(Violation {
            kind,
            span_id,
            detail,
            missing_terms,
        });
    }
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
        (true, None) => Some(crate::span::OriginalForm {
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

/// A constraint retained by a text other than its own must satisfy its
/// predicate, and be no longer than the form it was pinned in (its
/// original, when it already stood compressed); one without a predicate
/// cannot be checked and so fails.
fn check_form(v: &mut Report, original: &Span, text: &str, tokens: u32) {
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

#[allow(clippy::too_many_arguments)]
fn check_summary(
    v: &mut Report,
    s: &Span,
    tokens: u32,
    pre_index: &PreIndex,
    evicted: &[&Span],
    plan: &Plan,
    config: &SessionConfig,
) {
    let id = Some(s.id);
    if tokens != s.tokens {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!("summary claims {} tokens, counts {tokens}", s.tokens),
        );
    }
    if evicted.is_empty() {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            "a summary without evicted spans".into(),
        );
    }
    if pre_index.get(s.id).is_some() {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!("summary id {} is already taken", s.id),
        );
    }
    if s.class() != SpanClass::Summary {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            "the summary span is not of class SUMMARY".into(),
        );
    }
    if let Some(first) = evicted.iter().map(|e| e.position).min()
        && s.position != first
    {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!(
                "summary stands at position {}, the first evicted span at {first}",
                s.position
            ),
        );
    }
    let max = config.max_summary_generations;
    if s.generation > max {
        v.push(
            ViolationKind::GenerationExceeded,
            id,
            format!(
                "summary generation {} exceeds the session's max {max}",
                s.generation
            ),
        );
    }
    let highest = evicted.iter().map(|e| e.generation).max().unwrap_or(0);
    let floor = highest.saturating_add(1).min(max.max(1));
    if s.generation < floor {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!(
                "summary generation {} is below {floor} (1 + the highest generation it replaces, capped at {max})",
                s.generation
            ),
        );
    }
    let Some(info) = &s.summary else {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            "the summary span records no summary info".into(),
        );
        return;
    };
    let mut covers: FastSet<SpanId> = fasthash::set(info.covers.len());
    covers.extend(info.covers.iter().copied());
    let mut evicted_ids: FastSet<SpanId> = fasthash::set(evicted.len());
    evicted_ids.extend(evicted.iter().map(|e| e.id));
    if covers != evicted_ids || covers.len() != info.covers.len() {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!(
                "summary covers {} spans, the plan evicts {}",
                info.covers.len(),
                evicted.len()
            ),
        );
    }
    // Claimed anchors appear in the order they were written: search each
    // from where the previous one ended, and the whole text only when that
    // fails.
    let mut from = 0;
    let mut claimed_missing: Vec<String> = Vec::new();
    for a in &info.anchors {
        if let Some(at) = s.text[from..].find(a.as_str()) {
            from += at + a.len();
        } else if !s.text.contains(a.as_str()) {
            claimed_missing.push(a.clone());
        }
    }
    if !claimed_missing.is_empty() {
        v.push_terms(
            ViolationKind::AnchorMissing,
            id,
            format!(
                "summary claims {} anchors it does not contain",
                claimed_missing.len()
            ),
            claimed_missing,
        );
    }
    if plan.anchors_carried as usize != info.anchors.len() {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!(
                "plan says {} anchors carried, the summary records {}",
                plan.anchors_carried,
                info.anchors.len()
            ),
        );
    }
    let earlier: u64 = evicted
        .iter()
        .filter_map(|e| e.summary.as_ref())
        .map(|i| u64::from(i.anchors_dropped))
        .sum();
    let owed = earlier + u64::from(plan.anchors_dropped);
    if u64::from(info.anchors_dropped) < owed {
        v.push(
            ViolationKind::PlanInconsistent,
            id,
            format!(
                "summary records {} anchors dropped, at least {owed} were (this compaction and before)",
                info.anchors_dropped
            ),
        );
    }
}

/// The anchors the evicted spans oblige the summary to carry: every
/// anchor of an original span's text, and every anchor an evicted summary
/// recorded (or, if it recorded none, the anchors of its text).
fn owed_anchors(evicted: &[&Span]) -> Vec<String> {
    let mut seen: FastSet<String> = fasthash::set(evicted.len() * 2);
    let mut out = Vec::new();
    for s in evicted {
        let anchors = match &s.summary {
            Some(info) => info.anchors.clone(),
            None => extract_anchors(&s.text),
        };
        for a in anchors {
            if !a.is_empty() && !seen.contains(&a) {
                seen.insert(a.clone());
                out.push(a);
            }
        }
    }
    out
}

fn check_anchors(v: &mut Report, plan: &Plan, evicted: &[&Span]) {
    if evicted.is_empty() {
        return;
    }
    let owed = owed_anchors(evicted);
    let text = plan.summary.as_ref().map_or("", |s| s.text.as_str());
    // Claimed anchors were checked against the text already.
    let claimed: FastSet<&str> = plan
        .summary
        .as_ref()
        .and_then(|s| s.summary.as_ref())
        .map(|i| {
            let mut set = fasthash::set(i.anchors.len());
            set.extend(i.anchors.iter().map(String::as_str));
            set
        })
        .unwrap_or_default();
    let unclaimed: Vec<&String> = owed
        .iter()
        .filter(|a| !claimed.contains(a.as_str()))
        .collect();
    // As many as the plan says it dropped may be missing: only more than
    // that needs a search of the text.
    if unclaimed.len() as u64 <= u64::from(plan.anchors_dropped) {
        return;
    }
    let missing: Vec<String> = unclaimed
        .into_iter()
        .filter(|a| !text.contains(a.as_str()))
        .cloned()
        .collect();
    if missing.len() as u64 > u64::from(plan.anchors_dropped) {
        v.push_terms(
            ViolationKind::AnchorMissing,
            plan.summary.as_ref().map(|s| s.id),
            format!(
                "{} anchors of the evicted spans are missing from the summary, the plan accounts for {}",
                missing.len(),
                plan.anchors_dropped
            ),
            missing,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{CompressedForm, Eviction, EvictionReason};
    use crate::planner::{PlanInput, apply, plan};
    use crate::predicate::compress;
    use crate::span::Role;
    use crate::tokens::ByteLength;

    fn span(id: u64, role: Role, text: &str) -> Span {
        crate::testing::admitted(id, id, role, text)
    }

    struct Case {
        config: SessionConfig,
        pre: Vec<Span>,
        plan: Plan,
        incoming: u64,
    }

    fn case() -> Case {
        let mut pre = vec![span(
            1,
            Role::User,
            "Please never write to the `prod` namespace; stage only.",
        )];
        for id in 2..=12 {
            pre.push(span(
                id,
                Role::Tool,
                &format!(
                    "step {id}: edited src/mod_{id}.rs and ran the tests; all passed in 30s. {}",
                    "z".repeat(100)
                ),
            ));
        }
        let config = SessionConfig::with_window(2_000);
        let incoming = 300;
        let input = PlanInput {
            config: &config,
            live: &pre,
            incoming_tokens: incoming,
            query: "next step",
            turn: 13,
            next_span_id: 13,
            now_ms: 0,
            target_tokens: None,
        };
        let plan = plan(&input, &ByteLength);
        Case {
            config,
            pre,
            plan,
            incoming,
        }
    }

    fn kinds(verdict: &Verdict) -> Vec<ViolationKind> {
        verdict.violations.iter().map(|v| v.kind).collect()
    }

    fn run(c: &Case, plan: &Plan, post: &[Span]) -> Verdict {
        verify(&c.pre, plan, post, c.incoming, &c.config, &ByteLength)
    }

    #[test]
    fn a_planned_compaction_passes() {
        let c = case();
        assert!(!c.plan.evicted.is_empty());
        let post = apply(&c.pre, &c.plan);
        let verdict = run(&c, &c.plan, &post);
        assert!(verdict.passed(), "{verdict:?}");
    }

    #[test]
    fn an_evicted_constraint_is_pinned_missing() {
        let c = case();
        let mut p = c.plan.clone();
        p.evicted.insert(
            0,
            Eviction {
                span_id: 1,
                relevance: 0.0,
                reason: EvictionReason::Budget,
                tokens: c.pre[0].tokens,
            },
        );
        let post = apply(&c.pre, &p);
        let verdict = run(&c, &p, &post);
        assert!(
            kinds(&verdict).contains(&ViolationKind::PinnedMissing),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_constraint_missing_from_post_is_pinned_missing() {
        let c = case();
        let mut post = apply(&c.pre, &c.plan);
        post.retain(|s| s.id != 1);
        let verdict = run(&c, &c.plan, &post);
        let k = kinds(&verdict);
        assert!(k.contains(&ViolationKind::PinnedMissing), "{verdict:?}");
        assert!(k.contains(&ViolationKind::PlanInconsistent), "{verdict:?}");
    }

    #[test]
    fn compressed_forms_must_satisfy_the_predicate() {
        // Constraints are compressed only once no narrative is left: a
        // session of the constraint alone.
        let mut c = case();
        c.pre.truncate(1);
        c.incoming = 0;
        c.plan = plan(
            &PlanInput {
                config: &c.config,
                live: &c.pre,
                incoming_tokens: 0,
                query: "next step",
                turn: 13,
                next_span_id: 13,
                now_ms: 0,
                target_tokens: None,
            },
            &ByteLength,
        );
        assert!(c.plan.evicted.is_empty());
        let good = compress(
            &c.pre[0].text,
            c.pre[0].predicate.as_ref().unwrap(),
            &ByteLength,
        )
        .unwrap();
        let mut p = c.plan.clone();
        p.compressed.push(CompressedForm {
            span_id: 1,
            tokens: ByteLength.count(&good),
            text: good,
        });
        p.tokens_after -= u64::from(c.pre[0].tokens - p.compressed[0].tokens);
        let post = apply(&c.pre, &p);
        assert!(run(&c, &p, &post).passed(), "{:?}", run(&c, &p, &post));

        let mut bad = p.clone();
        bad.compressed[0].text = "Please write to the `prod` namespace; stage only.".into();
        bad.compressed[0].tokens = ByteLength.count(&bad.compressed[0].text);
        let post = apply(&c.pre, &bad);
        let verdict = run(&c, &bad, &post);
        let v = verdict
            .violations
            .iter()
            .find(|v| v.kind == ViolationKind::PredicateUnsatisfied)
            .expect("predicate violation");
        assert_eq!(v.span_id, Some(1));
        assert_eq!(v.missing_terms, ["modality:prohibition"]);
    }

    #[test]
    fn an_inflated_summary_is_caught_by_recounting() {
        let c = case();
        let mut p = c.plan.clone();
        let s = p.summary.as_mut().unwrap();
        s.text.push_str(&" padding".repeat(400));
        let post = apply(&c.pre, &p);
        let k = kinds(&run(&c, &p, &post));
        assert!(k.contains(&ViolationKind::OverBudget), "{k:?}");
        assert!(k.contains(&ViolationKind::PlanInconsistent), "{k:?}");
    }

    #[test]
    fn generation_and_anchor_violations() {
        let c = case();
        let mut p = c.plan.clone();
        let s = p.summary.as_mut().unwrap();
        s.generation = c.config.max_summary_generations + 1;
        let anchor = s.summary.as_ref().unwrap().anchors[0].clone();
        s.text = s.text.replace(&anchor, "");
        s.tokens = ByteLength.count(&s.text);
        p.tokens_after = apply(&c.pre, &p).iter().map(|s| u64::from(s.tokens)).sum();
        let post = apply(&c.pre, &p);
        let verdict = run(&c, &p, &post);
        let k = kinds(&verdict);
        assert!(k.contains(&ViolationKind::GenerationExceeded), "{k:?}");
        assert!(k.contains(&ViolationKind::AnchorMissing), "{k:?}");
        let missing = verdict
            .violations
            .iter()
            .filter(|v| v.kind == ViolationKind::AnchorMissing)
            .flat_map(|v| v.missing_terms.iter())
            .collect::<Vec<_>>();
        assert!(missing.contains(&&anchor), "{missing:?}");
    }

    #[test]
    fn duplicates_and_unknown_ids_are_inconsistent() {
        let c = case();
        let mut p = c.plan.clone();
        let first = p.evicted[0].clone();
        p.evicted.push(first);
        let post = apply(&c.pre, &p);
        assert!(kinds(&run(&c, &p, &post)).contains(&ViolationKind::PlanInconsistent));

        let mut p = c.plan.clone();
        p.evicted.push(Eviction {
            span_id: 999,
            relevance: 0.0,
            reason: EvictionReason::Budget,
            tokens: 1,
        });
        let post = apply(&c.pre, &p);
        assert!(kinds(&run(&c, &p, &post)).contains(&ViolationKind::PlanInconsistent));

        let mut post = apply(&c.pre, &c.plan);
        let dup = post[1].clone();
        post.insert(1, dup);
        assert!(kinds(&run(&c, &c.plan, &post)).contains(&ViolationKind::PlanInconsistent));
    }

    #[test]
    fn every_violation_is_reported() {
        let c = case();
        let mut p = c.plan.clone();
        p.evicted.insert(
            0,
            Eviction {
                span_id: 1,
                relevance: 0.0,
                reason: EvictionReason::Budget,
                tokens: c.pre[0].tokens,
            },
        );
        let s = p.summary.as_mut().unwrap();
        s.generation = 99;
        s.text.push_str(&"x".repeat(5_000));
        let post = apply(&c.pre, &p);
        let k = kinds(&run(&c, &p, &post));
        for want in [
            ViolationKind::PinnedMissing,
            ViolationKind::GenerationExceeded,
            ViolationKind::OverBudget,
            ViolationKind::PlanInconsistent,
        ] {
            assert!(k.contains(&want), "{want:?} in {k:?}");
        }
    }

    #[test]
    fn a_plan_for_another_turn_is_rejected() {
        let c = case();
        let post = apply(&c.pre, &c.plan);
        let verdict = verify(
            &c.pre,
            &c.plan,
            &post,
            c.incoming + 1,
            &c.config,
            &ByteLength,
        );
        assert!(kinds(&verdict).contains(&ViolationKind::PlanInconsistent));
    }

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
            let index = PreIndex::new(&pre);
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
