//! The summary a plan writes: recounted, in the place and generation the
//! evicted spans give it, covering exactly them, and carrying their
//! anchors or accounting for the ones it drops.

use super::Report;
use super::index::PreIndex;
use crate::config::SessionConfig;
use crate::fasthash::{self, FastSet};
use crate::plan::{Plan, ViolationKind};
use crate::span::{Span, SpanClass, SpanId};
use crate::tokens::TokenCounter;

/// The summary, recounted and checked, and the anchors the evicted spans
/// owe it (`owed`: every anchor of an original span's text, and every
/// anchor an evicted summary recorded, each once). Returns the summary's
/// recounted tokens.
pub(super) fn check_summary_and_anchors(
    v: &mut Report,
    plan: &Plan,
    pre_index: &PreIndex,
    evicted: &[&Span],
    owed: Vec<String>,
    config: &SessionConfig,
    counter: &dyn TokenCounter,
) -> Option<u32> {
    let summary_tokens = plan.summary.as_ref().map(|s| {
        let tokens = counter.count(&s.text);
        check_summary(v, s, tokens, pre_index, evicted, plan, config);
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
    check_anchors(v, plan, evicted, owed);
    summary_tokens
}

/// The summary span itself: its tokens, id, class, place and generation,
/// what it covers, and the anchors it claims to carry and to have dropped.
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

/// The anchors the evicted spans owe: carried by the summary, or as many
/// missing as the plan accounts for as dropped.
fn check_anchors(v: &mut Report, plan: &Plan, evicted: &[&Span], owed: Vec<String>) {
    if evicted.is_empty() {
        return;
    }
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
