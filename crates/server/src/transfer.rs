//! `ExportSession` and `ImportSession`: moving a session between replicas
//! (scale-out), as a snapshot any client can carry.
//!
//! The export reads the session from the store under one snapshot of the
//! store (see `ctxbroker_store::transfer`): consistent as of one moment
//! without taking the session's turn, so it neither waits behind nor holds
//! up the session's admissions. The import checks the snapshot in full,
//! then adds the session through the broker, which reserves its place
//! under `max_sessions`, writes it through the store's one writer (one
//! transaction, flushed before the reply) and serves it from memory from
//! then on. It writes no marker: an import is not a compaction, and the
//! session's marker count must stay the original's so that its next
//! markers carry the same per-session numbers on either replica.

use ctxbroker_core::session::{Session, SessionRecord};
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::SessionImport;
use prost::Message;
use tonic::Status;
use tracing::info;

use crate::blocking;
use crate::broker::Broker;
use crate::config::Limits;
use crate::convert::session_to_pb;
use crate::error::{ApiError, BadField};
use crate::validate;

/// The `ErrorInfo.reason` of an export refused for its size.
pub use crate::error::reason::SNAPSHOT_TOO_LARGE;

/// Exports a session as a snapshot. RESOURCE_EXHAUSTED when an
/// `ImportSession` request carrying it would exceed `max_request_bytes`:
/// such a snapshot could not be imported by a server with the same limits,
/// so the operator learns it before moving anything.
pub async fn export_session(
    broker: &Broker,
    req: pb::ExportSessionRequest,
) -> Result<pb::ExportSessionResponse, Status> {
    validate::full_session_id("session_id", &req.session_id, broker.limits())
        .map_err(validate::single)?;
    let id = req.session_id.clone();
    // A large session is read and encoded off the runtime's workers.
    let exported = blocking::read(broker.store(), move |store| store.export_session(&id)).await?;
    let snapshot = pb::SessionSnapshot {
        format_version: exported.format_version,
        session_id: exported.session_id,
        body: exported.body,
        checksum: exported.checksum,
    };
    let snapshot_bytes = snapshot.encoded_len();
    // The request is the snapshot as field 1 of ImportSessionRequest.
    let request_bytes = prost::encoding::message::encoded_len(1, &snapshot);
    let max = broker.limits().max_request_bytes;
    if request_bytes > max {
        return Err(ApiError::SnapshotTooLarge {
            session_id: req.session_id,
            snapshot_bytes,
            request_bytes,
            max,
        }
        .into());
    }
    info!(
        session_id = %req.session_id,
        revision = exported.record.revision,
        live_spans = exported.record.live_spans,
        archived_spans = exported.archived_spans,
        bytes = snapshot_bytes,
        "session exported"
    );
    Ok(pb::ExportSessionResponse {
        snapshot: Some(snapshot),
        session: Some(session_to_pb(&exported.record)),
        archived_spans: exported.archived_spans,
        idempotency_keys: exported.idempotency_keys,
        snapshot_bytes: snapshot_bytes as u64,
    })
}

/// Imports a snapshot as a new session. Every check runs before anything
/// is written; any refusal leaves the server as it was.
pub async fn import_session(
    broker: &Broker,
    req: pb::ImportSessionRequest,
) -> Result<pb::ImportSessionResponse, Status> {
    let limits = broker.limits();
    let Some(snapshot) = req.snapshot else {
        return Err(validate::single(BadField::new(
            "snapshot",
            "is required: the snapshot ExportSession returned",
        ))
        .into());
    };
    validate::full_session_id("snapshot.session_id", &snapshot.session_id, limits)
        .map_err(validate::single)?;
    let import = SessionImport::open(
        snapshot.format_version,
        &snapshot.session_id,
        &snapshot.body,
        snapshot.checksum,
    )
    .map_err(|err| {
        validate::single(BadField::new(
            format!("snapshot.{}", err.part.name()),
            err.detail,
        ))
    })?;
    fits_here(import.record(), limits)?;

    let session = Session::new(import.record().clone(), import.live_spans().to_vec());
    let archived_spans = import.archived_spans();
    let idempotency_keys = import.idempotency_keys();
    let text_bytes = import.text_bytes();
    let store = broker.store().clone();
    let record = broker
        .adopt_session(session, text_bytes, async move {
            store.import_session(import).await
        })
        .await?;
    info!(
        session_id = %record.id,
        revision = record.revision,
        live_spans = record.live_spans,
        archived_spans,
        idempotency_keys,
        "session imported"
    );
    Ok(pb::ImportSessionResponse {
        session: Some(session_to_pb(&record)),
        archived_spans,
        idempotency_keys,
    })
}

/// Refuses a session this server could not have held: a configuration
/// past its limits, or a live context above the session's own budget.
fn fits_here(record: &SessionRecord, limits: &Limits) -> Result<(), ApiError> {
    let mut bad = Vec::new();
    let field = "snapshot.body";
    validate::config(&mut record.config.clone(), limits, &mut bad);
    for f in &mut bad {
        f.description = format!(
            "the session's {} is refused by this server: {}",
            f.field, f.description
        );
        f.field = field.into();
    }
    let budget = u64::from(record.config.budget_tokens());
    if record.live_tokens > budget {
        bad.push(BadField::new(
            field,
            format!(
                "the session holds {} live tokens, above its budget of {budget}",
                record.live_tokens
            ),
        ));
    }
    validate::finish(bad)
}
