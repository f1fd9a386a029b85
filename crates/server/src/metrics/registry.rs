//! The families fed as things happen: admissions, compaction markers,
//! store flushes, watcher fall-backs, and the build's identity. Each
//! labelled family is created with every label value it can take, and the
//! counters' handles are kept in arrays indexed by label, so counting is an
//! atomic add.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::AtomicU64;

use ctxbroker_core::Marker;
use ctxbroker_core::marker::Outcome;
use ctxbroker_proto::v1 as pb;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::BuildInfo;
use crate::broker::now_ms;
use crate::convert::{compaction_trigger_to_pb, outcome_to_pb, violation_kind_to_pb};
use crate::error::ApiError;

/// Flush latency buckets, in seconds: 100 µs to 2.5 s.
const FLUSH_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// How an admission ended, for `ctxbroker_admissions_total`: admitted,
/// replayed (an idempotent retry), escalated, refused.
const ADMISSIONS: [&str; 4] = ["admitted", "replayed", "escalated", "refused"];

const CLASSES: [&str; 2] = ["constraint", "narrative"];

/// Compaction triggers, outcomes and violation kinds: the wire enums'
/// values after UNSPECIFIED, each a label value.
const TRIGGERS: usize = 5;
const OUTCOMES: usize = 2;
const VIOLATIONS: usize = 9;

/// The label values of a wire enum with `N` values after UNSPECIFIED, in
/// number order from 1: their names (`name` of each number) without the
/// enum's `prefix` ("COMPACTION_TRIGGER_HARD_BUDGET" is "HARD_BUDGET").
fn wire_labels<const N: usize>(
    prefix: &str,
    name: impl Fn(i32) -> Option<&'static str>,
) -> [&'static str; N] {
    std::array::from_fn(|i| {
        let full = i32::try_from(i + 1).ok().and_then(&name).unwrap_or("");
        full.strip_prefix(prefix).unwrap_or(full)
    })
}

/// A wire enum value's place in its [`wire_labels`].
fn wire_index(value: impl Into<i32>) -> usize {
    usize::try_from(value.into()).map_or(0, |v| v.saturating_sub(1))
}

/// One label: name and value.
type Label = (&'static str, &'static str);

/// Registers a counter family (`name` without its `_total`, which the
/// encoder appends) with one series per label set, and returns their
/// counters in the same order.
fn counters<L, const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    label_sets: [L; N],
) -> [Counter; N]
where
    L: Clone + Hash + Eq + EncodeLabelSet + Debug + Send + Sync + 'static,
{
    let family = Family::<L, Counter>::default();
    let counters = label_sets.map(|labels| family.get_or_create_owned(&labels));
    registry.register(name, help, family);
    counters
}

/// Registers an unlabelled counter.
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let counter = Counter::default();
    registry.register(name, help, counter.clone());
    counter
}

/// The counters and histograms fed by the services and the store. Help
/// texts have no final period: the registry appends one.
#[derive(Debug)]
pub(super) struct Counters {
    admissions: [Counter; 4],
    admitted_tokens: Counter,
    admitted_spans: [Counter; 2],
    /// trigger × outcome.
    compactions: [Counter; TRIGGERS * OUTCOMES],
    evicted_spans: Counter,
    reclaimed_tokens: Counter,
    anchors_dropped: Counter,
    escalations: [Counter; TRIGGERS],
    verification_failures: [Counter; VIOLATIONS],
    pub(super) watcher_log_fallbacks: Counter,
    pub(super) flush: Histogram,
    pub(super) session_cache: crate::sessions::CacheProbe,
}

impl Counters {
    /// Registers the families in `registry`, all at zero.
    pub(super) fn register(registry: &mut Registry, build: BuildInfo) -> Counters {
        registry.register(
            "ctxbroker_build",
            "Always 1; the labels say what the daemon was built from",
            Info::new([("version", build.version), ("commit", build.git_commit)]),
        );
        let started: Gauge<f64, AtomicU64> = Gauge::default();
        started.set(now_ms() as f64 / 1000.0);
        registry.register(
            "ctxbroker_start_time_seconds",
            "When the daemon started, in seconds since the Unix epoch",
            started,
        );
        let r = registry;
        let triggers: [&str; TRIGGERS] = wire_labels("COMPACTION_TRIGGER_", |v| {
            pb::CompactionTrigger::try_from(v)
                .ok()
                .map(|t| t.as_str_name())
        });
        let outcomes: [&str; OUTCOMES] = wire_labels("COMPACTION_OUTCOME_", |v| {
            pb::CompactionOutcome::try_from(v)
                .ok()
                .map(|o| o.as_str_name())
        });
        let violations: [&str; VIOLATIONS] = wire_labels("VIOLATION_KIND_", |v| {
            pb::ViolationKind::try_from(v).ok().map(|k| k.as_str_name())
        });
        let compaction_labels: [[Label; 2]; TRIGGERS * OUTCOMES] = std::array::from_fn(|i| {
            [
                ("trigger", triggers[i / OUTCOMES]),
                ("outcome", outcomes[i % OUTCOMES]),
            ]
        });
        let counters = Counters {
            admissions: counters(
                r,
                "ctxbroker_admissions",
                "Turns offered to Admit and AdmitStream, by outcome: admitted, replayed (an idempotent retry), escalated (FAILED_PRECONDITION: no valid compaction makes room), refused (any other error)",
                ADMISSIONS.map(|outcome| [("outcome", outcome)]),
            ),
            admitted_tokens: counter(
                r,
                "ctxbroker_admitted_tokens",
                "Tokens of the spans admitted (replays excluded)",
            ),
            admitted_spans: counters(
                r,
                "ctxbroker_admitted_spans",
                "Spans admitted, by class",
                CLASSES.map(|class| [("class", class)]),
            ),
            compactions: counters(
                r,
                "ctxbroker_compactions",
                "Compaction markers written, by trigger and outcome",
                compaction_labels,
            ),
            evicted_spans: counter(
                r,
                "ctxbroker_compaction_evicted_spans",
                "Spans moved to the archive by committed compactions",
            ),
            reclaimed_tokens: counter(
                r,
                "ctxbroker_compaction_reclaimed_tokens",
                "Live tokens freed by committed compactions",
            ),
            anchors_dropped: counter(
                r,
                "ctxbroker_anchors_dropped",
                "Anchors a committed summary could not carry forward (each one named in its marker)",
            ),
            escalations: counters(
                r,
                "ctxbroker_escalations",
                "Compactions that could not be made valid: nothing committed, the caller got FAILED_PRECONDITION, watchers an ABORTED marker",
                triggers.map(|trigger| [("trigger", trigger)]),
            ),
            verification_failures: counters(
                r,
                "ctxbroker_verification_failures",
                "Violations found by pre-commit verification in escalated compactions, by reason",
                violations.map(|reason| [("reason", reason)]),
            ),
            watcher_log_fallbacks: counter(
                r,
                "ctxbroker_watcher_log_fallbacks",
                "Times a watch fell behind the live ring and went back to the durable log (it loses nothing)",
            ),
            flush: Histogram::new(FLUSH_BUCKETS),
            session_cache: crate::sessions::CacheProbe {
                loads: counter(
                    r,
                    "ctxbroker_session_loads",
                    "Sessions read from the store into memory: first requests, and requests after the session cache let them go (loads keeping pace with admissions mean session_cache_bytes is smaller than the sessions in use)",
                ),
                let_go: counter(
                    r,
                    "ctxbroker_sessions_let_go",
                    "Idle sessions the session cache dropped from memory to stay within session_cache_bytes",
                ),
                bytes: Gauge::default(),
            },
        };
        r.register(
            "ctxbroker_session_cache_bytes",
            "Estimated bytes of the sessions held in memory (bounded by session_cache_bytes once their turns end)",
            counters.session_cache.bytes.clone(),
        );
        r.register(
            "ctxbroker_store_flush_duration_seconds",
            "Each flush of the storage engine by the store's flusher; concurrent writes share one",
            counters.flush.clone(),
        );
        counters
    }

    /// Counts how an admission ended, from what the service answers.
    pub(super) fn admission(&self, result: &Result<pb::AdmitResponse, ApiError>) {
        // An index into ADMISSIONS.
        let outcome = match result {
            Ok(reply) if reply.replayed => 1,
            Ok(reply) => {
                let mut tokens = 0u64;
                for span in &reply.spans {
                    tokens += u64::from(span.tokens);
                    let class = usize::from(span.span_class() != pb::SpanClass::Constraint);
                    inc(self.admitted_spans.get(class));
                }
                self.admitted_tokens.inc_by(tokens);
                0
            }
            Err(ApiError::Escalation(_)) => 2,
            Err(_) => 3,
        };
        inc(self.admissions.get(outcome));
    }

    /// Counts the markers of a flushed batch.
    pub(super) fn markers(&self, markers: &[Marker]) {
        for marker in markers {
            let trigger = wire_index(compaction_trigger_to_pb(marker.trigger));
            let outcome = wire_index(outcome_to_pb(marker.outcome));
            inc(self.compactions.get(trigger * OUTCOMES + outcome));
            match marker.outcome {
                Outcome::Committed => {
                    self.evicted_spans.inc_by(marker.evicted.len() as u64);
                    self.reclaimed_tokens.inc_by(u64::from(
                        marker.tokens_before.saturating_sub(marker.tokens_after),
                    ));
                    self.anchors_dropped
                        .inc_by(u64::from(marker.anchors_dropped));
                }
                Outcome::Aborted => {
                    inc(self.escalations.get(trigger));
                    for violation in &marker.violations {
                        let reason = wire_index(violation_kind_to_pb(violation.kind));
                        inc(self.verification_failures.get(reason));
                    }
                }
            }
        }
    }
}

fn inc(counter: Option<&Counter>) {
    if let Some(counter) = counter {
        counter.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxbroker_core::marker::CompactionTrigger;

    #[test]
    fn every_wire_value_has_its_label() {
        let triggers: [&str; TRIGGERS] = wire_labels("COMPACTION_TRIGGER_", |v| {
            pb::CompactionTrigger::try_from(v)
                .ok()
                .map(|t| t.as_str_name())
        });
        assert_eq!(
            triggers,
            [
                "HARD_BUDGET",
                "SOFT_WATERMARK",
                "STALENESS",
                "MANUAL",
                "UNPIN"
            ]
        );
        // One past the last value is no value: the counts are the enums'.
        assert!(pb::CompactionTrigger::try_from(TRIGGERS as i32 + 1).is_err());
        assert!(pb::CompactionOutcome::try_from(OUTCOMES as i32 + 1).is_err());
        assert!(pb::ViolationKind::try_from(VIOLATIONS as i32 + 1).is_err());
        assert_eq!(
            wire_index(compaction_trigger_to_pb(CompactionTrigger::Unpin)),
            4
        );
        assert_eq!(wire_index(outcome_to_pb(Outcome::Aborted)), 1);
    }
}
