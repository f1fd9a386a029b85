//! ctxbroker's storage: sessions, their live spans, pin sets and archives,
//! and the global log of compaction markers.
//!
//! The store knows the policy's domain types (`ctxbroker-core`), never the
//! wire contract, and no type of the engine underneath (sled 0.34) appears
//! in its API, so the engine can be replaced.
//!
//! # One writer
//!
//! Every write goes through one bounded queue to one dedicated thread. The
//! writer takes a batch of queued writes, checks each against the stored
//! state (a stale revision or a missing session refuses that write alone,
//! at once) and applies the accepted ones as a single transaction over
//! every keyspace; a batch that only appends turns (admissions without a
//! compaction, one per session) is applied without one, in an order that
//! a crash can only cut where the next open repairs it. A second thread, the flusher, then flushes once for
//! every batch applied since its last flush, publishes the new marker
//! head, calls the commit hook with their markers and acknowledges; the
//! writer meanwhile applies the next batch. With relaxed durability there
//! is no flush to wait for, so the writer does that itself, without the
//! hand-over. Concurrent requests thus share
//! flushes, and no request task ever waits on the engine's flush machinery
//! itself (sled 0.34 deadlocks when eight or more callers await its
//! asynchronous flush at once).
//!
//! Point reads go straight to the engine. Reads of several keys (a
//! session's live spans, one span by id, a pin set) see a batch wholly or
//! not at all; they may see a batch shortly before it is flushed. The
//! marker log is the exception that matters to watchers: it never shows a
//! marker before its flush, and it shows every marker before the hook
//! hands it on, so a subscriber can fill any gap from the log.
//!
//! # Keyspaces
//!
//! | tree | key | value |
//! |---|---|---|
//! | sessions | session id | session record |
//! | spans | session ‖ position (u64 BE) | live span of a block not packed |
//! | runs | session ‖ first position of a block (u64 BE) | the rows of a packed block's live spans (see `blocks`) |
//! | pins | session ‖ span id (u64 BE) | the constraint's predicate |
//! | archive | session ‖ span id (u64 BE) | evicted span and the seq that evicted it |
//! | markers | seq (u64 BE) | marker |
//! | meta | `format_version`, `marker_log` | format version; next and oldest seq |
//! | keys | session ‖ idempotency key | the span admitted with it |
//!
//! A span's row, live or archived, carries its term vector for search
//! (20-bit term keys and counts, about two bytes a term).
//!
//! "session" in a key is the id's length in one byte followed by the id,
//! so a prefix scan of one session never reaches another. Values are
//! protobuf messages in a frame of format version and a crc32 over key and
//! payload; a record that fails either is reported as
//! [`StoreError::Corrupt`] and never served.

mod blocks;
mod dir;
mod error;
mod keys;
mod migrate;
mod model;
mod record;
mod search;
mod store;
pub mod transfer;
mod writer;

#[cfg(test)]
mod tests;
// Lets the integration tests' builders compile inside the crate's tests.
#[cfg(test)]
extern crate self as ctxbroker_store;

pub use error::StoreError;
pub use model::{
    Change, CommitHook, Durability, FlushObserver, MarkerBounds, Pin, SessionMarkers,
    SessionRecord, SpanState, StoreOptions, StoreStats, StoredSpan, WriteAck, WriteOp, text_bytes,
};
pub use search::{SearchHit, SearchPage, SearchQuery, SpanListing};
pub use store::{LiveSeeded, Store};
pub use transfer::{InvalidSnapshot, SessionExport, SessionImport, SnapshotPart};

/// Whether the named fault is injected now. Only builds with the
/// `failpoints` feature inject faults (configured by `FAILPOINTS`, as the
/// `fail` crate reads it); in every other build this is `false` and costs
/// nothing. The names:
///
/// - `store::before_transaction`: a batch fails before it is applied;
/// - `store::after_transaction`: a batch is applied but its writes are
///   answered with an error before any flush;
/// - `store::before_flush`: the flush covering applied batches fails;
/// - `store::after_flush`: batches are durable but answered with an error;
/// - `broker::between_plan_and_commit` (the server's): a caller's commit
///   fails after its plan was re-derived and verified.
#[cfg(feature = "failpoints")]
pub fn fault(name: &str) -> bool {
    fail::eval(name, |_| ()).is_some()
}

/// Whether the named fault is injected now: never, in this build.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fault(_name: &str) -> bool {
    false
}
