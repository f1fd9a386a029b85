//! Per-tenant quotas through the real binary, authentication off: an
//! operator names sessions by full id (`acme/s1`), and acme's sessions,
//! stored bytes and admission rate are each refused at their quota with
//! RESOURCE_EXHAUSTED, reason QUOTA_EXCEEDED, a QuotaFailure naming the
//! tenant and a RetryInfo, while beta's sessions and bare ids are served.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use crate::support::{Daemon, admit, create, keyed, session, span, window};

/// acme: 2 sessions, 1000 bytes of text, 4 admissions at once then one
/// every 4 s. Everyone else: no quota.
const QUOTAS: &str = "[quota.tenants.acme]\nmax_sessions = 2\nmax_stored_bytes = 1000\nadmits_per_second = 0.25\nadmit_burst = 4\n";

/// The quota a refusal names, its limit and its retry delay, checking
/// every detail the status carries.
fn refused(status: &tonic::Status, quota: &str) -> (String, Duration) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let details = status.get_error_details();
    let info = details.error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "QUOTA_EXCEEDED", "{status:?}");
    assert_eq!(info.domain, "ctxbroker.v1");
    assert_eq!(info.metadata["tenant"], "acme");
    assert_eq!(info.metadata["quota"], quota, "{status:?}");
    let limit = info.metadata["limit"].clone();
    let failure = details.quota_failure().expect("QuotaFailure");
    assert_eq!(failure.violations.len(), 1);
    assert_eq!(failure.violations[0].subject, "acme");
    assert_eq!(
        failure.violations[0].description,
        format!("quota {quota} of {limit} exceeded")
    );
    let delay = details
        .retry_info()
        .expect("RetryInfo")
        .retry_delay
        .expect("a retry delay");
    assert_eq!(
        info.metadata["retry_after_ms"],
        delay.as_millis().to_string()
    );
    (limit, delay)
}

/// beta's session and a bare id are served while acme is refused.
async fn others_are_served(client: &mut ContextBrokerClient<Channel>, turn: &str) {
    for id in ["beta/x", "solo"] {
        admit(client, id, vec![span(pb::Role::Tool, turn)])
            .await
            .unwrap_or_else(|status| panic!("{id} is served: {status:?}"));
    }
}

#[tokio::test]
async fn a_tenant_is_refused_at_each_quota_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ctxbroker.toml");
    std::fs::write(&config, QUOTAS).unwrap();
    let daemon = Daemon::start_with(&["--config", config.to_str().unwrap()]).await;
    let mut client = daemon.client().await;

    // Sessions: two, then refused; nothing is stored for the third.
    create(&mut client, "acme/s1", window(100_000)).await;
    create(&mut client, "acme/s2", window(100_000)).await;
    let status = client
        .create_session(pb::CreateSessionRequest {
            session_id: "acme/s3".into(),
            config: Some(window(100_000)),
        })
        .await
        .unwrap_err();
    let (limit, delay) = refused(&status, "max_sessions");
    assert_eq!(limit, "2");
    assert_eq!(delay, Duration::from_secs(30));
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "acme/s3".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    // beta and the bare ids have no quota.
    for id in ["beta/x", "beta/y", "beta/z", "solo"] {
        create(&mut client, id, window(100_000)).await;
    }
    others_are_served(&mut client, "while acme is at its session quota").await;

    // Bytes: 600 fit, 500 more do not; the refused turn changes nothing
    // and spends no idempotency key. (Admissions 1 and 2 of the burst.)
    admit(
        &mut client,
        "acme/s1",
        vec![span(pb::Role::Tool, &"a".repeat(600))],
    )
    .await
    .unwrap();
    let before = session(&mut client, "acme/s2").await;
    let status = admit(
        &mut client,
        "acme/s2",
        vec![keyed(pb::Role::Tool, &"b".repeat(500), "k-big")],
    )
    .await
    .unwrap_err();
    let (limit, delay) = refused(&status, "max_stored_bytes");
    assert_eq!(limit, "1000");
    assert_eq!(delay, Duration::from_secs(30));
    assert_eq!(session(&mut client, "acme/s2").await, before);
    others_are_served(&mut client, "while acme is at its byte quota").await;

    // Rate: what is left of the burst of 4, then refused with the time
    // until the bucket holds a token again (at most 4 s at 0.25 a second).
    let mut served = 0;
    let status = loop {
        match admit(&mut client, "acme/s2", vec![span(pb::Role::Tool, "small")]).await {
            Ok(_) => served += 1,
            Err(status) => break status,
        }
        assert!(served <= 3, "the burst of 4 is spent by now");
    };
    assert!(served >= 1, "two admissions of the burst were left");
    let (limit, delay) = refused(&status, "admits_per_second");
    assert_eq!(limit, "0.25");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(4),
        "{delay:?}"
    );
    // Neither refused turn took a turn of the session.
    assert_eq!(session(&mut client, "acme/s2").await.turns, served);
    others_are_served(&mut client, "while acme is over its admission rate").await;

    // A delete frees acme's slot and its bytes.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "acme/s1".into(),
        })
        .await
        .unwrap();
    create(&mut client, "acme/s3", window(100_000)).await;
    // After the retry delay, the bucket has a token again, and the 600
    // bytes deleted make room for the 500 refused before.
    tokio::time::sleep(delay).await;
    admit(
        &mut client,
        "acme/s3",
        vec![keyed(pb::Role::Tool, &"b".repeat(500), "k-big")],
    )
    .await
    .unwrap();
}
