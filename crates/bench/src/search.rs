//! `search`: what the archive search costs, at admission and per query.
//!
//! One session of `--spans` spans (each size in the list) is written to a
//! store in a temporary directory, through the store's writer as the
//! daemon writes it, with the texts of the `storage` workload (80–2,000
//! bytes, mean about 420: tool output, prose, paths, identifiers).
//!
//! Figures, each with a baseline measured in the same run:
//!
//! - **indexing**: the span's term vector built and packed (what the
//!   writer adds to each admission), µs per span, against counting the
//!   same span's o200k tokens (what admission already pays);
//! - **index size**: the packed vectors' bytes against the raw text;
//! - **query**: `Store::search` for one identifier of a random span (an
//!   anchor, found in one span), first page of 10: the session's first
//!   search (which reads every term vector into the postings cache), then
//!   the median and p90 over `--queries` later queries, against finding
//!   the same spans without the index: reading every span of the session
//!   and matching the text.

use std::time::{Duration, Instant};

use clap::Parser;
use ctxbroker_core::config::{SessionConfig, TokenizerKind};
use ctxbroker_core::search::{self, SpanFilter, TermVector, codec};
use ctxbroker_core::session::{Change, SessionRecord};
use ctxbroker_core::span::{ClassSource, Classification, Role, Span, SpanClass};
use ctxbroker_core::tokens;
use ctxbroker_store::{SearchQuery, Store, StoreOptions, WriteOp};

use crate::common::{Failure, Rng, flags, median, percentile};
use crate::storage::span_input;

/// `ctxbroker-bench search`.
#[derive(Debug, Parser)]
struct SearchFlags {
    /// Session sizes, in spans, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    spans: Vec<usize>,
    /// Queries timed per size.
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// Spans per admission.
    #[arg(long, default_value_t = 100)]
    batch: usize,
}

const SESSION: &str = "bench";

/// Runs the subcommand.
pub async fn search_main(args: &[String]) -> Result<(), Failure> {
    let flags: SearchFlags = flags("search", args);
    if flags.spans.contains(&0) || flags.queries == 0 || flags.batch == 0 {
        return Err("--spans, --queries and --batch must be at least 1".into());
    }
    println!(
        "| spans | index µs/span | o200k count µs/span | ratio | index bytes / raw | first query µs | query p50 µs | p90 µs | scan p50 µs | scan / query |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &n in &flags.spans {
        let row = measure(n, &flags).await?;
        println!(
            "| {n} | {:.2} | {:.2} | {:.2} | {:.3} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0}× |",
            row.index_us,
            row.count_us,
            row.index_us / row.count_us.max(f64::MIN_POSITIVE),
            row.index_ratio,
            row.first_query,
            row.query_p50,
            row.query_p90,
            row.scan_p50,
            row.scan_p50 / row.query_p50.max(f64::MIN_POSITIVE),
        );
    }
    Ok(())
}

struct Row {
    index_us: f64,
    count_us: f64,
    index_ratio: f64,
    first_query: f64,
    query_p50: f64,
    query_p90: f64,
    scan_p50: f64,
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn measure(n: usize, flags: &SearchFlags) -> Result<Row, Failure> {
    let texts: Vec<String> = (0..n).map(|k| span_input(0, k).1).collect();
    let raw: usize = texts.iter().map(String::len).sum();

    // Indexing against token counting, five passes each, median.
    let counter = tokens::counter(TokenizerKind::O200kBase);
    let mut index_runs = Vec::new();
    let mut count_runs = Vec::new();
    let mut packed = 0usize;
    for _ in 0..5 {
        let started = Instant::now();
        packed = texts
            .iter()
            .map(|t| codec::encode(&TermVector::of(t)).len())
            .sum();
        index_runs.push(started.elapsed());
        let started = Instant::now();
        let total: u64 = texts.iter().map(|t| u64::from(counter.count(t))).sum();
        count_runs.push(started.elapsed());
        std::hint::black_box(total);
    }
    let per_span = |d: Duration| micros(d) / n as f64;

    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), StoreOptions::default())?;
    populate(&store, &texts, flags.batch).await?;

    // Anchors: an identifier of a random span.
    let mut rng = Rng::new(n as u64);
    let mut anchors = Vec::new();
    while anchors.len() < flags.queries {
        let k = rng.below(n);
        if let Some(id) = texts[k].split(' ').find(|w| w.starts_with("id_")) {
            anchors.push(id.trim_end_matches('.').to_owned());
        }
    }
    let mut first_query = None;
    let mut query_times = Vec::with_capacity(anchors.len());
    let mut scan_times = Vec::with_capacity(anchors.len());
    for anchor in &anchors {
        let query = SearchQuery {
            terms: search::query_terms(anchor),
            filter: SpanFilter::default(),
            offset: 0,
            limit: 10,
        };
        let started = Instant::now();
        let page = store.search(SESSION, &query)?;
        match first_query {
            None => first_query = Some(started.elapsed()),
            Some(_) => query_times.push(started.elapsed()),
        }
        let started = Instant::now();
        let spans = store.live_spans(SESSION)?;
        let found = spans
            .iter()
            .filter(|s| s.text.contains(anchor.as_str()))
            .count();
        scan_times.push(started.elapsed());
        if page.hits.is_empty() || found == 0 {
            return Err(
                format!("{anchor:?}: {} hits, {found} by scanning", page.hits.len()).into(),
            );
        }
    }
    store.close()?;
    query_times.sort_unstable();
    Ok(Row {
        index_us: per_span(median(index_runs)),
        count_us: per_span(median(count_runs)),
        index_ratio: packed as f64 / raw as f64,
        first_query: micros(first_query.unwrap_or_default()),
        query_p50: micros(percentile(&query_times, 0.5)),
        query_p90: micros(percentile(&query_times, 0.9)),
        scan_p50: micros(median(scan_times)),
    })
}

/// Writes the session, `batch` spans per admission.
async fn populate(store: &Store, texts: &[String], batch: usize) -> Result<(), Failure> {
    let mut record = SessionRecord::new(SESSION, SessionConfig::with_window(10_000_000), 1);
    store
        .write(WriteOp::CreateSession {
            record: record.clone(),
        })
        .await?;
    for (chunk_no, chunk) in texts.chunks(batch).enumerate() {
        let first = record.next_span_id;
        let spans: Vec<Span> = chunk
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let id = first + i as u64;
                Span {
                    id,
                    position: id,
                    role: Role::Tool,
                    classification: Classification {
                        class: SpanClass::Narrative,
                        source: ClassSource::Caller,
                        rule: String::new(),
                    },
                    text: text.clone(),
                    tokens: (text.len() / 4) as u32,
                    generation: 0,
                    turn: chunk_no as u64 + 1,
                    predicate: None,
                    summary: None,
                    relevance_hint: None,
                    admitted_at_ms: 1,
                    original: None,
                    attributes: None,
                }
            })
            .collect();
        let expected_revision = record.revision;
        record.revision += 1;
        record.turns += 1;
        record.next_span_id = first + spans.len() as u64;
        record.live_spans += spans.len() as u64;
        record.live_tokens += spans.iter().map(|s| u64::from(s.tokens)).sum::<u64>();
        store
            .write(WriteOp::Change {
                change: Change {
                    expected_revision,
                    record: record.clone(),
                    append: spans,
                    evict: Vec::new(),
                    summary: None,
                    replace: Vec::new(),
                    marker: None,
                },
                keys: Vec::new(),
            })
            .await?;
    }
    Ok(())
}
