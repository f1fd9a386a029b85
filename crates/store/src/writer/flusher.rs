//! The flusher: one flush for every batch applied since the last, then
//! the marker head, the commit hook and the acknowledgements.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ctxbroker_core::Marker;

use crate::error::StoreError;
use crate::model::{CommitHook, Durability, FlushObserver, MarkerBounds, WriteAck};
use crate::record;

use super::{Ack, Shared};

/// A batch the writer applied, waiting for a flush to cover it.
pub(crate) struct Applied {
    pub(super) acks: Vec<(Ack, WriteAck)>,
    pub(super) epoch: u64,
    pub(super) markers: Vec<Marker>,
    pub(super) bounds: MarkerBounds,
}

/// The thread that makes applied batches durable and reports them: it
/// takes every batch applied so far, flushes once for all of them, moves
/// the committed marker head, calls the commit hook and acknowledges.
/// While it flushes, the writer goes on applying the next batch.
pub(crate) struct Flusher {
    pub(crate) db: sled::Db,
    pub(crate) shared: Arc<Shared>,
    pub(crate) durability: Durability,
    pub(crate) hook: Option<CommitHook>,
    /// Told how long each successful flush took.
    pub(crate) on_flush: Option<FlushObserver>,
    /// Markers applied but not yet handed to the hook, because the flush
    /// that should have covered them failed; the next successful flush
    /// covers them.
    pub(crate) unpublished: Vec<Marker>,
    /// The bounds to publish with them.
    pub(crate) bounds: Option<MarkerBounds>,
    /// Where the durable commit epoch is recorded.
    pub(crate) epoch_file: EpochFile,
    /// The epoch of the last batch handed over.
    pub(crate) epoch: u64,
    /// The engine's blob files, synced before each flush.
    pub(crate) blobs: super::blobs::BlobSync,
    /// With relaxed durability, when the blob files were last synced.
    pub(crate) blobs_synced_at: std::time::Instant,
}

/// With relaxed durability nothing waits for a flush and the engine
/// flushes its log on its own, this often; the blob files are synced at
/// most this often too, when a batch is acknowledged, so that they lag the
/// log by about as much as the log lags the acknowledgements.
const RELAXED_BLOB_SYNC: std::time::Duration = std::time::Duration::from_millis(500);

/// The commit epoch recorded outside the engine, in `commit-epoch` beside
/// its files, after every flush.
///
/// The engine recovers from a damaged log by stopping at the damage: a
/// flipped bit in the middle of its log or a truncated file comes back as
/// an older, consistent-looking store, and the writes after the damage are
/// gone without a word. This file is how that is noticed: it is written
/// only after the engine's flush returned, so it never names an epoch the
/// engine did not make durable, and it is not synced itself (a crash of
/// the process leaves it in the page cache; losing power can only make it
/// older, never newer). On open, an engine epoch below the file's means
/// acknowledged writes were lost, and the store refuses to serve.
#[derive(Debug)]
pub(crate) struct EpochFile {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl EpochFile {
    /// The file's name in the data directory.
    pub(crate) const NAME: &'static str = "commit-epoch";

    /// Opens (or creates) the file in `dir` and returns it with the epoch
    /// it holds (`None` when empty: a new store, or one written before the
    /// file existed).
    pub(crate) fn open(dir: &std::path::Path) -> Result<(EpochFile, Option<u64>), StoreError> {
        use std::io::Read;
        let path = dir.join(Self::NAME);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::Io(format!("opening {}: {e}", path.display())))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))?;
        let epoch = if bytes.is_empty() {
            None
        } else {
            Some(record::decode_epoch(&bytes).map_err(|detail| StoreError::Corrupt {
                tree: "meta".into(),
                key: format!("{:?}", path.display().to_string()),
                session: None,
                detail: format!(
                    "{detail}; the file records the last durable commit epoch (remove it to accept the store as it is)"
                ),
            })?)
        };
        Ok((EpochFile { file, path }, epoch))
    }

    /// Records `epoch`: 12 bytes written in place, in one call.
    pub(crate) fn record(&mut self, epoch: u64) -> Result<(), StoreError> {
        use std::io::{Seek, SeekFrom, Write};
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(&record::encode_epoch(epoch)))
            .map_err(|e| StoreError::Io(format!("writing {}: {e}", self.path.display())))
    }
}

impl Flusher {
    /// Runs on a thread of its own until the writer hangs up, then flushes
    /// one last time.
    pub(crate) fn run(mut self, rx: std::sync::mpsc::Receiver<Applied>) -> Result<(), StoreError> {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while let Ok(next) = rx.try_recv() {
                group.push(next);
            }
            self.commit(group);
        }
        self.finish()
    }

    /// The last flush, when the store closes: records its epoch and hands
    /// on what it covered.
    pub(super) fn finish(mut self) -> Result<(), StoreError> {
        self.shared.flushes.fetch_add(1, Ordering::Relaxed);
        self.flush()?;
        self.epoch_file.record(self.epoch)?;
        self.publish();
        Ok(())
    }

    pub(super) fn commit(&mut self, group: Vec<Applied>) {
        let mut acks = Vec::new();
        for mut applied in group {
            self.epoch = self.epoch.max(applied.epoch);
            self.unpublished.append(&mut applied.markers);
            self.bounds = Some(applied.bounds);
            acks.append(&mut applied.acks);
        }
        if self.durability == Durability::Flush {
            self.shared.flushes.fetch_add(1, Ordering::Relaxed);
            let flushed = if crate::fault("store::before_flush") {
                Err(StoreError::Io("injected fault before the flush".into()))
            } else {
                self.flush()
            };
            if let Err(err) = flushed {
                let err = StoreError::Io(format!(
                    "flush failed, so these writes may or may not survive a crash: {err}"
                ));
                for (ack, _) in acks {
                    let _ = ack.send(Err(err.clone()));
                }
                return;
            }
            // Only what the flush covered is recorded; a failure here
            // leaves the file older, which is safe.
            if let Err(err) = self.epoch_file.record(self.epoch) {
                tracing::warn!(%err, "recording the commit epoch failed");
            }
        } else if self.blob_sync_due() {
            self.blobs_synced_at = std::time::Instant::now();
            match self.blobs.sync_new() {
                Ok(synced) => {
                    self.shared.blob_syncs.fetch_add(synced, Ordering::Relaxed);
                }
                Err(err) => tracing::warn!(%err, "syncing the engine's blob files failed"),
            }
        }
        // The head moves before any acknowledgement, so a caller that has
        // its reply can read what it wrote; the markers go to the hook
        // after the replies, so that fanning them out (to every watcher)
        // does not delay the writes' acknowledgements.
        self.advance_head();
        if crate::fault("store::after_flush") {
            let err = StoreError::Io("injected fault after the flush".into());
            for (ack, _) in acks {
                let _ = ack.send(Err(err.clone()));
            }
        } else {
            for (ack, outcome) in acks {
                // The caller may have stopped waiting; the write stands.
                let _ = ack.send(Ok(outcome));
            }
        }
        self.announce();
    }

    /// With relaxed durability, whether the next batch acknowledged syncs
    /// the blob files ([`RELAXED_BLOB_SYNC`]).
    pub(super) fn blob_sync_due(&self) -> bool {
        self.blobs_synced_at.elapsed() >= RELAXED_BLOB_SYNC
    }

    /// Syncs the engine's new blob files, then flushes the engine, telling
    /// the observer how long a successful flush took.
    pub(super) fn flush(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let synced = self.blobs.flush(&self.db)?;
        self.shared.blob_syncs.fetch_add(synced, Ordering::Relaxed);
        if let Some(observe) = &self.on_flush {
            observe(started.elapsed());
        }
        Ok(())
    }

    /// Moves the committed head over the markers that became durable, then
    /// hands them to the hook. Head first: a subscriber that receives
    /// marker N from the hook can always read every marker before N from
    /// the log, so it can fill any gap it finds without waiting.
    fn publish(&mut self) {
        self.advance_head();
        self.announce();
    }

    /// Moves the committed head over what became durable.
    fn advance_head(&mut self) {
        if let Some(bounds) = self.bounds.take() {
            *self
                .shared
                .bounds
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = bounds;
        }
    }

    /// Hands the markers the head passed to the hook, once each.
    fn announce(&mut self) {
        if !self.unpublished.is_empty() {
            if let Some(hook) = &self.hook {
                let markers = &self.unpublished;
                if catch_unwind(AssertUnwindSafe(|| hook(markers))).is_err() {
                    self.shared.hook_panics.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.unpublished.clear();
        }
    }
}
