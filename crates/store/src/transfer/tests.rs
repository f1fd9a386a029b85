//! A session moved between two stores comes out whole; a snapshot that is
//! damaged, altered or inconsistent is refused by part, and nothing is
//! written.

use std::path::Path;

use ctxbroker_core::marker::Outcome;
use ctxbroker_core::span::SpanClass;
use ctxbroker_core::{Span, SpanId};
use prost::Message;

use super::{BodyRecord, SessionImport, SnapshotBody, SnapshotPart, snapshot_checksum};
use crate::keys::{self, TreeId};
use crate::tests::support::{change, constraint, marker, record, span, write};
use crate::{Change, SessionExport, SessionRecord, Store, StoreError, StoreOptions, WriteOp};

/// Sets a record's live totals from its live spans, as the policy does.
fn with_totals(mut record: SessionRecord, live: &[&Span]) -> SessionRecord {
    record.live_spans = live.len() as u64;
    record.live_tokens = live.iter().map(|s| u64::from(s.tokens)).sum();
    let pinned: Vec<_> = live.iter().filter(|s| s.is_pinned()).collect();
    record.pinned_spans = pinned.len() as u64;
    record.pinned_tokens = pinned.iter().map(|s| u64::from(s.tokens)).sum();
    record
}

/// A session with a constraint, idempotency keys, and a compaction that
/// archived two spans behind a summary: spans 1 (constraint), 4 (summary
/// at position 2) and 5 live; 2 and 3 archived; keys k1..k3.
async fn populate(store: &Store, id: &str) {
    let mut r = record(id);
    store
        .write(WriteOp::CreateSession { record: r.clone() })
        .await
        .unwrap();
    let (c1, s2, s3) = (
        constraint(1, "never write to the prod namespace"),
        span(2, "alpha: the rollout of the overlay"),
        span(3, "beta: the replica count is 3"),
    );
    r.revision = 2;
    r.next_span_id = 4;
    r.turns = 1;
    r = with_totals(r, &[&c1, &s2, &s3]);
    store
        .write(write(
            Change {
                append: vec![c1.clone(), s2, s3],
                ..change(1, r.clone())
            },
            vec![("k1".into(), 1), ("k2".into(), 2), ("k3".into(), 3)],
        ))
        .await
        .unwrap();
    let mut summary = span(4, "summary of 2 and 3: /etc/hosts");
    summary.position = 2;
    summary.classification.class = SpanClass::Summary;
    summary.generation = 1;
    let s5 = span(5, "gamma: the probe port is 8080");
    let expected = r.revision;
    r.revision = 3;
    r.next_span_id = 6;
    r.turns = 2;
    r.marker_count = 1;
    r.compactions = 1;
    r.archived_spans = 2;
    r.last_compaction_turn = 2;
    r = with_totals(r, &[&c1, &summary, &s5]);
    let mut m = marker(id, 1, Outcome::Committed);
    m.evicted = vec![2, 3];
    m.summary_span_id = Some(4);
    store
        .write(write(
            Change {
                append: vec![s5],
                evict: vec![2, 3],
                summary: Some(summary),
                marker: Some(m),
                ..change(expected, r)
            },
            vec![],
        ))
        .await
        .unwrap();
}

fn open(dir: &Path) -> Store {
    Store::open(dir, StoreOptions::default()).unwrap()
}

/// Every raw record of a session, in every keyspace, pins included.
fn raw(store: &Store, id: &str) -> Vec<(TreeId, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    if let Some(v) = store.raw_tree(TreeId::Sessions).get(id).unwrap() {
        // Sealed again without the commit epoch it may carry: that is the
        // store's bookkeeping, not the session's.
        let key = id.as_bytes();
        let resealed =
            crate::record::encode_session(key, &crate::record::decode_session(key, &v).unwrap());
        out.push((TreeId::Sessions, key.to_vec(), resealed));
    }
    let prefix = keys::session_prefix(id);
    for tree in [TreeId::Spans, TreeId::Pins, TreeId::Archive, TreeId::Keys] {
        for entry in store.raw_tree(tree).scan_prefix(&prefix) {
            let (k, v) = entry.unwrap();
            out.push((tree, k.to_vec(), v.to_vec()));
        }
    }
    out
}

fn import(export: &SessionExport) -> Result<SessionImport, super::InvalidSnapshot> {
    SessionImport::open(
        export.format_version,
        &export.session_id,
        &export.body,
        export.checksum,
    )
}

#[tokio::test]
async fn a_session_moves_whole_and_stays_after_a_restart() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    populate(&a, "moved").await;
    populate(&a, "stays").await;
    let exported = a.export_session("moved").unwrap();
    assert_eq!(exported.archived_spans, 2);
    assert_eq!(exported.idempotency_keys, 3);
    assert_eq!(exported.record.revision, 3);

    let b = open(b_dir.path());
    let checked = import(&exported).unwrap();
    assert_eq!(
        checked
            .live_spans()
            .iter()
            .map(|s| s.id)
            .collect::<Vec<_>>(),
        [1, 4, 5]
    );
    b.import_session(checked).await.unwrap();

    let same = |b: &Store| {
        assert_eq!(raw(b, "moved"), raw(&a, "moved"), "every record, pins too");
        assert_eq!(b.session("moved").unwrap(), a.session("moved").unwrap());
        assert_eq!(
            b.live_spans("moved").unwrap(),
            a.live_spans("moved").unwrap()
        );
        assert_eq!(b.pins("moved").unwrap(), a.pins("moved").unwrap());
        for id in 1..=6 {
            assert_eq!(
                b.span("moved", id).unwrap(),
                a.span("moved", id).unwrap(),
                "span {id}"
            );
        }
        let asked: Vec<String> = ["k1", "k2", "k3", "k4"].map(String::from).to_vec();
        assert_eq!(
            b.spans_by_keys("moved", &asked).unwrap(),
            a.spans_by_keys("moved", &asked).unwrap()
        );
        assert_eq!(b.session_count(), 1);
        assert_eq!(b.marker_bounds().next, 1, "an import writes no marker");
        assert!(
            b.session("stays").unwrap().is_none(),
            "only the session asked for"
        );
    };
    same(&b);
    // What B exports is what A exported, byte for byte.
    assert_eq!(b.export_session("moved").unwrap().body, exported.body);

    b.close().unwrap();
    drop(b);
    let b = open(b_dir.path());
    same(&b);

    // The moved session takes writes planned as on the original.
    let next = with_totals(
        SessionRecord {
            revision: 4,
            next_span_id: 7,
            turns: 3,
            ..b.session("moved").unwrap().unwrap()
        },
        &[
            &a.span("moved", 1).unwrap().unwrap().span,
            &a.span("moved", 4).unwrap().unwrap().span,
            &a.span("moved", 5).unwrap().unwrap().span,
            &span(6, "delta"),
        ],
    );
    for store in [&a, &b] {
        store
            .write(write(
                Change {
                    append: vec![span(6, "delta")],
                    ..change(3, next.clone())
                },
                vec![("k4".into(), 6)],
            ))
            .await
            .unwrap();
    }
    assert_eq!(raw(&b, "moved"), raw(&a, "moved"));
}

#[tokio::test]
async fn an_import_over_a_taken_id_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    populate(&store, "moved").await;
    let exported = store.export_session("moved").unwrap();
    let before = raw(&store, "moved");
    let refused = store.import_session(import(&exported).unwrap()).await;
    assert_eq!(
        refused,
        Err(StoreError::SessionExists { id: "moved".into() })
    );
    assert_eq!(raw(&store, "moved"), before);
    assert_eq!(store.session_count(), 1);

    // Deleted, the id is free again and the import restores it.
    store
        .write(WriteOp::DeleteSession { id: "moved".into() })
        .await
        .unwrap();
    store
        .import_session(import(&exported).unwrap())
        .await
        .unwrap();
    assert_eq!(raw(&store, "moved"), before);
}

/// The export with its body rewritten by `change` and the checksum
/// recomputed: altered on purpose, but with a valid checksum.
fn altered(export: &SessionExport, change: impl FnOnce(&mut Vec<BodyRecord>)) -> SessionExport {
    let mut body = SnapshotBody::decode(export.body.as_slice()).unwrap();
    change(&mut body.records);
    let body = body.encode_to_vec();
    SessionExport {
        checksum: snapshot_checksum(export.format_version, &export.session_id, &body),
        body,
        ..export.clone()
    }
}

fn position(records: &[BodyRecord], tree: u32, key: &[u8]) -> usize {
    records
        .iter()
        .position(|r| r.tree == tree && r.key == key)
        .expect("the record is in the body")
}

#[tokio::test]
async fn damaged_altered_or_inconsistent_snapshots_are_refused_by_part() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    populate(&a, "moved").await;
    let good = a.export_session("moved").unwrap();
    let session_key = b"moved".to_vec();
    let span5 = keys::session_number_key("moved", 5);
    let rewrite_record = |change: fn(&mut SessionRecord)| {
        altered(&good, move |records| {
            let i = position(records, 1, b"moved");
            let mut r = crate::record::decode_session(b"moved", &records[i].value).unwrap();
            change(&mut r);
            records[i].value = crate::record::encode_session(b"moved", &r);
        })
    };

    let mut flipped = good.clone();
    let at = flipped.body.len() / 2;
    flipped.body[at] ^= 0x01;
    let cases: Vec<(&str, SessionExport, SnapshotPart, &str)> = vec![
        (
            "a newer format",
            SessionExport {
                format_version: 2,
                ..good.clone()
            },
            SnapshotPart::FormatVersion,
            "reads version 1",
        ),
        (
            "a wrong checksum",
            SessionExport {
                checksum: good.checksum ^ 1,
                ..good.clone()
            },
            SnapshotPart::Checksum,
            "damaged or altered",
        ),
        (
            "one flipped bit",
            flipped,
            SnapshotPart::Checksum,
            "damaged or altered",
        ),
        (
            "another session id",
            SessionExport {
                session_id: "elsewhere".into(),
                ..good.clone()
            },
            SnapshotPart::Checksum,
            "damaged or altered",
        ),
        (
            "an id the store cannot hold",
            {
                let id = "x".repeat(300);
                SessionExport {
                    checksum: snapshot_checksum(1, &id, &good.body),
                    session_id: id,
                    ..good.clone()
                }
            },
            SnapshotPart::SessionId,
            "got 300",
        ),
        (
            "a truncated body",
            {
                let body = good.body[..good.body.len() - 3].to_vec();
                SessionExport {
                    checksum: snapshot_checksum(1, "moved", &body),
                    body,
                    ..good.clone()
                }
            },
            SnapshotPart::Body,
            "does not decode",
        ),
        (
            "a damaged record",
            altered(&good, |records| {
                let i = position(records, 2, &span5);
                let last = records[i].value.len() - 1;
                records[i].value[last] ^= 0x20;
            }),
            SnapshotPart::Body,
            "(spans \"moved\"/position 5): checksum mismatch",
        ),
        (
            "totals that disagree with the spans",
            rewrite_record(|r| r.live_tokens += 1),
            SnapshotPart::Body,
            "live_tokens",
        ),
        (
            "a span past the next span id",
            rewrite_record(|r| r.next_span_id = 5),
            SnapshotPart::Body,
            "live span 5 is not among the ids the session gave out (1 to 4)",
        ),
        (
            "no session record",
            altered(&good, |records| {
                let i = position(records, 1, &session_key);
                records.remove(i);
            }),
            SnapshotPart::Body,
            "holds no session record",
        ),
        (
            "a key naming a span it does not hold",
            altered(&good, |records| {
                let key = keys::session_text_key("moved", "k9");
                let value = crate::record::encode_key(&key, 99);
                records.push(BodyRecord {
                    tree: 4,
                    key,
                    value,
                });
            }),
            SnapshotPart::Body,
            "names span 99",
        ),
        (
            "a record of another session",
            altered(&good, |records| {
                let i = position(records, 2, &span5);
                records[i].key = keys::session_number_key("other", 5);
            }),
            SnapshotPart::Body,
            "does not belong to session \"moved\"",
        ),
        (
            "a record twice",
            altered(&good, |records| {
                let i = position(records, 2, &span5);
                let copy = records[i].clone();
                records.push(copy);
            }),
            SnapshotPart::Body,
            "appears twice",
        ),
        (
            "an archived span that is also live",
            altered(&good, |records| {
                let i = position(records, 2, &span5);
                let mut archived = crate::record::decode_span(&span5, &records[i].value).unwrap();
                archived.id = 1;
                let key = keys::session_number_key("moved", 1);
                let value = crate::record::encode_archived(&key, &archived, 1, Vec::new());
                records.push(BodyRecord {
                    tree: 3,
                    key,
                    value,
                });
            }),
            SnapshotPart::Body,
            "span 1 appears more than once",
        ),
        (
            "a live span at or beyond the next span id",
            altered(&good, |records| {
                let i = position(records, 2, &span5);
                let mut moved = crate::record::decode_span(&span5, &records[i].value).unwrap();
                moved.position = 1_000;
                let key = keys::session_number_key("moved", 1_000);
                records[i].value =
                    crate::record::encode_span(&key, &moved, crate::record::span_terms(&moved));
                records[i].key = key;
            }),
            SnapshotPart::Body,
            "live span 5 stands at position 1000, not below the session's next span id",
        ),
        (
            "an unknown keyspace",
            altered(&good, |records| {
                records.push(BodyRecord {
                    tree: 9,
                    key: b"moved".to_vec(),
                    value: vec![1],
                });
            }),
            SnapshotPart::Body,
            "unknown keyspace code 9",
        ),
    ];
    let b = open(b_dir.path());
    for (what, export, part, says) in cases {
        match import(&export) {
            Err(err) => {
                assert_eq!(err.part, part, "{what}: {err}");
                assert!(err.detail.contains(says), "{what}: {err}");
            }
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    assert!(raw(&b, "moved").is_empty(), "nothing was written");
    assert_eq!(b.session_count(), 0);
    // The untouched snapshot still goes in.
    b.import_session(import(&good).unwrap()).await.unwrap();
    assert_eq!(raw(&b, "moved"), raw(&a, "moved"));
}

#[tokio::test]
async fn an_export_refuses_a_damaged_record_and_an_unknown_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    populate(&store, "moved").await;
    assert_eq!(
        store.export_session("nobody").unwrap_err(),
        StoreError::SessionNotFound {
            id: "nobody".into()
        }
    );
    let key = keys::session_number_key("moved", 2);
    let tree = store.raw_tree(TreeId::Archive);
    let mut value = tree.get(&key).unwrap().unwrap().to_vec();
    let last = value.len() - 1;
    value[last] ^= 0x40;
    tree.insert(&key, value).unwrap();
    match store.export_session("moved") {
        Err(StoreError::Corrupt { tree, key, .. }) => {
            assert_eq!(tree, "archive");
            assert_eq!(key, "\"moved\"/span 2");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Ids a live span may take: the writer refuses anything else, and so does
/// the import.
#[test]
fn ids_outside_the_given_range_are_named() {
    let ids: [SpanId; 2] = [0, 10];
    for id in ids {
        let mut r = record("s");
        r.next_span_id = 10;
        let s = span(id, "x");
        let r = with_totals(r, &[&s]);
        let session_key = keys::session_key("s");
        let span_key = keys::session_number_key("s", s.position);
        let body = SnapshotBody {
            records: vec![
                BodyRecord {
                    tree: 1,
                    value: crate::record::encode_session(&session_key, &r),
                    key: session_key,
                },
                BodyRecord {
                    tree: 2,
                    value: crate::record::encode_span(&span_key, &s, crate::record::span_terms(&s)),
                    key: span_key,
                },
            ],
        }
        .encode_to_vec();
        let err = SessionImport::open(1, "s", &body, snapshot_checksum(1, "s", &body)).unwrap_err();
        assert_eq!(err.part, SnapshotPart::Body);
        assert!(
            err.detail.contains(&format!("live span {id} is not among")),
            "{err}"
        );
    }
}
