//! The families read at scrape time: the stored sessions (aggregates and
//! the top sessions), the open watches against the marker log's head, the
//! store's writer, and how long the previous scrape took. [`Scraped`] is
//! what one scrape read, encoded as a prometheus-client collector.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ctxbroker_store::{Store, StoreError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Upper bounds of the `ctxbroker_sessions_by_fill` bands; the last band
/// takes everything above the one before.
const FILL_BANDS: &[(f64, &str)] = &[
    (0.5, "0.0-0.5"),
    (0.8, "0.5-0.8"),
    (0.9, "0.8-0.9"),
    (f64::INFINITY, "0.9-1.0"),
];
/// Sessions read from the store per step of a scrape.
const SCAN_PAGE: usize = 1024;

/// What one pass over the stored sessions found.
#[derive(Debug, Default)]
struct SessionStats {
    sessions: u64,
    live_tokens: u64,
    pinned_tokens: u64,
    /// `(live, budget, id)`, most live first.
    top: Vec<(u64, u64, String)>,
    bands: [u64; 4],
}

impl SessionStats {
    fn scan(store: &Store, top: usize) -> Result<SessionStats, StoreError> {
        // A min-heap of the best `top` so far, by (live, smaller id).
        let mut heap: BinaryHeap<Reverse<(u64, Reverse<String>, u64)>> = BinaryHeap::new();
        let mut stats = SessionStats::default();
        let mut after: Option<String> = None;
        loop {
            let page = store.sessions(after.as_deref(), SCAN_PAGE)?;
            for record in &page {
                stats.sessions += 1;
                stats.live_tokens += record.live_tokens;
                stats.pinned_tokens += record.pinned_tokens;
                let budget = u64::from(record.config.budget_tokens());
                let fill = if budget == 0 {
                    1.0
                } else {
                    record.live_tokens as f64 / budget as f64
                };
                let band = FILL_BANDS
                    .iter()
                    .position(|(upper, _)| fill < *upper)
                    .unwrap_or(FILL_BANDS.len() - 1);
                if let Some(count) = stats.bands.get_mut(band) {
                    *count += 1;
                }
                if top == 0 {
                    continue;
                }
                let beats = heap.len() < top
                    || heap.peek().is_some_and(|Reverse((live, id, _))| {
                        (record.live_tokens, Reverse(&record.id)) > (*live, Reverse(&id.0))
                    });
                if beats {
                    heap.push(Reverse((
                        record.live_tokens,
                        Reverse(record.id.clone()),
                        budget,
                    )));
                    if heap.len() > top {
                        heap.pop();
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() == SCAN_PAGE => after = Some(last.id.clone()),
                _ => break,
            }
        }
        // Most live first, ties by id.
        stats.top = heap
            .into_sorted_vec()
            .into_iter()
            .map(|Reverse((live, id, budget))| (live, budget, id.0))
            .collect();
        Ok(stats)
    }
}

/// Everything one scrape read, ready to encode.
#[derive(Debug)]
pub(super) struct Scraped {
    sessions: SessionStats,
    /// Each open watch's lag behind the head, in markers.
    lags: Vec<u64>,
    next_seq: u64,
    store: ctxbroker_store::StoreStats,
    last_scrape_us: u64,
}

impl Scraped {
    /// Reads the store; `positions` are the open watches' next sequences.
    pub(super) fn read(
        store: &Store,
        top_sessions: usize,
        positions: &[u64],
        last_scrape_us: u64,
    ) -> Result<Scraped, StoreError> {
        let sessions = SessionStats::scan(store, top_sessions)?;
        // Read after the positions: a position is never past the head it
        // was set under, and the head only grows.
        let next_seq = store.marker_bounds().next;
        Ok(Scraped {
            sessions,
            lags: positions
                .iter()
                .map(|&p| next_seq.saturating_sub(p))
                .collect(),
            next_seq,
            store: store.stats(),
            last_scrape_us,
        })
    }
}

/// Writes an unlabelled gauge.
fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(family)
}

/// Writes a gauge with one series per `(label value, value)`.
fn labelled_gauge<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    series: impl Iterator<Item = (&'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value_of_label, value) in series {
        let labels = [(label, value_of_label)];
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        let s = &self.sessions;
        gauge(e, "ctxbroker_sessions", "Sessions stored.", s.sessions)?;
        gauge(
            e,
            "ctxbroker_live_tokens",
            "Live tokens over all sessions.",
            s.live_tokens,
        )?;
        gauge(
            e,
            "ctxbroker_pinned_tokens",
            "Tokens held by pinned constraints over all sessions.",
            s.pinned_tokens,
        )?;
        labelled_gauge(
            e,
            "ctxbroker_session_live_tokens",
            "Live tokens of the sessions with the most (a bounded number of them, see metrics_top_sessions).",
            "session_id",
            s.top.iter().map(|(live, _, id)| (id.as_str(), *live)),
        )?;
        labelled_gauge(
            e,
            "ctxbroker_session_budget_tokens",
            "The budget (alpha x window - overhead) of the sessions in ctxbroker_session_live_tokens.",
            "session_id",
            s.top.iter().map(|(_, budget, id)| (id.as_str(), *budget)),
        )?;
        labelled_gauge(
            e,
            "ctxbroker_sessions_by_fill",
            "Sessions by how full their budget is (live / budget), in bands.",
            "fill",
            FILL_BANDS
                .iter()
                .zip(&s.bands)
                .map(|((_, band), count)| (*band, *count)),
        )?;

        gauge(
            e,
            "ctxbroker_watchers",
            "Open WatchCompactions streams.",
            self.lags.len() as u64,
        )?;
        gauge(
            e,
            "ctxbroker_watchers_lagging",
            "Open watches with committed markers not yet taken.",
            self.lags.iter().filter(|&&lag| lag > 0).count() as u64,
        )?;
        gauge(
            e,
            "ctxbroker_watcher_max_lag_markers",
            "Committed markers the furthest-behind watch has not yet taken.",
            self.lags.iter().copied().max().unwrap_or(0),
        )?;
        gauge(
            e,
            "ctxbroker_marker_next_seq",
            "The sequence the next marker will take.",
            self.next_seq,
        )?;

        let stats = &self.store;
        for (name, help, value) in [
            (
                "ctxbroker_store_writes",
                "Writes the store's writer took, applied or refused.",
                stats.writes,
            ),
            (
                "ctxbroker_store_rejected_writes",
                "Writes the store refused (a stale revision, a missing session).",
                stats.rejected,
            ),
            (
                "ctxbroker_store_batches",
                "Batches the writer took from its queue.",
                stats.batches,
            ),
            (
                "ctxbroker_store_flushes",
                "Flushes of the storage engine.",
                stats.flushes,
            ),
            (
                "ctxbroker_store_blob_syncs",
                "Files of the storage engine's large values and nodes synced before a flush.",
                stats.blob_syncs,
            ),
            (
                "ctxbroker_store_writes_applied_by_caller",
                "Writes applied by the request that made them, without waking the writer's thread (relaxed durability).",
                stats.applied_by_caller,
            ),
            (
                "ctxbroker_store_keys_written",
                "Keys the writer inserted or replaced, over every tree.",
                stats.keys_written,
            ),
            (
                "ctxbroker_store_keys_removed",
                "Keys the writer removed.",
                stats.keys_removed,
            ),
            (
                "ctxbroker_store_keys_read",
                "Keys the writer read from the storage engine to check writes: look-ups and scanned entries.",
                stats.keys_read,
            ),
            (
                "ctxbroker_store_bytes_written",
                "Bytes of the keys and values the writer handed the storage engine.",
                stats.bytes_written,
            ),
        ] {
            // The encoder appends `_total` to a counter's name.
            let family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(family)?;
        }
        gauge(
            e,
            "ctxbroker_store_queued_writes",
            "Writes waiting for the store's writer.",
            stats.queued,
        )?;

        gauge(
            e,
            "ctxbroker_scrape_duration_seconds",
            "How long the previous scrape took, most of it walking the stored sessions.",
            self.last_scrape_us as f64 / 1e6,
        )
    }
}

#[cfg(test)]
mod tests {

    use prometheus_client::encoding::prometheus_text;
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn session_ids_are_escaped_and_counters_end_in_total() {
        let scraped = Scraped {
            sessions: SessionStats {
                sessions: 1,
                top: vec![(7, 100, "q\"\\\nx".to_owned())],
                ..SessionStats::default()
            },
            lags: vec![0, 3],
            next_seq: 5,
            store: ctxbroker_store::StoreStats::default(),
            last_scrape_us: 250,
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(scraped));
        let mut text = String::new();
        prometheus_text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("ctxbroker_session_live_tokens{session_id=\"q\\\"\\\\\\nx\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE ctxbroker_store_writes_total counter\n"));
        assert!(text.contains("\nctxbroker_store_writes_total 0\n"));
        assert!(text.contains("\nctxbroker_watcher_max_lag_markers 3\n"));
        assert!(text.contains("\nctxbroker_scrape_duration_seconds 0.00025\n"));
        assert!(!text.contains("# EOF"));
    }
}
