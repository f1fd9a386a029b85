//! The registry of sessions held in memory, and per-session serialisation:
//! one async mutex per session, so that a session's requests take turns
//! while sessions proceed in parallel.
//!
//! # The resident set
//!
//! A session is loaded from the store on its first request and kept in
//! memory between requests, so that its next request needs no read. The
//! sessions kept are bounded by an estimate of their bytes (the setting
//! `session_cache_bytes`): when a request's turn ends and the idle
//! sessions in memory exceed it, the least recently used ones are dropped
//! from memory. Only a session nobody holds or waits for is dropped, so a
//! request never loses its turn to eviction. A dropped session is
//! reloaded from the store on its next request, exactly: memory only ever
//! holds what the store acknowledged (`Session::new(record, live spans)`).
//!
//! # Admission
//!
//! Least-recently-used alone fails badly when the sessions in use
//! together are a little more than the cache holds: clients that take
//! turns over them evict, at each turn, the very session the next turn
//! needs, and every request reloads. So a session just loaded must earn
//! its place: the registry counts each id's turns over a recent window
//! (older counts are halved as the window passes), and when a session
//! that was not in memory ends its turn with the cache over its budget,
//! it stays only if it was used more often than the idle session it
//! would displace, the least recently used one. Otherwise it leaves
//! memory itself as its turn ends (unless another request already waits
//! for it), and the sessions already in memory keep serving. Sessions in
//! steady use thus stay, and the ones beyond the budget are the ones
//! that reload.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::facts::LiveFacts;
use ctxbroker_core::session::{Change, Retraction, Session, SessionRecord};
use ctxbroker_core::span::{Span, SpanId};
use ctxbroker_core::trigger;
use ctxbroker_store::Store;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Mutex as AsyncMutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use crate::blocking;
use crate::error::ApiError;
use crate::idempotency::KeyFilter;

/// The default of `session_cache_bytes`, a quarter of the default
/// `memory_budget_bytes`: 64 MiB of idle sessions, about a hundred
/// sessions of a thousand 400-byte spans.
pub const DEFAULT_SESSION_CACHE_BYTES: u64 =
    crate::config::MemoryShares::of(crate::config::DEFAULT_MEMORY_BUDGET_BYTES).sessions;

/// A session as the server holds it between requests, mirroring what the
/// store acknowledged.
#[derive(Debug)]
pub struct Loaded {
    /// The policy's view: the record and the live spans in prompt order.
    pub session: Session,
    /// Set when a write failed and memory may differ from disk: the next
    /// request reloads from the store.
    pub stale: bool,
    /// Set when the session was deleted: holders of the old slot retry with
    /// a fresh one.
    pub gone: bool,
    /// The revision and result of the last estimate of `session`'s record
    /// and spans ([`spans_estimate`]): a read-only turn leaves the session
    /// as it was and is not estimated again, and a change that only
    /// appends adds its spans to it (see [`Loaded::apply`]).
    estimated: Option<(u64, u64)>,
    /// The session's idempotency keys, once read from the store, or known
    /// to be none: `None` until a keyed turn first needs them. Every key
    /// the session writes after is added (see [`KeyFilter`]).
    keys: Option<KeyFilter>,
}

impl Loaded {
    /// A session as the store acknowledged it. A key always names a span
    /// the session holds, live or archived, so a session that holds none
    /// (one just created) is known to have no key.
    pub fn new(session: Session) -> Self {
        let holds_no_span = session.spans.is_empty() && session.record.archived_spans == 0;
        Loaded {
            stale: false,
            gone: false,
            estimated: None,
            keys: holds_no_span.then(KeyFilter::default),
            session,
        }
    }

    /// The session's idempotency keys, when known.
    pub fn keys(&self) -> Option<&KeyFilter> {
        self.keys.as_ref()
    }

    /// Adopts the keys read from the store.
    pub fn know_keys(&mut self, keys: KeyFilter) {
        self.keys = Some(keys);
    }

    /// Notes keys the store acknowledged writing (no-op while the keys are
    /// not known: they are read whole when first needed).
    pub fn note_keys<'a>(&mut self, keys: impl IntoIterator<Item = &'a str>) {
        if let Some(filter) = self.keys.as_mut() {
            for key in keys {
                filter.insert(key);
            }
        }
    }

    /// The estimated bytes the session holds as its turn ends: 0 once it
    /// is deleted, the last estimate while its revision is unchanged and
    /// memory mirrors the store, a fresh one otherwise.
    fn bytes(&mut self) -> u64 {
        if self.gone {
            return 0;
        }
        let revision = self.session.record.revision;
        let spans = match self.estimated {
            Some((at, bytes)) if at == revision && !self.stale => bytes,
            _ => {
                let bytes = spans_estimate(&self.session);
                self.estimated = Some((revision, bytes));
                bytes
            }
        };
        spans + facts_estimate(&self.session) + self.keys.as_ref().map_or(0, KeyFilter::heap_bytes)
    }

    /// Adopts a retraction the store acknowledged; the estimate is made
    /// afresh.
    pub fn apply_retraction(&mut self, retraction: &Retraction) {
        self.session.apply_retraction(retraction);
        self.estimated = None;
    }

    /// Adopts a reset the store acknowledged.
    pub fn apply_reset(&mut self, record: SessionRecord) {
        self.session.apply_reset(record);
        self.estimated = None;
        // A reset deletes every key with the spans.
        self.keys = Some(KeyFilter::default());
    }

    /// Adopts a change the store acknowledged (`Session::apply_seeded`,
    /// with the seeds of its new spans' facts the store returned). A
    /// change that only appends spans updates the estimate by what it
    /// adds, so that a turn that fits costs the size of the turn here too;
    /// any other leaves the estimate to be made afresh.
    pub fn apply(&mut self, change: &Change, seeds: &[(SpanId, Vec<u8>)]) {
        let appends_only =
            change.evict.is_empty() && change.replace.is_empty() && change.summary.is_none();
        let current = self
            .estimated
            .filter(|&(at, _)| at == self.session.record.revision && appends_only);
        let capacity = self.session.spans.capacity();
        self.session.apply_seeded(change, seeds);
        self.estimated = current.map(|(_, bytes)| {
            let span = size_of::<Span>();
            let grown = heap(self.session.spans.capacity() * span) as u64;
            let added: usize = change.append.iter().map(span_heap).sum();
            let revision = self.session.record.revision;
            (
                revision,
                bytes.saturating_sub(heap(capacity * span) as u64) + grown + added as u64,
            )
        });
    }
}

type Slot = Arc<AsyncMutex<Option<Loaded>>>;

/// One id's place in the registry.
#[derive(Debug)]
struct Entry {
    slot: Slot,
    /// The estimated bytes of the session in the slot as of the end of its
    /// last turn; 0 while empty.
    bytes: u64,
    /// Its key in `Registry::order`.
    used: u64,
}

/// The slots, and the order in which they were last used.
#[derive(Debug, Default)]
struct Registry {
    entries: HashMap<String, Entry>,
    /// Ids by the tick of their last use, least recent first.
    order: BTreeMap<u64, String>,
    /// The next tick.
    tick: u64,
    /// The sum of the entries' `bytes`.
    bytes: u64,
    /// How often each id's turns ended recently, in memory or not.
    uses: Uses,
    /// Where the cache's loads, drops and size are reported, once set.
    probe: Option<CacheProbe>,
}

/// The session cache's metrics, fed as sessions come and go: loads from
/// the store, idle sessions let go to stay within the budget, and the
/// estimated bytes held. What an operator sizes `session_cache_bytes` by:
/// loads that keep pace with admissions mean the sessions in use do not
/// fit, and each reload reads the session and, at its next compaction,
/// derives its facts again.
#[derive(Debug, Clone, Default)]
pub struct CacheProbe {
    /// Sessions read from the store into memory.
    pub loads: Counter,
    /// Idle sessions dropped from memory by the cache.
    pub let_go: Counter,
    /// The estimated bytes of the sessions in memory.
    pub bytes: Gauge,
}

/// Recent turns per id: what a session just loaded is weighed by against
/// the session it would displace. Every count is halved, and ids whose
/// count falls to zero forgotten, once the turns counted since the last
/// halving reach a window proportional to the sessions in memory, so the
/// map stays about that size and old habits fade.
#[derive(Debug, Default)]
struct Uses {
    counts: HashMap<String, u32>,
    /// Turns counted since the last halving.
    since_halving: u64,
}

impl Uses {
    /// The fewest turns between two halvings.
    const MIN_WINDOW: u64 = 1024;
    /// Turns between two halvings per session in memory.
    const WINDOW_PER_ENTRY: u64 = 8;

    fn count(&self, id: &str) -> u32 {
        self.counts.get(id).copied().unwrap_or(0)
    }

    /// Counts a turn of `id`, with `resident` sessions in memory.
    fn record(&mut self, id: &str, resident: usize) {
        match self.counts.get_mut(id) {
            Some(count) => *count = count.saturating_add(1),
            None => {
                self.counts.insert(id.to_owned(), 1);
            }
        }
        self.since_halving += 1;
        let window = (resident as u64)
            .saturating_mul(Self::WINDOW_PER_ENTRY)
            .max(Self::MIN_WINDOW);
        if self.since_halving >= window {
            self.since_halving = 0;
            self.counts.retain(|_, count| {
                *count /= 2;
                *count > 0
            });
        }
    }

    fn forget(&mut self, id: &str) {
        self.counts.remove(id);
    }
}

impl Registry {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The slot for `id`, created empty when absent.
    fn slot(&mut self, id: &str) -> Slot {
        if let Some(entry) = self.entries.get(id) {
            return Arc::clone(&entry.slot);
        }
        let used = self.next_tick();
        let slot: Slot = Arc::new(AsyncMutex::new(None));
        self.order.insert(used, id.to_owned());
        self.entries.insert(
            id.to_owned(),
            Entry {
                slot: Arc::clone(&slot),
                bytes: 0,
                used,
            },
        );
        slot
    }

    /// Removes `id`'s entry when it is still `slot` (or any slot, when
    /// `slot` is `None`).
    fn remove(&mut self, id: &str, slot: Option<&Slot>) -> bool {
        let held = self
            .entries
            .get(id)
            .is_some_and(|entry| slot.is_none_or(|slot| Arc::ptr_eq(&entry.slot, slot)));
        if !held {
            return false;
        }
        let Some(entry) = self.entries.remove(id) else {
            return false;
        };
        self.order.remove(&entry.used);
        self.bytes -= entry.bytes;
        self.report();
        true
    }

    /// Reports the bytes held to the probe, if any.
    fn report(&self) {
        if let Some(probe) = &self.probe {
            probe
                .bytes
                .set(i64::try_from(self.bytes).unwrap_or(i64::MAX));
        }
    }

    /// Counts sessions the cache let go.
    fn let_go(&self, sessions: u64) {
        if let Some(probe) = &self.probe {
            probe.let_go.inc_by(sessions);
        }
    }

    /// Removes `id`'s entry when it is `slot` and nobody but the registry
    /// and the caller (who holds `slot`) refers to it.
    fn remove_unused(&mut self, id: &str, slot: &Slot) {
        if Arc::strong_count(slot) == 2 && self.remove(id, Some(slot)) {
            self.let_go(1);
        }
    }

    /// Records the end of a turn on `slot`: its session's size, `bytes`
    /// (estimated by the caller, before taking the registry's lock), and
    /// that it is now the most recently used; then drops idle sessions,
    /// least recently used first, while over `budget`. True when the
    /// session was not in memory before this turn and has not earned a
    /// place over the idle session it would displace (see the module
    /// documentation): the caller then drops it with
    /// [`Registry::remove_unused`] once its turn is released (a request
    /// waiting for it keeps it).
    fn release(&mut self, id: &str, slot: &Slot, bytes: u64, budget: u64) -> bool {
        let used = self.next_tick();
        let resident = self.entries.len();
        self.uses.record(id, resident);
        let Some(entry) = self.entries.get_mut(id) else {
            return false;
        };
        if !Arc::ptr_eq(&entry.slot, slot) {
            // Deleted (and maybe created again) meanwhile.
            return false;
        }
        let loaded = entry.bytes == 0 && bytes > 0;
        self.bytes = self.bytes - entry.bytes + bytes;
        entry.bytes = bytes;
        let previous = std::mem::replace(&mut entry.used, used);
        // The id moves to its new place in the order without a copy.
        let name = self
            .order
            .remove(&previous)
            .unwrap_or_else(|| id.to_owned());
        self.order.insert(used, name);
        self.report();
        if loaded && self.bytes > budget && !self.admits(id) {
            // Leaves as its turn ends: the others need only make room
            // for what stays.
            self.evict(budget.saturating_add(bytes));
            return true;
        }
        self.evict(budget);
        false
    }

    /// Whether `id`, just loaded, was used more often recently than the
    /// idle session it would displace. With no idle session to displace
    /// it stays: nothing would be gained by dropping it.
    fn admits(&self, id: &str) -> bool {
        let victim = self.order.values().find(|other| {
            other.as_str() != id
                && self
                    .entries
                    .get(other.as_str())
                    .is_some_and(|entry| entry.bytes > 0 && Arc::strong_count(&entry.slot) == 1)
        });
        match victim {
            Some(victim) => self.uses.count(id) > self.uses.count(victim),
            None => true,
        }
    }

    /// Drops idle sessions, least recently used first, until the resident
    /// bytes are within `budget` or no idle session is left. A slot only
    /// the registry refers to is idle: whoever holds or waits for a turn
    /// holds a reference, and references are only taken under the
    /// registry's lock, which the caller holds.
    fn evict(&mut self, budget: u64) {
        if self.bytes <= budget {
            return;
        }
        let mut idle = Vec::new();
        let mut freed = 0;
        for id in self.order.values() {
            if self.bytes - freed <= budget {
                break;
            }
            if let Some(entry) = self.entries.get(id)
                && Arc::strong_count(&entry.slot) == 1
            {
                freed += entry.bytes;
                idle.push(id.clone());
            }
        }
        let mut dropped = 0;
        for id in idle {
            dropped += u64::from(self.remove(&id, None));
        }
        self.let_go(dropped);
    }
}

/// A word of allocator overhead per allocation.
const ALLOCATION: usize = 16;

/// The heap an allocation of `capacity` bytes takes, about.
fn heap(capacity: usize) -> usize {
    if capacity == 0 {
        0
    } else {
        capacity + ALLOCATION
    }
}

/// The heap of a list of strings.
fn strings(list: &[String]) -> usize {
    heap(size_of_val(list)) + list.iter().map(|s| heap(s.len())).sum::<usize>()
}

/// The heap a span owns: its text and everything else it holds.
fn span_heap(span: &Span) -> usize {
    let mut bytes = heap(span.text.capacity()) + heap(span.classification.rule.capacity());
    if let Some(predicate) = &span.predicate {
        bytes += strings(&predicate.required_terms);
    }
    if let Some(summary) = &span.summary {
        bytes += heap(size_of_val(summary.covers.as_slice())) + strings(&summary.anchors);
    }
    if let Some(original) = &span.original {
        bytes += heap(original.text.capacity());
    }
    if let Some(attributes) = &span.attributes {
        // The box, its two strings, and per metadata entry a B-tree slot
        // (two strings' structs) and the strings' text.
        bytes += heap(size_of_val(attributes.as_ref()))
            + heap(attributes.tool_call_id.capacity())
            + heap(attributes.tool_name.capacity())
            + attributes
                .metadata
                .iter()
                .map(|(k, v)| 2 * size_of::<String>() + heap(k.capacity()) + heap(v.capacity()))
                .sum::<usize>();
    }
    bytes
}

/// An estimate of the heap a session's record and spans hold: the span
/// structs, their texts and everything else they own, with a word of
/// allocator overhead per allocation. Walks the spans.
fn spans_estimate(session: &Session) -> u64 {
    let record = size_of::<Loaded>() + heap(session.record.id.len()) + 256;
    let spans = heap(session.spans.capacity() * size_of::<Span>())
        + session.spans.iter().map(span_heap).sum::<usize>();
    (record + spans) as u64
}

/// What the session derived from its spans for compaction, if it did, or
/// the stored seeds it will derive it from: both kept as they change, so
/// it costs nothing per span.
fn facts_estimate(session: &Session) -> u64 {
    (session.derived_facts().map_or(0, LiveFacts::heap_bytes) + session.seed_bytes()) as u64
}

/// An estimate of the heap a session holds: its record and spans, and
/// what it derived from them for compaction.
#[cfg(test)]
fn estimate(session: &Session) -> u64 {
    spans_estimate(session) + facts_estimate(session)
}

/// The session's turn: while it is held, no other request of the same
/// session runs. When it ends, the session counts as the most recently
/// used, and idle sessions beyond the cache's budget leave memory.
#[derive(Debug)]
pub struct SessionGuard {
    guard: OwnedMappedMutexGuard<Option<Loaded>, Loaded>,
    release: Release,
}

/// The turn of an id that may not exist yet, for creation: `None` inside
/// when no session is held in memory (the store decides whether it
/// exists).
#[derive(Debug)]
pub struct CreateGuard {
    guard: OwnedMutexGuard<Option<Loaded>>,
    release: Release,
}

/// What a turn's end updates. Declared after the guard in the guards
/// that own it, so that it drops after the session's lock is released.
#[derive(Debug)]
struct Release {
    registry: Arc<Mutex<Registry>>,
    id: String,
    slot: Slot,
    budget: u64,
    /// Set when the session was not admitted to the cache as its turn
    /// ended: it leaves memory once the lock is released.
    unadmitted: bool,
}

impl Release {
    /// Runs while the turn is still held (the guard is dropped after): the
    /// estimate sees the session as the turn left it, and eviction, which
    /// only takes slots nobody refers to, never takes this one. The
    /// estimate walks the session's spans, so it is made before the
    /// registry's lock, which every session's turns share, is taken.
    fn run(&mut self, held: Option<&mut Loaded>) {
        let bytes = held.map_or(0, Loaded::bytes);
        self.unadmitted = lock(&self.registry).release(&self.id, &self.slot, bytes, self.budget);
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.unadmitted {
            lock(&self.registry).remove_unused(&self.id, &self.slot);
        }
    }
}

impl Deref for SessionGuard {
    type Target = Loaded;

    fn deref(&self) -> &Loaded {
        &self.guard
    }
}

impl DerefMut for SessionGuard {
    fn deref_mut(&mut self) -> &mut Loaded {
        &mut self.guard
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.release.run(Some(&mut self.guard));
    }
}

impl Deref for CreateGuard {
    type Target = Option<Loaded>;

    fn deref(&self) -> &Option<Loaded> {
        &self.guard
    }
}

impl DerefMut for CreateGuard {
    fn deref_mut(&mut self) -> &mut Option<Loaded> {
        &mut self.guard
    }
}

impl Drop for CreateGuard {
    fn drop(&mut self) {
        self.release.run(self.guard.as_mut());
    }
}

/// Locks a mutex, taking it over when a panic poisoned it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The sessions held in memory, loaded on first use, the idle ones bounded
/// by an estimate of their bytes.
#[derive(Debug)]
pub struct Sessions {
    registry: Arc<Mutex<Registry>>,
    /// Bytes of sessions kept in memory between requests.
    budget: u64,
    /// Each known session's tokenizer, fixed at creation: a turn is counted
    /// before its session's turn is taken, without waiting for the lock.
    tokenizers: Mutex<HashMap<String, TokenizerKind>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::new(DEFAULT_SESSION_CACHE_BYTES)
    }
}

impl Sessions {
    /// A registry that keeps about `cache_bytes` of idle sessions in
    /// memory.
    pub fn new(cache_bytes: u64) -> Self {
        Sessions {
            registry: Arc::default(),
            budget: cache_bytes,
            tokenizers: Mutex::default(),
        }
    }

    /// Reports the cache's loads, drops and size to `probe` from now on.
    pub fn observe(&self, probe: CacheProbe) {
        let mut registry = lock(&self.registry);
        probe
            .bytes
            .set(i64::try_from(registry.bytes).unwrap_or(i64::MAX));
        registry.probe = Some(probe);
    }

    fn slot(&self, id: &str) -> Slot {
        lock(&self.registry).slot(id)
    }

    fn release(&self, id: &str, slot: &Slot) -> Release {
        Release {
            registry: Arc::clone(&self.registry),
            id: id.to_owned(),
            slot: Arc::clone(slot),
            budget: self.budget,
            unadmitted: false,
        }
    }

    /// Loads the session into its held slot when the slot is empty or
    /// stale. False when the store does not hold it (the slot is then
    /// emptied; the caller releases and forgets it).
    async fn fill(
        &self,
        store: &Store,
        id: &str,
        guard: &mut OwnedMutexGuard<Option<Loaded>>,
    ) -> Result<bool, ApiError> {
        if guard.as_ref().is_some_and(|l| !l.stale) {
            return Ok(true);
        }
        **guard = load(store, id).await?;
        if guard.is_some()
            && let Some(probe) = &lock(&self.registry).probe
        {
            probe.loads.inc();
        }
        Ok(guard.is_some())
    }

    fn forget(&self, id: &str, slot: &Slot) {
        lock(&self.registry).remove(id, Some(slot));
    }

    /// Wraps a held, filled slot as the session's turn.
    fn turn(
        &self,
        id: &str,
        slot: &Slot,
        guard: OwnedMutexGuard<Option<Loaded>>,
    ) -> Option<SessionGuard> {
        let guard = OwnedMutexGuard::try_map(guard, Option::as_mut).ok()?;
        Some(SessionGuard {
            guard,
            release: self.release(id, slot),
        })
    }

    /// Waits for the session's turn and returns it, loading the session from
    /// the store if it is not in memory. NotFound when it does not exist.
    pub async fn lock(&self, store: &Store, id: &str) -> Result<SessionGuard, ApiError> {
        loop {
            let slot = self.slot(id);
            let mut guard = slot.clone().lock_owned().await;
            if guard.as_ref().is_some_and(|l| l.gone) {
                // Deleted while we waited: the registry already holds (or
                // will create) a fresh slot for the id.
                drop(guard);
                self.forget(id, &slot);
                continue;
            }
            if !self.fill(store, id, &mut guard).await? {
                drop(guard);
                self.forget(id, &slot);
                return Err(ApiError::SessionNotFound(id.to_owned()));
            }
            return self
                .turn(id, &slot, guard)
                .ok_or_else(|| ApiError::SessionNotFound(id.to_owned()));
        }
    }

    /// Waits for the turn of an id that may not exist yet, for creation.
    /// Holds `None` when no session is held in memory (the store decides
    /// whether it exists).
    pub async fn lock_for_create(&self, id: &str) -> CreateGuard {
        loop {
            let slot = self.slot(id);
            let guard = slot.clone().lock_owned().await;
            if guard.as_ref().is_some_and(|l| l.gone) {
                drop(guard);
                self.forget(id, &slot);
                continue;
            }
            return CreateGuard {
                guard,
                release: self.release(id, &slot),
            };
        }
    }

    /// The session's tokenizer, without taking the session's turn: from
    /// memory, or one point read of the store. NotFound when the session
    /// does not exist. A session deleted and created again meanwhile may
    /// have another; the caller checks again under the lock.
    pub async fn tokenizer(&self, store: &Store, id: &str) -> Result<TokenizerKind, ApiError> {
        let known = lock(&self.tokenizers).get(id).copied();
        if let Some(kind) = known {
            return Ok(kind);
        }
        let owned = id.to_owned();
        let record = blocking::read(store, move |store| store.session(&owned))
            .await?
            .ok_or_else(|| ApiError::SessionNotFound(id.to_owned()))?;
        let kind = record.config.tokenizer;
        self.remember_tokenizer(id, kind);
        Ok(kind)
    }

    /// Records a session's tokenizer (on create and load).
    pub fn remember_tokenizer(&self, id: &str, kind: TokenizerKind) {
        lock(&self.tokenizers).insert(id.to_owned(), kind);
    }

    /// Marks a locked session deleted and drops it from the registry.
    pub fn remove(&self, id: &str, guard: &mut SessionGuard) {
        guard.gone = true;
        lock(&self.tokenizers).remove(id);
        let mut registry = lock(&self.registry);
        registry.remove(id, Some(&guard.release.slot));
        registry.uses.forget(id);
    }

    /// The session's turn if nobody holds it, loading it when it is not
    /// in memory: for background work, which must never queue behind a
    /// request. `Ok(None)` when the session is busy or being deleted, and
    /// when it is not in memory and its record says the background has
    /// nothing to do for it (the staleness guard is not due: see
    /// [`trigger::staleness_due`]), so that the guard's tick does not
    /// load every guarded session the cache let go. NotFound when the
    /// store does not hold it.
    pub async fn try_lock(
        &self,
        store: &Store,
        id: &str,
    ) -> Result<Option<SessionGuard>, ApiError> {
        let slot = self.slot(id);
        let Ok(mut guard) = slot.clone().try_lock_owned() else {
            return Ok(None);
        };
        if guard.as_ref().is_some_and(|l| l.gone) {
            return Ok(None);
        }
        if guard.is_none() {
            let now = crate::broker::now_ms();
            match load_if(store, id, move |record| trigger::staleness_due(record, now)).await? {
                Found::Missing => {
                    drop(guard);
                    self.forget(id, &slot);
                    return Err(ApiError::SessionNotFound(id.to_owned()));
                }
                Found::Skipped => {
                    // Not loaded; the empty slot leaves the registry unless
                    // a request is already waiting for it.
                    drop(guard);
                    lock(&self.registry).remove_unused(id, &slot);
                    return Ok(None);
                }
                Found::Loaded(loaded) => *guard = Some(*loaded),
            }
        }
        if !self.fill(store, id, &mut guard).await? {
            drop(guard);
            self.forget(id, &slot);
            return Err(ApiError::SessionNotFound(id.to_owned()));
        }
        Ok(self.turn(id, &slot, guard))
    }

    /// The estimated bytes of the sessions held in memory, as of the end
    /// of their last turns: at most the budget once no turn is held.
    pub fn resident_bytes(&self) -> u64 {
        lock(&self.registry).bytes
    }

    /// How many sessions are held in memory.
    pub fn resident(&self) -> usize {
        let registry = lock(&self.registry);
        registry
            .entries
            .values()
            .filter(|entry| entry.bytes > 0 || Arc::strong_count(&entry.slot) > 1)
            .count()
    }
}

/// The session as the store holds it, read off the async workers.
async fn load(store: &Store, id: &str) -> Result<Option<Loaded>, ApiError> {
    Ok(match load_if(store, id, |_| true).await? {
        Found::Loaded(loaded) => Some(*loaded),
        Found::Missing | Found::Skipped => None,
    })
}

/// What [`load_if`] found.
enum Found {
    /// No such session.
    Missing,
    /// The session exists, but its record was not wanted.
    Skipped,
    /// The session, loaded.
    Loaded(Box<Loaded>),
}

/// Loads a session if its record is `wanted`, in one read off the async
/// workers: the record is read once, and the spans only when wanted.
async fn load_if(
    store: &Store,
    id: &str,
    wanted: impl FnOnce(&SessionRecord) -> bool + Send + 'static,
) -> Result<Found, ApiError> {
    let id = id.to_owned();
    blocking::read(store, move |store| -> Result<_, ApiError> {
        let Some(record) = store.session(&id)? else {
            return Ok(Found::Missing);
        };
        if !wanted(&record) {
            return Ok(Found::Skipped);
        }
        let (spans, seeds) = store.live_spans_seeded(&id)?;
        Ok(Found::Loaded(Box::new(Loaded::new(Session::with_seeds(
            record, spans, seeds,
        )))))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One turn of `id` as the guards run it: the slot taken, the turn
    /// released with the session's size, the lock let go, and the session
    /// dropped if it was not admitted. True when the session was in memory
    /// before the turn.
    fn turn(registry: &mut Registry, id: &str, bytes: u64, budget: u64) -> bool {
        let slot = registry.slot(id);
        let hit = registry
            .entries
            .get(id)
            .is_some_and(|entry| entry.bytes > 0);
        if registry.release(id, &slot, bytes, budget) {
            registry.remove_unused(id, &slot);
        }
        hit
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("session-{i}")).collect()
    }

    #[test]
    fn sessions_taking_turns_a_little_beyond_the_budget_mostly_stay() {
        // Room for 48 sessions of 100 bytes; 64 take turns in a cycle.
        // Least-recently-used alone would reload at every turn.
        let mut registry = Registry::default();
        let ids = ids(64);
        let mut hits = 0;
        for round in 0..20 {
            for id in &ids {
                let hit = turn(&mut registry, id, 100, 4_800);
                if round >= 10 && hit {
                    hits += 1;
                }
                assert!(registry.bytes <= 4_800, "over budget: {}", registry.bytes);
            }
        }
        // The 48 that fit stay: 480 of the last 640 turns find them.
        assert!(
            hits >= 440,
            "only {hits} of 640 turns found their session in memory"
        );
    }

    #[test]
    fn a_session_in_steady_use_displaces_one_no_longer_used() {
        let mut registry = Registry::default();
        let old = ids(4);
        for _ in 0..10 {
            for id in &old {
                turn(&mut registry, id, 100, 400);
            }
        }
        // "new" starts taking turns; session-0 and session-1 stop.
        let mut admitted_after = None;
        for k in 0..40 {
            let hit = turn(&mut registry, "new", 100, 400);
            turn(&mut registry, "session-2", 100, 400);
            turn(&mut registry, "session-3", 100, 400);
            if hit && admitted_after.is_none() {
                admitted_after = Some(k);
            }
        }
        let admitted_after = admitted_after.expect("the new session never stayed in memory");
        assert!(
            admitted_after <= 15,
            "stayed only after {admitted_after} turns"
        );
        assert!(registry.entries.get("new").is_some_and(|e| e.bytes > 0));
        assert!(
            registry
                .entries
                .get("session-2")
                .is_some_and(|e| e.bytes > 0)
        );
        assert!(
            registry
                .entries
                .get("session-3")
                .is_some_and(|e| e.bytes > 0)
        );
    }

    #[test]
    fn a_session_not_admitted_stays_while_another_request_waits_for_it() {
        let mut registry = Registry::default();
        for id in ids(2) {
            for _ in 0..3 {
                turn(&mut registry, &id, 100, 200);
            }
        }
        let slot = registry.slot("late");
        let waiting = registry.slot("late");
        assert!(
            registry.release("late", &slot, 100, 200),
            "a cold session was admitted"
        );
        registry.remove_unused("late", &slot);
        assert!(
            registry.entries.get("late").is_some_and(|e| e.bytes == 100),
            "dropped while a request waited for it"
        );
        drop(waiting);
        registry.remove_unused("late", &slot);
        assert!(!registry.entries.contains_key("late"));
        assert_eq!(registry.bytes, 200);
    }

    /// A session's estimate, kept by the changes applied to it, is the
    /// estimate made afresh: through turns that fit (added to the kept
    /// estimate) and compactions (estimated again).
    /// Turn `turn` of the sessions below: one tool or assistant output
    /// naming paths and error codes, of one to five lines, `scale` times.
    fn output_turn(
        session: &Session,
        turn: u64,
        scale: usize,
    ) -> Vec<ctxbroker_core::session::Incoming> {
        use ctxbroker_core::span::Role;
        use ctxbroker_core::tokens::ByteLength;

        use crate::broker::TurnSpan;

        let text = format!(
            "turn {turn}: read src/module_{}.rs and found error E{:04} near line {}",
            turn % 7,
            turn * 13 % 10_000,
            turn * 31
        )
        .repeat((1 + (turn % 5) as usize) * scale);
        let span = TurnSpan {
            role: if turn.is_multiple_of(2) {
                Role::Tool
            } else {
                Role::Assistant
            },
            text,
            token_count: None,
            class: None,
            predicate: None,
            relevance_hint: None,
            idempotency_key: String::new(),
            attributes: None,
        };
        let tokens = span.tokens(session.record.config.tokenizer, &ByteLength);
        vec![span.labelled(tokens)]
    }

    /// The estimate kept through turns that append (updated by what they
    /// add) and compactions (estimated again).
    #[test]
    fn the_kept_estimate_is_the_estimate_made_afresh() {
        use ctxbroker_core::SessionConfig;
        use ctxbroker_core::tokens::ByteLength;

        let config = SessionConfig::with_window(4_000);
        let mut loaded = Loaded::new(Session::create("estimate", config, 1));
        let (mut appended, mut compacted) = (0, 0);
        for turn in 0..120u64 {
            let incoming = output_turn(&loaded.session, turn, 1);
            let Ok(change) = loaded.session.admit(incoming, 10 + turn, &ByteLength) else {
                continue;
            };
            loaded.bytes();
            if change.evict.is_empty() && change.summary.is_none() {
                appended += 1;
            } else {
                compacted += 1;
            }
            loaded.apply(&change, &[]);
            let kept = loaded.bytes();
            assert_eq!(kept, estimate(&loaded.session), "turn {turn}");
        }
        assert!(
            appended >= 20 && compacted >= 3,
            "{appended} appended, {compacted} compacted"
        );
    }

    /// A session loaded from the store holds the seeds its spans' rows
    /// carry, counted in its estimate until its facts are read from them,
    /// and plans as the session that wrote them: relevance read from the
    /// seeds is relevance derived from the text.
    #[tokio::test]
    async fn a_loaded_session_reads_its_facts_from_the_seeds_stored() {
        use ctxbroker_core::SessionConfig;
        use ctxbroker_core::facts::SEED_MIN_BYTES;
        use ctxbroker_core::tokens::ByteLength;
        use ctxbroker_store::{StoreOptions, WriteOp};

        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut session = Session::create("seeded", SessionConfig::with_window(40_000), 1);
        let record = session.record.clone();
        store
            .write(WriteOp::CreateSession { record })
            .await
            .unwrap();
        let mut compacted = 0;
        for turn in 0..60u64 {
            // Outputs of 1 to 5 lines, 20 times: 1.4 to 7 KB.
            let incoming = output_turn(&session, turn, 20);
            let Ok(change) = session.admit(incoming, 10 + turn, &ByteLength) else {
                continue;
            };
            compacted += usize::from(change.summary.is_some());
            let write = WriteOp::Change {
                change: change.clone(),
                keys: Vec::new(),
            };
            let (_, seeds) = store.write_seeded(write).await.unwrap();
            let seeded = change.summary.iter().chain(&change.append);
            let long = seeded.filter(|s| s.text.len() >= SEED_MIN_BYTES).count();
            assert_eq!(seeds.len(), long);
            assert!(long >= change.append.len());
            session.apply_seeded(&change, &seeds);
        }
        assert!(compacted >= 2, "{compacted} compactions");
        let mut loaded = load(&store, "seeded").await.unwrap().unwrap();
        assert_eq!(loaded.session, session);
        let seeds = loaded.session.seed_bytes();
        assert!(seeds > 0);
        // No facts derived yet: what they will be made from is counted.
        assert!(loaded.session.derived_facts().is_none());
        assert_eq!(facts_estimate(&loaded.session), seeds as u64);
        assert_eq!(loaded.bytes(), estimate(&loaded.session));
        let mut from_text = Session::new(session.record.clone(), session.spans.clone());
        assert_eq!(loaded.session.relevance(), from_text.relevance());
        assert!(loaded.session.derived_facts().is_some());
        assert_eq!(loaded.session.seed_bytes(), 0);
        store.close().unwrap();
    }

    #[test]
    fn counts_fade_and_forgotten_ids_leave_the_counts() {
        let mut uses = Uses::default();
        for _ in 0..10 {
            uses.record("busy", 1);
        }
        uses.record("once", 1);
        for _ in 0..Uses::MIN_WINDOW {
            uses.record("other", 1);
        }
        assert_eq!(uses.count("busy"), 5);
        assert_eq!(uses.count("once"), 0);
        assert!(!uses.counts.contains_key("once"));
        uses.forget("busy");
        assert_eq!(uses.count("busy"), 0);
    }
}
