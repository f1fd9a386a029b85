//! Taking content back: the newest spans (an agent's undo of its last
//! item or turn), or everything (a reset). Neither is a compaction: the
//! spans leave outright, nothing is archived or summarised, and no marker
//! is written.

use super::{Rejection, Seeds, Session, SessionRecord};
use crate::facts::LiveFacts;
use crate::span::{Span, SpanClass};

/// The newest live spans taken back, and the record after.
#[derive(Debug, Clone, PartialEq)]
pub struct Retraction {
    /// The revision it was computed against; the store refuses it if the
    /// session has moved on.
    pub expected_revision: u64,
    /// The record after: totals without the spans, revision bumped.
    pub record: SessionRecord,
    /// The spans taken back, in prompt order: the last of the live
    /// context.
    pub spans: Vec<Span>,
}

impl Session {
    /// Takes back the newest `count` live spans; 0 takes back every live
    /// span of the newest turn (the live context's last spans that share
    /// its last span's turn). [`Rejection::NotRetractable`] when the
    /// session holds fewer live spans than asked for, or when a summary is
    /// among them (a compaction stands there; its spans were archived).
    pub fn retract(&self, count: usize, now_ms: u64) -> Result<Retraction, Rejection> {
        let n = self.spans.len();
        let take = match (count, self.spans.last()) {
            (_, None) => {
                return Err(Rejection::NotRetractable {
                    span_id: None,
                    detail: "the session has no live span".into(),
                });
            }
            (0, Some(last)) => self
                .spans
                .iter()
                .rev()
                .take_while(|s| s.turn == last.turn && s.class() != SpanClass::Summary)
                .count()
                .max(1),
            (count, Some(_)) => count,
        };
        if take > n {
            return Err(Rejection::NotRetractable {
                span_id: None,
                detail: format!("{take} spans asked for; the session has {n} live"),
            });
        }
        let tail = &self.spans[n - take..];
        if let Some(summary) = tail.iter().find(|s| s.class() == SpanClass::Summary) {
            return Err(Rejection::NotRetractable {
                span_id: Some(summary.id),
                detail: format!(
                    "span {} is a summary: the spans it stands for were archived by a compaction",
                    summary.id
                ),
            });
        }
        Ok(Retraction {
            expected_revision: self.record.revision,
            record: self.content_record(&self.spans[..n - take], now_ms),
            spans: tail.to_vec(),
        })
    }

    /// Adopts a retraction once the store has acknowledged it.
    pub fn apply_retraction(&mut self, retraction: &Retraction) {
        self.record = retraction.record.clone();
        let keep_len = self.spans.len().saturating_sub(retraction.spans.len());
        let keep: Vec<bool> = (0..self.spans.len()).map(|i| i < keep_len).collect();
        // The spans taken back are the last ones: their facts, or the
        // seeds of those not derived yet, go with them.
        match self.facts.as_mut() {
            Some(facts) if facts.len() + self.seeds.len() == keep.len() => {
                let derived = facts.len();
                facts.retain(&keep[..derived]);
                self.seeds.retain(&keep[derived..]);
            }
            Some(_) => {
                self.facts = None;
                self.seeds = Seeds::default();
            }
            None if self.seeds.len() == keep.len() => self.seeds.retain(&keep),
            None => {}
        }
        self.spans.truncate(keep_len);
    }

    /// The record of this session emptied at `now_ms`: no live span, its
    /// configuration and counters kept (ids, turns and marker counts go
    /// on), revision bumped.
    pub fn reset(&self, now_ms: u64) -> SessionRecord {
        self.content_record(&[], now_ms)
    }

    /// Adopts a reset once the store has acknowledged it.
    pub fn apply_reset(&mut self, record: SessionRecord) {
        self.record = record;
        self.spans.clear();
        self.facts = Some(LiveFacts::default());
        self.seeds = Seeds::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;
    use crate::span::Role;
    use crate::testing::admitted;

    fn session(turns: &[&[Role]]) -> Session {
        let mut record = SessionRecord::new("u", SessionConfig::with_window(10_000), 0);
        let mut spans = Vec::new();
        for (t, roles) in turns.iter().enumerate() {
            for role in roles.iter() {
                let id = spans.len() as u64 + 1;
                let span = admitted(id, t as u64 + 1, *role, &format!("span {id}"));
                record.live_tokens += u64::from(span.tokens);
                record.live_spans += 1;
                spans.push(span);
            }
            record.turns += 1;
        }
        record.next_span_id = spans.len() as u64 + 1;
        Session::new(record, spans)
    }

    #[test]
    fn zero_takes_back_the_newest_turn_and_a_count_the_newest_spans() {
        let mut s = session(&[
            &[Role::User],
            &[Role::Assistant, Role::Tool, Role::Assistant],
        ]);
        // Derive the facts so that the retraction must keep them in step.
        assert!(s.facts().is_some());
        let turn = s.retract(0, 5).unwrap();
        assert_eq!(
            turn.spans.iter().map(|s| s.id).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(turn.record.live_spans, 1);
        assert_eq!(turn.record.revision, s.record.revision + 1);
        assert_eq!(turn.record.next_span_id, s.record.next_span_id);
        let one = s.retract(1, 5).unwrap();
        assert_eq!(one.spans.iter().map(|s| s.id).collect::<Vec<_>>(), [4]);
        let mut after = s.clone();
        after.apply_retraction(&one);
        assert_eq!(after.spans.len(), 3);
        assert_eq!(after.record.live_spans, 3);
        assert!(
            after.facts().is_some(),
            "the facts still describe the spans"
        );
        let all = s.retract(4, 5).unwrap();
        assert_eq!(all.record.live_tokens, 0);
    }

    #[test]
    fn too_many_or_a_summary_is_refused() {
        let mut s = session(&[&[Role::User, Role::Tool]]);
        assert!(matches!(
            s.retract(3, 0),
            Err(Rejection::NotRetractable { span_id: None, .. })
        ));
        s.spans[1].classification.class = SpanClass::Summary;
        assert!(matches!(
            s.retract(1, 0),
            Err(Rejection::NotRetractable {
                span_id: Some(2),
                ..
            })
        ));
        let empty = session(&[]);
        assert!(empty.retract(0, 0).is_err());
    }

    #[test]
    fn a_reset_empties_and_keeps_the_counters() {
        let s = session(&[&[Role::User], &[Role::Tool]]);
        let record = s.reset(9);
        assert_eq!((record.live_spans, record.live_tokens), (0, 0));
        assert_eq!(record.turns, 2);
        assert_eq!(record.next_span_id, 3);
        let mut after = s.clone();
        after.apply_reset(record);
        assert!(after.spans.is_empty());
        assert_eq!(after.record.updated_at_ms, 9);
    }
}
