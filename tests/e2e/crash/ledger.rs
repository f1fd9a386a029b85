//! The acknowledgement ledger: what the daemon answered, as the load and
//! the watchers recorded it. The checks hold the restarted daemon to it.

use std::collections::BTreeMap;

use ctxbroker_proto::v1 as pb;

/// What happened to a span's pin, in the order the admitter did it.
#[derive(Debug, Clone)]
pub(crate) enum PinEvent {
    /// Pin acknowledged.
    Pinned,
    /// Pin sent, no answer.
    PinUnknown,
    /// Unpin acknowledged, with this reason.
    Unpinned(String),
    /// Unpin sent with this reason, no answer: the log tells (an unpin and
    /// its UNPIN marker are one write).
    UnpinUnknown(String),
}

/// One acknowledged span.
#[derive(Debug, Clone)]
pub(crate) struct AckedSpan {
    /// The text as admitted.
    pub(crate) text: String,
    /// The class the reply gave.
    pub(crate) class: pb::SpanClass,
    /// The predicate's required terms, from the reply (or the pin reply).
    pub(crate) terms: Vec<String>,
    pub(crate) history: Vec<PinEvent>,
}

/// Where a span should stand, as far as acknowledged operations tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    Constraint,
    Narrative,
    EitherClass,
}

impl AckedSpan {
    /// Replays the pin history; `unpinned` says whether an unpin with that
    /// reason is in the marker log.
    pub(crate) fn expect(&self, unpinned: impl Fn(&str) -> bool) -> Expect {
        let mut state = if self.class == pb::SpanClass::Constraint {
            Expect::Constraint
        } else {
            Expect::Narrative
        };
        for event in &self.history {
            state = match (event, state) {
                (PinEvent::Pinned, _) => Expect::Constraint,
                (PinEvent::PinUnknown, Expect::Constraint) => Expect::Constraint,
                (PinEvent::PinUnknown, _) => Expect::EitherClass,
                (PinEvent::Unpinned(_), _) => Expect::Narrative,
                (PinEvent::UnpinUnknown(reason), _) => {
                    if unpinned(reason) {
                        Expect::Narrative
                    } else {
                        Expect::Constraint
                    }
                }
            };
        }
        state
    }
}

/// Everything acknowledged for one session.
#[derive(Debug, Default)]
pub(crate) struct SessionLog {
    pub(crate) spans: BTreeMap<u64, AckedSpan>,
    /// Markers carried in replies (admissions and unpins).
    pub(crate) markers: Vec<pb::CompactionMarker>,
    /// Sequences of the ABORTED markers that refusals named.
    pub(crate) aborted: Vec<u64>,
    /// The texts of turns that got no answer: each may have landed, whole
    /// or not at all.
    pub(crate) unacked_turns: Vec<Vec<String>>,
}

/// One connection of a watcher: where it started and what it received.
#[derive(Debug, Clone, Default)]
pub(crate) struct Segment {
    pub(crate) from: u64,
    pub(crate) markers: Vec<pb::CompactionMarker>,
}

/// A watcher's whole record.
#[derive(Debug, Default)]
pub(crate) struct WatchLog {
    pub(crate) segments: Vec<Segment>,
    /// How each connection ended.
    pub(crate) breaks: Vec<String>,
}
