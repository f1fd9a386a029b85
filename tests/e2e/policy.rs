//! The policy through the wire: plan → commit (the pre-commit hook),
//! approval, pin and unpin, the soft watermark, the staleness guard, and
//! trigger selection.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::Role;
use pb::context_broker_client::ContextBrokerClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

type Client = ContextBrokerClient<Channel>;

async fn plan(client: &mut Client, id: &str) -> pb::PlanCompactionResponse {
    client
        .plan_compaction(pb::PlanCompactionRequest {
            session_id: id.into(),
            incoming_tokens: 0,
            target_tokens: None,
        })
        .await
        .expect("PlanCompaction succeeds")
        .into_inner()
}

async fn commit(
    client: &mut Client,
    id: &str,
    plan_id: &str,
    summary: Option<String>,
) -> Result<pb::CommitCompactionResponse, tonic::Status> {
    client
        .commit_compaction(pb::CommitCompactionRequest {
            session_id: id.into(),
            plan_id: plan_id.into(),
            summary_text: summary,
            compressed_forms: vec![],
            actor: "reviewer-7".into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Tool output with a path and an error line of its own.
fn tool_output(i: u64) -> String {
    format!(
        "cargo test -p svc-{i}: error[E0{i:03}]: mismatched types in crates/svc-{i}/src/lib.rs:{}:9; {}",
        10 + i,
        prose(i, &["build"], 30)
    )
}

/// Prose with one path in it: mostly words a summary can shorten.
fn chatter(i: u64) -> String {
    format!(
        "Notes on step {i} in docs/step-{i}.md: {}",
        prose(i, &["review"], 60)
    )
}

/// A session with live narrative well past its soft watermark: window
/// 1500, soft watermark 0.5 of the budget, so PlanCompaction has work.
async fn planned_session(client: &mut Client, id: &str, mode: pb::SessionMode) {
    create(
        client,
        id,
        pb::SessionConfig {
            soft_watermark: Some(0.5),
            mode: mode as i32,
            ..window(1500)
        },
    )
    .await;
    for i in 0..14 {
        admit(client, id, vec![span(Role::Tool, &tool_output(i))])
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_plan_is_bound_to_the_revision_it_was_made_at() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    planned_session(&mut client, "stale", pb::SessionMode::Approval).await;
    let planned = plan(&mut client, "stale").await;
    let p = planned.plan.unwrap();
    assert!(planned.verification.unwrap().passed);
    assert!(!p.evicted.is_empty());
    assert!(p.tokens_after < p.tokens_before);

    // Another admission lands in between.
    admit(
        &mut client,
        "stale",
        vec![span(Role::User, "One more small note.")],
    )
    .await
    .unwrap();
    let status = commit(&mut client, "stale", &p.plan_id, None)
        .await
        .expect_err("stale plan");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    let (reason, meta) = error_info(&status);
    assert_eq!(reason, "STALE_PLAN");
    assert_eq!(meta["planned_revision"], p.session_revision.to_string());

    // A plan id of another session is refused the same way, and a
    // malformed one names the field.
    planned_session(&mut client, "other", pb::SessionMode::Approval).await;
    let theirs = plan(&mut client, "other").await.plan.unwrap();
    let status = commit(&mut client, "stale", &theirs.plan_id, None)
        .await
        .expect_err("another session's plan");
    assert_eq!(status.code(), Code::Aborted);
    let status = commit(&mut client, "stale", "not-a-plan", None)
        .await
        .expect_err("malformed");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("plan_id"));
}

#[tokio::test]
async fn a_caller_summary_must_keep_the_required_anchors() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    planned_session(&mut client, "hook", pb::SessionMode::Approval).await;
    let (_watch, before) = watch_replay(&mut client, 0).await;
    let planned = plan(&mut client, "hook").await.plan.unwrap();
    let draft = planned.summary_draft.clone().expect("a summary draft");
    assert!(!draft.anchors.is_empty(), "{draft:?}");
    // An anchor no other anchor contains (a path inside an error line
    // would be carried by the line).
    let missing = draft
        .anchors
        .iter()
        .find(|a| {
            !draft
                .anchors
                .iter()
                .any(|b| b != *a && b.contains(a.as_str()))
        })
        .cloned()
        .expect("an outermost anchor");

    // A fluent summary that forgets an anchor is refused under REQUIRE.
    let lossy: Vec<&str> = draft
        .anchors
        .iter()
        .filter(|a| **a != missing)
        .map(String::as_str)
        .collect();
    let lossy = format!("Earlier builds failed; see {}.", lossy.join(", "));
    let status = commit(&mut client, "hook", &planned.plan_id, Some(lossy))
        .await
        .expect_err("missing anchor");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains(&missing),
        "names {missing}: {}",
        status.message()
    );
    assert!(
        status
            .message()
            .contains("the compaction cannot be committed"),
        "{}",
        status.message()
    );
    let (reason, _) = error_info(&status);
    assert_eq!(reason, "COMPACTION_INVARIANT");
    let (_w, after) = watch_replay(&mut client, 0).await;
    let aborted = after.last().unwrap();
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(aborted.outcome(), pb::CompactionOutcome::Aborted);
    assert!(aborted.violations.iter().any(
        |v| v.kind() == pb::ViolationKind::AnchorMissing && v.missing_terms.contains(&missing)
    ));

    // The same plan is still current (an aborted commit changes nothing):
    // with every anchor, it commits and shows in the context.
    let good = format!(
        "Fourteen builds of the svc crates failed on type errors. Anchors: {}.",
        draft.anchors.join(" ; ")
    );
    let done = commit(&mut client, "hook", &planned.plan_id, Some(good.clone()))
        .await
        .expect("commits");
    let marker = done.marker.unwrap();
    assert_eq!(marker.trigger(), pb::CompactionTrigger::Manual);
    assert_eq!(marker.actor, "reviewer-7");
    assert_eq!(marker.evicted_span_ids.len(), planned.evicted.len());
    let ctx = context(&mut client, "hook").await;
    let summary = ctx
        .spans
        .iter()
        .find(|s| s.span_class() == pb::SpanClass::Summary)
        .expect("the caller's summary is live");
    assert_eq!(summary.text, good);
    assert_eq!(Some(summary.span_id), marker.summary_span_id);
    assert!(
        ctx.spans
            .iter()
            .all(|s| !marker.evicted_span_ids.contains(&s.span_id))
    );
}

#[tokio::test]
async fn approval_mode_refuses_with_a_ready_plan() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(
        &mut client,
        "approve",
        pb::SessionConfig {
            mode: pb::SessionMode::Approval as i32,
            ..window(1200)
        },
    )
    .await;
    let mut i = 0;
    let (status, turn) = loop {
        i += 1;
        let turn = tool_output(i);
        match admit(&mut client, "approve", vec![span(Role::Tool, &turn)]).await {
            Ok(reply) => assert!(reply.compaction.is_none(), "never compacts on its own"),
            Err(status) => break (status, turn),
        }
    };
    assert_eq!(status.code(), Code::FailedPrecondition);
    let (reason, meta) = error_info(&status);
    assert_eq!(reason, "APPROVAL_REQUIRED");
    let plan_id = meta["plan_id"].clone();
    let done = commit(&mut client, "approve", &plan_id, None)
        .await
        .expect("the ready plan commits");
    assert_eq!(
        done.marker.unwrap().trigger(),
        pb::CompactionTrigger::Manual
    );
    let reply = admit(&mut client, "approve", vec![span(Role::Tool, &turn)])
        .await
        .expect("the turn fits now");
    assert!(reply.compaction.is_none());
}

#[tokio::test]
async fn caller_only_sessions_switch_to_approval_on_an_unclassified_span() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(
        &mut client,
        "caller",
        pb::SessionConfig {
            classifier: pb::ClassifierMode::CallerOnly as i32,
            ..window(1200)
        },
    )
    .await;
    admit(
        &mut client,
        "caller",
        vec![classed(
            Role::Tool,
            pb::SpanClass::Narrative,
            &tool_output(0),
        )],
    )
    .await
    .unwrap();
    let caller = session(&mut client, "caller").await;
    assert!(!caller.approval_required);
    admit(
        &mut client,
        "caller",
        vec![span(Role::User, "Keep going with the build fixes.")],
    )
    .await
    .unwrap();
    let caller = session(&mut client, "caller").await;
    assert!(
        caller.approval_required,
        "an unclassified span forces approval"
    );
    let status = loop {
        match admit(
            &mut client,
            "caller",
            vec![classed(
                Role::Tool,
                pb::SpanClass::Narrative,
                &tool_output(7),
            )],
        )
        .await
        {
            Ok(reply) => assert!(reply.compaction.is_none()),
            Err(status) => break status,
        }
    };
    assert_eq!(error_info(&status).0, "APPROVAL_REQUIRED");
}

#[tokio::test]
async fn pinned_spans_stay_until_unpinned_and_the_unpin_is_recorded() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "pins", window(900)).await;
    let note = "Deploys go through the blue cluster this week.";
    let first = admit(&mut client, "pins", vec![span(Role::Assistant, note)])
        .await
        .unwrap();
    let id = first.spans[0].span_id;
    assert_eq!(first.spans[0].span_class(), pb::SpanClass::Narrative);
    let pinned = client
        .pin(pb::PinRequest {
            session_id: "pins".into(),
            span_id: id,
            predicate: Some(pb::Predicate {
                modality: pb::Modality::Requirement as i32,
                required_terms: vec!["blue".into(), "cluster".into()],
                source: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .span
        .unwrap();
    assert_eq!(pinned.span_class(), pb::SpanClass::Constraint);
    assert_eq!(
        pinned.predicate.unwrap().required_terms,
        ["blue", "cluster"]
    );

    // A pin with a term the text lacks is refused by field.
    let status = client
        .pin(pb::PinRequest {
            session_id: "pins".into(),
            span_id: id,
            predicate: Some(pb::Predicate {
                required_terms: vec!["green".into()],
                ..Default::default()
            }),
        })
        .await
        .expect_err("a term not in the text");
    assert_eq!(status.code(), Code::InvalidArgument);

    let mut compactions = 0;
    for i in 0..20 {
        let reply = admit(&mut client, "pins", vec![span(Role::Tool, &tool_output(i))])
            .await
            .unwrap();
        if let Some(m) = reply.compaction {
            assert!(!m.evicted_span_ids.contains(&id));
            compactions += 1;
        }
    }
    assert!(compactions > 0);
    assert!(
        context(&mut client, "pins")
            .await
            .spans
            .iter()
            .any(|s| s.span_id == id)
    );

    // Unpin needs who and why, and records both.
    let status = client
        .unpin(pb::UnpinRequest {
            session_id: "pins".into(),
            span_id: id,
            actor: String::new(),
            reason: "done".into(),
        })
        .await
        .expect_err("no actor");
    assert_eq!(status.code(), Code::InvalidArgument);
    let unpinned = client
        .unpin(pb::UnpinRequest {
            session_id: "pins".into(),
            span_id: id,
            actor: "ops-lead".into(),
            reason: "the blue cluster freeze is over".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        unpinned.span.unwrap().span_class(),
        pb::SpanClass::Narrative
    );
    let marker = unpinned.marker.unwrap();
    assert_eq!(marker.trigger(), pb::CompactionTrigger::Unpin);
    assert_eq!(marker.actor, "ops-lead");
    assert!(
        marker.detail.contains("freeze is over"),
        "{}",
        marker.detail
    );
    // Now it may go like any narrative.
    let mut gone = false;
    for i in 20..60 {
        let reply = admit(&mut client, "pins", vec![span(Role::Tool, &tool_output(i))])
            .await
            .unwrap();
        if reply
            .compaction
            .is_some_and(|m| m.evicted_span_ids.contains(&id))
        {
            gone = true;
            break;
        }
    }
    assert!(gone, "an unpinned span is evictable");
}

#[tokio::test]
async fn the_soft_watermark_makes_room_in_the_background() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "soft", defaults(2000)).await;
    let mut watch = client
        .watch_compactions(pb::WatchCompactionsRequest {
            session_ids: vec!["soft".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let soft_session = session(&mut client, "soft").await;
    let soft = soft_session.totals.unwrap().soft_watermark_tokens;
    let mut i = 0;
    loop {
        i += 1;
        let reply = admit(&mut client, "soft", vec![span(Role::Tool, &tool_output(i))])
            .await
            .unwrap();
        assert!(
            reply.compaction.is_none(),
            "the budget is never reached first"
        );
        if reply.totals.unwrap().live_tokens > soft {
            break;
        }
    }
    let markers = read_markers(&mut watch, 1).await;
    let m = &markers[0];
    assert_eq!(m.trigger(), pb::CompactionTrigger::SoftWatermark);
    assert_eq!(m.incoming_tokens, 0);
    assert!(m.tokens_after <= soft, "{m:?}");
    let ctx = context(&mut client, "soft").await;
    assert!(ctx.totals.unwrap().live_tokens <= soft);
}

#[tokio::test]
async fn the_staleness_guard_sleeps_while_idle_and_fires_while_busy() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let hybrid = |w| pb::SessionConfig {
        trigger: pb::TriggerPolicy::Hybrid as i32,
        staleness_interval_ms: Some(1000),
        ..window(w)
    };
    create(&mut client, "idle", hybrid(100_000)).await;
    create(&mut client, "busy", hybrid(100_000)).await;
    let mut watch = client
        .watch_compactions(pb::WatchCompactionsRequest::default())
        .await
        .unwrap()
        .into_inner();

    // "idle" admits once, is compacted once by staleness, then sits idle.
    admit(&mut client, "idle", vec![span(Role::Tool, &chatter(1))])
        .await
        .unwrap();
    admit(&mut client, "idle", vec![span(Role::Tool, &chatter(2))])
        .await
        .unwrap();
    // "busy" keeps admitting small turns for the whole test.
    let mut busy_markers = 0;
    let mut idle_markers = Vec::new();
    let started = tokio::time::Instant::now();
    let mut n = 10;
    while started.elapsed() < Duration::from_secs(7) {
        n += 1;
        admit(&mut client, "busy", vec![span(Role::Tool, &chatter(n))])
            .await
            .unwrap();
        // Drain what arrived; stop at the first quiet 150 ms.
        loop {
            match tokio::time::timeout(Duration::from_millis(150), watch.message()).await {
                Ok(Ok(Some(event))) => {
                    if let Some(pb::watch_compactions_response::Event::Marker(m)) = event.event {
                        assert_eq!(m.trigger(), pb::CompactionTrigger::Staleness, "{m:?}");
                        match m.session_id.as_str() {
                            "busy" => busy_markers += 1,
                            _ => idle_markers.push(m),
                        }
                    }
                }
                Ok(other) => panic!("the watch ended: {other:?}"),
                Err(_) => break,
            }
        }
    }
    assert!(
        busy_markers >= 2,
        "a busy session gets staleness compactions ({busy_markers})"
    );
    // The idle session: one compaction of what it admitted, then nothing
    // for the 5 s and more it sat idle.
    assert_eq!(idle_markers.len(), 1, "{idle_markers:?}");
    let at = idle_markers[0].at.as_ref().unwrap();
    let idle_for = now_unix_s() - at.seconds;
    assert!(
        idle_for >= 5,
        "idle for {idle_for} s after its last compaction"
    );
}

#[tokio::test]
async fn the_staleness_guard_outlives_a_restart() {
    // A session that admitted and was never compacted is due once its
    // interval has passed, even if the daemon was down meanwhile and
    // nothing has touched the session since. The daemon stays down until
    // every span but the latest is older than the interval, so the one
    // compaction after the start evicts exactly those two.
    let interval = Duration::from_millis(2000);
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(
        &mut client,
        "after",
        pb::SessionConfig {
            trigger: pb::TriggerPolicy::Hybrid as i32,
            staleness_interval_ms: Some(interval.as_millis() as u64),
            ..window(100_000)
        },
    )
    .await;
    for i in 0..3 {
        admit(&mut client, "after", vec![span(Role::Tool, &chatter(i))])
            .await
            .unwrap();
    }
    let admitted = std::time::Instant::now();
    daemon.kill9();
    tokio::time::sleep_until((admitted + interval + Duration::from_millis(200)).into()).await;
    daemon.restart().await;
    let mut client = daemon.client().await;
    let mut watch = client
        .watch_compactions(pb::WatchCompactionsRequest {
            session_ids: vec!["after".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let marker = tokio::time::timeout(Duration::from_secs(10), read_markers(&mut watch, 1))
        .await
        .expect("a staleness compaction within 10 s of the restart");
    assert_eq!(marker[0].trigger(), pb::CompactionTrigger::Staleness);
    assert_eq!(marker[0].evicted_span_ids.len(), 2, "{:?}", marker[0]);
}

#[tokio::test]
async fn select_trigger_answers_for_the_seed_numbers() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let ask = |single, per_interval, idle_gaps| pb::SelectTriggerRequest {
        workload: Some(pb::DeclaredWorkload {
            window_tokens: 200_000,
            alpha: 0.85,
            reserved_overhead_tokens: 0,
            cadence_ms: 90_000,
            max_single_injection_tokens: single,
            max_interval_accumulation_tokens: per_interval,
            idle_gaps,
        }),
    };
    let bursty = client
        .select_trigger(ask(120_000, 120_000, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bursty.recommended(), pb::TriggerPolicy::TokenBudget);
    assert!(!bursty.time_based_sound);
    assert_eq!(bursty.headroom_tokens, 30_000);
    assert!(
        bursty
            .reasons
            .iter()
            .any(|r| r.contains("120000") || r.contains("120,000")),
        "{:?}",
        bursty.reasons
    );
    let steady = client
        .select_trigger(ask(1_000, 2_000, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(steady.recommended(), pb::TriggerPolicy::TimeBased);
    assert!(steady.time_based_sound);
}
