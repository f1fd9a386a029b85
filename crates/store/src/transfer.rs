//! Moving one session between stores: an export reads everything the
//! session is made of as of one moment; an import checks it in full and
//! writes it whole, through the writer, into another store.
//!
//! # What travels
//!
//! The session's record (configuration, counters, revision, next span id,
//! marker count, timestamps), its live spans (constraints with their
//! predicates: the pin set is rebuilt from them on import), its archive
//! (each evicted span with the seq of the marker that evicted it, a seq of
//! the exporting store's log) and its idempotency keys. An imported
//! session therefore answers as the original did and gives out the same
//! next span ids, revisions and per-session marker numbers.
//!
//! Its markers do not travel: the marker log is one global sequence per
//! store, and a seq means nothing in another store's log. An import writes
//! no marker either: it is not a compaction, and a marker would move the
//! session's marker count away from the original's.
//!
//! # The body
//!
//! A snapshot's body is a protobuf message of this module listing the
//! session's stored records as the store keeps them, key and value, each
//! value in the store's checksummed, versioned record frame (see
//! the `record` module): the body is readable by any build that reads that record
//! format. Before anything is written, an import decodes every record (a
//! damaged one is refused with its index and key), checks that every key
//! belongs to the session, and checks the records against each other:
//! ids and positions below the next span id, ids unique, the record's live
//! totals equal to its live spans', every idempotency key naming a span
//! the snapshot holds. The snapshot's checksum, over the format version,
//! the session id and the body, catches damage in transit or at rest; it
//! is not a signature.

use std::collections::HashSet;
use std::fmt;

use ctxbroker_core::span::SpanClass;
use ctxbroker_core::{Span, SpanId};
use prost::Message;

use crate::blocks;
use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::model::{SessionRecord, WriteAck};
use crate::record;
use crate::store::Store;
use crate::writer::{Effects, Op, Stage};

/// The snapshot format this build writes and reads: the body's layout and
/// the record frames inside it.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// A snapshot's body: the session's stored records.
#[derive(Clone, PartialEq, Message)]
struct SnapshotBody {
    #[prost(message, repeated, tag = "1")]
    records: Vec<BodyRecord>,
}

/// One stored record: its keyspace, key and framed value.
#[derive(Clone, PartialEq, Message)]
struct BodyRecord {
    /// The keyspace, as [`tree_code`] numbers it.
    #[prost(uint32, tag = "1")]
    tree: u32,
    #[prost(bytes = "vec", tag = "2")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
}

/// The keyspaces a snapshot carries, numbered from 1 so that a missing
/// field (0) is an error. Pins are rebuilt from the live constraints;
/// markers and meta belong to the store, not the session.
fn tree_code(tree: TreeId) -> Option<u32> {
    match tree {
        TreeId::Sessions => Some(1),
        TreeId::Spans => Some(2),
        TreeId::Archive => Some(3),
        TreeId::Keys => Some(4),
        TreeId::Runs | TreeId::Pins | TreeId::Markers | TreeId::Meta => None,
    }
}

fn tree_from(code: u32) -> Option<TreeId> {
    match code {
        1 => Some(TreeId::Sessions),
        2 => Some(TreeId::Spans),
        3 => Some(TreeId::Archive),
        4 => Some(TreeId::Keys),
        _ => None,
    }
}

/// The snapshot checksum: CRC-32 (IEEE) over the format version (4 bytes,
/// little-endian), the session id's length (8 bytes, little-endian), the
/// id, and the body.
pub fn snapshot_checksum(format_version: u32, session_id: &str, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&format_version.to_le_bytes());
    hasher.update(&(session_id.len() as u64).to_le_bytes());
    hasher.update(session_id.as_bytes());
    hasher.update(body);
    hasher.finalize()
}

/// A session exported from a store: the snapshot's parts, and what it
/// holds, for the reply.
#[derive(Clone)]
pub struct SessionExport {
    /// [`SNAPSHOT_FORMAT_VERSION`].
    pub format_version: u32,
    /// The session.
    pub session_id: String,
    /// The session's stored records.
    pub body: Vec<u8>,
    /// [`snapshot_checksum`] of the three above.
    pub checksum: u32,
    /// The session's record as exported.
    pub record: SessionRecord,
    /// Archived spans in the body.
    pub archived_spans: u64,
    /// Idempotency keys in the body.
    pub idempotency_keys: u64,
}

impl fmt::Debug for SessionExport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionExport")
            .field("session_id", &self.session_id)
            .field("format_version", &self.format_version)
            .field("body_bytes", &self.body.len())
            .field("checksum", &format_args!("{:08x}", self.checksum))
            .field("revision", &self.record.revision)
            .field("archived_spans", &self.archived_spans)
            .field("idempotency_keys", &self.idempotency_keys)
            .finish()
    }
}

/// The part of a snapshot that is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPart {
    /// A format this build does not read.
    FormatVersion,
    /// An id the store cannot hold.
    SessionId,
    /// The checksum does not match the content.
    Checksum,
    /// The body does not decode, or its records do not fit together.
    Body,
}

impl SnapshotPart {
    /// The part's field name in the snapshot.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotPart::FormatVersion => "format_version",
            SnapshotPart::SessionId => "session_id",
            SnapshotPart::Checksum => "checksum",
            SnapshotPart::Body => "body",
        }
    }
}

/// Why a snapshot cannot be imported. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("snapshot {}: {detail}", .part.name())]
pub struct InvalidSnapshot {
    /// The offending part.
    pub part: SnapshotPart,
    /// What is wrong, naming the record where one is at fault.
    pub detail: String,
}

fn invalid(part: SnapshotPart, detail: impl Into<String>) -> InvalidSnapshot {
    InvalidSnapshot {
        part,
        detail: detail.into(),
    }
}

fn bad_body(detail: impl Into<String>) -> InvalidSnapshot {
    invalid(SnapshotPart::Body, detail)
}

/// A stored record: its keyspace, key and framed value.
type RawRecord = (TreeId, Vec<u8>, Vec<u8>);

/// A snapshot checked in full, ready to be written by
/// [`Store::import_session`].
#[derive(Clone)]
pub struct SessionImport {
    record: SessionRecord,
    /// In prompt order.
    live: Vec<Span>,
    archived: u64,
    idempotency_keys: u64,
    /// The text bytes of its spans, live and archived.
    text_bytes: u64,
    /// The records to write, as they were exported.
    records: Vec<RawRecord>,
}

impl fmt::Debug for SessionImport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionImport")
            .field("session_id", &self.record.id)
            .field("revision", &self.record.revision)
            .field("live_spans", &self.live.len())
            .field("archived_spans", &self.archived)
            .field("idempotency_keys", &self.idempotency_keys)
            .finish()
    }
}

/// The detail of a record that failed to decode.
fn failure(err: StoreError) -> String {
    match err {
        StoreError::Corrupt { detail, .. } => detail,
        other => other.to_string(),
    }
}

impl SessionImport {
    /// Checks a snapshot: its format version, the session id, the
    /// checksum, then every record of the body and how they fit together.
    /// The first problem found is reported, naming the part and, inside
    /// the body, the record.
    pub fn open(
        format_version: u32,
        session_id: &str,
        body: &[u8],
        checksum: u32,
    ) -> Result<SessionImport, InvalidSnapshot> {
        if format_version != SNAPSHOT_FORMAT_VERSION {
            return Err(invalid(
                SnapshotPart::FormatVersion,
                format!(
                    "is {format_version}; this build reads version {SNAPSHOT_FORMAT_VERSION} (export the session again with a build of the importing server's version)"
                ),
            ));
        }
        if let Err(StoreError::InvalidSessionId { len }) = keys::check_session_id(session_id) {
            return Err(invalid(
                SnapshotPart::SessionId,
                format!(
                    "must be 1 to {} bytes; got {len}",
                    keys::MAX_SESSION_ID_BYTES
                ),
            ));
        }
        let actual = snapshot_checksum(format_version, session_id, body);
        if actual != checksum {
            return Err(invalid(
                SnapshotPart::Checksum,
                format!(
                    "is {checksum:08x}, but the snapshot's format_version, session_id and body sum to {actual:08x}: it was damaged or altered after export"
                ),
            ));
        }
        let decoded =
            SnapshotBody::decode(body).map_err(|e| bad_body(format!("does not decode: {e}")))?;

        let mut seen: HashSet<(u32, Vec<u8>)> = HashSet::new();
        let mut record = None;
        let mut live = Vec::new();
        let mut archived = Vec::new();
        let mut keyed = Vec::new();
        let mut text_bytes = 0;
        let mut records = Vec::with_capacity(decoded.records.len());
        for (i, mut entry) in decoded.records.into_iter().enumerate() {
            let Some(tree) = tree_from(entry.tree) else {
                return Err(bad_body(format!(
                    "record {i} has the unknown keyspace code {}",
                    entry.tree
                )));
            };
            let what = format!(
                "record {i} ({} {})",
                tree.name(),
                keys::render(tree, &entry.key)
            );
            let numbered = matches!(tree, TreeId::Spans | TreeId::Archive);
            let owner = if numbered {
                keys::parse_session_number_key(&entry.key).map(|(id, _)| id)
            } else {
                keys::session_of(tree, &entry.key)
            };
            if owner.as_deref() != Some(session_id) {
                return Err(bad_body(format!(
                    "{what}: its key does not belong to session {session_id:?}"
                )));
            }
            if !seen.insert((entry.tree, entry.key.clone())) {
                return Err(bad_body(format!("{what}: appears twice")));
            }
            let damaged = |err: StoreError| bad_body(format!("{what}: {}", failure(err)));
            match tree {
                TreeId::Sessions => {
                    let decoded =
                        record::decode_session(&entry.key, &entry.value).map_err(damaged)?;
                    // Sealed again: a commit epoch the record carried was the
                    // epoch of the store it came from, and means nothing here.
                    entry.value = record::encode_session(&entry.key, &decoded);
                    record = Some(decoded);
                }
                TreeId::Spans => {
                    let span = record::decode_span(&entry.key, &entry.value).map_err(damaged)?;
                    text_bytes += crate::text_bytes(&span);
                    live.push(span);
                }
                TreeId::Archive => {
                    let (span, _) =
                        record::decode_archived(&entry.key, &entry.value).map_err(damaged)?;
                    text_bytes += crate::text_bytes(&span);
                    archived.push(span.id);
                }
                TreeId::Keys => {
                    let span = record::decode_key(&entry.key, &entry.value).map_err(damaged)?;
                    keyed.push((keys::render(tree, &entry.key), span));
                }
                TreeId::Runs | TreeId::Pins | TreeId::Markers | TreeId::Meta => {
                    return Err(bad_body(format!(
                        "{what}: not a keyspace a snapshot carries"
                    )));
                }
            }
            records.push((tree, entry.key, entry.value));
        }
        let Some(record) = record else {
            return Err(bad_body("holds no session record"));
        };

        let next = record.next_span_id;
        let mut held: HashSet<SpanId> = HashSet::with_capacity(live.len() + archived.len());
        let mut check_id = |id: SpanId, state: &str| {
            if id == 0 || id >= next {
                return Err(bad_body(format!(
                    "{state} span {id} is not among the ids the session gave out (1 to {})",
                    next.saturating_sub(1)
                )));
            }
            if !held.insert(id) {
                return Err(bad_body(format!("span {id} appears more than once")));
            }
            Ok(())
        };
        for span in &live {
            check_id(span.id, "live")?;
            // The writer takes positions from the next span id on as free.
            if span.position >= next {
                return Err(bad_body(format!(
                    "live span {} stands at position {}, not below the session's next span id {next}",
                    span.id, span.position
                )));
            }
        }
        for &id in &archived {
            check_id(id, "archived")?;
        }

        let mut totals = [0u64; 4];
        for span in &live {
            totals[0] += 1;
            totals[1] += u64::from(span.tokens);
            if span.classification.class == SpanClass::Constraint {
                totals[2] += 1;
                totals[3] += u64::from(span.tokens);
            }
        }
        let stated = [
            ("live_spans", record.live_spans),
            ("live_tokens", record.live_tokens),
            ("pinned_spans", record.pinned_spans),
            ("pinned_tokens", record.pinned_tokens),
        ];
        for ((name, says), holds) in stated.into_iter().zip(totals) {
            if says != holds {
                return Err(bad_body(format!(
                    "the session record says {name} = {says}, but its live spans make {holds}"
                )));
            }
        }
        for (key, span) in &keyed {
            if !held.contains(span) {
                return Err(bad_body(format!(
                    "idempotency key {key} names span {span}, which the snapshot does not hold"
                )));
            }
        }

        live.sort_by_key(|span| span.position);
        Ok(SessionImport {
            record,
            live,
            archived: archived.len() as u64,
            idempotency_keys: keyed.len() as u64,
            text_bytes,
            records,
        })
    }

    /// The session's record as it will be stored.
    pub fn record(&self) -> &SessionRecord {
        &self.record
    }

    /// The live context, in prompt order.
    pub fn live_spans(&self) -> &[Span] {
        &self.live
    }

    /// Archived spans in the snapshot.
    pub fn archived_spans(&self) -> u64 {
        self.archived
    }

    /// Idempotency keys in the snapshot.
    pub fn idempotency_keys(&self) -> u64 {
        self.idempotency_keys
    }

    /// The text bytes ([`crate::text_bytes`]) of the snapshot's spans,
    /// live and archived: what the session will hold once imported.
    pub fn text_bytes(&self) -> u64 {
        self.text_bytes
    }
}

impl Store {
    /// Exports a session: its record, live spans, archive and idempotency
    /// keys, read under one snapshot, so the export holds the session as it
    /// was between two of the writer's batches. Every record is decoded on
    /// the way: a damaged one fails the export with
    /// [`StoreError::Corrupt`] instead of travelling.
    ///
    /// Blocks the writer only while the raw records are copied; run it off
    /// the async runtime's workers for large sessions.
    pub fn export_session(&self, id: &str) -> Result<SessionExport, StoreError> {
        self.reading("export_session");
        keys::check_session_id(id)?;
        let mut records = self.session_records(id)?;
        let mut exported = None;
        let mut archived_spans = 0;
        let mut idempotency_keys = 0;
        for (tree, key, value) in &mut records {
            match tree {
                TreeId::Sessions => {
                    let decoded = record::decode_session(key, value)?;
                    // Without the commit epoch it may carry: that is this
                    // store's bookkeeping, not the session's.
                    *value = record::encode_session(key, &decoded);
                    exported = Some(decoded);
                }
                TreeId::Spans => {
                    record::decode_span(key, value)?;
                }
                TreeId::Archive => {
                    record::decode_archived(key, value)?;
                    archived_spans += 1;
                }
                TreeId::Keys => {
                    record::decode_key(key, value)?;
                    idempotency_keys += 1;
                }
                TreeId::Runs | TreeId::Pins | TreeId::Markers | TreeId::Meta => {}
            }
        }
        let Some(exported) = exported else {
            return Err(StoreError::SessionNotFound { id: id.to_owned() });
        };
        let body = SnapshotBody {
            records: records
                .into_iter()
                .filter_map(|(tree, key, value)| {
                    tree_code(tree).map(|tree| BodyRecord { tree, key, value })
                })
                .collect(),
        }
        .encode_to_vec();
        Ok(SessionExport {
            format_version: SNAPSHOT_FORMAT_VERSION,
            session_id: id.to_owned(),
            checksum: snapshot_checksum(SNAPSHOT_FORMAT_VERSION, id, &body),
            body,
            record: exported,
            archived_spans,
            idempotency_keys,
        })
    }

    /// The raw records of a session, copied under one snapshot: the record
    /// first, then live spans, archive and keys, each in key order.
    fn session_records(&self, id: &str) -> Result<Vec<RawRecord>, StoreError> {
        let _snapshot = self.snapshot();
        let trees = self.trees();
        let key = keys::session_key(id);
        let Some(value) = trees.sessions.get(&key).map_err(StoreError::engine)? else {
            return Err(StoreError::SessionNotFound { id: id.to_owned() });
        };
        let mut records = vec![(TreeId::Sessions, key, value.to_vec())];
        let prefix = keys::session_prefix(id);
        // A snapshot carries a row per live span, however its block is
        // stored here.
        blocks::in_position_order(
            blocks::entries(trees.spans.scan_prefix(&prefix)),
            blocks::entries(trees.runs.scan_prefix(&prefix)),
            |key, row| {
                records.push((TreeId::Spans, key.to_vec(), row.to_vec()));
                Ok(())
            },
        )?;
        for tree in [TreeId::Archive, TreeId::Keys] {
            for entry in trees.tree(tree).scan_prefix(&prefix) {
                let (key, value) = entry.map_err(StoreError::engine)?;
                records.push((tree, key.to_vec(), value.to_vec()));
            }
        }
        Ok(records)
    }

    /// Writes a checked snapshot as a new session, in one transaction
    /// through the writer, flushed before it is acknowledged like any
    /// write. Refused with [`StoreError::SessionExists`] when the id is
    /// taken; nothing is written then, nor on any other error.
    pub async fn import_session(&self, import: SessionImport) -> Result<(), StoreError> {
        self.submit(Op::Import(Box::new(import))).await.map(|_| ())
    }
}

/// The writer's part of an import: checked against the staged state (the
/// id must be free, and no record of the id may linger), then every record
/// staged, with a pin for each live constraint.
pub(crate) fn stage_import(
    stage: &mut Stage<'_>,
    import: SessionImport,
    effects: &mut Effects,
) -> Result<WriteAck, StoreError> {
    let id = import.record.id.clone();
    keys::check_session_id(&id)?;
    if stage
        .get(TreeId::Sessions, &keys::session_key(&id))?
        .is_some()
    {
        return Err(StoreError::SessionExists { id });
    }
    let prefix = keys::session_prefix(&id);
    for tree in TreeId::PER_SESSION {
        if let Some(key) = stage.scan_keys(tree, &prefix)?.first() {
            return Err(StoreError::InvalidWrite {
                session: id.clone(),
                detail: format!(
                    "import refused: {} still holds {} of no stored session",
                    tree.name(),
                    keys::render(tree, key)
                ),
            });
        }
    }
    // A span's row carries its term vector for search; one exported from
    // a store that kept them apart gets it here, derived from the text.
    for (tree, key, value) in import.records {
        let value = match tree {
            TreeId::Spans | TreeId::Archive => {
                record::with_terms(tree, &key, &value, |_| None)?.unwrap_or(value)
            }
            _ => value,
        };
        stage.put(tree, key, value);
    }
    stage.pack_due(&id, import.record.next_span_id)?;
    for span in &import.live {
        if span.classification.class == SpanClass::Constraint {
            let key = keys::session_number_key(&id, span.id);
            let value = record::encode_pin(&key, span.id, span.predicate.as_ref());
            stage.put(TreeId::Pins, key, value);
        }
    }
    effects.sessions += 1;
    effects.reset.push(id);
    Ok(WriteAck::default())
}

#[cfg(test)]
mod tests;
