//! Request validation. Every check names the field and the limit; a request
//! with any bad field changes nothing.

use ctxbroker_core::classify::ClassifierTuning;
use ctxbroker_core::config::{SessionConfig, TokenizerKind, TriggerPolicy};
use ctxbroker_core::trigger;
use ctxbroker_proto::v1 as pb;

use crate::broker::TurnSpan;
use crate::config::Limits;
use crate::convert::{
    anchor_policy_from_pb, classifier_from_pb, mode_from_pb, presentation_from_pb,
    tokenizer_from_pb, trigger_from_pb, workload_from_pb,
};
use crate::error::{ApiError, BadField};

/// Checks a session id: 1 to `max_session_id_bytes` bytes of
/// `[A-Za-z0-9._:-]`. The character set keeps ids safe in logs, metrics
/// labels, URLs and routing headers.
pub fn session_id(field: &str, id: &str, limits: &Limits) -> Result<(), BadField> {
    if id.is_empty() {
        return Err(BadField::new(field, "must not be empty"));
    }
    if id.len() > limits.max_session_id_bytes {
        return Err(BadField::new(
            field,
            format!(
                "must be at most {} bytes; got {}",
                limits.max_session_id_bytes,
                id.len()
            ),
        ));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(BadField::new(
            field,
            format!("may only contain A-Z, a-z, 0-9, '.', '_', ':' and '-'; found {bad:?}"),
        ));
    }
    Ok(())
}

/// Checks a full session id as an operator names it: a session id, or
/// `tenant/session` for a session of a tenant.
pub fn full_session_id(field: &str, id: &str, limits: &Limits) -> Result<(), BadField> {
    match id.split_once(crate::tenant::SEPARATOR) {
        Some((tenant, session)) => {
            crate::tenant::check_tenant(field, tenant)?;
            session_id(field, session, limits)
        }
        None => session_id(field, id, limits),
    }
}

/// Checks a session id as a caller in `scope` names it: a bare id for a
/// tenant, a bare or full id for an operator.
pub fn named_session_id(
    scope: &crate::tenant::Scope,
    field: &str,
    id: &str,
    limits: &Limits,
) -> Result<(), BadField> {
    match scope.tenant_name() {
        Some(_) => session_id(field, id, limits),
        None => full_session_id(field, id, limits),
    }
}

/// Turns a single bad field into the request's error.
pub fn single(bad: BadField) -> ApiError {
    ApiError::InvalidArgument(vec![bad])
}

/// Fails with every collected bad field, if any.
pub fn finish(bad: Vec<BadField>) -> Result<(), ApiError> {
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ApiError::InvalidArgument(bad))
    }
}

/// The configuration of a new session: the request's fields over the
/// defaults. `window_tokens` is required.
pub fn create_config(
    config: Option<&pb::SessionConfig>,
    limits: &Limits,
) -> Result<SessionConfig, ApiError> {
    let Some(config) = config else {
        return Err(single(BadField::new(
            "config",
            "is required: window_tokens has no default",
        )));
    };
    let Some(window) = config.window_tokens else {
        return Err(single(BadField::new(
            "config.window_tokens",
            "is required (the model's context window in tokens)",
        )));
    };
    let base = SessionConfig::with_window(window);
    merge(base, config, limits, true)
}

/// The configuration after an update: the request's set fields over the
/// current configuration.
pub fn update_config(
    current: &SessionConfig,
    patch: &pb::SessionConfig,
    limits: &Limits,
) -> Result<SessionConfig, ApiError> {
    merge(current.clone(), patch, limits, false)
}

fn enum_value<E: TryFrom<i32>>(field: &str, value: i32, bad: &mut Vec<BadField>) -> Option<E> {
    match E::try_from(value) {
        Ok(v) => Some(v),
        Err(_) => {
            bad.push(BadField::new(field, format!("unknown enum value {value}")));
            None
        }
    }
}

fn merge(
    mut c: SessionConfig,
    p: &pb::SessionConfig,
    limits: &Limits,
    creating: bool,
) -> Result<SessionConfig, ApiError> {
    let mut bad = Vec::new();
    if let Some(w) = p.window_tokens {
        c.window_tokens = w;
    }
    if let Some(a) = p.alpha {
        c.alpha = a;
    }
    if let Some(s) = p.soft_watermark {
        c.soft_watermark = s;
    }
    if let Some(o) = p.reserved_overhead_tokens {
        c.reserved_overhead_tokens = o;
    }
    if let Some(f) = p.relevance_floor {
        c.relevance_floor = f;
    }
    if let Some(s) = p.staleness_interval_ms {
        c.staleness_interval_ms = s;
    }
    if let Some(g) = p.max_summary_generations {
        c.max_summary_generations = g;
    }
    if let Some(m) = p.summary_max_tokens {
        c.summary_max_tokens = m;
    }
    if let Some(t) = enum_value("config.trigger", p.trigger, &mut bad).and_then(trigger_from_pb) {
        c.trigger = t;
    }
    let tokenizer = enum_value("config.tokenizer", p.tokenizer, &mut bad);
    if let Some(kind) = tokenizer.and_then(tokenizer_from_pb) {
        if creating {
            c.tokenizer = kind;
        } else if kind != c.tokenizer {
            bad.push(BadField::new(
                "config.tokenizer",
                "cannot change after the session is created: every stored count is in the original tokenizer",
            ));
        }
    }
    let classifier = enum_value("config.classifier", p.classifier, &mut bad);
    if let Some(mode) = classifier.and_then(classifier_from_pb) {
        c.classifier = mode;
    }
    let anchors = enum_value("config.anchor_policy", p.anchor_policy, &mut bad);
    if let Some(policy) = anchors.and_then(anchor_policy_from_pb) {
        c.anchor_policy = policy;
    }
    if let Some(mode) = enum_value("config.mode", p.mode, &mut bad).and_then(mode_from_pb) {
        c.mode = mode;
    }
    if let Some(w) = &p.workload {
        c.workload = Some(workload_from_pb(w));
    }
    if let Some(r) = &p.relevance {
        let w = &mut c.relevance;
        for (slot, value) in [
            (&mut w.recency, r.recency),
            (&mut w.similarity, r.similarity),
            (&mut w.length, r.length),
            (&mut w.hint, r.hint),
            (&mut w.recency_half_life_turns, r.recency_half_life_turns),
        ] {
            if let Some(value) = value {
                *slot = value;
            }
        }
    }
    if let Some(a) = p.anchor_budget_tokens {
        c.anchor_budget_tokens = a;
    }
    if let Some(t) = &p.classifier_tuning {
        c.classifier_tuning = ClassifierTuning {
            pin_threshold: t.pin_threshold,
            pin_phrases: t.pin_phrases.clone(),
            protected_fraction: t.protected_fraction,
        };
    }
    let presentation = enum_value(
        "config.summary_presentation",
        p.summary_presentation,
        &mut bad,
    );
    if let Some(presentation) = presentation.and_then(presentation_from_pb) {
        c.summary_presentation = presentation;
    }
    if let Some(prefix) = &p.summary_prefix {
        if prefix.trim().is_empty() || prefix.len() > MAX_SUMMARY_PREFIX_BYTES {
            bad.push(BadField::new(
                "config.summary_prefix",
                format!(
                    "must be 1 to {MAX_SUMMARY_PREFIX_BYTES} bytes of text; got {} bytes",
                    prefix.len()
                ),
            ));
        } else if prefix.chars().any(char::is_control) {
            bad.push(BadField::new(
                "config.summary_prefix",
                "must not contain control characters",
            ));
        } else {
            c.summary_prefix = prefix.clone();
        }
    }
    config(&mut c, limits, &mut bad);
    finish(bad)?;
    Ok(c)
}

/// The longest summary prefix, in bytes.
pub const MAX_SUMMARY_PREFIX_BYTES: usize = 256;
/// The longest tool call id or tool name, in bytes.
pub const MAX_TOOL_FIELD_BYTES: usize = 128;
/// The most metadata entries on one span.
pub const MAX_METADATA_ENTRIES: usize = 32;
/// The longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 128;
/// The most bytes of metadata keys and values on one span.
pub const MAX_METADATA_BYTES: usize = 65_536;

/// Checks span `i`'s attributes: tool call id and tool name short and
/// free of control characters; metadata within its entry, key and byte
/// limits, keys of `[A-Za-z0-9._:/-]`.
fn attributes(i: usize, span: &pb::SpanInput, bad: &mut Vec<BadField>) {
    for (name, value) in [
        ("tool_call_id", &span.tool_call_id),
        ("tool_name", &span.tool_name),
    ] {
        if value.len() > MAX_TOOL_FIELD_BYTES {
            bad.push(BadField::new(
                format!("spans[{i}].{name}"),
                format!(
                    "must be at most {MAX_TOOL_FIELD_BYTES} bytes; got {}",
                    value.len()
                ),
            ));
        } else if value.chars().any(char::is_control) {
            bad.push(BadField::new(
                format!("spans[{i}].{name}"),
                "must not contain control characters",
            ));
        }
    }
    let field = format!("spans[{i}].metadata");
    if span.metadata.len() > MAX_METADATA_ENTRIES {
        bad.push(BadField::new(
            field,
            format!(
                "must hold at most {MAX_METADATA_ENTRIES} entries; got {}",
                span.metadata.len()
            ),
        ));
        return;
    }
    let bytes: usize = span.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_METADATA_BYTES {
        bad.push(BadField::new(
            field.clone(),
            format!("keys and values must hold at most {MAX_METADATA_BYTES} bytes; got {bytes}"),
        ));
    }
    let mut keys: Vec<&String> = span.metadata.keys().collect();
    keys.sort();
    for key in keys {
        let good = |b: u8| b.is_ascii_alphanumeric() || b"._:/-".contains(&b);
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES || !key.bytes().all(good) {
            bad.push(BadField::new(
                format!("{field}[{key:?}]"),
                format!("keys must be 1 to {MAX_METADATA_KEY_BYTES} bytes of [A-Za-z0-9._:/-]"),
            ));
        }
    }
}

/// Checks an effective configuration against the server's limits and the
/// policy's rules, adding to `bad` (checks that need the others to pass
/// run only when `bad` is empty so far).
pub fn config(c: &mut SessionConfig, limits: &Limits, bad: &mut Vec<BadField>) {
    if c.window_tokens > limits.max_window_tokens {
        bad.push(BadField::new(
            "config.window_tokens",
            format!(
                "must be at most the server's max_window_tokens = {}; got {}",
                limits.max_window_tokens, c.window_tokens
            ),
        ));
    }
    if let Err(violations) = c.validate() {
        bad.extend(
            violations
                .into_iter()
                .map(|v| BadField::new(v.field, v.description)),
        );
    }
    if bad.is_empty() && c.summary_max_tokens > c.budget_tokens() {
        bad.push(BadField::new(
            "config.summary_max_tokens",
            format!(
                "must be at most the budget of {} tokens; got {}",
                c.budget_tokens(),
                c.summary_max_tokens
            ),
        ));
    }
    if bad.is_empty()
        && c.trigger == TriggerPolicy::TimeBased
        && let Err(v) = trigger::time_based(c)
    {
        bad.push(BadField::new(v.field, v.description));
    }
}

/// A page size or length: 0 means the default; above the maximum is bad.
pub fn bounded(
    field: &str,
    value: u32,
    (default, max): (usize, usize),
    bad: &mut Vec<BadField>,
) -> usize {
    match value as usize {
        0 => default,
        n if n > max => {
            bad.push(BadField::new(
                field,
                format!("must be at most {max}; got {n}"),
            ));
            default
        }
        n => n,
    }
}

/// The longest actor or reason accepted, in bytes.
pub const MAX_LABEL_BYTES: usize = 1024;

/// Checks a caller-written text: non-empty, at most `max` bytes.
pub fn text(field: &str, text: &str, max: usize, bad: &mut Vec<BadField>) {
    if text.trim().is_empty() {
        bad.push(BadField::new(field, "must not be empty"));
    } else if text.len() > max {
        bad.push(BadField::new(
            field,
            format!(
                "must be at most max_span_bytes = {max} bytes; got {}",
                text.len()
            ),
        ));
    }
}

/// Checks an actor or reason recorded in a marker: at most
/// `MAX_LABEL_BYTES`, and present when `required`.
pub fn label(field: &str, value: &str, required: bool, bad: &mut Vec<BadField>) {
    if required && value.trim().is_empty() {
        bad.push(BadField::new(field, "is required: the marker records it"));
    } else if value.len() > MAX_LABEL_BYTES {
        bad.push(BadField::new(
            field,
            format!(
                "must be at most {MAX_LABEL_BYTES} bytes; got {}",
                value.len()
            ),
        ));
    }
}

/// Checks the shape of a turn, before anything about its session is known.
pub fn turn_shape(spans: &[pb::SpanInput], limits: &Limits, bad: &mut Vec<BadField>) {
    if spans.is_empty() {
        bad.push(BadField::new("spans", "must hold at least one span"));
        return;
    }
    if spans.len() > limits.max_spans_per_turn {
        bad.push(BadField::new(
            "spans",
            format!(
                "must hold at most max_spans_per_turn = {} spans; got {}",
                limits.max_spans_per_turn,
                spans.len()
            ),
        ));
        return;
    }
    for (i, span) in spans.iter().enumerate() {
        let field = |name: &str| format!("spans[{i}].{name}");
        match pb::Role::try_from(span.role) {
            Ok(pb::Role::Unspecified) => {
                bad.push(BadField::new(field("role"), "is required"));
            }
            Ok(_) => {}
            Err(_) => bad.push(BadField::new(
                field("role"),
                format!("unknown enum value {}", span.role),
            )),
        }
        if span.text.is_empty() {
            bad.push(BadField::new(field("text"), "must not be empty"));
        } else if span.text.len() > limits.max_span_bytes {
            bad.push(BadField::new(
                field("text"),
                format!(
                    "must be at most max_span_bytes = {} bytes; got {}",
                    limits.max_span_bytes,
                    span.text.len()
                ),
            ));
        }
        let class = pb::SpanClass::try_from(span.span_class);
        match class {
            Ok(pb::SpanClass::Summary) => bad.push(BadField::new(
                field("span_class"),
                "SUMMARY spans are written by compaction only",
            )),
            Ok(_) => {}
            Err(_) => bad.push(BadField::new(
                field("span_class"),
                format!("unknown enum value {}", span.span_class),
            )),
        }
        if let Some(hint) = span.relevance_hint
            && !(hint.is_finite() && (0.0..=1.0).contains(&hint))
        {
            bad.push(BadField::new(
                field("relevance_hint"),
                format!("must be a number in [0, 1]; got {hint}"),
            ));
        }
        idempotency_key(i, spans, bad);
        attributes(i, span, bad);
        if let Some(predicate) = &span.predicate {
            if matches!(class, Ok(pb::SpanClass::Narrative)) {
                bad.push(BadField::new(
                    field("predicate"),
                    "is only accepted on constraints (span_class CONSTRAINT or unspecified)",
                ));
            }
            predicate_shape(&field("predicate"), predicate, &span.text, bad);
        }
    }
}

/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// Checks span `i`'s idempotency key: printable ASCII without spaces, at
/// most [`MAX_IDEMPOTENCY_KEY_BYTES`], set on every span of the turn or on
/// none, and not repeated within the turn.
fn idempotency_key(i: usize, spans: &[pb::SpanInput], bad: &mut Vec<BadField>) {
    let field = format!("spans[{i}].idempotency_key");
    let key = spans[i].idempotency_key.as_str();
    if key.is_empty() {
        if let Some(j) = spans.iter().position(|s| !s.idempotency_key.is_empty()) {
            bad.push(BadField::new(
                field,
                format!("must be set: spans[{j}] carries one, and a turn's keys are set on every span or on none"),
            ));
        }
        return;
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        bad.push(BadField::new(
            field,
            format!(
                "must be at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes; got {}",
                key.len()
            ),
        ));
    } else if !key.bytes().all(|b| b.is_ascii_graphic()) {
        bad.push(BadField::new(
            field,
            "must be printable ASCII without spaces",
        ));
    } else if let Some(j) = spans[..i].iter().position(|s| s.idempotency_key == key) {
        bad.push(BadField::new(
            field,
            format!("repeats the key of spans[{j}]; each span takes its own"),
        ));
    }
}

/// Checks a caller's predicate: known modality; a bounded number of short,
/// non-empty terms, each present in the constraint's own text (a predicate
/// the original does not satisfy could never be satisfied by a shorter
/// form).
pub fn predicate_shape(field: &str, p: &pb::Predicate, text: &str, bad: &mut Vec<BadField>) {
    modality(field, p, bad);
    required_terms(field, &p.required_terms, text, bad);
}

/// Checks a predicate's modality is a known value.
pub fn modality(field: &str, p: &pb::Predicate, bad: &mut Vec<BadField>) {
    if pb::Modality::try_from(p.modality).is_err() {
        bad.push(BadField::new(
            format!("{field}.modality"),
            format!("unknown enum value {}", p.modality),
        ));
    }
}

/// Checks a predicate's terms (see [`predicate_shape`]).
pub fn required_terms(field: &str, terms: &[String], text: &str, bad: &mut Vec<BadField>) {
    const MAX_TERMS: usize = 64;
    const MAX_TERM_BYTES: usize = 256;
    if terms.len() > MAX_TERMS {
        bad.push(BadField::new(
            format!("{field}.required_terms"),
            format!("must hold at most {MAX_TERMS} terms; got {}", terms.len()),
        ));
        return;
    }
    let lowered = text.to_lowercase();
    for (j, term) in terms.iter().enumerate() {
        let name = format!("{field}.required_terms[{j}]");
        if term.trim().is_empty() {
            bad.push(BadField::new(name, "must not be empty"));
        } else if term.len() > MAX_TERM_BYTES {
            bad.push(BadField::new(
                name,
                format!("must be at most {MAX_TERM_BYTES} bytes; got {}", term.len()),
            ));
        } else if !lowered.contains(&term.to_lowercase()) {
            bad.push(BadField::new(
                name,
                format!("{term:?} does not occur in the span's text"),
            ));
        }
    }
}

/// Checks a turn's token counts against its session's tokenizer: given,
/// and positive, under CLIENT only.
pub fn token_counts(spans: &[TurnSpan], tokenizer: TokenizerKind) -> Result<(), ApiError> {
    let mut bad = Vec::new();
    for (i, span) in spans.iter().enumerate() {
        let field = format!("spans[{i}].token_count");
        match (tokenizer, span.token_count) {
            (TokenizerKind::Client, None) => bad.push(BadField::new(
                field,
                "is required: the session's tokenizer is CLIENT",
            )),
            (TokenizerKind::Client, Some(0)) => {
                bad.push(BadField::new(field, "must be greater than 0"));
            }
            (TokenizerKind::Client, Some(_)) | (_, None) => {}
            (_, Some(_)) => bad.push(BadField::new(
                field,
                "is only accepted when the session's tokenizer is CLIENT; the broker counts this session's tokens itself",
            )),
        }
    }
    finish(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(err: ApiError) -> Vec<String> {
        match err {
            ApiError::InvalidArgument(bad) => bad.into_iter().map(|b| b.field).collect(),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn session_ids_are_checked_by_length_and_charset() {
        let limits = Limits::default();
        assert!(session_id("session_id", "agent-7.run:3_b", &limits).is_ok());
        assert!(session_id("session_id", "", &limits).is_err());
        assert!(session_id("session_id", &"x".repeat(129), &limits).is_err());
        assert!(session_id("session_id", &"x".repeat(128), &limits).is_ok());
        assert!(session_id("session_id", "a/b", &limits).is_err());
        assert!(session_id("session_id", "é", &limits).is_err());
    }

    #[test]
    fn a_new_session_needs_a_window() {
        let limits = Limits::default();
        let err = create_config(Some(&pb::SessionConfig::default()), &limits).unwrap_err();
        assert_eq!(fields(err), ["config.window_tokens"]);
        let err = create_config(None, &limits).unwrap_err();
        assert_eq!(fields(err), ["config"]);
    }

    #[test]
    fn every_bad_config_field_is_named() {
        let limits = Limits::default();
        let config = pb::SessionConfig {
            window_tokens: Some(1000),
            alpha: Some(f64::NAN),
            soft_watermark: Some(1.5),
            relevance_floor: Some(-0.1),
            trigger: 99,
            ..Default::default()
        };
        let got = fields(create_config(Some(&config), &limits).unwrap_err());
        for want in [
            "config.alpha",
            "config.soft_watermark",
            "config.relevance_floor",
            "config.trigger",
        ] {
            assert!(got.iter().any(|f| f == want), "{want} missing from {got:?}");
        }
    }

    #[test]
    fn overhead_must_leave_a_budget() {
        let limits = Limits::default();
        let config = pb::SessionConfig {
            window_tokens: Some(1000),
            reserved_overhead_tokens: Some(1000),
            ..Default::default()
        };
        let got = fields(create_config(Some(&config), &limits).unwrap_err());
        assert_eq!(got, ["config.reserved_overhead_tokens"]);
    }

    #[test]
    fn the_tokenizer_is_fixed_after_creation() {
        let limits = Limits::default();
        let current = SessionConfig::with_window(1000);
        let patch = pb::SessionConfig {
            tokenizer: pb::TokenizerKind::Cl100kBase as i32,
            ..Default::default()
        };
        let got = fields(update_config(&current, &patch, &limits).unwrap_err());
        assert_eq!(got, ["config.tokenizer"]);
    }

    #[test]
    fn time_based_needs_a_sound_declared_workload() {
        let limits = Limits::default();
        let mut config = pb::SessionConfig {
            window_tokens: Some(200_000),
            trigger: pb::TriggerPolicy::TimeBased as i32,
            staleness_interval_ms: Some(90_000),
            ..Default::default()
        };
        let got = fields(create_config(Some(&config), &limits).unwrap_err());
        assert_eq!(got, ["config.workload"]);

        config.workload = Some(pb::DeclaredWorkload {
            cadence_ms: 90_000,
            max_single_injection_tokens: 120_000,
            max_interval_accumulation_tokens: 120_000,
            ..Default::default()
        });
        let got = fields(create_config(Some(&config), &limits).unwrap_err());
        assert_eq!(got, ["config.trigger"]);

        config.workload = Some(pb::DeclaredWorkload {
            cadence_ms: 90_000,
            max_single_injection_tokens: 1_000,
            max_interval_accumulation_tokens: 2_000,
            ..Default::default()
        });
        let c = create_config(Some(&config), &limits).unwrap();
        assert_eq!(c.trigger, TriggerPolicy::TimeBased);
        assert_eq!(c.workload.unwrap().window_tokens, 200_000);
    }

    #[test]
    fn turn_shapes_name_each_bad_span_field() {
        let limits = Limits {
            max_span_bytes: 10,
            ..Limits::default()
        };
        let spans = vec![
            pb::SpanInput {
                role: 0,
                text: String::new(),
                ..Default::default()
            },
            pb::SpanInput {
                role: pb::Role::User as i32,
                text: "x".repeat(11),
                span_class: pb::SpanClass::Summary as i32,
                relevance_hint: Some(f64::INFINITY),
                ..Default::default()
            },
        ];
        let mut bad = Vec::new();
        turn_shape(&spans, &limits, &mut bad);
        let got: Vec<_> = bad.into_iter().map(|b| b.field).collect();
        assert_eq!(
            got,
            [
                "spans[0].role",
                "spans[0].text",
                "spans[1].text",
                "spans[1].span_class",
                "spans[1].relevance_hint"
            ]
        );
        let mut bad = Vec::new();
        turn_shape(&[], &limits, &mut bad);
        assert_eq!(bad[0].field, "spans");
    }

    #[test]
    fn a_caller_predicate_must_hold_for_its_own_text() {
        let mut bad = Vec::new();
        let p = pb::Predicate {
            modality: pb::Modality::Prohibition as i32,
            required_terms: vec!["prod".into(), "staging-eu".into()],
            source: 0,
        };
        predicate_shape("spans[0].predicate", &p, "Never touch prod.", &mut bad);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].field, "spans[0].predicate.required_terms[1]");
    }
}
