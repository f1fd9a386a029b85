//! Bad input: each malformed request gets its own clear status naming the
//! field, and nothing is written.

use ctxbroker_proto::v1 as pb;
use pb::Role;
use tonic::Code;
use tonic_types::StatusExt;

use crate::support::*;

/// The fields a status names in its BadRequest details.
fn fields(status: &tonic::Status) -> Vec<String> {
    status
        .get_error_details()
        .bad_request()
        .map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect())
        .unwrap_or_default()
}

fn expect_invalid(result: Result<impl std::fmt::Debug, tonic::Status>, field: &str) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert!(
        fields(&status).iter().any(|f| f == field),
        "{field} not named in {:?} ({})",
        fields(&status),
        status.message()
    );
    assert!(
        status.message().contains(field),
        "message names {field}: {}",
        status.message()
    );
    let reason = status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone());
    assert_eq!(reason.as_deref(), Some("INVALID_ARGUMENT"));
}

async fn state(
    client: &mut pb::context_broker_client::ContextBrokerClient<tonic::transport::Channel>,
) -> (Vec<pb::Session>, u64) {
    let sessions = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    let info = client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    (sessions, info.next_marker_seq)
}

fn create_req(id: &str, config: pb::SessionConfig) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        session_id: id.into(),
        config: Some(config),
    }
}

#[tokio::test]
async fn each_bad_request_names_its_field_and_changes_nothing() {
    let daemon = Daemon::start_with(&["--max-span-bytes", "4096"]).await;
    let mut client = daemon.client().await;
    create(&mut client, "good", window(2000)).await;
    admit(&mut client, "good", vec![span(Role::User, "Hello there.")])
        .await
        .unwrap();
    let before = state(&mut client).await;
    let context_before = context(&mut client, "good").await;

    // Session ids.
    expect_invalid(
        client.create_session(create_req("", window(1000))).await,
        "session_id",
    );
    expect_invalid(
        client
            .create_session(create_req(&"x".repeat(129), window(1000)))
            .await,
        "session_id",
    );
    expect_invalid(
        client.create_session(create_req("a b", window(1000))).await,
        "session_id",
    );
    // Configs.
    let alpha = |a: f64| pb::SessionConfig {
        alpha: Some(a),
        ..window(1000)
    };
    for a in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
        expect_invalid(
            client.create_session(create_req("s1", alpha(a))).await,
            "config.alpha",
        );
    }
    expect_invalid(
        client.create_session(create_req("s1", window(0))).await,
        "config.window_tokens",
    );
    expect_invalid(
        client
            .create_session(create_req("s1", pb::SessionConfig::default()))
            .await,
        "config.window_tokens",
    );
    expect_invalid(
        client
            .create_session(create_req(
                "s1",
                pb::SessionConfig {
                    reserved_overhead_tokens: Some(1000),
                    ..window(1000)
                },
            ))
            .await,
        "config.reserved_overhead_tokens",
    );
    expect_invalid(
        client
            .create_session(create_req(
                "s1",
                pb::SessionConfig {
                    trigger: 42,
                    ..window(1000)
                },
            ))
            .await,
        "config.trigger",
    );
    // Turns.
    let turn = |spans: Vec<pb::SpanInput>| pb::AdmitRequest {
        session_id: "good".into(),
        spans,
    };
    expect_invalid(client.admit(turn(vec![])).await, "spans");
    expect_invalid(
        client
            .admit(turn(vec![span(Role::User, &"y".repeat(4097))]))
            .await,
        "spans[0].text",
    );
    expect_invalid(
        client.admit(turn(vec![span(Role::User, "")])).await,
        "spans[0].text",
    );
    expect_invalid(
        client
            .admit(turn(vec![span(Role::Unspecified, "no role")]))
            .await,
        "spans[0].role",
    );
    expect_invalid(
        client
            .admit(turn(vec![
                span(Role::User, "fine"),
                classed(Role::User, pb::SpanClass::Summary, "fake summary"),
            ]))
            .await,
        "spans[1].span_class",
    );
    expect_invalid(
        client
            .admit(turn(vec![pb::SpanInput {
                token_count: Some(3),
                ..span(Role::User, "counted by the caller")
            }]))
            .await,
        "spans[0].token_count",
    );
    expect_invalid(
        client
            .admit(pb::AdmitRequest {
                session_id: String::new(),
                spans: vec![span(Role::User, "to nowhere")],
            })
            .await,
        "session_id",
    );

    // Unknown sessions and spans.
    let status = admit(&mut client, "nobody", vec![span(Role::User, "hi")])
        .await
        .expect_err("unknown session");
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("nobody"));
    let status = client
        .get_span(pb::GetSpanRequest {
            session_id: "good".into(),
            span_id: 999,
        })
        .await
        .expect_err("unknown span");
    assert_eq!(status.code(), Code::NotFound);
    let status = client
        .create_session(create_req("good", window(1000)))
        .await
        .expect_err("taken id");
    assert_eq!(status.code(), Code::AlreadyExists);

    assert_eq!(state(&mut client).await, before, "nothing was written");
    assert_eq!(context(&mut client, "good").await, context_before);
}
