//! Prometheus metrics: a small registry of counters, gauges and
//! fixed-bucket histograms on atomics, rendered in the Prometheus text
//! format (version 0.0.4) and served by a minimal HTTP/1.1 endpoint on its
//! own address (`--metrics-addr`, off by default).
//!
//! The registry is written here rather than taken from a metrics crate:
//! the families are fixed and known when the daemon is built, so every
//! label set is an index into a preallocated array. An observation on the
//! admission path is a few relaxed atomic adds — no lock, no allocation,
//! no label hashing — and the daemon gains no dependency beyond tokio.
//! The cost of a scrape (formatting, one pass over the stored sessions)
//! is paid by the scraper, off the request path.
//!
//! # Families
//!
//! | family | type | labels | what |
//! |---|---|---|---|
//! | `ctxbroker_build_info` | gauge | `version`, `commit` | always 1 |
//! | `ctxbroker_start_time_seconds` | gauge | | when the daemon started |
//! | `ctxbroker_admissions_total` | counter | `outcome` | turns: `admitted`, `replayed` (idempotent retry), `escalated` (FAILED_PRECONDITION), `refused` (any other error) |
//! | `ctxbroker_admitted_tokens_total` | counter | | tokens of admitted spans |
//! | `ctxbroker_admitted_spans_total` | counter | `class` | admitted spans by class |
//! | `ctxbroker_compactions_total` | counter | `trigger`, `outcome` | every marker written |
//! | `ctxbroker_compaction_evicted_spans_total` | counter | | spans moved to the archive |
//! | `ctxbroker_compaction_reclaimed_tokens_total` | counter | | live tokens freed by committed compactions |
//! | `ctxbroker_anchors_dropped_total` | counter | | anchors a summary could not carry (invariant 8) |
//! | `ctxbroker_escalations_total` | counter | `trigger` | compactions that could not be made valid (ABORTED markers) |
//! | `ctxbroker_verification_failures_total` | counter | `reason` | violations in those markers, by kind |
//! | `ctxbroker_sessions` | gauge | | sessions stored |
//! | `ctxbroker_live_tokens` | gauge | | live tokens, all sessions |
//! | `ctxbroker_pinned_tokens` | gauge | | pinned tokens, all sessions |
//! | `ctxbroker_session_live_tokens` | gauge | `session_id` | the top sessions by live tokens |
//! | `ctxbroker_session_budget_tokens` | gauge | `session_id` | the same sessions' budgets |
//! | `ctxbroker_sessions_by_fill` | gauge | `fill` | sessions by live / budget band |
//! | `ctxbroker_watchers` | gauge | | open WatchCompactions streams |
//! | `ctxbroker_watchers_lagging` | gauge | | of those, watchers behind the head |
//! | `ctxbroker_watcher_max_lag_markers` | gauge | | markers the furthest-behind watcher has not yet taken |
//! | `ctxbroker_watcher_log_fallbacks_total` | counter | | times a watcher fell behind the live ring and went back to the log |
//! | `ctxbroker_marker_next_seq` | gauge | | the sequence the next marker will take |
//! | `ctxbroker_store_flush_duration_seconds` | histogram | | each flush of the engine |
//! | `ctxbroker_store_writes_total` | counter | | writes the store's writer took |
//! | `ctxbroker_store_rejected_writes_total` | counter | | of those, refused (stale revision, ...) |
//! | `ctxbroker_store_batches_total` | counter | | batches the writer applied |
//! | `ctxbroker_store_flushes_total` | counter | | flushes |
//! | `ctxbroker_store_queued_writes` | gauge | | writes waiting for the writer |
//! | `ctxbroker_rpc_duration_seconds` | histogram | `method`, `code` | `ContextBroker` calls |
//! | `ctxbroker_scrape_duration_seconds` | gauge | | how long the previous scrape took |
//!
//! # Bounded cardinality
//!
//! Every label takes values from a fixed set, except `session_id`: live
//! tokens per session are exported for the `top_sessions` sessions with the
//! most live tokens (10 by default, 0 for none; ties go to the smaller id),
//! plus aggregates over all sessions — their sum, and how many sessions
//! fill their budget to 0–50 %, 50–80 %, 80–90 % and 90–100 %. So the
//! number of series stays bounded whatever the number of sessions, and the
//! sessions closest to a compaction are the ones named. `method` takes the
//! contract's RPC names (read from its descriptor set, so a new RPC needs
//! no change here) or `other`; `code` the 17 gRPC codes.
//!
//! RPC latency is measured from the request's arrival at the service to its
//! response headers: for a unary call the whole handler, for a stream its
//! opening. A call dropped before it answered (client gone, or the
//! request timeout) counts as `CANCELLED`, or `DEADLINE_EXCEEDED` when its
//! deadline had passed.

use std::collections::{BinaryHeap, HashMap};
use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ctxbroker_core::Marker;
use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::plan::ViolationKind;
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::{Store, StoreError};
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tracing::{debug, warn};

use crate::BuildInfo;
use crate::broker::now_ms;
use crate::error::ApiError;

/// Sessions named by `ctxbroker_session_live_tokens` unless configured.
pub const DEFAULT_TOP_SESSIONS: usize = 10;
/// The most sessions that setting may name.
pub const MAX_TOP_SESSIONS: usize = 100;

/// RPC latency buckets, in microseconds: 250 µs to 10 s.
const RPC_BUCKETS_US: &[u64] = &[
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];
/// Flush latency buckets, in microseconds: 100 µs to 2.5 s.
const FLUSH_BUCKETS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000,
];
/// Upper bounds of the `ctxbroker_sessions_by_fill` bands; the last band
/// takes everything above the one before.
const FILL_BANDS: &[(f64, &str)] = &[
    (0.5, "0.0-0.5"),
    (0.8, "0.5-0.8"),
    (0.9, "0.8-0.9"),
    (f64::INFINITY, "0.9-1.0"),
];
/// Sessions read from the store per step of a scrape.
const SCAN_PAGE: usize = 1024;

/// The service whose calls are timed.
const SERVICE: &str = "ctxbroker.v1.ContextBroker";
/// The gRPC status codes, by number.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];
const CODE_UNKNOWN: usize = 2;
const CODE_CANCELLED: usize = 1;
const CODE_DEADLINE_EXCEEDED: usize = 4;

/// How an admission ended, for `ctxbroker_admissions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    Admitted,
    Replayed,
    Escalated,
    Refused,
}

const ADMISSIONS: [(Admission, &str); 4] = [
    (Admission::Admitted, "admitted"),
    (Admission::Replayed, "replayed"),
    (Admission::Escalated, "escalated"),
    (Admission::Refused, "refused"),
];

const TRIGGERS: [(CompactionTrigger, &str); 5] = [
    (CompactionTrigger::HardBudget, "HARD_BUDGET"),
    (CompactionTrigger::SoftWatermark, "SOFT_WATERMARK"),
    (CompactionTrigger::Staleness, "STALENESS"),
    (CompactionTrigger::Manual, "MANUAL"),
    (CompactionTrigger::Unpin, "UNPIN"),
];

const OUTCOMES: [(Outcome, &str); 2] = [
    (Outcome::Committed, "COMMITTED"),
    (Outcome::Aborted, "ABORTED"),
];

const VIOLATIONS: [(ViolationKind, &str); 8] = [
    (ViolationKind::PinnedMissing, "PINNED_MISSING"),
    (ViolationKind::PredicateUnsatisfied, "PREDICATE_UNSATISFIED"),
    (ViolationKind::OverBudget, "OVER_BUDGET"),
    (ViolationKind::PinnedExceedBudget, "PINNED_EXCEED_BUDGET"),
    (ViolationKind::TurnTooLarge, "TURN_TOO_LARGE"),
    (ViolationKind::GenerationExceeded, "GENERATION_EXCEEDED"),
    (ViolationKind::AnchorMissing, "ANCHOR_MISSING"),
    (ViolationKind::PlanInconsistent, "PLAN_INCONSISTENT"),
];

const CLASSES: [&str; 2] = ["constraint", "narrative"];

fn trigger_index(trigger: CompactionTrigger) -> usize {
    // Exhaustive: a new trigger must be given a label.
    match trigger {
        CompactionTrigger::HardBudget => 0,
        CompactionTrigger::SoftWatermark => 1,
        CompactionTrigger::Staleness => 2,
        CompactionTrigger::Manual => 3,
        CompactionTrigger::Unpin => 4,
    }
}

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Committed => 0,
        Outcome::Aborted => 1,
    }
}

fn violation_index(kind: ViolationKind) -> usize {
    match kind {
        ViolationKind::PinnedMissing => 0,
        ViolationKind::PredicateUnsatisfied => 1,
        ViolationKind::OverBudget => 2,
        ViolationKind::PinnedExceedBudget => 3,
        ViolationKind::TurnTooLarge => 4,
        ViolationKind::GenerationExceeded => 5,
        ViolationKind::AnchorMissing => 6,
        ViolationKind::PlanInconsistent => 7,
    }
}

fn admission_index(admission: Admission) -> usize {
    match admission {
        Admission::Admitted => 0,
        Admission::Replayed => 1,
        Admission::Escalated => 2,
        Admission::Refused => 3,
    }
}

fn counters<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

fn add(counter: Option<&AtomicU64>, n: u64) {
    if let Some(counter) = counter {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Microseconds, saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A histogram with fixed bucket bounds (in microseconds, exported in
/// seconds). Counts are kept per bucket and made cumulative when rendered,
/// so the `+Inf` bucket and `_count` are always the same number.
#[derive(Debug)]
struct Histogram {
    bounds_us: &'static [u64],
    /// One more than the bounds: the last is above every bound.
    counts: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

/// A histogram read at one moment.
#[derive(Debug, Clone, PartialEq)]
struct HistogramSnapshot {
    /// Cumulative counts, one per bound, then `+Inf`.
    cumulative: Vec<u64>,
    sum_us: u64,
}

impl HistogramSnapshot {
    fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

impl Histogram {
    fn new(bounds_us: &'static [u64]) -> Histogram {
        Histogram {
            bounds_us,
            counts: (0..=bounds_us.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    fn observe(&self, elapsed: Duration) {
        let us = micros(elapsed);
        // The first bucket whose bound is at least the value (`le`).
        let at = self.bounds_us.partition_point(|&bound| bound < us);
        add(self.counts.get(at), 1);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0u64;
        let cumulative = self
            .counts
            .iter()
            .map(|count| {
                running = running.saturating_add(get(count));
                running
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            sum_us: get(&self.sum_us),
        }
    }
}

/// Latency of the contract's RPCs, by method and status code.
#[derive(Debug)]
struct RpcTable {
    /// `/ctxbroker.v1.ContextBroker/`.
    prefix: String,
    /// The contract's methods; index `methods.len()` is `other`.
    methods: Vec<String>,
    /// `(methods.len() + 1) × CODES.len()` histograms.
    latency: Vec<Histogram>,
}

impl RpcTable {
    fn new() -> RpcTable {
        let methods = contract_methods();
        let latency = (0..(methods.len() + 1) * CODES.len())
            .map(|_| Histogram::new(RPC_BUCKETS_US))
            .collect();
        RpcTable {
            prefix: format!("/{SERVICE}/"),
            methods,
            latency,
        }
    }

    fn method_index(&self, path: &str) -> usize {
        path.strip_prefix(self.prefix.as_str())
            .and_then(|name| self.methods.iter().position(|m| m == name))
            .unwrap_or(self.methods.len())
    }

    fn method_name(&self, index: usize) -> &str {
        self.methods.get(index).map_or("other", String::as_str)
    }

    fn observe(&self, method: usize, code: usize, elapsed: Duration) {
        if let Some(h) = self.latency.get(method * CODES.len() + code) {
            h.observe(elapsed);
        }
    }
}

/// The RPC names of `ContextBroker`, from the contract's descriptor set.
fn contract_methods() -> Vec<String> {
    let Ok(set) = prost_types::FileDescriptorSet::decode(ctxbroker_proto::FILE_DESCRIPTOR_SET)
    else {
        return Vec::new();
    };
    set.file
        .iter()
        .filter(|file| file.package() == "ctxbroker.v1")
        .flat_map(|file| &file.service)
        .filter(|service| service.name() == "ContextBroker")
        .flat_map(|service| &service.method)
        .map(|method| method.name().to_owned())
        .collect()
}

/// The open watches and where each one is in the marker log.
#[derive(Debug, Default)]
struct Watchers {
    next_id: AtomicU64,
    /// Each watcher's next sequence to deliver. Locked only when a watch
    /// opens or ends, and by scrapes.
    positions: Mutex<HashMap<u64, Arc<AtomicU64>>>,
    fallbacks: AtomicU64,
}

/// One watcher's entry in the metrics: its feed reports its position
/// through it, and dropping it removes the watcher.
#[derive(Debug)]
pub struct WatcherProbe {
    id: u64,
    position: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl WatcherProbe {
    /// The watcher's next sequence to deliver is `next_seq`.
    pub fn at(&self, next_seq: u64) {
        self.position.store(next_seq, Ordering::Relaxed);
    }

    /// The watcher fell behind the live ring and reads the log again.
    pub fn fell_back(&self) {
        self.metrics
            .watchers
            .fallbacks
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for WatcherProbe {
    fn drop(&mut self) {
        self.metrics
            .watchers
            .positions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&self.id);
    }
}

/// The daemon's metrics. Shared by the services, the store's hooks and the
/// HTTP endpoint.
#[derive(Debug)]
pub struct Metrics {
    build: BuildInfo,
    started_at_ms: u64,
    top_sessions: usize,
    admissions: [AtomicU64; 4],
    admitted_tokens: AtomicU64,
    admitted_spans: [AtomicU64; 2],
    /// trigger × outcome.
    compactions: [AtomicU64; 10],
    evicted_spans: AtomicU64,
    reclaimed_tokens: AtomicU64,
    anchors_dropped: AtomicU64,
    escalations: [AtomicU64; 5],
    verification_failures: [AtomicU64; 8],
    flush: Histogram,
    rpc: RpcTable,
    watchers: Watchers,
    /// Microseconds the previous scrape took.
    last_scrape_us: AtomicU64,
    /// One scrape at a time: each walks every stored session.
    scrape: tokio::sync::Mutex<()>,
}

impl Metrics {
    /// Empty metrics for a daemon built as `build`, naming at most
    /// `top_sessions` sessions (clamped to [`MAX_TOP_SESSIONS`]).
    pub fn new(build: BuildInfo, top_sessions: usize) -> Metrics {
        Metrics {
            build,
            started_at_ms: now_ms(),
            top_sessions: top_sessions.min(MAX_TOP_SESSIONS),
            admissions: counters(),
            admitted_tokens: AtomicU64::new(0),
            admitted_spans: counters(),
            compactions: counters(),
            evicted_spans: AtomicU64::new(0),
            reclaimed_tokens: AtomicU64::new(0),
            anchors_dropped: AtomicU64::new(0),
            escalations: counters(),
            verification_failures: counters(),
            flush: Histogram::new(FLUSH_BUCKETS_US),
            rpc: RpcTable::new(),
            watchers: Watchers::default(),
            last_scrape_us: AtomicU64::new(0),
            scrape: tokio::sync::Mutex::new(()),
        }
    }

    /// Records how an admission ended, from what the service answers.
    pub fn admission(&self, result: &Result<pb::AdmitResponse, ApiError>) {
        let outcome = match result {
            Ok(reply) if reply.replayed => Admission::Replayed,
            Ok(reply) => {
                let mut tokens = 0u64;
                for span in &reply.spans {
                    tokens += u64::from(span.tokens);
                    let class = usize::from(span.span_class() != pb::SpanClass::Constraint);
                    add(self.admitted_spans.get(class), 1);
                }
                add(Some(&self.admitted_tokens), tokens);
                Admission::Admitted
            }
            Err(ApiError::Escalation(_)) => Admission::Escalated,
            Err(_) => Admission::Refused,
        };
        add(self.admissions.get(admission_index(outcome)), 1);
    }

    /// Records the markers of a flushed batch (the store's commit hook).
    pub fn markers(&self, markers: &[Marker]) {
        for marker in markers {
            let trigger = trigger_index(marker.trigger);
            let outcome = outcome_index(marker.outcome);
            add(self.compactions.get(trigger * OUTCOMES.len() + outcome), 1);
            match marker.outcome {
                Outcome::Committed => {
                    add(Some(&self.evicted_spans), marker.evicted.len() as u64);
                    add(
                        Some(&self.reclaimed_tokens),
                        u64::from(marker.tokens_before.saturating_sub(marker.tokens_after)),
                    );
                    add(
                        Some(&self.anchors_dropped),
                        u64::from(marker.anchors_dropped),
                    );
                }
                Outcome::Aborted => {
                    add(self.escalations.get(trigger), 1);
                    for violation in &marker.violations {
                        add(
                            self.verification_failures
                                .get(violation_index(violation.kind)),
                            1,
                        );
                    }
                }
            }
        }
    }

    /// Records one flush of the store (the store's flush observer).
    pub fn flushed(&self, took: Duration) {
        self.flush.observe(took);
    }

    /// Registers a watcher whose next sequence to deliver is `next_seq`.
    pub fn watcher(self: &Arc<Self>, next_seq: u64) -> Arc<WatcherProbe> {
        let id = self.watchers.next_id.fetch_add(1, Ordering::Relaxed);
        let position = Arc::new(AtomicU64::new(next_seq));
        self.watchers
            .positions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(id, position.clone());
        Arc::new(WatcherProbe {
            id,
            position,
            metrics: self.clone(),
        })
    }

    /// Renders every family. Walks the stored sessions, so it blocks: call
    /// it off the runtime's workers.
    pub fn render(&self, store: &Store) -> Result<String, StoreError> {
        let started = Instant::now();
        let sessions = SessionStats::scan(store, self.top_sessions)?;
        let mut out = Exposition::default();
        self.render_process(&mut out);
        self.render_admissions(&mut out);
        self.render_compactions(&mut out);
        render_sessions(&mut out, &sessions);
        self.render_watchers(&mut out, store);
        self.render_store(&mut out, store);
        self.render_rpc(&mut out);
        out.family(
            "ctxbroker_scrape_duration_seconds",
            Kind::Gauge,
            "How long the previous scrape took, most of it walking the stored sessions.",
        );
        out.sample(
            "ctxbroker_scrape_duration_seconds",
            &[],
            Seconds(get(&self.last_scrape_us)),
        );
        self.last_scrape_us
            .store(micros(started.elapsed()), Ordering::Relaxed);
        Ok(out.text)
    }

    fn render_process(&self, out: &mut Exposition) {
        out.family(
            "ctxbroker_build_info",
            Kind::Gauge,
            "Always 1; the labels say what the daemon was built from.",
        );
        out.sample(
            "ctxbroker_build_info",
            &[
                ("version", self.build.version),
                ("commit", self.build.git_commit),
            ],
            1,
        );
        out.family(
            "ctxbroker_start_time_seconds",
            Kind::Gauge,
            "When the daemon started, in seconds since the Unix epoch.",
        );
        out.sample(
            "ctxbroker_start_time_seconds",
            &[],
            Seconds(self.started_at_ms.saturating_mul(1000)),
        );
    }

    fn render_admissions(&self, out: &mut Exposition) {
        out.family(
            "ctxbroker_admissions_total",
            Kind::Counter,
            "Turns offered to Admit and AdmitStream, by outcome: admitted, replayed (an idempotent retry), escalated (FAILED_PRECONDITION: no valid compaction makes room), refused (any other error).",
        );
        for ((_, label), count) in ADMISSIONS.iter().zip(&self.admissions) {
            out.sample(
                "ctxbroker_admissions_total",
                &[("outcome", label)],
                get(count),
            );
        }
        out.family(
            "ctxbroker_admitted_tokens_total",
            Kind::Counter,
            "Tokens of the spans admitted (replays excluded).",
        );
        out.sample(
            "ctxbroker_admitted_tokens_total",
            &[],
            get(&self.admitted_tokens),
        );
        out.family(
            "ctxbroker_admitted_spans_total",
            Kind::Counter,
            "Spans admitted, by class.",
        );
        for (label, count) in CLASSES.iter().zip(&self.admitted_spans) {
            out.sample(
                "ctxbroker_admitted_spans_total",
                &[("class", label)],
                get(count),
            );
        }
    }

    fn render_compactions(&self, out: &mut Exposition) {
        out.family(
            "ctxbroker_compactions_total",
            Kind::Counter,
            "Compaction markers written, by trigger and outcome.",
        );
        for (t, (_, trigger)) in TRIGGERS.iter().enumerate() {
            for (o, (_, outcome)) in OUTCOMES.iter().enumerate() {
                let count = self.compactions.get(t * OUTCOMES.len() + o).map_or(0, get);
                out.sample(
                    "ctxbroker_compactions_total",
                    &[("trigger", trigger), ("outcome", outcome)],
                    count,
                );
            }
        }
        out.family(
            "ctxbroker_compaction_evicted_spans_total",
            Kind::Counter,
            "Spans moved to the archive by committed compactions.",
        );
        out.sample(
            "ctxbroker_compaction_evicted_spans_total",
            &[],
            get(&self.evicted_spans),
        );
        out.family(
            "ctxbroker_compaction_reclaimed_tokens_total",
            Kind::Counter,
            "Live tokens freed by committed compactions.",
        );
        out.sample(
            "ctxbroker_compaction_reclaimed_tokens_total",
            &[],
            get(&self.reclaimed_tokens),
        );
        out.family(
            "ctxbroker_anchors_dropped_total",
            Kind::Counter,
            "Anchors a committed summary could not carry forward (each one named in its marker).",
        );
        out.sample(
            "ctxbroker_anchors_dropped_total",
            &[],
            get(&self.anchors_dropped),
        );
        out.family(
            "ctxbroker_escalations_total",
            Kind::Counter,
            "Compactions that could not be made valid: nothing committed, the caller got FAILED_PRECONDITION, watchers an ABORTED marker.",
        );
        for ((_, trigger), count) in TRIGGERS.iter().zip(&self.escalations) {
            out.sample(
                "ctxbroker_escalations_total",
                &[("trigger", trigger)],
                get(count),
            );
        }
        out.family(
            "ctxbroker_verification_failures_total",
            Kind::Counter,
            "Violations found by pre-commit verification in escalated compactions, by reason.",
        );
        for ((_, reason), count) in VIOLATIONS.iter().zip(&self.verification_failures) {
            out.sample(
                "ctxbroker_verification_failures_total",
                &[("reason", reason)],
                get(count),
            );
        }
    }

    fn render_watchers(&self, out: &mut Exposition, store: &Store) {
        let positions: Vec<u64> = self
            .watchers
            .positions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .map(|p| get(p))
            .collect();
        // Read after the positions: a position is never past the head it
        // was set under, and the head only grows.
        let head = store.marker_bounds().next;
        let lags = positions.iter().map(|&p| head.saturating_sub(p));
        out.family(
            "ctxbroker_watchers",
            Kind::Gauge,
            "Open WatchCompactions streams.",
        );
        out.sample("ctxbroker_watchers", &[], positions.len());
        out.family(
            "ctxbroker_watchers_lagging",
            Kind::Gauge,
            "Open watches with committed markers not yet taken.",
        );
        out.sample(
            "ctxbroker_watchers_lagging",
            &[],
            lags.clone().filter(|&lag| lag > 0).count(),
        );
        out.family(
            "ctxbroker_watcher_max_lag_markers",
            Kind::Gauge,
            "Committed markers the furthest-behind watch has not yet taken.",
        );
        out.sample(
            "ctxbroker_watcher_max_lag_markers",
            &[],
            lags.max().unwrap_or(0),
        );
        out.family(
            "ctxbroker_watcher_log_fallbacks_total",
            Kind::Counter,
            "Times a watch fell behind the live ring and went back to the durable log (it loses nothing).",
        );
        out.sample(
            "ctxbroker_watcher_log_fallbacks_total",
            &[],
            get(&self.watchers.fallbacks),
        );
        out.family(
            "ctxbroker_marker_next_seq",
            Kind::Gauge,
            "The sequence the next marker will take.",
        );
        out.sample("ctxbroker_marker_next_seq", &[], head);
    }

    fn render_store(&self, out: &mut Exposition, store: &Store) {
        out.family(
            "ctxbroker_store_flush_duration_seconds",
            Kind::Histogram,
            "Each flush of the storage engine by the store's flusher; concurrent writes share one.",
        );
        out.histogram(
            "ctxbroker_store_flush_duration_seconds",
            &[],
            self.flush.bounds_us,
            &self.flush.snapshot(),
        );
        let stats = store.stats();
        for (name, help, value) in [
            (
                "ctxbroker_store_writes_total",
                "Writes the store's writer took, applied or refused.",
                stats.writes,
            ),
            (
                "ctxbroker_store_rejected_writes_total",
                "Writes the store refused (a stale revision, a missing session).",
                stats.rejected,
            ),
            (
                "ctxbroker_store_batches_total",
                "Batches the writer took from its queue.",
                stats.batches,
            ),
            (
                "ctxbroker_store_flushes_total",
                "Flushes of the storage engine.",
                stats.flushes,
            ),
        ] {
            out.family(name, Kind::Counter, help);
            out.sample(name, &[], value);
        }
        out.family(
            "ctxbroker_store_queued_writes",
            Kind::Gauge,
            "Writes waiting for the store's writer.",
        );
        out.sample("ctxbroker_store_queued_writes", &[], stats.queued);
    }

    fn render_rpc(&self, out: &mut Exposition) {
        out.family(
            "ctxbroker_rpc_duration_seconds",
            Kind::Histogram,
            "ContextBroker calls from arrival to response headers (a stream: until it opened), by method and gRPC code.",
        );
        let table = &self.rpc;
        for method in 0..=table.methods.len() {
            for (code, code_name) in CODES.iter().enumerate() {
                let Some(h) = table.latency.get(method * CODES.len() + code) else {
                    continue;
                };
                let snapshot = h.snapshot();
                // Only pairs that happened: 18 methods × 17 codes of zeros
                // would drown the rest.
                if snapshot.count() == 0 {
                    continue;
                }
                out.histogram(
                    "ctxbroker_rpc_duration_seconds",
                    &[("method", table.method_name(method)), ("code", code_name)],
                    h.bounds_us,
                    &snapshot,
                );
            }
        }
    }
}

/// What one pass over the stored sessions found.
#[derive(Debug, Default)]
struct SessionStats {
    sessions: u64,
    live_tokens: u64,
    pinned_tokens: u64,
    /// `(live, budget, id)`, most live first.
    top: Vec<(u64, u64, String)>,
    bands: [u64; 4],
}

impl SessionStats {
    fn scan(store: &Store, top: usize) -> Result<SessionStats, StoreError> {
        // A min-heap of the best `top` so far, by (live, smaller id).
        let mut heap: BinaryHeap<std::cmp::Reverse<(u64, std::cmp::Reverse<String>, u64)>> =
            BinaryHeap::new();
        let mut stats = SessionStats::default();
        let mut after: Option<String> = None;
        loop {
            let page = store.sessions(after.as_deref(), SCAN_PAGE)?;
            for record in &page {
                stats.sessions += 1;
                stats.live_tokens += record.live_tokens;
                stats.pinned_tokens += record.pinned_tokens;
                let budget = u64::from(record.config.budget_tokens());
                let fill = if budget == 0 {
                    1.0
                } else {
                    record.live_tokens as f64 / budget as f64
                };
                let band = FILL_BANDS
                    .iter()
                    .position(|(upper, _)| fill < *upper)
                    .unwrap_or(FILL_BANDS.len() - 1);
                if let Some(count) = stats.bands.get_mut(band) {
                    *count += 1;
                }
                if top == 0 {
                    continue;
                }
                let beats = heap.len() < top
                    || heap.peek().is_some_and(|std::cmp::Reverse((live, id, _))| {
                        (record.live_tokens, std::cmp::Reverse(&record.id))
                            > (*live, std::cmp::Reverse(&id.0))
                    });
                if beats {
                    heap.push(std::cmp::Reverse((
                        record.live_tokens,
                        std::cmp::Reverse(record.id.clone()),
                        budget,
                    )));
                    if heap.len() > top {
                        heap.pop();
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() == SCAN_PAGE => after = Some(last.id.clone()),
                _ => break,
            }
        }
        // Most live first, ties by id.
        stats.top = heap
            .into_sorted_vec()
            .into_iter()
            .map(|std::cmp::Reverse((live, id, budget))| (live, budget, id.0))
            .collect();
        Ok(stats)
    }
}

fn render_sessions(out: &mut Exposition, stats: &SessionStats) {
    out.family("ctxbroker_sessions", Kind::Gauge, "Sessions stored.");
    out.sample("ctxbroker_sessions", &[], stats.sessions);
    out.family(
        "ctxbroker_live_tokens",
        Kind::Gauge,
        "Live tokens over all sessions.",
    );
    out.sample("ctxbroker_live_tokens", &[], stats.live_tokens);
    out.family(
        "ctxbroker_pinned_tokens",
        Kind::Gauge,
        "Tokens held by pinned constraints over all sessions.",
    );
    out.sample("ctxbroker_pinned_tokens", &[], stats.pinned_tokens);
    out.family(
        "ctxbroker_session_live_tokens",
        Kind::Gauge,
        "Live tokens of the sessions with the most (a bounded number of them, see metrics_top_sessions).",
    );
    for (live, _, id) in &stats.top {
        out.sample("ctxbroker_session_live_tokens", &[("session_id", id)], live);
    }
    out.family(
        "ctxbroker_session_budget_tokens",
        Kind::Gauge,
        "The budget (alpha x window - overhead) of the sessions in ctxbroker_session_live_tokens.",
    );
    for (_, budget, id) in &stats.top {
        out.sample(
            "ctxbroker_session_budget_tokens",
            &[("session_id", id)],
            budget,
        );
    }
    out.family(
        "ctxbroker_sessions_by_fill",
        Kind::Gauge,
        "Sessions by how full their budget is (live / budget), in bands.",
    );
    for ((_, band), count) in FILL_BANDS.iter().zip(&stats.bands) {
        out.sample("ctxbroker_sessions_by_fill", &[("fill", band)], count);
    }
}

/// A metric family's type.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A duration in microseconds, written in seconds.
struct Seconds(u64);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1_000_000;
        let frac = self.0 % 1_000_000;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// The text being built.
#[derive(Debug, Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl fmt::Display) {
        self.text.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.text, " {value}");
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.text.push('{');
        let mut first = true;
        for (key, value) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            if !first {
                self.text.push(',');
            }
            first = false;
            let _ = write!(self.text, "{key}=\"{}\"", escape_label(value));
        }
        self.text.push('}');
    }

    fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds_us: &[u64],
        snapshot: &HistogramSnapshot,
    ) {
        for (i, count) in snapshot.cumulative.iter().enumerate() {
            let le = match bounds_us.get(i) {
                Some(&bound) => Seconds(bound).to_string(),
                None => "+Inf".to_owned(),
            };
            let _ = write!(self.text, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.text, " {count}");
        }
        let _ = write!(self.text, "{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.text, " {}", Seconds(snapshot.sum_us));
        let _ = write!(self.text, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.text, " {}", snapshot.count());
    }
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A `ContextBroker` service whose calls are timed into
/// `ctxbroker_rpc_duration_seconds`.
#[derive(Debug, Clone)]
pub struct Timed<S> {
    inner: S,
    metrics: Arc<Metrics>,
    /// The server's own request timeout: a call dropped after it counts as
    /// DEADLINE_EXCEEDED.
    timeout: Duration,
}

impl<S> Timed<S> {
    /// Times `inner`'s calls; `timeout` is the server's request timeout.
    pub fn new(inner: S, metrics: Arc<Metrics>, timeout: Duration) -> Timed<S> {
        Timed {
            inner,
            metrics,
            timeout,
        }
    }
}

impl<S: NamedService> NamedService for Timed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Timed<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = TimedCall<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = self.metrics.rpc.method_index(request.uri().path());
        let deadline = request
            .headers()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(grpc_timeout)
            .map_or(self.timeout, |client| client.min(self.timeout));
        TimedCall {
            inner: self.inner.call(request),
            metrics: self.metrics.clone(),
            method,
            started: Instant::now(),
            deadline,
            done: false,
        }
    }
}

/// A timed call in flight.
#[derive(Debug)]
pub struct TimedCall<F> {
    inner: F,
    metrics: Arc<Metrics>,
    method: usize,
    started: Instant,
    deadline: Duration,
    done: bool,
}

impl<F, R, E> Future for TimedCall<F>
where
    F: Future<Output = Result<http::Response<R>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let result = match Pin::new(&mut this.inner).poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => return Poll::Pending,
        };
        let code = match &result {
            // A handler's error is a trailers-only response: its status is
            // in the headers. Without one, the call succeeded.
            Ok(response) => response
                .headers()
                .get("grpc-status")
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<usize>().ok())
                .filter(|&code| code < CODES.len())
                .unwrap_or(0),
            Err(_) => CODE_UNKNOWN,
        };
        this.done = true;
        this.metrics
            .rpc
            .observe(this.method, code, this.started.elapsed());
        Poll::Ready(result)
    }
}

impl<F> Drop for TimedCall<F> {
    fn drop(&mut self) {
        if !self.done {
            let elapsed = self.started.elapsed();
            let code = if elapsed >= self.deadline {
                CODE_DEADLINE_EXCEEDED
            } else {
                CODE_CANCELLED
            };
            self.metrics.rpc.observe(self.method, code, elapsed);
        }
    }
}

/// A `grpc-timeout` header: up to 8 digits and a unit.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let unit_at = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(unit_at);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The longest request head the endpoint reads.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// How long a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more are answered 503.
const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` on `listener` until `shutdown`: HTTP/1.1, one
/// request per connection.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    store: Store,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (mut stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors and the like: back off, keep serving.
                warn!(%err, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let _ = respond(&mut stream, 503, "text/plain", b"busy\n", false).await;
            });
            continue;
        };
        let metrics = metrics.clone();
        let store = store.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::select! {
                () = shutdown.cancelled() => {}
                result = answer(&mut stream, &metrics, &store) => {
                    if let Err(err) = result {
                        debug!(%peer, %err, "metrics endpoint: connection failed");
                    }
                }
            }
        });
    }
}

/// Reads one request and answers it.
async fn answer(
    stream: &mut TcpStream,
    metrics: &Arc<Metrics>,
    store: &Store,
) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(stream)).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => {
            return respond(
                stream,
                431,
                "text/plain",
                b"request head too large\n",
                false,
            )
            .await;
        }
        Ok(Err(err)) => return Err(err),
        Err(_) => return respond(stream, 408, "text/plain", b"request timeout\n", false).await,
    };
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version)) = (method, target, version) else {
        return respond(stream, 400, "text/plain", b"bad request\n", false).await;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return respond(stream, 400, "text/plain", b"bad request\n", false).await;
    }
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return respond(stream, 405, "text/plain", b"only GET and HEAD\n", false).await;
    }
    let path = target.split('?').next().unwrap_or_default();
    match path {
        "/metrics" => {
            let text = scrape(metrics, store).await;
            match text {
                Ok(text) => {
                    respond(
                        stream,
                        200,
                        "text/plain; version=0.0.4; charset=utf-8",
                        text.as_bytes(),
                        head_only,
                    )
                    .await
                }
                Err(err) => {
                    warn!(%err, "metrics endpoint: scrape failed");
                    let body = format!("scrape failed: {err}\n");
                    respond(stream, 500, "text/plain", body.as_bytes(), head_only).await
                }
            }
        }
        "/" => {
            respond(
                stream,
                200,
                "text/plain",
                b"ctxbrokerd: metrics are at /metrics\n",
                head_only,
            )
            .await
        }
        _ => {
            respond(
                stream,
                404,
                "text/plain",
                b"not found; metrics are at /metrics\n",
                head_only,
            )
            .await
        }
    }
}

/// Renders the exposition on the blocking pool, one scrape at a time.
async fn scrape(metrics: &Arc<Metrics>, store: &Store) -> Result<String, String> {
    let _turn = metrics.scrape.lock().await;
    let metrics = metrics.clone();
    let store = store.clone();
    match tokio::task::spawn_blocking(move || metrics.render(&store)).await {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(err)) => Err(err.to_string()),
        Err(err) => Err(format!("the scrape task failed: {err}")),
    }
}

/// The request head, up to the blank line; `None` when it is too long.
/// Anything after the head (a body) is ignored.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_blank_line(&buf) {
            buf.truncate(end);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Ok(None);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before the request head ended",
            ));
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let allow = if status == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body).await?;
    }
    stream.flush().await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let h = Histogram::new(&[10, 100, 1000]);
        for us in [5, 10, 11, 100, 5000, 7000] {
            h.observe(Duration::from_micros(us));
        }
        let s = h.snapshot();
        // le=10: 5 and 10; le=100: + 11, 100; le=1000: nothing more; +Inf: all.
        assert_eq!(s.cumulative, vec![2, 4, 4, 6]);
        assert_eq!(s.count(), 6);
        assert_eq!(s.sum_us, 5 + 10 + 11 + 100 + 5000 + 7000);
    }

    #[test]
    fn seconds_are_written_exactly() {
        assert_eq!(Seconds(250).to_string(), "0.00025");
        assert_eq!(Seconds(1_000_000).to_string(), "1");
        assert_eq!(Seconds(2_500_000).to_string(), "2.5");
        assert_eq!(Seconds(0).to_string(), "0");
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut out = Exposition::default();
        out.family("x_total", Kind::Counter, "a \\ b\nc");
        out.sample("x_total", &[("k", "q\"\\\n")], 1);
        assert_eq!(
            out.text,
            "# HELP x_total a \\\\ b\\nc\n# TYPE x_total counter\nx_total{k=\"q\\\"\\\\\\n\"} 1\n"
        );
    }

    #[test]
    fn rpc_methods_come_from_the_contract() {
        let table = RpcTable::new();
        assert!(table.methods.iter().any(|m| m == "Admit"));
        assert!(table.methods.iter().any(|m| m == "WatchCompactions"));
        let admit = table.method_index("/ctxbroker.v1.ContextBroker/Admit");
        assert_eq!(table.method_name(admit), "Admit");
        let other = table.method_index("/ctxbroker.v1.ContextBroker/NoSuchThing");
        assert_eq!(table.method_name(other), "other");
        assert_eq!(table.method_index("/grpc.health.v1.Health/Check"), other);
    }

    #[test]
    fn grpc_timeouts_parse_and_nonsense_does_not() {
        assert_eq!(grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("m"), None);
        assert_eq!(grpc_timeout(""), None);
        assert_eq!(grpc_timeout("123456789S"), None);
        assert_eq!(grpc_timeout("10x"), None);
    }

    #[test]
    fn code_names_follow_the_grpc_numbering() {
        assert_eq!(
            CODES[tonic::Code::FailedPrecondition as usize],
            "FAILED_PRECONDITION"
        );
        assert_eq!(
            CODES[tonic::Code::Unauthenticated as usize],
            "UNAUTHENTICATED"
        );
        assert_eq!(CODES[CODE_CANCELLED], "CANCELLED");
        assert_eq!(CODES[CODE_DEADLINE_EXCEEDED], "DEADLINE_EXCEEDED");
        assert_eq!(CODES[CODE_UNKNOWN], "UNKNOWN");
    }

    #[test]
    fn label_tables_follow_the_index_functions() {
        for (i, (trigger, _)) in TRIGGERS.iter().enumerate() {
            assert_eq!(trigger_index(*trigger), i);
        }
        for (i, (outcome, _)) in OUTCOMES.iter().enumerate() {
            assert_eq!(outcome_index(*outcome), i);
        }
        for (i, (kind, name)) in VIOLATIONS.iter().enumerate() {
            assert_eq!(violation_index(*kind), i);
            // The wire name without its enum prefix.
            let wire = crate::convert::violation_kind_name(*kind);
            assert_eq!(wire.strip_prefix("VIOLATION_KIND_"), Some(*name));
        }
        for (i, (admission, _)) in ADMISSIONS.iter().enumerate() {
            assert_eq!(admission_index(*admission), i);
        }
    }
}
