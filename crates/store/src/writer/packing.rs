//! The writer's view of a session's live spans by position, whichever
//! shape their block has (see `crate::blocks`), and the packing of a
//! block into one run.

use crate::blocks;
use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::record;

use super::stage::Stage;
use super::{Entry, Trees, transact};

/// A packed block as the writer reads it: the run's key and its rows by
/// position.
type PackedBlock = (Vec<u8>, Vec<(u64, Vec<u8>)>);

impl Stage<'_> {
    /// The row of a session's live span at `position`, staged or stored.
    pub(super) fn span_row(
        &self,
        session: &str,
        position: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        blocks::row_at(session, position, |tree, key| self.get(tree, key))
    }

    /// The run of the block of `position`, when the block is packed: the
    /// run's key and rows.
    fn packed_block(
        &self,
        session: &str,
        position: u64,
    ) -> Result<Option<PackedBlock>, StoreError> {
        let key = keys::session_number_key(session, blocks::block_start(position));
        match self.get(TreeId::Runs, &key)? {
            Some(run) => {
                let rows = blocks::run_rows(&key, &run)?;
                Ok(Some((key, rows)))
            }
            None => Ok(None),
        }
    }

    /// Stages `row` as the live span at `position` (replacing any there):
    /// in its block's run when the block is packed, under its own key
    /// otherwise. For a position at or past the session's stored
    /// `next_span_id`, whose block is never packed, `put` it directly.
    pub(super) fn put_span_row(
        &mut self,
        session: &str,
        position: u64,
        row: Vec<u8>,
    ) -> Result<(), StoreError> {
        let Some((key, mut rows)) = self.packed_block(session, position)? else {
            self.put(
                TreeId::Spans,
                keys::session_number_key(session, position),
                row,
            );
            return Ok(());
        };
        match rows.binary_search_by_key(&position, |(at, _)| *at) {
            Ok(at) => rows[at].1 = row,
            Err(at) => rows.insert(at, (position, row)),
        }
        self.put_run(key, &rows);
        Ok(())
    }

    /// Stages the removal of the live span at `position`: from its
    /// block's run when the block is packed (the run goes with its last
    /// span), else its own key.
    pub(super) fn del_span_row(&mut self, session: &str, position: u64) -> Result<(), StoreError> {
        let Some((key, mut rows)) = self.packed_block(session, position)? else {
            self.del(TreeId::Spans, keys::session_number_key(session, position));
            return Ok(());
        };
        rows.retain(|(at, _)| *at != position);
        if rows.is_empty() {
            self.del(TreeId::Runs, key);
        } else {
            self.put_run(key, &rows);
        }
        Ok(())
    }

    fn put_run(&mut self, key: Vec<u8>, rows: &[(u64, Vec<u8>)]) {
        let run = record::encode_run(&key, rows.iter().map(|(at, row)| (*at, row.as_slice())));
        self.put(TreeId::Runs, key, run);
    }

    /// Every live span row of a session, in position order, each under the
    /// key it would have on its own.
    pub(super) fn live_span_rows(&self, session: &str) -> Result<Vec<Entry>, StoreError> {
        let prefix = keys::session_prefix(session);
        let singles = self.scan(TreeId::Spans, &prefix)?;
        let runs = self.scan(TreeId::Runs, &prefix)?;
        let mut rows = Vec::new();
        blocks::in_position_order(
            singles.into_iter().map(Ok),
            runs.into_iter().map(Ok),
            |key, row| {
                rows.push((key.to_vec(), row.to_vec()));
                Ok(())
            },
        )?;
        Ok(rows)
    }

    /// Packs every block due of `session` whose `next_span_id` is `next`
    /// (a session written whole: imported, or converted from a row per
    /// span); a block already packed is left as it is.
    pub(crate) fn pack_due(&mut self, session: &str, next: u64) -> Result<(), StoreError> {
        for block in blocks::blocks_due(0, next) {
            self.pack_block(session, block)?;
        }
        Ok(())
    }

    /// Packs the live spans of a session's block `block` into one run in
    /// the runs tree, if the block holds two or more as rows of their own
    /// (a packed block holds none).
    pub(super) fn pack_block(&mut self, session: &str, block: u64) -> Result<(), StoreError> {
        let (first, last) = blocks::block_keys(session, block);
        let rows = self.scan_range(TreeId::Spans, &first, &last)?;
        let Some(run) = blocks::pack(&first, &rows)? else {
            return Ok(());
        };
        for (key, _) in rows {
            self.del(TreeId::Spans, key);
        }
        self.put(TreeId::Runs, first, run);
        Ok(())
    }
}

/// Packs every block due of `session`, whose `next_span_id` is `next`,
/// in one transaction, with the writer's own packing: what converting a
/// store of a row per span does for each session (see `crate::migrate`).
/// A block already packed is left as it is. Returns how many blocks it
/// packed.
pub(crate) fn pack_session(trees: &Trees, session: &str, next: u64) -> Result<u64, StoreError> {
    let mut stage = Stage::new(trees);
    stage.pack_due(session, next)?;
    stage.keep();
    let writes = stage.into_writes();
    let packed = writes
        .keys()
        .filter(|(tree, _)| *tree == TreeId::Runs)
        .count();
    if packed > 0 {
        transact(trees, &writes)?;
    }
    Ok(packed as u64)
}
