//! Sizes: the post-state and the incoming turn within the budget, and the
//! plan's own token account matching what was counted.

use super::Report;
use crate::config::SessionConfig;
use crate::plan::{Plan, ViolationKind};

/// Post + incoming within the budget.
pub(super) fn check_budget(
    v: &mut Report,
    post_tokens: u64,
    incoming_tokens: u64,
    config: &SessionConfig,
) {
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
}

/// The plan's own account must match: tokens before and after, and the
/// turn it was made for.
pub(super) fn check_account(
    v: &mut Report,
    plan: &Plan,
    pre_tokens: u64,
    post_tokens: u64,
    incoming_tokens: u64,
) {
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
}
