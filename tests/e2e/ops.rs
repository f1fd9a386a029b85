//! What operators and generic gRPC tooling expect: health, reflection (v1
//! and v1alpha), server info, the session lifecycle, and the admit stream.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::Role;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::*;

#[tokio::test]
async fn health_reflection_and_server_info_answer() {
    let daemon = Daemon::start().await;
    let channel = daemon.channel().await;

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "ctxbroker.v1.ContextBroker"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }

    use tonic_reflection::pb::v1 as r1;
    use tonic_reflection::pb::v1alpha as r1a;
    let mut v1 = r1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let reply = v1
        .server_reflection_info(tokio_stream::iter([r1::ServerReflectionRequest {
            message_request: Some(r1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
            ..Default::default()
        }]))
        .await
        .unwrap()
        .into_inner()
        .next()
        .await
        .unwrap()
        .unwrap();
    let Some(r1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("a service list");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"ctxbroker.v1.ContextBroker"), "{names:?}");
    for name in [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }

    let mut v1alpha = r1a::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let reply = v1alpha
        .server_reflection_info(tokio_stream::iter([r1a::ServerReflectionRequest {
            message_request: Some(
                r1a::server_reflection_request::MessageRequest::FileContainingSymbol(
                    "ctxbroker.v1.ContextBroker".into(),
                ),
            ),
            ..Default::default()
        }]))
        .await
        .unwrap()
        .into_inner()
        .next()
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        reply.message_response,
        Some(r1a::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
    ));

    let mut client = pb::context_broker_client::ContextBrokerClient::new(channel);
    let info = client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!info.version.is_empty());
    assert_eq!(info.contract_digest.len(), 64, "a SHA-256 in hex");
    assert_eq!(info.durability, "flush");
    assert_eq!(info.next_marker_seq, 1);
    assert!(info.limits.unwrap().max_spans_per_turn > 0);
}

#[tokio::test]
async fn the_session_lifecycle_works_end_to_end() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    for i in 0..5 {
        create(&mut client, &format!("life-{i}"), window(8000)).await;
    }
    // Paging.
    let first = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.sessions.len(), 2);
    let mut seen: Vec<String> = first
        .sessions
        .iter()
        .map(|s| s.session_id.clone())
        .collect();
    let mut token = first.next_page_token;
    while !token.is_empty() {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(page.sessions.iter().map(|s| s.session_id.clone()));
        token = page.next_page_token;
    }
    assert_eq!(
        seen,
        (0..5).map(|i| format!("life-{i}")).collect::<Vec<_>>()
    );

    // Update: a patch keeps the other fields.
    let updated = client
        .update_session(pb::UpdateSessionRequest {
            session_id: "life-0".into(),
            config: Some(pb::SessionConfig {
                alpha: Some(0.5),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let config = updated.config.unwrap();
    assert_eq!(config.alpha, Some(0.5));
    assert_eq!(config.window_tokens, Some(8000));
    assert_eq!(updated.totals.unwrap().budget_tokens, 4000);
    assert_eq!(updated.revision, 2);

    // A budget below what is live is refused.
    admit(
        &mut client,
        "life-1",
        vec![span(Role::Tool, &prose(1, &["x"], 400))],
    )
    .await
    .unwrap();
    let status = client
        .update_session(pb::UpdateSessionRequest {
            session_id: "life-1".into(),
            config: Some(pb::SessionConfig {
                window_tokens: Some(100),
                ..Default::default()
            }),
        })
        .await
        .expect_err("below live");
    assert_eq!(status.code(), Code::FailedPrecondition);

    // Delete.
    let deleted = client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "life-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.spans_deleted, 1);
    let status = client
        .get_session(pb::GetSessionRequest {
            session_id: "life-1".into(),
        })
        .await
        .expect_err("gone");
    assert_eq!(status.code(), Code::NotFound);
    // The id can be taken again.
    let again = create(&mut client, "life-1", window(1000)).await;
    assert_eq!(again.turns, 0);
}

#[tokio::test]
async fn an_admit_stream_replies_in_order_with_inline_errors() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "stream", window(800)).await;

    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut replies = client
        .admit_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut compactions = 0;
    for i in 1..=30u64 {
        let text = prose(i, &["stream"], 40);
        tx.send(pb::AdmitStreamRequest {
            request_id: i,
            admit: Some(pb::AdmitRequest {
                session_id: if i == 1 {
                    "stream".into()
                } else {
                    String::new()
                },
                spans: vec![span(Role::Tool, &text)],
            }),
        })
        .await
        .unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(10), replies.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(reply.request_id, i, "replies come in request order");
        match reply.event {
            Some(pb::admit_stream_response::Event::Admitted(a)) => {
                assert!(a.totals.unwrap().live_tokens <= a.totals.unwrap().budget_tokens);
                compactions += usize::from(a.compaction.is_some());
            }
            other => panic!("expected an admission, got {other:?}"),
        }
    }
    assert!(compactions > 0);

    // A refused turn is an inline error; the stream stays open.
    tx.send(pb::AdmitStreamRequest {
        request_id: 99,
        admit: Some(pb::AdmitRequest {
            session_id: String::new(),
            spans: vec![],
        }),
    })
    .await
    .unwrap();
    let reply = replies.message().await.unwrap().unwrap();
    assert_eq!(reply.request_id, 99);
    let Some(pb::admit_stream_response::Event::Error(err)) = reply.event else {
        panic!("an inline error");
    };
    assert_eq!(err.code, Code::InvalidArgument as i32);
    assert_eq!(err.field_violations[0].field, "spans");

    // Another client's compaction on the same session arrives inline.
    let mut other = daemon.client().await;
    let mut seed = 500;
    let marker = loop {
        seed += 1;
        let reply = admit(
            &mut other,
            "stream",
            vec![span(Role::Tool, &prose(seed, &["other"], 40))],
        )
        .await
        .unwrap();
        if let Some(m) = reply.compaction {
            break m;
        }
    };
    let inline = tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(inline.request_id, 0);
    assert_eq!(
        inline.event,
        Some(pb::admit_stream_response::Event::Marker(marker))
    );
    drop(tx);
    assert!(
        replies.message().await.unwrap().is_none(),
        "the stream ends when the client does"
    );
}

#[tokio::test]
async fn an_admit_stream_that_sends_faster_than_it_reads_is_held_back_not_dropped() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "flood", window(2_000)).await;
    create(&mut client, "bystander", window(2_000)).await;

    // 2,000 turns offered at once, on their own connection; the replies
    // are not read until every request has been offered or the transport
    // pushes back.
    const TURNS: u64 = 2_000;
    let requests = tokio_stream::iter((1..=TURNS).map(|i| pb::AdmitStreamRequest {
        request_id: i,
        admit: Some(pb::AdmitRequest {
            session_id: if i == 1 {
                "flood".into()
            } else {
                String::new()
            },
            spans: vec![span(
                Role::Tool,
                &format!("flood {i}: {}", prose(i, &["flood"], 20)),
            )],
        }),
    }));
    let mut flooder = daemon.client().await;
    let mut replies = flooder.admit_stream(requests).await.unwrap().into_inner();

    // Meanwhile the daemon serves everyone else.
    for n in 0..20 {
        admit(
            &mut client,
            "bystander",
            vec![span(Role::User, &format!("still here {n}"))],
        )
        .await
        .expect("other sessions are served during the flood");
    }

    // Every reply, in request order, each admitted once.
    let mut last_turn = 0;
    for i in 1..=TURNS {
        let reply = tokio::time::timeout(Duration::from_secs(60), replies.message())
            .await
            .expect("replies keep coming")
            .expect("the stream stays up")
            .expect("a reply for every request");
        assert_eq!(reply.request_id, i);
        let Some(pb::admit_stream_response::Event::Admitted(a)) = reply.event else {
            panic!("request {i}: {:?}", reply.event);
        };
        assert_eq!(a.turn, last_turn + 1, "turns in order, none twice");
        last_turn = a.turn;
    }
    let flood = session(&mut client, "flood").await;
    assert_eq!(flood.turns, TURNS);
}
