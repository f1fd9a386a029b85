//! Injected faults (builds with the `failpoints` feature): before and
//! after the store's transaction, before and after its flush, and between
//! a plan and its commit. Each leaves the session exactly before or
//! exactly after the request, the caller gets an error — never an
//! acknowledgement of a write that may not stand — and the session goes on
//! normally, across a `kill -9` too.

use ctxbroker_proto::v1 as pb;
use pb::Role;
use prost::Message;

use crate::support::*;

/// The session's spans as (id, text), and its turn count.
async fn snapshot(
    client: &mut pb::context_broker_client::ContextBrokerClient<tonic::transport::Channel>,
    id: &str,
) -> (Vec<(u64, String)>, u64) {
    let ctx = context(client, id).await;
    let spans = ctx
        .spans
        .iter()
        .map(|s| (s.span_id, s.text.clone()))
        .collect();
    (spans, session(client, id).await.turns)
}

#[tokio::test]
async fn each_store_fault_leaves_the_session_before_or_after_and_never_acknowledges() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let faults = [
        "store::before_transaction",
        "store::after_transaction",
        "store::before_flush",
        "store::after_flush",
    ];
    for (i, _) in faults.iter().enumerate() {
        create(&mut client, &format!("f{i}"), window(5_000)).await;
        admit(
            &mut client,
            &format!("f{i}"),
            vec![span(Role::User, "Never touch `prod`.")],
        )
        .await
        .unwrap();
    }
    for (i, fault) in faults.iter().enumerate() {
        let id = format!("f{i}");
        daemon.set_faults(Some(&format!("{fault}=1*return")));
        daemon.restart().await;
        let mut client = daemon.client().await;
        let before = snapshot(&mut client, &id).await;
        let text = format!("A turn that meets {fault}.");
        let status = admit(&mut client, &id, vec![span(Role::Tool, &text)])
            .await
            .expect_err("the fault is reported, not acknowledged");
        assert!(
            status.message().contains("injected fault"),
            "{fault}: {status:?}"
        );

        let after = snapshot(&mut client, &id).await;
        let landed = after != before;
        if landed {
            // Exactly after: the whole turn, nothing else.
            assert_eq!(after.1, before.1 + 1, "{fault}");
            assert_eq!(after.0.len(), before.0.len() + 1, "{fault}");
            assert_eq!(after.0.last().map(|s| s.1.as_str()), Some(text.as_str()));
        }
        // The fault was spent: the session goes on.
        let next = admit(&mut client, &id, vec![span(Role::Tool, "The next turn.")])
            .await
            .unwrap_or_else(|s| panic!("{fault}: {s:?}"));
        assert_eq!(next.turn, after.1 + 1, "{fault}");
        let settled = context(&mut client, &id).await.encode_to_vec();

        // What was answered survives a crash, whatever the fault did.
        daemon.set_faults(None);
        daemon.restart().await;
        let mut client = daemon.client().await;
        assert_eq!(
            context(&mut client, &id).await.encode_to_vec(),
            settled,
            "{fault}"
        );
        eprintln!(
            "{fault}: the turn {}",
            if landed {
                "landed (after)"
            } else {
                "did not land (before)"
            }
        );
    }
}

#[tokio::test]
async fn a_fault_between_plan_and_commit_changes_nothing() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "pc", window(1_500)).await;
    for n in 0..12 {
        admit(
            &mut client,
            "pc",
            vec![span(Role::Tool, &prose(n, &["plan"], 50))],
        )
        .await
        .unwrap();
    }
    daemon.set_faults(Some("broker::between_plan_and_commit=1*return"));
    daemon.restart().await;
    let mut client = daemon.client().await;
    let plan = |client: &mut pb::context_broker_client::ContextBrokerClient<_>| {
        let mut client = client.clone();
        async move {
            client
                .plan_compaction(pb::PlanCompactionRequest {
                    session_id: "pc".into(),
                    incoming_tokens: 0,
                    target_tokens: Some(300),
                })
                .await
                .unwrap()
                .into_inner()
                .plan
                .unwrap()
                .plan_id
        }
    };
    let commit = |client: &mut pb::context_broker_client::ContextBrokerClient<_>,
                  plan_id: String| {
        let mut client = client.clone();
        async move {
            client
                .commit_compaction(pb::CommitCompactionRequest {
                    session_id: "pc".into(),
                    plan_id,
                    actor: "ops".into(),
                    ..Default::default()
                })
                .await
        }
    };
    let before = context(&mut client, "pc").await.encode_to_vec();
    let plan_id = plan(&mut client).await;
    let status = commit(&mut client, plan_id.clone())
        .await
        .expect_err("injected");
    assert!(status.message().contains("injected fault"), "{status:?}");
    assert_eq!(context(&mut client, "pc").await.encode_to_vec(), before);
    // The same plan is still current, and commits.
    let done = commit(&mut client, plan_id)
        .await
        .expect("commits")
        .into_inner();
    assert!(done.marker.is_some());
}
