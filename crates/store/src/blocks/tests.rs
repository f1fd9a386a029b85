use super::*;

#[test]
fn a_block_is_due_once_next_span_id_is_a_block_past_its_end() {
    let k = BLOCK_SPANS;
    assert!(blocks_due(0, 2 * k - 1).is_empty());
    assert_eq!(blocks_due(2 * k - 1, 2 * k), 0..1);
    assert!(blocks_due(2 * k, 2 * k + 1).is_empty());
    assert_eq!(blocks_due(2 * k, 5 * k + 3), 1..4);
    assert_eq!(blocks_due(0, 4 * k), 0..3);
    assert!(blocks_due(7, 7).is_empty());
    assert!(blocks_due(9 * k, 3).is_empty());
    assert_eq!(block_start(2 * k + 5), 2 * k);
}

#[test]
fn rows_are_found_alone_or_in_their_blocks_run_and_read_in_position_order() {
    let k = BLOCK_SPANS;
    let key = |position| keys::session_number_key("s", position);
    let run = record::encode_run(&key(k), [(k, &b"first"[..]), (k + 3, &b"fourth"[..])]);
    let mut stored = std::collections::BTreeMap::new();
    stored.insert((TreeId::Runs, key(k)), run.clone());
    for (position, row) in [(k - 1, "before"), (2 * k, "alone"), (2 * k + 1, "next")] {
        stored.insert((TreeId::Spans, key(position)), row.as_bytes().to_vec());
    }
    let get = |tree, key: &[u8]| Ok(stored.get(&(tree, key.to_vec())).cloned());
    assert_eq!(row_at("s", k, get).unwrap().unwrap(), b"first");
    assert_eq!(row_at("s", k + 3, get).unwrap().unwrap(), b"fourth");
    assert_eq!(row_at("s", k + 1, get).unwrap(), None);
    assert_eq!(row_at("s", 2 * k, get).unwrap().unwrap(), b"alone");
    assert_eq!(row_at("s", 2 * k + 2, get).unwrap(), None);
    assert_eq!(rows_in_run(&key(k), &run).unwrap(), 2);
    let entries = |tree| {
        stored
            .iter()
            .filter(move |((t, _), _)| *t == tree)
            .map(|((_, key), value)| Ok((key.clone(), value.clone())))
    };
    let mut seen = Vec::new();
    in_position_order(entries(TreeId::Spans), entries(TreeId::Runs), |key, row| {
        let position = keys::parse_session_number_key(key).unwrap().1;
        seen.push((position, String::from_utf8(row.to_vec()).unwrap()));
        Ok(())
    })
    .unwrap();
    let expected = [
        (k - 1, "before"),
        (k, "first"),
        (k + 3, "fourth"),
        (2 * k, "alone"),
        (2 * k + 1, "next"),
    ];
    assert_eq!(seen, expected.map(|(at, row)| (at, row.to_owned())));
}

#[test]
fn a_damaged_run_is_reported_not_read() {
    let block = keys::session_number_key("s", 0);
    let run = record::encode_run(&block, [(1, &b"row"[..]), (2, &b"next"[..])]);
    for at in 0..run.len() {
        let mut bad = run.clone();
        bad[at] ^= 0x40;
        assert!(rows_in_run(&block, &bad).is_err(), "byte {at}");
    }
    assert!(rows_in_run(&block, &run[..run.len() - 1]).is_err());
    // Under another key (another session or block) the checksum fails.
    let moved = keys::session_number_key("s", BLOCK_SPANS);
    assert!(rows_in_run(&moved, &run).is_err());
    // Well framed, but a position outside its block.
    let outside = record::encode_run(&block, [(BLOCK_SPANS, &b"row"[..])]);
    let err = rows_in_run(&block, &outside).unwrap_err().to_string();
    assert!(err.contains("outside positions 0..16"), "{err}");
    assert!(err.contains("runs"), "{err}");
    let unordered = record::encode_run(&block, [(3, &b"a"[..]), (2, &b"b"[..])]);
    assert!(rows_in_run(&block, &unordered).is_err());
    assert!(rows_in_run(&block, &record::encode_run(&block, [])).is_err());
}

// ---------------------------------------------------------------------------
// Through the store: packed blocks read back, are rewritten by changes
// and are converted to.

use std::collections::BTreeMap;

use ctxbroker_core::Span;

use crate::tests::{admission_rows, search_ids, support::Session};
use crate::{SessionImport, SpanState, Store, StoreError, StoreOptions, WriteOp};

/// Spans admitted one a turn, with texts of their own.
const ADMITTED: u64 = 100;

/// A store with session "s" holding spans 1..=ADMITTED, one per turn.
async fn admitted(dir: &std::path::Path) -> (Store, Session, Vec<Span>) {
    admitted_turns(dir, ADMITTED).await
}

/// A store with session "s" holding spans 1..=`turns`, one per turn.
async fn admitted_turns(dir: &std::path::Path, turns: u64) -> (Store, Session, Vec<Span>) {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    let mut session = Session::new("s");
    store.write(session.create()).await.unwrap();
    let mut spans = Vec::new();
    for _ in 0..turns {
        let next = session.next_spans(1);
        spans.extend(next.iter().cloned());
        store.write(session.admit(next)).await.unwrap();
    }
    (store, session, spans)
}

/// The session's keys in the spans and runs trees: (position of the key,
/// whether it is a run), in position order.
fn layout(store: &Store, session: &str) -> Vec<(u64, bool)> {
    let mut layout: Vec<(u64, bool)> = [TreeId::Spans, TreeId::Runs]
        .into_iter()
        .flat_map(|tree| {
            store
                .raw_tree(tree)
                .scan_prefix(keys::session_prefix(session))
                .keys()
                .map(move |key| {
                    let position = keys::parse_session_number_key(&key.unwrap()).unwrap().1;
                    (position, tree == TreeId::Runs)
                })
        })
        .collect();
    layout.sort();
    layout
}

/// Blocks 0..=4 (positions 1..=79) packed, blocks 5 and 6 a row per span.
fn expected_layout() -> Vec<(u64, bool)> {
    let mut layout: Vec<(u64, bool)> = (0..5).map(|b| (b * BLOCK_SPANS, true)).collect();
    layout.extend((5 * BLOCK_SPANS..=ADMITTED).map(|p| (p, false)));
    layout
}

fn live(store: &Store) -> Vec<Span> {
    store.live_spans("s").unwrap()
}

#[tokio::test]
async fn packed_blocks_read_back_as_the_spans_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, spans) = admitted(dir.path()).await;
    assert_eq!(layout(&store, "s"), expected_layout());
    assert_eq!(live(&store), spans);
    let (seeded, seeds) = store.live_spans_seeded("s").unwrap();
    assert_eq!((seeded, seeds.len()), (spans.clone(), spans.len()));
    for span in &spans {
        let stored = store.span("s", span.id).unwrap().unwrap();
        assert_eq!((&stored.span, stored.state), (span, SpanState::Live));
    }
    assert!(store.span("s", ADMITTED + 1).unwrap().is_none());
    let listed = store
        .list_spans("s", &Default::default(), Some(30), 10)
        .unwrap();
    let ids: Vec<u64> = listed.spans.iter().map(|s| s.span.id).collect();
    assert_eq!(ids, (31..=40).collect::<Vec<_>>());
    let bytes: u64 = spans.iter().map(crate::text_bytes).sum();
    assert_eq!(store.session_text_bytes("s").unwrap(), bytes);
    assert_eq!(search_ids(&store, "s", "37").unwrap(), [37]);
    // A snapshot carries a row per span; imported, the session is packed
    // the same way.
    let export = store.export_session("s").unwrap();
    let import = SessionImport::open(
        export.format_version,
        &export.session_id,
        &export.body,
        export.checksum,
    )
    .unwrap();
    assert_eq!(import.live_spans(), &spans[..]);
    let ack = store
        .write(WriteOp::DeleteSession { id: "s".into() })
        .await
        .unwrap();
    assert_eq!(ack.spans_deleted, ADMITTED);
    assert!(layout(&store, "s").is_empty());
    store.import_session(import).await.unwrap();
    assert_eq!(layout(&store, "s"), expected_layout());
    assert_eq!(live(&store), spans);
    // And after a restart.
    store.close().unwrap();
    drop(store);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(live(&store), spans);
}

#[tokio::test]
async fn search_reads_the_spans_packed_since_it_last_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut session, _) = admitted(dir.path()).await;
    assert_eq!(search_ids(&store, "s", "99").unwrap(), [99]);
    // Blocks 5 and 6 (positions 80..=111) are packed now, the postings
    // read up to span 100.
    for _ in 0..2 * BLOCK_SPANS {
        let next = session.next_spans(1);
        store.write(session.admit(next)).await.unwrap();
    }
    assert!(layout(&store, "s").contains(&(6 * BLOCK_SPANS, true)));
    for (query, id) in [
        ("99", 99),
        ("101", 101),
        ("111", 111),
        ("120", 120),
        ("7", 7),
    ] {
        assert_eq!(search_ids(&store, "s", query).unwrap(), [id], "{query}");
    }
}

#[tokio::test]
async fn changes_inside_packed_blocks_rewrite_their_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut session, spans) = admitted(dir.path()).await;
    let mut model: BTreeMap<u64, Span> = spans.iter().map(|s| (s.position, s.clone())).collect();

    // Evict two spans of block 1 and the first of block 0, summarised at
    // its position; rewrite a span of block 2; append one.
    let mut rewritten = model[&40].clone();
    rewritten.text = "span 40, compressed".into();
    rewritten.generation = 1;
    let appended = session.next_spans(1);
    let (op, summary) = session.admit_compacting(
        vec![1, 20, 21],
        1,
        vec![rewritten.clone()],
        appended.clone(),
    );
    let ack = store.write(op).await.unwrap();
    assert!(ack.marker_seq.is_some());
    for gone in [1, 20, 21] {
        model.remove(&gone);
        let archived = store.span("s", gone).unwrap().unwrap();
        assert!(
            matches!(archived.state, SpanState::Archived { .. }),
            "{gone}"
        );
    }
    model.insert(summary.position, summary.clone());
    model.insert(40, rewritten);
    let appended = Span {
        id: summary.id + 1,
        position: summary.id + 1,
        ..appended[0].clone()
    };
    model.insert(appended.position, appended);
    assert_eq!(live(&store), model.values().cloned().collect::<Vec<_>>());
    assert_eq!(store.span("s", summary.id).unwrap().unwrap().span, summary);
    // The rewritten blocks are still one run each.
    let runs: Vec<u64> = layout(&store, "s")
        .into_iter()
        .filter_map(|(at, run)| run.then_some(at))
        .collect();
    assert_eq!(runs, [0, 16, 32, 48, 64]);

    // A block whose spans all leave loses its key.
    let block_one: Vec<u64> = model.range(16..32).map(|(at, _)| *at).collect();
    let (op, _) = session.admit_compacting(block_one.clone(), 16, vec![], vec![]);
    store.write(op).await.unwrap();
    for at in &block_one {
        model.remove(at);
    }
    let summary_at_16 = store.live_spans("s").unwrap();
    let summary_at_16 = summary_at_16.iter().find(|s| s.position == 16).unwrap();
    model.insert(16, summary_at_16.clone());
    assert_eq!(live(&store), model.values().cloned().collect::<Vec<_>>());

    // Taking back a span of a packed block.
    let taken = model.remove(&50).unwrap();
    let expected_revision = session.record.revision;
    session.record.revision += 1;
    session.record.live_spans -= 1;
    store
        .write(WriteOp::Retract {
            expected_revision,
            record: session.record.clone(),
            spans: vec![taken.clone()],
        })
        .await
        .unwrap();
    assert_eq!(live(&store), model.values().cloned().collect::<Vec<_>>());
    assert!(store.span("s", 50).unwrap().is_none());
    // Taking it back again is refused: it is no longer live there.
    let again = store
        .write(WriteOp::Retract {
            expected_revision: session.record.revision,
            record: session.record.clone(),
            spans: vec![taken],
        })
        .await;
    assert!(
        matches!(again, Err(StoreError::InvalidWrite { .. })),
        "{again:?}"
    );

    let archived = 3 + block_one.len() as u64;
    let ack = store
        .write(WriteOp::DeleteSession { id: "s".into() })
        .await
        .unwrap();
    assert_eq!(ack.spans_deleted, model.len() as u64 + archived);
}

#[tokio::test]
async fn a_damaged_run_is_reported_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, spans) = admitted(dir.path()).await;
    let block = keys::session_number_key("s", 2 * BLOCK_SPANS);
    let raw = store.raw_tree(TreeId::Runs);
    let mut value = raw.get(&block).unwrap().unwrap().to_vec();
    let at = value.len() / 2;
    value[at] ^= 0x01;
    raw.insert(&block, value).unwrap();
    for read in [
        store.live_spans("s").map(|_| ()),
        store.span("s", 2 * BLOCK_SPANS + 3).map(|_| ()),
    ] {
        match read {
            Err(StoreError::Corrupt {
                tree, key, session, ..
            }) => {
                assert_eq!((tree.as_str(), session.as_deref()), ("runs", Some("s")));
                assert_eq!(key, "\"s\"/block from position 32");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    // Spans of other blocks are still served by id.
    assert_eq!(store.span("s", 5).unwrap().unwrap().span, spans[4]);
}

/// As a format-3 build left a store: every span under its own key.
fn unpacked(store: &Store) {
    let (spans, runs) = (store.raw_tree(TreeId::Spans), store.raw_tree(TreeId::Runs));
    for entry in runs.scan_prefix(keys::session_prefix("s")) {
        let (key, run) = entry.unwrap();
        runs.remove(&key).unwrap();
        for_each_run_row(&key, &run, |key, row| {
            spans.insert(key, row).unwrap();
            Ok(())
        })
        .unwrap();
    }
    assert!(layout(store, "s").iter().all(|(_, run)| !run));
}

#[tokio::test]
async fn a_store_of_a_row_per_span_has_its_blocks_packed_when_opened() {
    // A format-3 store, and one whose conversion was cut short: format 4
    // recorded, the packing still marked pending.
    for cut_short in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let spans = {
            let (store, _, spans) = admitted(dir.path()).await;
            unpacked(&store);
            let meta = store.raw_tree(TreeId::Meta);
            let format = if cut_short { 4 } else { 3 };
            meta.insert(
                keys::META_FORMAT,
                &record::encode_format_version(format)[..],
            )
            .unwrap();
            if cut_short {
                meta.insert(keys::META_PACKING, &[][..]).unwrap();
            }
            store.close().unwrap();
            spans
        };
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(
            layout(&store, "s"),
            expected_layout(),
            "cut short: {cut_short}"
        );
        assert_eq!(live(&store), spans);
        let meta = store.raw_tree(TreeId::Meta);
        let format = meta.get(keys::META_FORMAT).unwrap().unwrap();
        assert_eq!(record::decode_format_version(&format).unwrap(), 4);
        assert!(!meta.contains_key(keys::META_PACKING).unwrap());
        store.close().unwrap();
        drop(store);
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(layout(&store, "s"), expected_layout());
        assert_eq!(live(&store), spans);
    }
    // A format-4 store with nothing pending is opened as it is.
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _, _) = admitted(dir.path()).await;
        unpacked(&store);
        store.close().unwrap();
    }
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert!(layout(&store, "s").iter().all(|(_, run)| !run));
}

#[tokio::test]
async fn a_block_holding_a_long_row_keeps_a_row_per_span() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut session = Session::new("s");
    store.write(session.create()).await.unwrap();
    let mut spans = Vec::new();
    for _ in 0..50 {
        let mut next = session.next_spans(1);
        if next[0].id == 5 {
            next[0].text = "a long tool output ".repeat(500);
        }
        spans.extend(next.iter().cloned());
        store.write(session.admit(next)).await.unwrap();
    }
    // Blocks 0 and 1 are due; block 0 holds the long row.
    let mut expected: Vec<(u64, bool)> = (1..BLOCK_SPANS).map(|p| (p, false)).collect();
    expected.push((BLOCK_SPANS, true));
    expected.extend((2 * BLOCK_SPANS..=50).map(|p| (p, false)));
    assert_eq!(layout(&store, "s"), expected);
    assert_eq!(live(&store), spans);
}

/// A row's tree and key.
type At = (TreeId, Vec<u8>);

/// The commit epoch session "s"'s record carries: that of the batch of
/// appends that wrote it, none (0) if a transaction did.
fn record_epoch(store: &Store) -> u64 {
    let key = keys::session_key("s");
    let value = store.raw_tree(TreeId::Sessions).get(&key).unwrap().unwrap();
    record::session_epoch(&key, &value).unwrap()
}

/// A turn that packs a block is applied without a transaction, and leaves,
/// after a crash, a prefix of its writes in the order the writer applies
/// them (the engine recovers a prefix of its log). Cut after any of them,
/// the store opens with the turn undone, and the turn can be admitted
/// again. A turn whose pack would take its own first span into a run is
/// applied as a transaction.
#[tokio::test]
async fn a_packing_turn_a_crash_tore_after_any_write_is_undone_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut session, _) = admitted_turns(dir.path(), 30).await;
    assert_eq!(session.record.next_span_id, 31);
    // Spans 31..=33 move next_span_id to 34, which packs block 0.
    let mut spans = session.next_spans(3);
    spans[1] = crate::tests::support::constraint(32, "never touch prod");
    let WriteOp::Change { change, .. } = session.admit(spans) else {
        unreachable!("an admission is a change")
    };
    let turn = WriteOp::Change {
        change,
        keys: vec![("turn/31".into(), 31), ("turn/33".into(), 33)],
    };
    let durable = record_epoch(&store);
    assert!(durable > 0);
    let before = admission_rows(&store);
    store.write(turn.clone()).await.unwrap();
    let after = admission_rows(&store);
    assert!(layout(&store, "s").starts_with(&[(0, true), (16, false)]));
    assert_eq!(record_epoch(&store), durable + 1, "applied in order");

    // The turn's writes, in the order the writer applies them.
    let mut writes: Vec<(At, Option<Vec<u8>>)> = before
        .keys()
        .chain(after.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|at| before.get(*at) != after.get(*at))
        .map(|at| (at.clone(), after.get(at).cloned()))
        .collect();
    writes.sort_by_key(|((tree, key), value)| {
        (
            crate::writer::append_step(*tree, value.is_some()).unwrap(),
            key.clone(),
        )
    });
    // 3 spans, a run, a pin, 2 keys, 15 rows removed, the record.
    assert_eq!(writes.len(), 23);

    let mut store = store;
    for cut in 0..writes.len() {
        // What the crash left: the turn's first `cut` writes.
        for (at, _) in &writes {
            let tree = store.raw_tree(at.0);
            match before.get(at) {
                Some(value) => tree.insert(&at.1, value.as_slice()).unwrap(),
                None => tree.remove(&at.1).unwrap(),
            };
        }
        for ((tree, key), value) in &writes[..cut] {
            let tree = store.raw_tree(*tree);
            match value {
                Some(value) => tree.insert(key, value.as_slice()).unwrap(),
                None => tree.remove(key).unwrap(),
            };
        }
        store.close().unwrap();
        drop(store);
        std::fs::write(
            dir.path().join("commit-epoch"),
            record::encode_epoch(durable),
        )
        .unwrap();
        store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert!(admission_rows(&store) == before, "cut after {cut} writes");
    }
    // Nothing lost: the turn admits again, keys and all, and packs as it
    // did.
    store.write(turn).await.unwrap();
    assert!(admission_rows(&store) == after);
    let found = store.spans_by_keys("s", &["turn/33".into()]).unwrap();
    assert_eq!(found[0].as_ref().map(|s| s.span.id), Some(33));

    // Spans 34..=63 pack blocks 1 and 2, the second holding the turn's
    // first span: a transaction.
    let next = session.next_spans(30);
    store.write(session.admit(next)).await.unwrap();
    assert!(layout(&store, "s").starts_with(&[(0, true), (16, true), (32, true), (48, false)]));
    assert_eq!(record_epoch(&store), 0, "applied as a transaction");
    assert_eq!(live(&store).len(), 63);
}
