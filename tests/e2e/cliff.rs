//! The compaction cliff: an old, short, off-topic constraint admitted
//! without a class must survive every compaction.

use ctxbroker_proto::v1 as pb;
use pb::Role;

use crate::support::*;

const CONSTRAINT: &str = "Never write to the `prod` namespace; stage only.";

#[tokio::test]
async fn an_unclassified_constraint_survives_many_compactions() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let session = create(&mut client, "cliff", defaults(1500)).await;
    let budget = session.totals.unwrap().budget_tokens;

    let first = admit(&mut client, "cliff", vec![span(Role::User, CONSTRAINT)])
        .await
        .unwrap();
    let pinned = &first.spans[0];
    assert_eq!(pinned.span_class(), pb::SpanClass::Constraint, "{pinned:?}");
    assert_eq!(pinned.class_source(), pb::ClassSource::Rules);
    assert!(
        pinned.class_rule.starts_with("standing") && pinned.class_rule.contains("+neg_modal"),
        "{}",
        pinned.class_rule
    );
    let pinned_id = pinned.span_id;

    let topic = [
        "staging",
        "kustomize",
        "k8s/staging/deploy.yaml",
        "namespace",
        "refactor",
    ];
    let mut replied = Vec::new();
    for turn in 0..45u64 {
        let (role, words) = match turn % 3 {
            0 => (Role::User, 30),
            1 => (Role::Assistant, 45),
            _ => (Role::Tool, 70),
        };
        let text = format!(
            "Turn {turn}: refactoring the staging manifests. {}",
            prose(turn, &topic, words)
        );
        let reply = admit(&mut client, "cliff", vec![span(role, &text)])
            .await
            .unwrap_or_else(|s| panic!("turn {turn} refused: {s:?}"));
        let totals = reply.totals.unwrap();
        assert!(
            totals.live_tokens <= budget,
            "turn {turn}: live {} exceeds the budget {budget}",
            totals.live_tokens
        );
        replied.extend(reply.compaction);

        let ctx = context(&mut client, "cliff").await;
        let kept = ctx
            .spans
            .iter()
            .find(|s| s.span_id == pinned_id)
            .unwrap_or_else(|| panic!("turn {turn}: the constraint is gone from the context"));
        assert_eq!(kept.text, CONSTRAINT);
        assert_eq!(kept.span_class(), pb::SpanClass::Constraint);
        let live: u32 = ctx.spans.iter().map(|s| s.tokens).sum();
        assert_eq!(live, ctx.totals.unwrap().live_tokens);
        assert!(live <= budget);
    }

    // Every compaction, at admission or in the background ahead of it, is
    // in the durable log; none evicted the constraint.
    let (_stream, compactions) = watch_replay(&mut client, 0).await;
    for marker in &compactions {
        assert_eq!(marker.session_id, "cliff");
        assert_eq!(marker.outcome(), pb::CompactionOutcome::Committed);
        assert!(!marker.evicted_span_ids.is_empty(), "{marker:?}");
        assert!(!marker.evicted_span_ids.contains(&pinned_id));
        assert_eq!(marker.pinned_retained, marker.pinned_total);
        assert!(marker.tokens_after + marker.incoming_tokens <= budget);
    }
    for marker in &replied {
        assert_eq!(compactions.get(marker.seq as usize - 1), Some(marker));
    }
    assert!(
        compactions.len() >= 3,
        "expected several compactions, got {}",
        compactions.len()
    );

    // The constraint is the least relevant span (old, short, off-topic),
    // and it is still there.
    let ctx = context(&mut client, "cliff").await;
    let constraint = ctx.spans.iter().find(|s| s.span_id == pinned_id).unwrap();
    let narrative_min = ctx
        .spans
        .iter()
        .filter(|s| s.span_class() == pb::SpanClass::Narrative)
        .map(|s| s.relevance)
        .fold(f64::INFINITY, f64::min);
    assert!(
        constraint.relevance <= narrative_min,
        "constraint relevance {} vs lowest narrative {narrative_min}",
        constraint.relevance
    );

    // Every compaction is in the durable log, evictions recorded, and each
    // evicted span is readable from the archive.
    for logged in &compactions {
        for id in &logged.evicted_span_ids {
            let archived = client
                .get_span(pb::GetSpanRequest {
                    session_id: "cliff".into(),
                    span_id: *id,
                })
                .await
                .unwrap()
                .into_inner()
                .span
                .unwrap();
            assert_eq!(archived.state(), pb::SpanState::Archived);
            assert_eq!(archived.archived_by_seq, logged.seq);
        }
    }
}

/// A doubtful instruction (here: a clear one under a pin threshold nothing
/// reaches) is neither pinned nor narrative: it stays verbatim in the
/// standing-instructions tier while narrative is evicted around it, and
/// when the session gives the tier no room its eviction is named in the
/// marker.
#[tokio::test]
async fn a_doubtful_instruction_outlives_narrative_and_its_eviction_is_named() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let tuning = |fraction: Option<f64>| pb::ClassifierTuning {
        pin_threshold: Some(0.999_999_9),
        pin_phrases: Vec::new(),
        protected_fraction: fraction,
    };
    let config = pb::SessionConfig {
        classifier_tuning: Some(tuning(None)),
        ..defaults(1500)
    };
    create(&mut client, "tier", config).await;
    let doubt = "No tabs, anywhere.";
    let first = admit(&mut client, "tier", vec![span(Role::User, doubt)])
        .await
        .unwrap();
    let held = &first.spans[0];
    assert_eq!(held.span_class(), pb::SpanClass::Protected, "{held:?}");
    assert!(
        held.class_rule.starts_with("doubtful "),
        "{}",
        held.class_rule
    );
    let held_id = held.span_id;

    let topic = ["staging", "kustomize", "deploy.yaml", "overlay"];
    let filler = |turn: u64| {
        format!(
            "Turn {turn}: the overlay build output. {}",
            prose(turn, &topic, 70)
        )
    };
    for turn in 0..30u64 {
        admit(&mut client, "tier", vec![span(Role::Tool, &filler(turn))])
            .await
            .unwrap_or_else(|s| panic!("turn {turn} refused: {s:?}"));
        let ctx = context(&mut client, "tier").await;
        let kept = ctx.spans.iter().find(|s| s.span_id == held_id);
        assert_eq!(
            kept.map(|s| s.text.as_str()),
            Some(doubt),
            "turn {turn}: the doubtful instruction left the context"
        );
    }
    let (_stream, markers) = watch_replay(&mut client, 0).await;
    assert!(markers.len() >= 2, "{} compactions", markers.len());
    assert!(markers.iter().all(|m| m.tier_evicted_span_ids.is_empty()));

    // No room for the tier: the next compaction evicts it and says so.
    client
        .update_session(pb::UpdateSessionRequest {
            session_id: "tier".into(),
            config: Some(pb::SessionConfig {
                classifier_tuning: Some(tuning(Some(0.0))),
                ..Default::default()
            }),
        })
        .await
        .expect("UpdateSession succeeds");
    let before = markers.len();
    let mut turn = 30;
    let named = loop {
        assert!(turn < 60, "no compaction evicted the tier");
        admit(&mut client, "tier", vec![span(Role::Tool, &filler(turn))])
            .await
            .unwrap();
        turn += 1;
        let (_stream, markers) = watch_replay(&mut client, 0).await;
        if let Some(m) = markers[before..]
            .iter()
            .find(|m| !m.tier_evicted_span_ids.is_empty())
        {
            break m.clone();
        }
    };
    assert_eq!(named.tier_evicted_span_ids, vec![held_id], "{named:?}");
    assert!(named.evicted_span_ids.contains(&held_id));
    let ctx = context(&mut client, "tier").await;
    assert!(ctx.spans.iter().all(|s| s.span_id != held_id));
}
