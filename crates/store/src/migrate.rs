//! Bringing a store written by an earlier build to this build's format,
//! one format at a time, each step recording the format it reaches.
//!
//! Format 1 kept each span's term vector for search in a tree of its own,
//! `terms`, keyed by session ‖ span id: a second engine key for every span
//! stored. Format 2 keeps the vector in the span's own row, live or
//! archived. Opening a format-1 store moves every vector into its span's
//! row, drops the old tree and only then records format 2, so a migration
//! cut short by a crash runs again from the start at the next open: rows
//! already carrying a vector are left as they are.
//!
//! Format 3 lets a batch of appends carry its commit epoch in the last
//! session record it writes instead of a key of its own in the meta tree.
//! A format-2 store needs nothing moved (its epoch is in the meta tree,
//! which format 3 still reads); recording format 3 keeps builds that read
//! the epoch only from the meta tree from taking the store for one that
//! lost writes.
//!
//! Format 4 packs the live spans of a session's older blocks of positions
//! into one value per block (see `crate::blocks`). Opening a format-3
//! store records format 4 first, with a mark that the packing is pending
//! (a format-3 build would take a run for a damaged row, so from then on
//! it must refuse the store), then packs every block due, session by
//! session, each session's blocks in one transaction (the writer's own
//! packing: `writer::pack_session`), and removes the mark. A conversion
//! cut short is finished at the next open, leaving packed blocks as they
//! are. Rows are moved byte for byte, so a damaged row stays damaged, and
//! is reported where it is read, as before.

use std::collections::HashMap;
use std::path::Path;

use ctxbroker_core::SpanId;

use crate::error::StoreError;
use crate::keys;
use crate::record;
use crate::writer::Trees;
use crate::writer::blobs::BlobSync;

/// The format this build writes: term vectors in the spans' rows, commit
/// epochs in the meta tree or in session records, older blocks of live
/// spans packed.
pub(crate) const STORE_FORMAT: u32 = 4;

/// The format that kept term vectors in [`OLD_TERMS_TREE`].
pub(crate) const SEPARATE_TERMS_FORMAT: u32 = 1;

/// The format that kept term vectors in the spans' rows and every commit
/// epoch in the meta tree.
pub(crate) const META_EPOCH_FORMAT: u32 = 2;

/// The format that kept a row per live span, each under its own key.
pub(crate) const ROW_PER_SPAN_FORMAT: u32 = 3;

/// Brings a store of format `from` (checked: not newer than
/// [`STORE_FORMAT`]) to this build's format.
pub(crate) fn upgrade(
    trees: &Trees,
    dir: &Path,
    from: u32,
    blobs: &mut BlobSync,
) -> Result<(), StoreError> {
    if from == SEPARATE_TERMS_FORMAT {
        pack_term_vectors(trees, dir, blobs)?;
    }
    let converting = from <= ROW_PER_SPAN_FORMAT;
    let packing = converting
        || trees
            .meta
            .contains_key(keys::META_PACKING)
            .map_err(StoreError::engine)?;
    if packing {
        // Before anything is recorded, so that a refusal changes nothing.
        ensure_room(dir)?;
    }
    if converting {
        trees
            .meta
            .insert(keys::META_PACKING, &[][..])
            .map_err(StoreError::engine)?;
        record_format(trees, STORE_FORMAT, blobs)?;
        tracing::info!("recorded store format {STORE_FORMAT} (was {from})");
    }
    if packing {
        pack_blocks(trees, blobs)?;
        trees
            .meta
            .remove(keys::META_PACKING)
            .map_err(StoreError::engine)?;
        blobs.flush(&trees.db)?;
    }
    Ok(())
}

/// Packs every block due of every session (see `crate::blocks`), one
/// transaction per session, flushed. Returns how many blocks it packed.
fn pack_blocks(trees: &Trees, blobs: &mut BlobSync) -> Result<u64, StoreError> {
    let started = std::time::Instant::now();
    let (mut packed, mut sessions) = (0u64, 0u64);
    for entry in trees.sessions.iter() {
        let (key, value) = entry.map_err(StoreError::engine)?;
        // A damaged record is reported where it is read; its spans stay
        // as they are.
        let Ok(session) = record::decode_session(&key, &value) else {
            continue;
        };
        let blocks = crate::writer::pack_session(trees, &session.id, session.next_span_id)?;
        if blocks > 0 {
            packed += blocks;
            sessions += 1;
        }
    }
    blobs.flush(&trees.db)?;
    if packed > 0 {
        tracing::info!(
            sessions,
            blocks = packed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "packed the older blocks of live spans of a format {ROW_PER_SPAN_FORMAT} store (format {STORE_FORMAT})"
        );
    }
    Ok(packed)
}

/// Records `format` in the meta tree, flushed.
fn record_format(trees: &Trees, format: u32, blobs: &mut BlobSync) -> Result<(), StoreError> {
    trees
        .meta
        .insert(
            keys::META_FORMAT,
            &record::encode_format_version(format)[..],
        )
        .map_err(StoreError::engine)?;
    blobs.flush(&trees.db)?;
    Ok(())
}

/// Format 1's tree of term vectors.
pub(crate) const OLD_TERMS_TREE: &str = "terms";

/// Rows rewritten per engine batch.
const BATCH_ROWS: usize = 1024;

/// Moves every term vector of [`OLD_TERMS_TREE`] into its span's row (deriving
/// it from the text where the old row is missing or damaged: it was
/// derived data), drops the old tree and records [`META_EPOCH_FORMAT`].
/// Returns how many rows it rewrote. A damaged span row is left as it is,
/// to be reported where it is read, as before.
fn pack_term_vectors(trees: &Trees, dir: &Path, blobs: &mut BlobSync) -> Result<u64, StoreError> {
    ensure_room(dir)?;
    let started = std::time::Instant::now();
    let old_terms = trees
        .db
        .open_tree(OLD_TERMS_TREE)
        .map_err(StoreError::engine)?;
    let mut rewritten = 0u64;
    let mut sessions = 0u64;
    for entry in trees.sessions.iter().keys() {
        let key = entry.map_err(StoreError::engine)?;
        let Ok(session) = std::str::from_utf8(&key) else {
            continue;
        };
        if keys::check_session_id(session).is_err() {
            continue;
        }
        let prefix = keys::session_prefix(session);
        let mut vectors: HashMap<SpanId, Vec<u8>> = HashMap::new();
        for entry in old_terms.scan_prefix(&prefix) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            let id = keys::parse_session_number_key(&key).map(|(_, id)| id);
            if let (Some(id), Some(packed)) = (id, record::old_term_row(&key, &value)) {
                vectors.insert(id, packed);
            }
        }
        for (tree, rows) in trees.span_rows() {
            let mut batch = sled::Batch::default();
            let mut held = 0;
            for entry in rows.scan_prefix(&prefix) {
                let (key, value) = entry.map_err(StoreError::engine)?;
                match record::with_terms(tree, &key, &value, |id| vectors.remove(&id)) {
                    Ok(Some(packed)) => {
                        batch.insert(key.to_vec(), packed);
                        held += 1;
                    }
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(%err, "left a damaged row as it is while migrating");
                    }
                }
                if held == BATCH_ROWS {
                    rows.apply_batch(std::mem::take(&mut batch))
                        .map_err(StoreError::engine)?;
                    rewritten += held as u64;
                    held = 0;
                }
            }
            rows.apply_batch(batch).map_err(StoreError::engine)?;
            rewritten += held as u64;
        }
        sessions += 1;
    }
    blobs.flush(&trees.db)?;
    trees
        .db
        .drop_tree(OLD_TERMS_TREE)
        .map_err(StoreError::engine)?;
    record_format(trees, META_EPOCH_FORMAT, blobs)?;
    tracing::info!(
        sessions,
        rows = rewritten,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "moved the term vectors of a format {SEPARATE_TERMS_FORMAT} store into its spans' rows (format {META_EPOCH_FORMAT})"
    );
    Ok(rewritten)
}

/// Refuses a conversion the file system of `dir` has no room for (see
/// [`check_room`]).
fn ensure_room(dir: &Path) -> Result<(), StoreError> {
    let io = |what: &str, err: std::io::Error| {
        StoreError::Io(format!("{what} {}: {err}", dir.display()))
    };
    let needed = files_bytes(dir).map_err(|e| io("measuring", e))?;
    let available = fs2::available_space(dir).map_err(|e| io("reading the free space of", e))?;
    check_room(dir, needed, available)
}

/// The bytes of the regular files under `dir`, subdirectories included.
fn files_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += files_bytes(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Refuses a conversion the file system has no room for. It rewrites
/// every span's row, and the engine appends the new rows before it can
/// reuse the old ones' space (measured: the engine's files grow by about
/// three fifths), so it asks for as much free space as the store takes
/// now. Refused, nothing has changed and the next start tries again.
fn check_room(dir: &Path, needed: u64, available: u64) -> Result<(), StoreError> {
    if available >= needed {
        return Ok(());
    }
    const MIB: u64 = 1 << 20;
    Err(StoreError::Io(format!(
        "converting the store in {} to format {STORE_FORMAT} rewrites every span and needs about {} MiB free on its file system (the store's size); {} MiB are available. Nothing was changed: free space, then start again",
        dir.display(),
        needed.div_ceil(MIB),
        available / MIB,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_needs_room_for_a_second_copy() {
        let dir = Path::new("/data/ctxbroker");
        assert!(check_room(dir, 10 << 20, 10 << 20).is_ok());
        let refused = check_room(dir, 3 << 30, 1 << 30).unwrap_err().to_string();
        assert!(refused.contains("/data/ctxbroker"), "{refused}");
        assert!(refused.contains("about 3072 MiB free"), "{refused}");
        assert!(refused.contains("1024 MiB are available"), "{refused}");
        assert!(refused.contains("Nothing was changed"), "{refused}");
    }

    #[test]
    fn the_store_is_measured_with_its_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 100]).unwrap();
        std::fs::create_dir(dir.path().join("blobs")).unwrap();
        std::fs::write(dir.path().join("blobs").join("b"), [0u8; 23]).unwrap();
        assert_eq!(files_bytes(dir.path()).unwrap(), 123);
    }
}
