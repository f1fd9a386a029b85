//! Prometheus metrics: the families the daemon exports, kept in a
//! [prometheus-client](prometheus_client) registry and served by a small
//! axum endpoint on its own address (`--metrics-addr`, off by default).
//!
//! - `registry`: the counters and the flush histogram, fed by the services
//!   and the store's hooks;
//! - `scrape`: the gauges read at scrape time (stored sessions, watchers,
//!   the store's writer), a prometheus-client collector;
//! - `timed`: the tower service timing `ContextBroker` calls ([`Timed`]);
//! - `endpoint`: the HTTP endpoint ([`serve`]).
//!
//! Every family, with its type, labels and meaning, is listed in
//! `docs/operators.md`, section 5.
//!
//! # Exposition format
//!
//! The exposition is the Prometheus text format, version 0.0.4, served as
//! `text/plain; version=0.0.4; charset=utf-8` — what the daemon has always
//! served — written by [`prometheus_client::encoding::prometheus_text`],
//! not OpenMetrics: OpenMetrics names a counter's family without `_total`
//! (`# TYPE ctxbroker_admissions counter` above `ctxbroker_admissions_total`
//! samples) and ends with `# EOF`, which strict text-format readers of
//! today's output refuse. Counters are registered without their `_total`;
//! the encoder appends it, so the series names are unchanged.
//!
//! # Bounded cardinality
//!
//! Every label takes values from a fixed set, except `session_id`, which
//! names only the `top_sessions` sessions with the most live tokens; the
//! aggregates count every session. `method` takes the contract's RPC names
//! (read from its descriptor set, so a new RPC needs no change here) or
//! `other`; `code` the 17 gRPC codes.
//!
//! The labelled counters are created with all their label values when the
//! daemon starts (a zero is a sample too), and the admission path holds
//! their handles: an observation is an atomic add, with no label lookup.
//! The cost of a scrape (one pass over the stored sessions, formatting) is
//! paid by the scraper, off the request path, one scrape at a time.

mod endpoint;
mod registry;
mod scrape;
mod timed;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use ctxbroker_core::Marker;
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::{Store, StoreError};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::BuildInfo;
use crate::error::ApiError;

pub use endpoint::{EndpointOptions, serve};
pub use timed::{Timed, TimedCall};

/// Sessions named by `ctxbroker_session_live_tokens` unless configured.
pub const DEFAULT_TOP_SESSIONS: usize = 10;
/// The most sessions that setting may name.
pub const MAX_TOP_SESSIONS: usize = 100;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The stored sessions could not be read.
    #[error("reading the sessions: {0}")]
    Store(#[from] StoreError),
    /// The exposition could not be written.
    #[error("encoding the exposition")]
    Encode(#[from] std::fmt::Error),
}

/// One watcher's entry in the metrics: its feed reports its position
/// through it. The metrics hold it weakly, so dropping it removes the
/// watcher.
#[derive(Debug)]
pub struct WatcherProbe {
    /// The watcher's next sequence to deliver.
    position: AtomicU64,
    fallbacks: Counter,
}

impl WatcherProbe {
    /// The watcher's next sequence to deliver is `next_seq`.
    pub fn at(&self, next_seq: u64) {
        self.position.store(next_seq, Ordering::Relaxed);
    }

    /// The watcher fell behind the live ring and reads the log again.
    pub fn fell_back(&self) {
        self.fallbacks.inc();
    }
}

/// The daemon's metrics. Shared by the services, the store's hooks and the
/// HTTP endpoint.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    counters: registry::Counters,
    rpc: timed::RpcTable,
    top_sessions: usize,
    /// The open watches. Locked only when a watch opens, and by scrapes.
    watchers: Mutex<Vec<Weak<WatcherProbe>>>,
    /// Microseconds the previous scrape took.
    last_scrape_us: AtomicU64,
    /// One scrape at a time: each walks every stored session.
    scrape: tokio::sync::Mutex<()>,
}

impl Metrics {
    /// Empty metrics for a daemon built as `build`, naming at most
    /// `top_sessions` sessions (clamped to [`MAX_TOP_SESSIONS`]).
    pub fn new(build: BuildInfo, top_sessions: usize) -> Metrics {
        let mut registry = Registry::default();
        let counters = registry::Counters::register(&mut registry, build);
        let rpc = timed::RpcTable::register(&mut registry);
        Metrics {
            registry,
            counters,
            rpc,
            top_sessions: top_sessions.min(MAX_TOP_SESSIONS),
            watchers: Mutex::default(),
            last_scrape_us: AtomicU64::new(0),
            scrape: tokio::sync::Mutex::new(()),
        }
    }

    /// Records a `ContextBroker` call refused before it reached the
    /// service (no token, an unknown one, or a role that may not call it),
    /// by method and code, like every served call.
    pub fn refused_call(&self, path: &str, code: tonic::Code, elapsed: Duration) {
        self.rpc
            .observe(self.rpc.method_index(path), code as usize, elapsed);
    }

    /// Records how an admission ended, from what the service answers.
    pub fn admission(&self, result: &Result<pb::AdmitResponse, ApiError>) {
        self.counters.admission(result);
    }

    /// Records the markers of a flushed batch (the store's commit hook).
    pub fn markers(&self, markers: &[Marker]) {
        self.counters.markers(markers);
    }

    /// The session cache's probe, to give `Sessions::observe`.
    pub fn session_cache(&self) -> crate::sessions::CacheProbe {
        self.counters.session_cache.clone()
    }

    /// Records one flush of the store (the store's flush observer).
    pub fn flushed(&self, took: Duration) {
        self.counters.flush.observe(took.as_secs_f64());
    }

    /// Registers a watcher whose next sequence to deliver is `next_seq`.
    pub fn watcher(&self, next_seq: u64) -> Arc<WatcherProbe> {
        let probe = Arc::new(WatcherProbe {
            position: AtomicU64::new(next_seq),
            fallbacks: self.counters.watcher_log_fallbacks.clone(),
        });
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        // The watches that ended go here, so the list stays bounded.
        watchers.retain(|watcher| watcher.strong_count() > 0);
        watchers.push(Arc::downgrade(&probe));
        probe
    }

    /// Renders every family in the text format. Walks the stored sessions,
    /// so it blocks: call it off the runtime's workers.
    pub fn render(&self, store: &Store) -> Result<String, ScrapeError> {
        let started = Instant::now();
        let positions: Vec<u64> = self
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .map(|probe| probe.position.load(Ordering::Relaxed))
            .collect();
        // Read first: reading can fail, encoding a collector cannot report
        // why.
        let scraped = scrape::Scraped::read(
            store,
            self.top_sessions,
            &positions,
            self.last_scrape_us.load(Ordering::Relaxed),
        )?;
        let mut text = String::new();
        prometheus_text::encode(&mut text, &self.registry)?;
        let mut read_now = Registry::default();
        read_now.register_collector(Box::new(scraped));
        prometheus_text::encode(&mut text, &read_now)?;
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_scrape_us.store(took, Ordering::Relaxed);
        Ok(text)
    }
}
