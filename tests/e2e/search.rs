//! SearchSpans and ListSpans: an agent that reads "anchor dropped" in a
//! marker finds the turn that held it, by the anchor, however many
//! summaries have been written over it since, and after a restart.

use ctxbroker_proto::v1 as pb;
use pb::Role;
use pb::context_broker_client::ContextBrokerClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

type Client = ContextBrokerClient<Channel>;

/// The turn an agent will need back: a compiler error with a path and a
/// code, in a tool result.
const ANCHORED: &str = "error[E0599]: no method named `flush_pending` found for struct `Ingest` in the current scope\n  --> crates/ingest/src/parser_v2.rs:118:14\n   |\n118 |         self.flush_pending()?;\n   |              ^^^^^^^^^^^^^ method not found in `Ingest`";

async fn search(
    client: &mut Client,
    id: &str,
    query: &str,
    filter: Option<pb::SpanFilter>,
) -> pb::SearchSpansResponse {
    client
        .search_spans(pb::SearchSpansRequest {
            session_id: id.into(),
            query: query.into(),
            filter,
            ..Default::default()
        })
        .await
        .expect("SearchSpans succeeds")
        .into_inner()
}

async fn text_of(client: &mut Client, id: &str, span_id: u64) -> pb::Span {
    client
        .get_span(pb::GetSpanRequest {
            session_id: id.into(),
            span_id,
        })
        .await
        .expect("GetSpan succeeds")
        .into_inner()
        .span
        .expect("a span")
}

/// Finds the anchored turn by its path alone, as an agent would, and
/// checks that GetSpan gives back exactly what was admitted.
async fn found_by_anchor(client: &mut Client, id: &str, admitted_id: u64) {
    for anchor in ["crates/ingest/src/parser_v2.rs", "E0599", "flush_pending"] {
        // Among tool output: the original, not a summary that quotes it.
        let tool_only = pb::SpanFilter {
            roles: vec![Role::Tool as i32],
            ..Default::default()
        };
        let reply = search(client, id, anchor, Some(tool_only)).await;
        let Some(top) = reply.hits.first() else {
            panic!("searching {anchor:?} finds nothing");
        };
        assert_eq!(
            top.span_id, admitted_id,
            "searching {anchor:?}: {:?}",
            reply.hits
        );
        assert_eq!(top.state(), pb::SpanState::Archived);
        assert!(top.archived_by_seq > 0);
        assert!(top.score > 0.0);
        assert!(
            top.snippet.to_lowercase().contains(&anchor.to_lowercase()),
            "snippet {:?} lacks {anchor:?}",
            top.snippet
        );
        let span = text_of(client, id, top.span_id).await;
        assert_eq!(span.text, ANCHORED);
        // Unfiltered, it is still on the first page.
        let all = search(client, id, anchor, None).await;
        assert!(
            all.hits.iter().any(|h| h.span_id == admitted_id),
            "unfiltered search for {anchor:?}: {:?}",
            all.hits
        );
    }
}

#[tokio::test]
async fn an_evicted_turn_is_found_by_its_anchor_after_three_summary_generations_and_a_restart() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let id = "anchors";
    create(&mut client, id, window(3_000)).await;
    let first = admit(&mut client, id, vec![span(Role::Tool, ANCHORED)])
        .await
        .expect("admitted");
    let admitted_id = first.spans[0].span_id;

    // Prose on other topics until summaries of summaries reach the third
    // generation.
    let mut generation = 0;
    let mut turns = 0;
    while generation < 3 {
        turns += 1;
        assert!(turns <= 400, "no third summary generation after 400 turns");
        let text = prose(turns, &["rollout", "canary", "replica"], 160);
        let role = if turns % 2 == 0 {
            Role::Assistant
        } else {
            Role::Tool
        };
        admit(&mut client, id, vec![span(role, &text)])
            .await
            .expect("admitted");
        let ctx = context(&mut client, id).await;
        generation = ctx.spans.iter().map(|s| s.generation).max().unwrap_or(0);
    }
    let ctx = context(&mut client, id).await;
    assert!(
        ctx.spans.iter().all(|s| s.span_id != admitted_id),
        "still live"
    );
    found_by_anchor(&mut client, id, admitted_id).await;

    // Listing by the turn range finds it too, archived, in id order.
    let listed = client
        .list_spans(pb::ListSpansRequest {
            session_id: id.into(),
            filter: Some(pb::SpanFilter {
                from_turn: Some(1),
                to_turn: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("ListSpans succeeds")
        .into_inner();
    assert_eq!(
        listed.spans.iter().map(|s| s.span_id).collect::<Vec<_>>(),
        [admitted_id]
    );
    assert_eq!(listed.spans[0].state(), pb::SpanState::Archived);

    daemon.restart().await;
    let mut client = daemon.client().await;
    found_by_anchor(&mut client, id, admitted_id).await;
}

#[tokio::test]
async fn listing_pages_through_every_span_once() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let id = "pages";
    create(&mut client, id, window(2_000)).await;
    for n in 0..40 {
        let text = prose(n, &["ledger", "invoice"], 60);
        admit(&mut client, id, vec![span(Role::Assistant, &text)])
            .await
            .expect("admitted");
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_spans(pb::ListSpansRequest {
                session_id: id.into(),
                page_size: 7,
                page_token: token.clone(),
                snippet_chars: 20,
                ..Default::default()
            })
            .await
            .expect("ListSpans succeeds")
            .into_inner();
        assert!(page.spans.len() <= 7);
        assert!(page.spans.iter().all(|s| s.snippet.chars().count() <= 21));
        seen.extend(page.spans.iter().map(|s| s.span_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(seen, sorted, "each span once, in id order");
    // Every admitted span, live or archived, and the summaries written.
    let record = session(&mut client, id).await;
    assert!(record.archived_spans > 0, "nothing was compacted");
    let live = u64::from(record.totals.expect("totals").live_spans);
    assert_eq!(seen.len() as u64, live + record.archived_spans);
}

#[tokio::test]
async fn bad_searches_name_the_field_and_unknown_sessions_are_not_found() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "s", window(10_000)).await;
    let refused = |query: &str, page_token: &str| pb::SearchSpansRequest {
        session_id: "s".into(),
        query: query.into(),
        page_token: page_token.into(),
        ..Default::default()
    };
    for (request, field) in [
        (refused("", ""), "query"),
        (refused(&"x".repeat(5_000), ""), "query"),
        (refused("writer", "not-a-token"), "page_token"),
    ] {
        let status = client.search_spans(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    let status = client
        .search_spans(pb::SearchSpansRequest {
            session_id: "nobody".into(),
            query: "writer".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::NotFound);
    let status = client
        .list_spans(pb::ListSpansRequest {
            session_id: "s".into(),
            page_size: 1_001,
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("page_size"),
        "{}",
        status.message()
    );
}
