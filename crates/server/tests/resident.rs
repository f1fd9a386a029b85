//! The resident set: sessions the cache lets go leave memory, come back
//! from the store exactly as they were, and keep their per-session turns.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use ctxbroker_core::config::SessionConfig;
use ctxbroker_proto::v1 as pb;
use ctxbroker_server::broker::{Broker, TurnSpan};
use ctxbroker_server::config::{Limits, MIN_MEMORY_BUDGET_BYTES, MemoryShares};
use ctxbroker_server::convert;
use ctxbroker_store::{Store, StoreOptions};

fn broker(dir: &std::path::Path, cache_bytes: u64) -> Broker {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    Broker::new(
        store,
        Limits {
            session_cache_bytes: cache_bytes,
            ..Limits::default()
        },
    )
}

fn turn(session: usize, turn: usize) -> Vec<TurnSpan> {
    convert::turn_from_pb(wire_turn(session, turn))
}

fn wire_turn(session: usize, turn: usize) -> Vec<pb::SpanInput> {
    let mut spans = vec![pb::SpanInput {
        role: pb::Role::Tool as i32,
        text: format!(
            "session {session} turn {turn}: build of src/mod_{turn}.rs failed with error E{turn:04} after {} ms; the handler retried the queue and the cache missed",
            turn * 37
        ),
        ..Default::default()
    }];
    if turn == 1 {
        spans.push(pb::SpanInput {
            role: pb::Role::User as i32,
            text: format!("Never write to the `prod-{session}` namespace; stage only."),
            ..Default::default()
        });
    }
    spans
}

/// The live context as (id, position, text, tokens, class, generation,
/// relevance) rows: everything a reload must reproduce.
async fn rows(broker: &Broker, id: &str) -> Vec<(u64, u64, String, u32, String, u32, u64)> {
    let (_, spans) = broker.context(id).await.unwrap();
    spans
        .into_iter()
        .map(|(span, relevance)| {
            (
                span.id,
                span.position,
                span.text,
                span.tokens,
                format!("{:?}", span.classification),
                span.generation,
                relevance.to_bits(),
            )
        })
        .collect()
}

#[tokio::test]
async fn evicted_sessions_reload_exactly_and_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    // One byte: every idle session but the last one used leaves memory.
    let broker = broker(dir.path(), 1);
    let ids: Vec<String> = (0..5).map(|n| format!("resident-{n}")).collect();
    for id in &ids {
        broker
            .create_session(
                id,
                SessionConfig {
                    soft_watermark: 1.0,
                    ..SessionConfig::with_window(400)
                },
            )
            .await
            .unwrap();
    }
    // Enough turns to compact: summaries, archived spans and a pinned
    // constraint are part of what must come back.
    let mut compactions = 0;
    for t in 0..14 {
        for (n, id) in ids.iter().enumerate() {
            let admitted = broker.admit(id, turn(n, t)).await.unwrap();
            compactions += usize::from(admitted.marker.is_some());
            assert!(
                broker.resident_sessions() <= 2,
                "{} sessions resident under a one-byte cache",
                broker.resident_sessions()
            );
        }
    }
    assert!(
        compactions >= ids.len(),
        "the sessions should have compacted"
    );

    let mut before = Vec::new();
    for id in &ids {
        before.push(rows(&broker, id).await);
    }
    // Read each again after the others pushed it out: identical.
    for (id, expected) in ids.iter().zip(&before) {
        assert_eq!(&rows(&broker, id).await, expected, "{id} reloaded");
    }
    // Against a store opened afresh, nothing cached at all.
    drop(broker);
    let fresh = self::broker(dir.path(), 1 << 30);
    for (id, expected) in ids.iter().zip(&before) {
        assert_eq!(&rows(&fresh, id).await, expected, "{id} after reopening");
    }
    assert_eq!(fresh.resident_sessions(), ids.len());
    drop(fresh);

    // A reloaded session carries on where it stood: ids and turns go on,
    // the totals add up.
    let broker = self::broker(dir.path(), 1);
    for (n, id) in ids.iter().enumerate() {
        let record = broker.session(id).await.unwrap();
        let admitted = broker.admit(id, turn(n, 99)).await.unwrap();
        assert_eq!(admitted.turn, record.turns + 1);
        assert_eq!(admitted.spans[0].0.id, record.next_span_id);
        let (after, spans) = broker.context(id).await.unwrap();
        let live: u64 = spans.iter().map(|(s, _)| u64::from(s.tokens)).sum();
        assert_eq!(after.live_tokens, live);
    }
}

#[tokio::test]
async fn the_budget_keeps_recent_sessions_and_lets_old_ones_go() {
    let dir = tempfile::tempdir().unwrap();
    // Room for a few small sessions, not for twenty.
    let broker = broker(dir.path(), 64 << 10);
    for n in 0..20 {
        let id = format!("lru-{n}");
        broker
            .create_session(&id, SessionConfig::with_window(100_000))
            .await
            .unwrap();
        for t in 0..8 {
            broker.admit(&id, turn(n, t)).await.unwrap();
        }
    }
    let resident = broker.resident_sessions();
    assert!(
        (2..20).contains(&resident),
        "{resident} of 20 sessions resident"
    );
    // A generous budget keeps them all.
    let roomy_dir = tempfile::tempdir().unwrap();
    let roomy = self::broker(roomy_dir.path(), 1 << 30);
    for n in 0..20 {
        let id = format!("lru-{n}");
        roomy
            .create_session(&id, SessionConfig::with_window(100_000))
            .await
            .unwrap();
        roomy.admit(&id, turn(n, 0)).await.unwrap();
    }
    assert_eq!(roomy.resident_sessions(), 20);
}

#[tokio::test]
async fn sessions_read_back_stay_within_the_memory_budgets_share() {
    let dir = tempfile::tempdir().unwrap();
    // The smallest budget the settings allow; its sessions' share is 16 MiB.
    let budget = MIN_MEMORY_BUDGET_BYTES;
    let share = MemoryShares::of(budget).sessions;
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let broker = Broker::new(
        store,
        Limits {
            memory_budget_bytes: budget,
            session_cache_bytes: share,
            ..Limits::default()
        },
    );
    // About 1.3 MiB of text each: forty sessions hold three times the share.
    let text = "x".repeat(4_000);
    let ids: Vec<String> = (0..40).map(|n| format!("budget-{n}")).collect();
    for id in &ids {
        broker
            .create_session(id, SessionConfig::with_window(10_000_000))
            .await
            .unwrap();
        for _ in 0..2 {
            let spans = (0..170)
                .map(|k| pb::SpanInput {
                    role: pb::Role::Tool as i32,
                    text: format!("{id} {k} {text}"),
                    ..Default::default()
                })
                .collect();
            broker
                .admit(id, convert::turn_from_pb(spans))
                .await
                .unwrap();
        }
        assert!(broker.resident_bytes() <= share, "{id}: over the share");
    }
    // Read every one back, twice, in order: each read loads it again.
    let mut peak = 0;
    for id in ids.iter().chain(&ids) {
        let (_, spans) = broker.context(id).await.unwrap();
        assert_eq!(spans.len(), 340);
        peak = peak.max(broker.resident_bytes());
    }
    assert!(peak <= share, "{peak} bytes resident, share {share}");
    // The share is used, not left empty: several sessions stay.
    assert!(peak > share / 2, "{peak} bytes resident, share {share}");
    let resident = broker.resident_sessions();
    assert!((2..40).contains(&resident), "{resident} of 40 resident");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_stay_serial_while_sessions_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Arc::new(broker(dir.path(), 1));
    let ids: Vec<String> = (0..3).map(|n| format!("serial-{n}")).collect();
    for id in &ids {
        broker
            .create_session(id, SessionConfig::with_window(1_000_000))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let broker = Arc::clone(&broker);
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let mut turns = Vec::new();
            for k in 0..30 {
                let n = (worker + k) % ids.len();
                let admitted = broker.admit(&ids[n], turn(n, 2 + k)).await.unwrap();
                turns.push((n, admitted.turn));
                // Reads in between, so slots are released and taken often.
                broker.context(&ids[(n + 1) % ids.len()]).await.unwrap();
            }
            turns
        }));
    }
    let mut per_session = vec![Vec::new(); ids.len()];
    for task in tasks {
        for (n, t) in task.await.unwrap() {
            per_session[n].push(t);
        }
    }
    for (n, mut turns) in per_session.into_iter().enumerate() {
        turns.sort_unstable();
        let expected: Vec<u64> = (1..=turns.len() as u64).collect();
        assert_eq!(turns, expected, "session {n}: every turn once, none lost");
        let record = broker.session(&ids[n]).await.unwrap();
        assert_eq!(record.turns, expected.len() as u64);
    }
}
