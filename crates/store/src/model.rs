//! The store's public data: what it keeps per session and the writes it
//! accepts.

use std::fmt;
use std::sync::Arc;

pub use ctxbroker_core::session::{Change, SessionRecord};
use ctxbroker_core::span::Predicate;
use ctxbroker_core::{Marker, Span, SpanId};

/// Where a span is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanState {
    /// In the live context.
    Live,
    /// Evicted by a compaction and kept in the archive.
    Archived {
        /// The seq of the marker whose compaction evicted it.
        by_seq: u64,
    },
}

/// A span with where it is, as [`Store::span`](crate::Store::span)
/// returns it: callers asking for a span by id need to know whether it is
/// still in the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSpan {
    /// The span.
    pub span: Span,
    /// Live or archived.
    pub state: SpanState,
}

/// The text bytes a span holds in the store: its text, plus the form it
/// was admitted in when it is a compressed constraint (the store keeps
/// both), plus what the caller attached to it. UTF-8 bytes of text, not the engine's bytes on disk: what a
/// tenant's storage quota counts.
pub fn text_bytes(span: &Span) -> u64 {
    let original = span.original.as_ref().map_or(0, |o| o.text.len());
    let attributes = span.attributes.as_deref().map_or(0, |a| a.text_bytes());
    (span.text.len() + original + attributes) as u64
}

/// One entry of a session's pin set: a live constraint and what it
/// demands.
#[derive(Debug, Clone, PartialEq)]
pub struct Pin {
    /// The constraint span.
    pub span_id: SpanId,
    /// Its predicate, when it has one.
    pub predicate: Option<Predicate>,
}

/// A write handed to the writer. Each one is applied whole or not at all,
/// and is checked against the stored state (existence, revision) when the
/// writer takes it, so that a write planned on a stale view is refused
/// instead of overwriting a newer one.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // `Store::write_seeded` boxes the whole write once.
pub enum WriteOp {
    /// Create a session; refused with `SessionExists` if the id is taken.
    CreateSession {
        /// The new session.
        record: SessionRecord,
    },
    /// Replace a session's record (a configuration change).
    UpdateSession {
        /// The revision the change was planned against.
        expected_revision: u64,
        /// The record after the change.
        record: SessionRecord,
    },
    /// Remove a session's record, live spans, pins and archive. Its markers
    /// stay: the log is global and watchers may still need them.
    DeleteSession {
        /// The session.
        id: String,
    },
    /// Take back a session's newest live spans outright (not archived):
    /// their spans, pins and idempotency keys go, and the
    /// record is replaced. Refused unless each span is live at its
    /// position, and the revision matches.
    Retract {
        /// The revision the retraction was computed against.
        expected_revision: u64,
        /// The record after it.
        record: SessionRecord,
        /// The spans taken back.
        spans: Vec<Span>,
    },
    /// Empty a session: its live spans, pins, archive and
    /// idempotency keys go; its record is replaced (the caller keeps the
    /// counters). Markers stay.
    ResetSession {
        /// The revision the reset was computed against.
        expected_revision: u64,
        /// The record after it.
        record: SessionRecord,
    },
    /// Write a session's [`Change`] as it is given, in one piece: evict
    /// (archived under the marker's seq), insert the summary, rewrite
    /// `replace` in place (the pin set follows each span's class), append
    /// (ids must be new), then the marker (its `seq` assigned here) and the
    /// record. Evicting, summarising, or rewriting alongside an append needs
    /// a marker; an `ABORTED` marker must come alone, with the record only
    /// moving its marker count.
    Change {
        /// The change, from the session's state machine.
        change: Change,
        /// The caller's idempotency keys of appended spans: (key, span
        /// id). A key already stored for the session refuses the write.
        keys: Vec<(String, SpanId)>,
    },
}

/// What the writer reports for an applied write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteAck {
    /// The global seq given to the write's marker, if it wrote one.
    pub marker_seq: Option<u64>,
    /// For `DeleteSession`, `ResetSession` and `Retract`: the spans
    /// removed, live and archived.
    pub spans_deleted: u64,
}

/// The range of marker seqs a reader can get: everything in
/// `oldest..next` is retained and committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkerBounds {
    /// The oldest retained seq (equal to `next` when the log is empty).
    pub oldest: u64,
    /// The seq the next marker will get; seqs start at 1.
    pub next: u64,
}

/// A page of one session's markers, newest first
/// ([`Store::session_markers`](crate::Store::session_markers)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionMarkers {
    /// The session's markers found, newest first.
    pub markers: Vec<Marker>,
    /// Where the walk stopped: the next page starts below this seq. `None`
    /// when the walk reached the oldest retained marker, so nothing older
    /// is left to read.
    pub before: Option<u64>,
}

/// Counters of the writer's work, to see how well flushes are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Writes the writer took, applied or refused.
    pub writes: u64,
    /// Writes refused (stale revision, missing session, ...).
    pub rejected: u64,
    /// Batches: each time the writer drained the queue.
    pub batches: u64,
    /// Batches applied (those with at least one accepted write), each as
    /// one transaction or, when it only appends turns, in order.
    pub transactions: u64,
    /// Flushes to disk. One flush covers every batch applied before it
    /// started, so there can be fewer flushes than batches.
    pub flushes: u64,
    /// Blob files synced before flushes: the engine keeps a value or tree
    /// node of more than about 128 KiB in a file of its own, which its
    /// flush does not sync (see `writer::blobs`).
    pub blob_syncs: u64,
    /// Writes applied by the task that made them, without a hand-off to
    /// the writer's thread (relaxed durability, an append finding the
    /// writer idle; counted in `writes` too).
    pub applied_by_caller: u64,
    /// The most writes in one batch.
    pub largest_batch: u64,
    /// Times the commit hook panicked (the store carries on).
    pub hook_panics: u64,
    /// Keys inserted or replaced by applied batches, over every tree (the
    /// commit epoch of a batch among them when it has a key of its own).
    pub keys_written: u64,
    /// Keys removed by applied batches.
    pub keys_removed: u64,
    /// Keys the writer read from the engine to check and stage writes:
    /// the look-ups the engine answered and the entries of its scans
    /// (what a write finds staged by an earlier one of its batch is not
    /// counted). For a turn that only appends, its session's record, and
    /// one look-up per idempotency key.
    pub keys_read: u64,
    /// Bytes of the keys and values inserted or replaced: what the
    /// engine was handed to write, before its own framing.
    pub bytes_written: u64,
    /// Writes waiting in the queue right now.
    pub queued: u64,
}

/// Whether an acknowledgement waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every batch is flushed before its writes are acknowledged, so an
    /// acknowledged write survives `kill -9`; writes queued together share
    /// one flush.
    #[default]
    Flush,
    /// Batches are acknowledged as soon as they are applied; the engine
    /// flushes every 500 ms, so a crash may lose the latest acknowledged
    /// writes, and markers already handed to the hook.
    Relaxed,
}

/// The function the writer calls with each batch's markers, after they are
/// durable and before anyone is acknowledged or can read them from the log;
/// the server feeds its live watchers from it.
pub type CommitHook = Arc<dyn Fn(&[Marker]) + Send + Sync>;

/// The function the flusher calls after each flush of the engine with how
/// long it took; the server feeds its flush-latency histogram from it. It
/// runs on the flusher thread between the flush and the acknowledgements,
/// so it must be cheap and must not block.
pub type FlushObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

/// How a store runs.
#[derive(Clone)]
pub struct StoreOptions {
    /// Whether acknowledgements wait for a flush.
    pub durability: Durability,
    /// Keep at most this many markers; the oldest are removed in the same
    /// transaction that writes new ones. 0 keeps every marker.
    pub marker_retention: u64,
    /// The most writes in one batch (at least 1): bounds the latency a
    /// batch adds and the size of one transaction.
    pub max_batch: usize,
    /// Called after each flush, once its acknowledgements are sent, with
    /// the markers that became durable, in seq order, each exactly once.
    /// The committed head already covers them, and a caller holding its
    /// reply may not have been told yet. It must not block (the next batch
    /// waits for it) and should not
    /// hold a `Store` handle: a store kept alive by its own hook is only
    /// shut down by an explicit [`Store::close`](crate::Store::close).
    pub on_commit: Option<CommitHook>,
    /// Told the duration of every successful flush of the engine.
    pub on_flush: Option<FlushObserver>,
    /// The engine's page cache, in bytes. The engine counts a page by
    /// its size on disk, and up to 64 recent reads per cache shard before
    /// it evicts, so the memory it takes runs to about twice this. The
    /// server keeps the sessions it serves in memory itself, so this
    /// cache mostly serves the writer's reads and reloads.
    pub cache_capacity_bytes: u64,
    /// The postings of recently searched sessions kept in memory, in
    /// bytes (estimated), least recently searched dropped first. A
    /// session's first search reads its term vectors; later ones read
    /// only the spans stored since. 0 keeps none: every search reads
    /// every vector.
    pub search_cache_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Flush,
            marker_retention: 1_000_000,
            max_batch: 1024,
            on_commit: None,
            on_flush: None,
            cache_capacity_bytes: 32 * 1024 * 1024,
            search_cache_bytes: 32 * 1024 * 1024,
        }
    }
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("durability", &self.durability)
            .field("marker_retention", &self.marker_retention)
            .field("max_batch", &self.max_batch)
            .field(
                "on_commit",
                &self.on_commit.as_ref().map(|_| "Fn(&[Marker])"),
            )
            .field("on_flush", &self.on_flush.as_ref().map(|_| "Fn(Duration)"))
            .field("cache_capacity_bytes", &self.cache_capacity_bytes)
            .field("search_cache_bytes", &self.search_cache_bytes)
            .finish()
    }
}
