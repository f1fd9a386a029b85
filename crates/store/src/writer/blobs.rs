//! Making the engine's blob files durable before its log is flushed.
//!
//! sled 0.34.7 writes a message too large for its log (more than a
//! quarter of a 512 KiB segment) to a file of its own under `blobs/`,
//! named by the message's log sequence number, and leaves a pointer to it
//! in the log. Its flush syncs the log and never those files, so without
//! this a flushed, acknowledged write could point at a file that a power
//! failure or an operating-system crash takes away (a `kill -9` does not:
//! the page cache survives it). Such files hold any span of more than
//! about 128 KiB, and any tree node that large, small spans and all.
//!
//! Before each flush the flusher lists the directory and syncs every file
//! newer than the files it had already seen twice (so a file that was
//! still being written when it was first listed is synced again once the
//! writer has finished the batch that made it), then the directory, so
//! that the files' names are durable too. The engine writes a blob in the
//! thread that inserts, before its log record exists, so by the time the
//! flush makes that record durable the file it names is. When the store
//! opens, every blob file already there is synced once: a crashed process
//! can leave their pages waiting in the page cache.
//!
//! Most flushes follow writes that made no blob, so the listing is
//! skipped when the directory's modification time is the one of the last
//! listing and that time was already [`SETTLED`] old when it was listed:
//! a file created since would have moved it, even on a file system whose
//! clock for these times is coarse.

use std::fs::File;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::error::StoreError;

/// How much older than a listing the directory's modification time must
/// be for that time to prove that nothing was created since.
const SETTLED: Duration = Duration::from_millis(100);

/// The blob files synced so far; see the module's documentation.
#[derive(Debug)]
pub(crate) struct BlobSync {
    dir: PathBuf,
    /// Files named at or below this were synced after the batch that
    /// wrote them was applied.
    floor: u64,
    /// The newest file name seen at the last listing.
    seen: u64,
    /// The directory's modification time at the last listing, and when
    /// that listing began.
    listed: Option<(SystemTime, SystemTime)>,
    /// Listings made (a count for tests and diagnostics).
    pub(crate) listings: u64,
}

impl BlobSync {
    /// For the engine whose files are in `engine_dir`.
    pub(crate) fn new(engine_dir: PathBuf) -> BlobSync {
        BlobSync {
            dir: engine_dir.join("blobs"),
            floor: 0,
            seen: 0,
            listed: None,
            listings: 0,
        }
    }

    /// For the engine whose files are in `engine_dir`, opened and not yet
    /// written to: syncs every blob file there once (after a crash of the
    /// process their pages may still be waiting in the page cache), so
    /// that later listings start above them. Nothing else writes blob
    /// files yet, so none of them is synced twice.
    pub(crate) fn open(engine_dir: PathBuf) -> std::io::Result<BlobSync> {
        let mut blobs = BlobSync::new(engine_dir);
        blobs.sync_new()?;
        blobs.floor = blobs.seen;
        Ok(blobs)
    }

    /// Syncs the new blob files, then flushes the engine: after it, every
    /// log record and every file one points at is on disk. Returns how
    /// many files it synced. Every flush of a store holding data goes
    /// through here.
    pub(crate) fn flush(&mut self, db: &sled::Db) -> Result<u64, StoreError> {
        let synced = self
            .sync_new()
            .map_err(|e| StoreError::Io(format!("syncing the engine's blob files: {e}")))?;
        db.flush().map_err(StoreError::engine)?;
        Ok(synced)
    }

    /// Syncs every blob file above the floor, then the directory if any
    /// was; returns how many files it synced. A file the engine removed
    /// meanwhile (it collects blobs its log no longer needs) is skipped.
    pub(crate) fn sync_new(&mut self) -> std::io::Result<u64> {
        let modified = match std::fs::metadata(&self.dir) {
            Ok(meta) => meta.modified()?,
            // The engine creates the directory with its first blob.
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(0),
            Err(err) => return Err(err),
        };
        let unchanged = self
            .listed
            .is_some_and(|(before, listed_at)| before == modified && before + SETTLED <= listed_at);
        // A file first seen at the last listing is above the floor: it
        // is to be synced once more, so the directory is listed again.
        if unchanged && self.seen == self.floor {
            return Ok(0);
        }
        let listed_at = SystemTime::now();
        self.listings += 1;
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(0),
            Err(err) => return Err(err),
        };
        let mut newest = self.seen;
        let mut synced = 0;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(lsn) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            if lsn <= self.floor {
                continue;
            }
            match File::open(entry.path()) {
                Ok(file) => file.sync_all()?,
                Err(err) if err.kind() == ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            }
            synced += 1;
            newest = newest.max(lsn);
        }
        if synced > 0 {
            File::open(&self.dir)?.sync_all()?;
        }
        self.floor = self.seen;
        self.seen = newest;
        self.listed = Some((modified, listed_at));
        Ok(synced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_new_file_is_synced_at_two_listings_and_then_left() {
        let dir = tempfile::tempdir().unwrap();
        let mut blobs = BlobSync::new(dir.path().to_owned());
        // No directory yet: nothing to do.
        assert_eq!(blobs.sync_new().unwrap(), 0);
        let blob_dir = dir.path().join("blobs");
        std::fs::create_dir(&blob_dir).unwrap();
        std::fs::write(blob_dir.join("100"), b"a").unwrap();
        std::fs::write(blob_dir.join("200"), b"b").unwrap();
        std::fs::write(blob_dir.join("not-a-blob"), b"c").unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 2);
        // Seen once: synced again, with a file that came meanwhile.
        std::fs::write(blob_dir.join("300"), b"d").unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 3);
        // 100 and 200 are below the floor now; 300 is synced a second time.
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(blobs.sync_new().unwrap(), 0);
        // A file the engine removed is not looked for again.
        std::fs::write(blob_dir.join("400"), b"e").unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 1);
        std::fs::remove_file(blob_dir.join("400")).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0);
    }

    /// Sets the directory's modification time `ago` in the past.
    fn touch(dir: &std::path::Path, ago: Duration) {
        File::open(dir)
            .unwrap()
            .set_modified(SystemTime::now() - ago)
            .unwrap();
    }

    #[test]
    fn the_files_there_at_open_are_synced_once() {
        let dir = tempfile::tempdir().unwrap();
        let blob_dir = dir.path().join("blobs");
        std::fs::create_dir(&blob_dir).unwrap();
        std::fs::write(blob_dir.join("100"), b"a").unwrap();
        std::fs::write(blob_dir.join("200"), b"b").unwrap();
        let mut blobs = BlobSync::open(dir.path().to_owned()).unwrap();
        assert_eq!((blobs.listings, blobs.floor, blobs.seen), (1, 200, 200));
        // Listed again (the directory's time is recent) but not synced.
        assert_eq!(blobs.sync_new().unwrap(), 0);
        std::fs::write(blob_dir.join("300"), b"c").unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 1);
        // A store with no blob directory yet opens as well.
        let empty = tempfile::tempdir().unwrap();
        let mut blobs = BlobSync::open(empty.path().to_owned()).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0);
    }

    #[test]
    fn a_directory_unchanged_since_a_settled_listing_is_not_listed_again() {
        let dir = tempfile::tempdir().unwrap();
        let blob_dir = dir.path().join("blobs");
        std::fs::create_dir(&blob_dir).unwrap();
        std::fs::write(blob_dir.join("100"), b"a").unwrap();
        let mut blobs = BlobSync::new(dir.path().to_owned());
        // Modified just now: listed every time, as a file created within
        // the clock's resolution would not move the time.
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(blobs.sync_new().unwrap(), 0);
        assert_eq!(blobs.listings, 3);
        // Settled: the next listing proves it, and later flushes skip it.
        touch(&blob_dir, Duration::from_secs(5));
        assert_eq!(blobs.sync_new().unwrap(), 0);
        assert_eq!(blobs.listings, 4);
        assert_eq!(blobs.sync_new().unwrap(), 0);
        assert_eq!(blobs.listings, 4);
        // A new file moves the time: listed and synced, then once more.
        std::fs::write(blob_dir.join("200"), b"b").unwrap();
        touch(&blob_dir, Duration::from_secs(1));
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(blobs.listings, 6);
        assert_eq!(blobs.sync_new().unwrap(), 0);
        assert_eq!(blobs.listings, 6);
    }
}
