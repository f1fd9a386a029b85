//! Pinning a live span as a constraint and releasing one, in place.

use super::{Change, Rejection, Session, Totals, t32};
use crate::marker::{CompactionTrigger, Marker, Outcome};
use crate::predicate;
use crate::span::{ClassSource, Classification, Modality, Span, SpanClass, SpanId};

impl Session {
    /// Pins a live span: it becomes a constraint (class source CALLER)
    /// with a predicate made of the caller's modality and terms where
    /// given and derived from its text otherwise. Re-pinning a constraint
    /// replaces its predicate.
    ///
    /// A span standing in a compressed form keeps that form only if the
    /// form satisfies the new predicate; otherwise its original form is
    /// restored, which is refused as [`Rejection::WrongClass`] when the
    /// original does not fit the budget. Summaries cannot be pinned: they
    /// are the broker's account of evicted spans, not the caller's words.
    pub fn pin(
        &self,
        span_id: SpanId,
        modality: Option<Modality>,
        required_terms: Vec<String>,
        now_ms: u64,
    ) -> Result<Change, Rejection> {
        let at = self.live_index(span_id)?;
        let span = &self.spans[at];
        if span.class() == SpanClass::Summary {
            return Err(Rejection::WrongClass {
                span_id,
                detail: format!(
                    "span {span_id} is a summary written by compaction; pin the spans it stands for instead"
                ),
            });
        }
        let admitted_text = span
            .original
            .as_ref()
            .map_or(span.text.as_str(), |o| o.text.as_str());
        let predicate = predicate::with_caller_parts(admitted_text, modality, required_terms);
        let mut pinned = span.clone();
        pinned.classification = Classification {
            class: SpanClass::Constraint,
            source: ClassSource::Caller,
            rule: String::new(),
        };
        if let Some(original) = &span.original
            && predicate::check(&span.text, span.tokens, original.tokens, &predicate).is_err()
        {
            let live: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
            let restored = live - u64::from(span.tokens) + u64::from(original.tokens);
            let budget = u64::from(self.record.config.budget_tokens());
            if restored > budget {
                return Err(Rejection::WrongClass {
                    span_id,
                    detail: format!(
                        "span {span_id} stands compressed in a form that does not satisfy the new predicate, and its original form ({} tokens) would bring the live context to {restored} tokens, over the budget {budget}",
                        original.tokens
                    ),
                });
            }
            pinned.text = original.text.clone();
            pinned.tokens = original.tokens;
            pinned.original = None;
        }
        pinned.predicate = Some(predicate);
        let record = self.content_record(self.with_span(at, &pinned), now_ms);
        Ok(self.in_place(record, vec![pinned], None))
    }

    /// Releases a constraint: it becomes narrative (class source CALLER),
    /// its predicate is dropped, and it is evictable from now on. The
    /// release is recorded in an UNPIN marker naming who and why.
    ///
    /// A constraint standing compressed gets its original form back when
    /// that fits the budget; otherwise it keeps the compressed text, with
    /// the original still recorded alongside (so the archive holds it when
    /// the span is evicted).
    pub fn unpin(
        &self,
        span_id: SpanId,
        actor: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<Change, Rejection> {
        let at = self.live_index(span_id)?;
        let span = &self.spans[at];
        if !span.is_pinned() {
            return Err(Rejection::WrongClass {
                span_id,
                detail: format!(
                    "span {span_id} is not a constraint; only constraints are unpinned"
                ),
            });
        }
        let live: u64 = self.spans.iter().map(|s| u64::from(s.tokens)).sum();
        let budget = u64::from(self.record.config.budget_tokens());
        let mut released = span.clone();
        released.classification = Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Caller,
            rule: String::new(),
        };
        released.predicate = None;
        if let Some(original) = &span.original
            && live - u64::from(span.tokens) + u64::from(original.tokens) <= budget
        {
            released.text = original.text.clone();
            released.tokens = original.tokens;
            released.original = None;
        }
        let after = Totals::of(self.with_span(at, &released));
        let mut record = self.content_record(self.with_span(at, &released), now_ms);
        record.marker_count += 1;
        let marker = Marker {
            tokens_after: t32(after.live_tokens),
            pinned_tokens: t32(after.pinned_tokens),
            pinned_retained: t32(after.pinned_spans),
            pinned_total: t32(after.pinned_spans),
            detail: format!("span {span_id} unpinned: {reason}"),
            ..self.marker(
                &record,
                CompactionTrigger::Unpin,
                Outcome::Committed,
                actor,
                now_ms,
            )
        };
        Ok(self.in_place(record, vec![released], Some(marker)))
    }

    /// The live context with the span at `at` standing as `span`.
    fn with_span<'a>(&'a self, at: usize, span: &'a Span) -> impl Iterator<Item = &'a Span> {
        self.spans
            .iter()
            .enumerate()
            .map(move |(i, s)| if i == at { span } else { s })
    }

    fn live_index(&self, span_id: SpanId) -> Result<usize, Rejection> {
        self.spans
            .iter()
            .position(|s| s.id == span_id)
            .ok_or(Rejection::SpanNotLive { span_id })
    }
}
