//! Sessions: create, list, delete; closing; reopening after a drop.

#![allow(missing_docs)]

mod support;

use ctxbroker_store::{Store, StoreError, StoreOptions, WriteOp};
use support::{Session, constraint, span, tempdir};

#[tokio::test]
async fn sessions_are_created_once_and_listed_in_id_order() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    for id in ["b", "a", "ab", "c", "a/b"] {
        store.write(Session::new(id).create()).await.unwrap();
    }
    assert!(matches!(
        store.write(Session::new("ab").create()).await,
        Err(StoreError::SessionExists { id }) if id == "ab"
    ));
    assert_eq!(store.session_count(), 5);
    let page = |after: Option<&str>, limit| -> Vec<String> {
        store
            .sessions(after, limit)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(page(None, 10), ["a", "a/b", "ab", "b", "c"]);
    assert_eq!(page(None, 2), ["a", "a/b"]);
    assert_eq!(page(Some("a/b"), 2), ["ab", "b"]);
    assert_eq!(page(Some("aa"), 10), ["ab", "b", "c"]);
    assert!(page(Some("c"), 10).is_empty());
    assert_eq!(store.session("zz").unwrap(), None);
    assert!(matches!(
        store.session(""),
        Err(StoreError::InvalidSessionId { len: 0 })
    ));
    assert!(matches!(
        store.write(Session::new(&"x".repeat(256)).create()).await,
        Err(StoreError::InvalidSessionId { len: 256 })
    ));
}

#[tokio::test]
async fn a_session_never_sees_the_spans_of_one_whose_id_it_prefixes() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut a = Session::new("a");
    let mut ab = Session::new("ab");
    for s in [&mut a, &mut ab] {
        store.write(s.create()).await.unwrap();
        let spans = s.next_spans(3);
        store.write(s.admit(spans)).await.unwrap();
    }
    let live = store.live_spans("a").unwrap();
    assert_eq!(live.len(), 3);
    assert!(live.iter().all(|s| s.text.starts_with("a span")));
    store
        .write(WriteOp::DeleteSession { id: "a".into() })
        .await
        .unwrap();
    assert_eq!(store.live_spans("ab").unwrap().len(), 3);
}

#[tokio::test]
async fn delete_removes_everything_but_the_markers() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("gone");
    store.write(s.create()).await.unwrap();
    let mut spans = s.next_spans(4);
    spans[0] = constraint(1, "never deploy on friday");
    store.write(s.admit(spans)).await.unwrap();
    let (op, _) = s.admit_compacting(vec![2, 3], 2, vec![], vec![span(0, "x")]);
    store.write(op).await.unwrap();
    let mut other = Session::new("kept");
    store.write(other.create()).await.unwrap();
    store.write(other.admit(other.next_spans(2))).await.unwrap();
    assert_eq!(store.pins("gone").unwrap().len(), 1);

    let ack = store
        .write(WriteOp::DeleteSession { id: "gone".into() })
        .await
        .unwrap();
    // Live: 1, summary, 4, appended; archived: 2, 3.
    assert_eq!(ack.spans_deleted, 6);
    assert_eq!(store.session("gone").unwrap(), None);
    assert_eq!(store.session_count(), 1);
    for read in [
        store.live_spans("gone").map(|_| ()),
        store.pins("gone").map(|_| ()),
        store.span("gone", 2).map(|_| ()),
    ] {
        assert!(matches!(read, Err(StoreError::SessionNotFound { .. })));
    }
    assert!(matches!(
        store
            .write(WriteOp::DeleteSession { id: "gone".into() })
            .await,
        Err(StoreError::SessionNotFound { .. })
    ));
    assert_eq!(store.markers(1, 10).unwrap().len(), 1, "markers stay");
    assert_eq!(store.live_spans("kept").unwrap().len(), 2);

    // The id can be used again, from scratch.
    let mut again = Session::new("gone");
    store.write(again.create()).await.unwrap();
    store.write(again.admit(again.next_spans(1))).await.unwrap();
    assert_eq!(store.live_spans("gone").unwrap().len(), 1);
    assert!(store.pins("gone").unwrap().is_empty());
    assert_eq!(store.span("gone", 2).unwrap(), None);
}

#[tokio::test]
async fn close_stops_writes_but_not_reads() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("c");
    store.write(s.create()).await.unwrap();
    store.close().unwrap();
    store.close().unwrap();
    assert!(matches!(
        store.write(s.admit(s.next_spans(1))).await,
        Err(StoreError::Closed)
    ));
    assert!(store.session("c").unwrap().is_some());
}

#[tokio::test]
async fn a_store_dropped_without_close_reopens_with_every_acknowledged_write() {
    let dir = tempdir();
    let mut s = Session::new("d");
    {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store.write(s.create()).await.unwrap();
        for _ in 0..5 {
            store.write(s.admit(s.next_spans(2))).await.unwrap();
        }
        store.write(s.abort()).await.unwrap();
    }
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.session("d").unwrap().unwrap(), s.record);
    assert_eq!(store.live_spans("d").unwrap().len(), 10);
    assert_eq!(store.marker_bounds().next, 2);
    assert_eq!(store.session_count(), 1);
}

#[test]
fn a_directory_in_use_is_refused() {
    let dir = tempdir();
    let _store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert!(matches!(
        Store::open(dir.path(), StoreOptions::default()),
        Err(StoreError::Io(_) | StoreError::Engine(_))
    ));
}

/// A tenant's sessions are the ids under `tenant/`: counted by a walk of
/// the sessions tree, and their text bytes summed over live and archived
/// spans (a compressed constraint counting its admitted form too), never
/// reaching `tenant-x/` or the bare ids.
#[tokio::test]
async fn sessions_and_text_bytes_are_counted_by_id_prefix() {
    use ctxbroker_core::Span;
    use ctxbroker_core::span::OriginalForm;
    use ctxbroker_store::text_bytes;

    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut sessions: Vec<Session> = ["acme/a", "acme/b", "acme-x/c", "beta/d", "acme"]
        .into_iter()
        .map(Session::new)
        .collect();
    for s in &mut sessions {
        store.write(s.create()).await.unwrap();
        store
            .write(s.admit(vec![span(1, "0123456789"), span(2, "héllo")]))
            .await
            .unwrap();
    }
    // acme/a: span 1 evicted into a summary (its text stays, archived),
    // span 2 compressed in place, its admitted form kept beside it.
    let compressed = Span {
        text: "hé".into(),
        original: Some(OriginalForm {
            text: "héllo".into(),
            tokens: 5,
        }),
        ..span(2, "")
    };
    let (op, summary) = sessions[0].admit_compacting(vec![1], 1, vec![compressed.clone()], vec![]);
    store.write(op).await.unwrap();
    assert_eq!(text_bytes(&compressed), 3 + 6);

    assert_eq!(store.session_count_with_prefix("acme/").unwrap(), 2);
    assert_eq!(store.session_count_with_prefix("beta/").unwrap(), 1);
    assert_eq!(store.session_count_with_prefix("zeta/").unwrap(), 0);
    assert_eq!(store.session_count_with_prefix("").unwrap(), 5);

    let plain = 10 + 6;
    let a = 10 + text_bytes(&compressed) + summary.text.len() as u64;
    assert_eq!(store.session_text_bytes("acme/a").unwrap(), a);
    assert_eq!(store.session_text_bytes("acme/b").unwrap(), plain);
    assert_eq!(store.text_bytes_with_prefix("acme/").unwrap(), a + plain);
    assert_eq!(store.text_bytes_with_prefix("beta/").unwrap(), plain);
    assert_eq!(store.text_bytes_with_prefix("zeta/").unwrap(), 0);
    assert!(matches!(
        store.session_text_bytes("acme/zz"),
        Err(StoreError::SessionNotFound { .. })
    ));

    store
        .write(WriteOp::DeleteSession {
            id: "acme/a".into(),
        })
        .await
        .unwrap();
    assert_eq!(store.session_count_with_prefix("acme/").unwrap(), 1);
    assert_eq!(store.text_bytes_with_prefix("acme/").unwrap(), plain);
}

/// The writer counts the keys and bytes it hands the engine: an admission
/// of two spans is one key per span (its term vector inside its row) and
/// the session's record, which carries the batch's commit epoch; a
/// deletion removes what the session held and writes the epoch on its own.
/// It counts what it reads to check them too: an admission reads the
/// session's record and nothing else (an appended span's position is
/// known to be free).
#[tokio::test]
async fn the_writer_counts_the_keys_and_bytes_it_writes() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("counted");
    store.write(s.create()).await.unwrap();
    let before = store.stats();
    store.write(s.admit_next(2)).await.unwrap();
    let after = store.stats();
    assert_eq!(after.keys_written - before.keys_written, 2 + 1);
    assert_eq!(after.keys_removed, before.keys_removed);
    assert_eq!(after.keys_read - before.keys_read, 1);
    let bytes = after.bytes_written - before.bytes_written;
    let text: u64 = store
        .live_spans("counted")
        .unwrap()
        .iter()
        .map(|span| span.text.len() as u64)
        .sum();
    assert!(bytes > text, "{bytes} bytes written for {text} of text");
    assert!(
        bytes < text + 1024,
        "{bytes} bytes written for {text} of text"
    );
    store
        .write(WriteOp::DeleteSession {
            id: "counted".into(),
        })
        .await
        .unwrap();
    // The record and two spans go; the epoch is written.
    let deleted = store.stats();
    assert_eq!(deleted.keys_removed - after.keys_removed, 3);
    assert_eq!(deleted.keys_written - after.keys_written, 1);
}
