//! Each stored message from and to its domain type, and the explicit
//! codes enumerations are stored as (a missing field decodes as 0, which
//! is no code, so it is an error rather than a silent default).

use ctxbroker_core::classify::ClassifierTuning;
use ctxbroker_core::config::{
    AnchorPolicy, ClassifierMode, DeclaredWorkload, SessionMode, SummaryPresentation,
    TokenizerKind, TriggerPolicy,
};
use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::plan::{Violation, ViolationKind};
use ctxbroker_core::relevance::RelevanceWeights;
use ctxbroker_core::span::{
    Attributes, ClassSource, Classification, Modality, OriginalForm, Predicate, PredicateSource,
    Role, SpanClass, SummaryInfo,
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
/// The stored code of a summary presentation: 0, what records written
/// before the choice existed hold, is the system span they all had.
fn presentation_code(p: SummaryPresentation) -> u32 {
    match p {
        SummaryPresentation::System => 0,
        SummaryPresentation::User => 1,
    }
}

fn presentation_from(code: u32) -> Result<SummaryPresentation, String> {
    match code {
        0 => Ok(SummaryPresentation::System),
        1 => Ok(SummaryPresentation::User),
        other => Err(format!("unknown summary presentation code {other}")),
    }
}

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
    ToolExchangeSplit = 9,
});

/// A struct literal of `$ty` whose listed fields are taken from `$from`'s
/// fields of the same name (cloned from a reference with `&`, moved
/// otherwise), followed by the fields that need a conversion. Every field
/// is still named once, so a field added on either side without the other
/// fails to compile.
macro_rules! same_fields {
    (&$from:ident => $ty:ident [$($field:ident),+ $(,)?] $($rest:tt)*) => {
        $ty { $($field: Clone::clone(&$from.$field),)+ $($rest)* }
    };
    ($from:ident => $ty:ident [$($field:ident),+ $(,)?] $($rest:tt)*) => {
        $ty { $($field: $from.$field,)+ $($rest)* }
    };
}

pub(super) fn required<T>(value: Option<T>, what: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("missing {what}"))
}

pub(super) fn workload_row(w: &DeclaredWorkload) -> WorkloadRow {
    same_fields!(&w => WorkloadRow [
        window_tokens, alpha, reserved_overhead_tokens, cadence_ms,
        max_single_injection_tokens, max_interval_accumulation_tokens, idle_gaps,
    ])
}

pub(super) fn workload_from(row: WorkloadRow) -> DeclaredWorkload {
    same_fields!(row => DeclaredWorkload [
        window_tokens, alpha, reserved_overhead_tokens, cadence_ms,
        max_single_injection_tokens, max_interval_accumulation_tokens, idle_gaps,
    ])
}

pub(super) fn config_row(c: &SessionConfig) -> ConfigRow {
    let (relevance, tuning) = (&c.relevance, &c.classifier_tuning);
    let tuning =
        same_fields!(&tuning => TuningRow [pin_threshold, pin_phrases, protected_fraction]);
    same_fields!(&c => ConfigRow [
        window_tokens, alpha, soft_watermark, reserved_overhead_tokens, relevance_floor,
        staleness_interval_ms, max_summary_generations, summary_max_tokens, anchor_budget_tokens,
        summary_prefix,
    ]
        trigger: trigger_policy_code(c.trigger),
        summary_presentation: presentation_code(c.summary_presentation),
        tokenizer: tokenizer_code(c.tokenizer),
        classifier: classifier_code(c.classifier),
        anchor_policy: anchor_policy_code(c.anchor_policy),
        mode: mode_code(c.mode),
        workload: c.workload.as_ref().map(workload_row),
        relevance: Some(same_fields!(&relevance => RelevanceRow [
            recency, similarity, length, hint, recency_half_life_turns,
        ])),
        classifier_tuning: Some(tuning),
    )
}

pub(super) fn config_from(row: ConfigRow) -> Result<SessionConfig, String> {
    let relevance = row.relevance.map(|r| {
        same_fields!(r => RelevanceWeights [
            recency, similarity, length, hint, recency_half_life_turns,
        ])
    });
    let tuning = row.classifier_tuning.map(
        |t| same_fields!(t => ClassifierTuning [pin_threshold, pin_phrases, protected_fraction]),
    );
    Ok(same_fields!(row => SessionConfig [
        window_tokens, alpha, soft_watermark, reserved_overhead_tokens, relevance_floor,
        staleness_interval_ms, max_summary_generations, summary_max_tokens, anchor_budget_tokens,
        summary_prefix,
    ]
        trigger: trigger_policy_from(row.trigger)?,
        summary_presentation: presentation_from(row.summary_presentation)?,
        tokenizer: tokenizer_from(row.tokenizer)?,
        classifier: classifier_from(row.classifier)?,
        anchor_policy: anchor_policy_from(row.anchor_policy)?,
        mode: mode_from(row.mode)?,
        workload: row.workload.map(workload_from),
        relevance: relevance.unwrap_or_default(),
        classifier_tuning: tuning.unwrap_or_default(),
    ))
}

pub(super) fn session_row(r: &SessionRecord) -> SessionRow {
    same_fields!(&r => SessionRow [
        id, created_at_ms, updated_at_ms, revision, next_span_id, turns, marker_count,
        compactions, archived_spans, live_tokens, pinned_tokens, live_spans, pinned_spans,
        approval_required, last_compaction_turn, last_admit_ms, last_compaction_ms,
    ] config: Some(config_row(&r.config)), commit_epoch: 0)
}

pub(super) fn session_from(row: SessionRow) -> Result<SessionRecord, String> {
    let config = config_from(required(row.config, "config")?)?;
    Ok(same_fields!(row => SessionRecord [
        id, created_at_ms, updated_at_ms, revision, next_span_id, turns, marker_count,
        compactions, archived_spans, live_tokens, pinned_tokens, live_spans, pinned_spans,
        approval_required, last_compaction_turn, last_admit_ms, last_compaction_ms,
    ] config))
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
    let class = &s.classification;
    same_fields!(&s => SpanRow [
        id, position, text, tokens, generation, turn, relevance_hint, admitted_at_ms,
    ]
        role: role_code(s.role),
        classification: Some(ClassificationRow {
            class: class_code(class.class),
            source: class_source_code(class.source),
            rule: class.rule.clone(),
        }),
        predicate: s.predicate.as_ref().map(predicate_row),
        summary: (s.summary.as_ref())
            .map(|info| same_fields!(&info => SummaryRow [covers, anchors, anchors_dropped])),
        original: s.original.as_ref().map(|o| same_fields!(&o => OriginalRow [text, tokens])),
        attributes: (s.attributes.as_deref())
            .map(|a| same_fields!(&a => AttributesRow [tool_call_id, tool_name, metadata])),
        terms: None,
        facts: None,
    )
}

pub(super) fn span_from(row: SpanRow) -> Result<Span, String> {
    let class = required(row.classification, "classification")?;
    let classification = Classification {
        class: class_from(class.class)?,
        source: class_source_from(class.source)?,
        rule: class.rule,
    };
    let predicate = row.predicate.map(predicate_from).transpose()?;
    let summary = (row.summary)
        .map(|info| same_fields!(info => SummaryInfo [covers, anchors, anchors_dropped]));
    let original = (row.original).map(|o| same_fields!(o => OriginalForm [text, tokens]));
    let attributes = (row.attributes)
        .map(|a| same_fields!(a => Attributes [tool_call_id, tool_name, metadata]))
        .filter(|a| !a.is_empty())
        .map(Box::new);
    let role = role_from(row.role)?;
    Ok(same_fields!(row => Span [
        id, position, text, tokens, generation, turn, relevance_hint, admitted_at_ms,
    ] role, classification, predicate, summary, original, attributes))
}

pub(super) fn violation_row(v: &Violation) -> ViolationRow {
    same_fields!(&v => ViolationRow [span_id, detail, missing_terms] kind: violation_code(v.kind))
}

pub(super) fn violation_from(row: ViolationRow) -> Result<Violation, String> {
    let kind = violation_kind_from(row.kind)?;
    Ok(same_fields!(row => Violation [span_id, detail, missing_terms] kind))
}

pub(super) fn marker_row(m: &Marker) -> MarkerRow {
    same_fields!(&m => MarkerRow [
        seq, session_id, session_seq, tokens_before, tokens_after, incoming_tokens,
        window_tokens, budget_tokens, pinned_tokens, evicted, compressed, summary_span_id,
        summary_generation, pinned_retained, pinned_total, anchors_carried, anchors_dropped,
        at_ms, session_revision, actor, detail, tier_evicted, turn,
    ]
        trigger: trigger_code(m.trigger),
        outcome: outcome_code(m.outcome),
        violations: m.violations.iter().map(violation_row).collect(),
    )
}

pub(super) fn marker_from(row: MarkerRow) -> Result<Marker, String> {
    let violations = row.violations.into_iter().map(violation_from);
    Ok(same_fields!(row => Marker [
        seq, session_id, session_seq, tokens_before, tokens_after, incoming_tokens,
        window_tokens, budget_tokens, pinned_tokens, evicted, compressed, summary_span_id,
        summary_generation, pinned_retained, pinned_total, anchors_carried, anchors_dropped,
        at_ms, session_revision, actor, detail, tier_evicted, turn,
    ]
        trigger: trigger_from(row.trigger)?,
        outcome: outcome_from(row.outcome)?,
        violations: violations.collect::<Result<_, _>>()?,
    ))
}
