//! Each stored message from and to its domain type, and the explicit
//! codes enumerations are stored as (a missing field decodes as 0, which
//! is no code, so it is an error rather than a silent default).

use ctxbroker_core::classify::ClassifierTuning;
use ctxbroker_core::config::{
    AnchorPolicy, ClassifierMode, DeclaredWorkload, SessionMode, TokenizerKind, TriggerPolicy,
};
use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::plan::{Violation, ViolationKind};
use ctxbroker_core::relevance::RelevanceWeights;
use ctxbroker_core::span::{
    ClassSource, Classification, Modality, OriginalForm, Predicate, PredicateSource, Role,
    SpanClass, SummaryInfo,
};
use ctxbroker_core::{Marker, SessionConfig, Span};

use super::rows::*;
use crate::model::SessionRecord;

macro_rules! codes {
    ($ty:ty, $to:ident, $from:ident, $what:literal, { $($variant:ident = $code:literal),+ $(,)? }) => {
        fn $to(value: $ty) -> u32 {
            match value {
                $(<$ty>::$variant => $code,)+
            }
        }

        fn $from(code: u32) -> Result<$ty, String> {
            match code {
                $($code => Ok(<$ty>::$variant),)+
                other => Err(format!(concat!("unknown ", $what, " code {}"), other)),
            }
        }
    };
}

codes!(Role, role_code, role_from, "role", {
    User = 1, Assistant = 2, Tool = 3, System = 4,
});
codes!(SpanClass, class_code, class_from, "span class", {
    Narrative = 1, Constraint = 2, Summary = 3, Protected = 4,
});
codes!(ClassSource, class_source_code, class_source_from, "class source", {
    Caller = 1, Rules = 2, Broker = 3,
});
codes!(Modality, modality_code, modality_from, "modality", {
    Prohibition = 1, Requirement = 2, Restriction = 3, Correction = 4,
});
codes!(PredicateSource, predicate_source_code, predicate_source_from, "predicate source", {
    Derived = 1, Caller = 2,
});
codes!(TriggerPolicy, trigger_policy_code, trigger_policy_from, "trigger policy", {
    TokenBudget = 1, Hybrid = 2, TimeBased = 3,
});
codes!(TokenizerKind, tokenizer_code, tokenizer_from, "tokenizer", {
    O200kBase = 1, Cl100kBase = 2, Client = 3,
});
codes!(ClassifierMode, classifier_code, classifier_from, "classifier mode", {
    Rules = 1, CallerOnly = 2, Model = 3,
});
codes!(AnchorPolicy, anchor_policy_code, anchor_policy_from, "anchor policy", {
    Require = 1, Warn = 2,
});
codes!(SessionMode, mode_code, mode_from, "session mode", {
    Auto = 1, Approval = 2,
});
codes!(CompactionTrigger, trigger_code, trigger_from, "compaction trigger", {
    HardBudget = 1, SoftWatermark = 2, Staleness = 3, Manual = 4, Unpin = 5,
});
codes!(Outcome, outcome_code, outcome_from, "outcome", {
    Committed = 1, Aborted = 2,
});
codes!(ViolationKind, violation_code, violation_kind_from, "violation kind", {
    PinnedMissing = 1,
    PredicateUnsatisfied = 2,
    OverBudget = 3,
    PinnedExceedBudget = 4,
    TurnTooLarge = 5,
    GenerationExceeded = 6,
    AnchorMissing = 7,
    PlanInconsistent = 8,
});

pub(super) fn required<T>(value: Option<T>, what: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("missing {what}"))
}

pub(super) fn workload_row(w: &DeclaredWorkload) -> WorkloadRow {
    WorkloadRow {
        window_tokens: w.window_tokens,
        alpha: w.alpha,
        reserved_overhead_tokens: w.reserved_overhead_tokens,
        cadence_ms: w.cadence_ms,
        max_single_injection_tokens: w.max_single_injection_tokens,
        max_interval_accumulation_tokens: w.max_interval_accumulation_tokens,
        idle_gaps: w.idle_gaps,
    }
}

pub(super) fn workload_from(row: WorkloadRow) -> DeclaredWorkload {
    DeclaredWorkload {
        window_tokens: row.window_tokens,
        alpha: row.alpha,
        reserved_overhead_tokens: row.reserved_overhead_tokens,
        cadence_ms: row.cadence_ms,
        max_single_injection_tokens: row.max_single_injection_tokens,
        max_interval_accumulation_tokens: row.max_interval_accumulation_tokens,
        idle_gaps: row.idle_gaps,
    }
}

pub(super) fn config_row(c: &SessionConfig) -> ConfigRow {
    ConfigRow {
        window_tokens: c.window_tokens,
        alpha: c.alpha,
        soft_watermark: c.soft_watermark,
        reserved_overhead_tokens: c.reserved_overhead_tokens,
        relevance_floor: c.relevance_floor,
        trigger: trigger_policy_code(c.trigger),
        staleness_interval_ms: c.staleness_interval_ms,
        tokenizer: tokenizer_code(c.tokenizer),
        classifier: classifier_code(c.classifier),
        max_summary_generations: c.max_summary_generations,
        anchor_policy: anchor_policy_code(c.anchor_policy),
        mode: mode_code(c.mode),
        summary_max_tokens: c.summary_max_tokens,
        workload: c.workload.as_ref().map(workload_row),
        relevance: Some(RelevanceRow {
            recency: c.relevance.recency,
            similarity: c.relevance.similarity,
            length: c.relevance.length,
            hint: c.relevance.hint,
            recency_half_life_turns: c.relevance.recency_half_life_turns,
        }),
        anchor_budget_tokens: c.anchor_budget_tokens,
        classifier_tuning: Some(TuningRow {
            pin_threshold: c.classifier_tuning.pin_threshold,
            pin_phrases: c.classifier_tuning.pin_phrases.clone(),
            protected_fraction: c.classifier_tuning.protected_fraction,
        }),
    }
}

pub(super) fn config_from(row: ConfigRow) -> Result<SessionConfig, String> {
    Ok(SessionConfig {
        window_tokens: row.window_tokens,
        alpha: row.alpha,
        soft_watermark: row.soft_watermark,
        reserved_overhead_tokens: row.reserved_overhead_tokens,
        relevance_floor: row.relevance_floor,
        trigger: trigger_policy_from(row.trigger)?,
        staleness_interval_ms: row.staleness_interval_ms,
        tokenizer: tokenizer_from(row.tokenizer)?,
        classifier: classifier_from(row.classifier)?,
        max_summary_generations: row.max_summary_generations,
        anchor_policy: anchor_policy_from(row.anchor_policy)?,
        mode: mode_from(row.mode)?,
        summary_max_tokens: row.summary_max_tokens,
        workload: row.workload.map(workload_from),
        relevance: row
            .relevance
            .map(|r| RelevanceWeights {
                recency: r.recency,
                similarity: r.similarity,
                length: r.length,
                hint: r.hint,
                recency_half_life_turns: r.recency_half_life_turns,
            })
            .unwrap_or_default(),
        anchor_budget_tokens: row.anchor_budget_tokens,
        classifier_tuning: row
            .classifier_tuning
            .map(|t| ClassifierTuning {
                pin_threshold: t.pin_threshold,
                pin_phrases: t.pin_phrases,
                protected_fraction: t.protected_fraction,
            })
            .unwrap_or_default(),
    })
}

pub(super) fn session_row(r: &SessionRecord) -> SessionRow {
    SessionRow {
        id: r.id.clone(),
        config: Some(config_row(&r.config)),
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        revision: r.revision,
        next_span_id: r.next_span_id,
        turns: r.turns,
        marker_count: r.marker_count,
        compactions: r.compactions,
        archived_spans: r.archived_spans,
        live_tokens: r.live_tokens,
        pinned_tokens: r.pinned_tokens,
        live_spans: r.live_spans,
        pinned_spans: r.pinned_spans,
        approval_required: r.approval_required,
        last_compaction_turn: r.last_compaction_turn,
        last_admit_ms: r.last_admit_ms,
        last_compaction_ms: r.last_compaction_ms,
    }
}

pub(super) fn session_from(row: SessionRow) -> Result<SessionRecord, String> {
    Ok(SessionRecord {
        id: row.id,
        config: config_from(required(row.config, "config")?)?,
        created_at_ms: row.created_at_ms,
        updated_at_ms: row.updated_at_ms,
        revision: row.revision,
        next_span_id: row.next_span_id,
        turns: row.turns,
        marker_count: row.marker_count,
        compactions: row.compactions,
        archived_spans: row.archived_spans,
        live_tokens: row.live_tokens,
        pinned_tokens: row.pinned_tokens,
        live_spans: row.live_spans,
        pinned_spans: row.pinned_spans,
        approval_required: row.approval_required,
        last_compaction_turn: row.last_compaction_turn,
        last_admit_ms: row.last_admit_ms,
        last_compaction_ms: row.last_compaction_ms,
    })
}

pub(super) fn predicate_row(p: &Predicate) -> PredicateRow {
    PredicateRow {
        modality: modality_code(p.modality),
        required_terms: p.required_terms.clone(),
        source: predicate_source_code(p.source),
    }
}

pub(super) fn predicate_from(row: PredicateRow) -> Result<Predicate, String> {
    Ok(Predicate {
        modality: modality_from(row.modality)?,
        required_terms: row.required_terms,
        source: predicate_source_from(row.source)?,
    })
}

pub(super) fn span_row(s: &Span) -> SpanRow {
    SpanRow {
        id: s.id,
        position: s.position,
        role: role_code(s.role),
        classification: Some(ClassificationRow {
            class: class_code(s.classification.class),
            source: class_source_code(s.classification.source),
            rule: s.classification.rule.clone(),
        }),
        text: s.text.clone(),
        tokens: s.tokens,
        generation: s.generation,
        turn: s.turn,
        predicate: s.predicate.as_ref().map(predicate_row),
        summary: s.summary.as_ref().map(|info| SummaryRow {
            covers: info.covers.clone(),
            anchors: info.anchors.clone(),
            anchors_dropped: info.anchors_dropped,
        }),
        relevance_hint: s.relevance_hint,
        admitted_at_ms: s.admitted_at_ms,
        original: s.original.as_ref().map(|o| OriginalRow {
            text: o.text.clone(),
            tokens: o.tokens,
        }),
    }
}

pub(super) fn span_from(row: SpanRow) -> Result<Span, String> {
    let class = required(row.classification, "classification")?;
    Ok(Span {
        id: row.id,
        position: row.position,
        role: role_from(row.role)?,
        classification: Classification {
            class: class_from(class.class)?,
            source: class_source_from(class.source)?,
            rule: class.rule,
        },
        text: row.text,
        tokens: row.tokens,
        generation: row.generation,
        turn: row.turn,
        predicate: row.predicate.map(predicate_from).transpose()?,
        summary: row.summary.map(|info| SummaryInfo {
            covers: info.covers,
            anchors: info.anchors,
            anchors_dropped: info.anchors_dropped,
        }),
        relevance_hint: row.relevance_hint,
        admitted_at_ms: row.admitted_at_ms,
        original: row.original.map(|o| OriginalForm {
            text: o.text,
            tokens: o.tokens,
        }),
    })
}

pub(super) fn violation_row(v: &Violation) -> ViolationRow {
    ViolationRow {
        kind: violation_code(v.kind),
        span_id: v.span_id,
        detail: v.detail.clone(),
        missing_terms: v.missing_terms.clone(),
    }
}

pub(super) fn violation_from(row: ViolationRow) -> Result<Violation, String> {
    Ok(Violation {
        kind: violation_kind_from(row.kind)?,
        span_id: row.span_id,
        detail: row.detail,
        missing_terms: row.missing_terms,
    })
}

pub(super) fn marker_row(m: &Marker) -> MarkerRow {
    MarkerRow {
        seq: m.seq,
        session_id: m.session_id.clone(),
        session_seq: m.session_seq,
        trigger: trigger_code(m.trigger),
        outcome: outcome_code(m.outcome),
        tokens_before: m.tokens_before,
        tokens_after: m.tokens_after,
        incoming_tokens: m.incoming_tokens,
        window_tokens: m.window_tokens,
        budget_tokens: m.budget_tokens,
        pinned_tokens: m.pinned_tokens,
        evicted: m.evicted.clone(),
        compressed: m.compressed.clone(),
        summary_span_id: m.summary_span_id,
        summary_generation: m.summary_generation,
        pinned_retained: m.pinned_retained,
        pinned_total: m.pinned_total,
        anchors_carried: m.anchors_carried,
        anchors_dropped: m.anchors_dropped,
        violations: m.violations.iter().map(violation_row).collect(),
        at_ms: m.at_ms,
        session_revision: m.session_revision,
        actor: m.actor.clone(),
        detail: m.detail.clone(),
        tier_evicted: m.tier_evicted.clone(),
    }
}

pub(super) fn marker_from(row: MarkerRow) -> Result<Marker, String> {
    Ok(Marker {
        seq: row.seq,
        session_id: row.session_id,
        session_seq: row.session_seq,
        trigger: trigger_from(row.trigger)?,
        outcome: outcome_from(row.outcome)?,
        tokens_before: row.tokens_before,
        tokens_after: row.tokens_after,
        incoming_tokens: row.incoming_tokens,
        window_tokens: row.window_tokens,
        budget_tokens: row.budget_tokens,
        pinned_tokens: row.pinned_tokens,
        evicted: row.evicted,
        compressed: row.compressed,
        summary_span_id: row.summary_span_id,
        summary_generation: row.summary_generation,
        pinned_retained: row.pinned_retained,
        pinned_total: row.pinned_total,
        anchors_carried: row.anchors_carried,
        anchors_dropped: row.anchors_dropped,
        violations: row
            .violations
            .into_iter()
            .map(violation_from)
            .collect::<Result<_, _>>()?,
        at_ms: row.at_ms,
        session_revision: row.session_revision,
        actor: row.actor,
        detail: row.detail,
        tier_evicted: row.tier_evicted,
    })
}
