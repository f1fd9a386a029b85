//! Checks 1 and 2: every acknowledged span is live, or archived by the
//! committed marker that lists it; every acknowledged constraint not
//! acknowledged-unpinned is live and a constraint, verbatim or compressed
//! from what was admitted.

use std::collections::BTreeMap;

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::ledger::{AckedSpan, Expect, SessionLog};

pub(crate) const CHECK: &str = "acknowledged_spans_survive";

impl Checker {
    pub(crate) async fn acknowledged_spans_survive(
        &mut self,
        id: &str,
        ctx: &pb::GetContextResponse,
        log: &SessionLog,
    ) {
        let live: BTreeMap<u64, &pb::Span> = ctx.spans.iter().map(|s| (s.span_id, s)).collect();
        for (span_id, acked) in &log.spans {
            let expect = acked.expect(|reason| self.unpinned(id, reason));
            let fetched = match self.spans.get(id, *span_id).await {
                Ok(fetched) => fetched,
                Err(e) => {
                    self.fail(
                        CHECK,
                        format!("{id}: acknowledged span {span_id} lost: {e}"),
                    );
                    continue;
                }
            };
            match live.get(span_id) {
                Some(s) => self.live_span(id, s, &fetched, acked, expect),
                None => self.archived_span(id, &fetched, acked, expect),
            }
        }
    }

    fn live_span(
        &mut self,
        id: &str,
        s: &pb::Span,
        fetched: &pb::Span,
        acked: &AckedSpan,
        expect: Expect,
    ) {
        let span_id = s.span_id;
        if fetched.state() != pb::SpanState::Live {
            self.fail(
                CHECK,
                format!(
                    "{id}: span {span_id} is live but GetSpan says {:?}",
                    fetched.state()
                ),
            );
        }
        let class = s.span_class();
        let verbatim = s.text == acked.text;
        let compressed = class == pb::SpanClass::Constraint
            && s.original_text == acked.text
            && s.text != acked.text;
        if !verbatim && !compressed {
            self.fail(
                CHECK,
                format!(
                    "{id}: live span {span_id} reads {:?} (original {:?}), admitted {:?}",
                    s.text, s.original_text, acked.text
                ),
            );
        }
        if compressed {
            let lower = s.text.to_lowercase();
            for term in &acked.terms {
                if !lower.contains(&term.to_lowercase()) {
                    self.fail(
                        CHECK,
                        format!(
                            "{id}: compressed constraint {span_id} {:?} lost {term:?}",
                            s.text
                        ),
                    );
                }
            }
        }
        let fits = match expect {
            Expect::Constraint => class == pb::SpanClass::Constraint,
            Expect::Narrative => class == pb::SpanClass::Narrative,
            Expect::EitherClass => class != pb::SpanClass::Summary,
        };
        if !fits {
            self.fail(
                CHECK,
                format!(
                    "{id}: live span {span_id} is {class:?}, want {expect:?} (pins {:?})",
                    acked.history
                ),
            );
        }
    }

    fn archived_span(&mut self, id: &str, fetched: &pb::Span, acked: &AckedSpan, expect: Expect) {
        let span_id = fetched.span_id;
        // Check 2: a constraint never leaves the context.
        if expect == Expect::Constraint {
            self.fail(
                CHECK,
                format!(
                    "{id}: constraint {span_id} {:?} is not live: {:?} by {} (pins {:?})",
                    acked.text,
                    fetched.state(),
                    fetched.archived_by_seq,
                    acked.history
                ),
            );
        }
        // Check 1: archived by the committed marker that lists it.
        let by = self.evicted_by.get(&(id.to_owned(), span_id)).copied();
        if fetched.state() != pb::SpanState::Archived || by != Some(fetched.archived_by_seq) {
            self.fail(CHECK, format!(
                "{id}: acknowledged span {span_id} is not live; GetSpan says {:?} by {}, the log {by:?}",
                fetched.state(),
                fetched.archived_by_seq
            ));
        }
        if fetched.text != acked.text && fetched.original_text != acked.text {
            self.fail(
                CHECK,
                format!(
                    "{id}: archived span {span_id} reads {:?}, admitted {:?}",
                    fetched.text, acked.text
                ),
            );
        }
    }
}
