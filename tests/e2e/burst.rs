//! The cadence trap: a burst that lands when live is near the budget is
//! admitted after a compaction in the same call; a turn that can never fit
//! is refused and changes nothing; constraints alone beyond the budget fail
//! closed.

use std::collections::HashMap;

use ctxbroker_proto::v1 as pb;
use pb::{Role, SpanClass};
use prost::Message;
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn a_burst_near_the_budget_is_admitted_after_compaction_in_the_same_call() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let session = create(&mut client, "burst", window(4000)).await;
    let budget = session.totals.unwrap().budget_tokens;
    let window_tokens = 4000;

    admit(
        &mut client,
        "burst",
        vec![span(
            Role::User,
            "Do not delete the `billing` database; read only.",
        )],
    )
    .await
    .unwrap();
    // Fill to near the budget with ordinary narrative.
    let mut live = 0;
    let mut turn = 0;
    while live + 200 < budget {
        let text = prose(turn, &["pipeline", "build", "cache"], 60);
        let reply = admit(&mut client, "burst", vec![span(Role::Assistant, &text)])
            .await
            .unwrap();
        live = reply.totals.unwrap().live_tokens;
        turn += 1;
    }
    assert!(
        live + 200 >= budget && live <= budget,
        "live {live}, budget {budget}"
    );

    // A tool result of most of the window.
    let mut tool_text = String::from(
        "$ cargo build --release\nerror[E0433]: failed to resolve: use of undeclared crate `tokio_util` in src/server.rs:14\n",
    );
    let mut seed = 1000;
    while tool_text.len() < 14_000 {
        tool_text.push_str(&prose(
            seed,
            &["compile", "linker", "target/release/deps"],
            40,
        ));
        tool_text.push('\n');
        seed += 1;
    }
    let reply = admit(&mut client, "burst", vec![span(Role::Tool, &tool_text)])
        .await
        .expect("the burst is admitted");
    let tool_tokens = reply.spans[0].tokens;
    assert!(
        tool_tokens * 2 > window_tokens,
        "the burst ({tool_tokens} tokens) should be most of the window"
    );
    let marker = reply.compaction.expect("a compaction ran in the same call");
    assert_eq!(marker.outcome(), pb::CompactionOutcome::Committed);
    assert_eq!(marker.trigger(), pb::CompactionTrigger::HardBudget);
    assert_eq!(marker.incoming_tokens, tool_tokens);
    assert!(marker.tokens_after + tool_tokens <= budget, "{marker:?}");
    let totals = reply.totals.unwrap();
    assert!(totals.live_tokens <= budget);
    let ctx = context(&mut client, "burst").await;
    assert!(
        ctx.spans.iter().any(|s| s.text == tool_text),
        "the burst is live"
    );
    assert!(
        ctx.spans
            .iter()
            .any(|s| s.span_class() == SpanClass::Constraint)
    );
    assert!(
        ctx.spans
            .iter()
            .any(|s| s.span_class() == SpanClass::Summary)
    );

    // A turn larger than budget − pinned can never fit.
    let before = context(&mut client, "burst").await.encode_to_vec();
    let pinned = totals.pinned_tokens;
    let mut huge = String::new();
    let mut seed = 5000;
    while huge.len() < 30_000 {
        huge.push_str(&prose(seed, &["dump"], 50));
        seed += 1;
    }
    let status = admit(&mut client, "burst", vec![span(Role::Tool, &huge)])
        .await
        .expect_err("an oversized turn is refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let (reason, meta) = error_info(&status);
    assert_eq!(reason, "COMPACTION_INVARIANT");
    for key in [
        "live_tokens",
        "incoming_tokens",
        "pinned_tokens",
        "budget_tokens",
        "window_tokens",
    ] {
        assert!(meta.contains_key(key), "{key} missing from {meta:?}");
    }
    assert_eq!(meta["budget_tokens"], budget.to_string());
    assert_eq!(meta["window_tokens"], window_tokens.to_string());
    assert_eq!(meta["pinned_tokens"], pinned.to_string());
    let incoming: u32 = meta["incoming_tokens"].parse().unwrap();
    assert!(incoming > budget - pinned);
    assert!(meta["violations"].contains("TURN_TOO_LARGE"), "{meta:?}");
    let after = context(&mut client, "burst").await.encode_to_vec();
    assert_eq!(before, after, "a refused turn must not change the context");

    // Its ABORTED marker is in the log.
    let seq: u64 = meta["marker_seq"].parse().unwrap();
    let (_stream, markers) = watch_replay(&mut client, seq).await;
    let aborted = &markers[0];
    assert_eq!(aborted.seq, seq);
    assert_eq!(aborted.outcome(), pb::CompactionOutcome::Aborted);
    assert_eq!(aborted.tokens_before, aborted.tokens_after);
    assert!(!aborted.violations.is_empty());
}

#[tokio::test]
async fn constraints_alone_beyond_the_budget_fail_closed() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let session = create(&mut client, "closed", window(1000)).await;
    let budget = session.totals.unwrap().budget_tokens;

    let rule = |n: u64| {
        format!(
            "Never modify the file config/rule-{n}.yaml. {}",
            prose(n, &["rule"], 120)
        )
    };
    let mut admitted = 0;
    let mut pinned = 0;
    let refusal = loop {
        let reply = admit(
            &mut client,
            "closed",
            vec![classed(Role::User, SpanClass::Constraint, &rule(admitted))],
        )
        .await;
        match reply {
            Ok(reply) => {
                pinned = reply.totals.unwrap().pinned_tokens;
                admitted += 1;
                assert!(admitted < 20, "constraints should overflow the budget");
            }
            Err(status) => break status,
        }
    };
    assert!(admitted >= 1);
    assert_eq!(refusal.code(), Code::FailedPrecondition);
    let (reason, meta) = error_info(&refusal);
    assert_eq!(reason, "COMPACTION_INVARIANT");
    assert!(
        meta["violations"].contains("PINNED_EXCEED_BUDGET"),
        "{meta:?}"
    );
    let incoming: u32 = meta["incoming_tokens"].parse().unwrap();
    assert!(pinned + incoming > budget);

    // Nothing changed: the same constraints, the same revision.
    let ctx = context(&mut client, "closed").await;
    assert_eq!(ctx.spans.len(), admitted as usize);
    assert!(
        ctx.spans
            .iter()
            .all(|s| s.span_class() == SpanClass::Constraint)
    );
    assert_eq!(ctx.totals.unwrap().pinned_tokens, pinned);

    // An ABORTED marker was published, with its violations.
    let (_stream, markers) = watch_replay(&mut client, 0).await;
    let last = markers.last().expect("a marker");
    assert_eq!(last.outcome(), pb::CompactionOutcome::Aborted);
    assert_eq!(last.session_id, "closed");
    assert!(
        last.violations
            .iter()
            .any(|v| v.kind() == pb::ViolationKind::PinnedExceedBudget)
    );
    assert_eq!(last.seq.to_string(), meta["marker_seq"]);

    // Narrative that would fit beside the pins alone is still refused when
    // the pins leave it no room, and says so.
    let room = budget - pinned;
    let mut text = String::new();
    let mut seed = 900;
    while text.len() < (room as usize + 50) * 6 {
        text.push_str(&prose(seed, &["notes"], 30));
        seed += 1;
    }
    let status = admit(&mut client, "closed", vec![span(Role::Assistant, &text)])
        .await
        .expect_err("no room beside the pins");
    let (_, meta) = error_info(&status);
    assert!(meta["violations"].contains("TURN_TOO_LARGE"), "{meta:?}");
}

/// Wordy constraints that the built-in compressor can shorten.
const WORDY: [&str; 4] = [
    "Please remember that, whatever the task turns out to be, you must never write anything at all to the `prod` namespace; stage only.",
    "Also, as a general rule for the rest of this session, always run `cargo test` before you change anything under crates/billing.",
    "Keep in mind that you should not, under any circumstances at all, delete the `ledger` table or any of its backups.",
    "As we agreed earlier in the week, only deploy through the blue cluster and only after the review has been approved.",
];

#[tokio::test]
async fn constraints_are_compressed_only_once_narrative_is_exhausted() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let budget = create(&mut client, "squeeze", window(260))
        .await
        .totals
        .unwrap()
        .budget_tokens;
    let mut admitted = HashMap::new();
    // Classed by the caller: what this test holds is how constraints are
    // compressed, not how the classifier reads them (its tests and the
    // classify bench do).
    for text in WORDY {
        let constraint = classed(Role::User, SpanClass::Constraint, text);
        let reply = admit(&mut client, "squeeze", vec![constraint])
            .await
            .unwrap();
        let s = &reply.spans[0];
        assert_eq!(s.span_class(), SpanClass::Constraint, "{s:?}");
        admitted.insert(s.span_id, (text, s.predicate.clone().unwrap()));
    }

    // Narrative turns until a compaction had to compress: before that,
    // compactions only evict narrative.
    let mut compressed_marker = None;
    for i in 0..30u64 {
        // Two small turns, then tool results that need most of the room.
        let words = if i < 2 { 25 } else { 100 };
        let text = format!("Step {i}: {}", prose(i, &["ledger"], words));
        let reply = admit(&mut client, "squeeze", vec![span(Role::Tool, &text)])
            .await
            .unwrap_or_else(|s| panic!("turn {i} refused: {s:?}"));
        assert!(reply.totals.unwrap().live_tokens <= budget);
        if let Some(m) = reply.compaction
            && !m.compressed_span_ids.is_empty()
        {
            compressed_marker = Some((m, reply.spans[0].span_id));
            break;
        }
    }
    let (marker, turn_id) = compressed_marker.expect("a compaction compressed constraints");
    assert_eq!(marker.outcome(), pb::CompactionOutcome::Committed);
    assert_eq!(marker.pinned_retained, marker.pinned_total);

    let ctx = context(&mut client, "squeeze").await;
    // Narrative was exhausted: the only narrative left is the turn just
    // admitted.
    for s in &ctx.spans {
        if s.span_class() == SpanClass::Narrative {
            assert_eq!(
                s.span_id, turn_id,
                "narrative {s:?} stayed while constraints were compressed"
            );
        }
    }
    // Every constraint is still there; the compressed ones keep their
    // modality word and every required term, are shorter, and remember
    // what was admitted.
    for (id, (text, predicate)) in &admitted {
        let live = ctx
            .spans
            .iter()
            .find(|s| s.span_id == *id)
            .unwrap_or_else(|| panic!("constraint {id} is gone"));
        assert_eq!(live.span_class(), SpanClass::Constraint);
        if !marker.compressed_span_ids.contains(id) {
            assert_eq!(live.text, *text);
            continue;
        }
        assert_ne!(live.text, *text);
        assert_eq!(live.original_text, *text);
        assert!(live.tokens < live.original_tokens, "{live:?}");
        let lower = live.text.to_lowercase();
        for term in &predicate.required_terms {
            assert!(
                lower.contains(&term.to_lowercase()),
                "{term:?} lost from {:?}",
                live.text
            );
        }
    }
}
