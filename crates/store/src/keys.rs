//! Keyspaces and key encodings.
//!
//! Keys that belong to a session start with the session's id, prefixed by
//! its length in one byte, so that a prefix scan over "a" can never see the
//! keys of "ab". Numbers are big-endian so that byte order is numeric
//! order: a scan of a session's spans comes out in prompt order, a scan of
//! the marker log in seq order.

use crate::error::StoreError;

/// The longest session id, in bytes (it must fit the one-byte prefix).
/// The server's ids are at most 128 bytes; a tenant's session is keyed by
/// its full id, `tenant/session`, which adds up to 65 bytes.
pub(crate) const MAX_SESSION_ID_BYTES: usize = 255;

/// The meta key holding the format version.
pub(crate) const META_FORMAT: &[u8] = b"format_version";
/// The meta key holding the marker log's bounds.
pub(crate) const META_MARKER_LOG: &[u8] = b"marker_log";
/// The meta key holding the commit epoch: one more per applied batch.
pub(crate) const META_COMMIT_EPOCH: &[u8] = b"commit_epoch";
/// The meta key present while a conversion to packed blocks is unfinished.
pub(crate) const META_PACKING: &[u8] = b"packing_pending";

/// The keyspaces, one sled tree each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TreeId {
    /// Session id → session record.
    Sessions,
    /// Session ‖ position → live span.
    Spans,
    /// Session ‖ first position of a packed block → the run of its live
    /// spans (see `crate::blocks`).
    Runs,
    /// Session ‖ span id → predicate of a live constraint.
    Pins,
    /// Session ‖ span id → evicted span and the marker that evicted it.
    Archive,
    /// Global seq → marker.
    Markers,
    /// Format version and marker log bounds.
    Meta,
    /// Session ‖ caller's idempotency key → the span admitted with it.
    Keys,
}

impl TreeId {
    /// Every tree, in the order the writer's transaction takes them.
    pub(crate) const ALL: [TreeId; 8] = [
        TreeId::Sessions,
        TreeId::Spans,
        TreeId::Runs,
        TreeId::Pins,
        TreeId::Archive,
        TreeId::Markers,
        TreeId::Meta,
        TreeId::Keys,
    ];

    /// The trees keyed by session prefix: what a session owns besides its
    /// record.
    pub(crate) const PER_SESSION: [TreeId; 5] = [
        TreeId::Spans,
        TreeId::Runs,
        TreeId::Pins,
        TreeId::Archive,
        TreeId::Keys,
    ];

    /// The tree's name on disk and in errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TreeId::Sessions => "sessions",
            TreeId::Spans => "spans",
            TreeId::Runs => "runs",
            TreeId::Pins => "pins",
            TreeId::Archive => "archive",
            TreeId::Markers => "markers",
            TreeId::Meta => "meta",
            TreeId::Keys => "keys",
        }
    }
}

/// Refuses ids the key encoding cannot hold.
pub(crate) fn check_session_id(id: &str) -> Result<(), StoreError> {
    if id.is_empty() || id.len() > MAX_SESSION_ID_BYTES {
        return Err(StoreError::InvalidSessionId { len: id.len() });
    }
    Ok(())
}

/// The key of a session record: the bare id, so that the sessions tree
/// iterates in id order.
pub(crate) fn session_key(id: &str) -> Vec<u8> {
    id.as_bytes().to_vec()
}

/// The prefix shared by every key of a session in the spans, pins and
/// archive trees. The id must have passed [`check_session_id`].
pub(crate) fn session_prefix(id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + id.len() + 8);
    // check_session_id bounds the length to 255, so it fits one byte.
    key.push(id.len().min(MAX_SESSION_ID_BYTES) as u8);
    key.extend_from_slice(id.as_bytes());
    key
}

/// A session prefix followed by a big-endian number: a span's position in
/// the spans tree, a span id in the pins and archive trees.
pub(crate) fn session_number_key(id: &str, number: u64) -> Vec<u8> {
    let mut key = session_prefix(id);
    key.extend_from_slice(&number.to_be_bytes());
    key
}

/// The keys of a session's numbered records (spans tree: positions;
/// archive and terms: span ids) from `first` on.
pub(crate) fn session_numbers_from(id: &str, first: u64) -> std::ops::RangeInclusive<Vec<u8>> {
    session_number_key(id, first)..=session_number_key(id, u64::MAX)
}

/// A session prefix followed by a caller's idempotency key.
pub(crate) fn session_text_key(id: &str, text: &str) -> Vec<u8> {
    let mut key = session_prefix(id);
    key.extend_from_slice(text.as_bytes());
    key
}

/// Splits a session-prefixed key into the session id and the text after
/// it.
fn parse_session_text_key(key: &[u8]) -> Option<(String, String)> {
    let (&len, rest) = key.split_first()?;
    let len = usize::from(len);
    if rest.len() < len {
        return None;
    }
    let id = std::str::from_utf8(&rest[..len]).ok()?;
    let text = std::str::from_utf8(&rest[len..]).ok()?;
    Some((id.to_owned(), text.to_owned()))
}

/// The key of a marker.
pub(crate) fn marker_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Reads a marker key back.
pub(crate) fn parse_marker_key(key: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// Splits a session-prefixed key into the session id and the number after
/// it, when it has that shape.
pub(crate) fn parse_session_number_key(key: &[u8]) -> Option<(String, u64)> {
    let (&len, rest) = key.split_first()?;
    let len = usize::from(len);
    if rest.len() != len + 8 {
        return None;
    }
    let id = std::str::from_utf8(&rest[..len]).ok()?;
    let bytes: [u8; 8] = rest[len..].try_into().ok()?;
    Some((id.to_owned(), u64::from_be_bytes(bytes)))
}

/// The session a key belongs to, when it names one.
pub(crate) fn session_of(tree: TreeId, key: &[u8]) -> Option<String> {
    match tree {
        TreeId::Sessions => std::str::from_utf8(key).ok().map(str::to_owned),
        TreeId::Spans | TreeId::Runs | TreeId::Pins | TreeId::Archive => {
            parse_session_number_key(key).map(|(id, _)| id)
        }
        TreeId::Keys => parse_session_text_key(key).map(|(id, _)| id),
        TreeId::Markers | TreeId::Meta => None,
    }
}

/// A key as an operator can read it: `"ab"/position 17`, `seq 42`.
pub(crate) fn render(tree: TreeId, key: &[u8]) -> String {
    let raw = || format!("0x{}", hex(key));
    match tree {
        TreeId::Sessions => match std::str::from_utf8(key) {
            Ok(id) => format!("{id:?}"),
            Err(_) => raw(),
        },
        TreeId::Spans | TreeId::Runs | TreeId::Pins | TreeId::Archive => {
            match parse_session_number_key(key) {
                Some((id, n)) => {
                    let what = match tree {
                        TreeId::Spans => "position",
                        TreeId::Runs => "block from position",
                        _ => "span",
                    };
                    format!("{id:?}/{what} {n}")
                }
                None => raw(),
            }
        }
        TreeId::Markers => match parse_marker_key(key) {
            Some(seq) => format!("seq {seq}"),
            None => raw(),
        },
        TreeId::Meta => match std::str::from_utf8(key) {
            Ok(name) => format!("{name:?}"),
            Err(_) => raw(),
        },
        TreeId::Keys => match parse_session_text_key(key) {
            Some((id, text)) => format!("{id:?}/key {text:?}"),
            None => raw(),
        },
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_of_different_sessions_never_nest() {
        let a = session_number_key("a", u64::from(b'b'));
        let ab = session_prefix("ab");
        assert!(!a.starts_with(&ab));
        assert!(!session_number_key("ab", 0).starts_with(&session_prefix("a")));
    }

    #[test]
    fn numbers_sort_numerically() {
        assert!(session_number_key("s", 255) < session_number_key("s", 256));
        assert!(marker_key(9) < marker_key(10));
    }

    #[test]
    fn keys_render_readably() {
        let key = session_number_key("sess-1", 17);
        assert_eq!(render(TreeId::Spans, &key), "\"sess-1\"/position 17");
        assert_eq!(render(TreeId::Archive, &key), "\"sess-1\"/span 17");
        assert_eq!(render(TreeId::Markers, &marker_key(42)), "seq 42");
        assert_eq!(render(TreeId::Spans, &[1, 2]), "0x0102");
        assert_eq!(session_of(TreeId::Pins, &key).as_deref(), Some("sess-1"));
    }

    #[test]
    fn session_ids_are_bounded() {
        assert!(check_session_id("").is_err());
        assert!(check_session_id(&"x".repeat(255)).is_ok());
        assert!(check_session_id(&"x".repeat(256)).is_err());
    }
}
