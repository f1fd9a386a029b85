//! The marker log: global seqs from 1, gapless under concurrent writers and
//! across reopen; retention trims the oldest; readers never see a marker
//! before its batch is durable, and always before the hook hands it on.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ctxbroker_core::Marker;
use ctxbroker_store::{MarkerBounds, Store, StoreError, StoreOptions};
use support::{Session, tempdir};

/// `tasks` sessions, each writing `per_task` markers (aborts and
/// compactions alternating), all at once. Returns every acknowledged seq.
async fn write_markers(store: &Store, tasks: usize, per_task: usize, round: usize) -> Vec<u64> {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("m{t}");
            let mut s = match store.session(&id).unwrap() {
                Some(record) => Session { record },
                None => {
                    let s = Session::new(&id);
                    store.write(s.create()).await.unwrap();
                    s
                }
            };
            let mut seqs = Vec::new();
            for i in 0..per_task {
                let op = if (i + round).is_multiple_of(2) {
                    s.abort()
                } else {
                    // Add two spans, then fold the oldest live one away.
                    store.write(s.admit(s.next_spans(2))).await.unwrap();
                    let oldest = store.live_spans(&id).unwrap()[0].clone();
                    s.admit_compacting(vec![oldest.id], oldest.position, vec![], vec![])
                        .0
                };
                seqs.push(store.write(op).await.unwrap().marker_seq.unwrap());
            }
            seqs
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        let seqs = h.await.unwrap();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "one task's seqs increase"
        );
        all.extend(seqs);
    }
    all.sort_unstable();
    all
}

fn read_all(store: &Store, from: u64) -> Vec<Marker> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let page = store.markers(next, 7).unwrap();
        let Some(last) = page.last() else { break };
        next = last.seq + 1;
        out.extend(page);
    }
    out
}

fn check_log(markers: &[Marker], first: u64, last: u64) {
    let seqs: Vec<u64> = markers.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (first..=last).collect::<Vec<_>>(), "contiguous");
    // Per session, session_seq counts up by one.
    let mut per_session: BTreeMap<&str, u64> = BTreeMap::new();
    for m in markers {
        let prev = per_session.insert(&m.session_id, m.session_seq);
        if let Some(prev) = prev {
            assert_eq!(m.session_seq, prev + 1, "session {}", m.session_id);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seqs_are_gapless_across_concurrent_writers_and_reopen() {
    let dir = tempdir();
    let test = async {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let acked = write_markers(&store, 32, 6, 0).await;
        assert_eq!(acked, (1..=192).collect::<Vec<_>>());
        check_log(&read_all(&store, 0), 1, 192);
        assert_eq!(
            store.marker_bounds(),
            MarkerBounds {
                oldest: 1,
                next: 193
            }
        );
        store.close().unwrap();
        drop(store);

        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(
            store.marker_bounds(),
            MarkerBounds {
                oldest: 1,
                next: 193
            }
        );
        let acked = write_markers(&store, 32, 4, 1).await;
        assert_eq!(acked, (193..=320).collect::<Vec<_>>());
        check_log(&read_all(&store, 1), 1, 320);
        check_log(&read_all(&store, 250), 250, 320);
        assert!(store.markers(321, 10).unwrap().is_empty());
        store.close().unwrap();
    };
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("no deadlock");
}

#[tokio::test]
async fn retention_trims_the_oldest_and_moves_the_bound() {
    let dir = tempdir();
    let options = || StoreOptions {
        marker_retention: 10,
        ..StoreOptions::default()
    };
    {
        let store = Store::open(dir.path(), options()).unwrap();
        let mut s = Session::new("r");
        store.write(s.create()).await.unwrap();
        for _ in 0..25 {
            store.write(s.abort()).await.unwrap();
        }
        assert_eq!(
            store.marker_bounds(),
            MarkerBounds {
                oldest: 16,
                next: 26
            }
        );
        match store.markers(3, 100) {
            Err(StoreError::MarkersTrimmed { from_seq, oldest }) => {
                assert_eq!((from_seq, oldest), (3, 16));
            }
            other => panic!("expected MarkersTrimmed, got {other:?}"),
        }
        assert!(matches!(
            store.markers(0, 1),
            Err(StoreError::MarkersTrimmed { .. })
        ));
        check_log(&read_all(&store, 16), 16, 25);
        store.close().unwrap();
    }
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(
        store.marker_bounds(),
        MarkerBounds {
            oldest: 16,
            next: 26
        }
    );
    check_log(&read_all(&store, 16), 16, 25);
}

/// The hook sees every marker once, in order, after its batch is durable,
/// and only once the log already shows it: a subscriber that learns of a
/// marker from the hook can read everything up to it from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_log_shows_markers_before_the_hook_hands_them_on() {
    let dir = tempdir();
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let handle: Arc<OnceLock<Store>> = Arc::default();
    let options = StoreOptions {
        on_commit: Some({
            let seen = Arc::clone(&seen);
            let violations = Arc::clone(&violations);
            let handle = Arc::clone(&handle);
            Arc::new(move |markers: &[Marker]| {
                let mut bad = violations.lock().unwrap();
                if let Some(store) = handle.get() {
                    let first = markers[0].seq;
                    let last = markers[markers.len() - 1].seq;
                    if store.marker_bounds().next <= last {
                        bad.push(format!("head not yet past {last} in the hook"));
                    }
                    match store.markers(first, markers.len()) {
                        Ok(visible) => {
                            let seqs: Vec<u64> = visible.iter().map(|m| m.seq).collect();
                            let want: Vec<u64> = markers.iter().map(|m| m.seq).collect();
                            if seqs != want {
                                bad.push(format!("log shows {seqs:?} while the hook has {want:?}"));
                            }
                        }
                        Err(e) => bad.push(e.to_string()),
                    }
                }
                seen.lock().unwrap().extend(markers.iter().map(|m| m.seq));
            })
        }),
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    // The hook holds a handle only for this test; close() breaks the cycle.
    handle.set(store.clone()).ok();
    let acked = tokio::time::timeout(Duration::from_secs(60), write_markers(&store, 16, 5, 0))
        .await
        .expect("no deadlock");
    store.close().unwrap();
    assert_eq!(*violations.lock().unwrap(), Vec::<String>::new());
    assert_eq!(*seen.lock().unwrap(), acked);
    assert_eq!(acked, (1..=80).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_panicking_hook_does_not_stop_the_writer() {
    let dir = tempdir();
    let options = StoreOptions {
        on_commit: Some(Arc::new(|_: &[Marker]| panic!("hook failure"))),
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    let mut s = Session::new("p");
    store.write(s.create()).await.unwrap();
    store.write(s.abort()).await.unwrap();
    store.write(s.abort()).await.unwrap();
    // The hook runs after the acknowledgements: wait for the second call.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.stats().hook_panics < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(store.stats().hook_panics, 2);
    assert_eq!(store.markers(1, 10).unwrap().len(), 2);
}

/// A session's markers, newest first, found by a bounded walk down the
/// global log: pages join up, the walk stops at the session's first
/// marker, and a scan bound smaller than the gap between two of its
/// markers returns an empty page that still says where to go on.
#[tokio::test]
async fn a_sessions_markers_page_down_the_log() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut a = Session::new("a");
    let mut b = Session::new("b");
    store.write(a.create()).await.unwrap();
    store.write(b.create()).await.unwrap();
    // b's markers are seqs 1..=5, then a's and b's alternate (6..=15),
    // then b again (16..=20).
    for _ in 0..5 {
        store.write(b.abort()).await.unwrap();
    }
    for _ in 0..5 {
        store.write(a.abort()).await.unwrap();
        store.write(b.abort()).await.unwrap();
    }
    for _ in 0..5 {
        store.write(b.abort()).await.unwrap();
    }
    let seqs = |page: &ctxbroker_store::SessionMarkers| {
        page.markers.iter().map(|m| m.seq).collect::<Vec<_>>()
    };
    let first = store.session_markers("a", None, 3, 1000).unwrap();
    assert_eq!(seqs(&first), vec![14, 12, 10]);
    assert_eq!(first.before, Some(10));
    let second = store.session_markers("a", first.before, 3, 1000).unwrap();
    assert_eq!(seqs(&second), vec![8, 6]);
    assert_eq!(second.before, None, "a's first marker ends the walk");
    assert!(
        second.markers.iter().all(|m| m.session_id == "a"),
        "only the session's markers"
    );
    // Six of b's markers stand above a's newest: walks of three find
    // nothing twice and say where they stopped.
    let bounded = store.session_markers("a", None, 3, 3).unwrap();
    assert!(bounded.markers.is_empty());
    assert_eq!(bounded.before, Some(18));
    let on = store.session_markers("a", bounded.before, 3, 3).unwrap();
    assert!(on.markers.is_empty());
    assert_eq!(on.before, Some(15));
    let found = store.session_markers("a", on.before, 3, 3).unwrap();
    assert_eq!(seqs(&found), vec![14, 12]);
    assert_eq!(found.before, Some(12));
    // A session without markers walks to the oldest retained one.
    let c = Session::new("c");
    store.write(c.create()).await.unwrap();
    let none = store.session_markers("c", None, 10, 1000).unwrap();
    assert!(none.markers.is_empty());
    assert_eq!(none.before, None);
    assert!(
        store.session_markers("", None, 1, 1).is_err(),
        "ids are checked"
    );
}
