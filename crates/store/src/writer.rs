//! The one writer: a dedicated thread that owns every write, and the
//! flusher behind it.
//!
//! The writer blocks for the first queued write, drains whatever else is
//! queued (up to `max_batch`), checks each write against the stored state
//! as left by the writes before it in the batch, and applies every accepted
//! write of the batch as one multi-tree transaction. It then hands the
//! batch to the flusher and takes the next one. The flusher takes every
//! batch applied so far, flushes once for all of them, calls the commit
//! publishes the new marker head, calls the hook with their markers in seq
//! order, and
//! only then acknowledges. Refused writes are answered at once: they
//! changed nothing. Request tasks never touch the engine's write path, so
//! they can never pile up on its flush.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use ctxbroker_core::marker::Outcome;
use ctxbroker_core::span::SpanClass;
use ctxbroker_core::{Marker, Span, SpanId};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use tokio::sync::{mpsc, oneshot};

use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::model::{
    Change, CommitHook, Durability, FlushObserver, MarkerBounds, SessionRecord, StoreStats,
    WriteAck, WriteOp,
};
use crate::record;
use crate::search::IndexCache;

/// The most old markers one batch removes, so that lowering the retention
/// of a large log does not turn one batch into a huge transaction; the
/// rest go in later batches.
const TRIM_PER_BATCH: u64 = 4096;

/// The engine's trees, opened once.
#[derive(Clone)]
pub(crate) struct Trees {
    pub(crate) db: sled::Db,
    pub(crate) sessions: sled::Tree,
    pub(crate) spans: sled::Tree,
    pub(crate) pins: sled::Tree,
    pub(crate) archive: sled::Tree,
    pub(crate) markers: sled::Tree,
    pub(crate) meta: sled::Tree,
    pub(crate) keys: sled::Tree,
    pub(crate) terms: sled::Tree,
}

impl Trees {
    pub(crate) fn open(db: sled::Db) -> Result<Trees, StoreError> {
        let tree = |id: TreeId| db.open_tree(id.name()).map_err(StoreError::engine);
        Ok(Trees {
            sessions: tree(TreeId::Sessions)?,
            spans: tree(TreeId::Spans)?,
            pins: tree(TreeId::Pins)?,
            archive: tree(TreeId::Archive)?,
            markers: tree(TreeId::Markers)?,
            meta: tree(TreeId::Meta)?,
            keys: tree(TreeId::Keys)?,
            terms: tree(TreeId::Terms)?,
            db,
        })
    }

    pub(crate) fn tree(&self, id: TreeId) -> &sled::Tree {
        match id {
            TreeId::Sessions => &self.sessions,
            TreeId::Spans => &self.spans,
            TreeId::Pins => &self.pins,
            TreeId::Archive => &self.archive,
            TreeId::Markers => &self.markers,
            TreeId::Meta => &self.meta,
            TreeId::Keys => &self.keys,
            TreeId::Terms => &self.terms,
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
    pub(crate) largest_batch: AtomicU64,
    pub(crate) hook_panics: AtomicU64,
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
            largest_batch: AtomicU64::new(0),
            hook_panics: AtomicU64::new(0),
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
            largest_batch: get(&self.largest_batch),
            hook_panics: get(&self.hook_panics),
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
}

/// What the writer applies: a public write, or an import of a whole
/// session (`transfer.rs`), which only the store itself builds.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // as for `WriteOp`: moved once into the queue.
pub(crate) enum Op {
    /// A [`WriteOp`].
    Write(WriteOp),
    /// A checked snapshot to write as a new session.
    Import(Box<crate::transfer::SessionImport>),
}

/// What goes through the writer's queue.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // `Wake` is rare; writes are not worth a box each.
pub(crate) enum Msg {
    /// A write.
    Write(Request),
    /// Nothing: wakes a writer blocked on an empty queue so it sees that
    /// the store is closing.
    Wake,
}

/// The writer's state: the trees and the counters only it advances.
pub(crate) struct Writer {
    pub(crate) trees: Trees,
    pub(crate) shared: Arc<Shared>,
    pub(crate) rx: mpsc::Receiver<Msg>,
    pub(crate) retention: u64,
    pub(crate) max_batch: usize,
    /// Where applied batches go to be flushed and acknowledged.
    pub(crate) flusher: std::sync::mpsc::Sender<Applied>,
    /// Joined when the writer ends, after it has handed over its last batch.
    pub(crate) flusher_thread: JoinHandle<Result<(), StoreError>>,
    /// The seq the next marker gets.
    pub(crate) next_seq: u64,
    /// The oldest marker retained.
    pub(crate) oldest_seq: u64,
    /// Sessions stored.
    pub(crate) sessions: u64,
    /// The commit epoch of the last applied batch.
    pub(crate) epoch: u64,
}

impl Writer {
    /// Runs until the store closes: then applies what is queued, lets the
    /// flusher flush one last time, and returns its outcome.
    pub(crate) fn run(mut self) -> Result<(), StoreError> {
        let mut queue_closed = false;
        loop {
            if !queue_closed && self.shared.closing.load(Ordering::SeqCst) {
                // Refuses new sends; what is queued is still received.
                self.rx.close();
                queue_closed = true;
            }
            let first = match self.rx.blocking_recv() {
                Some(Msg::Write(request)) => request,
                Some(Msg::Wake) => continue,
                None => break,
            };
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match self.rx.try_recv() {
                    Ok(Msg::Write(request)) => batch.push(request),
                    Ok(Msg::Wake) => {}
                    Err(_) => break,
                }
            }
            self.run_batch(batch);
        }
        drop(self.flusher);
        self.flusher_thread
            .join()
            .map_err(|_| StoreError::Engine("the flusher thread panicked".into()))?
    }

    fn run_batch(&mut self, batch: Vec<Request>) {
        let shared = &self.shared;
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
        for request in batch {
            let mut effects = Effects::default();
            match apply(&mut stage, request.op, next_seq, &mut effects) {
                Ok(ack) => {
                    stage.keep();
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
        if accepted.is_empty() {
            return;
        }

        // Every applied batch moves the epoch; the flusher records the
        // durable one beside the engine's files (see `EpochFile`).
        let epoch = self.epoch + 1;
        stage.put(
            TreeId::Meta,
            keys::META_COMMIT_EPOCH.to_vec(),
            record::encode_epoch(epoch).to_vec(),
        );
        stage.keep();
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

        let writes = stage.into_writes();
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
            let applied = transact(&self.trees, &writes);
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
        let handed = self.flusher.send(Applied {
            acks: accepted,
            epoch,
            markers,
            bounds: MarkerBounds {
                oldest,
                next: next_seq,
            },
        });
        if let Err(std::sync::mpsc::SendError(lost)) = handed {
            // The flusher is gone (it panicked): nobody can vouch for
            // durability any more.
            for (ack, _) in lost.acks {
                let _ = ack.send(Err(StoreError::Closed));
            }
        }
    }
}

/// A batch the writer applied, waiting for a flush to cover it.
pub(crate) struct Applied {
    acks: Vec<(Ack, WriteAck)>,
    epoch: u64,
    markers: Vec<Marker>,
    bounds: MarkerBounds,
}

/// The thread that makes applied batches durable and reports them: it
/// takes every batch applied so far, flushes once for all of them, moves
/// the committed marker head, calls the commit hook and acknowledges.
/// While it flushes, the writer goes on applying the next batch.
pub(crate) struct Flusher {
    pub(crate) db: sled::Db,
    pub(crate) shared: Arc<Shared>,
    pub(crate) rx: std::sync::mpsc::Receiver<Applied>,
    pub(crate) durability: Durability,
    pub(crate) hook: Option<CommitHook>,
    /// Told how long each successful flush took.
    pub(crate) on_flush: Option<FlushObserver>,
    /// Markers applied but not yet handed to the hook, because the flush
    /// that should have covered them failed; the next successful flush
    /// covers them.
    pub(crate) unpublished: Vec<Marker>,
    /// The bounds to publish with them.
    pub(crate) bounds: Option<MarkerBounds>,
    /// Where the durable commit epoch is recorded.
    pub(crate) epoch_file: EpochFile,
    /// The epoch of the last batch handed over.
    pub(crate) epoch: u64,
}

/// The commit epoch recorded outside the engine, in `commit-epoch` beside
/// its files, after every flush.
///
/// The engine recovers from a damaged log by stopping at the damage: a
/// flipped bit in the middle of its log or a truncated file comes back as
/// an older, consistent-looking store, and the writes after the damage are
/// gone without a word. This file is how that is noticed: it is written
/// only after the engine's flush returned, so it never names an epoch the
/// engine did not make durable, and it is not synced itself (a crash of
/// the process leaves it in the page cache; losing power can only make it
/// older, never newer). On open, an engine epoch below the file's means
/// acknowledged writes were lost, and the store refuses to serve.
#[derive(Debug)]
pub(crate) struct EpochFile {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl EpochFile {
    /// The file's name in the data directory.
    pub(crate) const NAME: &'static str = "commit-epoch";

    /// Opens (or creates) the file in `dir` and returns it with the epoch
    /// it holds (`None` when empty: a new store, or one written before the
    /// file existed).
    pub(crate) fn open(dir: &std::path::Path) -> Result<(EpochFile, Option<u64>), StoreError> {
        use std::io::Read;
        let path = dir.join(Self::NAME);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::Io(format!("opening {}: {e}", path.display())))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))?;
        let epoch = if bytes.is_empty() {
            None
        } else {
            Some(record::decode_epoch(&bytes).map_err(|detail| StoreError::Corrupt {
                tree: "meta".into(),
                key: format!("{:?}", path.display().to_string()),
                session: None,
                detail: format!(
                    "{detail}; the file records the last durable commit epoch (remove it to accept the store as it is)"
                ),
            })?)
        };
        Ok((EpochFile { file, path }, epoch))
    }

    /// Records `epoch`: 12 bytes written in place, in one call.
    pub(crate) fn record(&mut self, epoch: u64) -> Result<(), StoreError> {
        use std::io::{Seek, SeekFrom, Write};
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(&record::encode_epoch(epoch)))
            .map_err(|e| StoreError::Io(format!("writing {}: {e}", self.path.display())))
    }
}

impl Flusher {
    /// Runs until the writer hangs up, then flushes one last time.
    pub(crate) fn run(mut self) -> Result<(), StoreError> {
        while let Ok(first) = self.rx.recv() {
            let mut group = vec![first];
            while let Ok(next) = self.rx.try_recv() {
                group.push(next);
            }
            self.commit(group);
        }
        self.shared.flushes.fetch_add(1, Ordering::Relaxed);
        self.flush()?;
        self.epoch_file.record(self.epoch)?;
        self.publish();
        Ok(())
    }

    fn commit(&mut self, group: Vec<Applied>) {
        let mut acks = Vec::new();
        for mut applied in group {
            self.epoch = self.epoch.max(applied.epoch);
            self.unpublished.append(&mut applied.markers);
            self.bounds = Some(applied.bounds);
            acks.append(&mut applied.acks);
        }
        if self.durability == Durability::Flush {
            self.shared.flushes.fetch_add(1, Ordering::Relaxed);
            let flushed = if crate::fault("store::before_flush") {
                Err(StoreError::Io("injected fault before the flush".into()))
            } else {
                self.flush()
            };
            if let Err(err) = flushed {
                let err = StoreError::Io(format!(
                    "flush failed, so these writes may or may not survive a crash: {err}"
                ));
                for (ack, _) in acks {
                    let _ = ack.send(Err(err.clone()));
                }
                return;
            }
            // Only what the flush covered is recorded; a failure here
            // leaves the file older, which is safe.
            if let Err(err) = self.epoch_file.record(self.epoch) {
                tracing::warn!(%err, "recording the commit epoch failed");
            }
        }
        // The head moves before any acknowledgement, so a caller that has
        // its reply can read what it wrote; the markers go to the hook
        // after the replies, so that fanning them out (to every watcher)
        // does not delay the writes' acknowledgements.
        self.advance_head();
        if crate::fault("store::after_flush") {
            let err = StoreError::Io("injected fault after the flush".into());
            for (ack, _) in acks {
                let _ = ack.send(Err(err.clone()));
            }
        } else {
            for (ack, outcome) in acks {
                // The caller may have stopped waiting; the write stands.
                let _ = ack.send(Ok(outcome));
            }
        }
        self.announce();
    }

    /// Flushes the engine, telling the observer how long a successful
    /// flush took.
    fn flush(&self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        self.db.flush().map_err(StoreError::engine)?;
        if let Some(observe) = &self.on_flush {
            observe(started.elapsed());
        }
        Ok(())
    }

    /// Moves the committed head over the markers that became durable, then
    /// hands them to the hook. Head first: a subscriber that receives
    /// marker N from the hook can always read every marker before N from
    /// the log, so it can fill any gap it finds without waiting.
    fn publish(&mut self) {
        self.advance_head();
        self.announce();
    }

    /// Moves the committed head over what became durable.
    fn advance_head(&mut self) {
        if let Some(bounds) = self.bounds.take() {
            *self
                .shared
                .bounds
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = bounds;
        }
    }

    /// Hands the markers the head passed to the hook, once each.
    fn announce(&mut self) {
        if !self.unpublished.is_empty() {
            if let Some(hook) = &self.hook {
                let markers = &self.unpublished;
                if catch_unwind(AssertUnwindSafe(|| hook(markers))).is_err() {
                    self.shared.hook_panics.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.unpublished.clear();
        }
    }
}

/// Staged changes: a value to store, or `None` to remove the key.
type Writes = BTreeMap<(TreeId, Vec<u8>), Option<Vec<u8>>>;

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// Applies a batch's writes as one transaction over every tree. The closure
/// only replays the prepared writes, so the engine may run it again.
fn transact(trees: &Trees, writes: &Writes) -> Result<(), StoreError> {
    let result = (
        &trees.sessions,
        &trees.spans,
        &trees.pins,
        &trees.archive,
        &trees.markers,
        &trees.meta,
        &trees.keys,
        &trees.terms,
    )
        .transaction(
            |(sessions, spans, pins, archive, markers, meta, keys, terms)| {
                for ((tree, key), value) in writes {
                    let tree = match tree {
                        TreeId::Sessions => sessions,
                        TreeId::Spans => spans,
                        TreeId::Pins => pins,
                        TreeId::Archive => archive,
                        TreeId::Markers => markers,
                        TreeId::Meta => meta,
                        TreeId::Keys => keys,
                        TreeId::Terms => terms,
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
    result.map_err(|err| match err {
        TransactionError::Abort(()) => StoreError::Engine("transaction aborted".into()),
        TransactionError::Storage(err) => StoreError::engine(err),
    })
}

/// The batch's writes so far, over the stored state: every check reads
/// through it, so a write sees the writes accepted before it in the batch.
/// The current write's changes stay apart until it is accepted.
pub(crate) struct Stage<'a> {
    trees: &'a Trees,
    batch: Writes,
    op: Writes,
}

impl<'a> Stage<'a> {
    fn new(trees: &'a Trees) -> Stage<'a> {
        Stage {
            trees,
            batch: BTreeMap::new(),
            op: BTreeMap::new(),
        }
    }

    pub(crate) fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let staged = (tree, key.to_vec());
        if let Some(value) = self.op.get(&staged).or_else(|| self.batch.get(&staged)) {
            return Ok(value.clone());
        }
        let stored = self.trees.tree(tree).get(key).map_err(StoreError::engine)?;
        Ok(stored.map(|v| v.to_vec()))
    }

    /// Every live entry under `prefix`, in key order.
    fn scan(&self, tree: TreeId, prefix: &[u8]) -> Result<Vec<Entry>, StoreError> {
        let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for entry in self.trees.tree(tree).scan_prefix(prefix) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            merged.insert(key.to_vec(), Some(value.to_vec()));
        }
        for layer in [&self.batch, &self.op] {
            let from = (tree, prefix.to_vec());
            for ((t, key), value) in layer.range(from..) {
                if *t != tree || !key.starts_with(prefix) {
                    break;
                }
                merged.insert(key.clone(), value.clone());
            }
        }
        Ok(merged
            .into_iter()
            .filter_map(|(key, value)| value.map(|v| (key, v)))
            .collect())
    }

    /// Every live key under `prefix`, in key order, without the values.
    pub(crate) fn scan_keys(
        &self,
        tree: TreeId,
        prefix: &[u8],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut merged: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        for entry in self.trees.tree(tree).scan_prefix(prefix).keys() {
            merged.insert(entry.map_err(StoreError::engine)?.to_vec(), true);
        }
        for layer in [&self.batch, &self.op] {
            let from = (tree, prefix.to_vec());
            for ((t, key), value) in layer.range(from..) {
                if *t != tree || !key.starts_with(prefix) {
                    break;
                }
                merged.insert(key.clone(), value.is_some());
            }
        }
        Ok(merged
            .into_iter()
            .filter_map(|(key, live)| live.then_some(key))
            .collect())
    }

    pub(crate) fn put(&mut self, tree: TreeId, key: Vec<u8>, value: Vec<u8>) {
        self.op.insert((tree, key), Some(value));
    }

    fn del(&mut self, tree: TreeId, key: Vec<u8>) {
        self.op.insert((tree, key), None);
    }

    /// The current write was accepted: its changes join the batch.
    fn keep(&mut self) {
        let op = std::mem::take(&mut self.op);
        self.batch.extend(op);
    }

    /// The current write was refused: its changes are dropped.
    fn discard(&mut self) {
        self.op.clear();
    }

    fn into_writes(self) -> Writes {
        self.batch
    }
}

/// What an accepted write changes besides its keys.
#[derive(Default)]
pub(crate) struct Effects {
    markers: Vec<Marker>,
    pub(crate) sessions: i64,
    /// Sessions deleted or created whole: their cached postings go.
    pub(crate) reset: Vec<String>,
}

fn invalid(session: &str, detail: String) -> StoreError {
    StoreError::InvalidWrite {
        session: session.to_owned(),
        detail,
    }
}

fn load_session(stage: &Stage<'_>, id: &str) -> Result<SessionRecord, StoreError> {
    let key = keys::session_key(id);
    match stage.get(TreeId::Sessions, &key)? {
        Some(value) => record::decode_session(&key, &value),
        None => Err(StoreError::SessionNotFound { id: id.to_owned() }),
    }
}

fn check_revision(session: &str, expected: u64, stored: &SessionRecord) -> Result<(), StoreError> {
    if stored.revision != expected {
        return Err(StoreError::StaleRevision {
            session: session.to_owned(),
            expected,
            actual: stored.revision,
        });
    }
    Ok(())
}

fn put_session(stage: &mut Stage<'_>, record: &SessionRecord) {
    let key = keys::session_key(&record.id);
    let value = record::encode_session(&key, record);
    stage.put(TreeId::Sessions, key, value);
}

/// Writes a constraint's pin, or removes the pin of a span that is no
/// longer a constraint.
fn sync_pin(stage: &mut Stage<'_>, session: &str, span: &Span) -> Result<(), StoreError> {
    let key = keys::session_number_key(session, span.id);
    if span.classification.class == SpanClass::Constraint {
        let value = record::encode_pin(&key, span.id, span.predicate.as_ref());
        stage.put(TreeId::Pins, key, value);
    } else if stage.get(TreeId::Pins, &key)?.is_some() {
        stage.del(TreeId::Pins, key);
    }
    Ok(())
}

/// Stores a new span at its position, which must be free, and pins it if it
/// is a constraint. Its id has passed [`check_new_id`], so no pin can exist
/// for it yet.
fn insert_span(stage: &mut Stage<'_>, session: &str, span: &Span) -> Result<(), StoreError> {
    let key = keys::session_number_key(session, span.position);
    if let Some(taken) = stage.get(TreeId::Spans, &key)? {
        let holder = record::decode_span(&key, &taken)?;
        return Err(invalid(
            session,
            format!(
                "span {} cannot take position {}: span {} holds it",
                span.id, span.position, holder.id
            ),
        ));
    }
    let value = record::encode_span(&key, span);
    stage.put(TreeId::Spans, key, value);
    if span.classification.class == SpanClass::Constraint {
        let key = keys::session_number_key(session, span.id);
        let value = record::encode_pin(&key, span.id, span.predicate.as_ref());
        stage.put(TreeId::Pins, key, value);
    }
    index_span(stage, session, span);
    Ok(())
}

/// Indexes a newly stored span for search, in the same transaction as the
/// span itself: one row, its term vector. A span is indexed once, as it
/// was stored: eviction moves it to the archive without touching its row.
pub(crate) fn index_span(stage: &mut Stage<'_>, session: &str, span: &Span) {
    let (key, value) = record::term_row(session, span);
    stage.put(TreeId::Terms, key, value);
}

/// Finds a live span by id: spans are keyed by position, which equals the
/// id for admitted spans; summaries stand elsewhere, so on a miss the
/// session's live spans are indexed once.
fn find_live(
    stage: &Stage<'_>,
    session: &str,
    id: SpanId,
    index: &mut Option<HashMap<SpanId, Vec<u8>>>,
) -> Result<Option<(Vec<u8>, Span)>, StoreError> {
    let direct = keys::session_number_key(session, id);
    if let Some(value) = stage.get(TreeId::Spans, &direct)? {
        let span = record::decode_span(&direct, &value)?;
        if span.id == id {
            return Ok(Some((direct, span)));
        }
    }
    if index.is_none() {
        let mut by_id = HashMap::new();
        for (key, value) in stage.scan(TreeId::Spans, &keys::session_prefix(session))? {
            let span = record::decode_span(&key, &value)?;
            by_id.insert(span.id, key);
        }
        *index = Some(by_id);
    }
    let Some(key) = index.as_ref().and_then(|by_id| by_id.get(&id)) else {
        return Ok(None);
    };
    // The index predates this write's own changes: read the key again.
    if let Some(value) = stage.get(TreeId::Spans, key)? {
        let span = record::decode_span(key, &value)?;
        if span.id == id {
            return Ok(Some((key.clone(), span)));
        }
    }
    Ok(None)
}

/// Checks that a span id is one of those the write gives out: at least the
/// stored first free id, below the new record's.
fn check_new_id(
    session: &str,
    id: SpanId,
    stored: &SessionRecord,
    record: &SessionRecord,
) -> Result<(), StoreError> {
    if id < stored.next_span_id || id >= record.next_span_id {
        return Err(invalid(
            session,
            format!(
                "new span id {id} is outside the ids this write gives out ({}..{})",
                stored.next_span_id, record.next_span_id
            ),
        ));
    }
    Ok(())
}

fn check_marker(session: &str, marker: &Marker, record: &SessionRecord) -> Result<(), StoreError> {
    if marker.session_id != session {
        return Err(invalid(
            session,
            format!("marker names session {:?}", marker.session_id),
        ));
    }
    if marker.session_seq != record.marker_count {
        return Err(invalid(
            session,
            format!(
                "marker session_seq {} differs from the record's marker_count {}",
                marker.session_seq, record.marker_count
            ),
        ));
    }
    Ok(())
}

fn put_marker(stage: &mut Stage<'_>, mut marker: Marker, seq: u64, effects: &mut Effects) {
    marker.seq = seq;
    let key = keys::marker_key(seq).to_vec();
    let value = record::encode_marker(&key, &marker);
    stage.put(TreeId::Markers, key, value);
    effects.markers.push(marker);
}

/// Checks one write against the staged state and stages its changes.
/// `seq` is the seq its marker gets, if it writes one.
fn apply(
    stage: &mut Stage<'_>,
    op: Op,
    seq: u64,
    effects: &mut Effects,
) -> Result<WriteAck, StoreError> {
    let op = match op {
        Op::Write(op) => op,
        Op::Import(import) => return crate::transfer::stage_import(stage, *import, effects),
    };
    match op {
        WriteOp::CreateSession { record } => {
            keys::check_session_id(&record.id)?;
            let key = keys::session_key(&record.id);
            if stage.get(TreeId::Sessions, &key)?.is_some() {
                return Err(StoreError::SessionExists { id: record.id });
            }
            put_session(stage, &record);
            effects.sessions += 1;
            Ok(WriteAck::default())
        }
        WriteOp::UpdateSession {
            expected_revision,
            record,
        } => {
            keys::check_session_id(&record.id)?;
            let stored = load_session(stage, &record.id)?;
            check_revision(&record.id, expected_revision, &stored)?;
            put_session(stage, &record);
            Ok(WriteAck::default())
        }
        WriteOp::DeleteSession { id } => {
            keys::check_session_id(&id)?;
            let key = keys::session_key(&id);
            // Presence is enough: a corrupt record can still be deleted.
            if stage.get(TreeId::Sessions, &key)?.is_none() {
                return Err(StoreError::SessionNotFound { id });
            }
            let prefix = keys::session_prefix(&id);
            let mut spans_deleted = 0;
            for tree in TreeId::PER_SESSION {
                for key in stage.scan_keys(tree, &prefix)? {
                    if matches!(tree, TreeId::Spans | TreeId::Archive) {
                        spans_deleted += 1;
                    }
                    stage.del(tree, key);
                }
            }
            stage.del(TreeId::Sessions, key);
            effects.sessions -= 1;
            effects.reset.push(id.clone());
            Ok(WriteAck {
                marker_seq: None,
                spans_deleted,
            })
        }
        WriteOp::Change { change, keys } => write_change(stage, change, keys, seq, effects),
    }
}

/// Checks a change against the stored session and stages each part it
/// has, in order: evict, rewrite in place, summary, append with its keys,
/// marker, record. Rewrites come before the summary, as the session
/// applies them, so a rewrite never names the summary.
fn write_change(
    stage: &mut Stage<'_>,
    change: Change,
    idempotency: Vec<(String, SpanId)>,
    seq: u64,
    effects: &mut Effects,
) -> Result<WriteAck, StoreError> {
    let Change {
        expected_revision,
        record,
        append,
        evict,
        summary,
        replace,
        marker,
    } = change;
    let session = record.id.as_str();
    keys::check_session_id(session)?;
    let stored = load_session(stage, session)?;
    check_revision(session, expected_revision, &stored)?;
    if record.next_span_id < stored.next_span_id {
        return Err(invalid(
            session,
            format!(
                "next_span_id would move back from {} to {}",
                stored.next_span_id, record.next_span_id
            ),
        ));
    }
    match &marker {
        // A rewrite in place and an admission stand alone; anything more
        // is a compaction, which needs its marker.
        None if !evict.is_empty()
            || summary.is_some()
            || !(replace.is_empty() || append.is_empty()) =>
        {
            return Err(invalid(
                session,
                "a change that evicts or rewrites spans carries no marker".into(),
            ));
        }
        None => {}
        Some(marker) => {
            check_marker(session, marker, &record)?;
            if marker.outcome == Outcome::Aborted {
                // Nothing changes but the record's marker count.
                check_revision(session, record.revision, &stored)?;
                if !(append.is_empty()
                    && evict.is_empty()
                    && summary.is_none()
                    && replace.is_empty())
                {
                    return Err(invalid(
                        session,
                        "an ABORTED marker comes with changes to the context".into(),
                    ));
                }
            }
        }
    }

    let mut index = None;
    for id in evict {
        let Some((key, span)) = find_live(stage, session, id, &mut index)? else {
            return Err(invalid(session, format!("span {id} to evict is not live")));
        };
        stage.del(TreeId::Spans, key);
        let archive_key = keys::session_number_key(session, id);
        let value = record::encode_archived(&archive_key, &span, seq);
        stage.put(TreeId::Archive, archive_key.clone(), value);
        if stage.get(TreeId::Pins, &archive_key)?.is_some() {
            stage.del(TreeId::Pins, archive_key);
        }
    }
    for span in &replace {
        let key = keys::session_number_key(session, span.position);
        let holder = match stage.get(TreeId::Spans, &key)? {
            Some(value) => Some(record::decode_span(&key, &value)?.id),
            None => None,
        };
        if holder != Some(span.id) {
            let holder = holder.map_or("no live span".into(), |id| format!("span {id}"));
            return Err(invalid(
                session,
                format!(
                    "span {} to rewrite: position {} holds {holder}",
                    span.id, span.position
                ),
            ));
        }
        let value = record::encode_span(&key, span);
        stage.put(TreeId::Spans, key, value);
        sync_pin(stage, session, span)?;
    }
    for span in summary.iter().chain(&append) {
        check_new_id(session, span.id, &stored, &record)?;
        insert_span(stage, session, span)?;
    }
    for (key, span_id) in &idempotency {
        if !append.iter().any(|s| s.id == *span_id) {
            return Err(invalid(
                session,
                format!(
                    "idempotency key {key:?} names span {span_id}, which this write does not admit"
                ),
            ));
        }
        let stored_key = keys::session_text_key(session, key);
        if stage.get(TreeId::Keys, &stored_key)?.is_some() {
            return Err(invalid(
                session,
                format!("idempotency key {key:?} is already taken"),
            ));
        }
        let value = record::encode_key(&stored_key, *span_id);
        stage.put(TreeId::Keys, stored_key, value);
    }
    let marker_seq = marker.map(|marker| {
        put_marker(stage, marker, seq, effects);
        seq
    });
    put_session(stage, &record);
    Ok(WriteAck {
        marker_seq,
        spans_deleted: 0,
    })
}
