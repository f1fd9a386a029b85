//! Conversions between the wire contract and the domain types. The server
//! is the only crate that knows both.

use ctxbroker_core::admission::CallerPredicate;
use ctxbroker_core::config::{
    AnchorPolicy, ClassifierMode, DeclaredWorkload, SessionConfig, SessionMode,
    SummaryPresentation, TokenizerKind, TriggerPolicy,
};
use ctxbroker_core::marker::{CompactionTrigger, Marker, Outcome};
use ctxbroker_core::plan::{EvictionReason, Verdict, Violation, ViolationKind};
use ctxbroker_core::session::{CallerEdits, PlanOutcome};
use ctxbroker_core::span::{
    Attributes, ClassSource, Modality, Predicate, PredicateSource, Role, Span, SpanClass,
};
use ctxbroker_proto::encoded::Encoded;
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::{SessionRecord, SpanState, StoredSpan};

use crate::broker::TurnSpan;
use crate::config::Limits;
use crate::hub::{FeedStart, SharedMarker};
use crate::tenant::Scope;

/// Milliseconds since the Unix epoch as a protobuf timestamp.
pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        // < 1e9 by construction.
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// A domain enum and its wire twin, whose variants bear the same names:
/// `$to` gives the wire value of a domain one and, for the enums requests
/// carry, `$from` the domain value of a wire one (`None` for UNSPECIFIED,
/// which has no domain value).
macro_rules! twins {
    ($domain:ident <=> $wire:ident, $to:ident, [$($v:ident),+ $(,)?]) => {
        #[doc = concat!("The wire form of a domain `", stringify!($domain), "`.")]
        pub fn $to(value: $domain) -> pb::$wire {
            match value {
                $($domain::$v => pb::$wire::$v,)+
            }
        }
    };
    ($domain:ident <=> $wire:ident, $to:ident, $from:ident, [$($v:ident),+ $(,)?]) => {
        twins!($domain <=> $wire, $to, [$($v),+]);

        #[doc = concat!("The domain form of a wire `", stringify!($wire), "`; `None` for")]
        #[doc = "UNSPECIFIED."]
        pub fn $from(value: pb::$wire) -> Option<$domain> {
            match value {
                pb::$wire::Unspecified => None,
                $(pb::$wire::$v => Some($domain::$v),)+
            }
        }
    };
}

twins!(Role <=> Role, role_to_pb, role_from_pb, [User, Assistant, Tool, System]);
twins!(SpanClass <=> SpanClass, class_to_pb, class_from_pb, [
    Narrative, Constraint, Summary, Protected,
]);
twins!(ClassSource <=> ClassSource, class_source_to_pb, [Caller, Rules, Broker]);
twins!(Modality <=> Modality, modality_to_pb, modality_from_pb, [
    Prohibition, Requirement, Restriction, Correction,
]);
twins!(TriggerPolicy <=> TriggerPolicy, trigger_to_pb, trigger_from_pb, [
    TokenBudget, Hybrid, TimeBased,
]);
twins!(TokenizerKind <=> TokenizerKind, tokenizer_to_pb, tokenizer_from_pb, [
    O200kBase, Cl100kBase, Client,
]);
twins!(ClassifierMode <=> ClassifierMode, classifier_to_pb, classifier_from_pb, [
    Rules, Model, CallerOnly,
]);
twins!(AnchorPolicy <=> AnchorPolicy, anchor_policy_to_pb, anchor_policy_from_pb, [
    Require, Warn,
]);
twins!(SessionMode <=> SessionMode, mode_to_pb, mode_from_pb, [Auto, Approval]);
twins!(CompactionTrigger <=> CompactionTrigger, compaction_trigger_to_pb, [
    HardBudget, SoftWatermark, Staleness, Manual, Unpin,
]);
twins!(Outcome <=> CompactionOutcome, outcome_to_pb, [Committed, Aborted]);
twins!(EvictionReason <=> EvictionReason, eviction_reason_to_pb, [
    BelowFloor, Budget, TierFull,
]);
twins!(ViolationKind <=> ViolationKind, violation_kind_to_pb, [
    PinnedMissing, PredicateUnsatisfied, OverBudget, PinnedExceedBudget, TurnTooLarge,
    GenerationExceeded, AnchorMissing, PlanInconsistent, ToolExchangeSplit,
]);
twins!(SummaryPresentation <=> SummaryPresentation, presentation_to_pb, presentation_from_pb, [
    System, User,
]);

/// Saturates a domain count into the contract's u32 token fields.
pub fn tokens32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The wire state of a span and, when archived, the seq that evicted it
/// (0 otherwise).
pub fn state_to_pb(state: SpanState) -> (pb::SpanState, u64) {
    match state {
        SpanState::Live => (pb::SpanState::Live, 0),
        SpanState::Archived { by_seq } => (pb::SpanState::Archived, by_seq),
    }
}

/// The caller's predicate of a wire one whose modality is known.
pub fn predicate_from_pb(p: pb::Predicate) -> CallerPredicate {
    CallerPredicate {
        modality: modality_from_pb(p.modality()),
        required_terms: p.required_terms,
    }
}

/// The domain form of a turn whose shape is checked (roles known and
/// specified).
pub fn turn_from_pb(spans: Vec<pb::SpanInput>) -> Vec<TurnSpan> {
    spans
        .into_iter()
        .map(|s| TurnSpan {
            role: role_from_pb(s.role()).unwrap_or(Role::User),
            class: class_from_pb(s.span_class()),
            token_count: s.token_count,
            predicate: s.predicate.map(predicate_from_pb),
            relevance_hint: s.relevance_hint,
            idempotency_key: s.idempotency_key,
            text: s.text,
            attributes: Some(Attributes {
                tool_call_id: s.tool_call_id,
                tool_name: s.tool_name,
                metadata: s.metadata.into_iter().collect(),
            })
            .filter(|a| !a.is_empty())
            .map(Box::new),
        })
        .collect()
}

/// The caller's edits of a plan.
pub fn edits_from_pb(
    summary: Option<String>,
    forms: Vec<pb::CompressedForm>,
    actor: String,
) -> CallerEdits {
    CallerEdits {
        summary,
        compressed: forms.into_iter().map(|f| (f.span_id, f.text)).collect(),
        actor,
    }
}

/// Where a watch's feed starts.
pub fn feed_start_from_pb(start: pb::WatchStart, from_seq: u64) -> FeedStart {
    match start {
        pb::WatchStart::Unspecified | pb::WatchStart::FromSeq => FeedStart::Seq(from_seq),
        pb::WatchStart::Oldest => FeedStart::Oldest,
        pb::WatchStart::Now => FeedStart::Now,
    }
}

/// The wire form of the server's limits, saturated into its u32 fields.
pub fn limits_to_pb(limits: &Limits) -> pb::ServerLimits {
    let saturate = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    pb::ServerLimits {
        max_request_bytes: saturate(limits.max_request_bytes),
        max_spans_per_turn: saturate(limits.max_spans_per_turn),
        max_span_bytes: saturate(limits.max_span_bytes),
        max_sessions: u32::try_from(limits.max_sessions).unwrap_or(u32::MAX),
        max_session_id_bytes: saturate(limits.max_session_id_bytes),
        max_window_tokens: limits.max_window_tokens,
        max_concurrent_streams: saturate(limits.max_concurrent_streams),
        marker_retention: limits.marker_retention,
    }
}

/// The wire form of a search hit or listed span.
pub fn span_hit(stored: &StoredSpan, score: f64, snippet: String) -> pb::SpanHit {
    let span = &stored.span;
    let (state, archived_by_seq) = state_to_pb(stored.state);
    pb::SpanHit {
        span_id: span.id,
        role: role_to_pb(span.role) as i32,
        span_class: class_to_pb(span.class()) as i32,
        turn: span.turn,
        state: state as i32,
        archived_by_seq,
        generation: span.generation,
        tokens: span.tokens,
        score,
        snippet,
    }
}

/// The wire form of a predicate.
pub fn predicate_to_pb(predicate: &Predicate) -> pb::Predicate {
    pb::Predicate {
        modality: modality_to_pb(predicate.modality) as i32,
        required_terms: predicate.required_terms.clone(),
        source: match predicate.source {
            PredicateSource::Derived => pb::PredicateSource::Derived,
            PredicateSource::Caller => pb::PredicateSource::Caller,
        } as i32,
    }
}

/// The wire form of a span. `relevance` is filled where it was computed.
pub fn span_to_pb(span: &Span, state: SpanState, relevance: f64) -> pb::Span {
    let (state, archived_by_seq) = state_to_pb(state);
    let attributes = span.attributes.as_deref().cloned().unwrap_or_default();
    pb::Span {
        span_id: span.id,
        role: role_to_pb(span.role) as i32,
        span_class: class_to_pb(span.classification.class) as i32,
        class_source: class_source_to_pb(span.classification.source) as i32,
        class_rule: span.classification.rule.clone(),
        text: span.text.clone(),
        tokens: span.tokens,
        generation: span.generation,
        turn: span.turn,
        predicate: span.predicate.as_ref().map(predicate_to_pb),
        summarized_span_ids: span
            .summary
            .as_ref()
            .map(|s| s.covers.clone())
            .unwrap_or_default(),
        anchors: span
            .summary
            .as_ref()
            .map(|s| s.anchors.clone())
            .unwrap_or_default(),
        state: state as i32,
        relevance,
        admitted_at: Some(timestamp(span.admitted_at_ms)),
        archived_by_seq,
        relevance_hint: span.relevance_hint,
        original_text: span
            .original
            .as_ref()
            .map(|o| o.text.clone())
            .unwrap_or_default(),
        original_tokens: span.original.as_ref().map_or(0, |o| o.tokens),
        tool_call_id: attributes.tool_call_id,
        tool_name: attributes.tool_name,
        metadata: attributes.metadata.into_iter().collect(),
    }
}

/// The stable name of a violation kind, as in the contract's enum.
pub fn violation_kind_name(kind: ViolationKind) -> &'static str {
    violation_kind_to_pb(kind).as_str_name()
}

/// The wire form of a violation.
pub fn violation_to_pb(violation: &Violation) -> pb::Violation {
    pb::Violation {
        kind: violation_kind_to_pb(violation.kind) as i32,
        span_id: violation.span_id.unwrap_or(0),
        detail: violation.detail.clone(),
        missing_terms: violation.missing_terms.clone(),
    }
}

/// The wire form of a marker.
pub fn marker_to_pb(marker: &Marker) -> pb::CompactionMarker {
    pb::CompactionMarker {
        seq: marker.seq,
        session_id: marker.session_id.clone(),
        session_seq: marker.session_seq,
        trigger: compaction_trigger_to_pb(marker.trigger) as i32,
        outcome: outcome_to_pb(marker.outcome) as i32,
        tokens_before: marker.tokens_before,
        tokens_after: marker.tokens_after,
        incoming_tokens: marker.incoming_tokens,
        window_tokens: marker.window_tokens,
        budget_tokens: marker.budget_tokens,
        evicted_span_ids: marker.evicted.clone(),
        tier_evicted_span_ids: marker.tier_evicted.clone(),
        compressed_span_ids: marker.compressed.clone(),
        summary_span_id: marker.summary_span_id,
        summary_generation: marker.summary_generation,
        pinned_retained: marker.pinned_retained,
        pinned_total: marker.pinned_total,
        anchors_carried: marker.anchors_carried,
        anchors_dropped: marker.anchors_dropped,
        violations: marker.violations.iter().map(violation_to_pb).collect(),
        at: Some(timestamp(marker.at_ms)),
        pinned_tokens: marker.pinned_tokens,
        session_revision: marker.session_revision,
        turn: marker.turn,
        actor: marker.actor.clone(),
        detail: marker.detail.clone(),
    }
}

/// The `WatchCompactions` event that delivers a marker.
pub fn watch_marker_event(marker: &Marker) -> pb::WatchCompactionsResponse {
    pb::WatchCompactionsResponse {
        event: Some(pb::watch_compactions_response::Event::Marker(marker_to_pb(
            marker,
        ))),
    }
}

/// [`watch_marker_event`] encoded, once per marker: the first watch that
/// delivers the marker encodes it and every other watch sends the same
/// bytes, which are what encoding the event itself writes.
pub fn watch_marker(marker: &SharedMarker) -> Encoded<pb::WatchCompactionsResponse> {
    Encoded::from_bytes(marker.wire(|m| Encoded::new(&watch_marker_event(m)).into_bytes()))
}

/// [`watch_marker`] as a watcher in `scope` receives it: operators get the
/// shared form, a tenant's watchers the form that names the session by
/// its bare id (also encoded once per marker).
pub fn watch_marker_in(
    marker: &SharedMarker,
    scope: &Scope,
) -> Encoded<pb::WatchCompactionsResponse> {
    if scope.tenant_name().is_none() {
        return watch_marker(marker);
    }
    Encoded::from_bytes(
        marker.tenant_wire(scope, |m| Encoded::new(&watch_marker_event(m)).into_bytes()),
    )
}

/// The `WatchCompactions` event that ends a watch's replay, encoded.
pub fn watch_caught_up(next_seq: u64) -> Encoded<pb::WatchCompactionsResponse> {
    Encoded::new(&pb::WatchCompactionsResponse {
        event: Some(pb::watch_compactions_response::Event::CaughtUp(
            pb::CaughtUp { next_seq },
        )),
    })
}

/// The wire form of a declared workload.
pub fn workload_to_pb(w: &DeclaredWorkload) -> pb::DeclaredWorkload {
    pb::DeclaredWorkload {
        window_tokens: w.window_tokens,
        alpha: w.alpha,
        reserved_overhead_tokens: w.reserved_overhead_tokens,
        cadence_ms: w.cadence_ms,
        max_single_injection_tokens: w.max_single_injection_tokens,
        max_interval_accumulation_tokens: w.max_interval_accumulation_tokens,
        idle_gaps: w.idle_gaps,
    }
}

/// The domain form of a wire workload.
pub fn workload_from_pb(w: &pb::DeclaredWorkload) -> DeclaredWorkload {
    DeclaredWorkload {
        window_tokens: w.window_tokens,
        alpha: w.alpha,
        reserved_overhead_tokens: w.reserved_overhead_tokens,
        cadence_ms: w.cadence_ms,
        max_single_injection_tokens: w.max_single_injection_tokens,
        max_interval_accumulation_tokens: w.max_interval_accumulation_tokens,
        idle_gaps: w.idle_gaps,
    }
}

/// The wire form of an effective configuration, every field set.
pub fn config_to_pb(c: &SessionConfig) -> pb::SessionConfig {
    pb::SessionConfig {
        window_tokens: Some(c.window_tokens),
        alpha: Some(c.alpha),
        soft_watermark: Some(c.soft_watermark),
        reserved_overhead_tokens: Some(c.reserved_overhead_tokens),
        relevance_floor: Some(c.relevance_floor),
        trigger: trigger_to_pb(c.trigger) as i32,
        staleness_interval_ms: Some(c.staleness_interval_ms),
        tokenizer: tokenizer_to_pb(c.tokenizer) as i32,
        classifier: classifier_to_pb(c.classifier) as i32,
        max_summary_generations: Some(c.max_summary_generations),
        anchor_policy: anchor_policy_to_pb(c.anchor_policy) as i32,
        mode: mode_to_pb(c.mode) as i32,
        summary_max_tokens: Some(c.effective_summary_max_tokens()),
        workload: c.workload.as_ref().map(workload_to_pb),
        relevance: Some(pb::RelevanceWeights {
            recency: Some(c.relevance.recency),
            similarity: Some(c.relevance.similarity),
            length: Some(c.relevance.length),
            hint: Some(c.relevance.hint),
            recency_half_life_turns: Some(c.relevance.recency_half_life_turns),
        }),
        anchor_budget_tokens: Some(c.effective_anchor_budget_tokens()),
        classifier_tuning: Some(pb::ClassifierTuning {
            pin_threshold: Some(
                c.classifier_tuning
                    .pin_threshold
                    .unwrap_or(ctxbroker_core::classify::model::builtin().pin_threshold),
            ),
            pin_phrases: c.classifier_tuning.pin_phrases.clone(),
            protected_fraction: Some(c.classifier_tuning.effective_protected_fraction()),
        }),
        summary_presentation: presentation_to_pb(c.summary_presentation) as i32,
        summary_prefix: Some(c.effective_summary_prefix().to_owned()),
    }
}

/// The wire totals of a session record.
pub fn totals_to_pb(record: &SessionRecord) -> pb::ContextTotals {
    let c = &record.config;
    pb::ContextTotals {
        live_tokens: tokens32(record.live_tokens),
        pinned_tokens: tokens32(record.pinned_tokens),
        budget_tokens: c.budget_tokens(),
        window_tokens: c.window_tokens,
        soft_watermark_tokens: c.soft_watermark_tokens(),
        live_spans: tokens32(record.live_spans),
        pinned_spans: tokens32(record.pinned_spans),
    }
}

/// The wire form of a session.
pub fn session_to_pb(record: &SessionRecord) -> pb::Session {
    pb::Session {
        session_id: record.id.clone(),
        config: Some(config_to_pb(&record.config)),
        revision: record.revision,
        totals: Some(totals_to_pb(record)),
        turns: record.turns,
        compactions: record.compactions,
        archived_spans: record.archived_spans,
        created_at: Some(timestamp(record.created_at_ms)),
        updated_at: Some(timestamp(record.updated_at_ms)),
        approval_required: record.approval_required || record.config.mode == SessionMode::Approval,
    }
}

/// The wire form of a verification.
pub fn verdict_to_pb(verdict: &Verdict) -> pb::Verification {
    pb::Verification {
        passed: verdict.passed(),
        violations: verdict.violations.iter().map(violation_to_pb).collect(),
    }
}

/// The wire form of a plan, with the ids it keeps in prompt order.
pub fn plan_to_pb(outcome: &PlanOutcome, revision: u64) -> pb::CompactionPlan {
    let plan = &outcome.plan;
    pb::CompactionPlan {
        plan_id: outcome.plan_id.to_string(),
        session_revision: revision,
        evicted: plan
            .evicted
            .iter()
            .map(|e| pb::EvictedSpan {
                span_id: e.span_id,
                relevance: e.relevance,
                reason: eviction_reason_to_pb(e.reason) as i32,
                tokens: e.tokens,
            })
            .collect(),
        kept_span_ids: outcome.kept.clone(),
        compressed: plan
            .compressed
            .iter()
            .map(|c| pb::CompressedForm {
                span_id: c.span_id,
                text: c.text.clone(),
                tokens: c.tokens,
            })
            .collect(),
        summary_draft: plan
            .summary
            .as_ref()
            .map(|s| span_to_pb(s, SpanState::Live, 0.0)),
        tokens_before: tokens32(plan.tokens_before),
        tokens_after: tokens32(plan.tokens_after),
        incoming_tokens: tokens32(plan.incoming_tokens),
        target_tokens: tokens32(plan.target_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_split_milliseconds() {
        let ts = timestamp(1_700_000_123_456);
        assert_eq!(ts.seconds, 1_700_000_123);
        assert_eq!(ts.nanos, 456_000_000);
    }

    fn markers() -> Vec<Marker> {
        let committed = Marker {
            seq: 41,
            session_id: "agent-7".into(),
            session_seq: 3,
            trigger: CompactionTrigger::SoftWatermark,
            outcome: Outcome::Committed,
            tokens_before: 1_900,
            tokens_after: 700,
            incoming_tokens: 120,
            window_tokens: 2_000,
            budget_tokens: 1_800,
            pinned_tokens: 35,
            evicted: vec![4, 5, 6, 300_000],
            tier_evicted: vec![5],
            compressed: vec![9],
            summary_span_id: Some(0),
            summary_generation: 2,
            pinned_retained: 1,
            pinned_total: 1,
            anchors_carried: 4,
            anchors_dropped: 1,
            violations: vec![],
            at_ms: 1_700_000_123_456,
            session_revision: 12,
            turn: 31,
            actor: "operator".into(),
            detail: "evicted 4 spans; summary ✓".into(),
        };
        let aborted = Marker {
            outcome: Outcome::Aborted,
            trigger: CompactionTrigger::Unpin,
            tokens_after: 1_900,
            summary_span_id: None,
            violations: vec![Violation {
                kind: ViolationKind::PinnedMissing,
                span_id: Some(2),
                detail: "constraint 2 is missing".into(),
                missing_terms: vec!["prod".into(), "eu-west".into()],
            }],
            ..committed.clone()
        };
        // Every field at its default: nothing but the timestamp is written.
        let empty = Marker {
            seq: 0,
            session_id: String::new(),
            session_seq: 0,
            trigger: CompactionTrigger::HardBudget,
            outcome: Outcome::Committed,
            tokens_before: 0,
            tokens_after: 0,
            incoming_tokens: 0,
            window_tokens: 0,
            budget_tokens: 0,
            pinned_tokens: 0,
            evicted: vec![],
            tier_evicted: vec![],
            compressed: vec![],
            summary_span_id: None,
            summary_generation: 0,
            pinned_retained: 0,
            pinned_total: 0,
            anchors_carried: 0,
            anchors_dropped: 0,
            violations: vec![],
            at_ms: 0,
            session_revision: 0,
            turn: 0,
            actor: String::new(),
            detail: String::new(),
        };
        vec![committed, aborted, empty]
    }

    #[test]
    fn a_watched_marker_is_encoded_once_exactly_as_its_event_encodes() {
        use prost::Message;
        for marker in markers() {
            let expected = pb::WatchCompactionsResponse {
                event: Some(pb::watch_compactions_response::Event::Marker(marker_to_pb(
                    &marker,
                ))),
            };
            let shared = SharedMarker::new(marker.clone());
            let first = watch_marker(&shared);
            assert_eq!(first.as_bytes().as_ref(), expected.encode_to_vec());
            // What the codec writes for it.
            assert_eq!(first.encode_to_vec(), expected.encode_to_vec());
            assert_eq!(
                pb::WatchCompactionsResponse::decode(first.as_bytes().clone()).unwrap(),
                expected,
                "{marker:?}"
            );
            let again = watch_marker(&shared);
            assert_eq!(
                again.as_bytes().as_ptr(),
                first.as_bytes().as_ptr(),
                "encoded once, then shared"
            );
        }
    }

    #[test]
    fn caught_up_is_encoded_as_its_event_encodes() {
        use prost::Message;
        let expected = pb::WatchCompactionsResponse {
            event: Some(pb::watch_compactions_response::Event::CaughtUp(
                pb::CaughtUp { next_seq: 1 << 40 },
            )),
        };
        assert_eq!(
            watch_caught_up(1 << 40).encode_to_vec(),
            expected.encode_to_vec()
        );
    }

    #[test]
    fn every_violation_kind_has_its_contract_name() {
        assert_eq!(
            violation_kind_name(ViolationKind::PinnedExceedBudget),
            "VIOLATION_KIND_PINNED_EXCEED_BUDGET"
        );
        assert_eq!(
            violation_kind_name(ViolationKind::TurnTooLarge),
            "VIOLATION_KIND_TURN_TOO_LARGE"
        );
    }
}
