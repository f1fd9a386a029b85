//! The search index: written with the spans, read under one snapshot,
//! kept across reopening, rebuilt on import, removed with its session.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use ctxbroker_core::search::{self, SpanFilter, Standing};
use ctxbroker_core::span::{Role, SpanClass};
use ctxbroker_store::{SearchQuery, SpanState, Store, StoreOptions, WriteOp};
use support::{Session, constraint, span, tempdir};

fn query(text: &str) -> SearchQuery {
    SearchQuery {
        terms: search::query_terms(text),
        filter: SpanFilter::default(),
        offset: 0,
        limit: 10,
    }
}

fn ids(store: &Store, session: &str, q: &SearchQuery) -> Vec<u64> {
    store
        .search(session, q)
        .unwrap()
        .hits
        .iter()
        .map(|h| h.stored.span.id)
        .collect()
}

/// A session "s" with five spans, then spans 1 and 2 evicted into a
/// summary (id 6) while span 7 is admitted.
async fn populated(store: &Store) -> Session {
    let mut s = Session::new("s");
    store.write(s.create()).await.unwrap();
    let texts = [
        "error[E0308]: mismatched types in src/store/writer.rs",
        "never write to the prod namespace",
        "the tests pass in src/lib.rs",
        "writer thread batches commits",
        "unrelated chatter about lunch",
    ];
    let mut spans: Vec<_> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| span(i as u64 + 1, t))
        .collect();
    spans[1] = constraint(2, texts[1]);
    store.write(s.admit(spans)).await.unwrap();
    let (op, _) = s.admit_compacting(vec![1, 2], 1, vec![], vec![span(0, "after the compaction")]);
    store.write(op).await.unwrap();
    s
}

#[tokio::test]
async fn evicted_spans_are_found_by_their_terms_and_ranked() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    populated(&store).await;

    let page = store.search("s", &query("E0308")).unwrap();
    assert_eq!(page.matched, 1);
    let hit = &page.hits[0];
    assert_eq!(hit.stored.span.id, 1);
    assert!(matches!(
        hit.stored.state,
        SpanState::Archived { by_seq: 1 }
    ));
    assert!(hit.score > 0.0);

    // "writer" is in spans 1 and 4; the path's rarer parts put span 1 first.
    assert_eq!(ids(&store, "s", &query("src/store/writer.rs")), [1, 3, 4]);
    // The summary (6) and the span admitted with it (7) are indexed too.
    assert_eq!(ids(&store, "s", &query("compaction")), [7]);
    assert_eq!(ids(&store, "s", &query("summary")), [6]);
    assert!(ids(&store, "s", &query("nothing-like-this")).is_empty());
    assert!(ids(&store, "s", &query("")).is_empty());
}

#[tokio::test]
async fn filters_and_pages_cut_the_ranked_hits() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    populated(&store).await;
    let all = ids(&store, "s", &query("src writer prod lunch"));
    assert_eq!(all.len(), 5);

    let only = |filter: SpanFilter| {
        ids(
            &store,
            "s",
            &SearchQuery {
                filter,
                ..query("src writer prod lunch")
            },
        )
    };
    assert_eq!(
        only(SpanFilter {
            roles: vec![Role::User],
            ..Default::default()
        }),
        [2]
    );
    assert_eq!(
        only(SpanFilter {
            classes: vec![SpanClass::Constraint],
            ..Default::default()
        }),
        [2]
    );
    assert_eq!(
        only(SpanFilter {
            standing: Some(Standing::Archived),
            ..Default::default()
        })
        .len(),
        2
    );
    // Span turns equal their ids in these builders.
    let mut mid = only(SpanFilter {
        from_turn: Some(3),
        to_turn: Some(4),
        ..Default::default()
    });
    mid.sort();
    assert_eq!(mid, [3, 4]);

    // Pages of two walk the same order, and say when more follow.
    let mut walked = Vec::new();
    let mut offset = 0;
    loop {
        let page = store
            .search(
                "s",
                &SearchQuery {
                    offset,
                    limit: 2,
                    ..query("src writer prod lunch")
                },
            )
            .unwrap();
        walked.extend(page.hits.iter().map(|h| h.stored.span.id));
        offset += page.hits.len();
        if !page.more {
            break;
        }
    }
    assert_eq!(walked, all);
}

#[tokio::test]
async fn listing_merges_live_and_archived_spans_in_id_order() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    populated(&store).await;
    let list = |after, limit| {
        let l = store
            .list_spans("s", &SpanFilter::default(), after, limit)
            .unwrap();
        let ids: Vec<u64> = l.spans.iter().map(|s| s.span.id).collect();
        (ids, l.more)
    };
    assert_eq!(list(None, 10), (vec![1, 2, 3, 4, 5, 6, 7], false));
    assert_eq!(list(None, 3), (vec![1, 2, 3], true));
    assert_eq!(list(Some(3), 3), (vec![4, 5, 6], true));
    assert_eq!(list(Some(6), 3), (vec![7], false));
    let archived = store
        .list_spans(
            "s",
            &SpanFilter {
                standing: Some(Standing::Archived),
                ..Default::default()
            },
            None,
            10,
        )
        .unwrap();
    assert_eq!(archived.spans.len(), 2);
    assert!(
        archived
            .spans
            .iter()
            .all(|s| matches!(s.state, SpanState::Archived { .. }))
    );
}

#[tokio::test]
async fn the_index_survives_reopening_and_goes_with_its_session() {
    let dir = tempdir();
    {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        populated(&store).await;
        store.close().unwrap();
    }
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(ids(&store, "s", &query("E0308")), [1]);

    store
        .write(WriteOp::DeleteSession { id: "s".into() })
        .await
        .unwrap();
    // A new session of the same id starts with an empty index.
    let s = Session::new("s");
    store.write(s.create()).await.unwrap();
    assert!(ids(&store, "s", &query("E0308")).is_empty());
}

#[tokio::test]
async fn an_imported_session_is_searchable() {
    let dir = tempdir();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut s = populated(&store).await;
    // The builders do not account for evicted tokens; an export checks
    // the record against its spans, so set the record right first.
    let live = store.live_spans("s").unwrap();
    let expected_revision = s.record.revision;
    s.record.revision += 1;
    s.record.live_spans = live.len() as u64;
    s.record.live_tokens = live.iter().map(|x| u64::from(x.tokens)).sum();
    s.record.pinned_spans = 0;
    s.record.pinned_tokens = 0;
    store
        .write(WriteOp::UpdateSession {
            expected_revision,
            record: s.record.clone(),
        })
        .await
        .unwrap();
    let export = store.export_session("s").unwrap();
    let other = tempdir();
    let target = Store::open(other.path(), StoreOptions::default()).unwrap();
    let import = match ctxbroker_store::SessionImport::open(
        export.format_version,
        &export.session_id,
        &export.body,
        export.checksum,
    ) {
        Ok(import) => import,
        Err(err) => panic!("the export does not check: {err:?}"),
    };
    target.import_session(import).await.unwrap();
    assert_eq!(
        ids(&target, "s", &query("src writer prod lunch")),
        ids(&store, "s", &query("src writer prod lunch"))
    );
}

#[tokio::test]
async fn a_session_too_large_to_cache_is_searched_the_same() {
    let cached_dir = tempdir();
    let cached = Store::open(cached_dir.path(), StoreOptions::default()).unwrap();
    populated(&cached).await;
    let bare_dir = tempdir();
    let bare = Store::open(
        bare_dir.path(),
        StoreOptions {
            search_cache_bytes: 0,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    populated(&bare).await;
    for text in [
        "E0308",
        "src/store/writer.rs",
        "summary",
        "src writer prod lunch",
    ] {
        let want = cached.search("s", &query(text)).unwrap();
        // Twice: the first search finds the session too large, the second
        // goes straight to the term vectors.
        for _ in 0..2 {
            let got = bare.search("s", &query(text)).unwrap();
            assert_eq!(got, want, "{text}");
        }
    }
    // Spans stored after a cached search are found by the next one.
    let mut s = Session::new("t");
    cached.write(s.create()).await.unwrap();
    cached
        .write(s.admit(vec![span(1, "first words")]))
        .await
        .unwrap();
    assert_eq!(ids(&cached, "t", &query("words")), [1]);
    cached
        .write(s.admit(vec![span(2, "more words")]))
        .await
        .unwrap();
    assert_eq!(ids(&cached, "t", &query("words")), [2, 1]);
}

/// A session's postings, once read, follow what the writer does next: a
/// span admitted and evicted before any search saw it, a summary at the
/// position of what it replaced, a span admitted after; and they answer
/// as postings read from scratch (after reopening) do.
#[tokio::test]
async fn postings_read_before_a_compaction_follow_it() {
    let dir = tempdir();
    let queries = ["writer", "summary", "epsilon", "alpha", "delta"];
    let answers = {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut s = Session::new("s");
        store.write(s.create()).await.unwrap();
        let first = ["alpha writer", "beta writer", "gamma"];
        let spans = (first.iter().enumerate())
            .map(|(i, t)| span(i as u64 + 1, t))
            .collect();
        store.write(s.admit(spans)).await.unwrap();
        assert_eq!(ids(&store, "s", &query("writer")).len(), 2);
        store
            .write(s.admit(vec![span(4, "delta writer")]))
            .await
            .unwrap();
        let (op, summary) =
            s.admit_compacting(vec![1, 4], 1, vec![], vec![span(0, "epsilon writer")]);
        assert_eq!((summary.id, summary.position), (5, 1));
        store.write(op).await.unwrap();
        let mut writer = ids(&store, "s", &query("writer"));
        writer.sort();
        assert_eq!(writer, [1, 2, 4, 6]);
        assert_eq!(ids(&store, "s", &query("summary")), [5]);
        let answers: Vec<_> = queries.map(|q| ids(&store, "s", &query(q))).into();
        store.close().unwrap();
        answers
    };
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let fresh: Vec<_> = queries.map(|q| ids(&store, "s", &query(q))).into();
    assert_eq!(fresh, answers);
}
