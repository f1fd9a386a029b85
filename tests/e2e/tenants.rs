//! Tenant isolation through the real binary (docs/security.md): a tenant
//! never sees, changes, watches or learns of another tenant's sessions,
//! on every RPC of the contract, and an operator sees them all.

use std::collections::BTreeSet;
use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::support::{
    Daemon, TokenClient as Client, classed, read_markers, span, token_client, window,
};

const ACME_AGENT: &str = "acme-agent-token-0123456789abcdef";
const BETA_AGENT: &str = "beta-agent-token-0123456789abcdef";
const BETA_WATCHER: &str = "beta-watcher-token-0123456789abcd";
const OPERATOR: &str = "operator-token-0123456789abcdef01";

/// A token file with an agent for acme, an agent and a watcher for beta,
/// and an operator.
fn token_file(dir: &std::path::Path) -> String {
    let entry = |id: &str, role: &str, tenant: Option<&str>, token: &str| {
        let tenant = tenant
            .map(|t| format!("tenant = \"{t}\"\n"))
            .unwrap_or_default();
        format!(
            "[[token]]\nid = \"{id}\"\nrole = \"{role}\"\n{tenant}sha256 = \"{}\"\n\n",
            hex::encode(Sha256::digest(token.as_bytes()))
        )
    };
    let text = [
        entry("acme-agent", "agent", Some("acme"), ACME_AGENT),
        entry("beta-agent", "agent", Some("beta"), BETA_AGENT),
        entry("beta-watcher", "watcher", Some("beta"), BETA_WATCHER),
        entry("root", "operator", None, OPERATOR),
    ]
    .concat();
    let path = dir.join("tokens.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

async fn client(daemon: &Daemon, token: &str) -> Client {
    token_client(daemon.channel().await, token)
}

/// Every RPC of the contract, as the descriptor names them.
fn contract_rpcs() -> BTreeSet<String> {
    let set = prost_types::FileDescriptorSet::decode(ctxbroker_proto::FILE_DESCRIPTOR_SET).unwrap();
    set.file
        .iter()
        .flat_map(|f| f.service.iter())
        .filter(|s| s.name() == "ContextBroker")
        .flat_map(|s| s.method.iter().map(|m| m.name().to_owned()))
        .collect()
}

/// What another tenant's agent gets from each RPC aimed at acme's session
/// `s1` (which beta names `s1` too): every RPC is in the table.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// NOT_FOUND, as if the session did not exist.
    NotFound,
    /// Served, but over beta's own sessions only (checked apart).
    OwnScope,
    /// Names no session.
    NoSession,
    /// Not an agent's to call.
    Denied,
}

const TABLE: &[(&str, Expect)] = &[
    ("CreateSession", Expect::OwnScope),
    ("GetSession", Expect::NotFound),
    ("ListSessions", Expect::OwnScope),
    ("UpdateSession", Expect::NotFound),
    ("DeleteSession", Expect::NotFound),
    ("Admit", Expect::NotFound),
    ("AdmitStream", Expect::NotFound),
    ("GetContext", Expect::NotFound),
    ("GetSpan", Expect::NotFound),
    ("SearchSpans", Expect::NotFound),
    ("ListSpans", Expect::NotFound),
    ("PlanCompaction", Expect::NotFound),
    ("CommitCompaction", Expect::NotFound),
    ("Pin", Expect::NotFound),
    ("Unpin", Expect::NotFound),
    ("WatchCompactions", Expect::OwnScope),
    ("SelectTrigger", Expect::NoSession),
    ("GetServerInfo", Expect::NoSession),
    ("ExportSession", Expect::Denied),
    ("ImportSession", Expect::Denied),
    ("RetractLastTurn", Expect::NotFound),
    ("ResetSession", Expect::NotFound),
];

/// Calls `rpc` about session `id`; the status when it fails. For the
/// admit stream, the inline error of its one turn.
async fn call(client: &mut Client, rpc: &str, id: &str, span_id: u64) -> Result<(), tonic::Status> {
    let session_id = id.to_owned();
    match rpc {
        "GetSession" => client
            .get_session(pb::GetSessionRequest { session_id })
            .await
            .map(drop),
        "UpdateSession" => client
            .update_session(pb::UpdateSessionRequest {
                session_id,
                config: Some(pb::SessionConfig {
                    alpha: Some(0.5),
                    ..Default::default()
                }),
            })
            .await
            .map(drop),
        "DeleteSession" => client
            .delete_session(pb::DeleteSessionRequest { session_id })
            .await
            .map(drop),
        "Admit" => client
            .admit(pb::AdmitRequest {
                session_id,
                spans: vec![span(pb::Role::User, "never write to the prod namespace")],
            })
            .await
            .map(drop),
        "AdmitStream" => {
            let request = pb::AdmitStreamRequest {
                request_id: 1,
                admit: Some(pb::AdmitRequest {
                    session_id,
                    spans: vec![span(pb::Role::User, "hello")],
                }),
            };
            let mut replies = client
                .admit_stream(tokio_stream::iter([request]))
                .await?
                .into_inner();
            let reply = replies.next().await.expect("one reply")?;
            match reply.event {
                Some(pb::admit_stream_response::Event::Error(err)) => {
                    Err(tonic::Status::new(Code::from(err.code), err.message))
                }
                _ => Ok(()),
            }
        }
        "GetContext" => client
            .get_context(pb::GetContextRequest { session_id })
            .await
            .map(drop),
        "GetSpan" => client
            .get_span(pb::GetSpanRequest {
                session_id,
                span_id,
            })
            .await
            .map(drop),
        "SearchSpans" => client
            .search_spans(pb::SearchSpansRequest {
                session_id,
                query: "prod".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "ListSpans" => client
            .list_spans(pb::ListSpansRequest {
                session_id,
                ..Default::default()
            })
            .await
            .map(drop),
        "PlanCompaction" => client
            .plan_compaction(pb::PlanCompactionRequest {
                session_id,
                ..Default::default()
            })
            .await
            .map(drop),
        "CommitCompaction" => client
            .commit_compaction(pb::CommitCompactionRequest {
                session_id,
                plan_id: "p1.2.0.0.0".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "Pin" => client
            .pin(pb::PinRequest {
                session_id,
                span_id,
                ..Default::default()
            })
            .await
            .map(drop),
        "Unpin" => client
            .unpin(pb::UnpinRequest {
                session_id,
                span_id,
                actor: "someone".into(),
                reason: "curious".into(),
            })
            .await
            .map(drop),
        "ExportSession" => client
            .export_session(pb::ExportSessionRequest { session_id })
            .await
            .map(drop),
        "ImportSession" => client
            .import_session(pb::ImportSessionRequest {
                snapshot: Some(pb::SessionSnapshot {
                    session_id,
                    ..Default::default()
                }),
            })
            .await
            .map(drop),
        "RetractLastTurn" => client
            .retract_last_turn(pb::RetractLastTurnRequest {
                session_id,
                spans: 1,
                expected_revision: None,
            })
            .await
            .map(drop),
        "ResetSession" => client
            .reset_session(pb::ResetSessionRequest {
                session_id,
                expected_revision: None,
            })
            .await
            .map(drop),
        "SelectTrigger" => client
            .select_trigger(pb::SelectTriggerRequest {
                workload: Some(pb::DeclaredWorkload {
                    window_tokens: 100_000,
                    alpha: 0.8,
                    ..Default::default()
                }),
            })
            .await
            .map(drop),
        "GetServerInfo" => client
            .get_server_info(pb::GetServerInfoRequest {})
            .await
            .map(drop),
        other => panic!("no call written for {other}"),
    }
}

/// Acme's session as an operator reads it: record, context and spans.
async fn acme_state(operator: &mut Client) -> (pb::Session, Vec<(u64, String)>) {
    let session = operator
        .get_session(pb::GetSessionRequest {
            session_id: "acme/s1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let spans = operator
        .get_context(pb::GetContextRequest {
            session_id: "acme/s1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .spans
        .into_iter()
        .map(|s| (s.span_id, s.text))
        .collect();
    (session, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_session_is_not_found_on_every_rpc() {
    let temp = tempfile::tempdir().unwrap();
    let tokens = token_file(temp.path());
    let daemon = Daemon::start_with(&["--auth-tokens-file", &tokens]).await;
    let mut acme = client(&daemon, ACME_AGENT).await;
    let mut beta = client(&daemon, BETA_AGENT).await;
    let mut operator = client(&daemon, OPERATOR).await;

    let table: BTreeSet<String> = TABLE.iter().map(|(rpc, _)| (*rpc).to_owned()).collect();
    assert_eq!(
        table,
        contract_rpcs(),
        "the table covers every RPC of the contract"
    );

    // Acme's session, with a pinned constraint.
    acme.create_session(pb::CreateSessionRequest {
        session_id: "s1".into(),
        config: Some(window(2_000)),
    })
    .await
    .unwrap();
    let admitted = acme
        .admit(pb::AdmitRequest {
            session_id: "s1".into(),
            spans: vec![classed(
                pb::Role::User,
                pb::SpanClass::Constraint,
                "Never write to the prod namespace, whatever the task says.",
            )],
        })
        .await
        .unwrap()
        .into_inner();
    let span_id = admitted.spans[0].span_id;
    assert_eq!(
        admitted.spans[0].span_class,
        pb::SpanClass::Constraint as i32,
        "a pinned constraint"
    );
    let mut acme_watch = acme
        .watch_compactions(pb::WatchCompactionsRequest {
            start: pb::WatchStart::Oldest as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let before = acme_state(&mut operator).await;

    for (rpc, expect) in TABLE {
        if *expect == Expect::OwnScope {
            continue;
        }
        let got = call(&mut beta, rpc, "s1", span_id).await;
        match expect {
            Expect::NotFound => {
                let status = got.expect_err(rpc);
                assert_eq!(status.code(), Code::NotFound, "{rpc}: {status:?}");
                assert!(
                    !status.message().contains("acme"),
                    "{rpc}: the message names no other tenant: {}",
                    status.message()
                );
            }
            Expect::Denied => {
                let status = got.expect_err(rpc);
                assert_eq!(status.code(), Code::PermissionDenied, "{rpc}: {status:?}");
            }
            Expect::NoSession => {
                got.unwrap_or_else(|s| panic!("{rpc}: {s:?}"));
            }
            Expect::OwnScope => {}
        }
        assert_eq!(
            acme_state(&mut operator).await,
            before,
            "{rpc} from beta left acme's session as it was"
        );
    }

    // CreateSession: beta's `s1` is its own session, acme's is untouched.
    let created = beta
        .create_session(pb::CreateSessionRequest {
            session_id: "s1".into(),
            config: Some(window(2_000)),
        })
        .await
        .expect("beta creates its own s1")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(created.session_id, "s1");
    assert_eq!(created.turns, 0, "a new session, not acme's");
    assert_eq!(acme_state(&mut operator).await, before);
    beta.admit(pb::AdmitRequest {
        session_id: "s1".into(),
        spans: vec![span(pb::Role::User, "beta's own turn")],
    })
    .await
    .unwrap();

    // ListSessions: each tenant sees its own, by bare id; the operator
    // sees both, by full id.
    let ids = |reply: pb::ListSessionsResponse| -> Vec<String> {
        reply.sessions.into_iter().map(|s| s.session_id).collect()
    };
    let listed = beta
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(listed), ["s1"]);
    let listed = acme
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(listed), ["s1"]);
    let listed = operator
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(listed), ["acme/s1", "beta/s1"]);
    let acme_turns = acme
        .get_session(pb::GetSessionRequest {
            session_id: "s1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .turns;
    assert_eq!(acme_turns, 1, "beta's turn went to beta's session");

    // WatchCompactions: beta's watch over all its sessions and a watch
    // naming `s1` see beta's markers only; acme's see acme's only.
    let mut beta_all = beta
        .watch_compactions(pb::WatchCompactionsRequest {
            start: pb::WatchStart::Oldest as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut beta_named = beta
        .watch_compactions(pb::WatchCompactionsRequest {
            start: pb::WatchStart::Oldest as i32,
            session_ids: vec!["s1".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Unpinning writes a marker naming who asked: acme's, then beta's.
    acme.unpin(pb::UnpinRequest {
        session_id: "s1".into(),
        span_id,
        actor: "acme-ops".into(),
        reason: "superseded".into(),
    })
    .await
    .unwrap();
    let beta_span = beta
        .admit(pb::AdmitRequest {
            session_id: "s1".into(),
            spans: vec![classed(
                pb::Role::User,
                pb::SpanClass::Constraint,
                "Do not open pull requests against the release branch.",
            )],
        })
        .await
        .unwrap()
        .into_inner()
        .spans[0]
        .span_id;
    beta.unpin(pb::UnpinRequest {
        session_id: "s1".into(),
        span_id: beta_span,
        actor: String::new(),
        reason: "done".into(),
    })
    .await
    .unwrap();

    for (who, stream) in [("beta, all", &mut beta_all), ("beta, s1", &mut beta_named)] {
        let marker = next_marker(stream).await;
        assert_eq!(marker.session_id, "s1", "{who}");
        assert_eq!(
            marker.actor, "beta-agent@beta",
            "{who}: the marker records beta's token: {:?}",
            marker.actor
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(300), next_marker(stream))
                .await
                .is_err(),
            "{who}: no other marker reaches beta"
        );
    }
    let first = next_marker(&mut acme_watch).await;
    assert_eq!(first.session_id, "s1");
    assert_eq!(first.actor, "acme-agent@acme (as acme-ops)");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), next_marker(&mut acme_watch))
            .await
            .is_err(),
        "beta's marker does not reach acme"
    );
    let mut all = operator
        .watch_compactions(pb::WatchCompactionsRequest {
            start: pb::WatchStart::Oldest as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let seen: BTreeSet<String> = [next_marker(&mut all).await, next_marker(&mut all).await]
        .into_iter()
        .map(|m| m.session_id)
        .collect();
    assert_eq!(
        seen,
        BTreeSet::from(["acme/s1".to_owned(), "beta/s1".to_owned()]),
        "the operator watches every tenant, by full id"
    );

    // A watcher reads but does not write.
    let mut watcher = client(&daemon, BETA_WATCHER).await;
    call(&mut watcher, "GetSession", "s1", 0)
        .await
        .expect("a watcher reads its tenant's session");
    let denied = call(&mut watcher, "Admit", "s1", 0).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    // The operator exports acme's session and imports it into beta.
    let exported = operator
        .export_session(pb::ExportSessionRequest {
            session_id: "acme/s1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exported.session.unwrap().session_id, "acme/s1");
    operator
        .delete_session(pb::DeleteSessionRequest {
            session_id: "beta/s1".into(),
        })
        .await
        .unwrap();

    // The audit log answers who removed acme's constraint, and who
    // deleted beta's session.
    let audit = std::fs::read_to_string(daemon.data_dir().join("audit.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = audit
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let find = |action: &str, session: &str, outcome: &str| {
        entries
            .iter()
            .find(|e| {
                e["action"] == action && e["session_id"] == session && e["outcome"] == outcome
            })
            .unwrap_or_else(|| panic!("no {action} {session} {outcome} in {audit}"))
    };
    let unpin = find("unpin", "acme/s1", "ok");
    assert_eq!(unpin["token_id"], "acme-agent");
    assert_eq!(unpin["token_tenant"], "acme");
    assert_eq!(unpin["tenant"], "acme");
    assert!(
        unpin["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("span {span_id}"))
    );
    let tried = find("unpin", "beta/s1", "NOT_FOUND");
    assert_eq!(
        tried["token_id"], "beta-agent",
        "beta's attempt is recorded too"
    );
    let deleted = find("delete_session", "beta/s1", "ok");
    assert_eq!(deleted["token_id"], "root");
    assert_eq!(deleted["role"], "operator");
    find("export_session", "acme/s1", "ok");
    assert!(
        !entries
            .iter()
            .any(|e| e["session_id"] == "acme/s1" && e["token_id"] == "beta-agent"),
        "beta's requests never touched acme's session"
    );
}

/// The next marker of a watch.
async fn next_marker(
    stream: &mut tonic::Streaming<pb::WatchCompactionsResponse>,
) -> pb::CompactionMarker {
    read_markers(stream, 1).await.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_at_most_its_streams_while_others_open_theirs() {
    let temp = tempfile::tempdir().unwrap();
    let tokens = token_file(temp.path());
    let config = temp.path().join("ctxbroker.toml");
    std::fs::write(&config, "[quota.tenants.beta]\nmax_streams = 1\n").unwrap();
    let daemon = Daemon::start_with(&[
        "--auth-tokens-file",
        &tokens,
        "--config",
        config.to_str().unwrap(),
    ])
    .await;
    let mut beta = client(&daemon, BETA_AGENT).await;
    let mut acme = client(&daemon, ACME_AGENT).await;
    let watch = pb::WatchCompactionsRequest {
        start: pb::WatchStart::Now as i32,
        ..Default::default()
    };

    let first = beta.watch_compactions(watch.clone()).await.unwrap();
    let status = beta.watch_compactions(watch.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let (reason, metadata) = crate::support::error_info(&status);
    assert_eq!(reason, "QUOTA_EXCEEDED");
    assert_eq!(metadata["quota"], "max_streams");
    assert_eq!(metadata["tenant"], "beta");
    // An admit stream counts too.
    let request = pb::AdmitStreamRequest::default();
    let status = beta
        .admit_stream(tokio_stream::iter([request]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // Another tenant has no such quota.
    let _acme_watches = (
        acme.watch_compactions(watch.clone()).await.unwrap(),
        acme.watch_compactions(watch.clone()).await.unwrap(),
    );

    // Closing the stream gives its place back.
    drop(first);
    let began = std::time::Instant::now();
    loop {
        match beta.watch_compactions(watch.clone()).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    began.elapsed() < Duration::from_secs(10),
                    "the closed watch's place was not given back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
}
