//! Many tasks writing at once all complete, share flushes, and readers see
//! whole batches only.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ctxbroker_core::span::SpanClass;
use ctxbroker_store::{Durability, Store, StoreOptions};
use support::{Session, tempdir};

/// `tasks` sessions admitting `per_task` turns of one span each, at once.
async fn admit_concurrently(store: &Store, tasks: usize, per_task: usize) {
    let sessions = run_writers(store, tasks, per_task).await;
    for s in sessions {
        assert_eq!(store.session(s.id()).unwrap().unwrap(), s.record);
        assert_eq!(store.live_spans(s.id()).unwrap().len(), per_task);
    }
}

async fn run_writers(store: &Store, tasks: usize, per_task: usize) -> Vec<Session> {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut s = Session::new(&format!("c{t:03}"));
            store.write(s.create()).await.unwrap();
            for _ in 0..per_task {
                store.write(s.admit(s.next_spans(1))).await.unwrap();
            }
            s
        }));
    }
    let mut sessions = Vec::new();
    for h in handles {
        sessions.push(h.await.unwrap());
    }
    sessions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_writers_complete_and_share_flushes() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), admit_concurrently(&store, 64, 40))
        .await
        .expect("64 concurrent writers finished (no deadlock)");
    let stats = store.stats();
    assert_eq!(stats.writes, 64 * 41);
    assert_eq!(stats.rejected, 0);
    assert!(
        stats.batches < stats.writes / 2,
        "flushes are shared: {stats:?}"
    );
    assert!(stats.flushes <= stats.batches + 1, "{stats:?}");
    assert!(stats.largest_batch > 1, "{stats:?}");
    assert_eq!(store.session_count(), 64);
    store.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relaxed_durability_does_not_flush_per_batch() {
    let dir = tempdir();
    let options = StoreOptions {
        durability: Durability::Relaxed,
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    tokio::time::timeout(Duration::from_secs(60), admit_concurrently(&store, 16, 20))
        .await
        .expect("finished");
    assert_eq!(store.stats().flushes, 0);
    store.close().unwrap();
    assert_eq!(store.stats().flushes, 1, "close flushes");
    drop(store);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.session_count(), 16);
    assert_eq!(store.live_spans("c015").unwrap().len(), 20);
}

/// While compactions move spans between the live context and the archive,
/// a reader always sees a context some commit left, never a mix of two.
///
/// Each compaction evicts the oldest live span (from the second one on,
/// the previous summary) into a new summary at the same position, and
/// appends one span whose id is the summary's + 1. So every committed
/// context is `[summary_k, 2, 3, 4, more_1 .. more_k]`: the last span
/// directly follows the summary in id order. A scan that straddled a
/// commit would show the old summary with the new span.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_half_a_batch() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = Session::new("read");
    store.write(s.create()).await.unwrap();
    store.write(s.admit(s.next_spans(4))).await.unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let store = store.clone();
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !done.load(Ordering::SeqCst) {
                let live = store.live_spans("read").unwrap();
                let more = live.iter().filter(|s| s.text == "more").count();
                assert_eq!(live.len(), 4 + more);
                if more > 0 {
                    assert_eq!(live[0].classification.class, SpanClass::Summary);
                    assert_eq!(live[live.len() - 1].id, live[0].id + 1, "a mixed view");
                }
                reads += 1;
            }
            reads
        })
    };
    for _ in 0..60 {
        let oldest = store.live_spans("read").unwrap()[0].clone();
        let (op, _) = s.admit_compacting(
            vec![oldest.id],
            oldest.position,
            vec![],
            vec![support::span(0, "more")],
        );
        store.write(op).await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(
        store.live_spans("read").unwrap().len() as u64,
        s.record.live_spans
    );
}

/// Writes/s of small admissions with 64 writers. Run with
/// `cargo test -p ctxbroker-store --release --test concurrency -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn throughput_of_small_admissions() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for durability in [Durability::Flush, Durability::Relaxed] {
        let dir = tempdir();
        let store = Store::open(
            dir.path(),
            StoreOptions {
                durability,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        let started = Instant::now();
        runtime.block_on(run_writers(&store, 64, 2000));
        let elapsed = started.elapsed();
        let stats = store.stats();
        println!(
            "{durability:?}: {} writes in {:.2?} = {:.0} writes/s; {} batches (mean {:.1}, largest {}), {} flushes",
            stats.writes,
            elapsed,
            stats.writes as f64 / elapsed.as_secs_f64(),
            stats.batches,
            stats.writes as f64 / stats.batches as f64,
            stats.largest_batch,
            stats.flushes,
        );
        store.close().unwrap();
    }
}
