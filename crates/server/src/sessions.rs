//! The registry of sessions held in memory, and per-session serialisation:
//! one async mutex per session, so that a session's requests take turns
//! while sessions proceed in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::session::Session;
use ctxbroker_store::Store;
use tokio::sync::{Mutex as AsyncMutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use crate::error::ApiError;

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
}

type Slot = Arc<AsyncMutex<Option<Loaded>>>;

/// The session's turn: while it is held, no other request of the same
/// session runs.
pub type SessionGuard = OwnedMappedMutexGuard<Option<Loaded>, Loaded>;

/// The sessions held in memory, loaded on first use.
#[derive(Debug, Default)]
pub struct Sessions {
    slots: Mutex<HashMap<String, Slot>>,
    /// Each known session's tokenizer, fixed at creation: a turn is counted
    /// before its session's turn is taken, without waiting for the lock.
    tokenizers: Mutex<HashMap<String, TokenizerKind>>,
}

impl Sessions {
    fn slot(&self, id: &str) -> Slot {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slots
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(AsyncMutex::new(None)))
            .clone()
    }

    /// Loads the session into its held slot when the slot is empty or
    /// stale. False when the store does not hold it (the slot is then
    /// emptied; the caller releases and forgets it).
    fn fill(
        &self,
        store: &Store,
        id: &str,
        guard: &mut OwnedMutexGuard<Option<Loaded>>,
    ) -> Result<bool, ApiError> {
        if guard.as_ref().is_some_and(|l| !l.stale) {
            return Ok(true);
        }
        **guard = load(store, id)?;
        Ok(guard.is_some())
    }

    fn forget(&self, id: &str, slot: &Slot) {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slots.get(id).is_some_and(|held| Arc::ptr_eq(held, slot)) {
            slots.remove(id);
        }
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
            if !self.fill(store, id, &mut guard)? {
                drop(guard);
                self.forget(id, &slot);
                return Err(ApiError::SessionNotFound(id.to_owned()));
            }
            return OwnedMutexGuard::try_map(guard, Option::as_mut)
                .map_err(|_| ApiError::SessionNotFound(id.to_owned()));
        }
    }

    /// Waits for the turn of an id that may not exist yet, for creation.
    /// Returns the raw slot guard: `None` inside when no session is held
    /// in memory (the store decides whether it exists).
    pub async fn lock_for_create(&self, id: &str) -> OwnedMutexGuard<Option<Loaded>> {
        loop {
            let slot = self.slot(id);
            let guard = slot.clone().lock_owned().await;
            if guard.as_ref().is_some_and(|l| l.gone) {
                drop(guard);
                self.forget(id, &slot);
                continue;
            }
            return guard;
        }
    }

    /// The session's tokenizer, without taking the session's turn: from
    /// memory, or one point read of the store. NotFound when the session
    /// does not exist. A session deleted and created again meanwhile may
    /// have another; the caller checks again under the lock.
    pub fn tokenizer(&self, store: &Store, id: &str) -> Result<TokenizerKind, ApiError> {
        let known = self
            .tokenizers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(id)
            .copied();
        if let Some(kind) = known {
            return Ok(kind);
        }
        let record = store
            .session(id)?
            .ok_or_else(|| ApiError::SessionNotFound(id.to_owned()))?;
        let kind = record.config.tokenizer;
        self.remember_tokenizer(id, kind);
        Ok(kind)
    }

    /// Records a session's tokenizer (on create and load).
    pub fn remember_tokenizer(&self, id: &str, kind: TokenizerKind) {
        self.tokenizers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(id.to_owned(), kind);
    }

    /// Marks a locked session deleted and drops it from the registry.
    pub fn remove(&self, id: &str, guard: &mut SessionGuard) {
        guard.gone = true;
        self.tokenizers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(id);
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.remove(id);
    }

    /// The session's turn if nobody holds it, loading it when it is not
    /// in memory: for background work, which must never queue behind a
    /// request. `Ok(None)` when the session is busy or being deleted;
    /// NotFound when the store does not hold it.
    pub fn try_lock(&self, store: &Store, id: &str) -> Result<Option<SessionGuard>, ApiError> {
        let slot = self.slot(id);
        let Ok(mut guard) = slot.clone().try_lock_owned() else {
            return Ok(None);
        };
        if guard.as_ref().is_some_and(|l| l.gone) {
            return Ok(None);
        }
        if !self.fill(store, id, &mut guard)? {
            drop(guard);
            self.forget(id, &slot);
            return Err(ApiError::SessionNotFound(id.to_owned()));
        }
        Ok(OwnedMutexGuard::try_map(guard, Option::as_mut).ok())
    }

    /// How many sessions are held in memory.
    pub fn resident(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

fn load(store: &Store, id: &str) -> Result<Option<Loaded>, ApiError> {
    let Some(record) = store.session(id)? else {
        return Ok(None);
    };
    let spans = store.live_spans(id)?;
    Ok(Some(Loaded {
        session: Session::new(record, spans),
        stale: false,
        gone: false,
    }))
}
