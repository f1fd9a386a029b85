//! Builders shared by the unit tests of several modules.

use crate::classify::classify;
use crate::plan::{CompressedForm, Eviction, Plan};
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
        attributes: None,
    }
}

/// A small xorshift generator for tests that draw random cases: the same
/// seed makes the same cases on every run.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next number.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// An index below `n` (0 when `n` is 0).
    pub(crate) fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}

/// A plan with these parts and every count zero.
pub(crate) fn plan(
    evicted: Vec<Eviction>,
    summary: Option<Span>,
    compressed: Vec<CompressedForm>,
) -> Plan {
    Plan {
        evicted,
        summary,
        compressed,
        tokens_before: 0,
        tokens_after: 0,
        incoming_tokens: 0,
        target_tokens: 0,
        anchors_carried: 0,
        anchors_dropped: 0,
    }
}
