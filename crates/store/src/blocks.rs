//! A session's live spans packed by block of positions.
//!
//! Positions fall in blocks of [`BLOCK_SPANS`]. A block stands either as
//! one row per live span in the spans tree, each under its own key
//! (session ‖ position), or packed: every live span of the block in one
//! run (`record::encode_run`) in the runs tree, under the key of the
//! block's first position, and none of its spans in the spans tree. The
//! engine keeps an entry in memory for every page of at most 16 keys it
//! stores, for as long as it runs, so a key per span made its index grow
//! with every span stored; packed blocks hold 16 spans a key.
//!
//! The writer packs a block once the session's `next_span_id` is a whole
//! block past its end (so the block being appended to and the one before
//! it stay a row per span, and an append writes only new keys), in the
//! write that moves `next_span_id` there, unless a row of the block is
//! larger than [`MAX_PACKED_ROW_BYTES`]. A rewrite, eviction or summary
//! that lands in a packed block rewrites its run. Runs have a tree of
//! their own so that removing a packed block's rows, which empties pages
//! of the spans tree, never merges those pages into pages of runs: the
//! engine rewrites a page whole when it merges, and a page of runs can be
//! large enough to be written to a file of its own. Readers take both
//! shapes: a run's rows are byte for byte the rows its spans would have
//! under their own keys, and are read as such.

use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::record;

/// Positions per block.
pub(crate) const BLOCK_SPANS: u64 = 16;

/// The largest row a packed block holds: a block with a larger one (a long
/// tool output, say) keeps a row per span. Such a row is worth its own key,
/// and runs this size keep a page of 16 runs within the 128 KiB past which
/// the engine writes a page to a file of its own, rewritten whole at every
/// consolidation.
pub(crate) const MAX_PACKED_ROW_BYTES: usize = 8 * 1024;

/// The first position of the block that holds `position`.
pub(crate) fn block_start(position: u64) -> u64 {
    position - position % BLOCK_SPANS
}

/// The blocks (by index: block `b` holds positions `b × BLOCK_SPANS` on)
/// that a write moving a session's `next_span_id` from `from` to `to`
/// makes due for packing: block `b` is due once `next_span_id` reaches
/// `(b + 2) × BLOCK_SPANS`.
pub(crate) fn blocks_due(from: u64, to: u64) -> std::ops::Range<u64> {
    let due = |next: u64| (next / BLOCK_SPANS).saturating_sub(1);
    due(from)..due(to.max(from))
}

/// The first and last keys of a session's block `block`.
pub(crate) fn block_keys(session: &str, block: u64) -> (Vec<u8>, Vec<u8>) {
    let start = block.saturating_mul(BLOCK_SPANS);
    (
        keys::session_number_key(session, start),
        keys::session_number_key(session, start.saturating_add(BLOCK_SPANS - 1)),
    )
}

/// Calls `f` with each row of the run stored at `key` in the runs tree,
/// under the key the row would have on its own in the spans tree.
pub(crate) fn for_each_run_row(
    key: &[u8],
    run: &[u8],
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut row_key = key.to_vec();
    for (position, range) in record::open_run(key, run, BLOCK_SPANS)? {
        set_position(&mut row_key, position);
        f(&row_key, &run[range])?;
    }
    Ok(())
}

/// Calls `f` with each span row a value of `tree` holds, with the tree
/// the row belongs to: a run's rows are the spans tree's; any other value
/// is one row of its own tree.
pub(crate) fn rows_of(
    tree: TreeId,
    key: &[u8],
    value: &[u8],
    mut f: impl FnMut(TreeId, &[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    match tree {
        TreeId::Runs => for_each_run_row(key, value, |key, row| f(TreeId::Spans, key, row)),
        _ => f(tree, key, value),
    }
}

/// Calls `f` with the key and row of each of a session's live spans in
/// position order, given the session's entries in the spans tree
/// (`singles`) and in the runs tree (`runs`), each in key order. No
/// single row stands inside a packed block, so a run goes whole before
/// the first single row past its first position.
pub(crate) fn in_position_order<K, V>(
    singles: impl IntoIterator<Item = Result<(K, V), StoreError>>,
    runs: impl IntoIterator<Item = Result<(K, V), StoreError>>,
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError>
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut runs = runs.into_iter().peekable();
    for single in singles {
        let (key, row) = single?;
        let key = key.as_ref();
        while let Some(run) =
            runs.next_if(|run| run.as_ref().map_or(true, |(at, _)| at.as_ref() < key))
        {
            let (at, run) = run?;
            for_each_run_row(at.as_ref(), run.as_ref(), &mut f)?;
        }
        f(key, row.as_ref())?;
    }
    for run in runs {
        let (at, run) = run?;
        for_each_run_row(at.as_ref(), run.as_ref(), &mut f)?;
    }
    Ok(())
}

/// A sled walk's entries with the store's error.
pub(crate) fn entries(
    walk: sled::Iter,
) -> impl Iterator<Item = Result<(sled::IVec, sled::IVec), StoreError>> {
    walk.map(|entry| entry.map_err(StoreError::engine))
}

/// The rows of a run stored at `key`, by position, copied out.
pub(crate) fn run_rows(key: &[u8], run: &[u8]) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    Ok(record::open_run(key, run, BLOCK_SPANS)?
        .into_iter()
        .map(|(position, range)| (position, run[range].to_vec()))
        .collect())
}

/// How many live spans a run holds.
pub(crate) fn rows_in_run(key: &[u8], run: &[u8]) -> Result<u64, StoreError> {
    Ok(record::open_run(key, run, BLOCK_SPANS)?.len() as u64)
}

/// The row of a session's live span at `position`, read through `get` (a
/// look-up by tree and key): under the position's own key in the spans
/// tree, else in the run of its block.
pub(crate) fn row_at(
    session: &str,
    position: u64,
    mut get: impl FnMut(TreeId, &[u8]) -> Result<Option<Vec<u8>>, StoreError>,
) -> Result<Option<Vec<u8>>, StoreError> {
    let key = keys::session_number_key(session, position);
    if let Some(row) = get(TreeId::Spans, &key)? {
        return Ok(Some(row));
    }
    let block_key = keys::session_number_key(session, block_start(position));
    let Some(run) = get(TreeId::Runs, &block_key)? else {
        return Ok(None);
    };
    Ok(record::open_run(&block_key, &run, BLOCK_SPANS)?
        .into_iter()
        .find(|(at, _)| *at == position)
        .map(|(_, range)| run[range].to_vec()))
}

/// The run packing a block's rows, given each under its own key in key
/// order, under the block's first key `first`; `None` when that gains
/// nothing (fewer than two rows) or a row is larger than
/// [`MAX_PACKED_ROW_BYTES`].
pub(crate) fn pack<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    first: &[u8],
    rows: &[(K, V)],
) -> Result<Option<Vec<u8>>, StoreError> {
    if rows.len() < 2
        || rows
            .iter()
            .any(|(_, row)| row.as_ref().len() > MAX_PACKED_ROW_BYTES)
    {
        return Ok(None);
    }
    let mut positions = Vec::with_capacity(rows.len());
    for (key, _) in rows {
        let key = key.as_ref();
        match keys::parse_session_number_key(key) {
            Some((_, position)) => positions.push(position),
            None => {
                return Err(record::corrupt(
                    TreeId::Spans,
                    key,
                    "a span key names no position",
                ));
            }
        }
    }
    let rows = positions
        .into_iter()
        .zip(rows.iter().map(|(_, row)| row.as_ref()));
    Ok(Some(record::encode_run(first, rows)))
}

/// Replaces the position at the end of a session-number key.
fn set_position(key: &mut [u8], position: u64) {
    let at = key.len().saturating_sub(8);
    key[at..].copy_from_slice(&position.to_be_bytes());
}

#[cfg(test)]
mod tests;
