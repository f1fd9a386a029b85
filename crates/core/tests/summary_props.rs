//! Property (3): a summary carries every anchor of its inputs or counts it
//! as dropped, stays within its token limit (counted on the final text),
//! and respects the generation rule.

mod support;

use std::collections::HashSet;

use ctxbroker_core::span::{Role, Span};
use ctxbroker_core::summary::{extract_anchors, summarize, summarize_bounded};
use ctxbroker_core::tokens::{ByteLength, TokenCounter};
use proptest::prelude::*;
use support::{Kind, admitted, earlier_summary, kind, tokens};

fn inputs() -> impl Strategy<Value = Vec<Span>> {
    prop::collection::vec(kind(), 1..30).prop_map(|kinds| {
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let id = i as u64 + 1;
                match k {
                    Kind::Narrative(role, text, _) => admitted(id, id, id, role, text, Some(false)),
                    Kind::Constraint(text, _) => {
                        admitted(id, id, id, Role::User, text, Some(false))
                    }
                    Kind::Summary(g, anchors, dropped, note) => {
                        earlier_summary(id, id, id, g, anchors, dropped, &note)
                    }
                }
            })
            .collect()
    })
}

fn owed(spans: &[Span]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for s in spans {
        let anchors = match &s.summary {
            Some(info) => info.anchors.clone(),
            None => extract_anchors(&s.text),
        };
        for a in anchors {
            if seen.insert(a.clone()) {
                out.push(a);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn anchors_are_carried_or_counted(
        spans in inputs(),
        max_tokens in prop_oneof![0u32..64, 64u32..4_096],
        prose in 0u32..4_096,
        max_generations in 1u32..5,
        bytes in any::<bool>(),
    ) {
        let counter: &dyn TokenCounter = if bytes { &ByteLength } else { tokens() };
        let refs: Vec<&Span> = spans.iter().collect();
        let d = summarize_bounded(&refs, max_tokens, prose, max_generations, counter);
        prop_assert_eq!(d.tokens, counter.count(&d.text));
        prop_assert!(d.tokens <= max_tokens, "{} > {max_tokens}", d.tokens);
        let owed = owed(&spans);
        let missing = owed.iter().filter(|a| !d.text.contains(a.as_str())).count();
        prop_assert!(missing as u32 <= d.anchors_dropped, "{missing} missing, {} dropped", d.anchors_dropped);
        prop_assert_eq!(d.anchors.len() + d.anchors_dropped as usize, owed.len());
        for a in &d.anchors {
            prop_assert!(d.text.contains(a.as_str()), "claimed anchor {a:?} not in text");
            prop_assert!(owed.contains(a));
        }
        let highest = spans.iter().map(|s| s.generation).max().unwrap_or(0);
        prop_assert_eq!(d.generation, (highest + 1).min(max_generations));
        prop_assert_eq!(d.covers, spans.iter().map(|s| s.id).collect::<Vec<_>>());
    }

    #[test]
    fn with_room_nothing_is_dropped(spans in inputs()) {
        let refs: Vec<&Span> = spans.iter().collect();
        let d = summarize(&refs, 1_000_000, 3, tokens());
        prop_assert_eq!(d.anchors_dropped, 0);
        prop_assert_eq!(d.anchors, owed(&spans));
        prop_assert!(d.text.starts_with("[summary of "));
    }

    #[test]
    fn anchors_are_verbatim_substrings(text in any::<String>()) {
        for a in extract_anchors(&text) {
            prop_assert!(!a.is_empty());
            prop_assert!(text.contains(a.as_str()));
        }
    }
}
