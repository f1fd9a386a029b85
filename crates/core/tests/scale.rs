//! Planning and verification stay near O(n log n) in the live span count.
//!
//! The debug test catches quadratic work on 10,000 spans. The ignored
//! release benchmark plans, applies and verifies 100,000 spans and prints
//! the time of each step (run with
//! `cargo test --release -p ctxbroker-core --test scale -- --ignored --nocapture`);
//! it fails above 250 ms, far above the 20 ms the product aims at, so that
//! it flags regressions without depending on the machine's load.

use std::time::{Duration, Instant};

use ctxbroker_core::config::{SessionConfig, TokenizerKind};
use ctxbroker_core::planner::{PlanInput, apply, plan};
use ctxbroker_core::span::{ClassSource, Classification, Role, Span, SpanClass};
use ctxbroker_core::tokens::{counter, warm_up};
use ctxbroker_core::verify::verify;

fn session(n: u64) -> (SessionConfig, Vec<Span>) {
    let mut live = Vec::with_capacity(n as usize);
    let mut total = 0u64;
    for id in 1..=n {
        let pinned = id % 1_000 == 1;
        let text = if pinned {
            format!("Never write to the `prod{id}` namespace; stage only.")
        } else {
            format!(
                "step {id}: patched src/mod_{}.rs, tests passed in {}s.",
                id % 97,
                id % 60
            )
        };
        let tokens = 16;
        total += tokens;
        live.push(Span {
            id,
            position: id,
            role: if pinned { Role::User } else { Role::Tool },
            classification: Classification {
                class: if pinned {
                    SpanClass::Constraint
                } else {
                    SpanClass::Narrative
                },
                source: ClassSource::Caller,
                rule: String::new(),
            },
            text,
            tokens: tokens as u32,
            generation: 0,
            turn: id / 10,
            predicate: pinned.then(|| {
                ctxbroker_core::predicate::derive("Never write to prod; stage only.", None)
            }),
            summary: None,
            relevance_hint: None,
            admitted_at_ms: 0,
            original: None,
            attributes: None,
        });
    }
    let config = SessionConfig::with_window((total as f64 / 0.85) as u32 + 1);
    (config, live)
}

fn run(n: u64) -> Duration {
    warm_up(TokenizerKind::O200kBase);
    let c = counter(TokenizerKind::O200kBase);
    let (config, live) = session(n);
    let input = PlanInput {
        config: &config,
        live: &live,
        incoming_tokens: 2_000,
        query: "run the tests for src/mod_3.rs again",
        turn: n / 10 + 1,
        next_span_id: n + 1,
        now_ms: 0,
        target_tokens: None,
        held_tool_calls: &[],
    };
    let start = Instant::now();
    let p = plan(&input, c);
    let planned = start.elapsed();
    let post = apply(&live, &p);
    let applied = start.elapsed();
    let verdict = verify(&live, &p, &post, 2_000, &config, c);
    let elapsed = start.elapsed();
    assert!(verdict.passed(), "{:?}", verdict.violations.first());
    assert!(!p.evicted.is_empty());
    eprintln!(
        "{n} spans: plan {planned:?}, apply {:?}, verify {:?}, total {elapsed:?}; evicted {}, summary {} tokens",
        applied - planned,
        elapsed - applied,
        p.evicted.len(),
        p.summary.as_ref().map_or(0, |s| s.tokens)
    );
    elapsed
}

#[test]
fn ten_thousand_spans_plan_and_verify() {
    // Generous for a debug build on a loaded two-core machine; the point is
    // to catch quadratic work, which would take minutes here.
    assert!(run(10_000) < Duration::from_secs(5));
}

#[test]
#[ignore = "a release-mode benchmark"]
fn hundred_thousand_spans_in_release() {
    let best = (0..5).map(|_| run(100_000)).min().unwrap();
    eprintln!("best of 5: {best:?}");
    if !cfg!(debug_assertions) {
        assert!(best <= Duration::from_millis(250), "{best:?}");
    }
}
