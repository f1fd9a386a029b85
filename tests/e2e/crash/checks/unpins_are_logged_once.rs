//! Check 3, unpins: every UNPIN marker is an unpin the admitter sent;
//! each acknowledged one is in the log once, each unanswered one at most
//! once.

use ctxbroker_proto::v1 as pb;

use super::Checker;
use crate::crash::ledger::{PinEvent, SessionLog};

pub(crate) const CHECK: &str = "unpins_are_logged_once";

impl Checker {
    pub(crate) fn unpins_are_logged_once(&mut self, id: &str, log: &SessionLog) {
        let mut sent: Vec<(&str, bool)> = Vec::new();
        for event in log.spans.values().flat_map(|s| &s.history) {
            match event {
                PinEvent::Unpinned(reason) => sent.push((reason, true)),
                PinEvent::UnpinUnknown(reason) => sent.push((reason, false)),
                PinEvent::Pinned | PinEvent::PinUnknown => {}
            }
        }
        let unpin_markers: Vec<&pb::CompactionMarker> = self
            .markers
            .iter()
            .filter(|m| m.session_id == id && m.trigger() == pb::CompactionTrigger::Unpin)
            .collect();
        let mut failures = Vec::new();
        for m in &unpin_markers {
            let asked = sent.iter().filter(|(r, _)| m.detail.contains(r)).count();
            if asked != 1 {
                failures.push(format!(
                    "{id}: UNPIN marker {} matches {asked} unpins sent: {:?}",
                    m.seq, m.detail
                ));
            }
        }
        for (reason, acked) in &sent {
            let n = unpin_markers
                .iter()
                .filter(|m| m.detail.contains(reason))
                .count();
            if n > 1 || (*acked && n != 1) {
                let which = if *acked { "acknowledged" } else { "unanswered" };
                failures.push(format!(
                    "{id}: {which} unpin {reason:?} is in {n} UNPIN markers"
                ));
            }
        }
        self.record(CHECK, failures);
    }
}
