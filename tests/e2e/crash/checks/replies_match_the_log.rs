//! Check 3, the replies: markers carried in acknowledged replies, and the
//! ABORTED markers that refusals named, are in the log as acknowledged.

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::ledger::SessionLog;

pub(crate) const CHECK: &str = "replies_match_the_log";

impl Checker {
    pub(crate) fn replies_match_the_log(&mut self, id: &str, log: &SessionLog) {
        let mut failures = Vec::new();
        for m in &log.markers {
            match self.logged(m.seq) {
                Some(logged) if logged == m => {}
                Some(logged) => failures.push(format!(
                    "{id}: acknowledged marker {} differs from the log's: {m:?} vs {logged:?}",
                    m.seq
                )),
                None => failures.push(format!(
                    "{id}: acknowledged marker {} is not in the log",
                    m.seq
                )),
            }
        }
        for &seq in &log.aborted {
            match self.logged(seq) {
                Some(m) if m.session_id == id && m.outcome() == pb::CompactionOutcome::Aborted => {}
                other => failures.push(format!(
                    "{id}: a refusal named ABORTED marker {seq}; the log has {other:?}"
                )),
            }
        }
        self.record(CHECK, failures);
    }
}
