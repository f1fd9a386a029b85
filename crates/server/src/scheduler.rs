//! The background scheduler: pre-compactions of sessions above their soft
//! watermark, and the staleness guard of HYBRID and TIME_BASED sessions.
//! Core decides when each is due (`trigger::soft_due`,
//! `trigger::staleness_due`) and what it compacts; the scheduler finds the
//! sessions, takes their turns and commits through the broker.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use ctxbroker_core::session::{Change, SessionRecord};
use ctxbroker_core::{tokens, trigger};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn};

use crate::blocking;
use crate::broker::{Broker, now_ms};
use crate::error::ApiError;
use crate::sessions::{Loaded, lock};

/// How often the staleness guard looks at the sessions in memory.
const STALENESS_TICK: Duration = Duration::from_millis(100);

/// The background work's queue and watch list.
#[derive(Debug)]
pub struct Scheduler {
    /// Sessions above their soft watermark, waiting for the background
    /// pre-compaction; the set keeps each queued once.
    soft_queue: mpsc::UnboundedSender<String>,
    soft_pending: Mutex<HashSet<String>>,
    soft_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    /// Sessions whose trigger has a staleness guard (HYBRID, TIME_BASED):
    /// the only ones the guard's tick looks at. Seeded from the store when
    /// the background work starts, so a restart loses none.
    guarded: Mutex<BTreeSet<String>>,
}

impl Default for Scheduler {
    fn default() -> Self {
        let (soft_queue, soft_rx) = mpsc::unbounded_channel();
        Scheduler {
            soft_queue,
            soft_pending: Mutex::default(),
            soft_rx: Mutex::new(Some(soft_rx)),
            guarded: Mutex::default(),
        }
    }
}

impl Scheduler {
    /// Keeps the set of sessions with a staleness guard in step with a
    /// session's configuration.
    pub fn guard(&self, record: &SessionRecord) {
        let mut guarded = lock(&self.guarded);
        if trigger::has_staleness_guard(&record.config) {
            if !guarded.contains(&record.id) {
                guarded.insert(record.id.clone());
            }
        } else {
            guarded.remove(&record.id);
        }
    }

    /// Seeds the staleness guard's set from the store, a page at a time,
    /// each read off the async workers.
    async fn seed(&self, broker: &Broker) {
        const PAGE: usize = 512;
        let mut after: Option<String> = None;
        loop {
            let from = after.take();
            let read = blocking::read(broker.store(), move |store| {
                store.sessions(from.as_deref(), PAGE)
            });
            let page = match read.await {
                Ok(page) => page,
                Err(err) => {
                    warn!(%err, "listing sessions for the staleness guard failed");
                    return;
                }
            };
            for record in &page {
                self.guard(record);
            }
            match page.last() {
                Some(last) if page.len() == PAGE => after = Some(last.id.clone()),
                _ => return,
            }
        }
    }

    /// Queues the session's background pre-compaction when core says it
    /// has work ([`trigger::soft_due`]), once.
    pub fn queue_soft(&self, record: &SessionRecord) {
        if !trigger::soft_due(record) {
            return;
        }
        let fresh = lock(&self.soft_pending).insert(record.id.clone());
        if fresh {
            let _ = self.soft_queue.send(record.id.clone());
        }
    }

    /// Runs the background work until `shutdown`. Neither part is on the
    /// admission path, and neither ever compacts a session that admitted
    /// nothing since its last compaction.
    pub async fn run(&self, broker: &Broker, shutdown: CancellationToken) {
        let rx = lock(&self.soft_rx).take();
        let Some(mut rx) = rx else {
            return;
        };
        self.seed(broker).await;
        let mut tick = tokio::time::interval(STALENESS_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                id = rx.recv() => {
                    let Some(id) = id else { return };
                    lock(&self.soft_pending).remove(&id);
                    soft(broker, &id).await;
                }
                _ = tick.tick() => self.staleness(broker).await,
            }
        }
    }

    /// One tick of the staleness guard over the sessions it watches.
    async fn staleness(&self, broker: &Broker) {
        let now = now_ms();
        let ids: Vec<String> = lock(&self.guarded).iter().cloned().collect();
        for id in ids {
            // Never queue behind a request: a busy session is not stale.
            let mut loaded = match broker.sessions.try_lock(broker.store(), &id).await {
                Ok(Some(loaded)) => loaded,
                Ok(None) => continue,
                Err(ApiError::SessionNotFound(_)) => {
                    self.forget(&id);
                    continue;
                }
                Err(err) => {
                    debug!(session_id = %id, %err, "staleness guard could not load the session");
                    continue;
                }
            };
            if !trigger::has_staleness_guard(&loaded.session.record.config) {
                self.forget(&id);
                continue;
            }
            if !trigger::staleness_due(&loaded.session.record, now) {
                continue;
            }
            let counter = tokens::counter(loaded.session.record.config.tokenizer);
            let turn = loaded.session.record.turns;
            let planned = info_span!("plan", session_id = %id, turn)
                .in_scope(|| loaded.session.staleness_compaction(now, counter));
            if let Some(change) = planned {
                commit(broker, &mut loaded, change, "staleness compaction").await;
            }
        }
    }

    /// Stops watching a session (deleted, or its guard removed).
    pub fn forget(&self, id: &str) {
        lock(&self.guarded).remove(id);
    }
}

/// Runs a queued session's pre-compaction, when core still finds one.
async fn soft(broker: &Broker, id: &str) {
    // Waits its turn like any request: the admission that queued it
    // has released the session already.
    let Ok(mut loaded) = broker.sessions.lock(broker.store(), id).await else {
        return;
    };
    let counter = tokens::counter(loaded.session.record.config.tokenizer);
    let turn = loaded.session.record.turns;
    let planned = info_span!("plan", session_id = id, turn)
        .in_scope(|| loaded.session.soft_compaction(now_ms(), counter));
    let Some(change) = planned else {
        return;
    };
    commit(broker, &mut loaded, change, "soft-watermark pre-compaction").await;
}

/// Persists a background compaction through the broker.
async fn commit(broker: &Broker, loaded: &mut Loaded, change: Change, what: &str) {
    let id = loaded.session.record.id.clone();
    match broker.persist(loaded, &change, Vec::new()).await {
        Ok(seq) => info!(
            session_id = %id,
            seq = seq.unwrap_or(0),
            evicted = change.evict.len(),
            live = loaded.session.record.live_tokens,
            "{what} committed"
        ),
        Err(err) => debug!(session_id = %id, %err, "{what} not committed"),
    }
}
