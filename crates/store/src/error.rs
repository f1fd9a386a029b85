//! The crate's one error type.

/// Everything that can go wrong in the store, named for what the caller
/// asked for rather than for what the engine underneath reported.
///
/// It is `Clone` because one engine failure (a transaction or a flush that
/// fails) is reported to every write of the batch it hit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A `CreateSession` named a session that already exists.
    #[error("session {id:?} already exists")]
    SessionExists {
        /// The session id.
        id: String,
    },
    /// A write or read named a session that does not exist.
    #[error("session {id:?} not found")]
    SessionNotFound {
        /// The session id.
        id: String,
    },
    /// A write was planned against a revision of the session that is no
    /// longer the stored one: another write got there first. Nothing of
    /// the refused write was applied.
    #[error(
        "session {session:?} is at revision {actual}; the write was planned against revision {expected}"
    )]
    StaleRevision {
        /// The session id.
        session: String,
        /// The revision the write expected.
        expected: u64,
        /// The revision stored.
        actual: u64,
    },
    /// A session id is empty or longer than 255 bytes.
    #[error("session id of {len} bytes is invalid: ids are 1 to 255 bytes")]
    InvalidSessionId {
        /// Its length in bytes.
        len: usize,
    },
    /// A write does not fit the stored state (a position already taken,
    /// an evicted span that is not live, ids that disagree). It means the
    /// caller computed the write wrongly; nothing of it was applied.
    #[error("write to session {session:?} refused: {detail}")]
    InvalidWrite {
        /// The session the write was for.
        session: String,
        /// What does not fit.
        detail: String,
    },
    /// Markers from `from_seq` were requested, but retention has already
    /// removed some of them; reading on would silently skip markers.
    #[error("markers from seq {from_seq} are no longer retained; the oldest retained is {oldest}")]
    MarkersTrimmed {
        /// The first seq asked for.
        from_seq: u64,
        /// The oldest seq still retained.
        oldest: u64,
    },
    /// A stored record failed its checksum or did not decode. It is never
    /// served; the caller sees which record so an operator can act.
    #[error("corrupt record in tree {tree} at {key}: {detail}")]
    Corrupt {
        /// The keyspace: sessions, spans, pins, archive, markers or meta.
        tree: String,
        /// The key, printable.
        key: String,
        /// The session the record belongs to, when the key names one.
        session: Option<String>,
        /// What failed: checksum, version or decoding.
        detail: String,
    },
    /// The directory holds a store written by a newer build, in a format
    /// this build does not know; opening it could misread it.
    #[error(
        "store format version {found} is newer than this build supports (version {supported}); refusing to open"
    )]
    UnsupportedFormat {
        /// The version found on disk.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The file system failed (opening, reading, writing or flushing).
    /// When a flush fails, the writes of that batch may or may not
    /// survive a crash.
    #[error("storage I/O failed: {0}")]
    Io(String),
    /// The storage engine failed for a reason other than I/O.
    #[error("storage engine failed: {0}")]
    Engine(String),
    /// The store has been closed (or its writer has stopped); no more
    /// writes are accepted.
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// Translates an engine error; kept private so that no engine type
    /// appears in the crate's public API, not even in a trait impl.
    pub(crate) fn engine(err: sled::Error) -> Self {
        match err {
            sled::Error::Io(io) => StoreError::Io(io.to_string()),
            other => StoreError::Engine(other.to_string()),
        }
    }
}
