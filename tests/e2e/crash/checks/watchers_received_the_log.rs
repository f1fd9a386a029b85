//! Check 3, the watchers: every marker a watcher received equals the
//! log's, and every connection received exactly the log's markers
//! (matching its filter) from its resume point on, in order, once.

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::ledger::WatchLog;

pub(crate) const CHECK: &str = "watchers_received_the_log";

impl Checker {
    pub(crate) fn watchers_received_the_log(
        &mut self,
        name: &str,
        filter: &[String],
        log: &WatchLog,
    ) {
        let matching: Vec<&pb::CompactionMarker> = self
            .markers
            .iter()
            .filter(|m| filter.is_empty() || filter.contains(&m.session_id))
            .collect();
        let mut failures = Vec::new();
        let mut resume_at = 1;
        let mut received = Vec::new();
        for (k, segment) in log.segments.iter().enumerate() {
            if segment.from != resume_at {
                failures.push(format!(
                    "{name}: connection {k} resumed from {}, want {resume_at}",
                    segment.from
                ));
            }
            let from_log = matching.iter().filter(|m| m.seq >= segment.from);
            for (j, (got, want)) in segment.markers.iter().zip(from_log).enumerate() {
                if got != *want {
                    let what = if got.seq == want.seq {
                        format!("differs: got {got:?}, logged {want:?}")
                    } else {
                        format!("the log has seq {} next", want.seq)
                    };
                    failures.push(format!(
                        "{name}: connection {k} item {j} is seq {}: {what}",
                        got.seq
                    ));
                    break;
                }
            }
            if let Some(last) = segment.markers.last() {
                resume_at = last.seq + 1;
            }
            received.extend(segment.markers.iter().map(|m| m.seq));
        }
        let want: Vec<u64> = matching
            .iter()
            .map(|m| m.seq)
            .take_while(|&s| s < resume_at)
            .collect();
        if received != want {
            failures.push(format!(
                "{name}: received {} markers in all, want the log's {} below {resume_at}",
                received.len(),
                want.len()
            ));
        }
        self.record(CHECK, failures);
    }
}
