//! The checks, run against the restarted daemon once the load has
//! stopped, one file each, named after what it proves. Every failure is
//! collected under its check's name; none stops the others. Check
//! numbers are those of `docs/reliability.md`.

mod acknowledged_spans_are_searchable;
mod acknowledged_spans_survive;
mod evicted_spans_are_archived;
mod marker_log_is_contiguous;
mod nothing_unadmitted_is_stored;
mod replies_match_the_log;
mod sessions_are_not_half_compacted;
mod unpins_are_logged_once;
mod watchers_received_the_log;

use std::collections::{BTreeMap, HashMap};

use ctxbroker_proto::v1 as pb;

use super::harness::{CHECK_TIMEOUT, Client, CrashRun, SpanReader, settled};

/// Every check, in the order they run: the marker log's first, since the
/// others read which marker evicted each span from it.
pub(crate) const CHECKS: [&str; 9] = [
    marker_log_is_contiguous::CHECK,
    watchers_received_the_log::CHECK,
    replies_match_the_log::CHECK,
    sessions_are_not_half_compacted::CHECK,
    nothing_unadmitted_is_stored::CHECK,
    unpins_are_logged_once::CHECK,
    acknowledged_spans_survive::CHECK,
    acknowledged_spans_are_searchable::CHECK,
    evicted_spans_are_archived::CHECK,
];

/// The state the checks share: the log as it stands, and the reads so far.
pub(crate) struct Checker {
    /// The whole marker log.
    pub(crate) markers: Vec<pb::CompactionMarker>,
    /// Which committed marker evicted each (session, span).
    pub(crate) evicted_by: HashMap<(String, u64), u64>,
    pub(crate) spans: SpanReader,
    pub(crate) client: Client,
    /// Each failure, prefixed with its check's name.
    pub(crate) violations: Vec<String>,
    /// Failures found by each check, listed or not.
    pub(crate) failed: BTreeMap<&'static str, usize>,
    /// Failures not listed because the daemon had stopped answering.
    pub(crate) suppressed: usize,
    /// Spans of turns that got no answer and landed all the same.
    pub(crate) landed: usize,
}

impl Checker {
    /// A failure of `check` found by reading the daemon: once it has
    /// stopped answering, only the first is listed.
    pub(crate) fn fail(&mut self, check: &'static str, what: String) {
        *self.failed.entry(check).or_default() += 1;
        let what = format!("{check}: {what}");
        if self.spans.gone.is_none() {
            self.violations.push(what);
        } else if self.suppressed == 0 {
            self.violations.push(what);
            self.suppressed = 1;
        } else {
            self.suppressed += 1;
        }
    }

    /// Failures of `check` found in the records alone: all listed.
    pub(crate) fn record(&mut self, check: &'static str, failures: Vec<String>) {
        *self.failed.entry(check).or_default() += failures.len();
        self.violations
            .extend(failures.into_iter().map(|what| format!("{check}: {what}")));
    }

    pub(crate) fn logged(&self, seq: u64) -> Option<&pb::CompactionMarker> {
        let at = usize::try_from(seq.checked_sub(1)?).ok()?;
        self.markers.get(at).filter(|m| m.seq == seq)
    }

    /// Whether the log holds the UNPIN marker of an unpin with `reason`.
    pub(crate) fn unpinned(&self, id: &str, reason: &str) -> bool {
        self.markers.iter().any(|m| {
            m.session_id == id
                && m.trigger() == pb::CompactionTrigger::Unpin
                && m.detail.contains(reason)
        })
    }
}

/// Reads the log and the contexts once they are stable, and runs every
/// check over them and the run's records, within [`CHECK_TIMEOUT`].
pub(crate) async fn run_all(run: &mut CrashRun) -> Checker {
    let mut client = run.daemon.client().await;
    let spans = SpanReader::new(run.daemon.client().await);
    let checks = async {
        let (markers, contexts) = settled(&mut client, &run.ids).await;
        let mut check = Checker {
            markers,
            evicted_by: HashMap::new(),
            spans,
            client,
            violations: Vec::new(),
            failed: CHECKS.iter().map(|&c| (c, 0)).collect(),
            suppressed: 0,
            landed: 0,
        };
        check.marker_log_is_contiguous();
        for watched in &run.watchers {
            check.watchers_received_the_log(&watched.name, &watched.filter, &watched.log);
        }
        for (id, ctx) in run.ids.iter().zip(&contexts) {
            let log = &run.logs[id];
            check.replies_match_the_log(id, log);
            check
                .sessions_are_not_half_compacted(id, ctx, run.budgets[id])
                .await;
            check.nothing_unadmitted_is_stored(id, ctx, log).await;
            check.unpins_are_logged_once(id, log);
            check.acknowledged_spans_survive(id, ctx, log).await;
            check.acknowledged_spans_are_searchable(id, log).await;
        }
        check.evicted_spans_are_archived().await;
        check
    };
    let check = tokio::time::timeout(CHECK_TIMEOUT, checks).await;
    let exited = run.daemon.exited();
    let Ok(mut check) = check else {
        panic!("the checks did not finish within {CHECK_TIMEOUT:?}; the daemon's exit: {exited:?}");
    };
    if let Some(gone) = &check.spans.gone {
        let note = format!(
            "{gone} during the checks (exit status {exited:?}); {} failures after it not listed",
            check.suppressed.saturating_sub(1)
        );
        check.violations.insert(0, note);
    } else if let Some(status) = exited {
        check.fail(
            "the daemon serves the checks",
            format!("the last daemon exited on its own during the checks: {status}"),
        );
    }
    check
}
