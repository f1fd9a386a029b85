//! Check 4, the archive: every span the log's markers evicted reads back
//! as archived by its marker.

use ctxbroker_proto::v1 as pb;

use super::Checker;

pub(crate) const CHECK: &str = "evicted_spans_are_archived";

impl Checker {
    pub(crate) async fn evicted_spans_are_archived(&mut self) {
        let evicted: Vec<((String, u64), u64)> = self
            .evicted_by
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for ((id, span_id), seq) in evicted {
            match self.spans.get(&id, span_id).await {
                Ok(s) if s.state() == pb::SpanState::Archived && s.archived_by_seq == seq => {}
                other => self.fail(
                    CHECK,
                    format!("{id}: span {span_id} evicted by marker {seq} reads back {other:?}"),
                ),
            }
        }
    }
}
