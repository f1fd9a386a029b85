//! One write against the batch so far: its checks, and the keys and
//! values it stages (a session's record, spans, pins, archive, keys, term
//! vectors and marker).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use ctxbroker_core::facts;
use ctxbroker_core::marker::Outcome;
use ctxbroker_core::span::SpanClass;
use ctxbroker_core::{Marker, Span, SpanId};

use crate::blocks;
use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::model::{Change, SessionRecord, WriteAck, WriteOp};
use crate::record;

use super::{Entry, Op, Trees, Writes};

/// The batch's writes so far, over the stored state: every check reads
/// through it, so a write sees the writes accepted before it in the batch.
/// The current write's changes stay apart until it is accepted.
pub(crate) struct Stage<'a> {
    trees: &'a Trees,
    batch: Writes,
    op: Writes,
    /// The rows of the current write's new spans, encoded before it was
    /// queued (see [`Encoded`]).
    encoded: Encoded,
    /// Keys read from the engine: look-ups it answered and entries of its
    /// scans, not what was found staged.
    reads: Cell<u64>,
}

/// The rows of a change's new spans (its summary and appended spans),
/// encoded by the task that queued the write rather than by the writer:
/// encoding a row and deriving a span's term vector are the writer's
/// largest work per span, and the writer is one thread for every session,
/// while the tasks that queue writes run side by side. Each entry holds
/// the span row's value, term vector included, made by the functions the
/// writer uses; a span not found here is encoded by the writer. The rows
/// carry the seed of each span's facts (`ctxbroker_core::facts::seed`),
/// which the caller also gets back, to derive the facts it keeps in
/// memory from it rather than from the text again.
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    rows: Vec<EncodedSpan>,
    seeds: Vec<(SpanId, Vec<u8>)>,
}

#[derive(Debug)]
struct EncodedSpan {
    id: SpanId,
    position: u64,
    span: Vec<u8>,
}

/// The spans a write stores anew: a change's summary and appended spans.
fn new_spans(op: &WriteOp) -> impl Iterator<Item = &Span> {
    let change = match op {
        WriteOp::Change { change, .. } => Some(change),
        _ => None,
    };
    change
        .into_iter()
        .flat_map(|change| change.summary.iter().chain(&change.append))
}

impl Encoded {
    /// The rows of the new spans `op` writes.
    pub(crate) fn of(op: &WriteOp) -> Encoded {
        let WriteOp::Change { change, .. } = op else {
            return Encoded::default();
        };
        let session = change.record.id.as_str();
        if keys::check_session_id(session).is_err() {
            return Encoded::default();
        }
        let mut seeds = Vec::new();
        let rows = new_spans(op)
            .map(|span| {
                let key = keys::session_number_key(session, span.position);
                let seed = facts::seed(span);
                if let Some(seed) = &seed {
                    seeds.push((span.id, seed.clone()));
                }
                EncodedSpan {
                    id: span.id,
                    position: span.position,
                    span: record::encode_seeded_span(&key, span, record::span_terms(span), seed),
                }
            })
            .collect();
        Encoded { rows, seeds }
    }

    /// The seeds of the new spans' facts, by span id, taken out.
    pub(crate) fn take_seeds(&mut self) -> Vec<(SpanId, Vec<u8>)> {
        std::mem::take(&mut self.seeds)
    }

    /// The text bytes the new spans of `op` hold.
    pub(crate) fn text_bytes(op: &WriteOp) -> usize {
        new_spans(op).map(|span| span.text.len()).sum()
    }

    /// The rows encoded for `span`, taken out.
    fn take(&mut self, span: &Span) -> Option<EncodedSpan> {
        let at = self
            .rows
            .iter()
            .position(|row| row.id == span.id && row.position == span.position)?;
        Some(self.rows.swap_remove(at))
    }
}

impl<'a> Stage<'a> {
    pub(super) fn new(trees: &'a Trees) -> Stage<'a> {
        Stage {
            trees,
            batch: BTreeMap::new(),
            op: BTreeMap::new(),
            encoded: Encoded::default(),
            reads: Cell::new(0),
        }
    }

    /// Keys read from the engine so far (see the field).
    pub(super) fn reads(&self) -> u64 {
        self.reads.get()
    }

    fn count_read(&self) {
        self.reads.set(self.reads.get().saturating_add(1));
    }

    /// The rows the next write's task encoded for it.
    pub(super) fn use_encoded(&mut self, encoded: Encoded) {
        self.encoded = encoded;
    }

    pub(crate) fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let staged = (tree, key.to_vec());
        if let Some(value) = self.op.get(&staged).or_else(|| self.batch.get(&staged)) {
            return Ok(value.clone());
        }
        self.count_read();
        let stored = self.trees.tree(tree).get(key).map_err(StoreError::engine)?;
        Ok(stored.map(|v| v.to_vec()))
    }

    /// Every live entry under `prefix`, in key order.
    pub(super) fn scan(&self, tree: TreeId, prefix: &[u8]) -> Result<Vec<Entry>, StoreError> {
        self.merged(
            tree,
            self.trees.tree(tree).scan_prefix(prefix),
            prefix,
            |key| key.starts_with(prefix),
        )
    }

    /// Every live entry from `first` to `last`, both included, in key
    /// order.
    pub(super) fn scan_range(
        &self,
        tree: TreeId,
        first: &[u8],
        last: &[u8],
    ) -> Result<Vec<Entry>, StoreError> {
        let engine = self.trees.tree(tree).range(first..=last);
        self.merged(tree, engine, first, |key| key <= last)
    }

    /// The engine's entries from `from` on while `within` holds, with the
    /// batch's and the current write's staged changes over them.
    fn merged(
        &self,
        tree: TreeId,
        engine: sled::Iter,
        from: &[u8],
        within: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for entry in engine {
            let (key, value) = entry.map_err(StoreError::engine)?;
            self.count_read();
            merged.insert(key.to_vec(), Some(value.to_vec()));
        }
        for layer in [&self.batch, &self.op] {
            for ((t, key), value) in layer.range((tree, from.to_vec())..) {
                if *t != tree || !within(key) {
                    break;
                }
                merged.insert(key.clone(), value.clone());
            }
        }
        Ok(merged
            .into_iter()
            .filter_map(|(key, value)| value.map(|v| (key, v)))
            .collect())
    }

    /// Every live key under `prefix`, in key order, without the values.
    pub(crate) fn scan_keys(
        &self,
        tree: TreeId,
        prefix: &[u8],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut merged: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        for entry in self.trees.tree(tree).scan_prefix(prefix).keys() {
            let key = entry.map_err(StoreError::engine)?;
            self.count_read();
            merged.insert(key.to_vec(), true);
        }
        for layer in [&self.batch, &self.op] {
            let from = (tree, prefix.to_vec());
            for ((t, key), value) in layer.range(from..) {
                if *t != tree || !key.starts_with(prefix) {
                    break;
                }
                merged.insert(key.clone(), value.is_some());
            }
        }
        Ok(merged
            .into_iter()
            .filter_map(|(key, live)| live.then_some(key))
            .collect())
    }

    pub(crate) fn put(&mut self, tree: TreeId, key: Vec<u8>, value: Vec<u8>) {
        self.op.insert((tree, key), Some(value));
    }

    pub(super) fn del(&mut self, tree: TreeId, key: Vec<u8>) {
        self.op.insert((tree, key), None);
    }

    /// The current write was accepted: its changes join the batch.
    pub(super) fn keep(&mut self) {
        let op = std::mem::take(&mut self.op);
        self.batch.extend(op);
    }

    /// The current write was refused: its changes are dropped.
    pub(super) fn discard(&mut self) {
        self.op.clear();
    }

    pub(super) fn into_writes(self) -> Writes {
        self.batch
    }
}

/// What an accepted write changes besides its keys.
#[derive(Default)]
pub(crate) struct Effects {
    pub(super) markers: Vec<Marker>,
    pub(crate) sessions: i64,
    /// Sessions deleted or created whole, or given a summary: their
    /// cached postings go.
    pub(crate) reset: Vec<String>,
    /// The write packs a block holding spans it appends (a turn of more
    /// than a block): its first span would stand only in a run, which a
    /// torn batch of appends must not leave (see `writer::in_order`), so it
    /// needs a transaction.
    pub(super) packs_own_spans: bool,
}

pub(super) fn invalid(session: &str, detail: String) -> StoreError {
    StoreError::InvalidWrite {
        session: session.to_owned(),
        detail,
    }
}

fn load_session(stage: &Stage<'_>, id: &str) -> Result<SessionRecord, StoreError> {
    let key = keys::session_key(id);
    match stage.get(TreeId::Sessions, &key)? {
        Some(value) => record::decode_session(&key, &value),
        None => Err(StoreError::SessionNotFound { id: id.to_owned() }),
    }
}

fn check_revision(session: &str, expected: u64, stored: &SessionRecord) -> Result<(), StoreError> {
    if stored.revision != expected {
        return Err(StoreError::StaleRevision {
            session: session.to_owned(),
            expected,
            actual: stored.revision,
        });
    }
    Ok(())
}

fn put_session(stage: &mut Stage<'_>, record: &SessionRecord) {
    let key = keys::session_key(&record.id);
    let value = record::encode_session(&key, record);
    stage.put(TreeId::Sessions, key, value);
}

/// Refuses a record whose first free span id is below the stored one:
/// every stored span id stays below it (the repair of a torn append
/// relies on that).
fn check_next_span_id(
    session: &str,
    stored: &SessionRecord,
    record: &SessionRecord,
) -> Result<(), StoreError> {
    if record.next_span_id < stored.next_span_id {
        return Err(invalid(
            session,
            format!(
                "next_span_id would move back from {} to {}",
                stored.next_span_id, record.next_span_id
            ),
        ));
    }
    Ok(())
}

/// Writes a constraint's pin, or removes the pin of a span that is no
/// longer a constraint.
fn sync_pin(stage: &mut Stage<'_>, session: &str, span: &Span) -> Result<(), StoreError> {
    let key = keys::session_number_key(session, span.id);
    if span.classification.class == SpanClass::Constraint {
        let value = record::encode_pin(&key, span.id, span.predicate.as_ref());
        stage.put(TreeId::Pins, key, value);
    } else if stage.get(TreeId::Pins, &key)?.is_some() {
        stage.del(TreeId::Pins, key);
    }
    Ok(())
}

/// Stores a new span at its position, which must be free, and pins it if it
/// is a constraint. Its id has passed [`check_new_id`], so no pin can exist
/// for it yet.
///
/// Positions from `free_from` on are known to be free, and are not looked
/// up: no span stands at or beyond its session's stored next span id (an
/// admitted span's position is its id, a summary's the position of a span
/// it replaces, an import refuses a span beyond it, and opening the store
/// removes what a torn append left there), and this write's earlier spans
/// move `free_from` past their own positions. An appended span, the usual
/// case, so costs no read of the engine; a summary, which stands at an
/// earlier position, is looked up.
fn insert_span(
    stage: &mut Stage<'_>,
    session: &str,
    span: &Span,
    free_from: &mut u64,
) -> Result<(), StoreError> {
    let key = keys::session_number_key(session, span.position);
    let known_free = span.position >= *free_from;
    if !known_free && let Some(taken) = stage.span_row(session, span.position)? {
        let holder = record::decode_span(&key, &taken)?;
        return Err(invalid(
            session,
            format!(
                "span {} cannot take position {}: span {} holds it",
                span.id, span.position, holder.id
            ),
        ));
    }
    *free_from = (*free_from).max(span.position.saturating_add(1));
    let value = match stage.encoded.take(span) {
        Some(row) => row.span,
        None => record::encode_seeded_span(&key, span, record::span_terms(span), facts::seed(span)),
    };
    if known_free {
        // At or past the stored next span id: its block is not packed.
        stage.put(TreeId::Spans, key, value);
    } else {
        stage.put_span_row(session, span.position, value)?;
    }
    if span.classification.class == SpanClass::Constraint {
        let key = keys::session_number_key(session, span.id);
        let value = record::encode_pin(&key, span.id, span.predicate.as_ref());
        stage.put(TreeId::Pins, key, value);
    }
    Ok(())
}

/// A live span as [`find_live`] finds it: the span, and the term vector
/// its row carries.
struct Live {
    span: Span,
    terms: Option<Vec<u8>>,
}

/// Finds a live span by id: spans are keyed by position, which equals the
/// id for admitted spans; summaries stand elsewhere, so on a miss the
/// session's live spans are indexed once, id to position.
fn find_live(
    stage: &Stage<'_>,
    session: &str,
    id: SpanId,
    index: &mut Option<HashMap<SpanId, u64>>,
) -> Result<Option<Live>, StoreError> {
    let at = |position: u64| -> Result<Option<Live>, StoreError> {
        let Some(value) = stage.span_row(session, position)? else {
            return Ok(None);
        };
        let key = keys::session_number_key(session, position);
        let (span, terms) = record::decode_span_with_terms(&key, &value)?;
        Ok((span.id == id).then_some(Live { span, terms }))
    };
    if let Some(live) = at(id)? {
        return Ok(Some(live));
    }
    if index.is_none() {
        let mut by_id = HashMap::new();
        for (key, value) in stage.live_span_rows(session)? {
            let span = record::decode_span(&key, &value)?;
            by_id.insert(span.id, span.position);
        }
        *index = Some(by_id);
    }
    match index.as_ref().and_then(|by_id| by_id.get(&id)) {
        // The index predates this write's own changes: read the row again.
        Some(&position) => at(position),
        None => Ok(None),
    }
}

/// Checks that a span id is one of those the write gives out: at least the
/// stored first free id, below the new record's.
fn check_new_id(
    session: &str,
    id: SpanId,
    stored: &SessionRecord,
    record: &SessionRecord,
) -> Result<(), StoreError> {
    if id < stored.next_span_id || id >= record.next_span_id {
        return Err(invalid(
            session,
            format!(
                "new span id {id} is outside the ids this write gives out ({}..{})",
                stored.next_span_id, record.next_span_id
            ),
        ));
    }
    Ok(())
}

fn check_marker(session: &str, marker: &Marker, record: &SessionRecord) -> Result<(), StoreError> {
    if marker.session_id != session {
        return Err(invalid(
            session,
            format!("marker names session {:?}", marker.session_id),
        ));
    }
    if marker.session_seq != record.marker_count {
        return Err(invalid(
            session,
            format!(
                "marker session_seq {} differs from the record's marker_count {}",
                marker.session_seq, record.marker_count
            ),
        ));
    }
    Ok(())
}

fn put_marker(stage: &mut Stage<'_>, mut marker: Marker, seq: u64, effects: &mut Effects) {
    marker.seq = seq;
    let key = keys::marker_key(seq).to_vec();
    let value = record::encode_marker(&key, &marker);
    stage.put(TreeId::Markers, key, value);
    effects.markers.push(marker);
}

/// Checks one write against the staged state and stages its changes.
/// `seq` is the seq its marker gets, if it writes one.
pub(super) fn apply(
    stage: &mut Stage<'_>,
    op: Op,
    seq: u64,
    effects: &mut Effects,
) -> Result<WriteAck, StoreError> {
    let op = match op {
        Op::Write(op) => *op,
        Op::Import(import) => return crate::transfer::stage_import(stage, *import, effects),
    };
    match op {
        WriteOp::CreateSession { record } => {
            keys::check_session_id(&record.id)?;
            let key = keys::session_key(&record.id);
            if stage.get(TreeId::Sessions, &key)?.is_some() {
                return Err(StoreError::SessionExists { id: record.id });
            }
            put_session(stage, &record);
            effects.sessions += 1;
            Ok(WriteAck::default())
        }
        WriteOp::UpdateSession {
            expected_revision,
            record,
        } => {
            keys::check_session_id(&record.id)?;
            let stored = load_session(stage, &record.id)?;
            check_revision(&record.id, expected_revision, &stored)?;
            check_next_span_id(&record.id, &stored, &record)?;
            put_session(stage, &record);
            Ok(WriteAck::default())
        }
        WriteOp::DeleteSession { id } => {
            keys::check_session_id(&id)?;
            let key = keys::session_key(&id);
            // Presence is enough: a corrupt record can still be deleted.
            if stage.get(TreeId::Sessions, &key)?.is_none() {
                return Err(StoreError::SessionNotFound { id });
            }
            let spans_deleted = delete_contents(stage, &id)?;
            stage.del(TreeId::Sessions, key);
            effects.sessions -= 1;
            effects.reset.push(id.clone());
            Ok(WriteAck {
                marker_seq: None,
                spans_deleted,
            })
        }
        WriteOp::Retract {
            expected_revision,
            record,
            spans,
        } => retract(stage, expected_revision, &record, &spans, effects),
        WriteOp::ResetSession {
            expected_revision,
            record,
        } => {
            let session = record.id.as_str();
            keys::check_session_id(session)?;
            let stored = load_session(stage, session)?;
            check_revision(session, expected_revision, &stored)?;
            check_next_span_id(session, &stored, &record)?;
            let spans_deleted = delete_contents(stage, session)?;
            put_session(stage, &record);
            effects.reset.push(record.id.clone());
            Ok(WriteAck {
                marker_seq: None,
                spans_deleted,
            })
        }
        WriteOp::Change { change, keys } => write_change(stage, change, keys, seq, effects),
    }
}

/// Deletes everything a session owns but its record (live spans, pins,
/// archive, keys); returns the spans deleted, live and
/// archived.
fn delete_contents(stage: &mut Stage<'_>, session: &str) -> Result<u64, StoreError> {
    let prefix = keys::session_prefix(session);
    let mut spans_deleted = 0;
    for tree in TreeId::PER_SESSION {
        if tree == TreeId::Runs {
            // A packed block's run holds several spans.
            for (key, run) in stage.scan(tree, &prefix)? {
                spans_deleted += blocks::rows_in_run(&key, &run)?;
                stage.del(tree, key);
            }
            continue;
        }
        for key in stage.scan_keys(tree, &prefix)? {
            if matches!(tree, TreeId::Spans | TreeId::Archive) {
                spans_deleted += 1;
            }
            stage.del(tree, key);
        }
    }
    Ok(spans_deleted)
}

/// Takes back live spans: each must stand at its position; its span,
/// pin and idempotency keys are removed, then the record is
/// written.
fn retract(
    stage: &mut Stage<'_>,
    expected_revision: u64,
    record: &SessionRecord,
    spans: &[Span],
    effects: &mut Effects,
) -> Result<WriteAck, StoreError> {
    let session = record.id.as_str();
    keys::check_session_id(session)?;
    let stored = load_session(stage, session)?;
    check_revision(session, expected_revision, &stored)?;
    check_next_span_id(session, &stored, record)?;
    let mut ids = std::collections::HashSet::with_capacity(spans.len());
    for span in spans {
        let key = keys::session_number_key(session, span.position);
        let holder = match stage.span_row(session, span.position)? {
            Some(value) => Some(record::decode_span(&key, &value)?.id),
            None => None,
        };
        if holder != Some(span.id) {
            return Err(invalid(
                session,
                format!(
                    "span {} to take back is not live at position {}",
                    span.id, span.position
                ),
            ));
        }
        stage.del_span_row(session, span.position)?;
        let by_id = keys::session_number_key(session, span.id);
        if stage.get(TreeId::Pins, &by_id)?.is_some() {
            stage.del(TreeId::Pins, by_id);
        }
        ids.insert(span.id);
    }
    // Keys name span ids; a session's keys are few next to its spans, and
    // taking back is rare, so they are read whole.
    for (key, value) in stage.scan(TreeId::Keys, &keys::session_prefix(session))? {
        if ids.contains(&record::decode_key(&key, &value)?) {
            stage.del(TreeId::Keys, key);
        }
    }
    put_session(stage, record);
    effects.reset.push(record.id.clone());
    Ok(WriteAck {
        marker_seq: None,
        spans_deleted: spans.len() as u64,
    })
}

/// Checks a change against the stored session and stages each part it
/// has, in order: evict, rewrite in place, summary, append with its keys,
/// marker, record. Rewrites come before the summary, as the session
/// applies them, so a rewrite never names the summary.
fn write_change(
    stage: &mut Stage<'_>,
    change: Change,
    idempotency: Vec<(String, SpanId)>,
    seq: u64,
    effects: &mut Effects,
) -> Result<WriteAck, StoreError> {
    let Change {
        expected_revision,
        record,
        append,
        evict,
        summary,
        replace,
        marker,
    } = change;
    let session = record.id.as_str();
    keys::check_session_id(session)?;
    let stored = load_session(stage, session)?;
    check_revision(session, expected_revision, &stored)?;
    check_next_span_id(session, &stored, &record)?;
    match &marker {
        // A rewrite in place and an admission stand alone; anything more
        // is a compaction, which needs its marker.
        None if !evict.is_empty()
            || summary.is_some()
            || !(replace.is_empty() || append.is_empty()) =>
        {
            return Err(invalid(
                session,
                "a change that evicts or rewrites spans carries no marker".into(),
            ));
        }
        None => {}
        Some(marker) => {
            check_marker(session, marker, &record)?;
            if marker.outcome == Outcome::Aborted {
                // Nothing changes but the record's marker count.
                check_revision(session, record.revision, &stored)?;
                if !(append.is_empty()
                    && evict.is_empty()
                    && summary.is_none()
                    && replace.is_empty())
                {
                    return Err(invalid(
                        session,
                        "an ABORTED marker comes with changes to the context".into(),
                    ));
                }
            }
        }
    }

    let mut index = None;
    for id in evict {
        let Some(Live { span, terms }) = find_live(stage, session, id, &mut index)? else {
            return Err(invalid(session, format!("span {id} to evict is not live")));
        };
        stage.del_span_row(session, span.position)?;
        let archive_key = keys::session_number_key(session, id);
        // The term vector moves with the span, as it was first stored.
        let terms = terms.unwrap_or_else(|| record::span_terms(&span));
        let value = record::encode_archived(&archive_key, &span, seq, terms);
        stage.put(TreeId::Archive, archive_key.clone(), value);
        if stage.get(TreeId::Pins, &archive_key)?.is_some() {
            stage.del(TreeId::Pins, archive_key);
        }
    }
    for span in &replace {
        let key = keys::session_number_key(session, span.position);
        let (holder, terms) = match stage.span_row(session, span.position)? {
            Some(value) => {
                let (held, terms) = record::decode_span_with_terms(&key, &value)?;
                let terms = terms.unwrap_or_else(|| record::span_terms(&held));
                (Some(held.id), terms)
            }
            None => (None, Vec::new()),
        };
        if holder != Some(span.id) {
            let holder = holder.map_or("no live span".into(), |id| format!("span {id}"));
            return Err(invalid(
                session,
                format!(
                    "span {} to rewrite: position {} holds {holder}",
                    span.id, span.position
                ),
            ));
        }
        // A span is indexed once, as it was stored: a rewrite keeps the
        // term vector of the text it replaces.
        let value = record::encode_span(&key, span, terms);
        stage.put_span_row(session, span.position, value)?;
        sync_pin(stage, session, span)?;
    }
    let mut free_from = stored.next_span_id;
    for span in summary.iter().chain(&append) {
        check_new_id(session, span.id, &stored, &record)?;
        insert_span(stage, session, span, &mut free_from)?;
    }
    if summary.is_some() {
        // A summary stands at the position of what it replaces, below the
        // ids search has read: the session's postings are read anew.
        effects.reset.push(session.to_owned());
    }
    for (key, span_id) in &idempotency {
        if !append.iter().any(|s| s.id == *span_id) {
            return Err(invalid(
                session,
                format!(
                    "idempotency key {key:?} names span {span_id}, which this write does not admit"
                ),
            ));
        }
        let stored_key = keys::session_text_key(session, key);
        if stage.get(TreeId::Keys, &stored_key)?.is_some() {
            return Err(invalid(
                session,
                format!("idempotency key {key:?} is already taken"),
            ));
        }
        let value = record::encode_key(&stored_key, *span_id);
        stage.put(TreeId::Keys, stored_key, value);
    }
    for block in blocks::blocks_due(stored.next_span_id, record.next_span_id) {
        stage.pack_block(session, block)?;
        effects.packs_own_spans |= (block + 1) * blocks::BLOCK_SPANS > stored.next_span_id;
    }
    let marker_seq = marker.map(|marker| {
        put_marker(stage, marker, seq, effects);
        seq
    });
    put_session(stage, &record);
    Ok(WriteAck {
        marker_seq,
        spans_deleted: 0,
    })
}
