//! Check 4, unanswered turns: nothing that nobody admitted is stored,
//! live or archived, and a turn that got no answer landed whole or not at
//! all.

use std::collections::{BTreeMap, BTreeSet};

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::ledger::SessionLog;

pub(crate) const CHECK: &str = "nothing_unadmitted_is_stored";

impl Checker {
    /// Nothing that nobody admitted, live or archived. Span ids are given
    /// in order; each one not acknowledged is a summary written by
    /// compaction or a span of a turn that got no answer (in flight at a
    /// kill) and landed — and such a turn landed whole or not at all.
    pub(crate) async fn nothing_unadmitted_is_stored(
        &mut self,
        id: &str,
        ctx: &pb::GetContextResponse,
        log: &SessionLog,
    ) {
        let live: BTreeMap<u64, &pb::Span> = ctx.spans.iter().map(|s| (s.span_id, s)).collect();
        let unanswered: BTreeSet<&String> = log.unacked_turns.iter().flatten().collect();
        let mut landed = BTreeSet::new();
        let newest = log
            .spans
            .keys()
            .chain(live.keys())
            .copied()
            .max()
            .unwrap_or(0);
        for span_id in (1..=newest).filter(|s| !log.spans.contains_key(s)) {
            let found = match live.get(&span_id) {
                Some(s) => Ok((*s).clone()),
                None => self.spans.get(id, span_id).await,
            };
            match found {
                Ok(s) if s.span_class() == pb::SpanClass::Summary => {}
                Ok(s) if unanswered.contains(&s.text) || unanswered.contains(&s.original_text) => {
                    self.landed += 1;
                    landed.insert(s.text);
                    landed.insert(s.original_text);
                }
                Ok(s) => self.fail(
                    CHECK,
                    format!(
                        "{id}: span {span_id} ({:?}, {:?}) {:?} was never admitted",
                        s.span_class(),
                        s.state(),
                        s.text
                    ),
                ),
                Err(e) => self.fail(
                    CHECK,
                    format!("{id}: span id {span_id}, below the newest {newest}, reads back {e}"),
                ),
            }
        }
        for turn in &log.unacked_turns {
            let n = turn.iter().filter(|t| landed.contains(*t)).count();
            if n != 0 && n != turn.len() {
                self.fail(
                    CHECK,
                    format!(
                        "{id}: an unanswered turn landed in part ({n} of {}): {turn:?}",
                        turn.len()
                    ),
                );
            }
        }
    }
}
