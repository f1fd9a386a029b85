//! The broker: the session lifecycle and every operation that changes a
//! session, between the wire and the store. It takes and returns domain
//! types only: `service` checks requests with `validate` and converts them
//! with `convert`; background work runs in `scheduler`.
//!
//! The policy decides (`ctxbroker_core::session::Session` returns a
//! `Change` or a `Rejection` and mutates nothing); the broker serialises
//! each session's requests, persists the change through the store's single
//! writer, and applies it to memory only once it is acknowledged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ctxbroker_core::admission::{self, CallerPredicate};
use ctxbroker_core::config::{SessionConfig, TokenizerKind};
use ctxbroker_core::marker::{CompactionTrigger, Marker};
use ctxbroker_core::session::{
    CallerEdits, Change, Incoming, PlanId, PlanOutcome, Rejection, Session, SessionRecord,
};
use ctxbroker_core::span::{Attributes, Role, SpanClass};
use ctxbroker_core::tokens::TokenCounter;
use ctxbroker_core::{Span, SpanId, tokens};
use ctxbroker_store::{SpanState, Store, StoredSpan, WriteOp};
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;
use tracing::{Span as TraceSpan, info, info_span, instrument, warn};

use crate::blocking;
use crate::config::Limits;
use crate::error::{ApiError, BadField, Escalation, Refused};
use crate::idempotency::KeyFilter;
use crate::quota::{Hold, Quotas};
use crate::scheduler::Scheduler;
use crate::sessions::{Loaded, Sessions};
use crate::{tenant, validate};

/// Texts at least this long are counted on the blocking pool, so that one
/// 120k-token tool result does not stall the runtime's workers.
const BLOCKING_COUNT_BYTES: usize = 64 << 10;

/// The broker's state: the store, the sessions in memory and the queue of
/// background pre-compactions.
#[derive(Debug)]
pub struct Broker {
    store: Store,
    pub(crate) sessions: Sessions,
    limits: Limits,
    /// Sessions that exist or are being created: reserved before a create is
    /// written, so concurrent creates cannot overshoot `max_sessions`.
    session_count: AtomicU64,
    /// The background pre-compactions and the staleness guard.
    scheduler: Scheduler,
    /// The tenants' quotas: none unless [`Broker::with_quotas`].
    quotas: Arc<Quotas>,
}

/// One span of a turn as the caller gave it: checked and converted from
/// the wire, not yet counted or classified.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSpan {
    /// Who produced it.
    pub role: Role,
    /// The content.
    pub text: String,
    /// The caller's count, accepted under the CLIENT tokenizer only.
    pub token_count: Option<u32>,
    /// The caller's class; `None` leaves it to the broker.
    pub class: Option<SpanClass>,
    /// The caller's predicate, for a constraint.
    pub predicate: Option<CallerPredicate>,
    /// The caller's relevance hint.
    pub relevance_hint: Option<f64>,
    /// The caller's idempotency key; empty when none.
    pub idempotency_key: String,
    /// What the caller attached to it, when anything.
    pub attributes: Option<Box<Attributes>>,
}

impl TurnSpan {
    /// Its tokens: the caller's count under the CLIENT tokenizer, else
    /// `counter`'s.
    pub fn tokens(&self, tokenizer: TokenizerKind, counter: &dyn TokenCounter) -> u32 {
        match (tokenizer, self.token_count) {
            (TokenizerKind::Client, Some(n)) => n,
            _ => counter.count(&self.text),
        }
    }

    /// The span counted (`tokens`) and labelled as the broker labels it
    /// ([`admission::label`]), ready for the session, which settles an
    /// unlabelled one under its classifier mode.
    pub fn labelled(self, tokens: u32) -> Incoming {
        let (classification, predicate) =
            admission::label(self.role, &self.text, self.class, self.predicate.as_ref());
        Incoming {
            role: self.role,
            text: self.text,
            tokens,
            classification,
            predicate,
            relevance_hint: self.relevance_hint,
            unclassified: self.class.is_none(),
            attributes: self.attributes,
        }
    }
}

/// The result of an admission, for the wire.
#[derive(Debug)]
pub struct Admitted {
    /// The admitted spans, as they stand: live, or archived when a replay
    /// finds them evicted since.
    pub spans: Vec<(Span, SpanState)>,
    /// The spans' turn.
    pub turn: u64,
    /// Nothing was admitted: every span's idempotency key had been, and
    /// `spans` are the originals.
    pub replayed: bool,
    /// The committed compaction marker, when one ran.
    pub marker: Option<Marker>,
    /// The record after the admission.
    pub record: SessionRecord,
}

/// The result of a commit, an unpin or any other change with a marker.
#[derive(Debug)]
pub struct Committed {
    /// The marker, with its sequence.
    pub marker: Option<Marker>,
    /// The record after.
    pub record: SessionRecord,
    /// Spans the change rewrote (a pinned or unpinned span).
    pub replaced: Vec<Span>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Broker {
    /// A broker over an open store. Debug builds arm the store's check
    /// that no read runs on an async worker (see [`blocking`]).
    pub fn new(store: Store, limits: Limits) -> Self {
        if cfg!(debug_assertions) {
            store.check_reads_off_workers();
        }
        let session_count = AtomicU64::new(store.session_count());
        Broker {
            store,
            sessions: Sessions::new(limits.session_cache_bytes),
            limits,
            session_count,
            scheduler: Scheduler::default(),
            quotas: Arc::new(Quotas::default()),
        }
    }

    /// The sessions held in memory.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Enforces the tenants' quotas: sessions, stored bytes and the
    /// admission rate here, streams where the service opens them (see
    /// [`Quotas::open_stream`]).
    pub fn with_quotas(mut self, quotas: Arc<Quotas>) -> Self {
        self.quotas = quotas;
        self
    }

    /// The tenants' quotas.
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Sessions held in memory now.
    pub fn resident_sessions(&self) -> usize {
        self.sessions.resident()
    }

    /// The estimated bytes of the sessions held in memory as of the end of
    /// their last turns.
    pub fn resident_bytes(&self) -> u64 {
        self.sessions.resident_bytes()
    }

    /// Writes a change, with the idempotency keys of the spans it admits,
    /// and, once the store acknowledges it, applies it to the session in
    /// memory. Cancel-safe: if this future is dropped while the writer
    /// holds the change, the next request reloads from disk.
    pub(crate) async fn persist(
        &self,
        loaded: &mut Loaded,
        change: &Change,
        keys: Vec<(String, SpanId)>,
    ) -> Result<Option<u64>, ApiError> {
        self.persist_held(loaded, change, keys, None).await
    }

    /// [`Broker::persist`], charging the change's text bytes to the
    /// session's tenant, less what `hold` reserved for them (given back
    /// if the write fails).
    #[instrument(name = "commit", skip_all, fields(session_id = %change.record.id, turn = change.record.turns))]
    async fn persist_held(
        &self,
        loaded: &mut Loaded,
        change: &Change,
        keys: Vec<(String, SpanId)>,
        hold: Option<Hold<'_>>,
    ) -> Result<Option<u64>, ApiError> {
        let tenant = tenant::tenant_of(&change.record.id);
        self.quotas.load(&self.store, tenant).await?;
        let delta = match self.quotas.counts_bytes(tenant) {
            true => text_delta(loaded, change),
            false => 0,
        };
        loaded.stale = true;
        let change_write = WriteOp::Change {
            change: change.clone(),
            keys,
        };
        let (ack, seeds) = self.store.write_seeded(change_write).await?;
        loaded.apply(change, &seeds);
        loaded.stale = false;
        self.quotas.settle(tenant, delta, hold);
        Ok(ack.marker_seq)
    }

    /// Turns a rejection into the caller's error, writing the ABORTED
    /// marker of an escalation first.
    async fn reject(&self, loaded: &mut Loaded, rejection: Rejection) -> ApiError {
        let session_id = loaded.session.record.id.clone();
        match rejection {
            Rejection::Escalation {
                sizes,
                violations,
                abort,
            } => {
                let refused = match abort.marker.as_ref().map(|m| m.trigger) {
                    Some(CompactionTrigger::Manual) => Refused::Commit,
                    _ => Refused::Turn,
                };
                match self.persist(loaded, &abort, Vec::new()).await {
                    Ok(seq) => {
                        let marker_seq = seq.unwrap_or(0);
                        warn!(
                            %session_id,
                            seq = marker_seq,
                            live = sizes.live,
                            incoming = sizes.incoming,
                            pinned = sizes.pinned,
                            budget = sizes.budget,
                            "compaction aborted: escalated to the caller"
                        );
                        ApiError::Escalation(Box::new(Escalation {
                            session_id,
                            sizes,
                            violations,
                            marker_seq,
                            refused,
                        }))
                    }
                    Err(err) => err,
                }
            }
            Rejection::ApprovalRequired { plan_id, sizes } => ApiError::ApprovalRequired {
                session_id,
                live: sizes.live,
                incoming: sizes.incoming,
                budget: sizes.budget,
                plan_id: plan_id.to_string(),
            },
            Rejection::StalePlan { planned, current } => ApiError::StalePlan {
                session_id,
                planned,
                current,
            },
            // Every id below the session's next one was given, and a
            // given span is live or archived: one not live is archived.
            // An id the session never gave is not found.
            Rejection::SpanNotLive { span_id }
                if span_id > 0 && span_id < loaded.session.record.next_span_id =>
            {
                ApiError::SpanNotLive {
                    session_id,
                    span_id,
                }
            }
            Rejection::SpanNotLive { span_id } => ApiError::SpanNotFound {
                session_id,
                span_id,
            },
            Rejection::WrongClass { span_id, detail } => ApiError::WrongClass {
                session_id,
                span_id,
                detail,
            },
            Rejection::NothingToCommit => ApiError::NothingToCommit { session_id },
            Rejection::NotRetractable { span_id, detail } => ApiError::NotRetractable {
                session_id,
                span_id,
                detail,
            },
        }
    }

    /// Persists an operation's outcome: the change, or the rejection's
    /// error. For an admission, `keys[i]`, when not empty, is the
    /// idempotency key of the change's i-th appended span.
    ///
    /// The change is boxed before the returned future is made, so that
    /// the futures awaiting it (a request's, which are moved whole) hold a
    /// pointer rather than the change.
    fn carry_out<'a>(
        &'a self,
        loaded: &'a mut Loaded,
        outcome: Result<Change, Rejection>,
        keys: &'a [String],
        hold: Option<Hold<'a>>,
    ) -> impl Future<Output = Result<(Change, Option<u64>), ApiError>> + Send + 'a {
        let outcome = outcome.map(Box::new);
        async move {
            match outcome {
                Ok(change) => {
                    let keyed = keys
                        .iter()
                        .zip(&change.append)
                        .filter(|(key, _)| !key.is_empty())
                        .map(|(key, span)| (key.clone(), span.id))
                        .collect();
                    let seq = self.persist_held(loaded, &change, keyed, hold).await?;
                    let written = keys.iter().zip(&change.append).map(|(key, _)| key.as_str());
                    loaded.note_keys(written.filter(|key| !key.is_empty()));
                    Ok((*change, seq))
                }
                Err(rejection) => Err(self.reject(loaded, rejection).await),
            }
        }
    }

    /// Creates a session.
    pub async fn create_session(
        &self,
        id: &str,
        config: SessionConfig,
    ) -> Result<SessionRecord, ApiError> {
        let session = Session::create(id, config, now_ms());
        let record = session.record.clone();
        let store = &self.store;
        let write = async move {
            store
                .write(WriteOp::CreateSession { record })
                .await
                .map(|_| ())
        };
        let record = self.adopt_session(session, 0, write).await?;
        info!(
            session_id = id,
            window = record.config.window_tokens,
            "session created"
        );
        Ok(record)
    }

    /// A session's record.
    pub async fn session(&self, id: &str) -> Result<SessionRecord, ApiError> {
        let loaded = self.sessions.lock(&self.store, id).await?;
        Ok(loaded.session.record.clone())
    }

    /// Sessions whose full ids start with `prefix` (one tenant's, or all
    /// for an empty prefix), in id order after `after`, at most `limit`.
    pub async fn list_sessions(
        &self,
        prefix: String,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, ApiError> {
        blocking::read(&self.store, move |store| {
            store.sessions_under(&prefix, after.as_deref(), limit)
        })
        .await
    }

    /// Changes a session's configuration to what `update` makes of the
    /// current one, within the session's turn.
    pub async fn update_session(
        &self,
        id: &str,
        update: impl FnOnce(&SessionConfig) -> Result<SessionConfig, ApiError>,
    ) -> Result<SessionRecord, ApiError> {
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        let current = &loaded.session.record;
        let config = update(&current.config)?;
        let budget = u64::from(config.budget_tokens());
        if current.live_tokens > budget {
            return Err(ApiError::ConfigBelowLive {
                live: current.live_tokens,
                budget,
            });
        }
        let mut record = current.clone();
        record.config = config;
        record.revision += 1;
        record.updated_at_ms = now_ms();
        let expected_revision = current.revision;
        loaded.stale = true;
        self.store
            .write(WriteOp::UpdateSession {
                expected_revision,
                record: record.clone(),
            })
            .await?;
        loaded.session.record = record.clone();
        loaded.stale = false;
        self.scheduler.guard(&record);
        info!(
            session_id = id,
            revision = record.revision,
            "session updated"
        );
        Ok(record)
    }

    /// Deletes a session and everything it holds but its markers.
    pub async fn delete_session(&self, id: &str) -> Result<u64, ApiError> {
        let tenant = tenant::tenant_of(id);
        self.quotas.load(&self.store, tenant).await?;
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        // Read before the delete, under the session's turn: what the
        // tenant gets back.
        let bytes = self.counted_bytes(tenant, id).await?;
        loaded.stale = true;
        let ack = self
            .store
            .write(WriteOp::DeleteSession { id: id.to_owned() })
            .await?;
        self.sessions.remove(id, &mut loaded);
        self.session_count.fetch_sub(1, Ordering::SeqCst);
        self.quotas.session_deleted(tenant, bytes);
        self.scheduler.forget(id);
        info!(
            session_id = id,
            spans = ack.spans_deleted,
            "session deleted"
        );
        Ok(ack.spans_deleted)
    }

    /// Takes back the session's newest `count` live spans (0: its newest
    /// turn's), when its revision is `expected_revision` if one is given.
    /// Returns the spans taken back and the record after.
    pub async fn retract(
        &self,
        id: &str,
        count: usize,
        expected_revision: Option<u64>,
    ) -> Result<(Vec<Span>, SessionRecord), ApiError> {
        let tenant = tenant::tenant_of(id);
        self.quotas.load(&self.store, tenant).await?;
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        check_expected(&loaded, expected_revision)?;
        let retraction = match loaded.session.retract(count, now_ms()) {
            Ok(retraction) => retraction,
            Err(rejection) => return Err(self.reject(&mut loaded, rejection).await),
        };
        let freed: i64 = (retraction.spans.iter())
            .map(|s| i64::try_from(ctxbroker_store::text_bytes(s)).unwrap_or(i64::MAX))
            .sum();
        loaded.stale = true;
        self.store
            .write(WriteOp::Retract {
                expected_revision: retraction.expected_revision,
                record: retraction.record.clone(),
                spans: retraction.spans.clone(),
            })
            .await?;
        loaded.apply_retraction(&retraction);
        loaded.stale = false;
        if self.quotas.counts_bytes(tenant) {
            self.quotas.settle(tenant, -freed, None);
        }
        let record = loaded.session.record.clone();
        info!(
            session_id = id,
            spans = retraction.spans.len(),
            revision = record.revision,
            "spans taken back"
        );
        Ok((retraction.spans, record))
    }

    /// The text bytes session `id` holds in the store, when its tenant's
    /// storage is counted (0 otherwise): what emptying it gives back. Read
    /// under the session's turn.
    async fn counted_bytes(&self, tenant: Option<&str>, id: &str) -> Result<u64, ApiError> {
        if !self.quotas.counts_bytes(tenant) {
            return Ok(0);
        }
        let owned = id.to_owned();
        blocking::read(&self.store, move |store| store.session_text_bytes(&owned)).await
    }

    /// Empties a session, keeping its configuration and counters, when
    /// its revision is `expected_revision` if one is given. Returns the
    /// record after and the spans removed, live and archived.
    pub async fn reset_session(
        &self,
        id: &str,
        expected_revision: Option<u64>,
    ) -> Result<(SessionRecord, u64), ApiError> {
        let tenant = tenant::tenant_of(id);
        self.quotas.load(&self.store, tenant).await?;
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        check_expected(&loaded, expected_revision)?;
        let bytes = self.counted_bytes(tenant, id).await?;
        let record = loaded.session.reset(now_ms());
        loaded.stale = true;
        let ack = self
            .store
            .write(WriteOp::ResetSession {
                expected_revision: loaded.session.record.revision,
                record: record.clone(),
            })
            .await?;
        loaded.apply_reset(record.clone());
        loaded.stale = false;
        self.quotas
            .settle(tenant, -i64::try_from(bytes).unwrap_or(i64::MAX), None);
        info!(
            session_id = id,
            spans = ack.spans_deleted,
            revision = record.revision,
            "session reset"
        );
        Ok((record, ack.spans_deleted))
    }

    /// Adds a session that `write` stores whole: a new one
    /// ([`Broker::create_session`]) or one made elsewhere (an imported
    /// snapshot, see `transfer`, holding `text_bytes` of span text). The
    /// id must be free, the session counts against `max_sessions` and its
    /// tenant's `max_sessions` and `max_stored_bytes` quotas (reserved
    /// before `write` runs, so concurrent adds cannot overshoot them), and
    /// once written it is served from memory
    /// like any other, with its staleness guard and, when it stands above
    /// its soft watermark with a turn since its last compaction, the
    /// background pre-compaction its own server would have queued.
    pub async fn adopt_session(
        &self,
        session: Session,
        text_bytes: u64,
        write: impl Future<Output = Result<(), ctxbroker_store::StoreError>>,
    ) -> Result<SessionRecord, ApiError> {
        let id = session.record.id.clone();
        let tenant = tenant::tenant_of(&id);
        self.quotas.load(&self.store, tenant).await?;
        let mut slot = self.sessions.lock_for_create(&id).await;
        if slot.is_some() {
            return Err(ApiError::SessionExists(id));
        }
        // Given back if anything below fails.
        let hold = self.quotas.reserve_session(tenant, text_bytes)?;
        let max = self.limits.max_sessions;
        if self.session_count.fetch_add(1, Ordering::SeqCst) >= max {
            self.session_count.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::SessionLimit { max });
        }
        if let Err(err) = write.await {
            self.session_count.fetch_sub(1, Ordering::SeqCst);
            return Err(err.into());
        }
        hold.keep();
        let record = session.record.clone();
        self.sessions
            .remember_tokenizer(&id, record.config.tokenizer);
        *slot = Some(Loaded::new(session));
        drop(slot);
        self.scheduler.guard(&record);
        self.scheduler.queue_soft(&record);
        Ok(record)
    }

    /// The live context with relevance as of the latest turn.
    pub async fn context(&self, id: &str) -> Result<(SessionRecord, Vec<(Span, f64)>), ApiError> {
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        let scores = loaded.session.relevance();
        let spans = loaded.session.spans.iter().cloned().zip(scores).collect();
        Ok((loaded.session.record.clone(), spans))
    }

    /// One span, live or archived.
    pub async fn span(&self, id: &str, span_id: u64) -> Result<StoredSpan, ApiError> {
        let loaded = self.sessions.lock(&self.store, id).await?;
        if let Some(span) = loaded.session.spans.iter().find(|s| s.id == span_id) {
            return Ok(StoredSpan {
                span: span.clone(),
                state: SpanState::Live,
            });
        }
        let owned = id.to_owned();
        let stored = blocking::read(&self.store, move |store| store.span(&owned, span_id));
        match stored.await? {
            Some(stored) => Ok(stored),
            None => Err(ApiError::SpanNotFound {
                session_id: id.to_owned(),
                span_id,
            }),
        }
    }

    /// Admits one turn. Counting happens before the session's turn is
    /// taken; classifying unlabelled user and system spans (under the
    /// session's mode), the decision, the write and the memory update
    /// happen within it.
    ///
    /// The tenant's admission rate is checked first, before anything else
    /// is done: a turn refused for it takes no turn of the session and
    /// spends no idempotency key. Its stored bytes are checked within the
    /// turn, after a replay (which stores nothing) is answered and before
    /// anything is written.
    pub async fn admit(&self, id: &str, inputs: Vec<TurnSpan>) -> Result<Admitted, ApiError> {
        let tenant = tenant::tenant_of(id);
        self.quotas.admit(tenant)?;
        let tokenizer = self.sessions.tokenizer(&self.store, id).await?;
        let keys: Vec<String> = inputs
            .iter()
            .map(|input| input.idempotency_key.clone())
            .collect();
        let keyed = keys.iter().any(|key| !key.is_empty());
        let mut incoming = prepare(inputs, tokenizer).await?;
        self.quotas.load(&self.store, tenant).await?;

        let mut loaded = self.sessions.lock(&self.store, id).await?;
        let actual = loaded.session.record.config.tokenizer;
        if actual != tokenizer {
            // Deleted and created again with another tokenizer while this
            // turn was being counted.
            self.sessions.remember_tokenizer(id, actual);
            if actual == TokenizerKind::Client || tokenizer == TokenizerKind::Client {
                return Err(ApiError::StaleRevision {
                    session_id: id.to_owned(),
                    expected: 0,
                    actual: loaded.session.record.revision,
                });
            }
            let counter = tokens::counter(actual);
            for span in &mut incoming {
                span.tokens = counter.count(&span.text);
            }
        }
        if keyed && let Some(replay) = self.replay(&mut loaded, &incoming, &keys).await? {
            info!(
                session_id = id,
                turn = replay.turn,
                "turn replayed for its idempotency keys"
            );
            return Ok(replay);
        }
        let bytes = incoming.iter().map(|span| span.text.len() as u64).sum();
        let hold = self.quotas.reserve_bytes(tenant, bytes)?;
        let counter = tokens::counter(actual);
        let turn = loaded.session.record.turns + 1;
        let outcome = info_span!("plan", session_id = id, turn)
            .in_scope(|| loaded.session.admit(incoming, now_ms(), counter));
        let (change, seq) = self
            .carry_out(&mut loaded, outcome, &keys, Some(hold))
            .await?;
        let marker = change.marker.map(|mut marker| {
            marker.seq = seq.unwrap_or(0);
            info!(
                session_id = id,
                seq = marker.seq,
                evicted = marker.evicted.len(),
                compressed = marker.compressed.len(),
                tokens_before = marker.tokens_before,
                tokens_after = marker.tokens_after,
                incoming = marker.incoming_tokens,
                "compaction committed"
            );
            marker
        });
        let record = loaded.session.record.clone();
        // Make room in the background, so that the admission that crosses
        // the budget usually finds it made.
        self.scheduler.queue_soft(&record);
        Ok(Admitted {
            spans: change
                .append
                .into_iter()
                .map(|span| (span, SpanState::Live))
                .collect(),
            turn: record.turns,
            replayed: false,
            marker,
            record,
        })
    }

    /// The original admission of a turn whose every span carries an
    /// idempotency key the session has admitted before, with the same role
    /// and text, in the same order, as one turn. `None` when no key was
    /// admitted before; INVALID_ARGUMENT, naming each key, when some were
    /// and the turn is not exactly their retry.
    ///
    /// Answered from the session's [`KeyFilter`] when no key may have been
    /// admitted (read from the store once, on the first keyed turn after
    /// the session is loaded); the store is read only for possible
    /// repeats.
    async fn replay(
        &self,
        loaded: &mut Loaded,
        incoming: &[Incoming],
        keys: &[String],
    ) -> Result<Option<Admitted>, ApiError> {
        let id = loaded.session.record.id.clone();
        if loaded.keys().is_none() {
            let read_id = id.clone();
            let stored =
                blocking::read(&self.store, move |store| store.idempotency_keys(&read_id)).await?;
            loaded.know_keys(KeyFilter::of(stored.iter().map(String::as_str)));
        }
        if let Some(filter) = loaded.keys()
            && !keys
                .iter()
                .any(|key| !key.is_empty() && filter.may_hold(key))
        {
            return Ok(None);
        }
        let keys = keys.to_vec();
        let found =
            blocking::read(&self.store, move |store| store.spans_by_keys(&id, &keys)).await?;
        if found.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut bad = Vec::new();
        let first = found.iter().flatten().next().map(|s| s.span.id);
        let turn = found.iter().flatten().next().map(|s| s.span.turn);
        for (i, (stored, given)) in found.iter().zip(incoming).enumerate() {
            let field = format!("spans[{i}].idempotency_key");
            let Some(stored) = stored else {
                bad.push(BadField::new(
                    field,
                    "is new, but other keys of this turn were admitted before: a retry resends the whole turn, a new turn takes new keys",
                ));
                continue;
            };
            let span = &stored.span;
            let text = span
                .original
                .as_ref()
                .map_or(span.text.as_str(), |o| o.text.as_str());
            let in_place = Some(span.id) == first.map(|f| f + i as u64) && Some(span.turn) == turn;
            if span.role != given.role || text != given.text || !in_place {
                bad.push(BadField::new(
                    field,
                    format!(
                        "was used in this session for span {} (turn {}) with another role, text or place in its turn",
                        span.id, span.turn
                    ),
                ));
            }
        }
        validate::finish(bad)?;
        let record = loaded.session.record.clone();
        Ok(Some(Admitted {
            turn: turn.unwrap_or(0),
            spans: found
                .into_iter()
                .flatten()
                .map(|stored| (stored.span, stored.state))
                .collect(),
            replayed: true,
            marker: None,
            record,
        }))
    }

    /// A dry run of a compaction, bound to the session's revision.
    #[instrument(name = "plan", skip_all, fields(session_id = id, turn = Empty))]
    pub async fn plan(
        &self,
        id: &str,
        incoming_tokens: u64,
        target_tokens: Option<u64>,
    ) -> Result<(SessionRecord, PlanOutcome), ApiError> {
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        TraceSpan::current().record("turn", loaded.session.record.turns);
        let counter = tokens::counter(loaded.session.record.config.tokenizer);
        let outcome = loaded
            .session
            .plan(incoming_tokens, target_tokens, now_ms(), counter);
        Ok((loaded.session.record.clone(), outcome))
    }

    /// Commits a plan with the caller's edits.
    pub async fn commit(
        &self,
        id: &str,
        plan_id: PlanId,
        edits: CallerEdits,
    ) -> Result<Committed, ApiError> {
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        let counter = tokens::counter(loaded.session.record.config.tokenizer);
        let turn = loaded.session.record.turns;
        let outcome = info_span!("verify", session_id = id, turn)
            .in_scope(|| loaded.session.commit(plan_id, &edits, now_ms(), counter));
        if outcome.is_ok() && ctxbroker_store::fault("broker::between_plan_and_commit") {
            return Err(ApiError::Internal(
                "injected fault between plan and commit".into(),
            ));
        }
        let (change, seq) = self.carry_out(&mut loaded, outcome, &[], None).await?;
        Ok(self.committed(&loaded, change, seq, "compaction committed by the caller"))
    }

    /// Marks a live span as a constraint.
    pub async fn pin(
        &self,
        id: &str,
        span_id: SpanId,
        predicate: CallerPredicate,
    ) -> Result<Committed, ApiError> {
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        // The terms are checked against the text the span was admitted in
        // (a span not live is refused by the session below).
        if let Some(span) = loaded.session.spans.iter().find(|s| s.id == span_id) {
            let text = span
                .original
                .as_ref()
                .map_or(span.text.as_str(), |o| o.text.as_str());
            let mut bad = Vec::new();
            validate::required_terms("predicate", &predicate.required_terms, text, &mut bad);
            validate::finish(bad)?;
        }
        let outcome = loaded.session.pin(
            span_id,
            predicate.modality,
            predicate.required_terms,
            now_ms(),
        );
        let (change, seq) = self.carry_out(&mut loaded, outcome, &[], None).await?;
        info!(session_id = id, span_id, "span pinned");
        Ok(self.committed(&loaded, change, seq, "span pinned"))
    }

    /// Releases a constraint, recording who and why in an UNPIN marker.
    pub async fn unpin(
        &self,
        id: &str,
        span_id: SpanId,
        actor: &str,
        reason: &str,
    ) -> Result<Committed, ApiError> {
        let mut loaded = self.sessions.lock(&self.store, id).await?;
        let outcome = loaded.session.unpin(span_id, actor, reason, now_ms());
        let (change, seq) = self.carry_out(&mut loaded, outcome, &[], None).await?;
        Ok(self.committed(&loaded, change, seq, "constraint unpinned"))
    }

    fn committed(
        &self,
        loaded: &Loaded,
        change: Change,
        seq: Option<u64>,
        what: &str,
    ) -> Committed {
        let marker = change.marker.map(|mut marker| {
            marker.seq = seq.unwrap_or(0);
            info!(
                session_id = %marker.session_id,
                seq = marker.seq,
                trigger = ?marker.trigger,
                actor = %marker.actor,
                "{what}"
            );
            marker
        });
        Committed {
            marker,
            record: loaded.session.record.clone(),
            replaced: change.replace,
        }
    }

    /// Runs the background work (see [`Scheduler`]) until `shutdown`.
    pub async fn run_background(self: Arc<Self>, shutdown: CancellationToken) {
        self.scheduler.run(&self, shutdown).await;
    }
}

/// Refuses a request made against another revision than the session's.
fn check_expected(loaded: &Loaded, expected: Option<u64>) -> Result<(), ApiError> {
    let actual = loaded.session.record.revision;
    match expected {
        Some(expected) if expected != actual => Err(ApiError::StaleRevision {
            session_id: loaded.session.record.id.clone(),
            expected,
            actual,
        }),
        _ => Ok(()),
    }
}

/// The change in the text bytes a session holds that `change` makes:
/// appended spans and a summary add theirs; a span rewritten in place
/// (compressed, pinned) adds the difference; an evicted span keeps its
/// bytes, in the archive.
fn text_delta(loaded: &Loaded, change: &Change) -> i64 {
    let bytes = |span: &Span| i64::try_from(ctxbroker_store::text_bytes(span)).unwrap_or(i64::MAX);
    let mut delta: i64 = change.append.iter().map(bytes).sum();
    delta += change.summary.as_ref().map_or(0, bytes);
    for new in &change.replace {
        let old = loaded
            .session
            .spans
            .iter()
            .find(|span| span.id == new.id)
            .map_or(0, bytes);
        delta += bytes(new) - old;
    }
    delta
}

/// Counts and classifies a turn's spans. Runs before the session's turn is
/// taken; large texts are counted on the blocking pool.
async fn prepare(
    inputs: Vec<TurnSpan>,
    tokenizer: TokenizerKind,
) -> Result<Vec<Incoming>, ApiError> {
    validate::token_counts(&inputs, tokenizer)?;
    let large = inputs.iter().map(|s| s.text.len()).sum::<usize>() >= BLOCKING_COUNT_BYTES;
    if large {
        tokio::task::spawn_blocking(move || prepare_now(inputs, tokenizer))
            .await
            .map_err(|err| ApiError::Internal(format!("token counting failed: {err}")))
    } else {
        Ok(prepare_now(inputs, tokenizer))
    }
}

fn prepare_now(inputs: Vec<TurnSpan>, tokenizer: TokenizerKind) -> Vec<Incoming> {
    let counter = tokens::counter(tokenizer);
    inputs
        .into_iter()
        .map(|input| {
            let tokens = input.tokens(tokenizer, counter);
            input.labelled(tokens)
        })
        .collect()
}

/// Shared ownership of the broker by services and background tasks.
pub type SharedBroker = Arc<Broker>;
#[cfg(test)]
mod tests {
    use super::*;

    /// A request's futures are moved whole (into the server's box, and by
    /// each `async fn` awaiting the next), so each byte of an admission's
    /// future is copied several times per request. The write and the
    /// change travel boxed; an admission's future was 10,440 bytes before
    /// they did and is about 1,600 after.
    #[tokio::test]
    async fn an_admissions_future_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let broker = Broker::new(store, Limits::default());
        let admission = broker.admit("s", Vec::new());
        let size = std::mem::size_of_val(&admission);
        assert!(size <= 4096, "an admission's future takes {size} bytes");
        let write = broker
            .store()
            .write_seeded(WriteOp::DeleteSession { id: "s".into() });
        let size = std::mem::size_of_val(&write);
        assert!(size <= 1024, "a write's future takes {size} bytes");
    }
}
