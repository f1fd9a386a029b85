//! Request validation under arbitrary input: it never panics, and what it
//! lets through is what the contract promises — a turn it accepts has
//! known roles and classes, bounded non-empty texts, hints in [0, 1] and
//! well-formed keys; a configuration it accepts passes the policy's own
//! validation.
#![allow(missing_docs)]

use ctxbroker_proto::v1 as pb;
use ctxbroker_server::config::Limits;
use ctxbroker_server::validate;
use proptest::prelude::*;

fn limits() -> Limits {
    Limits {
        max_spans_per_turn: 8,
        max_span_bytes: 64,
        ..Limits::default()
    }
}

/// Any f64, the awkward ones often.
fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(0.0),
        Just(1.0),
        -2.0f64..2.0,
        any::<f64>(),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[!-~]{1,12}",
        "[a-z ]{1,6}",
        "[!-~]{127,130}",
        "\\PC{1,4}",
    ]
}

fn span_input() -> impl Strategy<Value = pb::SpanInput> {
    (
        (-1i32..7, -1i32..5, "\\PC{0,80}"),
        (prop::option::of(number()), key()),
        prop::option::of((-1i32..7, prop::collection::vec("\\PC{0,6}", 0..3))),
    )
        .prop_map(
            |((role, class, text), (hint, key), predicate)| pb::SpanInput {
                role,
                span_class: class,
                text,
                relevance_hint: hint,
                idempotency_key: key,
                predicate: predicate.map(|(modality, required_terms)| pb::Predicate {
                    modality,
                    required_terms,
                    source: 0,
                }),
                ..Default::default()
            },
        )
}

fn config() -> impl Strategy<Value = pb::SessionConfig> {
    (
        (
            prop::option::of(prop_oneof![Just(0u32), 1u32..20_000_000, any::<u32>()]),
            prop::option::of(number()),
            prop::option::of(number()),
            prop::option::of(any::<u32>()),
            prop::option::of(number()),
        ),
        (
            -1i32..5,
            prop::option::of(any::<u64>()),
            -1i32..5,
            -1i32..4,
            prop::option::of(0u32..8),
            -1i32..4,
            -1i32..4,
        ),
        prop::option::of((number(), number(), number(), number(), number())),
    )
        .prop_map(
            |(
                (window, alpha, soft, overhead, floor),
                (trigger, staleness, tokenizer, classifier, generations, policy, mode),
                weights,
            )| pb::SessionConfig {
                window_tokens: window,
                alpha,
                soft_watermark: soft,
                reserved_overhead_tokens: overhead,
                relevance_floor: floor,
                trigger,
                staleness_interval_ms: staleness,
                tokenizer,
                classifier,
                max_summary_generations: generations,
                anchor_policy: policy,
                mode,
                relevance: weights.map(|(recency, similarity, length, hint, half)| {
                    pb::RelevanceWeights {
                        recency: Some(recency),
                        similarity: Some(similarity),
                        length: Some(length),
                        hint: Some(hint),
                        recency_half_life_turns: Some(half),
                    }
                }),
                ..Default::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn an_accepted_turn_is_well_formed(spans in prop::collection::vec(span_input(), 0..10)) {
        let limits = limits();
        let mut bad = Vec::new();
        validate::turn_shape(&spans, &limits, &mut bad);
        if !bad.is_empty() {
            return Ok(());
        }
        prop_assert!(!spans.is_empty() && spans.len() <= limits.max_spans_per_turn);
        let keyed = spans.iter().filter(|s| !s.idempotency_key.is_empty()).count();
        prop_assert!(keyed == 0 || keyed == spans.len(), "keys on some spans only");
        let mut keys = std::collections::HashSet::new();
        for s in &spans {
            prop_assert!(matches!(
                pb::Role::try_from(s.role),
                Ok(pb::Role::User | pb::Role::Assistant | pb::Role::Tool | pb::Role::System)
            ));
            prop_assert!(matches!(
                pb::SpanClass::try_from(s.span_class),
                Ok(pb::SpanClass::Unspecified
                    | pb::SpanClass::Narrative
                    | pb::SpanClass::Constraint
                    | pb::SpanClass::Protected)
            ));
            prop_assert!(!s.text.is_empty() && s.text.len() <= limits.max_span_bytes);
            if let Some(h) = s.relevance_hint {
                prop_assert!(h.is_finite() && (0.0..=1.0).contains(&h));
            }
            if !s.idempotency_key.is_empty() {
                prop_assert!(s.idempotency_key.len() <= validate::MAX_IDEMPOTENCY_KEY_BYTES);
                prop_assert!(s.idempotency_key.bytes().all(|b| b.is_ascii_graphic()));
                prop_assert!(keys.insert(s.idempotency_key.clone()), "repeated key");
            }
            if let Some(p) = &s.predicate {
                prop_assert!(pb::Modality::try_from(p.modality).is_ok());
            }
        }
    }

    #[test]
    fn an_accepted_configuration_passes_the_policy(c in config()) {
        let limits = Limits::default();
        if let Ok(config) = validate::create_config(Some(&c), &limits) {
            prop_assert!(config.validate().is_ok(), "{config:?}: {:?}", config.validate());
            prop_assert!(config.window_tokens > 0 && config.window_tokens <= limits.max_window_tokens);
            prop_assert!(config.budget_tokens() > 0);
            prop_assert!(config.soft_watermark_tokens() <= config.budget_tokens());
        }
        // An update of a valid configuration by the same patch behaves the
        // same way.
        let base = ctxbroker_core::SessionConfig::with_window(10_000);
        if let Ok(config) = validate::update_config(&base, &c, &limits) {
            prop_assert!(config.validate().is_ok(), "{config:?}");
        }
    }
}
