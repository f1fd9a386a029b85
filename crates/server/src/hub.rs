//! The marker hub: one fan-out point fed by the store's writer after each
//! flushed batch, and the feed every subscriber reads through.
//!
//! The writer never blocks on a reader: it sends into a bounded broadcast
//! ring. A subscriber that falls behind the ring is not dropped and does
//! not lose markers: its feed goes back to the durable log from the first
//! sequence it has not delivered, then rejoins the ring. Every subscriber
//! therefore sees every marker `>= start`, in order, once.
//!
//! A marker travels as a [`SharedMarker`]: one allocation however many
//! feeds deliver it, which also keeps the bytes a watch sends for it once
//! the first watch has encoded them, so that every other watch sends the
//! same bytes instead of encoding the marker again. Feeds that fall behind
//! together share their reads of the log the same way (`ReplayCache`).

use std::collections::{HashSet, VecDeque};
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bytes::Bytes;
use ctxbroker_core::Marker;
use ctxbroker_store::Store;
use tokio::sync::broadcast;

use crate::blocking;
use crate::error::ApiError;
use crate::metrics::WatcherProbe;
use crate::tenant::Scope;

/// Markers held in the ring for subscribers that read slowly; past that,
/// they read from the log.
const RING: usize = 4096;
/// Markers read from the log per step of a replay: the size of a chunk of
/// the replay cache.
const REPLAY_BATCH: usize = 256;
/// Chunks the replay cache holds: as many markers as the ring.
const REPLAY_CHUNKS: usize = 16;

/// A marker as the hub hands it to every feed that delivers it: the
/// marker, and its wire form once a watch has made it. Dereferences to the
/// marker.
#[derive(Debug)]
pub struct SharedMarker {
    marker: Marker,
    wire: OnceLock<Bytes>,
    /// The wire form watchers of the marker's tenant receive: the session
    /// named by its bare id.
    tenant_wire: OnceLock<Bytes>,
}

impl SharedMarker {
    /// A marker with no wire form yet.
    pub fn new(marker: Marker) -> Self {
        SharedMarker {
            marker,
            wire: OnceLock::new(),
            tenant_wire: OnceLock::new(),
        }
    }

    /// The marker's wire form: made by `encode` for the first caller and
    /// shared with every later one (`encode` is not called again, and
    /// concurrent callers wait for the first). Every caller must pass the
    /// same encoding: the server has one, the `WatchCompactions` event.
    pub fn wire(&self, encode: impl FnOnce(&Marker) -> Bytes) -> Bytes {
        self.wire.get_or_init(|| encode(&self.marker)).clone()
    }

    /// The marker's wire form for the watchers of its tenant, made once
    /// like [`SharedMarker::wire`]: `encode` is given the marker with its
    /// session named as the tenant knows it.
    pub fn tenant_wire(&self, scope: &Scope, encode: impl FnOnce(&Marker) -> Bytes) -> Bytes {
        self.tenant_wire
            .get_or_init(|| {
                let mut local = self.marker.clone();
                if let Some(id) = scope.local_id(&self.marker.session_id) {
                    local.session_id = id.to_owned();
                }
                encode(&local)
            })
            .clone()
    }
}

impl Deref for SharedMarker {
    type Target = Marker;

    fn deref(&self) -> &Marker {
        &self.marker
    }
}

/// The markers of one chunk of the log, in sequence order.
type Chunk = Arc<[Arc<SharedMarker>]>;

/// The stretches of the marker log that replays have read, shared by every
/// feed that replays them: when many watchers fall behind together, each
/// stretch is read from the log, and each of its markers encoded, once
/// rather than once per watcher.
///
/// The log is cut into chunks of `batch` markers, the first chunk starting
/// at sequence 1; a replay reads the rest of the chunk its position falls
/// in, so that from its second step on it reads whole chunks. Only whole
/// chunks are kept (a marker, once written, never changes), at most
/// [`REPLAY_CHUNKS`], the first kept going first.
#[derive(Debug)]
struct ReplayCache {
    batch: u64,
    chunks: Mutex<VecDeque<Chunk>>,
}

impl ReplayCache {
    fn new(batch: usize) -> Self {
        ReplayCache {
            batch: batch.max(1) as u64,
            chunks: Mutex::new(VecDeque::with_capacity(REPLAY_CHUNKS)),
        }
    }

    /// The first sequence of the chunk `seq` falls in.
    fn chunk_start(&self, seq: u64) -> u64 {
        seq - seq.saturating_sub(1) % self.batch
    }

    /// The whole chunk that starts at `start`, when a replay has read it.
    fn get(&self, start: u64) -> Option<Chunk> {
        let chunks = self.chunks.lock().unwrap_or_else(PoisonError::into_inner);
        chunks
            .iter()
            .find(|chunk| chunk.first().is_some_and(|m| m.seq == start))
            .cloned()
    }

    /// Keeps a chunk a replay has read, whole and contiguous from its
    /// start, unless another replay kept the same chunk first: returns
    /// the chunk kept, which every replay then delivers.
    fn keep(&self, chunk: Chunk) -> Chunk {
        let Some(start) = chunk.first().map(|m| m.seq) else {
            return chunk;
        };
        if chunk.len() as u64 != self.batch || self.chunk_start(start) != start {
            return chunk;
        }
        let mut chunks = self.chunks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = chunks
            .iter()
            .find(|kept| kept.first().is_some_and(|m| m.seq == start))
        {
            return kept.clone();
        }
        if chunks.len() >= REPLAY_CHUNKS {
            chunks.pop_front();
        }
        chunks.push_back(chunk.clone());
        chunk
    }
}

/// The fan-out point.
#[derive(Debug, Clone)]
pub struct Hub {
    tx: broadcast::Sender<Arc<SharedMarker>>,
    replays: Arc<ReplayCache>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new()
    }
}

impl Hub {
    /// An empty hub.
    pub fn new() -> Self {
        Hub::with_ring(RING)
    }

    /// A hub whose ring holds `ring` markers for slow subscribers.
    pub fn with_ring(ring: usize) -> Self {
        Hub::with_sizes(ring, REPLAY_BATCH)
    }

    /// A hub whose ring holds `ring` markers and whose replays read the log
    /// `batch` markers at a time.
    fn with_sizes(ring: usize, batch: usize) -> Self {
        let (tx, _) = broadcast::channel(ring.max(1));
        Hub {
            tx,
            replays: Arc::new(ReplayCache::new(batch)),
        }
    }

    /// Publishes a flushed batch's markers, in sequence order. Never
    /// blocks.
    pub fn publish(&self, markers: &[Marker]) {
        for marker in markers {
            // No receivers is not an error: nobody is watching.
            let _ = self.tx.send(Arc::new(SharedMarker::new(marker.clone())));
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<SharedMarker>> {
        self.tx.subscribe()
    }
}

/// What a feed yields.
#[derive(Debug)]
pub enum FeedEvent {
    /// The next marker that matches the filter.
    Marker(Arc<SharedMarker>),
    /// The replay from the log is done; every marker below this sequence
    /// has been yielded (when it matched). Yielded once.
    CaughtUp(u64),
}

/// Why a feed cannot go on.
#[derive(Debug)]
pub enum FeedEnd {
    /// The next marker to deliver was trimmed by retention while the
    /// subscriber lagged.
    OutOfRange {
        /// The first sequence not delivered.
        next: u64,
        /// The oldest sequence still retained.
        oldest: u64,
    },
    /// The hub is gone (shutdown).
    Closed {
        /// The first sequence not delivered.
        next: u64,
    },
    /// Reading the log failed.
    Store(ApiError),
}

/// One subscriber's ordered, gapless view of the marker log.
#[derive(Debug)]
pub struct MarkerFeed {
    store: Store,
    rx: broadcast::Receiver<Arc<SharedMarker>>,
    replays: Arc<ReplayCache>,
    /// The first sequence not yet yielded or skipped.
    next: u64,
    filter: Option<HashSet<String>>,
    /// Only sessions whose full ids start with this: one tenant's.
    prefix: Option<String>,
    backlog: VecDeque<Arc<SharedMarker>>,
    /// False while the feed reads the log.
    live: bool,
    caught_up_sent: bool,
    /// Where the metrics learn this feed's position, when it is a watch.
    probe: Option<Arc<WatcherProbe>>,
}

/// Where a feed starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedStart {
    /// At this sequence (1 is the first marker ever).
    Seq(u64),
    /// At the oldest marker retained.
    Oldest,
    /// After the newest marker committed so far.
    Now,
}

impl MarkerFeed {
    /// Subscribes, then fixes the start: subscribing first means no marker
    /// committed from now on can be missed between the log and the ring.
    pub fn open(
        hub: &Hub,
        store: Store,
        start: FeedStart,
        filter: Option<HashSet<String>>,
    ) -> Result<MarkerFeed, ApiError> {
        let rx = hub.subscribe();
        let bounds = store.marker_bounds();
        let next = match start {
            FeedStart::Seq(seq) => {
                let seq = seq.max(1);
                if seq < bounds.oldest {
                    return Err(ApiError::MarkerOutOfRange {
                        requested: seq,
                        oldest: bounds.oldest,
                    });
                }
                if seq > bounds.next {
                    return Err(ApiError::InvalidArgument(vec![
                        crate::error::BadField::new(
                            "from_seq",
                            format!(
                                "is beyond the newest marker: the next sequence to be written is {}",
                                bounds.next
                            ),
                        ),
                    ]));
                }
                seq
            }
            FeedStart::Oldest => bounds.oldest,
            FeedStart::Now => bounds.next,
        };
        Ok(MarkerFeed {
            store,
            rx,
            replays: hub.replays.clone(),
            next,
            filter,
            prefix: None,
            backlog: VecDeque::new(),
            live: false,
            caught_up_sent: false,
            probe: None,
        })
    }

    /// Reports this feed's position to `probe` from now on.
    pub fn track(&mut self, probe: Arc<WatcherProbe>) {
        probe.at(self.next_seq());
        self.probe = Some(probe);
    }

    /// Going back to the log, counted when tracked.
    fn fall_back(&mut self) {
        self.live = false;
        if let Some(probe) = &self.probe {
            probe.fell_back();
        }
    }

    /// The first sequence this feed has not yielded: where a subscriber
    /// resumes.
    pub fn next_seq(&self) -> u64 {
        self.backlog.front().map_or(self.next, |marker| marker.seq)
    }

    /// Narrows the feed to the sessions whose full ids start with
    /// `prefix` (one tenant's sessions), on top of any id filter.
    pub fn within(mut self, prefix: String) -> Self {
        self.prefix = (!prefix.is_empty()).then_some(prefix);
        self
    }

    fn wanted(&self, marker: &Marker) -> bool {
        self.prefix
            .as_deref()
            .is_none_or(|prefix| marker.session_id.starts_with(prefix))
            && self
                .filter
                .as_ref()
                .is_none_or(|ids| ids.contains(&marker.session_id))
    }

    /// Moves the rest of the chunk of the log that `next` falls in into
    /// the backlog: from the replay cache when another replay read it
    /// whole, otherwise from the log (off the async workers). Returns
    /// whether anything was found.
    async fn replay_step(&mut self) -> Result<bool, FeedEnd> {
        let chunk = match self.cached_chunk() {
            Some(chunk) => chunk,
            None => match self.read_chunk().await? {
                Some(chunk) => chunk,
                None => return Ok(false),
            },
        };
        // A cached chunk may start before `next`; what it holds from
        // `next` on is contiguous.
        let delivered = chunk.iter().take_while(|m| m.seq < self.next).count();
        let rest = chunk.get(delivered..).unwrap_or_default();
        if rest.is_empty() {
            return Ok(false);
        }
        for marker in rest {
            self.next = marker.seq + 1;
            if self.wanted(marker) {
                self.backlog.push_back(marker.clone());
            }
        }
        Ok(true)
    }

    /// The chunk `next` falls in, if a replay has read it whole and `next`
    /// is still retained: a position retention has trimmed ends the feed,
    /// as the log says, whatever the cache holds.
    fn cached_chunk(&self) -> Option<Chunk> {
        if self.next < self.store.marker_bounds().oldest {
            return None;
        }
        self.replays.get(self.replays.chunk_start(self.next))
    }

    /// Reads the log from `next` to the end of its chunk; `None` when it
    /// holds nothing from `next` on. A whole chunk is kept in the replay
    /// cache, and the chunk delivered is the one kept.
    async fn read_chunk(&self) -> Result<Option<Chunk>, FeedEnd> {
        let from = self.next;
        let end = self.replays.chunk_start(from) + self.replays.batch;
        let limit = usize::try_from(end - from).unwrap_or(REPLAY_BATCH);
        let batch = blocking::read(&self.store, move |store| store.markers(from, limit))
            .await
            .map_err(FeedEnd::Store)?;
        let Some(first) = batch.first() else {
            return Ok(None);
        };
        if first.seq != from {
            let oldest = self.store.marker_bounds().oldest;
            return Err(FeedEnd::OutOfRange { next: from, oldest });
        }
        for (marker, expected) in batch.iter().zip(from..) {
            if marker.seq != expected {
                return Err(FeedEnd::Store(ApiError::Storage(format!(
                    "marker log gap: expected {expected} found {}",
                    marker.seq
                ))));
            }
        }
        let chunk: Chunk = batch
            .into_iter()
            .map(|marker| Arc::new(SharedMarker::new(marker)))
            .collect();
        Ok(Some(self.replays.keep(chunk)))
    }

    /// The next event. Cancel-safe: all state lives in the feed, and a log
    /// read dropped before it returns leaves the feed as it was.
    pub async fn next_event(&mut self) -> Result<FeedEvent, FeedEnd> {
        loop {
            if let Some(probe) = &self.probe {
                probe.at(self.next_seq());
            }
            if let Some(marker) = self.backlog.pop_front() {
                return Ok(FeedEvent::Marker(marker));
            }
            if !self.live {
                if self.replay_step().await? {
                    continue;
                }
                self.live = true;
                if !self.caught_up_sent {
                    self.caught_up_sent = true;
                    return Ok(FeedEvent::CaughtUp(self.next));
                }
                continue;
            }
            match self.rx.recv().await {
                Ok(marker) => {
                    if marker.seq < self.next {
                        continue;
                    }
                    if marker.seq > self.next {
                        // Something between is only in the log.
                        self.fall_back();
                        continue;
                    }
                    self.next = marker.seq + 1;
                    if self.wanted(&marker) {
                        return Ok(FeedEvent::Marker(marker));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.fall_back(),
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(FeedEnd::Closed { next: self.next });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ctxbroker_core::SessionConfig;
    use ctxbroker_proto::v1 as pb;
    use ctxbroker_store::{Store, StoreOptions};

    use super::*;
    use crate::broker::Broker;
    use crate::config::Limits;

    /// A broker over a temporary store whose commits feed `hub`.
    fn broker(dir: &std::path::Path, hub: &Hub) -> Broker {
        broker_keeping(dir, hub, StoreOptions::default().marker_retention)
    }

    /// The same, keeping at most `retention` markers.
    fn broker_keeping(dir: &std::path::Path, hub: &Hub, retention: u64) -> Broker {
        let publish = hub.clone();
        let store = Store::open(
            dir,
            StoreOptions {
                on_commit: Some(Arc::new(move |markers| publish.publish(markers))),
                marker_retention: retention,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        Broker::new(store, Limits::default())
    }

    /// Admits tool output until the session has written `n` markers.
    async fn compactions(broker: &Broker, id: &str, n: u64) {
        let mut turn = 0u64;
        while broker.session(id).await.unwrap().marker_count < n {
            turn += 1;
            let text = format!("tool run {turn}: {}", "build output line ".repeat(12));
            broker
                .admit(
                    id,
                    crate::convert::turn_from_pb(vec![pb::SpanInput {
                        role: pb::Role::Tool as i32,
                        text,
                        ..Default::default()
                    }]),
                )
                .await
                .unwrap();
        }
    }

    async fn next_marker(feed: &mut MarkerFeed) -> Arc<SharedMarker> {
        loop {
            let event = tokio::time::timeout(std::time::Duration::from_secs(10), feed.next_event())
                .await
                .expect("an event within 10 s")
                .unwrap();
            if let FeedEvent::Marker(marker) = event {
                return marker;
            }
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_lags_past_the_ring_gets_every_marker_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::with_ring(2);
        let broker = broker(dir.path(), &hub);
        broker
            .create_session("lag", SessionConfig::with_window(400))
            .await
            .unwrap();
        let mut feed =
            MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Seq(1), None).unwrap();
        // Caught up at once: nothing written yet.
        assert!(matches!(
            feed.next_event().await.unwrap(),
            FeedEvent::CaughtUp(1)
        ));

        // Ten markers while the subscriber reads nothing: the ring of two
        // overflows.
        compactions(&broker, "lag", 10).await;
        let mut seqs = Vec::new();
        for _ in 0..10 {
            seqs.push(next_marker(&mut feed).await.seq);
        }
        assert_eq!(seqs, (1..=10).collect::<Vec<_>>());

        // And it carries on live afterwards.
        compactions(&broker, "lag", 11).await;
        assert_eq!(next_marker(&mut feed).await.seq, 11);
        assert_eq!(feed.next_seq(), 12);
    }

    #[tokio::test]
    async fn every_feed_delivers_one_shared_marker_whose_wire_form_is_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::new();
        let broker = broker(dir.path(), &hub);
        broker
            .create_session("s", SessionConfig::with_window(400))
            .await
            .unwrap();
        let open = || MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Now, None).unwrap();
        let (mut a, mut b) = (open(), open());
        // Both live (their replay is done) before the marker is written:
        // it reaches them through the ring.
        for feed in [&mut a, &mut b] {
            assert!(matches!(
                feed.next_event().await.unwrap(),
                FeedEvent::CaughtUp(1)
            ));
        }
        compactions(&broker, "s", 1).await;
        let (x, y) = (next_marker(&mut a).await, next_marker(&mut b).await);
        assert!(Arc::ptr_eq(&x, &y), "one allocation for every feed");

        let calls = std::sync::atomic::AtomicUsize::new(0);
        let encode = |marker: &Marker| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Bytes::from(marker.seq.to_string())
        };
        let (first, second) = (x.wire(encode), y.wire(encode));
        assert_eq!(calls.into_inner(), 1, "encoded once");
        assert_eq!(first, Bytes::from("1"));
        assert_eq!(first.as_ptr(), second.as_ptr(), "the same bytes, shared");
    }

    #[tokio::test]
    async fn feeds_that_replay_the_same_stretch_share_its_reads_of_the_log() {
        let dir = tempfile::tempdir().unwrap();
        // Chunks of four: 1-4, 5-8, then the head.
        let hub = Hub::with_sizes(2, 4);
        let broker = broker(dir.path(), &hub);
        broker
            .create_session("r", SessionConfig::with_window(400))
            .await
            .unwrap();
        compactions(&broker, "r", 10).await;
        let head = broker.store().marker_bounds().next;
        let open = |seq| {
            MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Seq(seq), None).unwrap()
        };
        let mut read = Vec::new();
        for start in [1, 1, 3] {
            let mut feed = open(start);
            let mut markers = Vec::new();
            for _ in start..head {
                markers.push(next_marker(&mut feed).await);
            }
            let seqs: Vec<u64> = markers.iter().map(|m| m.seq).collect();
            assert_eq!(seqs, (start..head).collect::<Vec<_>>());
            read.push(markers);
        }
        let [a, b, c] = &read[..] else {
            unreachable!("three feeds")
        };
        // The whole chunks are one read, whichever feed made it: the same
        // markers, so encoded once. The head's partial chunk is not kept.
        for i in 0..8 {
            assert!(Arc::ptr_eq(&a[i], &b[i]), "seq {}", i + 1);
        }
        for i in 2..8 {
            assert!(Arc::ptr_eq(&a[i], &c[i - 2]), "seq {}", i + 1);
        }
        assert!(!Arc::ptr_eq(&a[8], &b[8]));
    }

    #[tokio::test]
    async fn a_kept_chunk_never_hides_a_trimmed_position() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::with_sizes(2, 4);
        let broker = broker_keeping(dir.path(), &hub, 6);
        broker
            .create_session("t", SessionConfig::with_window(400))
            .await
            .unwrap();
        compactions(&broker, "t", 4).await;
        let open =
            || MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Seq(1), None).unwrap();
        let (mut behind, mut reader) = (open(), open());
        // The reader's replay keeps the chunk 1-4.
        for seq in 1..=4 {
            assert_eq!(next_marker(&mut reader).await.seq, seq);
        }
        // Retention removes marker 1 while the other feed has read nothing.
        let mut n = 4;
        while broker.store().marker_bounds().oldest <= 1 {
            n += 1;
            compactions(&broker, "t", n).await;
        }
        assert!(matches!(
            behind.next_event().await,
            Err(FeedEnd::Store(ApiError::MarkerOutOfRange {
                requested: 1,
                ..
            }))
        ));
    }

    #[tokio::test]
    async fn a_filtered_feed_skips_other_sessions_but_tracks_the_global_position() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::new();
        let broker = broker(dir.path(), &hub);
        for id in ["a", "b"] {
            broker
                .create_session(id, SessionConfig::with_window(400))
                .await
                .unwrap();
        }
        compactions(&broker, "a", 2).await;
        compactions(&broker, "b", 1).await;
        let filter = Some(std::collections::HashSet::from(["b".to_owned()]));
        let mut feed =
            MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Oldest, filter).unwrap();
        let marker = next_marker(&mut feed).await;
        assert_eq!((marker.seq, marker.session_id.as_str()), (3, "b"));
        assert!(matches!(
            feed.next_event().await.unwrap(),
            FeedEvent::CaughtUp(4)
        ));
    }

    #[tokio::test]
    async fn a_tenants_feed_sees_its_sessions_named_by_bare_id() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::new();
        let broker = broker(dir.path(), &hub);
        for id in ["acme/a", "acmex/a", "beta/a", "a"] {
            broker
                .create_session(id, SessionConfig::with_window(400))
                .await
                .unwrap();
            compactions(&broker, id, 1).await;
        }
        let acme = Scope::tenant("acme");
        let mut feed = MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Oldest, None)
            .unwrap()
            .within(acme.prefix());
        let marker = next_marker(&mut feed).await;
        assert_eq!((marker.seq, marker.session_id.as_str()), (1, "acme/a"));
        assert!(matches!(
            feed.next_event().await.unwrap(),
            FeedEvent::CaughtUp(5)
        ));
        // Its wire form names the session as acme knows it; the operators'
        // form keeps the full id; each is made once.
        let mut made = 0;
        let mut encode = |m: &Marker| {
            made += 1;
            Bytes::from(m.session_id.clone())
        };
        assert_eq!(marker.tenant_wire(&acme, &mut encode), "a");
        assert_eq!(marker.tenant_wire(&acme, &mut encode), "a");
        assert_eq!(marker.wire(&mut encode), "acme/a");
        assert_eq!(made, 2);
    }

    #[tokio::test]
    async fn a_start_past_the_head_is_refused_and_now_starts_at_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::new();
        let broker = broker(dir.path(), &hub);
        let past = MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Seq(5), None);
        assert!(matches!(past, Err(ApiError::InvalidArgument(_))));
        let now = MarkerFeed::open(&hub, broker.store().clone(), FeedStart::Now, None).unwrap();
        assert_eq!(now.next_seq(), 1);
    }
}
