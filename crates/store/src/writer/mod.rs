//! The one writer: a dedicated thread that owns every write, and the
//! flusher behind it.
//!
//! The writer blocks for the first queued write, drains whatever else is
//! queued (up to `max_batch`), checks each write against the stored state
//! as left by the writes before it in the batch, and applies every accepted
//! write of the batch as one multi-tree transaction (or, when every write
//! only appends a turn, in an order a crash cannot leave inconsistent once
//! the next open has repaired it: see [`in_order`]). It then hands the
//! batch to the flusher and takes the next one (with relaxed durability,
//! where nothing waits for a flush, it does the flusher's part itself:
//! see [`Handoff`]). The flusher takes every
//! batch applied so far, flushes once for all of them, publishes the new
//! marker head, calls the commit hook with their markers in seq order,
//! and only then acknowledges. Refused writes are answered at once: they
//! changed nothing. Request tasks never flush, so they can never pile up
//! on the engine's flush; with relaxed durability a request task that
//! finds the writer idle applies its own append under the writer's lock,
//! exactly as the writer would, instead of waking it and being woken (see
//! [`Writer::apply_here`]).
//!
//! Here: the writer thread and how a batch is applied; the flusher
//! is in `flusher`, what one write checks and stages in `stage`.

pub(crate) mod blobs;
mod flusher;
mod packing;
mod stage;

pub(crate) use flusher::*;
pub(crate) use packing::pack_session;
pub(crate) use stage::*;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use tokio::sync::{mpsc, oneshot};

use crate::blocks;
use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::model::{MarkerBounds, StoreStats, WriteAck, WriteOp};
use crate::record;
use crate::search::IndexCache;

/// The most old markers one batch removes, so that lowering the retention
/// of a large log does not turn one batch into a huge transaction; the
/// rest go in later batches.
const TRIM_PER_BATCH: u64 = 4096;

/// The most writes a batch of appends is applied in order (see
/// [`in_order`]); a larger one is a transaction, whose fixed cost it
/// spreads over that many writes anyway.
const IN_ORDER_MAX_WRITES: usize = 256;

/// The engine's trees, opened once.
#[derive(Clone)]
pub(crate) struct Trees {
    pub(crate) db: sled::Db,
    pub(crate) sessions: sled::Tree,
    pub(crate) spans: sled::Tree,
    pub(crate) runs: sled::Tree,
    pub(crate) pins: sled::Tree,
    pub(crate) archive: sled::Tree,
    pub(crate) markers: sled::Tree,
    pub(crate) meta: sled::Tree,
    pub(crate) keys: sled::Tree,
}

impl Trees {
    pub(crate) fn open(db: sled::Db) -> Result<Trees, StoreError> {
        let tree = |id: TreeId| db.open_tree(id.name()).map_err(StoreError::engine);
        Ok(Trees {
            sessions: tree(TreeId::Sessions)?,
            spans: tree(TreeId::Spans)?,
            runs: tree(TreeId::Runs)?,
            pins: tree(TreeId::Pins)?,
            archive: tree(TreeId::Archive)?,
            markers: tree(TreeId::Markers)?,
            meta: tree(TreeId::Meta)?,
            keys: tree(TreeId::Keys)?,
            db,
        })
    }

    /// The trees a span's row stands in, each with its id: archived spans
    /// (by id), then live ones (by position), alone or in packed blocks'
    /// runs. Search reads them all.
    pub(crate) fn span_rows(&self) -> [(TreeId, &sled::Tree); 3] {
        [
            (TreeId::Archive, &self.archive),
            (TreeId::Spans, &self.spans),
            (TreeId::Runs, &self.runs),
        ]
    }

    pub(crate) fn tree(&self, id: TreeId) -> &sled::Tree {
        match id {
            TreeId::Sessions => &self.sessions,
            TreeId::Spans => &self.spans,
            TreeId::Runs => &self.runs,
            TreeId::Pins => &self.pins,
            TreeId::Archive => &self.archive,
            TreeId::Markers => &self.markers,
            TreeId::Meta => &self.meta,
            TreeId::Keys => &self.keys,
        }
    }
}

/// What the writer and the readers share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The committed marker head: advanced only after the flush, just
    /// before the hook runs.
    pub(crate) bounds: Mutex<MarkerBounds>,
    /// Sessions stored, kept here so nobody counts the tree per call.
    pub(crate) sessions: AtomicU64,
    /// Held for writing while a batch is applied, for reading by reads that
    /// touch several keys, so that they see a batch wholly or not at all.
    pub(crate) snapshot: RwLock<()>,
    /// Set by `close`: the writer stops taking writes once it sees it.
    pub(crate) closing: AtomicBool,
    pub(crate) writes: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) transactions: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) blob_syncs: AtomicU64,
    pub(crate) applied_by_caller: AtomicU64,
    pub(crate) largest_batch: AtomicU64,
    pub(crate) hook_panics: AtomicU64,
    pub(crate) keys_written: AtomicU64,
    pub(crate) keys_removed: AtomicU64,
    pub(crate) keys_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    /// Postings of recently searched sessions.
    pub(crate) search: IndexCache,
}

impl Shared {
    pub(crate) fn new(bounds: MarkerBounds, sessions: u64, search_cache_bytes: usize) -> Shared {
        Shared {
            search: IndexCache::new(search_cache_bytes),
            bounds: Mutex::new(bounds),
            sessions: AtomicU64::new(sessions),
            snapshot: RwLock::new(()),
            closing: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            transactions: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            blob_syncs: AtomicU64::new(0),
            applied_by_caller: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            hook_panics: AtomicU64::new(0),
            keys_written: AtomicU64::new(0),
            keys_removed: AtomicU64::new(0),
            keys_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        }
    }

    pub(crate) fn bounds(&self) -> MarkerBounds {
        *self
            .bounds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn stats(&self) -> StoreStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreStats {
            writes: get(&self.writes),
            rejected: get(&self.rejected),
            batches: get(&self.batches),
            transactions: get(&self.transactions),
            flushes: get(&self.flushes),
            blob_syncs: get(&self.blob_syncs),
            applied_by_caller: get(&self.applied_by_caller),
            largest_batch: get(&self.largest_batch),
            hook_panics: get(&self.hook_panics),
            keys_written: get(&self.keys_written),
            keys_removed: get(&self.keys_removed),
            keys_read: get(&self.keys_read),
            bytes_written: get(&self.bytes_written),
            queued: 0,
        }
    }
}

/// Where the writer sends a write's outcome.
pub(crate) type Ack = oneshot::Sender<Result<WriteAck, StoreError>>;

/// A write waiting for the writer, with where to send its outcome.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) ack: Ack,
    /// The rows of the write's new spans, encoded by the task that queued
    /// it (see [`Encoded`]).
    pub(crate) encoded: Encoded,
}

/// What the writer applies: a public write, or an import of a whole
/// session (`transfer.rs`), which only the store itself builds.
#[derive(Debug)]
pub(crate) enum Op {
    /// A [`WriteOp`], boxed by [`Store::write_seeded`](crate::Store::write_seeded):
    /// the request's futures and the queue's slots hold a pointer, not
    /// the write.
    Write(Box<WriteOp>),
    /// A checked snapshot to write as a new session.
    Import(Box<crate::transfer::SessionImport>),
}

/// What goes through the writer's queue.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A write.
    Write(Request),
    /// Nothing: wakes a writer blocked on an empty queue so it sees that
    /// the store is closing.
    Wake,
}

/// Who acknowledges the batches the writer applied.
pub(crate) enum Handoff {
    /// Acknowledgements wait for a flush
    /// ([`Durability::Flush`](crate::Durability::Flush)): the flusher
    /// thread takes each applied batch, so that the writer applies the
    /// next one while it flushes.
    Thread {
        to: std::sync::mpsc::Sender<Applied>,
        /// Joined when the writer ends, after it has handed over its last
        /// batch.
        thread: JoinHandle<Result<(), StoreError>>,
    },
    /// Acknowledgements wait for nothing
    /// ([`Durability::Relaxed`](crate::Durability::Relaxed)): the writer
    /// moves the head, acknowledges and calls the hook itself, sparing
    /// every batch a hand-over to another thread; the flusher's last flush
    /// runs when the writer ends.
    Inline(Box<Flusher>),
}

/// The writer's state: the trees and the counters only it advances.
pub(crate) struct Writer {
    pub(crate) trees: Trees,
    pub(crate) shared: Arc<Shared>,
    pub(crate) retention: u64,
    /// Where applied batches go to be flushed and acknowledged.
    pub(crate) handoff: Handoff,
    /// The seq the next marker gets.
    pub(crate) next_seq: u64,
    /// The oldest marker retained.
    pub(crate) oldest_seq: u64,
    /// Sessions stored.
    pub(crate) sessions: u64,
    /// The commit epoch of the last applied batch.
    pub(crate) epoch: u64,
    /// Set when a batch applied in order (see [`in_order`]) failed part
    /// way: the engine holds part of it until the store is opened again
    /// and [`repair_torn_appends`] removes it, so nothing more is written.
    pub(crate) torn: bool,
}

/// The writer's state behind its lock: the writer's thread applies each
/// batch it takes from the queue under it, and with relaxed durability a
/// request task may take it to apply its own append (see
/// [`Writer::apply_here`]). `None` once the writer has ended.
pub(crate) type WriterCell = Mutex<Option<Writer>>;

/// Locks the writer's state. A panic while it was held (a request task
/// applying its own append) may have left part of a write in the engine
/// and the counters behind it, so the writer takes no more writes until
/// the store is opened again, as after a batch that failed part way.
fn lock_writer(cell: &WriterCell) -> std::sync::MutexGuard<'_, Option<Writer>> {
    cell.lock().unwrap_or_else(|poisoned| {
        let mut guard = poisoned.into_inner();
        if let Some(writer) = guard.as_mut() {
            writer.torn = true;
        }
        guard
    })
}

impl Writer {
    /// Runs the writer's thread until the store closes: then applies what
    /// is queued, lets the flusher flush one last time, and returns its
    /// outcome.
    pub(crate) fn run(
        cell: Arc<WriterCell>,
        mut rx: mpsc::Receiver<Msg>,
        shared: Arc<Shared>,
        max_batch: usize,
    ) -> Result<(), StoreError> {
        let mut queue_closed = false;
        loop {
            if !queue_closed && shared.closing.load(Ordering::SeqCst) {
                // Refuses new sends; what is queued is still received.
                rx.close();
                queue_closed = true;
            }
            let first = match rx.blocking_recv() {
                Some(Msg::Write(request)) => request,
                Some(Msg::Wake) => continue,
                None => break,
            };
            let mut batch = vec![first];
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(Msg::Write(request)) => batch.push(request),
                    Ok(Msg::Wake) => {}
                    Err(_) => break,
                }
            }
            // Only this thread takes the state, after the loop.
            if let Some(writer) = lock_writer(&cell).as_mut() {
                writer.run_batch(batch);
            }
        }
        let writer = lock_writer(&cell).take();
        match writer {
            Some(writer) => writer.finish(),
            None => Ok(()),
        }
    }

    /// Applies `request` on the calling thread, as a batch of its own,
    /// when that spares it two hand-offs between threads and costs nobody
    /// a wait: durability is relaxed (no flush to wait for), the write only
    /// appends a turn (a few engine inserts into pages the session's last
    /// turn touched, and one turn in 16 a block packed: no marker, nothing
    /// for the commit hook, no transaction), the writer is not applying a
    /// batch (the lock is free) and the blob files are not due a sync. (The
    /// caller offers only turns small enough to be encoded on its task: see
    /// `Store::write`.) Its outcome is on its `ack` when this returns.
    /// Gives the request back otherwise (`Some`), to be queued; the caller
    /// checks that nothing is queued before it, so that a busy writer keeps
    /// batching. The engine's inserts never wait for the disk unless its
    /// log buffers are all being written out.
    pub(crate) fn apply_here(cell: &WriterCell, request: Request) -> Option<Request> {
        if append_only_session(&request.op).is_none() {
            return Some(request);
        }
        // Held by the writer's thread or another request, or poisoned:
        // the queue answers.
        let Ok(mut guard) = cell.try_lock() else {
            return Some(request);
        };
        match guard.as_mut() {
            Some(writer) if writer.applies_here() => {
                writer
                    .shared
                    .applied_by_caller
                    .fetch_add(1, Ordering::Relaxed);
                writer.run_batch(vec![request]);
                None
            }
            _ => Some(request),
        }
    }

    /// Whether [`Writer::apply_here`] may apply a write now.
    fn applies_here(&self) -> bool {
        match &self.handoff {
            Handoff::Inline(flusher) => !self.torn && !flusher.blob_sync_due(),
            // Measured: under 64 clients, durable appends applied by their
            // tasks (each its own batch for the flusher) made fewer
            // admissions a second than the writer's own batches.
            Handoff::Thread { .. } => false,
        }
    }

    /// Hands the last batch over, then waits for the last flush.
    fn finish(self) -> Result<(), StoreError> {
        match self.handoff {
            Handoff::Thread { to, thread } => {
                drop(to);
                thread
                    .join()
                    .map_err(|_| StoreError::Engine("the flusher thread panicked".into()))?
            }
            Handoff::Inline(flusher) => flusher.finish(),
        }
    }

    fn run_batch(&mut self, batch: Vec<Request>) {
        let shared = &self.shared;
        if self.torn {
            for request in batch {
                let _ = request.ack.send(Err(StoreError::Engine(
                    "an earlier batch failed part way; the store takes no more writes until it is opened again"
                        .into(),
                )));
            }
            return;
        }
        shared.batches.fetch_add(1, Ordering::Relaxed);
        shared
            .writes
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        shared
            .largest_batch
            .fetch_max(batch.len() as u64, Ordering::Relaxed);

        let mut stage = Stage::new(&self.trees);
        let mut next_seq = self.next_seq;
        let mut sessions = self.sessions;
        let mut markers = Vec::new();
        let mut reset = Vec::new();
        let mut accepted = Vec::with_capacity(batch.len());
        // Whether every accepted write only appends spans to a session no
        // other write of the batch touches (see `in_order`).
        let mut appends_only = true;
        let mut appended = std::collections::HashSet::new();
        for request in batch {
            let mut effects = Effects::default();
            let appends_to = append_only_session(&request.op).map(str::to_owned);
            stage.use_encoded(request.encoded);
            match apply(&mut stage, request.op, next_seq, &mut effects) {
                Ok(ack) => {
                    stage.keep();
                    appends_only &= !effects.packs_own_spans
                        && appends_to.is_some_and(|id| appended.insert(id));
                    next_seq += effects.markers.len() as u64;
                    markers.append(&mut effects.markers);
                    reset.append(&mut effects.reset);
                    sessions = sessions.saturating_add_signed(effects.sessions);
                    accepted.push((request.ack, ack));
                }
                Err(err) => {
                    stage.discard();
                    shared.rejected.fetch_add(1, Ordering::Relaxed);
                    // Refused writes changed nothing: no flush to wait for.
                    let _ = request.ack.send(Err(err));
                }
            }
        }
        shared.keys_read.fetch_add(stage.reads(), Ordering::Relaxed);
        if accepted.is_empty() {
            return;
        }

        let epoch = self.epoch + 1;
        let mut oldest = self.oldest_seq;
        if !markers.is_empty() {
            if self.retention > 0 && next_seq - oldest > self.retention {
                let keep_from = next_seq - self.retention;
                let trim_to = keep_from.min(oldest.saturating_add(TRIM_PER_BATCH));
                for seq in oldest..trim_to {
                    stage.del(TreeId::Markers, keys::marker_key(seq).to_vec());
                }
                oldest = trim_to;
            }
            stage.put(
                TreeId::Meta,
                keys::META_MARKER_LOG.to_vec(),
                record::encode_marker_log(next_seq, oldest),
            );
            stage.keep();
        }

        // Every applied batch moves the epoch; the flusher records the
        // durable one beside the engine's files (see `EpochFile`). A batch
        // of appends carries it in the last record it puts, any other in
        // the meta tree (see `in_order`).
        let mut writes = stage.into_writes();
        let appends = appends_only && in_order(&writes) && stamp_last_record(&mut writes, epoch);
        if !appends {
            writes.insert(
                (TreeId::Meta, keys::META_COMMIT_EPOCH.to_vec()),
                Some(record::encode_epoch(epoch).to_vec()),
            );
        }
        if crate::fault("store::before_transaction") {
            let err = StoreError::Io("injected fault before the transaction".into());
            for (ack, _) in accepted {
                let _ = ack.send(Err(err.clone()));
            }
            return;
        }
        let applied = {
            let _exclusive = shared
                .snapshot
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let applied = if appends {
                let applied = put_in_order(&self.trees, &writes);
                self.torn = applied.is_err();
                applied
            } else {
                transact(&self.trees, &writes)
            };
            // Under the exclusive hold, so no search sees the new state
            // with the old postings.
            for id in &reset {
                shared.search.forget(id);
            }
            applied
        };
        if let Err(err) = applied {
            for (ack, _) in accepted {
                let _ = ack.send(Err(err.clone()));
            }
            return;
        }
        shared.transactions.fetch_add(1, Ordering::Relaxed);
        let (mut written, mut removed, mut bytes) = (0u64, 0u64, 0u64);
        for ((_, key), value) in &writes {
            match value {
                Some(value) => {
                    written += 1;
                    bytes += (key.len() + value.len()) as u64;
                }
                None => removed += 1,
            }
        }
        shared.keys_written.fetch_add(written, Ordering::Relaxed);
        shared.keys_removed.fetch_add(removed, Ordering::Relaxed);
        shared.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.epoch = epoch;
        self.next_seq = next_seq;
        self.oldest_seq = oldest;
        self.sessions = sessions;
        shared.sessions.store(sessions, Ordering::Relaxed);
        let mut accepted = accepted;
        if crate::fault("store::after_transaction") {
            // Applied, so the state moved on and the flusher still covers
            // the batch; the callers get an error, never an
            // acknowledgement the flush has not earned.
            let err = StoreError::Io("injected fault after the transaction".into());
            for (ack, _) in accepted.drain(..) {
                let _ = ack.send(Err(err.clone()));
            }
        }
        let applied = Applied {
            acks: accepted,
            epoch,
            markers,
            bounds: MarkerBounds {
                oldest,
                next: next_seq,
            },
        };
        match &mut self.handoff {
            Handoff::Thread { to, .. } => {
                if let Err(std::sync::mpsc::SendError(lost)) = to.send(applied) {
                    // The flusher is gone (it panicked): nobody can vouch
                    // for durability any more.
                    for (ack, _) in lost.acks {
                        let _ = ack.send(Err(StoreError::Closed));
                    }
                }
            }
            Handoff::Inline(flusher) => flusher.commit(vec![applied]),
        }
    }
}

/// Staged changes: a value to store, or `None` to remove the key.
type Writes = BTreeMap<(TreeId, Vec<u8>), Option<Vec<u8>>>;

/// The session a write only appends spans to (a turn admitted without a
/// compaction: new spans, each at the position of its id, their pins and
/// idempotency keys, and the session's record), or `None` for any other
/// write.
fn append_only_session(op: &Op) -> Option<&str> {
    let Op::Write(op) = op else {
        return None;
    };
    match &**op {
        WriteOp::Change { change, .. }
            if change.marker.is_none()
                && change.evict.is_empty()
                && change.summary.is_none()
                && change.replace.is_empty()
                && !change.append.is_empty()
                && change.append.iter().all(|span| span.position == span.id) =>
        {
            Some(&change.record.id)
        }
        _ => None,
    }
}

/// Whether a batch's writes are appends that [`put_in_order`] can apply
/// without a transaction; false when the batch holds anything else (then
/// it needs one). The caller has checked that every write of the batch
/// only appends to a session no other write touches (see
/// [`append_only_session`]).
///
/// Appending writes keys that did not exist (spans, pins and idempotency
/// keys of span ids from the session's `next_span_id` on; an appended
/// span's position is its id), packs the blocks the move of
/// `next_span_id` makes due (a run put, the block's rows removed: see
/// `crate::blocks`), and then replaces the session's record. The engine
/// recovers a prefix of its log after a crash, so applying the writes in
/// [`APPEND_ORDER`] leaves a session of a torn batch in one of two states:
/// its record written, so the whole append is there; or not, so what
/// survived of the append lies at span ids from its record's
/// `next_span_id` on, starting with a span at that position (a turn whose
/// pack would take that span into a run is not applied in order), then
/// perhaps a run of a block that record has not made due, holding copies
/// of rows the pack was moving (they are removed only after the run is
/// in). That span is how [`repair_torn_appends`] finds such a session
/// when the store opens, with one look-up in the spans tree, and undoes
/// the rest. The batch's commit epoch rides in the last record it puts
/// ([`stamp_last_record`]): the engine recovers it only with everything
/// the batch wrote before it.
///
/// This spares the batch the transaction, whose two seals of the
/// engine's log buffer each wake every one of its I/O threads.
fn in_order(writes: &Writes) -> bool {
    writes.len() <= IN_ORDER_MAX_WRITES
        && writes
            .iter()
            .all(|((tree, _), value)| append_step(*tree, value.is_some()).is_some())
}

/// The steps in which [`put_in_order`] applies a batch of appends (see
/// [`in_order`]): a tree, and whether the step puts (else removes).
pub(crate) const APPEND_ORDER: [(TreeId, bool); 6] = [
    (TreeId::Spans, true),
    (TreeId::Runs, true),
    (TreeId::Pins, true),
    (TreeId::Keys, true),
    (TreeId::Spans, false),
    (TreeId::Sessions, true),
];

/// The step of [`APPEND_ORDER`] that applies a put (`put`) or a removal
/// in `tree`, or `None` when a batch of appends has none.
pub(crate) fn append_step(tree: TreeId, put: bool) -> Option<usize> {
    APPEND_ORDER.iter().position(|step| *step == (tree, put))
}

/// Puts `epoch` into the last session record of a batch of appends, the
/// last write [`put_in_order`] applies; false when there is none to carry
/// it.
fn stamp_last_record(writes: &mut Writes, epoch: u64) -> bool {
    let last = writes
        .iter_mut()
        .rfind(|((tree, _), _)| *tree == TreeId::Sessions);
    let Some(((_, key), Some(value))) = last else {
        return false;
    };
    match record::stamp_epoch(key, value, epoch) {
        Some(stamped) => {
            *value = stamped;
            true
        }
        None => false,
    }
}

/// Applies a batch of appends one write at a time, step by step in
/// [`APPEND_ORDER`] (see [`in_order`]).
fn put_in_order(trees: &Trees, writes: &Writes) -> Result<(), StoreError> {
    for step in 0..APPEND_ORDER.len() {
        for ((tree, key), value) in writes {
            if append_step(*tree, value.is_some()) != Some(step) {
                continue;
            }
            let tree = trees.tree(*tree);
            match value {
                Some(value) => tree.insert(key.as_slice(), value.as_slice()),
                None => tree.remove(key.as_slice()),
            }
            .map_err(StoreError::engine)?;
        }
    }
    Ok(())
}

/// Undoes what survived of appends a crash tore (see [`in_order`]): for
/// each session, the spans, pins and idempotency keys of span ids its
/// record has not reached, and the runs of blocks it has not made due,
/// whose rows before `next_span_id` go back to keys of their own first
/// (the pack may have removed them). A session's torn append starts with
/// a span at its record's `next_span_id`, so a look-up per session finds
/// it (and only a torn session's runs are read: a look-up there pulls in
/// a page of runs); the spans go last, so a repair cut short is found
/// again. (A format-1 store wrote each span's term row before it: term
/// rows a crash left without their span go with that format's terms tree
/// when the store is converted, see `migrate`.)
/// Returns how many sessions it repaired.
pub(crate) fn repair_torn_appends(
    trees: &Trees,
    blobs: &mut blobs::BlobSync,
) -> Result<u64, StoreError> {
    let mut repaired = 0;
    for entry in trees.sessions.iter() {
        let (key, value) = entry.map_err(StoreError::engine)?;
        // A damaged record is reported where it is read, as before.
        let Ok(record) = record::decode_session(&key, &value) else {
            continue;
        };
        let session = record.id.as_str();
        if keys::check_session_id(session).is_err() {
            continue;
        }
        let next = record.next_span_id;
        let torn = keys::session_numbers_from(session, next);
        let first = trees.spans.range(torn.clone()).next().transpose();
        if first.map_err(StoreError::engine)?.is_none() {
            continue;
        }
        let not_due = blocks::blocks_due(0, next).end * blocks::BLOCK_SPANS;
        let runs = trees
            .runs
            .range(keys::session_numbers_from(session, not_due))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::engine)?;
        let next_key = keys::session_number_key(session, next);
        let mut undone = Vec::with_capacity(runs.len());
        for (at, run) in &runs {
            let restored = blocks::for_each_run_row(at, run, |key, row| {
                if key < next_key.as_slice()
                    && !trees.spans.contains_key(key).map_err(StoreError::engine)?
                {
                    trees.spans.insert(key, row).map_err(StoreError::engine)?;
                }
                Ok(())
            });
            match restored {
                Ok(()) => undone.push(at),
                // A damaged run stays, for its readers to report.
                Err(StoreError::Corrupt { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        let prefix = keys::session_prefix(session);
        for entry in trees.keys.scan_prefix(&prefix) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            if record::decode_key(&key, &value).is_ok_and(|id| id >= next) {
                trees.keys.remove(&key).map_err(StoreError::engine)?;
            }
        }
        for entry in trees.pins.range(torn.clone()).keys() {
            let key = entry.map_err(StoreError::engine)?;
            trees.pins.remove(&key).map_err(StoreError::engine)?;
        }
        for at in undone {
            trees.runs.remove(at).map_err(StoreError::engine)?;
        }
        for entry in trees.spans.range(torn.clone()).keys() {
            let key = entry.map_err(StoreError::engine)?;
            trees.spans.remove(&key).map_err(StoreError::engine)?;
        }
        tracing::warn!(
            session_id = session,
            next_span_id = next,
            "removed the part of an admission a crash interrupted"
        );
        repaired += 1;
    }
    if repaired > 0 {
        blobs.flush(&trees.db)?;
    }
    Ok(repaired)
}

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// Applies a batch's writes as one transaction over every tree. The closure
/// only replays the prepared writes, so the engine may run it again.
fn transact(trees: &Trees, writes: &Writes) -> Result<(), StoreError> {
    let result = (
        &trees.sessions,
        &trees.spans,
        &trees.runs,
        &trees.pins,
        &trees.archive,
        &trees.markers,
        &trees.meta,
        &trees.keys,
    )
        .transaction(
            |(sessions, spans, runs, pins, archive, markers, meta, keys)| {
                for ((tree, key), value) in writes {
                    let tree = match tree {
                        TreeId::Sessions => sessions,
                        TreeId::Spans => spans,
                        TreeId::Runs => runs,
                        TreeId::Pins => pins,
                        TreeId::Archive => archive,
                        TreeId::Markers => markers,
                        TreeId::Meta => meta,
                        TreeId::Keys => keys,
                    };
                    match value {
                        Some(value) => {
                            tree.insert(key.as_slice(), value.as_slice())?;
                        }
                        None => {
                            tree.remove(key.as_slice())?;
                        }
                    }
                }
                Ok::<(), ConflictableTransactionError<()>>(())
            },
        );
    result.map_err(transaction_error)
}

/// The store's error for a failed engine transaction whose closure never
/// aborts.
pub(crate) fn transaction_error(err: TransactionError<()>) -> StoreError {
    match err {
        TransactionError::Abort(()) => StoreError::Engine("transaction aborted".into()),
        TransactionError::Storage(err) => StoreError::engine(err),
    }
}
