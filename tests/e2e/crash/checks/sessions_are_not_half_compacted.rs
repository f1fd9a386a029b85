//! Check 4, not half-compacted: the spans add up to the totals, under
//! the budget; nothing a committed marker evicted is live; every summary a
//! committed marker wrote is live or archived by a marker.

use std::collections::BTreeSet;

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::harness::RPC_TIMEOUT;
use crate::support::session;

pub(crate) const CHECK: &str = "sessions_are_not_half_compacted";

impl Checker {
    pub(crate) async fn sessions_are_not_half_compacted(
        &mut self,
        id: &str,
        ctx: &pb::GetContextResponse,
        budget: u32,
    ) {
        let totals = ctx.totals.unwrap_or_default();
        let live: BTreeSet<u64> = ctx.spans.iter().map(|s| s.span_id).collect();
        if live.len() != ctx.spans.len() {
            self.fail(
                CHECK,
                format!("{id}: a span id appears twice in the context"),
            );
        }
        let sum: u32 = ctx.spans.iter().map(|s| s.tokens).sum();
        let pinned: u32 = ctx
            .spans
            .iter()
            .filter(|s| s.span_class() == pb::SpanClass::Constraint)
            .map(|s| s.tokens)
            .sum();
        if (sum, pinned, ctx.spans.len())
            != (
                totals.live_tokens,
                totals.pinned_tokens,
                totals.live_spans as usize,
            )
        {
            self.fail(CHECK, format!(
                "{id}: spans sum to {sum} tokens ({pinned} pinned) in {} spans; totals {totals:?}",
                ctx.spans.len()
            ));
        }
        if sum > totals.budget_tokens || totals.budget_tokens != budget {
            self.fail(
                CHECK,
                format!(
                    "{id}: live {sum}, budget {} (created with {budget})",
                    totals.budget_tokens
                ),
            );
        }
        if self.spans.gone.is_none() {
            match tokio::time::timeout(RPC_TIMEOUT, session(&mut self.client, id)).await {
                Ok(record) if record.totals == ctx.totals && record.revision == ctx.revision => {}
                Ok(record) => self.fail(
                    CHECK,
                    format!(
                        "{id}: GetSession {:?} at revision {} vs GetContext {:?} at {}",
                        record.totals, record.revision, ctx.totals, ctx.revision
                    ),
                ),
                Err(_) => {
                    self.spans.gone = Some("the daemon stopped answering (GetSession)".into());
                    self.fail(CHECK, format!("{id}: GetSession timed out"));
                }
            }
        }
        let committed: Vec<(u64, Vec<u64>, Option<u64>)> = self
            .markers
            .iter()
            .filter(|m| m.session_id == id && m.outcome() == pb::CompactionOutcome::Committed)
            .map(|m| (m.seq, m.evicted_span_ids.clone(), m.summary_span_id))
            .collect();
        for (seq, evicted, summary) in committed {
            for span_id in evicted.iter().filter(|s| live.contains(s)) {
                self.fail(
                    CHECK,
                    format!("{id}: span {span_id} evicted by marker {seq} is live"),
                );
            }
            let Some(summary) = summary.filter(|s| !live.contains(s)) else {
                continue;
            };
            let by = self.evicted_by.get(&(id.to_owned(), summary)).copied();
            match self.spans.get(id, summary).await {
                Ok(s) if s.state() == pb::SpanState::Archived && by == Some(s.archived_by_seq) => {}
                other => self.fail(CHECK, format!(
                    "{id}: summary {summary} of marker {seq} is not live, evicted by {by:?}, reads {other:?}"
                )),
            }
        }
    }
}
