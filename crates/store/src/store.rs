//! The store's handle: opening, reading, queueing writes, closing.

use std::cell::Cell;
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ctxbroker_core::{Marker, Span, SpanId};
use tokio::sync::{mpsc, oneshot};

use crate::blocks;
use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::migrate;
use crate::model::{
    Durability, MarkerBounds, Pin, SessionMarkers, SessionRecord, StoreOptions, StoreStats,
    StoredSpan, WriteAck, WriteOp,
};
use crate::record;
use crate::writer::{
    Encoded, EpochFile, Flusher, Handoff, Msg, Op, Request, Shared, Trees, Writer, WriterCell,
};

/// A session's live spans, in prompt order, with the seed of each span's
/// facts its row carries (see [`Store::live_spans_seeded`]).
pub type LiveSeeded = (Vec<Span>, Vec<Option<Box<[u8]>>>);

/// A handle on an open store. Cheap to clone: every clone shares the same
/// engine and the same writer. Reads go straight to the engine from the
/// calling thread; writes are queued to the one writer thread (with
/// relaxed durability, an append that finds the writer idle is applied by
/// the calling task, under the writer's lock).
///
/// Dropping the last handle closes the store as [`Store::close`] does.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    trees: Trees,
    shared: Arc<Shared>,
    queue: mpsc::Sender<Msg>,
    /// The writer's state, which a request task may take to apply its own
    /// append (see [`Writer::apply_here`]).
    writer_state: Arc<WriterCell>,
    /// Taken by the first `close`, which joins it.
    writer: Mutex<Option<JoinHandle<Result<(), StoreError>>>>,
    /// Set by [`Store::check_reads_off_workers`].
    checked: AtomicBool,
}

thread_local! {
    /// Set while the thread runs [`Store::off_workers`].
    static OFF_WORKERS: Cell<bool> = const { Cell::new(false) };
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .field("markers", &self.inner.shared.bounds())
            .field("sessions", &self.session_count())
            .finish_non_exhaustive()
    }
}

/// How long an open waits for the directory's lock to be released: the
/// engine of a store closed an instant ago (a restart in the same process,
/// a process still exiting) lets go of it from its own threads, a moment
/// after the last handle is dropped. A directory held longer — another
/// daemon serving it — is refused after this wait.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The most new text a write's rows are encoded for on the calling task;
/// a larger change is encoded on the blocking pool (see [`Store::write`]).
pub(crate) const ENCODE_INLINE_BYTES: usize = 64 << 10;

/// Opens the engine, waiting at most [`LOCK_WAIT`] for the directory's
/// lock.
fn open_engine(dir: &Path, options: &StoreOptions) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_capacity_bytes)
            .flush_every_ms(Some(500))
            .open();
        match opened {
            Ok(db) => return Ok(db),
            // sled 0.34.7 (pinned) reports a held lock as an `Other` I/O
            // error with this message.
            Err(sled::Error::Io(err))
                if err.to_string().starts_with("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => {
                return Err(match StoreError::engine(e) {
                    StoreError::Io(msg) => {
                        StoreError::Io(format!("opening {}: {msg}", dir.display()))
                    }
                    other => other,
                });
            }
        }
    }
}

/// What [`Store::write_seeded`] returns: the acknowledgement, and the
/// seeds of the facts of the new spans it stored, by span id.
type Seeded = Result<(WriteAck, Vec<(SpanId, Vec<u8>)>), StoreError>;

impl Store {
    /// Opens (or creates) the store in `dir` and starts its writer.
    ///
    /// Refuses a store written in a newer format
    /// ([`StoreError::UnsupportedFormat`]) and one whose bookkeeping does
    /// not add up ([`StoreError::Corrupt`]).
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        crate::dir::make_private(dir)?;
        let db = open_engine(dir, &options)?;
        let trees = Trees::open(db)?;
        let (next_seq, oldest_seq, format) = check_format(&trees)?;
        let (mut epoch_file, recorded) = EpochFile::open(dir)?;
        let epoch = check_epoch(&trees, dir, recorded)?;
        // Every flush from here on syncs the engine's new blob files first.
        let mut blobs = crate::writer::blobs::BlobSync::open(dir.to_owned())
            .map_err(|e| StoreError::Io(format!("syncing the engine's blob files: {e}")))?;
        crate::writer::repair_torn_appends(&trees, &mut blobs)?;
        epoch_file.record(epoch)?;
        migrate::upgrade(&trees, dir, format, &mut blobs)?;
        let sessions = trees.sessions.len() as u64;
        let shared = Arc::new(Shared::new(
            MarkerBounds {
                oldest: oldest_seq,
                next: next_seq,
            },
            sessions,
            options.search_cache_bytes,
        ));
        let max_batch = options.max_batch.max(1);
        let (queue, rx) = mpsc::channel(max_batch.saturating_mul(2));
        let flusher = Flusher {
            db: trees.db.clone(),
            shared: Arc::clone(&shared),
            durability: options.durability,
            hook: options.on_commit,
            on_flush: options.on_flush,
            unpublished: Vec::new(),
            bounds: None,
            epoch_file,
            epoch,
            blobs,
            blobs_synced_at: std::time::Instant::now(),
        };
        let handoff = match options.durability {
            Durability::Flush => {
                let (to, from_writer) = std::sync::mpsc::channel();
                // The kernel keeps 15 bytes of a thread's name: these two
                // stay apart in `top -H` and `/proc`.
                let thread = std::thread::Builder::new()
                    .name("store-flusher".into())
                    .spawn(move || flusher.run(from_writer))
                    .map_err(|e| StoreError::Io(format!("starting the flusher thread: {e}")))?;
                Handoff::Thread { to, thread }
            }
            Durability::Relaxed => Handoff::Inline(Box::new(flusher)),
        };
        let writer = Writer {
            trees: trees.clone(),
            shared: Arc::clone(&shared),
            retention: options.marker_retention,
            handoff,
            next_seq,
            oldest_seq,
            sessions,
            epoch,
            torn: false,
        };
        let writer_state = Arc::new(WriterCell::new(Some(writer)));
        let handle = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn({
                let cell = Arc::clone(&writer_state);
                let shared = Arc::clone(&shared);
                move || Writer::run(cell, rx, shared, max_batch)
            })
            .map_err(|e| StoreError::Io(format!("starting the writer thread: {e}")))?;
        Ok(Store {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                trees,
                shared,
                queue,
                writer_state,
                writer: Mutex::new(Some(handle)),
                checked: AtomicBool::new(false),
            }),
        })
    }

    /// Queues a write to the writer and waits for its acknowledgement,
    /// which comes once the write's batch is applied and (with
    /// [`Durability::Flush`](crate::Durability::Flush)) flushed. Waits for
    /// room when the queue is full, so a burst slows callers down instead
    /// of growing memory.
    ///
    /// A write whose caller stops waiting after it was queued may still be
    /// applied. With relaxed durability, a write that only appends a turn
    /// of at most [`ENCODE_INLINE_BYTES`] of new text and finds the writer
    /// idle and nothing queued is applied by the calling task itself, under
    /// the writer's lock (a few inserts into the engine's cached pages, no
    /// flush), and acknowledged at once, without any hand-off between
    /// threads. A larger turn goes to the writer's thread: the engine keeps
    /// a value of more than about 128 KiB in a file of its own, which the
    /// inserting thread creates.
    ///
    /// The rows of the write's new spans are encoded here, by the calling
    /// task, so that the one writer thread only checks and applies them; a
    /// change with more than [`ENCODE_INLINE_BYTES`] of new text is encoded
    /// on the blocking pool, off the async workers.
    ///
    /// The write is boxed before the returned future is made, so that this
    /// future and every future awaiting it hold a pointer to it: the
    /// futures of a request are moved whole, and a write is about a
    /// kilobyte.
    pub fn write(
        &self,
        op: WriteOp,
    ) -> impl Future<Output = Result<WriteAck, StoreError>> + Send + '_ {
        let seeded = self.write_seeded(op);
        async move { seeded.await.map(|(ack, _)| ack) }
    }

    /// [`Store::write`], returning with the acknowledgement the seeds of
    /// the facts of the new spans it stored (a change's summary and
    /// appended spans), by span id: what `Session::apply_seeded` reads
    /// their facts from (see `ctxbroker_core::facts::seed`).
    pub fn write_seeded(&self, op: WriteOp) -> impl Future<Output = Seeded> + Send + '_ {
        let op = Box::new(op);
        async move {
            let small = Encoded::text_bytes(&op) <= ENCODE_INLINE_BYTES;
            let (op, mut encoded) = if small {
                let encoded = Encoded::of(&op);
                (op, encoded)
            } else {
                tokio::task::spawn_blocking(move || {
                    let encoded = Encoded::of(&op);
                    (op, encoded)
                })
                .await
                .map_err(|err| match err.is_cancelled() {
                    // The runtime is shutting down.
                    true => StoreError::Closed,
                    false => StoreError::Engine(format!("encoding the write's rows failed: {err}")),
                })?
            };
            let seeds = encoded.take_seeds();
            let ack = self.send(Op::Write(op), encoded, small).await?;
            Ok((ack, seeds))
        }
    }

    /// Queues anything the writer applies; see [`Store::write`].
    pub(crate) async fn submit(&self, op: Op) -> Result<WriteAck, StoreError> {
        self.send(op, Encoded::default(), false).await
    }

    /// Queues a write, or applies it here when `may_apply_here` and the
    /// writer allows it (see [`Writer::apply_here`]).
    async fn send(
        &self,
        op: Op,
        encoded: Encoded,
        may_apply_here: bool,
    ) -> Result<WriteAck, StoreError> {
        if self.inner.shared.closing.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        let (ack, outcome) = oneshot::channel();
        let mut request = Request { op, ack, encoded };
        // Nothing queued before it: a write waiting in the queue means a
        // busy writer, which batches better than a request on its own.
        let queue = &self.inner.queue;
        if may_apply_here && queue.capacity() == queue.max_capacity() {
            match Writer::apply_here(&self.inner.writer_state, request) {
                None => return outcome.await.map_err(|_| StoreError::Closed)?,
                Some(back) => request = back,
            }
        }
        queue
            .send(Msg::Write(request))
            .await
            .map_err(|_| StoreError::Closed)?;
        outcome.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f`, whose store reads the caller has put off the async
    /// workers (on a blocking pool, or on a thread of its own), as such for
    /// [`Store::check_reads_off_workers`].
    pub fn off_workers<T>(f: impl FnOnce() -> T) -> T {
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                OFF_WORKERS.set(self.0);
            }
        }
        let _restore = Restore(OFF_WORKERS.replace(true));
        f()
    }

    /// From now on, every read of this store that may touch the disk (all
    /// but the counters kept in memory) panics when it runs inside a tokio
    /// runtime but outside [`Store::off_workers`]: there it could block an
    /// async worker on the disk. A check for debug builds and tests, which
    /// costs a release build one relaxed load a read. (tokio cannot tell a
    /// worker from a thread of its blocking pool: both run inside the
    /// runtime, so whoever puts reads on the pool marks them.)
    pub fn check_reads_off_workers(&self) {
        self.inner.checked.store(true, Ordering::Relaxed);
    }

    /// The check of [`Store::check_reads_off_workers`], at the start of
    /// every read that may touch the disk.
    pub(crate) fn reading(&self, what: &str) {
        if self.inner.checked.load(Ordering::Relaxed)
            && !OFF_WORKERS.get()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            panic!("Store::{what} read on an async worker: run it off the workers");
        }
    }

    /// A session's record, if it exists.
    pub fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.reading("session");
        keys::check_session_id(id)?;
        let key = keys::session_key(id);
        match get_counted(&self.inner.trees.sessions, &key)? {
            Some(value) => record::decode_session(&key, &value).map(Some),
            None => Ok(None),
        }
    }

    /// Up to `limit` sessions in id order (byte order of the ids), strictly
    /// after `after`: pages of a listing.
    pub fn sessions(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions_under("", after, limit)
    }

    /// Sessions whose ids start with `prefix`, in id order after `after`,
    /// at most `limit`: one tenant's sessions when the prefix is
    /// `tenant/`.
    pub fn sessions_under(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.reading("sessions");
        let start = match after {
            Some(after) if after > prefix => Bound::Excluded(keys::session_key(after)),
            _ => Bound::Included(keys::session_key(prefix)),
        };
        let tree = &self.inner.trees.sessions;
        let range = tree.range::<Vec<u8>, _>((start.clone(), Bound::Unbounded));
        let mut out = Vec::with_capacity(limit.min(1024));
        let mut last = None;
        for entry in range.take(limit) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            if !key.starts_with(prefix.as_bytes()) {
                break;
            }
            out.push(record::decode_session(&key, &value)?);
            last = Some(key);
        }
        if let Some(last) = last {
            count_walk(tree.range::<Vec<u8>, _>((start, Bound::Included(last.to_vec()))))?;
        }
        Ok(out)
    }

    /// How many sessions are stored; kept in memory by the writer.
    pub fn session_count(&self) -> u64 {
        self.inner.shared.sessions.load(Ordering::Relaxed)
    }

    /// A session's live context, in prompt order (by position).
    pub fn live_spans(&self, id: &str) -> Result<Vec<Span>, StoreError> {
        self.reading("live_spans");
        let mut spans = Vec::new();
        self.scan_live(id, |key, value| {
            spans.push(record::decode_span(key, value)?);
            Ok(())
        })?;
        Ok(spans)
    }

    /// [`Store::live_spans`], with the seed of each span's facts its row
    /// carries (`seeds[k]` for `spans[k]`): what `Session::with_seeds`
    /// reads the facts from.
    pub fn live_spans_seeded(&self, id: &str) -> Result<LiveSeeded, StoreError> {
        self.reading("live_spans_seeded");
        let (mut spans, mut seeds) = (Vec::new(), Vec::new());
        self.scan_live(id, |key, value| {
            let (span, seed) = record::decode_seeded_span(key, value)?;
            spans.push(span);
            seeds.push(seed.map(Vec::into_boxed_slice));
            Ok(())
        })?;
        Ok((spans, seeds))
    }

    /// Calls `f` with the key and value of each of a session's live spans,
    /// in position order, as of one moment.
    fn scan_live(
        &self,
        id: &str,
        f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        keys::check_session_id(id)?;
        let _snapshot = self.snapshot();
        self.require_session(id)?;
        walk_live(&self.inner.trees, id, f)
    }

    /// How many stored sessions have an id starting with `prefix` (a
    /// tenant's sessions, for `tenant/`): a walk over the sessions tree's
    /// keys, decoding no record.
    pub fn session_count_with_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.reading("session_count_with_prefix");
        let tree = &self.inner.trees.sessions;
        let mut count = 0;
        for entry in tree.scan_prefix(prefix.as_bytes()) {
            entry.map_err(StoreError::engine)?;
            count += 1;
        }
        count_walk(tree.scan_prefix(prefix.as_bytes()))?;
        Ok(count)
    }

    /// The text bytes ([`crate::text_bytes`]) of a session's spans, live
    /// and archived, read as of one moment.
    pub fn session_text_bytes(&self, id: &str) -> Result<u64, StoreError> {
        self.reading("session_text_bytes");
        keys::check_session_id(id)?;
        let _snapshot = self.snapshot();
        self.require_session(id)?;
        self.read_text_bytes(id)
    }

    /// The text bytes of every session whose id starts with `prefix` (a
    /// tenant's, for `tenant/`), each session read as of one moment (not
    /// all of them as of the same one: the writer is held up for one
    /// session at a time).
    pub fn text_bytes_with_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.reading("text_bytes_with_prefix");
        let mut total = 0;
        for entry in self.inner.trees.sessions.scan_prefix(prefix.as_bytes()) {
            let (key, _) = entry.map_err(StoreError::engine)?;
            let Ok(id) = std::str::from_utf8(&key) else {
                return Err(record::corrupt(
                    TreeId::Sessions,
                    &key,
                    "the session id is not UTF-8",
                ));
            };
            let _snapshot = self.snapshot();
            if get_counted(&self.inner.trees.sessions, &key)?.is_some() {
                total += self.read_text_bytes(id)?;
            }
        }
        Ok(total)
    }

    /// [`Store::session_text_bytes`] without the checks, under the
    /// caller's snapshot.
    fn read_text_bytes(&self, id: &str) -> Result<u64, StoreError> {
        let prefix = keys::session_prefix(id);
        let mut bytes = 0;
        walk_live(&self.inner.trees, id, |key, row| {
            bytes += crate::text_bytes(&record::decode_span(key, row)?);
            Ok(())
        })?;
        let archive = &self.inner.trees.archive;
        for entry in archive.scan_prefix(&prefix) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            bytes += crate::text_bytes(&record::decode_archived(&key, &value)?.0);
        }
        count_walk(archive.scan_prefix(&prefix))?;
        Ok(bytes)
    }

    /// One span of a session by id, live or archived.
    pub fn span(&self, session: &str, span_id: SpanId) -> Result<Option<StoredSpan>, StoreError> {
        self.reading("span");
        keys::check_session_id(session)?;
        let _snapshot = self.snapshot();
        self.require_session(session)?;
        self.read_span(session, span_id)
    }

    /// [`Store::span`] without the checks, under the caller's snapshot.
    fn read_span(&self, session: &str, span_id: SpanId) -> Result<Option<StoredSpan>, StoreError> {
        crate::search::Resolver::new(self, session).get(span_id)
    }

    /// The spans a caller's idempotency keys admitted, live or archived,
    /// one answer per key (`None` for a key the session never admitted),
    /// read as of one moment.
    pub fn spans_by_keys(
        &self,
        session: &str,
        idempotency_keys: &[String],
    ) -> Result<Vec<Option<StoredSpan>>, StoreError> {
        self.reading("spans_by_keys");
        keys::check_session_id(session)?;
        let _snapshot = self.snapshot();
        self.require_session(session)?;
        let mut out = Vec::with_capacity(idempotency_keys.len());
        for key in idempotency_keys {
            let stored_key = keys::session_text_key(session, key);
            let Some(value) = get_counted(&self.inner.trees.keys, &stored_key)? else {
                out.push(None);
                continue;
            };
            let span_id = record::decode_key(&stored_key, &value)?;
            // A key is never rewritten, only deleted with its session or
            // with the span it admitted when that span is taken back.
            match self.read_span(session, span_id)? {
                Some(span) => out.push(Some(span)),
                None => {
                    return Err(record::corrupt(
                        TreeId::Keys,
                        &stored_key,
                        format!("names span {span_id}, which the session does not hold"),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Every idempotency key the session has admitted a span with, in key
    /// order: what a server needs to answer "is this key new" without a
    /// read per turn. A key that is not UTF-8 is refused as corrupt.
    pub fn idempotency_keys(&self, session: &str) -> Result<Vec<String>, StoreError> {
        self.reading("idempotency_keys");
        keys::check_session_id(session)?;
        let _snapshot = self.snapshot();
        self.require_session(session)?;
        let prefix = keys::session_prefix(session);
        let tree = &self.inner.trees.keys;
        let mut out = Vec::new();
        for entry in tree.scan_prefix(&prefix).keys() {
            let key = entry.map_err(StoreError::engine)?;
            let text = key
                .get(prefix.len()..)
                .and_then(|rest| std::str::from_utf8(rest).ok())
                .ok_or_else(|| record::corrupt(TreeId::Keys, &key, "the key is not UTF-8"))?;
            out.push(text.to_owned());
        }
        count_walk(tree.scan_prefix(&prefix))?;
        Ok(out)
    }

    /// A session's pin set: its live constraints and their predicates, in
    /// span id order.
    pub fn pins(&self, session: &str) -> Result<Vec<Pin>, StoreError> {
        self.reading("pins");
        keys::check_session_id(session)?;
        let _snapshot = self.snapshot();
        self.require_session(session)?;
        let mut pins = Vec::new();
        let tree = &self.inner.trees.pins;
        for entry in tree.scan_prefix(keys::session_prefix(session)) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            pins.push(record::decode_pin(&key, &value)?);
        }
        count_walk(tree.scan_prefix(keys::session_prefix(session)))?;
        Ok(pins)
    }

    /// Up to `limit` committed markers with seq ≥ `from_seq`, ascending and
    /// contiguous. Never returns a marker beyond the committed head (see
    /// [`Store::marker_bounds`]); returns an empty list at the head.
    ///
    /// Fails with [`StoreError::MarkersTrimmed`] when markers from
    /// `from_seq` (or from 1, for 0) are no longer all retained, so that a
    /// reader can never skip one silently.
    pub fn markers(&self, from_seq: u64, limit: usize) -> Result<Vec<Marker>, StoreError> {
        self.reading("markers");
        let bounds = self.inner.shared.bounds();
        let start = from_seq.max(1);
        let trimmed = |oldest: u64| StoreError::MarkersTrimmed { from_seq, oldest };
        if start < bounds.oldest {
            return Err(trimmed(bounds.oldest));
        }
        if start >= bounds.next || limit == 0 {
            return Ok(Vec::new());
        }
        let range = self
            .inner
            .trees
            .markers
            .range(keys::marker_key(start)..keys::marker_key(bounds.next));
        let mut out: Vec<Marker> = Vec::with_capacity(limit.min(1024));
        for entry in range.take(limit) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            let marker = record::decode_marker(&key, &value)?;
            let expected = start + out.len() as u64;
            if marker.seq != expected {
                // Retention removed markers while this read ran. What was
                // read so far is contiguous; the caller's next read will
                // report the trim.
                if out.is_empty() {
                    return Err(trimmed(marker.seq));
                }
                break;
            }
            out.push(marker);
        }
        if let Some(last) = out.last() {
            count_walk(
                self.inner
                    .trees
                    .markers
                    .range(keys::marker_key(start)..=keys::marker_key(last.seq)),
            )?;
        }
        if out.is_empty() {
            // Everything from `start` was removed while this read ran.
            return Err(trimmed(self.inner.shared.bounds().oldest.max(start + 1)));
        }
        Ok(out)
    }

    /// One session's committed markers, newest first: at most `limit` of
    /// them, found by walking the marker log down from below `before`
    /// (from the committed head for `None`) over at most `scan` markers of
    /// any session. The log is global, so the walk is bounded: a page's
    /// `before` says where to go on, and is `None` once the oldest
    /// retained marker was reached. Markers that retention removes while
    /// the walk runs are simply not found.
    pub fn session_markers(
        &self,
        session: &str,
        before: Option<u64>,
        limit: usize,
        scan: usize,
    ) -> Result<SessionMarkers, StoreError> {
        self.reading("session_markers");
        keys::check_session_id(session)?;
        let bounds = self.inner.shared.bounds();
        let end = before.map_or(bounds.next, |b| b.min(bounds.next));
        let mut page = SessionMarkers::default();
        if end <= bounds.oldest || limit == 0 {
            return Ok(page);
        }
        let tree = &self.inner.trees.markers;
        let range = keys::marker_key(bounds.oldest)..keys::marker_key(end);
        let mut lowest = end;
        let mut walked = 0;
        // The session's first marker ends the walk: nothing older is its.
        let mut first_found = false;
        for entry in tree.range(range).rev() {
            if walked == scan.max(1) || page.markers.len() == limit {
                break;
            }
            let (key, value) = entry.map_err(StoreError::engine)?;
            walked += 1;
            let marker = record::decode_marker(&key, &value)?;
            lowest = marker.seq;
            if marker.session_id == session {
                first_found = marker.session_seq <= 1;
                page.markers.push(marker);
                if first_found {
                    break;
                }
            }
        }
        if walked > 0 {
            count_walk(tree.range(keys::marker_key(lowest)..keys::marker_key(end)))?;
        }
        page.before = (lowest > bounds.oldest && !first_found).then_some(lowest);
        Ok(page)
    }

    /// The committed marker log: the writer advances `next` only after the
    /// markers below it are flushed, and before it hands them to the commit
    /// hook.
    pub fn marker_bounds(&self) -> MarkerBounds {
        self.inner.shared.bounds()
    }

    /// How the writer has batched so far.
    pub fn stats(&self) -> StoreStats {
        let queue = &self.inner.queue;
        StoreStats {
            queued: (queue.max_capacity() - queue.capacity()) as u64,
            ..self.inner.shared.stats()
        }
    }

    /// Stops accepting writes, lets the writer finish what is queued, flushes
    /// one last time and joins the writer. Later writes fail with
    /// [`StoreError::Closed`]; reads keep working. Closing again is a no-op.
    ///
    /// The directory stays locked until the last handle is dropped.
    pub fn close(&self) -> Result<(), StoreError> {
        self.inner.close()
    }

    /// The engine's trees, for reads that live in other modules (the
    /// session transfer).
    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    pub(crate) fn trees(&self) -> &Trees {
        &self.inner.trees
    }

    pub(crate) fn snapshot(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.inner
            .shared
            .snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn require_session(&self, id: &str) -> Result<(), StoreError> {
        let present = get_counted(&self.inner.trees.sessions, &keys::session_key(id))?.is_some();
        if present {
            Ok(())
        } else {
            Err(StoreError::SessionNotFound { id: id.to_owned() })
        }
    }

    /// The engine tree behind a keyspace, for tests that damage records.
    #[cfg(test)]
    pub(crate) fn raw_tree(&self, tree: TreeId) -> &sled::Tree {
        self.inner.trees.tree(tree)
    }

    /// The writer's state, for tests that hold or poison its lock.
    #[cfg(test)]
    pub(crate) fn writer_state(&self) -> &WriterCell {
        &self.inner.writer_state
    }

    /// The engine itself, for tests that write what another format held.
    #[cfg(test)]
    pub(crate) fn raw_db(&self) -> &sled::Db {
        &self.inner.trees.db
    }
}

impl Inner {
    fn close(&self) -> Result<(), StoreError> {
        self.shared.closing.store(true, Ordering::SeqCst);
        // A full queue needs no wake-up: the writer is not waiting.
        let _ = self.queue.try_send(Msg::Wake);
        let mut writer = self
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(handle) = writer.take() else {
            return Ok(());
        };
        if handle.thread().id() == std::thread::current().id() {
            // Dropped from the writer itself: it is already on its way out.
            return Ok(());
        }
        handle
            .join()
            .map_err(|_| StoreError::Engine("the writer thread panicked".into()))?
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// A point read whose leaf the engine's cache counts.
///
/// sled 0.34 counts a page against its cache only when it finds the page
/// already in memory: a page it pulls from disk is installed uncounted
/// (`PageCache::get` tells its LRU only of hits), so a page read once is
/// never paged out, and memory grows with every distinct page read, past
/// any cache capacity (measured: reading back 1,000 sessions of 1,000
/// spans once kept about 150 MB of leaves in memory under an 8 MiB
/// cache). So every read visits what it read a second time: now a hit,
/// which the LRU counts and can page out again.
pub(crate) fn get_counted(tree: &sled::Tree, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
    let value = tree.get(key).map_err(StoreError::engine)?;
    tree.get(key).map_err(StoreError::engine)?;
    Ok(value)
}

/// Calls `f` with the key and row of each of a session's live spans, in
/// position order, under the caller's snapshot (see
/// [`blocks::in_position_order`]); then walks the rows again for the
/// engine's cache ([`count_walk`]), and looks each packed block's run up
/// [`RUN_NOTES`] times more by key.
///
/// The engine takes note of the pages a thread touched in batches, 64
/// notes per shard of its cache (256 shards), and counts and pages out
/// only when it reads a shard's batch; a walk notes each page once,
/// however many keys it reads from it. A walk over packed blocks touches
/// few pages, each large (up to 16 runs of 16 spans), so the batches
/// filled slowly and pages read back waited in them, uncounted, several
/// per shard: at 2,000 sessions × 1,000 spans, 130 MiB more after reading
/// all of them than with a row per span, and still about 60 MiB more with
/// a look-up per run. Noted [`RUN_NOTES`] times per run, a page of 8 runs
/// or more fills a batch of its own, so a shard holds about one such page
/// uncounted.
pub(crate) fn walk_live(
    trees: &Trees,
    session: &str,
    f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let prefix = keys::session_prefix(session);
    let mut run_keys = Vec::new();
    let runs = blocks::entries(trees.runs.scan_prefix(&prefix)).inspect(|entry| {
        if let Ok((key, _)) = entry {
            run_keys.push(key.clone());
        }
    });
    blocks::in_position_order(blocks::entries(trees.spans.scan_prefix(&prefix)), runs, f)?;
    count_walk(trees.spans.scan_prefix(&prefix))?;
    for key in run_keys {
        for _ in 0..RUN_NOTES {
            trees.runs.get(&key).map_err(StoreError::engine)?;
        }
    }
    Ok(())
}

/// How many times [`walk_live`] looks each run up after reading it: a
/// page of 8 runs (the engine splits a page past 16 keys) is then noted 64
/// times, a shard's batch. Measured at 2,000 sessions × 1,000 spans, RSS
/// after reading them all: 276 MiB with one look-up, 228 with 4, 216 with
/// 8, in as long.
const RUN_NOTES: usize = 8;

/// Walks a range a first walk read, so that the engine's cache counts the
/// leaves that walk pulled in (see [`get_counted`]). In memory, it costs
/// a fraction of the first walk.
pub(crate) fn count_walk(walk: sled::Iter) -> Result<(), StoreError> {
    for entry in walk {
        entry.map_err(StoreError::engine)?;
    }
    Ok(())
}

/// The engine's commit epoch, checked against the one recorded beside it
/// after the last flush: an engine behind that record lost acknowledged
/// writes (see [`EpochFile`]), and the store is refused.
///
/// The engine's epoch is the newest of the meta tree's and of those the
/// session records carry (a batch of appends puts its epoch in the last
/// record it writes instead of the meta tree). A damaged record is
/// reported where it is read, as before, and carries none here.
fn check_epoch(trees: &Trees, dir: &Path, recorded: Option<u64>) -> Result<u64, StoreError> {
    let mut engine = match trees
        .meta
        .get(keys::META_COMMIT_EPOCH)
        .map_err(StoreError::engine)?
    {
        Some(value) => record::decode_epoch(&value)
            .map_err(|detail| record::corrupt(TreeId::Meta, keys::META_COMMIT_EPOCH, detail))?,
        None => 0,
    };
    for entry in trees.sessions.iter() {
        let (key, value) = entry.map_err(StoreError::engine)?;
        if let Ok(epoch) = record::session_epoch(&key, &value) {
            engine = engine.max(epoch);
        }
    }
    match recorded {
        Some(acknowledged) if acknowledged > engine => Err(record::corrupt(
            TreeId::Meta,
            keys::META_COMMIT_EPOCH,
            format!(
                "the store lost acknowledged writes: commit epoch {acknowledged} was flushed and acknowledged, but the engine recovered only epoch {engine} from {}; its log is damaged (a flipped bit or a truncated file). Refusing to serve it as valid: restore the directory from a backup, or remove {} to accept the loss",
                dir.display(),
                dir.join(EpochFile::NAME).display()
            ),
        )),
        _ => Ok(engine),
    }
}

/// Checks the stored format version (writing it into a new store) and
/// returns the marker log's `(next, oldest)` and the version: this build's
/// or one [`migrate`] brings up to it.
fn check_format(trees: &Trees) -> Result<(u64, u64, u32), StoreError> {
    let meta = &trees.meta;
    let meta_corrupt = |key: &[u8], detail: &str| record::corrupt(TreeId::Meta, key, detail);
    let Some(version) = meta.get(keys::META_FORMAT).map_err(StoreError::engine)? else {
        for tree in TreeId::ALL {
            if !trees.tree(tree).is_empty() {
                return Err(meta_corrupt(
                    keys::META_FORMAT,
                    &format!("missing, but tree {} holds data", tree.name()),
                ));
            }
        }
        let mut batch = sled::Batch::default();
        batch.insert(
            keys::META_FORMAT,
            &record::encode_format_version(migrate::STORE_FORMAT)[..],
        );
        batch.insert(keys::META_MARKER_LOG, record::encode_marker_log(1, 1));
        meta.apply_batch(batch).map_err(StoreError::engine)?;
        trees.db.flush().map_err(StoreError::engine)?;
        return Ok((1, 1, migrate::STORE_FORMAT));
    };
    let version = record::decode_format_version(&version)?;
    let supported = migrate::STORE_FORMAT;
    if version > supported {
        return Err(StoreError::UnsupportedFormat {
            found: version,
            supported,
        });
    }
    if version < migrate::SEPARATE_TERMS_FORMAT {
        return Err(meta_corrupt(
            keys::META_FORMAT,
            &format!("format version {version} was never written by any build"),
        ));
    }
    let log = match meta
        .get(keys::META_MARKER_LOG)
        .map_err(StoreError::engine)?
    {
        Some(value) => record::decode_marker_log(&value)?,
        None => return Err(meta_corrupt(keys::META_MARKER_LOG, "missing")),
    };
    // A marker at or past `next` would be overwritten by the next write.
    if let Some((key, _)) = trees.markers.last().map_err(StoreError::engine)? {
        match keys::parse_marker_key(&key) {
            Some(seq) if seq < log.next_seq => {}
            _ => {
                return Err(meta_corrupt(
                    keys::META_MARKER_LOG,
                    &format!(
                        "says the next marker is {} but the log holds {}",
                        log.next_seq,
                        keys::render(TreeId::Markers, &key)
                    ),
                ));
            }
        }
    }
    Ok((log.next_seq, log.oldest_seq, version))
}
