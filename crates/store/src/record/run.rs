//! A run: the rows of several live spans of one block of positions, stored
//! as one value under the block's key in the runs tree (see
//! `crate::blocks`).
//!
//! A run is `[RUN_FRAME: u8][crc32: u32 LE][entries]`, each entry the
//! span's position as a varint, its row's length as a varint and the row
//! itself, byte for byte the value a single span's row would be under its
//! own key (framed and checksummed against that key). The run's checksum
//! covers the block's key, the frame byte and every entry, so a damaged
//! length or position is caught before any row is read; each row's own
//! checksum is then checked as it is decoded. A single row starts with
//! [`FORMAT_VERSION`](super::FORMAT_VERSION), never with [`RUN_FRAME`].

use std::ops::Range;

use prost::encoding::{decode_varint, encode_varint};

use super::{HEADER, checksum, corrupt};
use crate::error::StoreError;
use crate::keys::{self, TreeId};

/// The first byte of a run.
pub(crate) const RUN_FRAME: u8 = b'R';

/// Frames rows, given with their positions in increasing order, as the run
/// stored under `key` (the block's key).
pub(crate) fn encode_run<'a>(
    key: &[u8],
    rows: impl IntoIterator<Item = (u64, &'a [u8])>,
) -> Vec<u8> {
    let mut out = vec![RUN_FRAME, 0, 0, 0, 0];
    for (position, row) in rows {
        encode_varint(position, &mut out);
        encode_varint(row.len() as u64, &mut out);
        out.extend_from_slice(row);
    }
    let crc = checksum(key, RUN_FRAME, &out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The entries of the run stored at `key`: each row's position and where
/// its bytes lie in `value`. Positions increase and stay within the block
/// whose first position the key names, `block` positions long.
pub(crate) fn open_run(
    key: &[u8],
    value: &[u8],
    block: u64,
) -> Result<Vec<(u64, Range<usize>)>, StoreError> {
    let damaged = |detail: String| corrupt(TreeId::Runs, key, detail);
    if value.len() < HEADER || value[0] != RUN_FRAME {
        return Err(damaged("not a run of span rows".into()));
    }
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&value[1..HEADER]);
    let stored = u32::from_le_bytes(crc);
    let actual = checksum(key, RUN_FRAME, &value[HEADER..]);
    if stored != actual {
        return Err(damaged(format!(
            "run checksum mismatch: stored {stored:08x}, computed {actual:08x}"
        )));
    }
    let Some((_, start)) = keys::parse_session_number_key(key) else {
        return Err(damaged("a run under a key that names no position".into()));
    };
    let end = start.saturating_add(block);
    let mut entries = Vec::new();
    let mut rest = &value[HEADER..];
    let mut previous: Option<u64> = None;
    while !rest.is_empty() {
        let position = decode_varint(&mut rest).map_err(|e| damaged(format!("run entry: {e}")))?;
        let len = decode_varint(&mut rest).map_err(|e| damaged(format!("run entry: {e}")))?;
        if position < start || position >= end || previous.is_some_and(|p| p >= position) {
            return Err(damaged(format!(
                "run entry at position {position} is out of order or outside positions {start}..{end}"
            )));
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= rest.len())
            .ok_or_else(|| damaged(format!("run entry of {len} bytes overruns the run")))?;
        let at = value.len() - rest.len();
        entries.push((position, at..at + len));
        rest = &rest[len..];
        previous = Some(position);
    }
    if entries.is_empty() {
        return Err(damaged("an empty run".into()));
    }
    Ok(entries)
}
