//! Tests that reach the engine's trees directly: damaged records and
//! foreign formats.

#![allow(clippy::await_holding_lock)]

#[path = "../tests/support/mod.rs"]
pub(crate) mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::RwLockReadGuard;

use support::{Session, change, constraint, queue_in_order, wait_until, write};

use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::span::{ClassSource, Classification, Role, SpanClass};
use ctxbroker_core::{Marker, SessionConfig, Span};

use crate::keys::{self, TreeId};
use crate::record;
use crate::{
    Change, Durability, MarkerBounds, SessionRecord, SpanState, Store, StoreError, StoreOptions,
    WriteAck, WriteOp,
};

fn record(id: &str, revision: u64, next_span_id: u64) -> SessionRecord {
    SessionRecord {
        revision,
        next_span_id,
        ..SessionRecord::new(id, SessionConfig::with_window(10_000), 1)
    }
}

fn span(id: u64) -> Span {
    Span {
        id,
        position: id,
        role: Role::User,
        classification: Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Caller,
            rule: String::new(),
        },
        text: format!("span {id}"),
        tokens: 2,
        generation: 0,
        turn: 1,
        predicate: None,
        summary: None,
        relevance_hint: None,
        admitted_at_ms: 1,
        original: None,
        attributes: None,
    }
}

fn marker(session: &str, session_seq: u64) -> Marker {
    Marker {
        seq: 0,
        session_id: session.into(),
        session_seq,
        trigger: CompactionTrigger::Manual,
        outcome: Outcome::Committed,
        tokens_before: 6,
        tokens_after: 4,
        incoming_tokens: 0,
        window_tokens: 10_000,
        budget_tokens: 8_500,
        pinned_tokens: 0,
        evicted: vec![1],
        tier_evicted: vec![],
        compressed: vec![],
        summary_span_id: None,
        summary_generation: 0,
        pinned_retained: 0,
        pinned_total: 0,
        anchors_carried: 0,
        anchors_dropped: 0,
        violations: vec![],
        at_ms: 2,
        session_revision: 3,
        turn: 4,
        actor: "op".into(),
        detail: String::new(),
    }
}

/// Creates session `id`, empty.
async fn create(store: &Store, id: &str) {
    store
        .write(WriteOp::CreateSession {
            record: record(id, 1, 1),
        })
        .await
        .unwrap();
}

/// A store opened in `dir` with session `id` created, empty.
async fn with_session(dir: &Path, id: &str) -> Store {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    create(&store, id).await;
    store
}

/// Two sessions, "hurt" and "fine", each with spans 1..=3; "hurt" then
/// evicts span 1 under marker 1.
async fn populated(dir: &Path) -> Store {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    for id in ["hurt", "fine"] {
        create(&store, id).await;
        store
            .write(write(
                Change {
                    append: vec![span(1), span(2), span(3)],
                    ..change(1, record(id, 2, 4))
                },
                Vec::new(),
            ))
            .await
            .unwrap();
    }
    let mut after = record("hurt", 3, 4);
    after.marker_count = 1;
    store
        .write(write(
            Change {
                evict: vec![1],
                marker: Some(marker("hurt", 1)),
                ..change(2, after)
            },
            Vec::new(),
        ))
        .await
        .unwrap();
    store
}

fn flip_byte(store: &Store, tree: TreeId, key: &[u8], at: usize) {
    let raw = store.raw_tree(tree);
    let mut value = raw.get(key).unwrap().expect("record present").to_vec();
    let at = at.min(value.len() - 1);
    value[at] ^= 0x40;
    raw.insert(key, value).unwrap();
}

fn assert_corrupt<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    tree: &str,
    key: &str,
    session: Option<&str>,
) {
    match result {
        Err(StoreError::Corrupt {
            tree: t,
            key: k,
            session: s,
            detail,
        }) => {
            assert_eq!(t, tree);
            assert_eq!(k, key);
            assert_eq!(s.as_deref(), session);
            assert!(!detail.is_empty());
        }
        other => panic!("expected Corrupt in {tree} at {key}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_damaged_span_is_reported_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;
    flip_byte(
        &store,
        TreeId::Spans,
        &keys::session_number_key("hurt", 2),
        20,
    );

    assert_corrupt(
        store.live_spans("hurt"),
        "spans",
        "\"hurt\"/position 2",
        Some("hurt"),
    );
    assert_corrupt(
        store.span("hurt", 2),
        "spans",
        "\"hurt\"/position 2",
        Some("hurt"),
    );
    // The other session and the other records are untouched.
    assert_eq!(store.live_spans("fine").unwrap().len(), 3);
    assert!(store.span("hurt", 3).is_ok());

    // A write that must read the damaged record is refused, and changes
    // nothing.
    let mut after = record("hurt", 4, 4);
    after.marker_count = 2;
    let evict_damaged = write(
        Change {
            evict: vec![2],
            marker: Some(marker("hurt", 2)),
            ..change(3, after)
        },
        Vec::new(),
    );
    assert_corrupt(
        store.write(evict_damaged).await,
        "spans",
        "\"hurt\"/position 2",
        Some("hurt"),
    );
    assert_eq!(store.marker_bounds().next, 2);
    assert_eq!(store.session("hurt").unwrap().unwrap().revision, 3);
}

#[tokio::test]
async fn damaged_sessions_archives_and_markers_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;

    flip_byte(
        &store,
        TreeId::Archive,
        &keys::session_number_key("hurt", 1),
        9,
    );
    assert_corrupt(
        store.span("hurt", 1),
        "archive",
        "\"hurt\"/span 1",
        Some("hurt"),
    );

    flip_byte(&store, TreeId::Markers, &keys::marker_key(1), 0);
    assert_corrupt(store.markers(1, 10), "markers", "seq 1", None);

    flip_byte(&store, TreeId::Sessions, b"hurt", 7);
    assert_corrupt(store.session("hurt"), "sessions", "\"hurt\"", Some("hurt"));
    assert_corrupt(
        store.sessions(None, 10),
        "sessions",
        "\"hurt\"",
        Some("hurt"),
    );
    assert_eq!(store.sessions(Some("hurt"), 10).unwrap().len(), 0);
    assert_eq!(store.sessions(None, 1).unwrap()[0].id, "fine");

    // A damaged session can still be deleted.
    let ack = store
        .write(WriteOp::DeleteSession { id: "hurt".into() })
        .await
        .unwrap();
    assert_eq!(ack.spans_deleted, 3);
    assert_eq!(store.session("hurt").unwrap(), None);
}

#[tokio::test]
async fn a_truncated_record_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;
    let key = keys::session_number_key("fine", 3);
    store
        .raw_tree(TreeId::Spans)
        .insert(&key, &[1u8, 2][..])
        .unwrap();
    assert_corrupt(
        store.live_spans("fine"),
        "spans",
        "\"fine\"/position 3",
        Some("fine"),
    );
    store.raw_tree(TreeId::Spans).insert(&key, &[][..]).unwrap();
    assert_corrupt(
        store.span("fine", 3),
        "spans",
        "\"fine\"/position 3",
        Some("fine"),
    );
}

#[tokio::test]
async fn a_store_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = populated(dir.path()).await;
        store
            .raw_tree(TreeId::Meta)
            .insert(keys::META_FORMAT, &record::encode_format_version(7)[..])
            .unwrap();
        store.close().unwrap();
    }
    match Store::open(dir.path(), StoreOptions::default()) {
        Err(StoreError::UnsupportedFormat { found, supported }) => {
            assert_eq!((found, supported), (7, 4));
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }
}

#[tokio::test]
async fn damaged_bookkeeping_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = populated(dir.path()).await;
        // The log's bounds say no marker exists yet, but marker 1 does.
        store
            .raw_tree(TreeId::Meta)
            .insert(keys::META_MARKER_LOG, record::encode_marker_log(1, 1))
            .unwrap();
        store.close().unwrap();
    }
    let opened = Store::open(dir.path(), StoreOptions::default());
    assert_corrupt(opened, "meta", "\"marker_log\"", None);

    {
        let db = sled::open(dir.path()).unwrap();
        db.open_tree("meta")
            .unwrap()
            .remove(keys::META_FORMAT)
            .unwrap();
        db.flush().unwrap();
    }
    let opened = Store::open(dir.path(), StoreOptions::default());
    assert_corrupt(opened, "meta", "\"format_version\"", None);
}

/// Holds the writer: a reader holding the snapshot lock stops it at its
/// next transaction. A write for `session` is sent and taken by the
/// writer, which then waits; writes queued meanwhile form its next batch.
/// Dropping the guard lets it go on; the handle yields that first write's
/// outcome.
async fn hold_writer<'a>(
    store: &'a Store,
    session: &mut Session,
) -> (
    RwLockReadGuard<'a, ()>,
    tokio::task::JoinHandle<Result<WriteAck, StoreError>>,
) {
    let guard = store.snapshot();
    let taken = store.stats().writes + 1;
    let op = session.abort();
    let handle = {
        let store = store.clone();
        tokio::spawn(async move { store.write(op).await })
    };
    wait_until(|| store.stats().writes >= taken).await;
    (guard, handle)
}

/// Sessions "s0", "s1", … (`count` of them), each created and given
/// `spans` spans in one admission.
async fn sessions_with_spans(store: &Store, count: usize, spans: usize) -> Vec<Session> {
    let mut sessions: Vec<Session> = (0..count).map(|i| Session::new(&format!("s{i}"))).collect();
    for s in &mut sessions {
        store.write(s.create()).await.unwrap();
        store.write(s.admit_next(spans)).await.unwrap();
    }
    sessions
}

/// The writer is held while four writes queue up behind it, so they are
/// taken as one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixing_stale_and_good_writes_applies_only_the_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut sessions = sessions_with_spans(&store, 4, 2).await;
    let before = store.stats();
    let (held, blocker) = hold_writer(&store, &mut sessions[0]).await;

    // s1: good; s2: stale; s3: good, with a marker; s1 again: good, planned
    // on the write queued before it in the same batch.
    let mut stale = sessions[2].clone();
    stale.record.revision -= 1;
    let ops = vec![
        sessions[1].admit_next(1),
        stale.admit_next(1),
        sessions[3].abort(),
        sessions[1].admit_next(2),
    ];
    let count = ops.len() as u64;
    let pending = queue_in_order(&store, ops).await;
    assert_eq!(store.stats().queued, count);
    drop(held);

    assert_eq!(blocker.await.unwrap().unwrap().marker_seq, Some(1));
    let mut results = Vec::new();
    for p in pending {
        results.push(p.await.unwrap());
    }
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(StoreError::StaleRevision { .. })));
    assert_eq!(results[2].as_ref().unwrap().marker_seq, Some(2));
    assert!(results[3].is_ok());

    let after = store.stats();
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    assert!(after.largest_batch >= count);
    assert_eq!(store.live_spans("s1").unwrap().len(), 5);
    assert_eq!(store.live_spans("s2").unwrap().len(), 2);
    assert_eq!(store.session("s1").unwrap().unwrap(), sessions[1].record);
    assert_eq!(store.session("s3").unwrap().unwrap(), sessions[3].record);
    assert_eq!(store.marker_bounds(), MarkerBounds { oldest: 1, next: 3 });
    store.close().unwrap();
}

/// Span `id` with a text of 289 KiB: more than the engine keeps in its
/// log (a quarter of its 512 KiB segment), so it goes to a blob file.
fn big_span(id: u64) -> Span {
    Span {
        text: "error: timed out waiting for rollout\n".repeat(8_000),
        ..span(id)
    }
}

/// A span too large for the engine's log goes to a file of its own, which
/// the engine's flush does not sync: the flusher syncs it before the
/// flush that acknowledges it, and the span reads back after a restart.
#[tokio::test]
async fn a_span_too_large_for_the_log_is_synced_before_it_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let store = with_session(dir.path(), "big").await;
    assert_eq!(store.stats().blob_syncs, 0);
    let big = big_span(1);
    store
        .write(write(
            Change {
                append: vec![big.clone()],
                ..change(1, record("big", 2, 2))
            },
            vec![],
        ))
        .await
        .unwrap();
    let files = std::fs::read_dir(dir.path().join("blobs")).unwrap().count();
    assert!(files >= 1, "the engine kept the span in its log");
    assert!(store.stats().blob_syncs >= 1, "{:?}", store.stats());
    store.close().unwrap();
    drop(store);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.live_spans("big").unwrap(), [big]);
}

/// With relaxed durability nothing waits for a flush, but the blob files
/// are still synced, at most every half second, when a batch is
/// acknowledged.
#[tokio::test]
async fn relaxed_durability_syncs_blob_files_every_half_second() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        durability: Durability::Relaxed,
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    create(&store, "big").await;
    writer_idle(&store).await;
    let big = big_span(1);
    store
        .write(write(
            Change {
                append: vec![big],
                ..change(1, record("big", 2, 2))
            },
            vec![],
        ))
        .await
        .unwrap();
    assert!(std::fs::read_dir(dir.path().join("blobs")).unwrap().count() >= 1);
    // A turn that large is applied on the writer's thread, which creates
    // the engine's file, never by the request's task.
    assert_eq!(store.stats().applied_by_caller, 0);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    store
        .write(write(
            Change {
                append: vec![span(2)],
                ..change(2, record("big", 3, 3))
            },
            vec![],
        ))
        .await
        .unwrap();
    assert!(store.stats().blob_syncs >= 1, "{:?}", store.stats());
    assert_eq!(store.stats().flushes, 0);
}

/// Waits until the writer's thread has let go of its state after its last
/// batch (it acknowledges a relaxed batch, or hands a durable one to the
/// flusher, before it does); with nothing queued, it then stays idle.
async fn writer_idle(store: &Store) {
    wait_until(|| store.writer_state().try_lock().is_ok()).await;
}

/// A relaxed store whose session "a" holds two spans, each admission
/// applied by the task that made it.
async fn relaxed_with_appends(dir: &Path) -> (Store, Session) {
    let options = StoreOptions {
        durability: Durability::Relaxed,
        ..StoreOptions::default()
    };
    let store = Store::open(dir, options).unwrap();
    let mut a = Session::new("a");
    store.write(a.create()).await.unwrap();
    assert_eq!(store.stats().applied_by_caller, 0, "a creation is queued");
    writer_idle(&store).await;
    for _ in 0..2 {
        store.write(a.admit_next(1)).await.unwrap();
    }
    assert_eq!(store.stats().applied_by_caller, 2, "{:?}", store.stats());
    (store, a)
}

/// With relaxed durability an append that finds the writer idle is
/// applied by the task that made it, with the same outcome; one made
/// while the writer applies a batch is queued and applied after it. A
/// durable store applies every write on the writer's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_append_finding_the_writer_idle_is_applied_by_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut a) = relaxed_with_appends(dir.path()).await;
    let mut b = Session::new("b");
    store.write(b.create()).await.unwrap();
    let (guard, held) = hold_writer(&store, &mut b).await;
    let queued = {
        let (store, op) = (store.clone(), a.admit_next(1));
        tokio::spawn(async move { store.write(op).await })
    };
    wait_until(|| store.stats().queued >= 1).await;
    drop(guard);
    held.await.unwrap().unwrap();
    let ack = queued.await.unwrap().unwrap();
    assert_eq!(ack.marker_seq, None);
    assert_eq!(store.stats().applied_by_caller, 2, "{:?}", store.stats());
    let texts = |store: &Store| -> Vec<String> {
        let spans = store.live_spans("a").unwrap();
        spans.into_iter().map(|span| span.text).collect()
    };
    let before = texts(&store);
    assert_eq!(before.len(), 3);
    store.close().unwrap();
    drop(store);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(texts(&store), before);
    assert_eq!(store.session("a").unwrap().unwrap(), a.record);
    let mut c = Session::new("c");
    store.write(c.create()).await.unwrap();
    writer_idle(&store).await;
    store.write(c.admit_next(1)).await.unwrap();
    let stats = store.stats();
    assert_eq!(
        stats.applied_by_caller, 0,
        "durable, on the writer: {stats:?}"
    );
    assert_eq!(stats.writes, 2, "{stats:?}");
}

/// A panic while the writer's state is held (a request applying its own
/// append) may leave part of a write behind: the store takes no more
/// writes until it is opened again, and then serves what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_under_the_writers_lock_stops_the_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut a) = relaxed_with_appends(dir.path()).await;
    let cell = store.writer_state();
    let panicked = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let _held = cell.lock();
                panic!("a panic while the writer's state is held");
            })
            .join()
    });
    assert!(panicked.is_err());
    let refused = store.write(a.admit_next(1)).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::Engine(msg) if msg.contains("until it is opened again")),
        "{refused:?}"
    );
    assert_eq!(store.stats().applied_by_caller, 2);
    store.close().unwrap();
    drop(store);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.live_spans("a").unwrap().len(), 2);
}

/// A batch of appends to several sessions carries its commit epoch in the
/// last record it writes and nowhere else; any other batch keeps it in the
/// meta tree. The engine's epoch at open is the newest of them, so a store
/// holding that record is served, and one whose record came back older
/// (its log lost the batch's last write after the flush) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_appends_carries_its_commit_epoch_in_its_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut sessions = sessions_with_spans(&store, 3, 1).await;
    let raw_record = |store: &Store, id: &str| {
        let key = keys::session_key(id);
        let value = store.raw_tree(TreeId::Sessions).get(&key).unwrap().unwrap();
        (key, value.to_vec())
    };
    let epoch_of = |store: &Store, id: &str| {
        let (key, value) = raw_record(store, id);
        record::session_epoch(&key, &value).unwrap()
    };
    let meta_epoch =
        |store: &Store| record::decode_epoch(&meta(store, keys::META_COMMIT_EPOCH)).unwrap();
    // Creating a session is not an append: its epoch went to the meta
    // tree. Each one-span admission after it carried its own.
    let created = meta_epoch(&store);
    assert_eq!(epoch_of(&store, "s2"), created + 1);
    let older_s2 = raw_record(&store, "s2");

    // The blocker (a marker: not an append) takes the meta tree; the two
    // appends queued behind it form the next batch.
    let before = store.stats();
    let (held, blocker) = hold_writer(&store, &mut sessions[0]).await;
    let ops = vec![sessions[1].admit_next(1), sessions[2].admit_next(2)];
    let pending = queue_in_order(&store, ops).await;
    drop(held);
    blocker.await.unwrap().unwrap();
    for p in pending {
        p.await.unwrap().unwrap();
    }
    assert_eq!(store.stats().batches - before.batches, 2);
    let marker_epoch = meta_epoch(&store);
    assert!(marker_epoch > created + 1, "{marker_epoch}");
    assert_eq!(epoch_of(&store, "s0"), 0);
    assert_eq!(epoch_of(&store, "s1"), 0);
    assert_eq!(epoch_of(&store, "s2"), marker_epoch + 1);
    store.close().unwrap();
    drop(store);

    // Served: the engine's epoch is the record's, the one acknowledged.
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.live_spans("s2").unwrap().len(), 3);
    let (key, value) = older_s2;
    store
        .raw_tree(TreeId::Sessions)
        .insert(&key, value.as_slice())
        .unwrap();
    store.close().unwrap();
    drop(store);
    let refused = Store::open(dir.path(), StoreOptions::default()).map(drop);
    let Err(StoreError::Corrupt { detail, .. }) = refused else {
        panic!("not refused: {refused:?}");
    };
    assert!(detail.contains("lost acknowledged writes"), "{detail}");
    assert!(
        detail.contains(&format!("epoch {}", marker_epoch + 1)),
        "{detail}"
    );
    assert!(
        detail.contains(&format!("epoch {marker_epoch}")),
        "{detail}"
    );
}

/// Delete, create and admit for one id in one batch: each sees the
/// state the one before it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_recreate_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("x");
    store.write(s.create()).await.unwrap();
    let mut spans = s.next_spans(3);
    spans[0] = constraint(1, "never delete backups");
    store.write(s.admit(spans)).await.unwrap();
    let (op, _) = s.admit_compacting(vec![2], 2, vec![], vec![]);
    store.write(op).await.unwrap();
    let mut other = Session::new("other");
    store.write(other.create()).await.unwrap();
    let batches = store.stats().batches;

    let (held, blocker) = hold_writer(&store, &mut other).await;
    let mut fresh = Session::new("x");
    let ops = vec![
        WriteOp::DeleteSession { id: "x".into() },
        fresh.create(),
        fresh.admit(fresh.next_spans(2)),
    ];
    let pending = queue_in_order(&store, ops).await;
    drop(held);
    blocker.await.unwrap().unwrap();
    let mut acks = Vec::new();
    for p in pending {
        acks.push(p.await.unwrap().unwrap());
    }
    assert_eq!(
        store.stats().batches,
        batches + 2,
        "one batch after the held one"
    );
    assert_eq!(acks[0].spans_deleted, 4);
    assert_eq!(store.live_spans("x").unwrap().len(), 2);
    assert!(store.pins("x").unwrap().is_empty());
    assert_eq!(
        store.span("x", 2).unwrap().map(|s| s.state),
        Some(SpanState::Live)
    );
    assert_eq!(store.span("x", 3).unwrap(), None);
    assert_eq!(store.session("x").unwrap().unwrap(), fresh.record);
    assert_eq!(store.session_count(), 2);
    store.close().unwrap();
}

/// The span one idempotency key admitted in session "k".
fn by_key(store: &Store, key: &str) -> Option<crate::StoredSpan> {
    let mut found = store.spans_by_keys("k", &[key.to_owned()]).unwrap();
    assert_eq!(found.len(), 1);
    found.pop().unwrap()
}

#[tokio::test]
async fn idempotency_keys_find_their_spans_live_or_archived_until_the_session_goes() {
    let dir = tempfile::tempdir().unwrap();
    let store = with_session(dir.path(), "k").await;
    store
        .write(write(
            Change {
                append: vec![span(1), span(2)],
                ..change(1, record("k", 2, 3))
            },
            vec![("turn-1/a".into(), 1), ("turn-1/b".into(), 2)],
        ))
        .await
        .unwrap();
    let found = by_key(&store, "turn-1/b").unwrap();
    assert_eq!((found.span.id, found.state), (2, SpanState::Live));
    assert!(by_key(&store, "turn-2/a").is_none());

    // A key can be taken once; a key for a span the write does not admit
    // is refused; neither write changes anything.
    for (keys, append) in [
        (vec![("turn-1/a".to_owned(), 3)], vec![span(3)]),
        (vec![("turn-2/a".to_owned(), 1)], vec![span(3)]),
    ] {
        let refused = store
            .write(write(
                Change {
                    append,
                    ..change(2, record("k", 3, 4))
                },
                keys,
            ))
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidWrite { .. })),
            "{refused:?}"
        );
    }
    assert_eq!(store.session("k").unwrap().unwrap().revision, 2);
    assert!(by_key(&store, "turn-2/a").is_none());

    // Evicted, the span is still found, archived.
    let mut after = record("k", 3, 3);
    after.marker_count = 1;
    store
        .write(write(
            Change {
                evict: vec![1],
                marker: Some(marker("k", 1)),
                ..change(2, after)
            },
            Vec::new(),
        ))
        .await
        .unwrap();
    let found = by_key(&store, "turn-1/a").unwrap();
    assert_eq!(found.span.id, 1);
    assert!(matches!(found.state, SpanState::Archived { .. }));
    // The session's keys, listed whole, archived span's included; the
    // refused writes added none.
    assert_eq!(
        store.idempotency_keys("k").unwrap(),
        vec!["turn-1/a".to_owned(), "turn-1/b".to_owned()]
    );

    // Deleted with the session; a new session of that id starts afresh.
    store
        .write(WriteOp::DeleteSession { id: "k".into() })
        .await
        .unwrap();
    store
        .write(WriteOp::CreateSession {
            record: record("k", 1, 1),
        })
        .await
        .unwrap();
    assert!(by_key(&store, "turn-1/a").is_none());
    assert!(store.idempotency_keys("k").unwrap().is_empty());
    assert_eq!(
        keys::render(TreeId::Keys, &keys::session_text_key("k", "t/1")),
        "\"k\"/key \"t/1\""
    );
}

mod decoder_props {
    //! The record decoder under arbitrary bytes: it never panics, a record
    //! round-trips, and any single flipped bit or truncation of a stored
    //! value is reported as corrupt, never decoded as another record.
    use proptest::prelude::*;

    use super::{marker, record, span};
    use crate::keys;
    use crate::record as codec;

    fn flip(value: &[u8], bit: usize) -> Vec<u8> {
        let mut v = value.to_vec();
        let at = bit % (v.len() * 8);
        v[at / 8] ^= 1 << (at % 8);
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

        #[test]
        fn spans_round_trip_and_damage_is_caught(
            id in 1u64..1_000_000,
            text in "\\PC{0,200}",
            bit in any::<usize>(),
            cut in any::<usize>(),
        ) {
            let mut s = span(id);
            s.text = text;
            let key = keys::session_number_key("p", id);
            let value = codec::encode_span(&key, &s, codec::span_terms(&s));
            prop_assert_eq!(codec::decode_span(&key, &value).unwrap(), s);
            prop_assert!(codec::decode_span(&key, &flip(&value, bit)).is_err());
            prop_assert!(codec::decode_span(&key, &value[..cut % value.len()]).is_err());
            // The same bytes under another key are not that key's record.
            let other = keys::session_number_key("q", id);
            prop_assert!(codec::decode_span(&other, &value).is_err());
        }

        #[test]
        fn sessions_and_markers_catch_any_flipped_bit(
            revision in 1u64..1_000,
            seq in 1u64..1_000,
            bit in any::<usize>(),
        ) {
            let r = record("p", revision, revision + 1);
            let key = keys::session_key("p");
            let value = codec::encode_session(&key, &r);
            prop_assert_eq!(codec::decode_session(&key, &value).unwrap(), r);
            prop_assert!(codec::decode_session(&key, &flip(&value, bit)).is_err());

            let mut m = marker("p", seq);
            m.seq = seq;
            let key = keys::marker_key(seq);
            let value = codec::encode_marker(&key, &m);
            prop_assert_eq!(codec::decode_marker(&key, &value).unwrap(), m);
            prop_assert!(codec::decode_marker(&key, &flip(&value, bit)).is_err());

            let key = keys::session_text_key("p", "turn-1");
            let value = codec::encode_key(&key, seq);
            prop_assert_eq!(codec::decode_key(&key, &value).unwrap(), seq);
            prop_assert!(codec::decode_key(&key, &flip(&value, bit)).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let key = keys::session_number_key("p", 1);
            let _ = codec::decode_span(&key, &bytes);
            let _ = codec::decode_archived(&key, &bytes);
            let _ = codec::decode_pin(&key, &bytes);
            let _ = codec::decode_session(b"p", &bytes);
            let _ = codec::decode_marker(&keys::marker_key(1), &bytes);
            let _ = codec::decode_key(&keys::session_text_key("p", "k"), &bytes);
        }
    }
}

#[tokio::test]
async fn an_engine_behind_the_recorded_commit_epoch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;
    store.close().unwrap();
    drop(store);
    // A clean reopen is accepted; the epoch file names the engine's epoch.
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    store.close().unwrap();
    drop(store);
    let path = dir.path().join("commit-epoch");
    let recorded = record::decode_epoch(&std::fs::read(&path).unwrap()).unwrap();
    assert!(recorded >= 5, "one epoch per applied batch: {recorded}");

    // The engine comes back older than what was acknowledged (as after a
    // damaged log): refused, naming both epochs and the way out.
    std::fs::write(&path, record::encode_epoch(recorded + 3)).unwrap();
    let refused = Store::open(dir.path(), StoreOptions::default()).map(drop);
    let Err(StoreError::Corrupt { tree, detail, .. }) = refused else {
        panic!("not refused: {refused:?}");
    };
    assert_eq!(tree, "meta");
    assert!(detail.contains("lost acknowledged writes"), "{detail}");
    assert!(
        detail.contains(&format!("epoch {}", recorded + 3)),
        "{detail}"
    );
    assert!(detail.contains(&format!("epoch {recorded}")), "{detail}");

    // A damaged epoch file is reported too; removing it accepts the store.
    std::fs::write(&path, b"garbage").unwrap();
    assert!(matches!(
        Store::open(dir.path(), StoreOptions::default()).map(drop),
        Err(StoreError::Corrupt { .. })
    ));
    std::fs::remove_file(&path).unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.session("hurt").unwrap().unwrap().revision, 3);
}

pub(crate) fn search_ids(store: &Store, session: &str, text: &str) -> Result<Vec<u64>, StoreError> {
    let query = crate::SearchQuery {
        terms: ctxbroker_core::search::query_terms(text),
        filter: Default::default(),
        offset: 0,
        limit: 10,
    };
    Ok(store
        .search(session, &query)?
        .hits
        .iter()
        .map(|h| h.stored.span.id)
        .collect())
}

#[tokio::test]
async fn a_damaged_term_vector_is_reported_not_ranked() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;
    // Damaged before any search reads it (a search keeps what it read,
    // checked, in memory): a row whose frame is sound but whose term
    // vector is not.
    let key = keys::session_number_key("hurt", 2);
    let spans = store.raw_tree(TreeId::Spans);
    let value = spans.get(&key).unwrap().unwrap();
    let span = record::decode_span(&key, &value).unwrap();
    spans
        .insert(&key, record::encode_span(&key, &span, vec![0xff; 3]))
        .unwrap();
    assert_corrupt(
        search_ids(&store, "hurt", "span"),
        "spans",
        "\"hurt\"/position 2",
        Some("hurt"),
    );
    // Other sessions still answer; spans "span 1".."span 3" each hold
    // "span".
    assert_eq!(search_ids(&store, "fine", "span").unwrap().len(), 3);
}

/// Rewrites a store as format 1 kept it: each span's term vector in a
/// tree of its own (`with_term_rows`), or nowhere, as before search
/// existed; the spans' rows without one.
fn as_format_one(store: &Store, with_term_rows: bool) {
    let terms = store.raw_db().open_tree("terms").unwrap();
    for tree in [TreeId::Spans, TreeId::Archive] {
        for entry in store.raw_tree(tree).iter() {
            let (key, value) = entry.unwrap();
            let old = record::format_one(tree, &key, &value).unwrap();
            store.raw_tree(tree).insert(&key, old.row).unwrap();
            if with_term_rows {
                terms.insert(old.term_key, old.term_row).unwrap();
            }
        }
    }
    if with_term_rows {
        // A crash in the middle of an append leaves its first row, the
        // term row of the next span id, without the span.
        let torn = span(4);
        let key = keys::session_number_key("hurt", torn.position);
        let value = record::encode_span(&key, &torn, record::span_terms(&torn));
        let old = record::format_one(TreeId::Spans, &key, &value).unwrap();
        terms.insert(old.term_key, old.term_row).unwrap();
    }
    store
        .raw_tree(TreeId::Meta)
        .insert(keys::META_FORMAT, &record::encode_format_version(1)[..])
        .unwrap();
}

/// Every live and archived span of a session, and the term vector its
/// row carries.
fn span_rows(store: &Store, session: &str) -> Vec<(Span, Option<Vec<u8>>)> {
    let prefix = keys::session_prefix(session);
    let mut rows = Vec::new();
    for entry in store.raw_tree(TreeId::Spans).scan_prefix(&prefix) {
        let (key, value) = entry.unwrap();
        rows.push(record::decode_span_with_terms(&key, &value).unwrap());
    }
    for entry in store.raw_tree(TreeId::Archive).scan_prefix(&prefix) {
        let (key, value) = entry.unwrap();
        let terms = record::stored_terms(TreeId::Archive, &key, &value)
            .unwrap()
            .1;
        rows.push((
            record::decode_archived(&key, &value).unwrap().0,
            Some(terms),
        ));
    }
    rows
}

/// A format-2 store kept every commit epoch in the meta tree: opened, it
/// is served as it is and recorded as this build's format, whose batches
/// of appends carry their epoch in a session record.
#[tokio::test]
async fn a_format_two_store_is_served_as_it_is_and_recorded_as_this_builds_format() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = {
        let store = populated(dir.path()).await;
        let sessions = store.sessions_under("", None, 10).unwrap();
        // As format 2 left it: no record carries an epoch, the meta tree
        // holds the newest.
        let mut newest = 0;
        for entry in store.raw_tree(TreeId::Sessions).iter() {
            let (key, value) = entry.unwrap();
            newest = newest.max(record::session_epoch(&key, &value).unwrap());
            let plain =
                record::encode_session(&key, &record::decode_session(&key, &value).unwrap());
            store
                .raw_tree(TreeId::Sessions)
                .insert(&key, plain)
                .unwrap();
        }
        assert!(newest > 0, "appends carried their epochs in records");
        let meta_tree = store.raw_tree(TreeId::Meta);
        let in_meta = record::decode_epoch(&meta(&store, keys::META_COMMIT_EPOCH));
        let newest = newest.max(in_meta.unwrap());
        meta_tree
            .insert(keys::META_COMMIT_EPOCH, &record::encode_epoch(newest)[..])
            .unwrap();
        meta_tree
            .insert(keys::META_FORMAT, &record::encode_format_version(2)[..])
            .unwrap();
        store.close().unwrap();
        sessions
    };
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.sessions_under("", None, 10).unwrap(), sessions);
    assert_eq!(recorded_format(&store), 4);
}

/// The value of `key` in the meta tree, which must be there.
fn meta(store: &Store, key: &[u8]) -> Vec<u8> {
    store
        .raw_tree(TreeId::Meta)
        .get(key)
        .unwrap()
        .unwrap()
        .to_vec()
}

/// The store format recorded in the meta tree.
fn recorded_format(store: &Store) -> u32 {
    record::decode_format_version(&meta(store, keys::META_FORMAT)).unwrap()
}

#[tokio::test]
async fn a_format_one_store_moves_its_term_vectors_into_the_spans_rows() {
    for with_term_rows in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (spans, answers) = {
            let store = populated(dir.path()).await;
            let spans = ["hurt", "fine"].map(|id| span_rows(&store, id));
            let answers = ["hurt", "fine"].map(|id| search_ids(&store, id, "span").unwrap());
            as_format_one(&store, with_term_rows);
            for entry in store.raw_tree(TreeId::Spans).iter() {
                let (key, value) = entry.unwrap();
                let (_, terms) = record::decode_span_with_terms(&key, &value).unwrap();
                assert!(terms.is_none());
            }
            store.close().unwrap();
            (spans, answers)
        };
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        // The same spans, each row with its term vector again; the same
        // answers; the old tree gone and the new format recorded.
        assert_eq!(["hurt", "fine"].map(|id| span_rows(&store, id)), spans);
        assert_eq!(
            ["hurt", "fine"].map(|id| search_ids(&store, id, "span").unwrap()),
            answers
        );
        assert_eq!(answers[0], [3, 2, 1]);
        assert!(
            !store
                .raw_db()
                .tree_names()
                .iter()
                .any(|n| n.as_ref() == b"terms")
        );
        assert_eq!(recorded_format(&store), 4);
        store.close().unwrap();
        drop(store);
        // Opened again, there is nothing left to move.
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(["hurt", "fine"].map(|id| span_rows(&store, id)), spans);
    }
}

#[tokio::test]
async fn a_prefix_lists_one_tenants_sessions_in_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let long = format!("{}/{}", "t".repeat(64), "s".repeat(128));
    for id in [
        "acme/a",
        "acme/b",
        "acme/c",
        "acmex/a",
        "beta/a",
        "bare",
        long.as_str(),
    ] {
        store.write(Session::new(id).create()).await.unwrap();
    }
    let ids = |records: Vec<SessionRecord>| records.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.sessions_under("acme/", None, 10).unwrap()),
        ["acme/a", "acme/b", "acme/c"]
    );
    assert_eq!(
        ids(store.sessions_under("acme/", None, 2).unwrap()),
        ["acme/a", "acme/b"]
    );
    assert_eq!(
        ids(store.sessions_under("acme/", Some("acme/b"), 10).unwrap()),
        ["acme/c"]
    );
    // A token from before the prefix starts at its first id; one after it
    // finds nothing.
    assert_eq!(
        ids(store.sessions_under("acme/", Some("a"), 1).unwrap()),
        ["acme/a"]
    );
    assert!(
        store
            .sessions_under("acme/", Some("b"), 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ids(store.sessions_under("beta/", None, 10).unwrap()),
        ["beta/a"]
    );
    assert!(store.sessions_under("gamma/", None, 10).unwrap().is_empty());
    assert_eq!(store.sessions_under("", None, 10).unwrap().len(), 7);
    assert_eq!(store.session(&long).unwrap().unwrap().id, long);
}

/// Every row of the trees a session's admissions write, by tree and key.
pub(crate) fn admission_rows(store: &Store) -> BTreeMap<(TreeId, Vec<u8>), Vec<u8>> {
    let mut rows = BTreeMap::new();
    for tree in [
        TreeId::Sessions,
        TreeId::Spans,
        TreeId::Runs,
        TreeId::Pins,
        TreeId::Keys,
        TreeId::Archive,
    ] {
        for entry in store.raw_tree(tree).iter() {
            let (key, value) = entry.unwrap();
            rows.insert((tree, key.to_vec()), value.to_vec());
        }
    }
    rows
}

#[tokio::test]
async fn an_append_a_crash_tore_is_removed_at_open() {
    let turn = || {
        write(
            Change {
                append: vec![span(2), support::constraint(3, "never touch prod")],
                ..change(2, record("t", 3, 4))
            },
            vec![("turn-2/a".into(), 2), ("turn-2/b".into(), 3)],
        )
    };
    // What survives of the append: every new row but the record, or
    // only the first row the writer puts (the first span).
    for only_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = with_session(dir.path(), "t").await;
        store
            .write(write(
                Change {
                    append: vec![span(1)],
                    ..change(1, record("t", 2, 2))
                },
                vec![("turn-1/a".into(), 1)],
            ))
            .await
            .unwrap();
        let before = admission_rows(&store);
        store.write(turn()).await.unwrap();
        let after = admission_rows(&store);
        assert!(after.len() >= before.len() + 5, "{}", after.len());
        // Back to the record before the append, with the new rows left.
        let session = keys::session_key("t");
        let old_record = before[&(TreeId::Sessions, session.clone())].clone();
        store
            .raw_tree(TreeId::Sessions)
            .insert(&session, old_record.as_slice())
            .unwrap();
        if only_first {
            let first = keys::session_number_key("t", 2);
            for (tree, key) in after.keys() {
                let new = !before.contains_key(&(*tree, key.clone()));
                if new && !(*tree == TreeId::Spans && *key == first) {
                    store.raw_tree(*tree).remove(key).unwrap();
                }
            }
        }
        assert_ne!(admission_rows(&store), before);
        store.close().unwrap();
        drop(store);
        // A torn batch was never flushed, so the last durable commit epoch
        // is the one the record before it carries.
        let durable = record::session_epoch(&session, &old_record).unwrap();
        assert!(durable > 0);
        std::fs::write(
            dir.path().join("commit-epoch"),
            record::encode_epoch(durable),
        )
        .unwrap();

        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(admission_rows(&store), before, "only_first: {only_first}");
        assert!(store.spans_by_keys("t", &["turn-2/a".into()]).unwrap()[0].is_none());
        // The turn can be admitted again, keys and all.
        store.write(turn()).await.unwrap();
        assert_eq!(admission_rows(&store), after);
        store.close().unwrap();
        drop(store);
        // A store with nothing torn is left as it is.
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(admission_rows(&store), after);
    }
}

#[tokio::test]
async fn a_record_update_cannot_move_next_span_id_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    store
        .write(WriteOp::CreateSession {
            record: record("u", 1, 5),
        })
        .await
        .unwrap();
    let refused = store
        .write(WriteOp::UpdateSession {
            expected_revision: 1,
            record: record("u", 2, 4),
        })
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidWrite { .. })),
        "{refused:?}"
    );
}

/// A span's attributes are kept; taking back the newest spans removes
/// them with their keys (which can then admit again), refuses a stale
/// revision or a span that is not live, and a reset empties the session
/// but keeps its record.
#[tokio::test]
async fn retract_and_reset_remove_what_they_name_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;
    let mut tooled = span(4);
    tooled.attributes = Some(Box::new(ctxbroker_core::span::Attributes {
        tool_call_id: "call_1".into(),
        tool_name: "shell".into(),
        metadata: [("framework.id".to_owned(), "m-4".to_owned())].into(),
    }));
    store
        .write(write(
            Change {
                append: vec![tooled.clone(), span(5)],
                ..change(2, record("fine", 3, 6))
            },
            vec![("k4".into(), 4), ("k5".into(), 5)],
        ))
        .await
        .unwrap();
    let live = store.live_spans("fine").unwrap();
    assert_eq!(live[3], tooled, "attributes round-trip");
    let bytes_before = store.session_text_bytes("fine").unwrap();

    let stale = store
        .write(WriteOp::Retract {
            expected_revision: 2,
            record: record("fine", 4, 6),
            spans: vec![tooled.clone(), span(5)],
        })
        .await;
    assert!(
        matches!(stale, Err(StoreError::StaleRevision { .. })),
        "{stale:?}"
    );
    let not_live = store
        .write(WriteOp::Retract {
            expected_revision: 3,
            record: record("fine", 4, 6),
            spans: vec![span(9)],
        })
        .await;
    assert!(
        matches!(not_live, Err(StoreError::InvalidWrite { .. })),
        "{not_live:?}"
    );
    assert_eq!(
        store.live_spans("fine").unwrap().len(),
        5,
        "refusals change nothing"
    );

    let ack = store
        .write(WriteOp::Retract {
            expected_revision: 3,
            record: record("fine", 4, 6),
            spans: vec![tooled.clone(), span(5)],
        })
        .await
        .unwrap();
    assert_eq!(ack.spans_deleted, 2);
    let ids: Vec<u64> = store
        .live_spans("fine")
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(store.session("fine").unwrap().unwrap().revision, 4);
    assert!(store.span("fine", 4).unwrap().is_none());
    assert!(store.session_text_bytes("fine").unwrap() < bytes_before);
    let by_key = store
        .spans_by_keys("fine", &["k4".into(), "k5".into()])
        .unwrap();
    assert_eq!(by_key, vec![None, None], "the keys went with their spans");
    // A taken-back key admits new content.
    store
        .write(write(
            Change {
                append: vec![span(6)],
                ..change(4, record("fine", 5, 7))
            },
            vec![("k4".into(), 6)],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.spans_by_keys("fine", &["k4".into()]).unwrap()[0]
            .as_ref()
            .map(|s| s.span.id),
        Some(6)
    );

    // "hurt" has two live spans and one archived; a reset removes all
    // three and keeps the record it is given.
    let mut after = record("hurt", 4, 4);
    after.marker_count = 1;
    let ack = store
        .write(WriteOp::ResetSession {
            expected_revision: 3,
            record: after.clone(),
        })
        .await
        .unwrap();
    assert_eq!(ack.spans_deleted, 3);
    assert!(store.live_spans("hurt").unwrap().is_empty());
    assert!(
        store.span("hurt", 1).unwrap().is_none(),
        "the archive is emptied"
    );
    assert_eq!(store.session("hurt").unwrap(), Some(after));
    assert_eq!(store.markers(1, 10).unwrap().len(), 1, "markers stay");
    assert_eq!(
        store.live_spans("fine").unwrap().len(),
        4,
        "other sessions untouched"
    );
}

/// Writes the same turns to two stores, one through [`Store::write`]
/// (rows encoded by the calling task, or on the blocking pool for a large
/// change) and one through the writer alone, and compares every row: a
/// plain turn, a large one, and a compaction whose summary stands at a
/// position other than its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_encoded_before_the_writer_equal_the_writers_own() {
    let turns = || {
        let mut s = Session::new("e");
        let create = s.create();
        let plain = s.admit(vec![span(1), constraint(2, "never touch prod")]);
        let large = Span {
            text: "a large tool output, writer.rs line 12 failed ".repeat(2_000),
            ..span(3)
        };
        assert!(large.text.len() > crate::store::ENCODE_INLINE_BYTES);
        let large = s.admit(vec![large]);
        let next = s.next_spans(2);
        let (compacting, summary) = s.admit_compacting(vec![1, 3], 1, Vec::new(), next);
        assert_ne!(summary.id, summary.position);
        vec![create, plain, large, compacting]
    };
    let mut rows = Vec::new();
    for through_write in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        for op in turns() {
            match through_write {
                true => store.write(op).await.unwrap(),
                false => store
                    .submit(crate::writer::Op::Write(Box::new(op)))
                    .await
                    .unwrap(),
            };
        }
        rows.push(admission_rows(&store));
        store.close().unwrap();
    }
    assert_eq!(rows[0].len(), rows[1].len());
    // Every span's row carries its term vector, whoever encoded it.
    for ((tree, key), value) in &rows[0] {
        if *tree == TreeId::Spans {
            let (_, terms) = record::decode_span_with_terms(key, value).unwrap();
            assert!(terms.is_some(), "{}", keys::render(*tree, key));
        }
    }
    assert_eq!(rows[0], rows[1]);
}

/// A change's new spans are stored with the seeds of their facts (those
/// long enough to get one), which the write returns and a load reads
/// back; a span rewritten in place is stored without one (its text
/// changed), and so read.
#[tokio::test]
async fn new_spans_are_stored_with_the_seeds_of_their_facts() {
    use ctxbroker_core::facts::{SEED_MIN_BYTES, seed};

    let dir = tempfile::tempdir().unwrap();
    let store = with_session(dir.path(), "s").await;
    let mut spans = vec![span(1), span(2), span(3)];
    spans[1].text = "Deploy web-1 from /srv/app/release.tar; error E0308 again\n".repeat(20);
    assert!(spans[1].text.len() >= SEED_MIN_BYTES);
    let (_, seeds) = store
        .write_seeded(write(
            Change {
                append: spans.clone(),
                ..change(1, record("s", 2, 4))
            },
            Vec::new(),
        ))
        .await
        .unwrap();
    let long = seed(&spans[1]).unwrap();
    assert_eq!(seeds, vec![(2, long.clone())]);
    let (live, stored) = store.live_spans_seeded("s").unwrap();
    assert_eq!(live, spans);
    assert_eq!(stored, vec![None, Some(long.into_boxed_slice()), None]);
    let mut rewritten = spans[1].clone();
    rewritten.text = "Rewritten: the release failed twice at /srv/app\n".repeat(30);
    store
        .write(write(
            Change {
                replace: vec![rewritten.clone()],
                ..change(2, record("s", 3, 4))
            },
            Vec::new(),
        ))
        .await
        .unwrap();
    let (live, stored) = store.live_spans_seeded("s").unwrap();
    assert_eq!(live[1], rewritten);
    assert_eq!(stored, vec![None, None, None]);
    assert_eq!(store.live_spans("s").unwrap(), live);
    // A row written before seeds (or re-encoded from its span) reads as
    // having none: its facts are derived from the text.
    let key = keys::session_number_key("s", 2);
    let row = record::encode_span(&key, &spans[1], record::span_terms(&spans[1]));
    assert_eq!(
        record::decode_seeded_span(&key, &row).unwrap(),
        (spans[1].clone(), None)
    );
}

/// A new span's position must be free. An appended span stands beyond
/// every stored one and is not looked up, so what the writer still
/// refuses is a summary at a position a live span holds and two spans of
/// one write at the same position; either leaves the session as it was.
#[tokio::test]
async fn a_new_span_at_a_taken_position_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path()).await;
    let before = admission_rows(&store);
    // Span 1 evicted under a summary (id 4) standing at `position`.
    let summarise_at = |position: u64| {
        let mut summary = span(4);
        summary.position = position;
        let mut after = record("fine", 3, 5);
        after.marker_count = 1;
        let mut compaction = marker("fine", 1);
        compaction.evicted = vec![1];
        write(
            Change {
                evict: vec![1],
                summary: Some(summary),
                marker: Some(compaction),
                ..change(2, after)
            },
            Vec::new(),
        )
    };

    let over_a_live_span = store.write(summarise_at(2)).await;
    let mut twin = span(5);
    twin.position = 4;
    let twice = store
        .write(write(
            Change {
                append: vec![span(4), twin],
                ..change(2, record("fine", 3, 6))
            },
            Vec::new(),
        ))
        .await;
    for (what, refused) in [("summary", over_a_live_span), ("twin", twice)] {
        match refused {
            Err(StoreError::InvalidWrite { detail, .. }) => assert!(
                detail.contains("cannot take position") && detail.contains("holds it"),
                "{what}: {detail}"
            ),
            other => panic!("{what}: expected InvalidWrite, got {other:?}"),
        }
    }
    assert_eq!(admission_rows(&store), before, "refusals change nothing");

    // The same summary at the position of the span it replaces goes in,
    // and an append after it is not refused.
    store.write(summarise_at(1)).await.unwrap();
    store
        .write(write(
            Change {
                append: vec![span(5)],
                ..change(3, record("fine", 4, 6))
            },
            Vec::new(),
        ))
        .await
        .unwrap();
    let positions: Vec<u64> = store
        .live_spans("fine")
        .unwrap()
        .iter()
        .map(|s| s.position)
        .collect();
    assert_eq!(positions, [1, 2, 3, 5]);
}

/// The writer and the flusher run on threads whose names the kernel keeps
/// whole (15 bytes), so that `top -H`, `/proc` and the benchmarks' split
/// of the daemon's CPU by thread tell them apart.
#[tokio::test]
async fn the_store_threads_have_names_the_kernel_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let _store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let names = || {
        let mut names = Vec::new();
        for entry in std::fs::read_dir("/proc/self/task").unwrap() {
            if let Ok(comm) = std::fs::read_to_string(entry.unwrap().path().join("comm")) {
                names.push(comm.trim_end().to_owned());
            }
        }
        names
    };
    // A new thread names itself once it runs: wait for both.
    let named = |names: &[String]| {
        ["store-writer", "store-flusher"]
            .iter()
            .all(|wanted| names.iter().any(|n| n == wanted))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = names();
    while !named(&seen) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        seen = names();
    }
    assert!(
        named(&seen),
        "no store-writer and store-flusher among {seen:?}"
    );
}
