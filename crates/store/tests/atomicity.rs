//! An admission with its compaction and marker is one write: all of it or
//! none of it, and a write planned on a stale revision changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use ctxbroker_core::SpanId;
use ctxbroker_core::marker::Outcome;
use ctxbroker_core::span::SpanClass;
use ctxbroker_store::{Change, MarkerBounds, SpanState, Store, StoreError, StoreOptions, WriteOp};
use support::{Session, change, constraint, span, tempdir, write};

fn ids(spans: &[ctxbroker_core::Span]) -> Vec<SpanId> {
    spans.iter().map(|s| s.id).collect()
}

/// Spans 1..=6 (2 a constraint), then one admission that evicts 1, 3, 4
/// into a summary at position 1, compresses 2 and appends one span.
async fn compacted(store: &Store) -> (Session, ctxbroker_core::Span) {
    let mut s = Session::new("agent-1");
    store.write(s.create()).await.unwrap();
    let mut first = s.next_spans(6);
    first[1] = constraint(2, "never write to the prod namespace; stage only");
    store.write(s.admit(first)).await.unwrap();

    let mut compressed = constraint(2, "never write prod");
    compressed.tokens = 5;
    let (op, summary) = s.admit_compacting(
        vec![1, 3, 4],
        1,
        vec![compressed],
        vec![span(0, "the next tool output")],
    );
    let ack = store.write(op).await.unwrap();
    assert_eq!(ack.marker_seq, Some(1));
    (s, summary)
}

fn check_compacted(store: &Store, s: &Session, summary: &ctxbroker_core::Span) {
    let live = store.live_spans("agent-1").unwrap();
    assert_eq!(ids(&live), vec![summary.id, 2, 5, 6, 8], "prompt order");
    assert_eq!(&live[0], summary);
    assert_eq!(live[1].text, "never write prod");
    assert_eq!(live[4].text, "the next tool output");

    for evicted in [1, 3, 4] {
        let stored = store.span("agent-1", evicted).unwrap().unwrap();
        assert_eq!(stored.state, SpanState::Archived { by_seq: 1 });
        assert_eq!(stored.span.id, evicted);
    }
    let found = store.span("agent-1", summary.id).unwrap().unwrap();
    assert_eq!(found.state, SpanState::Live);
    assert_eq!(found.span, *summary);
    assert_eq!(store.span("agent-1", 99).unwrap(), None);

    let pins = store.pins("agent-1").unwrap();
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0].span_id, 2);

    let markers = store.markers(1, 10).unwrap();
    assert_eq!(markers.len(), 1);
    assert_eq!(markers[0].seq, 1);
    assert_eq!(markers[0].evicted, vec![1, 3, 4]);
    assert_eq!(markers[0].outcome, Outcome::Committed);
    assert_eq!(store.marker_bounds(), MarkerBounds { oldest: 1, next: 2 });

    assert_eq!(store.session("agent-1").unwrap().unwrap(), s.record);
}

#[tokio::test]
async fn an_admission_with_compaction_lands_whole_and_survives_reopen() {
    let dir = tempdir();
    let (s, summary) = {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let out = compacted(&store).await;
        check_compacted(&store, &out.0, &out.1);
        store.close().unwrap();
        out
    };
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    check_compacted(&store, &s, &summary);
    assert_eq!(store.session_count(), 1);
}

#[tokio::test]
async fn a_stale_revision_is_refused_and_changes_nothing() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let (mut s, summary) = compacted(&store).await;

    // Planned against the revision before the compaction.
    let mut stale = s.clone();
    stale.record.revision -= 1;
    let (op, _) = stale.admit_compacting(vec![5, 6], 5, vec![], vec![span(0, "late")]);
    match store.write(op).await {
        Err(StoreError::StaleRevision {
            session,
            expected,
            actual,
        }) => {
            assert_eq!(session, "agent-1");
            assert_eq!(expected, s.record.revision - 1);
            assert_eq!(actual, s.record.revision);
        }
        other => panic!("expected StaleRevision, got {other:?}"),
    }
    let mut stale_abort = s.clone();
    stale_abort.record.revision += 5;
    assert!(matches!(
        store.write(stale_abort.abort()).await,
        Err(StoreError::StaleRevision { .. })
    ));
    check_compacted(&store, &s, &summary);

    // The refused writes took no marker seq.
    let ack = store.write(s.abort()).await.unwrap();
    assert_eq!(ack.marker_seq, Some(2));
}

#[tokio::test]
async fn writes_that_do_not_fit_the_stored_state_are_refused_whole() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let (s, summary) = compacted(&store).await;

    let invalid = |r: Result<_, StoreError>| matches!(r, Err(StoreError::InvalidWrite { .. }));
    // Evicting an archived span.
    let (op, _) = s.clone().admit_compacting(vec![5, 3], 5, vec![], vec![]);
    assert!(invalid(store.write(op).await));
    // Appending onto a taken position.
    let mut t = s.clone();
    let mut spans = t.next_spans(2);
    spans[1].position = 5;
    assert!(invalid(store.write(t.admit(spans)).await));
    // Reusing an id already given out.
    let mut t = s.clone();
    let reused = span(6, "again");
    let op = t.admit(vec![reused]);
    assert!(invalid(store.write(op).await));
    // Rewriting a span at a position it does not hold.
    let mut moved = span(5, "moved");
    moved.position = 6;
    let op = write(
        Change {
            replace: vec![moved],
            ..change(s.record.revision, s.record.clone())
        },
        vec![],
    );
    assert!(invalid(store.write(op).await));
    // A marker whose session_seq disagrees with the record.
    let mut t = s.clone();
    let mut op = t.abort();
    if let WriteOp::Change {
        change: Change {
            marker: Some(marker),
            ..
        },
        ..
    } = &mut op
    {
        marker.session_seq += 1;
    }
    assert!(invalid(store.write(op).await));
    // Evicting without a marker; rewriting alongside an admission without
    // one; an ABORTED marker that also evicts.
    let marker_refused = |r: Result<_, StoreError>| matches!(r, Err(StoreError::InvalidWrite { detail, .. }) if detail.contains("marker"));
    let evicting = Change {
        evict: vec![5],
        ..change(s.record.revision, s.record.clone())
    };
    assert!(marker_refused(store.write(write(evicting, vec![])).await));
    let mut t = s.clone();
    let append = t.next_spans(1);
    t.record.next_span_id += 1;
    let rewriting = Change {
        replace: vec![span(5, "rewritten")],
        append,
        ..change(s.record.revision, t.record)
    };
    assert!(marker_refused(store.write(write(rewriting, vec![])).await));
    let mut op = s.clone().abort();
    if let WriteOp::Change { change, .. } = &mut op {
        change.evict = vec![5];
    }
    assert!(marker_refused(store.write(op).await));

    check_compacted(&store, &s, &summary);
    assert_eq!(store.stats().rejected, 8);
}

#[tokio::test]
async fn rewrite_moves_spans_in_and_out_of_the_pin_set() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("pins");
    store.write(s.create()).await.unwrap();
    store.write(s.admit(s.next_spans(3))).await.unwrap();
    assert!(store.pins("pins").unwrap().is_empty());

    let pin = |s: &mut Session, spans| {
        let expected_revision = s.record.revision;
        s.record.revision += 1;
        write(
            Change {
                replace: spans,
                ..change(expected_revision, s.record.clone())
            },
            vec![],
        )
    };
    let op = pin(&mut s, vec![constraint(3, "only touch staging")]);
    store.write(op).await.unwrap();
    let pins = store.pins("pins").unwrap();
    assert_eq!(pins.iter().map(|p| p.span_id).collect::<Vec<_>>(), vec![3]);
    assert!(pins[0].predicate.is_some());

    let op = pin(&mut s, vec![span(3, "only touch staging")]);
    store.write(op).await.unwrap();
    assert!(store.pins("pins").unwrap().is_empty());
    let live = store.live_spans("pins").unwrap();
    assert_eq!(live[2].classification.class, SpanClass::Narrative);
}

#[tokio::test]
async fn an_admission_without_compaction_writes_no_marker() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("plain");
    store.write(s.create()).await.unwrap();
    let expected_revision = s.record.revision;
    let spans = s.next_spans(3);
    s.record.revision += 1;
    s.record.next_span_id = 4;
    let ack = store
        .write(write(
            Change {
                append: spans,
                ..change(expected_revision, s.record.clone())
            },
            vec![],
        ))
        .await
        .unwrap();
    assert_eq!(ack.marker_seq, None);
    assert_eq!(store.marker_bounds(), MarkerBounds { oldest: 1, next: 1 });
    assert!(store.markers(0, 10).unwrap().is_empty());
}
