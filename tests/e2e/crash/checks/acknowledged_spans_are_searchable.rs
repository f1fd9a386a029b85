//! Check 5, the search index: acknowledged spans, live or archived, are
//! found by the reference their text carries.

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::harness::RPC_TIMEOUT;
use crate::crash::ledger::SessionLog;

pub(crate) const CHECK: &str = "acknowledged_spans_are_searchable";

impl Checker {
    /// Check 5, the search index: acknowledged spans, live or archived,
    /// are found by the reference their text carries (`ref <id>-t3p0` in
    /// turns, `` `<id>-c3` `` in constraints), which no other span of the
    /// session holds (summaries aside, which carry references as
    /// anchors). The index is written in the transaction that stores
    /// the span, so no kill can leave one without the other. At most the
    /// last 40 of a session are searched, to bound the check's time.
    pub(crate) async fn acknowledged_spans_are_searchable(&mut self, id: &str, log: &SessionLog) {
        let reference = |text: &str| -> Option<String> {
            let from_ref = text
                .split(' ')
                .find(|w| w.starts_with(&format!("{id}-t")))
                .map(|w| w.trim_end_matches(':').to_owned());
            from_ref.or_else(|| {
                let start = text.find(&format!("`{id}-c"))? + 1;
                let len = text[start..].find('`')?;
                Some(text[start..start + len].to_owned())
            })
        };
        let wanted: Vec<(u64, String)> = log
            .spans
            .iter()
            .rev()
            .filter_map(|(span_id, acked)| reference(&acked.text).map(|r| (*span_id, r)))
            .take(40)
            .collect();
        // Every admitted text carries a reference: finding none means the
        // check would pass without searching.
        if wanted.is_empty() && !log.spans.is_empty() {
            self.fail(
                CHECK,
                format!(
                    "{id}: none of {} acknowledged spans carries a reference",
                    log.spans.len()
                ),
            );
        }
        for (span_id, reference) in wanted {
            // Summaries carry references as anchors, and may rank above
            // the span itself: leave them out.
            let request = pb::SearchSpansRequest {
                session_id: id.into(),
                query: reference.clone(),
                filter: Some(pb::SpanFilter {
                    span_classes: vec![
                        pb::SpanClass::Narrative as i32,
                        pb::SpanClass::Constraint as i32,
                        pb::SpanClass::Protected as i32,
                    ],
                    ..Default::default()
                }),
                page_size: 5,
                ..Default::default()
            };
            let reply = tokio::time::timeout(RPC_TIMEOUT, self.client.search_spans(request)).await;
            match reply {
                Ok(Ok(reply)) => {
                    let hits = reply.into_inner().hits;
                    if hits.first().map(|h| h.span_id) != Some(span_id) {
                        self.fail(CHECK, format!(
                            "{id}: searching {reference:?} finds {:?}, not span {span_id} first",
                            hits.iter().map(|h| h.span_id).collect::<Vec<_>>()
                        ));
                    }
                }
                Ok(Err(status)) => {
                    self.fail(
                        CHECK,
                        format!("{id}: SearchSpans {reference:?} refused: {status:?}"),
                    );
                }
                Err(_) => self.fail(CHECK, format!("{id}: SearchSpans {reference:?} timed out")),
            }
        }
    }
}
