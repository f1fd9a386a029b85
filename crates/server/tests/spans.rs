//! Tracing spans: every RPC handler, and the plan, verify and commit steps
//! under it, carry the session id and the turn, so that one slow admission
//! can be followed through the logs.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use ctxbroker_proto::v1 as pb;
use ctxbroker_proto::v1::context_broker_server::ContextBroker;
use ctxbroker_server::BuildInfo;
use ctxbroker_server::broker::Broker;
use ctxbroker_server::config::{Durability, Limits};
use ctxbroker_server::hub::Hub;
use ctxbroker_server::service::BrokerService;
use ctxbroker_store::{Store, StoreOptions};
use tokio_util::sync::CancellationToken;
use tonic::Request;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as it stood when it was last recorded to.
#[derive(Debug, Clone)]
struct Captured {
    id: u64,
    name: &'static str,
    fields: BTreeMap<String, String>,
}

/// A layer that keeps every span's name and fields.
#[derive(Debug, Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Captured {
            id: id.into_u64(),
            name: attrs.metadata().name(),
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some(span) = spans.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
}

impl Capture {
    /// The spans named `name`, as (session_id, turn) pairs.
    fn named(&self, name: &str) -> Vec<(String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name)
            .map(|s| {
                let get = |f: &str| s.fields.get(f).cloned().unwrap_or_default();
                (get("session_id"), get("turn"))
            })
            .collect()
    }
}

const BUILD: BuildInfo = BuildInfo {
    version: "test",
    git_commit: "test",
    contract_digest: "test",
};

#[tokio::test(flavor = "current_thread")]
async fn handlers_and_the_plan_verify_and_commit_steps_carry_session_and_turn() {
    let capture = Capture::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let broker = Arc::new(Broker::new(store, Limits::default()));
    let service = BrokerService::new(
        broker,
        Hub::new(),
        CancellationToken::new(),
        BUILD,
        Durability::Flush,
    );
    service
        .create_session(Request::new(pb::CreateSessionRequest {
            session_id: "traced".into(),
            config: Some(pb::SessionConfig {
                window_tokens: Some(400),
                soft_watermark: Some(1.0),
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
    for turn in 1..=3 {
        let reply = service
            .admit(Request::new(pb::AdmitRequest {
                session_id: "traced".into(),
                spans: vec![pb::SpanInput {
                    role: pb::Role::Tool as i32,
                    text: format!("tool run {turn}: {}", "compiler output line ".repeat(10)),
                    ..Default::default()
                }],
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.turn, turn);
    }
    let plan = service
        .plan_compaction(Request::new(pb::PlanCompactionRequest {
            session_id: "traced".into(),
            incoming_tokens: 0,
            target_tokens: Some(50),
        }))
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap();
    service
        .commit_compaction(Request::new(pb::CommitCompactionRequest {
            session_id: "traced".into(),
            plan_id: plan.plan_id,
            actor: "test".into(),
            ..Default::default()
        }))
        .await
        .unwrap();

    let at = |turn: u64| ("traced".to_owned(), turn.to_string());
    assert_eq!(capture.named("create_session"), [at(0)]);
    assert_eq!(capture.named("admit"), [at(1), at(2), at(3)]);
    // Each admission plans (and verifies) within the session's turn, then
    // commits to the store; the caller's commit is verified and committed.
    assert_eq!(capture.named("plan"), [at(1), at(2), at(3), at(3)]);
    assert_eq!(capture.named("plan_compaction"), [at(3)]);
    assert_eq!(capture.named("verify"), [at(3)]);
    assert_eq!(capture.named("commit_compaction"), [at(3)]);
    assert_eq!(capture.named("commit"), [at(1), at(2), at(3), at(3)]);
}
