//! Check 3, the log: contiguous from 1, each sequence once, each
//! session's own count contiguous too; no span evicted twice. It also
//! records which marker evicted each span, for the checks after it.

use std::collections::HashMap;

use ctxbroker_proto::v1 as pb;

use super::Checker;

pub(crate) const CHECK: &str = "marker_log_is_contiguous";

impl Checker {
    pub(crate) fn marker_log_is_contiguous(&mut self) {
        let mut failures = Vec::new();
        if let Some((i, m)) = self
            .markers
            .iter()
            .enumerate()
            .find(|(i, m)| m.seq != *i as u64 + 1)
        {
            failures.push(format!("log: position {i} holds seq {}", m.seq));
        }
        let mut per_session: HashMap<&str, u64> = HashMap::new();
        for m in &self.markers {
            let n = per_session.entry(m.session_id.as_str()).or_default();
            *n += 1;
            if m.session_seq != *n {
                failures.push(format!(
                    "log: marker {} of {} has session_seq {}, want {n}",
                    m.seq, m.session_id, m.session_seq
                ));
            }
        }
        for m in &self.markers {
            if m.outcome() != pb::CompactionOutcome::Committed {
                continue;
            }
            for id in &m.evicted_span_ids {
                let key = (m.session_id.clone(), *id);
                if let Some(first) = self.evicted_by.insert(key, m.seq) {
                    failures.push(format!(
                        "log: {} span {id} evicted by both {first} and {}",
                        m.session_id, m.seq
                    ));
                }
            }
        }
        self.record(CHECK, failures);
    }
}
