//! Generators shared by the property tests: random sessions mixing
//! narrative, constraints and summaries, with realistic anchors.
#![allow(dead_code, unreachable_pub, missing_docs)]

use ctxbroker_core::classify::classify;
use ctxbroker_core::config::{SessionConfig, TokenizerKind};
use ctxbroker_core::predicate::derive;
use ctxbroker_core::span::{
    ClassSource, Classification, Modality, Role, Span, SpanClass, SummaryInfo,
};
use ctxbroker_core::tokens::{TokenCounter, counter};
use proptest::prelude::*;

/// The one tokenizer of the test process (lazily built, shared).
pub fn tokens() -> &'static dyn TokenCounter {
    counter(TokenizerKind::O200kBase)
}

const WORDS: &[&str] = &[
    "the",
    "build",
    "failed",
    "deploy",
    "staging",
    "cluster",
    "module",
    "parser",
    "tests",
    "passed",
    "we",
    "looked",
    "at",
    "config",
    "retry",
    "timeout",
    "cache",
    "handler",
    "request",
    "agent",
    "and",
    "then",
    "it",
    "was",
    "slow",
    "fixed",
    "naïve",
    "日本語",
    "🦀",
    "e\u{301}t\u{e9}",
    "overlay",
    "namespace",
    "replica",
    "queue",
    "worker",
    "latency",
];

/// A code-like piece that the anchor rules pick up.
pub fn anchor() -> impl Strategy<Value = String> {
    prop_oneof![
        "src/[a-z]{1,8}\\.rs",
        "k8s/[a-z]{1,6}/[a-z]{1,6}\\.yaml",
        "/etc/[a-z]{1,6}\\.conf",
        "[a-z]{2,6}_[a-z]{2,6}",
        "[a-z]{2,5}[A-Z][a-z]{2,5}",
        "[1-9][0-9]{0,3} MiB",
        "[1-9][0-9]{0,2}s",
        "https://example\\.com/[a-z]{1,8}",
        "`[a-z]{2,8}`",
        "v[0-9]\\.[0-9]{1,2}\\.[0-9]",
    ]
}

/// One piece of narrative: a word, an anchor, or an error line.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(WORDS).prop_map(str::to_string),
        2 => anchor(),
        1 => "[a-z]{3,9}".prop_map(|w| format!("\nerror: {w} failed\n")),
    ]
}

const SEPARATORS: &[&str] = &[" ", " ", " ", ". ", ", ", "\n"];

/// Narrative text of 1 to `max` pieces.
pub fn narrative_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec((piece(), prop::sample::select(SEPARATORS)), 1..max).prop_map(|parts| {
        let mut text = String::new();
        for (p, sep) in parts {
            text.push_str(&p);
            text.push_str(sep);
        }
        text.trim_end().to_string()
    })
}

/// A user constraint the rule classifier pins.
pub fn constraint_text() -> impl Strategy<Value = String> {
    let word = prop::sample::select(WORDS);
    (0usize..8, anchor(), anchor(), word, 1u32..64).prop_map(|(k, a, b, w, n)| match k {
        0 => format!("Never write to the `{w}` namespace; stage only."),
        1 => format!("Do not touch {a}; {b} only."),
        2 => format!("Always run `cargo test` before you change {a}."),
        3 => format!("Use at most {n} workers for {w}."),
        4 => format!("Only edit files under {a} and never {b}."),
        5 => format!("Actually, use {a} instead of {b}."),
        6 => format!("You must not delete {a} or the {w} cache."),
        _ => format!("Ensure every {w} handler keeps its {n}s timeout in {a}."),
    })
}

pub fn classification(class: SpanClass, source: ClassSource, rule: &str) -> Classification {
    Classification {
        class,
        source,
        rule: rule.to_string(),
    }
}

/// An admitted (generation 0) span with a counted text; constraints get a
/// derived predicate.
pub fn admitted(
    id: u64,
    position: u64,
    turn: u64,
    role: Role,
    text: String,
    pinned: Option<bool>,
) -> Span {
    let classification = match pinned {
        Some(true) => classification(SpanClass::Constraint, ClassSource::Caller, ""),
        Some(false) => classification(SpanClass::Narrative, ClassSource::Caller, ""),
        None => classify(role, &text),
    };
    let predicate = (classification.class == SpanClass::Constraint).then(|| derive(&text, None));
    Span {
        id,
        position,
        role,
        classification,
        tokens: tokens().count(&text),
        text,
        generation: 0,
        turn,
        predicate,
        summary: None,
        relevance_hint: None,
        admitted_at_ms: turn * 1_000,
        original: None,
        attributes: None,
    }
}

/// A summary left by an earlier compaction.
pub fn earlier_summary(
    id: u64,
    position: u64,
    turn: u64,
    generation: u32,
    anchors: Vec<String>,
    dropped: u32,
    note: &str,
) -> Span {
    let text = format!(
        "[summary of 3 spans, generation {generation}]\nanchors: {}\n- {note}",
        anchors.join(" | ")
    );
    Span {
        id,
        position,
        role: Role::System,
        classification: classification(SpanClass::Summary, ClassSource::Broker, ""),
        tokens: tokens().count(&text),
        text,
        generation,
        turn,
        predicate: None,
        summary: Some(SummaryInfo {
            covers: vec![id.saturating_sub(1_000_000)],
            anchors,
            anchors_dropped: dropped,
        }),
        relevance_hint: None,
        admitted_at_ms: turn * 1_000,
        original: None,
        attributes: None,
    }
}

/// What one live span is before ids are assigned.
#[derive(Debug, Clone)]
pub enum Kind {
    Narrative(Role, String, Option<f64>),
    Constraint(String, bool),
    Summary(u32, Vec<String>, u32, String),
}

pub fn kind() -> impl Strategy<Value = Kind> {
    let role = prop::sample::select(&[Role::Tool, Role::Assistant, Role::User, Role::Tool][..]);
    let hint = prop::option::weighted(0.2, 0.0f64..=1.0);
    prop_oneof![
        8 => (role, narrative_text(40), hint).prop_map(|(r, t, h)| Kind::Narrative(r, t, h)),
        2 => (constraint_text(), any::<bool>()).prop_map(|(t, caller)| Kind::Constraint(t, caller)),
        1 => (1u32..5, prop::collection::vec(anchor(), 0..6), 0u32..4, narrative_text(8))
            .prop_map(|(g, a, d, n)| Kind::Summary(g, a, d, n)),
    ]
}

#[derive(Debug, Clone)]
pub struct Session {
    pub config: SessionConfig,
    pub live: Vec<Span>,
    pub incoming: Vec<Span>,
    pub next_span_id: u64,
    pub turn: u64,
}

impl Session {
    pub fn live_tokens(&self) -> u64 {
        self.live.iter().map(|s| u64::from(s.tokens)).sum()
    }
    pub fn incoming_tokens(&self) -> u64 {
        self.incoming.iter().map(|s| u64::from(s.tokens)).sum()
    }
    pub fn pinned(spans: &[Span]) -> u64 {
        spans
            .iter()
            .filter(|s| s.is_pinned())
            .map(|s| u64::from(s.tokens))
            .sum()
    }
    pub fn budget(&self) -> u64 {
        u64::from(self.config.budget_tokens())
    }
    pub fn query(&self) -> String {
        self.incoming
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

pub fn config() -> impl Strategy<Value = SessionConfig> {
    (
        200u32..6_000,
        0.5f64..0.95,
        0.5f64..=1.0,
        0.0f64..0.3,
        1u32..5,
        prop_oneof![Just(0u32), 16u32..800],
        0.0f64..0.2,
    )
        .prop_map(|(w, alpha, soft, floor, gens, smax, overhead)| {
            let mut c = SessionConfig::with_window(w);
            c.alpha = alpha;
            c.soft_watermark = soft;
            c.relevance_floor = floor;
            c.max_summary_generations = gens;
            c.summary_max_tokens = smax;
            c.reserved_overhead_tokens = (overhead * f64::from(c.alpha_window_tokens())) as u32;
            c
        })
}

/// A random session: a config, 0–40 live spans (narrative, constraints,
/// summaries), and an incoming turn of 1–3 spans, sometimes huge.
pub fn session() -> impl Strategy<Value = Session> {
    (
        config(),
        prop::collection::vec((kind(), 1u64..4), 0..40),
        prop::collection::vec((kind(), 1usize..4), 1..4),
        prop_oneof![6 => Just(1usize), 1 => 2usize..40],
    )
        .prop_map(|(config, kinds, incoming_kinds, blow_up)| {
            let mut live = Vec::new();
            let mut position = 0u64;
            let mut turn = 0u64;
            let mut summary_id = 1_000_000u64;
            for (k, gap) in kinds {
                position += gap;
                turn += 1;
                live.push(match k {
                    Kind::Narrative(role, text, hint) => {
                        let mut s = admitted(position, position, turn, role, text, Some(false));
                        s.relevance_hint = hint;
                        s
                    }
                    Kind::Constraint(text, caller) => admitted(
                        position,
                        position,
                        turn,
                        Role::User,
                        text,
                        caller.then_some(true),
                    ),
                    Kind::Summary(g, anchors, dropped, note) => {
                        summary_id += 1;
                        earlier_summary(summary_id, position, turn, g, anchors, dropped, &note)
                    }
                });
            }
            // Classified constraints that the rules do not pin stay
            // narrative: that is the classifier's call, not the test's.
            let mut next = summary_id.max(position) + 1;
            turn += 1;
            let mut incoming = Vec::new();
            for (k, repeat) in incoming_kinds {
                let (role, text, pinned) = match k {
                    Kind::Narrative(role, text, _) => (role, text, Some(false)),
                    Kind::Constraint(text, _) => (Role::User, text, None),
                    Kind::Summary(_, _, _, note) => (Role::Tool, note, Some(false)),
                };
                let text = vec![text; repeat * blow_up].join("\n");
                incoming.push(admitted(next, next, turn, role, text, pinned));
                next += 1;
            }
            Session {
                config,
                live,
                incoming,
                next_span_id: next,
                turn,
            }
        })
}

/// Whether a text expresses a modality (for readable assertions).
pub fn modality_name(m: Modality) -> &'static str {
    ctxbroker_core::classify::modality_name(m)
}
