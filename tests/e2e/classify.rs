//! Unlabelled spans through the daemon: the classifier's verdict and its
//! explanation travel with the span (Admit, GetContext, GetSpan) under
//! either classifier mode, and a session's tuning (pin threshold, phrases)
//! is applied at admission, survives a restart, and can be changed.

use ctxbroker_proto::v1 as pb;
use pb::Role;

use crate::support::*;

fn tuned(phrases: &[&str], threshold: Option<f64>) -> pb::SessionConfig {
    pb::SessionConfig {
        classifier: pb::ClassifierMode::Model as i32,
        classifier_tuning: Some(pb::ClassifierTuning {
            pin_threshold: threshold,
            pin_phrases: phrases.iter().map(|p| p.to_string()).collect(),
            protected_fraction: None,
        }),
        ..window(4_000)
    }
}

async fn admitted_class(
    client: &mut pb::context_broker_client::ContextBrokerClient<tonic::transport::Channel>,
    id: &str,
    text: &str,
) -> pb::Span {
    let reply = admit(client, id, vec![span(Role::User, text)])
        .await
        .expect("admitted");
    reply.spans.into_iter().next().expect("one span")
}

#[tokio::test]
async fn verdicts_are_explained_and_sessions_tune_them() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;

    // The modal rules when asked for, naming their phrase.
    create(
        &mut client,
        "rules",
        pb::SessionConfig {
            classifier: pb::ClassifierMode::Rules as i32,
            ..window(4_000)
        },
    )
    .await;
    let ruled = admitted_class(&mut client, "rules", "Never write to the prod namespace.").await;
    assert_eq!(ruled.span_class(), pb::SpanClass::Constraint);
    assert_eq!(ruled.class_rule, "prohibition:never");
    let missed = admitted_class(&mut client, "rules", "No tabs, anywhere.").await;
    assert_eq!(missed.span_class(), pb::SpanClass::Narrative, "{missed:?}");

    // The model by default, explained.
    create(&mut client, "plain", window(4_000)).await;
    let ban_noun = admitted_class(&mut client, "plain", "No tabs, anywhere.").await;
    assert_eq!(
        ban_noun.span_class(),
        pb::SpanClass::Constraint,
        "{ban_noun:?}"
    );
    assert!(
        ban_noun.class_rule.contains("+noun_ban"),
        "{}",
        ban_noun.class_rule
    );
    let ban = admitted_class(&mut client, "plain", "Never write to the prod namespace.").await;
    assert_eq!(ban.span_class(), pb::SpanClass::Constraint, "{ban:?}");
    assert_eq!(ban.class_source(), pb::ClassSource::Rules);
    assert!(
        ban.class_rule.starts_with("standing "),
        "{}",
        ban.class_rule
    );
    let tool = admit(
        &mut client,
        "plain",
        vec![span(Role::Tool, "error: you must never call this twice")],
    )
    .await
    .unwrap();
    assert_eq!(tool.spans[0].span_class(), pb::SpanClass::Narrative);
    assert_eq!(tool.spans[0].class_rule, "role:tool");
    let live = context(&mut client, "plain").await;
    let live_ban = live
        .spans
        .iter()
        .find(|s| s.span_id == ban.span_id)
        .expect("the ban is live");
    assert_eq!(live_ban.class_rule, ban.class_rule);
    let got = client
        .get_span(pb::GetSpanRequest {
            session_id: "plain".into(),
            span_id: ban.span_id,
        })
        .await
        .unwrap()
        .into_inner()
        .span
        .unwrap();
    assert_eq!(got.class_rule, ban.class_rule);

    // The threshold in force is shown.
    let shown = session(&mut client, "plain").await;
    let threshold = shown
        .config
        .as_ref()
        .and_then(|c| c.classifier_tuning.as_ref())
        .and_then(|t| t.pin_threshold)
        .expect("the threshold in force");
    assert!(threshold > 0.0 && threshold < 1.0, "{threshold}");

    // A session's phrase pins, under either mode.
    let chatter = "house rule: tickets get a link to their PR.";
    create(&mut client, "tuned", tuned(&["house rule"], None)).await;
    let pinned = admitted_class(&mut client, "tuned", chatter).await;
    assert_eq!(pinned.span_class(), pb::SpanClass::Constraint);
    assert!(
        pinned.class_rule.contains("+phrase:\"house rule\""),
        "{}",
        pinned.class_rule
    );
    let by_rules = pb::SessionConfig {
        classifier: pb::ClassifierMode::Rules as i32,
        ..tuned(&["house rule"], None)
    };
    create(&mut client, "tuned-rules", by_rules).await;
    let pinned = admitted_class(&mut client, "tuned-rules", chatter).await;
    assert_eq!(pinned.span_class(), pb::SpanClass::Constraint);
    assert_eq!(pinned.class_rule, "phrase:\"house rule\"");

    // A threshold nothing reaches pins nothing, and survives a restart.
    create(&mut client, "strict", tuned(&[], Some(0.999_999_9))).await;
    daemon.restart().await;
    let mut client = daemon.client().await;
    let strict = session(&mut client, "strict").await;
    assert_eq!(
        strict
            .config
            .and_then(|c| c.classifier_tuning)
            .and_then(|t| t.pin_threshold),
        Some(0.999_999_9)
    );
    let doubted = admitted_class(&mut client, "strict", "Never write to the prod namespace.").await;
    // Below the pin threshold, it is doubtful: the standing-instructions
    // tier keeps it.
    assert_eq!(
        doubted.span_class(),
        pb::SpanClass::Protected,
        "{doubted:?}"
    );
    assert!(
        doubted.class_rule.starts_with("doubtful "),
        "{}",
        doubted.class_rule
    );

    // Tuning changes on update, for later turns.
    client
        .update_session(pb::UpdateSessionRequest {
            session_id: "strict".into(),
            config: Some(pb::SessionConfig {
                classifier_tuning: Some(pb::ClassifierTuning {
                    pin_threshold: None,
                    pin_phrases: vec!["prod namespace".into()],
                    protected_fraction: None,
                }),
                ..Default::default()
            }),
        })
        .await
        .expect("UpdateSession succeeds");
    let again = admitted_class(
        &mut client,
        "strict",
        "writes to the prod namespace are out",
    )
    .await;
    assert_eq!(again.span_class(), pb::SpanClass::Constraint, "{again:?}");
}
