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

/// One hostile or malformed request of the table.
enum Req {
    Create(pb::CreateSessionRequest),
    Update(pb::UpdateSessionRequest),
    Delete(pb::DeleteSessionRequest),
    Admit(pb::AdmitRequest),
    Context(pb::GetContextRequest),
    Span(pb::GetSpanRequest),
    Plan(pb::PlanCompactionRequest),
    Commit(pb::CommitCompactionRequest),
    Pin(pb::PinRequest),
    Unpin(pb::UnpinRequest),
    Watch(pb::WatchCompactionsRequest),
    Select(pb::SelectTriggerRequest),
}

async fn send(
    client: &mut pb::context_broker_client::ContextBrokerClient<tonic::transport::Channel>,
    req: Req,
) -> Result<(), tonic::Status> {
    match req {
        Req::Create(r) => client.create_session(r).await.map(drop),
        Req::Update(r) => client.update_session(r).await.map(drop),
        Req::Delete(r) => client.delete_session(r).await.map(drop),
        Req::Admit(r) => client.admit(r).await.map(drop),
        Req::Context(r) => client.get_context(r).await.map(drop),
        Req::Span(r) => client.get_span(r).await.map(drop),
        Req::Plan(r) => client.plan_compaction(r).await.map(drop),
        Req::Commit(r) => client.commit_compaction(r).await.map(drop),
        Req::Pin(r) => client.pin(r).await.map(drop),
        Req::Unpin(r) => client.unpin(r).await.map(drop),
        Req::Watch(r) => client.watch_compactions(r).await.map(drop),
        Req::Select(r) => client.select_trigger(r).await.map(drop),
    }
}

/// Whether a status names `field` (if any) in its details and message.
fn named(status: &tonic::Status, field: &str) -> bool {
    field.is_empty()
        || (fields(status).iter().any(|f| f == field) && status.message().contains(field))
}

fn turn_of(id: &str, spans: Vec<pb::SpanInput>) -> Req {
    Req::Admit(pb::AdmitRequest {
        session_id: id.into(),
        spans,
    })
}

#[tokio::test]
async fn a_table_of_hostile_requests_gets_documented_statuses_and_writes_nothing() {
    let daemon = Daemon::start_with(&["--max-span-bytes", "4096"]).await;
    let mut client = daemon.client().await;
    create(&mut client, "t", window(2000)).await;
    create(&mut client, "other", window(2000)).await;
    let admitted = admit(
        &mut client,
        "t",
        vec![
            keyed(Role::User, "Never touch the `prod` namespace.", "k1"),
            keyed(Role::Tool, &prose(1, &["build"], 40), "k2"),
        ],
    )
    .await
    .unwrap();
    let constraint_id = admitted.spans[0].span_id;
    let narrative_id = admitted.spans[1].span_id;
    for n in 2..6 {
        admit(
            &mut client,
            "other",
            vec![span(Role::Tool, &prose(n, &["deploy"], 40))],
        )
        .await
        .unwrap();
    }
    let theirs = client
        .plan_compaction(pb::PlanCompactionRequest {
            session_id: "other".into(),
            incoming_tokens: 0,
            target_tokens: Some(50),
        })
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap()
        .plan_id;
    let max_spans = client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .limits
        .unwrap()
        .max_spans_per_turn as usize;
    let before = state(&mut client).await;
    let context_before = context(&mut client, "t").await;

    let config = |f: &dyn Fn(&mut pb::SessionConfig)| {
        let mut c = window(1000);
        f(&mut c);
        Req::Create(create_req("new", c))
    };
    let workload = |f: &dyn Fn(&mut pb::DeclaredWorkload)| {
        let mut w = pb::DeclaredWorkload {
            window_tokens: 200_000,
            alpha: 0.85,
            cadence_ms: 90_000,
            max_single_injection_tokens: 1_000,
            max_interval_accumulation_tokens: 2_000,
            ..Default::default()
        };
        f(&mut w);
        Req::Select(pb::SelectTriggerRequest { workload: Some(w) })
    };
    let commit = |plan_id: &str, f: &dyn Fn(&mut pb::CommitCompactionRequest)| {
        let mut r = pb::CommitCompactionRequest {
            session_id: "t".into(),
            plan_id: plan_id.into(),
            actor: "ops".into(),
            ..Default::default()
        };
        f(&mut r);
        Req::Commit(r)
    };
    use Code::{Aborted, FailedPrecondition, InvalidArgument, NotFound};
    let table: Vec<(&str, Req, Code, &str)> = vec![
        (
            "soft watermark 0",
            config(&|c| c.soft_watermark = Some(0.0)),
            InvalidArgument,
            "config.soft_watermark",
        ),
        (
            "soft watermark above 1",
            config(&|c| c.soft_watermark = Some(1.5)),
            InvalidArgument,
            "config.soft_watermark",
        ),
        (
            "negative relevance floor",
            config(&|c| c.relevance_floor = Some(-0.1)),
            InvalidArgument,
            "config.relevance_floor",
        ),
        (
            "NaN relevance floor",
            config(&|c| c.relevance_floor = Some(f64::NAN)),
            InvalidArgument,
            "config.relevance_floor",
        ),
        (
            "zero summary generations",
            config(&|c| c.max_summary_generations = Some(0)),
            InvalidArgument,
            "config.max_summary_generations",
        ),
        (
            "unknown tokenizer",
            config(&|c| c.tokenizer = 99),
            InvalidArgument,
            "config.tokenizer",
        ),
        (
            "unknown classifier",
            config(&|c| c.classifier = 99),
            InvalidArgument,
            "config.classifier",
        ),
        (
            "unknown anchor policy",
            config(&|c| c.anchor_policy = 99),
            InvalidArgument,
            "config.anchor_policy",
        ),
        (
            "unknown mode",
            config(&|c| c.mode = 99),
            InvalidArgument,
            "config.mode",
        ),
        (
            "time-based without a workload",
            config(&|c| {
                c.trigger = pb::TriggerPolicy::TimeBased as i32;
                c.staleness_interval_ms = Some(60_000);
            }),
            InvalidArgument,
            "config.workload",
        ),
        (
            "negative relevance weight",
            config(&|c| {
                c.relevance = Some(pb::RelevanceWeights {
                    recency: Some(-1.0),
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.relevance.recency",
        ),
        (
            "pin threshold of 1",
            config(&|c| {
                c.classifier_tuning = Some(pb::ClassifierTuning {
                    pin_threshold: Some(1.0),
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.classifier_tuning.pin_threshold",
        ),
        (
            "NaN pin threshold",
            config(&|c| {
                c.classifier_tuning = Some(pb::ClassifierTuning {
                    pin_threshold: Some(f64::NAN),
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.classifier_tuning.pin_threshold",
        ),
        (
            "33 pin phrases",
            config(&|c| {
                c.classifier_tuning = Some(pb::ClassifierTuning {
                    pin_phrases: (0..33).map(|i| format!("rule {i}")).collect(),
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.classifier_tuning.pin_phrases",
        ),
        (
            "a blank pin phrase",
            config(&|c| {
                c.classifier_tuning = Some(pb::ClassifierTuning {
                    pin_phrases: vec!["house rule".into(), "  ".into()],
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.classifier_tuning.pin_phrases",
        ),
        (
            "a pin phrase of 129 bytes",
            config(&|c| {
                c.classifier_tuning = Some(pb::ClassifierTuning {
                    pin_phrases: vec!["x".repeat(129)],
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.classifier_tuning.pin_phrases",
        ),
        (
            "a tier share above one half",
            config(&|c| {
                c.classifier_tuning = Some(pb::ClassifierTuning {
                    protected_fraction: Some(0.75),
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.classifier_tuning.protected_fraction",
        ),
        (
            "NaN half-life",
            config(&|c| {
                c.relevance = Some(pb::RelevanceWeights {
                    recency_half_life_turns: Some(f64::NAN),
                    ..Default::default()
                })
            }),
            InvalidArgument,
            "config.relevance.recency_half_life_turns",
        ),
        (
            "update of an unknown session",
            Req::Update(pb::UpdateSessionRequest {
                session_id: "ghost".into(),
                config: Some(window(1000)),
            }),
            NotFound,
            "",
        ),
        (
            "update that changes the tokenizer",
            Req::Update(pb::UpdateSessionRequest {
                session_id: "t".into(),
                config: Some(pb::SessionConfig {
                    tokenizer: pb::TokenizerKind::Cl100kBase as i32,
                    ..Default::default()
                }),
            }),
            InvalidArgument,
            "config.tokenizer",
        ),
        (
            "delete of an unknown session",
            Req::Delete(pb::DeleteSessionRequest {
                session_id: "ghost".into(),
            }),
            NotFound,
            "",
        ),
        (
            "one span more than max_spans_per_turn",
            turn_of("t", vec![span(Role::Tool, "x"); max_spans + 1]),
            InvalidArgument,
            "spans",
        ),
        (
            "NaN relevance hint",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    relevance_hint: Some(f64::NAN),
                    ..span(Role::Tool, "x")
                }],
            ),
            InvalidArgument,
            "spans[0].relevance_hint",
        ),
        (
            "negative relevance hint",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    relevance_hint: Some(-1.0),
                    ..span(Role::Tool, "x")
                }],
            ),
            InvalidArgument,
            "spans[0].relevance_hint",
        ),
        (
            "unknown role",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    role: 99,
                    ..span(Role::Tool, "x")
                }],
            ),
            InvalidArgument,
            "spans[0].role",
        ),
        (
            "unknown span class",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    span_class: 42,
                    ..span(Role::Tool, "x")
                }],
            ),
            InvalidArgument,
            "spans[0].span_class",
        ),
        (
            "predicate on narrative",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    predicate: Some(pb::Predicate::default()),
                    ..classed(Role::Tool, pb::SpanClass::Narrative, "x")
                }],
            ),
            InvalidArgument,
            "spans[0].predicate",
        ),
        (
            "predicate term not in the text",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    predicate: Some(pb::Predicate {
                        required_terms: vec!["staging".into()],
                        ..Default::default()
                    }),
                    ..classed(
                        Role::User,
                        pb::SpanClass::Constraint,
                        "Never write to prod.",
                    )
                }],
            ),
            InvalidArgument,
            "spans[0].predicate.required_terms[0]",
        ),
        (
            "unknown predicate modality",
            turn_of(
                "t",
                vec![pb::SpanInput {
                    predicate: Some(pb::Predicate {
                        modality: 9,
                        ..Default::default()
                    }),
                    ..classed(
                        Role::User,
                        pb::SpanClass::Constraint,
                        "Never write to prod.",
                    )
                }],
            ),
            InvalidArgument,
            "spans[0].predicate.modality",
        ),
        (
            "a span just past max_span_bytes",
            turn_of("t", vec![span(Role::Tool, &"z".repeat(4097))]),
            InvalidArgument,
            "spans[0].text",
        ),
        (
            "idempotency key reused for other content",
            turn_of(
                "t",
                vec![
                    keyed(Role::User, "Never touch staging.", "k1"),
                    keyed(Role::Tool, "other", "k2"),
                ],
            ),
            InvalidArgument,
            "spans[0].idempotency_key",
        ),
        (
            "idempotency key with a space",
            turn_of("t", vec![keyed(Role::Tool, "x", "a b")]),
            InvalidArgument,
            "spans[0].idempotency_key",
        ),
        (
            "idempotency key repeated in a turn",
            turn_of(
                "t",
                vec![keyed(Role::Tool, "x", "k9"), keyed(Role::Tool, "y", "k9")],
            ),
            InvalidArgument,
            "spans[1].idempotency_key",
        ),
        (
            "context of an unknown session",
            Req::Context(pb::GetContextRequest {
                session_id: "ghost".into(),
            }),
            NotFound,
            "",
        ),
        (
            "span of a malformed session id",
            Req::Span(pb::GetSpanRequest {
                session_id: "bad id".into(),
                span_id: 1,
            }),
            InvalidArgument,
            "session_id",
        ),
        (
            "plan for an unknown session",
            Req::Plan(pb::PlanCompactionRequest {
                session_id: "ghost".into(),
                ..Default::default()
            }),
            NotFound,
            "",
        ),
        (
            "commit of a malformed plan id",
            commit("p1.x", &|_| {}),
            InvalidArgument,
            "plan_id",
        ),
        (
            "commit of another session's plan",
            commit(&theirs, &|_| {}),
            Aborted,
            "",
        ),
        (
            "commit with two forms for one span",
            commit(&theirs, &|r| {
                r.compressed_forms = vec![
                    pb::CompressedForm {
                        span_id: 1,
                        text: "a".into(),
                        ..Default::default()
                    },
                    pb::CompressedForm {
                        span_id: 1,
                        text: "b".into(),
                        ..Default::default()
                    },
                ]
            }),
            InvalidArgument,
            "compressed_forms[1].span_id",
        ),
        (
            "commit with an oversized summary",
            commit(&theirs, &|r| r.summary_text = Some("s".repeat(4097))),
            InvalidArgument,
            "summary_text",
        ),
        (
            "pin of an unknown span",
            Req::Pin(pb::PinRequest {
                session_id: "t".into(),
                span_id: 999,
                predicate: None,
            }),
            NotFound,
            "",
        ),
        (
            "pin with an unknown modality",
            Req::Pin(pb::PinRequest {
                session_id: "t".into(),
                span_id: narrative_id,
                predicate: Some(pb::Predicate {
                    modality: 77,
                    ..Default::default()
                }),
            }),
            InvalidArgument,
            "predicate.modality",
        ),
        (
            "unpin without a reason",
            Req::Unpin(pb::UnpinRequest {
                session_id: "t".into(),
                span_id: constraint_id,
                actor: "ops".into(),
                reason: String::new(),
            }),
            InvalidArgument,
            "reason",
        ),
        (
            "unpin of narrative",
            Req::Unpin(pb::UnpinRequest {
                session_id: "t".into(),
                span_id: narrative_id,
                actor: "ops".into(),
                reason: "why".into(),
            }),
            FailedPrecondition,
            "",
        ),
        (
            "watch from beyond the head",
            Req::Watch(pb::WatchCompactionsRequest {
                from_seq: 1_000_000,
                ..Default::default()
            }),
            InvalidArgument,
            "from_seq",
        ),
        (
            "watch with a malformed session filter",
            Req::Watch(pb::WatchCompactionsRequest {
                session_ids: vec!["no good".into()],
                ..Default::default()
            }),
            InvalidArgument,
            "session_ids[0]",
        ),
        (
            "select trigger without a workload",
            Req::Select(pb::SelectTriggerRequest { workload: None }),
            InvalidArgument,
            "workload",
        ),
        (
            "select trigger with NaN alpha",
            workload(&|w| w.alpha = f64::NAN),
            InvalidArgument,
            "workload.alpha",
        ),
        (
            "select trigger with no window",
            workload(&|w| w.window_tokens = 0),
            InvalidArgument,
            "workload.window_tokens",
        ),
    ];
    assert!(table.len() >= 30, "{} cases", table.len());
    let mut wrong = Vec::new();
    for (name, req, code, field) in table {
        match send(&mut client, req).await {
            Ok(()) => wrong.push(format!("{name}: accepted")),
            Err(status) => {
                if status.code() != code {
                    wrong.push(format!(
                        "{name}: {:?} instead of {code:?}: {}",
                        status.code(),
                        status.message()
                    ));
                } else if !named(&status, field) {
                    wrong.push(format!(
                        "{name}: {field} not named: {:?} {}",
                        fields(&status),
                        status.message()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // The daemon is up, and nothing the table sent was written.
    let (sessions, next_seq) = state(&mut client).await;
    assert_eq!(
        sessions.iter().find(|s| s.session_id == "t"),
        before.0.iter().find(|s| s.session_id == "t")
    );
    assert!(sessions.iter().all(|s| s.session_id != "new"));
    assert_eq!(next_seq, before.1);
    assert_eq!(context(&mut client, "t").await, context_before);

    // Pathological text for the tokenizer is ordinary input: admitted
    // (its counting cost is measured in the tokenizer's benchmarks).
    create(&mut client, "big", window(100_000)).await;
    for text in [
        "a".repeat(4096),
        " ".repeat(4096),
        "9".repeat(4096),
        "\u{1F980}".repeat(1024),
    ] {
        admit(&mut client, "big", vec![span(Role::Tool, &text)])
            .await
            .unwrap_or_else(|s| panic!("{s:?}"));
    }
}
