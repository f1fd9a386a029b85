//! Builders shared by the unit tests of several modules.

use crate::classify::classify;
use crate::predicate::derive;
use crate::span::{Role, Span, SpanClass};
use crate::tokens::{ByteLength, TokenCounter};

/// A span as admission makes it: classified by the rules, with a derived
/// predicate when it is a constraint, counted in bytes.
pub(crate) fn admitted(id: u64, turn: u64, role: Role, text: &str) -> Span {
    let classification = classify(role, text);
    let predicate = (classification.class == SpanClass::Constraint).then(|| derive(text, None));
    Span {
        id,
        position: id,
        role,
        classification,
        text: text.into(),
        tokens: ByteLength.count(text),
        generation: 0,
        turn,
        predicate,
        summary: None,
        relevance_hint: None,
        admitted_at_ms: 0,
        original: None,
    }
}
