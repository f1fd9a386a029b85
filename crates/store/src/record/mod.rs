//! Stored records: protobuf messages inside a checksummed, versioned frame.
//!
//! A stored value is `[format version: u8][crc32: u32 LE][protobuf payload]`.
//! The checksum covers the key, the version byte and the payload, so a
//! flipped bit anywhere, or a record written under the wrong key, is
//! caught before anything is decoded. Enumerations are stored as explicit
//! codes starting at 1, so that a missing field (decoded as 0) is an error
//! instead of a silent default.
//!
//! These message types are the store's own: they are not the wire
//! contract, and they change only together with [`FORMAT_VERSION`].
//!
//! Here: the frame and each tree's encoders and decoders; the messages
//! are in `rows`, their conversions from and to the domain types (and the
//! enumeration codes) in `convert`.

mod convert;
mod rows;
mod run;

use ctxbroker_core::search::{TermVector, codec};
use ctxbroker_core::span::Predicate;
use ctxbroker_core::{Marker, Span, SpanId};
use prost::Message;

use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::model::{Pin, SessionRecord};
use convert::*;
use rows::*;
pub(crate) use run::{encode_run, open_run};

/// The record format this build writes and reads.
pub(crate) const FORMAT_VERSION: u8 = 1;

const HEADER: usize = 5;

fn checksum(key: &[u8], version: u8, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&(key.len() as u64).to_le_bytes());
    hasher.update(key);
    hasher.update(&[version]);
    hasher.update(payload);
    hasher.finalize()
}

/// Frames a message for storage under `key`.
pub(crate) fn seal<M: Message>(key: &[u8], message: &M) -> Vec<u8> {
    let payload = message.encode_to_vec();
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&checksum(key, FORMAT_VERSION, &payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Checks a frame read from `key` and decodes its message; the error is the
/// detail of a `Corrupt`.
pub(crate) fn open<M: Message + Default>(key: &[u8], value: &[u8]) -> Result<M, String> {
    if value.len() < HEADER {
        return Err(format!(
            "record of {} bytes is shorter than its header",
            value.len()
        ));
    }
    let version = value[0];
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&value[1..HEADER]);
    let stored = u32::from_le_bytes(crc);
    let payload = &value[HEADER..];
    let actual = checksum(key, version, payload);
    if stored != actual {
        return Err(format!(
            "checksum mismatch: stored {stored:08x}, computed {actual:08x}"
        ));
    }
    if version != FORMAT_VERSION {
        return Err(format!(
            "record format version {version}; this build reads version {FORMAT_VERSION}"
        ));
    }
    M::decode(payload).map_err(|e| format!("does not decode: {e}"))
}

/// The `Corrupt` error for a record of `tree` at `key`.
pub(crate) fn corrupt(tree: TreeId, key: &[u8], detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        tree: tree.name().to_owned(),
        key: keys::render(tree, key),
        session: keys::session_of(tree, key),
        detail: detail.into(),
    }
}

/// Opens a frame and converts its message, turning any failure into
/// `Corrupt` for that record.
fn read<M, T>(
    tree: TreeId,
    key: &[u8],
    value: &[u8],
    convert: impl FnOnce(M) -> Result<T, String>,
) -> Result<T, StoreError>
where
    M: Message + Default,
{
    open::<M>(key, value)
        .and_then(convert)
        .map_err(|detail| corrupt(tree, key, detail))
}

// ---------------------------------------------------------------------------
// Encoding and decoding stored values. Each decoder also checks that the
// record agrees with the key it was found under.

/// Encodes a session record for its key.
pub(crate) fn encode_session(key: &[u8], record: &SessionRecord) -> Vec<u8> {
    seal(key, &session_row(record))
}

/// Decodes a session record found at `key`.
pub(crate) fn decode_session(key: &[u8], value: &[u8]) -> Result<SessionRecord, StoreError> {
    read(TreeId::Sessions, key, value, |row: SessionRow| {
        let record = session_from(row)?;
        if record.id.as_bytes() != key {
            return Err(format!("record names session {:?}", record.id));
        }
        Ok(record)
    })
}

/// A session's record as [`encode_session`] sealed it, carrying `epoch`
/// as the commit epoch of the batch that writes it: the field is added
/// to the end of the payload (a record encoded from a [`SessionRecord`]
/// has none, and the last occurrence of a field is the one decoded) and
/// the checksum computed again. `None` when `sealed` is not an intact
/// record of this format under `key`.
pub(crate) fn stamp_epoch(key: &[u8], sealed: &[u8], epoch: u64) -> Option<Vec<u8>> {
    open::<SessionEpochRow>(key, sealed).ok()?;
    let mut out = Vec::with_capacity(sealed.len() + 11);
    out.extend_from_slice(sealed);
    SessionEpochRow {
        commit_epoch: epoch,
    }
    .encode(&mut out)
    .ok()?;
    let crc = checksum(key, FORMAT_VERSION, &out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
    Some(out)
}

/// The commit epoch a session's record carries (0 for none).
pub(crate) fn session_epoch(key: &[u8], value: &[u8]) -> Result<u64, StoreError> {
    read(TreeId::Sessions, key, value, |row: SessionEpochRow| {
        Ok(row.commit_epoch)
    })
}

/// A span's term vector for search, packed as its row carries it.
pub(crate) fn span_terms(span: &Span) -> Vec<u8> {
    codec::encode(&TermVector::of(&span.text))
}

/// Encodes a live span for its key, with its packed term vector
/// ([`span_terms`]).
pub(crate) fn encode_span(key: &[u8], span: &Span, terms: Vec<u8>) -> Vec<u8> {
    encode_seeded_span(key, span, terms, None)
}

/// [`encode_span`], with the seed of the span's facts when it has one
/// (`ctxbroker_core::facts::seed`).
pub(crate) fn encode_seeded_span(
    key: &[u8],
    span: &Span,
    terms: Vec<u8>,
    seed: Option<Vec<u8>>,
) -> Vec<u8> {
    let mut row = span_row(span);
    row.terms = Some(terms);
    row.facts = seed;
    seal(key, &row)
}

/// Decodes a live span found at `key` (session ‖ position) with the seed
/// of its facts its row carries, if any.
pub(crate) fn decode_seeded_span(
    key: &[u8],
    value: &[u8],
) -> Result<(Span, Option<Vec<u8>>), StoreError> {
    decode_live(key, value, |row| row.facts.take())
}

/// Decodes a live span found at `key` (session ‖ position).
pub(crate) fn decode_span(key: &[u8], value: &[u8]) -> Result<Span, StoreError> {
    decode_span_with_terms(key, value).map(|(span, _)| span)
}

/// Decodes a live span found at `key` (session ‖ position) with the term
/// vector its row carries, derived from its text for rows written without
/// one.
pub(crate) fn decode_span_with_terms(
    key: &[u8],
    value: &[u8],
) -> Result<(Span, Option<Vec<u8>>), StoreError> {
    decode_live(key, value, |row| row.terms.take())
}

/// Decodes a live span's row found at `key` (session ‖ position), with
/// what `take` takes out of the row before the span is made of it.
fn decode_live<T>(
    key: &[u8],
    value: &[u8],
    take: impl FnOnce(&mut SpanRow) -> T,
) -> Result<(Span, T), StoreError> {
    read(TreeId::Spans, key, value, |mut row: SpanRow| {
        let taken = take(&mut row);
        let span = span_from(row)?;
        match keys::parse_session_number_key(key) {
            Some((_, position)) if position == span.position => Ok((span, taken)),
            _ => Err(format!("record holds position {}", span.position)),
        }
    })
}

/// Encodes an archived span for its key, with its packed term vector.
pub(crate) fn encode_archived(key: &[u8], span: &Span, by_seq: u64, terms: Vec<u8>) -> Vec<u8> {
    let mut row = span_row(span);
    row.terms = Some(terms);
    seal(
        key,
        &ArchivedRow {
            span: Some(row),
            archived_by_seq: by_seq,
        },
    )
}

/// Decodes an archived span found at `key` (session ‖ span id), with the
/// seq of the marker that evicted it.
pub(crate) fn decode_archived(key: &[u8], value: &[u8]) -> Result<(Span, u64), StoreError> {
    read(TreeId::Archive, key, value, |row: ArchivedRow| {
        archived_from(key, row)
    })
}

/// An archived row's span and the seq that evicted it, checked against
/// the key it was found at.
fn archived_from(key: &[u8], row: ArchivedRow) -> Result<(Span, u64), String> {
    let span = span_from(required(row.span, "span")?)?;
    match keys::parse_session_number_key(key) {
        Some((_, id)) if id == span.id => Ok((span, row.archived_by_seq)),
        _ => Err(format!("record holds span {}", span.id)),
    }
}

/// The id and packed term vector of the span whose row (live, in the
/// spans tree, or archived) is at `key`, read without decoding its text;
/// for a row written without a term vector, derived from its text.
pub(crate) fn stored_terms(
    tree: TreeId,
    key: &[u8],
    value: &[u8],
) -> Result<(SpanId, Vec<u8>), StoreError> {
    let view = match tree {
        TreeId::Archive => read(tree, key, value, |row: ArchivedTermsView| {
            let view = required(row.span, "span")?;
            match keys::parse_session_number_key(key) {
                Some((_, id)) if id == view.id => Ok(view),
                _ => Err(format!("record holds span {}", view.id)),
            }
        })?,
        _ => read(
            tree,
            key,
            value,
            |row: SpanTermsView| match keys::parse_session_number_key(key) {
                Some((_, position)) if position == row.position => Ok(row),
                _ => Err(format!("record holds position {}", row.position)),
            },
        )?,
    };
    if let Some(terms) = view.terms {
        return Ok((view.id, terms));
    }
    let span = match tree {
        TreeId::Archive => decode_archived(key, value)?.0,
        _ => decode_span(key, value)?,
    };
    Ok((span.id, span_terms(&span)))
}

/// The length of a packed term vector and the frequency of each of
/// `term_keys` in it, reading no further than the largest; a damaged
/// vector is reported as its row's.
pub(crate) fn term_frequencies(
    tree: TreeId,
    key: &[u8],
    packed: &[u8],
    term_keys: &[u32],
) -> Result<(u32, Vec<u32>), StoreError> {
    codec::frequencies(packed, term_keys)
        .map_err(|e| corrupt(tree, key, format!("term vector: {e}")))
}

/// Decodes a packed term vector; a damaged one is reported as its row's.
pub(crate) fn decode_terms(
    tree: TreeId,
    key: &[u8],
    packed: &[u8],
) -> Result<TermVector, StoreError> {
    codec::decode(packed).map_err(|e| corrupt(tree, key, format!("term vector: {e}")))
}

/// The packed term vector of a format-1 term row, or `None` if the row
/// is damaged: it is derived data, so the migration derives it again from
/// the span's text instead.
pub(crate) fn old_term_row(key: &[u8], value: &[u8]) -> Option<Vec<u8>> {
    open::<TermRow>(key, value).ok().map(|row| row.packed)
}

/// The value of a live or archived span's row at `key` with a term
/// vector, if the row was written without one; `None` if it has one.
/// `terms` supplies it (a format-1 term row), else it is derived from the
/// text.
pub(crate) fn with_terms(
    tree: TreeId,
    key: &[u8],
    value: &[u8],
    terms: impl FnOnce(SpanId) -> Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(match tree {
        TreeId::Archive => {
            let ((span, by_seq), has_terms) = read(tree, key, value, |row: ArchivedRow| {
                let has_terms = row.span.as_ref().is_some_and(|s| s.terms.is_some());
                Ok((archived_from(key, row)?, has_terms))
            })?;
            if has_terms {
                return Ok(None);
            }
            let packed = terms(span.id).unwrap_or_else(|| span_terms(&span));
            Some(encode_archived(key, &span, by_seq, packed))
        }
        _ => {
            let (span, stored) = decode_span_with_terms(key, value)?;
            if stored.is_some() {
                return Ok(None);
            }
            let packed = terms(span.id).unwrap_or_else(|| span_terms(&span));
            Some(encode_span(key, &span, packed))
        }
    })
}

/// What [`format_one`] makes of a span's row.
#[cfg(test)]
pub(crate) struct FormatOne {
    /// The row without its term vector.
    pub(crate) row: Vec<u8>,
    /// The key and value of its term row.
    pub(crate) term_key: Vec<u8>,
    pub(crate) term_row: Vec<u8>,
}

/// A span's row (live or archived) as format 1 stored it, without its
/// term vector, with the key and value of the term row format 1 kept
/// beside it: what a store of that format holds, for tests of the
/// migration.
#[cfg(test)]
pub(crate) fn format_one(tree: TreeId, key: &[u8], value: &[u8]) -> Result<FormatOne, StoreError> {
    let session = keys::session_of(tree, key).unwrap_or_default();
    let (row, span, terms) = match tree {
        TreeId::Archive => {
            let (span, by_seq) = decode_archived(key, value)?;
            let terms = stored_terms(tree, key, value)?.1;
            let row = ArchivedRow {
                span: Some(span_row(&span)),
                archived_by_seq: by_seq,
            };
            (seal(key, &row), span, terms)
        }
        _ => {
            let (span, terms) = decode_span_with_terms(key, value)?;
            let terms = terms.unwrap_or_else(|| span_terms(&span));
            (seal(key, &span_row(&span)), span, terms)
        }
    };
    let term_key = keys::session_number_key(&session, span.id);
    let term_row = seal(&term_key, &TermRow { packed: terms });
    Ok(FormatOne {
        row,
        term_key,
        term_row,
    })
}

/// Encodes a pin for its key.
pub(crate) fn encode_pin(key: &[u8], span_id: SpanId, predicate: Option<&Predicate>) -> Vec<u8> {
    seal(
        key,
        &PinRow {
            span_id,
            predicate: predicate.map(predicate_row),
        },
    )
}

/// Decodes a pin found at `key` (session ‖ span id).
pub(crate) fn decode_pin(key: &[u8], value: &[u8]) -> Result<Pin, StoreError> {
    read(TreeId::Pins, key, value, |row: PinRow| {
        let pin = Pin {
            span_id: row.span_id,
            predicate: row.predicate.map(predicate_from).transpose()?,
        };
        match keys::parse_session_number_key(key) {
            Some((_, id)) if id == pin.span_id => Ok(pin),
            _ => Err(format!("record holds span {}", pin.span_id)),
        }
    })
}

/// Encodes an idempotency key's span for its key.
pub(crate) fn encode_key(key: &[u8], span_id: SpanId) -> Vec<u8> {
    seal(key, &KeyRow { span_id })
}

/// Decodes the span id found at `key` (session ‖ idempotency key).
pub(crate) fn decode_key(key: &[u8], value: &[u8]) -> Result<SpanId, StoreError> {
    read(TreeId::Keys, key, value, |row: KeyRow| Ok(row.span_id))
}

/// Encodes a marker for its key.
pub(crate) fn encode_marker(key: &[u8], marker: &Marker) -> Vec<u8> {
    seal(key, &marker_row(marker))
}

/// Decodes a marker found at `key`.
pub(crate) fn decode_marker(key: &[u8], value: &[u8]) -> Result<Marker, StoreError> {
    read(TreeId::Markers, key, value, |row: MarkerRow| {
        let marker = marker_from(row)?;
        match keys::parse_marker_key(key) {
            Some(seq) if seq == marker.seq => Ok(marker),
            _ => Err(format!("record holds seq {}", marker.seq)),
        }
    })
}

/// Encodes the marker log's bounds.
pub(crate) fn encode_marker_log(next_seq: u64, oldest_seq: u64) -> Vec<u8> {
    seal(
        keys::META_MARKER_LOG,
        &MarkerLogRow {
            next_seq,
            oldest_seq,
        },
    )
}

/// Decodes the marker log's bounds.
pub(crate) fn decode_marker_log(value: &[u8]) -> Result<MarkerLogRow, StoreError> {
    read(
        TreeId::Meta,
        keys::META_MARKER_LOG,
        value,
        |row: MarkerLogRow| {
            if row.next_seq == 0 || row.oldest_seq == 0 || row.oldest_seq > row.next_seq {
                return Err(format!(
                    "impossible bounds: oldest {}, next {}",
                    row.oldest_seq, row.next_seq
                ));
            }
            Ok(row)
        },
    )
}

/// The stored format version: four big-endian bytes and their crc32. It
/// sits outside the record frame on purpose, so that a future build that
/// changes the frame can still be recognised and refused by this one.
pub(crate) fn encode_epoch(epoch: u64) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&epoch.to_be_bytes());
    out[8..].copy_from_slice(&crc32fast::hash(&epoch.to_be_bytes()).to_be_bytes());
    out
}

/// Reads a commit epoch written by [`encode_epoch`]; the error says what
/// is wrong with the bytes.
pub(crate) fn decode_epoch(value: &[u8]) -> Result<u64, String> {
    let bytes: [u8; 12] = value
        .try_into()
        .map_err(|_| format!("{} bytes, expected 12", value.len()))?;
    let mut epoch = [0u8; 8];
    epoch.copy_from_slice(&bytes[..8]);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&bytes[8..]);
    if crc32fast::hash(&epoch) != u32::from_be_bytes(crc) {
        return Err("checksum mismatch".into());
    }
    Ok(u64::from_be_bytes(epoch))
}

/// Encodes the stored format version with its checksum.
pub(crate) fn encode_format_version(version: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&version.to_be_bytes());
    out[4..].copy_from_slice(&crc32fast::hash(&version.to_be_bytes()).to_be_bytes());
    out
}

/// Reads the stored format version.
pub(crate) fn decode_format_version(value: &[u8]) -> Result<u32, StoreError> {
    let bad = |detail: String| corrupt(TreeId::Meta, keys::META_FORMAT, detail);
    let bytes: [u8; 8] = value.try_into().map_err(|_| {
        bad(format!(
            "format version of {} bytes, expected 8",
            value.len()
        ))
    })?;
    let mut version = [0u8; 4];
    version.copy_from_slice(&bytes[..4]);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&bytes[4..]);
    if crc32fast::hash(&version) != u32::from_be_bytes(crc) {
        return Err(bad("format version fails its checksum".into()));
    }
    Ok(u32::from_be_bytes(version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxbroker_core::SessionConfig;
    use ctxbroker_core::config::{
        AnchorPolicy, ClassifierMode, DeclaredWorkload, SessionMode, SummaryPresentation,
        TokenizerKind, TriggerPolicy,
    };
    use ctxbroker_core::marker::{CompactionTrigger, Outcome};
    use ctxbroker_core::plan::{Violation, ViolationKind};
    use ctxbroker_core::relevance::RelevanceWeights;
    use ctxbroker_core::span::{
        Attributes, ClassSource, Classification, Modality, OriginalForm, PredicateSource, Role,
        SpanClass, SummaryInfo,
    };
    use proptest::collection::{btree_map, vec};
    use proptest::option;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        // Any Unicode, including the empty string.
        any::<String>()
    }

    fn finite() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(f64::INFINITY),
            any::<f64>().prop_filter("not NaN", |x| !x.is_nan()),
        ]
    }

    fn predicate() -> impl Strategy<Value = Predicate> {
        (0u32..4, vec(text(), 0..4), 0u32..2).prop_map(|(m, terms, s)| Predicate {
            modality: [
                Modality::Prohibition,
                Modality::Requirement,
                Modality::Restriction,
                Modality::Correction,
            ][m as usize],
            required_terms: terms,
            source: [PredicateSource::Derived, PredicateSource::Caller][s as usize],
        })
    }

    fn summary() -> impl Strategy<Value = SummaryInfo> {
        (vec(any::<u64>(), 0..5), vec(text(), 0..4), any::<u32>()).prop_map(
            |(covers, anchors, anchors_dropped)| SummaryInfo {
                covers,
                anchors,
                anchors_dropped,
            },
        )
    }

    prop_compose! {
        fn span()(
            id in any::<u64>(),
            position in any::<u64>(),
            role in 0usize..4,
            class in 0usize..4,
            source in 0usize..3,
            rule in text(),
            body in text(),
            tokens in any::<u32>(),
            generation in any::<u32>(),
            turn in any::<u64>(),
            predicate in option::of(predicate()),
            summary in option::of(summary()),
            relevance_hint in option::of(finite()),
            admitted_at_ms in any::<u64>(),
            original in option::of((text(), any::<u32>())),
            attributes in option::of((text(), text(), btree_map("[a-z._:/-]{1,12}", text(), 0..4))),
        ) -> Span {
            Span {
                id,
                position,
                role: [Role::User, Role::Assistant, Role::Tool, Role::System][role],
                classification: Classification {
                    class: [
                        SpanClass::Narrative,
                        SpanClass::Constraint,
                        SpanClass::Summary,
                        SpanClass::Protected,
                    ][class],
                    source: [ClassSource::Caller, ClassSource::Rules, ClassSource::Broker][source],
                    rule,
                },
                text: body,
                tokens,
                generation,
                turn,
                predicate,
                summary,
                relevance_hint,
                admitted_at_ms,
                original: original.map(|(text, tokens)| OriginalForm { text, tokens }),
                attributes: attributes
                    .map(|(tool_call_id, tool_name, metadata)| Attributes {
                        tool_call_id,
                        tool_name,
                        metadata,
                    })
                    .filter(|a| !a.is_empty())
                    .map(Box::new),
            }
        }
    }

    prop_compose! {
        fn workload()(
            window_tokens in any::<u32>(),
            alpha in finite(),
            reserved_overhead_tokens in any::<u32>(),
            cadence_ms in any::<u64>(),
            max_single_injection_tokens in any::<u32>(),
            max_interval_accumulation_tokens in any::<u32>(),
            idle_gaps in any::<bool>(),
        ) -> DeclaredWorkload {
            DeclaredWorkload {
                window_tokens,
                alpha,
                reserved_overhead_tokens,
                cadence_ms,
                max_single_injection_tokens,
                max_interval_accumulation_tokens,
                idle_gaps,
            }
        }
    }

    prop_compose! {
        fn config()(
            window_tokens in any::<u32>(),
            alpha in finite(),
            soft_watermark in finite(),
            reserved_overhead_tokens in any::<u32>(),
            relevance_floor in finite(),
            trigger in 0usize..3,
            staleness_interval_ms in any::<u64>(),
            tokenizer in 0usize..3,
            classifier in 0usize..3,
            max_summary_generations in any::<u32>(),
            anchor_policy in 0usize..2,
            mode in 0usize..2,
            summary_max_tokens in any::<u32>(),
            workload in option::of(workload()),
            weights in vec(finite(), 5),
            anchor_budget_tokens in any::<u32>(),
            pin_threshold in option::of(finite()),
            pin_phrases in vec("[a-z ]{1,12}", 0..3),
            protected_fraction in option::of(finite()),
            user_summaries in any::<bool>(),
            summary_prefix in text(),
        ) -> SessionConfig {
            SessionConfig {
                window_tokens,
                alpha,
                soft_watermark,
                reserved_overhead_tokens,
                relevance_floor,
                trigger: [TriggerPolicy::TokenBudget, TriggerPolicy::Hybrid, TriggerPolicy::TimeBased][trigger],
                staleness_interval_ms,
                tokenizer: [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase, TokenizerKind::Client][tokenizer],
                classifier: [ClassifierMode::Rules, ClassifierMode::CallerOnly, ClassifierMode::Model][classifier],
                max_summary_generations,
                anchor_policy: [AnchorPolicy::Require, AnchorPolicy::Warn][anchor_policy],
                mode: [SessionMode::Auto, SessionMode::Approval][mode],
                summary_max_tokens,
                workload,
                relevance: RelevanceWeights {
                    recency: weights[0],
                    similarity: weights[1],
                    length: weights[2],
                    hint: weights[3],
                    recency_half_life_turns: weights[4],
                },
                anchor_budget_tokens,
                classifier_tuning: ctxbroker_core::classify::ClassifierTuning {
                    pin_threshold,
                    pin_phrases,
                    protected_fraction,
                },
                summary_presentation: if user_summaries {
                    SummaryPresentation::User
                } else {
                    SummaryPresentation::System
                },
                summary_prefix,
            }
        }
    }

    fn session_id() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_./-]{1,40}|\\PC{1,32}"
            .prop_filter("1 to 128 bytes", |s| !s.is_empty() && s.len() <= 128)
    }

    prop_compose! {
        fn counters()(c in vec(any::<u64>(), 13)) -> Vec<u64> { c }
    }

    prop_compose! {
        fn session()(
            id in session_id(),
            config in config(),
            c in counters(),
            approval_required in any::<bool>(),
        ) -> SessionRecord {
            SessionRecord {
                id,
                config,
                created_at_ms: c[0],
                updated_at_ms: c[1],
                revision: c[2],
                next_span_id: c[3],
                turns: c[4],
                marker_count: c[5],
                compactions: c[6],
                archived_spans: c[7],
                live_tokens: c[8],
                pinned_tokens: c[9],
                live_spans: c[10],
                pinned_spans: c[11],
                approval_required,
                last_compaction_turn: c[12],
                last_admit_ms: c[0] ^ c[12],
                last_compaction_ms: c[1] ^ c[12],
            }
        }
    }

    fn violation() -> impl Strategy<Value = Violation> {
        (
            0usize..8,
            option::of(any::<u64>()),
            text(),
            vec(text(), 0..3),
        )
            .prop_map(|(kind, span_id, detail, missing_terms)| Violation {
                kind: [
                    ViolationKind::PinnedMissing,
                    ViolationKind::PredicateUnsatisfied,
                    ViolationKind::OverBudget,
                    ViolationKind::PinnedExceedBudget,
                    ViolationKind::TurnTooLarge,
                    ViolationKind::GenerationExceeded,
                    ViolationKind::AnchorMissing,
                    ViolationKind::PlanInconsistent,
                ][kind],
                span_id,
                detail,
                missing_terms,
            })
    }

    prop_compose! {
        fn marker()(
            seq in any::<u64>(),
            session_id in session_id(),
            session_seq in any::<u64>(),
            trigger in 0usize..5,
            outcome in 0usize..2,
            t in vec(any::<u32>(), 11),
            evicted in vec(any::<u64>(), 0..6),
            tier_evicted in vec(any::<u64>(), 0..3),
            compressed in vec(any::<u64>(), 0..3),
            summary_span_id in option::of(any::<u64>()),
            violations in vec(violation(), 0..3),
            at_ms in any::<u64>(),
            session_revision in any::<u64>(),
            turn in any::<u64>(),
            actor in text(),
            detail in text(),
        ) -> Marker {
            Marker {
                seq,
                session_id,
                session_seq,
                trigger: [
                    CompactionTrigger::HardBudget,
                    CompactionTrigger::SoftWatermark,
                    CompactionTrigger::Staleness,
                    CompactionTrigger::Manual,
                    CompactionTrigger::Unpin,
                ][trigger],
                outcome: [Outcome::Committed, Outcome::Aborted][outcome],
                tokens_before: t[0],
                tokens_after: t[1],
                incoming_tokens: t[2],
                window_tokens: t[3],
                budget_tokens: t[4],
                pinned_tokens: t[5],
                evicted,
                tier_evicted,
                compressed,
                summary_span_id,
                summary_generation: t[6],
                pinned_retained: t[7],
                pinned_total: t[8],
                anchors_carried: t[9],
                anchors_dropped: t[10],
                violations,
                at_ms,
                session_revision,
                turn,
                actor,
                detail,
            }
        }
    }

    proptest! {
        #[test]
        fn session_records_round_trip(record in session()) {
            let key = keys::session_key(&record.id);
            let value = encode_session(&key, &record);
            prop_assert_eq!(decode_session(&key, &value)?, record);
        }

        #[test]
        fn spans_round_trip(span in span(), session in session_id()) {
            let key = keys::session_number_key(&session, span.position);
            let terms = span_terms(&span);
            let value = encode_span(&key, &span, terms.clone());
            prop_assert_eq!(decode_span(&key, &value)?, span.clone());
            prop_assert_eq!(
                decode_span_with_terms(&key, &value)?,
                (span.clone(), Some(terms.clone()))
            );
            prop_assert_eq!(stored_terms(TreeId::Spans, &key, &value)?, (span.id, terms));
            prop_assert_eq!(with_terms(TreeId::Spans, &key, &value, |_| None)?, None);
        }

        #[test]
        fn archived_spans_round_trip(span in span(), session in session_id(), by_seq in any::<u64>()) {
            let key = keys::session_number_key(&session, span.id);
            let terms = span_terms(&span);
            let value = encode_archived(&key, &span, by_seq, terms.clone());
            prop_assert_eq!(decode_archived(&key, &value)?, (span.clone(), by_seq));
            prop_assert_eq!(stored_terms(TreeId::Archive, &key, &value)?, (span.id, terms));
            prop_assert_eq!(with_terms(TreeId::Archive, &key, &value, |_| None)?, None);
        }

        /// Rows written before spans carried their term vector read the
        /// same, with the vector derived from the text; `with_terms`
        /// gives them the vector it is handed, or the derived one.
        #[test]
        fn rows_without_a_term_vector_get_one(span in span(), session in session_id(), by_seq in any::<u64>()) {
            let terms = span_terms(&span);
            let live = keys::session_number_key(&session, span.position);
            let old_live = seal(&live, &span_row(&span));
            prop_assert_eq!(decode_span_with_terms(&live, &old_live)?, (span.clone(), None));
            prop_assert_eq!(stored_terms(TreeId::Spans, &live, &old_live)?, (span.id, terms.clone()));
            let packed = with_terms(TreeId::Spans, &live, &old_live, |_| None)?;
            prop_assert_eq!(packed, Some(encode_span(&live, &span, terms.clone())));
            let handed = with_terms(TreeId::Spans, &live, &old_live, |_| Some(vec![7]))?;
            prop_assert_eq!(handed, Some(encode_span(&live, &span, vec![7])));

            let archived = keys::session_number_key(&session, span.id);
            let old_archived = seal(&archived, &ArchivedRow { span: Some(span_row(&span)), archived_by_seq: by_seq });
            prop_assert_eq!(stored_terms(TreeId::Archive, &archived, &old_archived)?, (span.id, terms.clone()));
            let packed = with_terms(TreeId::Archive, &archived, &old_archived, |_| None)?;
            prop_assert_eq!(packed, Some(encode_archived(&archived, &span, by_seq, terms)));
        }

        #[test]
        fn pins_round_trip(span_id in any::<u64>(), predicate in option::of(predicate()), session in session_id()) {
            let key = keys::session_number_key(&session, span_id);
            let value = encode_pin(&key, span_id, predicate.as_ref());
            prop_assert_eq!(decode_pin(&key, &value)?, Pin { span_id, predicate });
        }

        #[test]
        fn markers_round_trip(marker in marker()) {
            let key = keys::marker_key(marker.seq);
            let value = encode_marker(&key, &marker);
            prop_assert_eq!(decode_marker(&key, &value)?, marker);
        }

        #[test]
        fn marker_log_round_trips(oldest in 1u64..1000, extra in 0u64..1000) {
            let value = encode_marker_log(oldest + extra, oldest);
            let row = decode_marker_log(&value)?;
            prop_assert_eq!((row.next_seq, row.oldest_seq), (oldest + extra, oldest));
        }

        #[test]
        fn format_version_round_trips(version in any::<u32>()) {
            prop_assert_eq!(decode_format_version(&encode_format_version(version))?, version);
        }

        /// Any single flipped bit of a stored record is caught.
        #[test]
        fn a_flipped_bit_is_corrupt(marker in marker(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let key = keys::marker_key(marker.seq);
            let mut value = encode_marker(&key, &marker);
            let i = at.index(value.len());
            value[i] ^= 1 << bit;
            let is_corrupt = matches!(decode_marker(&key, &value), Err(StoreError::Corrupt { .. }));
            prop_assert!(is_corrupt);
        }
    }

    #[test]
    fn negative_zero_and_infinity_keep_their_bits() {
        let mut config = SessionConfig::with_window(1000);
        config.alpha = -0.0;
        config.relevance_floor = f64::NEG_INFINITY;
        let row = config_from(config_row(&config)).map(|c| (c.alpha.to_bits(), c.relevance_floor));
        assert_eq!(row, Ok(((-0.0f64).to_bits(), f64::NEG_INFINITY)));
    }

    #[test]
    fn a_record_under_another_key_is_corrupt() {
        let mut config = SessionConfig::with_window(1000);
        config.workload = Some(DeclaredWorkload::default());
        let record = SessionRecord {
            id: "a".into(),
            config,
            created_at_ms: 1,
            updated_at_ms: 2,
            revision: 3,
            next_span_id: 4,
            turns: 5,
            marker_count: 6,
            compactions: 7,
            archived_spans: 8,
            live_tokens: 9,
            pinned_tokens: 10,
            live_spans: 11,
            pinned_spans: 12,
            approval_required: true,
            last_compaction_turn: 13,
            last_admit_ms: 14,
            last_compaction_ms: 15,
        };
        let value = encode_session(b"a", &record);
        match decode_session(b"b", &value) {
            Err(StoreError::Corrupt {
                tree,
                key,
                session,
                detail,
            }) => {
                assert_eq!(tree, "sessions");
                assert_eq!(key, "\"b\"");
                assert_eq!(session.as_deref(), Some("b"));
                assert!(detail.contains("checksum"), "{detail}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn unknown_enum_codes_and_missing_fields_are_corrupt() {
        let key = keys::session_number_key("s", 1);
        let row = SpanRow {
            id: 1,
            position: 1,
            role: 9,
            classification: Some(ClassificationRow {
                class: 1,
                source: 1,
                rule: String::new(),
            }),
            ..SpanRow::default()
        };
        let value = seal(&key, &row);
        let err = decode_span(&key, &value);
        assert!(
            matches!(&err, Err(StoreError::Corrupt { detail, .. }) if detail.contains("role")),
            "{err:?}"
        );
        let row = SpanRow {
            role: 1,
            classification: None,
            ..row
        };
        let value = seal(&key, &row);
        let err = decode_span(&key, &value);
        assert!(
            matches!(&err, Err(StoreError::Corrupt { detail, .. }) if detail.contains("classification")),
            "{err:?}"
        );
    }
}
