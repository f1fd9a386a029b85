//! No policy function panics on any text, and what the predicate functions
//! promise holds for every input: a derived predicate's own compressed form
//! passes its check, and classification is stable under case.

mod support;

use ctxbroker_core::classify::{classify, modality_of};
use ctxbroker_core::predicate::{check, compress, derive};
use ctxbroker_core::span::{Role, SpanClass};
use ctxbroker_core::summary::extract_anchors;
use ctxbroker_core::tokens::{ByteLength, TokenCounter};
use proptest::prelude::*;
use support::{constraint_text, narrative_text, tokens};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        narrative_text(30),
        constraint_text(),
        "[`'\"a-z ;.,\n_/:-]{0,80}",
        proptest::collection::vec(any::<u8>(), 0..200)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn nothing_panics_and_compression_is_sound(t in text(), bytes in any::<bool>()) {
        let counter: &dyn TokenCounter = if bytes { &ByteLength } else { tokens() };
        for role in [Role::User, Role::System, Role::Tool, Role::Assistant] {
            let _ = classify(role, &t);
        }
        let m = modality_of(&t);
        let p = derive(&t, m);
        let _ = extract_anchors(&t);
        if let Some(form) = compress(&t, &p, counter) {
            let (f, o) = (counter.count(&form), counter.count(&t));
            prop_assert!(f < o);
            prop_assert_eq!(check(&form, f, o, &p), Ok(()));
        }
    }

    #[test]
    fn constraints_are_pinned_and_satisfy_themselves(t in constraint_text()) {
        let c = classify(Role::User, &t);
        prop_assert_eq!(c.class, SpanClass::Constraint, "{}", c.rule);
        let p = derive(&t, None);
        prop_assert_eq!(check(&t, 1, 1, &p), Ok(()));
        // Case does not change the class.
        prop_assert_eq!(classify(Role::User, &t.to_uppercase()).class, SpanClass::Constraint);
    }
}

/// Large adversarial texts (hundreds of thousands of hits, code spans,
/// quotes) take linear time: quadratic work would take minutes here.
#[test]
fn huge_texts_stay_linear() {
    use std::time::{Duration, Instant};
    let texts = [
        "only never must not actually, not x but y ".repeat(10_000),
        "`a` \"q\" src/x.rs ".repeat(10_000),
        "the ".repeat(50_000),
        "x".repeat(200_000),
        "é\u{301}🦀".repeat(25_000),
        "error: boom\n".repeat(10_000),
    ];
    let start = Instant::now();
    for t in &texts {
        let _ = classify(Role::User, t);
        let p = derive(t, None);
        let _ = compress(t, &p, &ByteLength);
        let _ = extract_anchors(t);
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}
