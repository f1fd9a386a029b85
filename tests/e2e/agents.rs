//! What agent frameworks need of the contract: a span's attributes kept
//! through restarts and transfers, tool calls and their results evicted
//! together, taking back the last item or turn, a reset, and summaries
//! presented as a user message.

use std::collections::{BTreeSet, HashMap};

use ctxbroker_proto::v1 as pb;
use pb::Role;
use pb::context_broker_client::ContextBrokerClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

type Client = ContextBrokerClient<Channel>;

const CONSTRAINT: &str = "Never write to the `prod` namespace; stage only.";

fn call(id: &str, text: &str) -> pb::SpanInput {
    pb::SpanInput {
        tool_call_id: id.into(),
        tool_name: "kubectl".into(),
        ..span(Role::Assistant, text)
    }
}

fn result(id: &str, text: &str) -> pb::SpanInput {
    pb::SpanInput {
        tool_call_id: id.into(),
        tool_name: "kubectl".into(),
        ..span(Role::Tool, text)
    }
}

fn output(i: usize) -> String {
    format!(
        "deployment.apps/web-{i} configured in namespace staging; rollout {i} waiting: 2 of 3 replicas ready, probe /healthz on port 8080 returned 503 after 30s; image registry.local/web:1.{i} pulled"
    )
}

async fn retract(
    client: &mut Client,
    id: &str,
    spans: u32,
    expected_revision: Option<u64>,
) -> Result<pb::RetractLastTurnResponse, tonic::Status> {
    client
        .retract_last_turn(pb::RetractLastTurnRequest {
            session_id: id.into(),
            spans,
            expected_revision,
        })
        .await
        .map(|r| r.into_inner())
}

fn ids(spans: &[pb::Span]) -> Vec<u64> {
    spans.iter().map(|s| s.span_id).collect()
}

/// The calls of `spans` without their results and the results without
/// their calls, by tool call id.
fn orphans(spans: &[pb::Span]) -> Vec<String> {
    let mut roles: HashMap<&str, BTreeSet<i32>> = HashMap::new();
    for s in spans.iter().filter(|s| !s.tool_call_id.is_empty()) {
        roles.entry(&s.tool_call_id).or_default().insert(s.role);
    }
    let mut out: Vec<String> = roles
        .into_iter()
        .filter(|(_, r)| r.len() != 2)
        .map(|(id, _)| id.to_owned())
        .collect();
    out.sort();
    out
}

/// A span's tool call id, tool name and metadata come back from Admit,
/// GetContext and GetSpan, after a restart, and through an export and
/// import.
#[tokio::test]
async fn attributes_are_kept_through_a_restart_and_a_transfer() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "attrs", defaults(10_000)).await;
    let mut tagged = call("call_7", "kubectl get pods -n staging");
    tagged.metadata = [
        ("langchain.id".to_owned(), "run-1/msg-3".to_owned()),
        (
            "openai.item".to_owned(),
            r#"{"type":"function_call"}"#.to_owned(),
        ),
    ]
    .into();
    let admitted = admit(
        &mut client,
        "attrs",
        vec![tagged.clone(), span(Role::User, "go on")],
    )
    .await
    .unwrap();
    let check = |s: &pb::Span| {
        assert_eq!(s.tool_call_id, "call_7");
        assert_eq!(s.tool_name, "kubectl");
        assert_eq!(s.metadata, tagged.metadata);
    };
    check(&admitted.spans[0]);
    assert!(admitted.spans[1].tool_call_id.is_empty() && admitted.spans[1].metadata.is_empty());
    daemon.restart().await;
    let mut client = daemon.client().await;
    check(&context(&mut client, "attrs").await.spans[0]);

    let snapshot = client
        .export_session(pb::ExportSessionRequest {
            session_id: "attrs".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot;
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "attrs".into(),
        })
        .await
        .unwrap();
    client
        .import_session(pb::ImportSessionRequest { snapshot })
        .await
        .unwrap();
    let span = client
        .get_span(pb::GetSpanRequest {
            session_id: "attrs".into(),
            span_id: admitted.spans[0].span_id,
        })
        .await
        .unwrap()
        .into_inner()
        .span
        .unwrap();
    check(&span);
}

/// Bad attributes and bad presentation settings are refused naming the
/// field and the limit, and change nothing.
#[tokio::test]
async fn bad_attributes_and_settings_name_the_field() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "bad", defaults(10_000)).await;
    let cases: Vec<(pb::SpanInput, &str, &str)> = vec![
        (
            call(&"x".repeat(129), "c"),
            "spans[0].tool_call_id",
            "128 bytes",
        ),
        (
            pb::SpanInput {
                tool_name: "a\nb".into(),
                ..span(Role::Tool, "t")
            },
            "spans[0].tool_name",
            "control characters",
        ),
        (
            pb::SpanInput {
                metadata: [("has space".to_owned(), "v".to_owned())].into(),
                ..span(Role::Tool, "t")
            },
            "spans[0].metadata[\"has space\"]",
            "[A-Za-z0-9._:/-]",
        ),
        (
            pb::SpanInput {
                metadata: (0..33).map(|i| (format!("k{i}"), String::new())).collect(),
                ..span(Role::Tool, "t")
            },
            "spans[0].metadata",
            "at most 32 entries",
        ),
        (
            pb::SpanInput {
                metadata: [("k".to_owned(), "v".repeat(70_000))].into(),
                ..span(Role::Tool, "t")
            },
            "spans[0].metadata",
            "65536 bytes",
        ),
    ];
    for (input, field, limit) in cases {
        let status = admit(&mut client, "bad", vec![input]).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
        assert!(
            status.message().contains(limit),
            "{limit}: {}",
            status.message()
        );
    }
    assert_eq!(session(&mut client, "bad").await.turns, 0);

    let status = client
        .update_session(pb::UpdateSessionRequest {
            session_id: "bad".into(),
            config: Some(pb::SessionConfig {
                summary_prefix: Some(" ".into()),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("config.summary_prefix"),
        "{}",
        status.message()
    );
    let status = retract(&mut client, "bad", 100_000, None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("max_spans_per_turn"),
        "{}",
        status.message()
    );
    assert_eq!(session(&mut client, "bad").await.revision, 1);
}

/// Through many compactions of a small window, no tool result stands in
/// the context without its call, nor a call without its result, whether
/// they came in one turn or the result a turn later; the constraint stays.
#[tokio::test]
async fn tool_calls_and_results_are_evicted_together() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "tools", defaults(700)).await;
    admit(&mut client, "tools", vec![span(Role::User, CONSTRAINT)])
        .await
        .unwrap();
    let mut compactions = 0;
    for i in 0..30 {
        let id = format!("call_{i}");
        let reply = if i % 3 == 0 {
            // The call in one turn, its result in the next.
            admit(
                &mut client,
                "tools",
                vec![call(&id, &format!("kubectl rollout status web-{i}"))],
            )
            .await
            .unwrap();
            admit(&mut client, "tools", vec![result(&id, &output(i))])
                .await
                .unwrap()
        } else {
            admit(
                &mut client,
                "tools",
                vec![
                    call(&id, &format!("kubectl apply -f web-{i}.yaml")),
                    result(&id, &output(i)),
                ],
            )
            .await
            .unwrap()
        };
        compactions += usize::from(reply.compaction.is_some());
        let live = context(&mut client, "tools").await;
        assert_eq!(orphans(&live.spans), Vec::<String>::new(), "after turn {i}");
        assert!(
            live.spans.iter().any(|s| s.text == CONSTRAINT),
            "after turn {i}"
        );
    }
    // Admissions compact, and so does the background pre-compaction above
    // the soft watermark: the session counts both.
    let done = session(&mut client, "tools").await.compactions;
    assert!(done >= 5, "{done} compactions ({compactions} at admission)");
}

/// Taking back the last span, then the rest of the newest turn; a stale
/// revision and too many spans are refused and change nothing; a taken
/// back key admits anew; all of it survives a restart.
#[tokio::test]
async fn the_newest_spans_are_taken_back() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "undo", defaults(10_000)).await;
    admit(&mut client, "undo", vec![span(Role::User, CONSTRAINT)])
        .await
        .unwrap();
    let turn = admit(
        &mut client,
        "undo",
        vec![
            keyed(Role::Assistant, "I will stage it.", "k-a"),
            keyed(Role::Tool, "staged", "k-b"),
            keyed(Role::Assistant, "Done: staged.", "k-c"),
        ],
    )
    .await
    .unwrap();
    let before = session(&mut client, "undo").await;

    let stale = retract(&mut client, "undo", 1, Some(before.revision - 1))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    assert_eq!(error_info(&stale).0, "STALE_REVISION");
    let many = retract(&mut client, "undo", 5, None).await.unwrap_err();
    assert_eq!(many.code(), Code::FailedPrecondition);
    assert_eq!(error_info(&many).0, "NOT_RETRACTABLE");
    assert_eq!(session(&mut client, "undo").await.revision, before.revision);

    let one = retract(&mut client, "undo", 1, Some(before.revision))
        .await
        .unwrap();
    assert_eq!(ids(&one.spans), [turn.spans[2].span_id]);
    assert_eq!(one.spans[0].text, "Done: staged.");
    let session_after = one.session.unwrap();
    assert_eq!(session_after.revision, before.revision + 1);
    assert_eq!(session_after.totals.unwrap().live_spans, 3);
    let rest = retract(&mut client, "undo", 0, None).await.unwrap();
    assert_eq!(ids(&rest.spans), ids(&turn.spans[..2]));

    // The keys went with their spans: admitting with one again admits.
    let again = admit(
        &mut client,
        "undo",
        vec![keyed(Role::Assistant, "redo", "k-a")],
    )
    .await
    .unwrap();
    assert!(!again.replayed);
    assert!(
        again.spans[0].span_id > turn.spans[2].span_id,
        "ids are never given twice"
    );

    daemon.restart().await;
    let mut client = daemon.client().await;
    let live = context(&mut client, "undo").await;
    let texts: Vec<&str> = live.spans.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, [CONSTRAINT, "redo"]);
}

/// A reset empties the live context and the archive after compactions,
/// keeps the configuration and the counters, and the session goes on.
#[tokio::test]
async fn a_reset_empties_the_session_and_keeps_its_settings() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "reset", defaults(600)).await;
    admit(&mut client, "reset", vec![span(Role::User, CONSTRAINT)])
        .await
        .unwrap();
    for i in 0..12 {
        admit(&mut client, "reset", vec![span(Role::Tool, &output(i))])
            .await
            .unwrap();
    }
    let before = session(&mut client, "reset").await;
    assert!(before.compactions > 0 && before.archived_spans > 0);
    let reply = client
        .reset_session(pb::ResetSessionRequest {
            session_id: "reset".into(),
            expected_revision: Some(before.revision),
        })
        .await
        .unwrap()
        .into_inner();
    let after = reply.session.unwrap();
    assert!(reply.spans_removed > 12, "{}", reply.spans_removed);
    assert_eq!(after.totals.as_ref().unwrap().live_spans, 0);
    assert_eq!(after.turns, before.turns);
    assert_eq!(after.config, before.config);
    assert!(context(&mut client, "reset").await.spans.is_empty());
    let listed = client
        .list_spans(pb::ListSpansRequest {
            session_id: "reset".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.spans.is_empty(), "the archive is emptied");
    let next = admit(&mut client, "reset", vec![span(Role::User, "start over")])
        .await
        .unwrap();
    assert_eq!(next.spans[0].turn, before.turns + 1);
    let stale = client
        .reset_session(pb::ResetSessionRequest {
            session_id: "reset".into(),
            expected_revision: Some(before.revision),
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
}

/// Summaries stand as system spans by default; a session that asks for
/// them as user messages gets them as user spans starting with its
/// prefix, counted within the budget.
#[tokio::test]
async fn summaries_can_be_presented_as_user_messages() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    for (id, presentation, prefix) in [
        ("as-system", pb::SummaryPresentation::Unspecified, None),
        (
            "as-user",
            pb::SummaryPresentation::User,
            Some("Earlier, in short:"),
        ),
    ] {
        let config = pb::SessionConfig {
            summary_presentation: presentation as i32,
            summary_prefix: prefix.map(str::to_owned),
            ..defaults(600)
        };
        let created = create(&mut client, id, config).await;
        let effective = created.config.unwrap();
        for i in 0..12 {
            admit(&mut client, id, vec![span(Role::Tool, &output(i))])
                .await
                .unwrap();
        }
        let live = context(&mut client, id).await;
        let totals = live.totals.unwrap();
        assert!(totals.live_tokens <= totals.budget_tokens);
        let summaries: Vec<&pb::Span> = live
            .spans
            .iter()
            .filter(|s| s.span_class == pb::SpanClass::Summary as i32)
            .collect();
        assert!(!summaries.is_empty(), "{id}: a summary stands");
        for s in summaries {
            match prefix {
                None => {
                    assert_eq!(s.role, Role::System as i32, "{id}");
                    assert_eq!(
                        effective.summary_presentation,
                        pb::SummaryPresentation::System as i32
                    );
                }
                Some(prefix) => {
                    assert_eq!(s.role, Role::User as i32, "{id}");
                    assert!(s.text.starts_with(&format!("{prefix}\n")), "{}", s.text);
                    assert_eq!(effective.summary_prefix.as_deref(), Some(prefix));
                }
            }
        }
    }
}
