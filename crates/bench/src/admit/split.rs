//! The split: where the time of one admission goes, stage by stage, and
//! that it does not grow with the session.
//!
//! In process, on one thread: a session of `n` live spans (the `plan`
//! generator's turns, admitted turn by turn through [`Session::admit`]
//! and written through a real [`Store`] with relaxed durability in a
//! temporary directory, then loaded back from the store as a [`Session`])
//! admits one short user message after another, unlabelled, so the
//! classifier runs. The window is large enough that nothing compacts:
//! the session stays below its soft watermark. Each admission runs the
//! daemon's path for `Admit` (`service` → `broker` → core → store →
//! `service`), with each stage timed around exactly its calls:
//!
//! - **parse**: the request's protobuf decoded from its bytes, checked
//!   (`validate::session_id`, `validate::turn_shape`, `validate::finish`)
//!   and converted (`convert::turn_from_pb`), its token counts checked
//!   (`validate::token_counts`);
//! - **count**: the text counted with the session's tokenizer;
//! - **classify**: the span labelled as the broker labels it
//!   (`TurnSpan::labelled`) and settled under the session's classifier
//!   mode (`Incoming::settle`: the model under MODEL, the default); the settled
//!   span is handed on as classified, so the next stage does not classify
//!   it again (under MODEL this decides the same change, which is checked
//!   once per size);
//! - **plan**: [`Session::admit`], which decides that the turn fits and
//!   makes the change;
//! - **write**: the change cloned into a `WriteOp::Change` and written,
//!   awaited until the store acknowledges it: the writer thread applies
//!   it, the flusher thread acknowledges it (with relaxed durability, no
//!   flush is awaited);
//! - **apply**: [`Session::apply`] of the acknowledged change;
//! - **encode**: the `AdmitResponse` built (`convert::span_to_pb`,
//!   `marker_to_pb`, `totals_to_pb`) and encoded with
//!   `prost::Message::encode_to_vec`;
//!
//! and **total**, their sum. Not measured: tonic's framing and HTTP/2,
//! the session map's lock and tokenizer lookup, the scheduler's check
//! after the admission, and tracing.
//!
//! Every size's session is built first, each in a store of its own, and
//! warmed up with unrecorded admissions; the recorded ones then run
//! interleaved, a few (`--split-chunk`) for each size in turn, so that
//! the machine's other load falls on every size alike. (Switching sizes
//! after every admission slowed the first stages of the admission after
//! each switch in trial runs; with ten at a time, one admission in ten
//! follows a switch, which the medians ignore.) Every admission
//! adds its span to the session, so a session ends the run larger than
//! it started (both sizes are printed). The figures are medians (and the
//! total's p99) of wall-clock time: the bench does not depend on libc, so
//! the thread's CPU time is not read, and the write includes the waits
//! for the store's threads.

use std::time::{Duration, Instant};

use ctxbroker_core::config::{ClassifierMode, SessionConfig, TokenizerKind, defaults};
use ctxbroker_core::session::{Change, Incoming, Session};
use ctxbroker_core::tokens::{self, TokenCounter, warm_up};
use ctxbroker_proto::v1 as pb;
use ctxbroker_server::broker::{TurnSpan, now_ms};
use ctxbroker_server::config::Limits;
use ctxbroker_server::convert::{self, marker_to_pb, span_to_pb, totals_to_pb};
use ctxbroker_server::validate;
use ctxbroker_store::{Durability, SpanState, Store, StoreOptions, WriteOp};
use prost::Message;

use super::per_byte;
use super::workload::{Mix, Workload};
use crate::common::{Failure, Quantiles};

/// The stages, in the order an admission runs them.
pub const STAGES: [&str; 7] = [
    "parse", "count", "classify", "plan", "write", "apply", "encode",
];

/// The short user messages admitted, in turn.
pub const MESSAGES: [&str; 8] = [
    "please keep the retries at three and tell me when the build is green",
    "can you check why the ingest tests are slow on the second run?",
    "looks good, now rename the handler to something clearer",
    "what does the scheduler do when the queue is full?",
    "run the migration again and paste the last twenty lines of output",
    "thanks, that fixed it. next, the cache eviction looks too aggressive",
    "hold off on the billing changes until tomorrow",
    "show me the diff before you commit anything",
];

/// The session's id.
const SESSION: &str = "split";

/// What the split measures: the sizes, and the admissions per size.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    /// Live spans of each session before its admissions.
    pub sizes: Vec<usize>,
    /// Admissions recorded per size.
    pub admissions: usize,
    /// Admissions per size before them, not recorded.
    pub warmup: usize,
    /// Recorded admissions a size makes before the next size's turn.
    pub chunk: usize,
    /// The mix whose turns the per-byte table reads.
    pub mix: Mix,
    /// How many of its turns it reads; none skips the table.
    pub mix_turns: usize,
}

/// One size's figures.
#[derive(Debug, Clone)]
pub struct SplitRow {
    /// Live spans before the first admission.
    pub spans: usize,
    /// Live spans after the last.
    pub spans_after: usize,
    /// The median of each stage, in the order of [`STAGES`], µs.
    pub stages: [f64; STAGES.len()],
    /// The total's quantiles, µs.
    pub total: Quantiles,
    /// Recorded admissions whose message was classified a constraint.
    pub constraints: usize,
    /// Store writes that filled the session.
    pub fill_writes: usize,
    /// Seconds to fill and load the session.
    pub fill_seconds: f64,
}

/// Measures every size on a thread of its own and prints the section.
pub async fn section(plan: SplitPlan) -> Result<(), Failure> {
    if plan.sizes.is_empty() || plan.sizes.contains(&0) || plan.admissions == 0 || plan.chunk == 0 {
        return Err(
            "--split-sizes must name at least one size, each at least 1 span, and --split-admissions and --split-chunk must be at least 1"
                .into(),
        );
    }
    let printed = plan.clone();
    let thread = std::thread::Builder::new()
        .name("ctxbroker-bench-split".into())
        .spawn(move || {
            let rows = measure_all(&plan)?;
            let per_byte = match plan.mix_turns {
                0 => None,
                turns => Some(per_byte::measure(&Workload::generate(plan.mix), turns)?),
            };
            Ok::<_, Failure>((rows, per_byte))
        })
        .map_err(|err| format!("starting the split's thread: {err}"))?;
    let (rows, per_byte) = tokio::task::spawn_blocking(move || thread.join())
        .await?
        .map_err(|_| "the split's thread panicked")??;
    print(&rows, &printed);
    if let Some(figures) = per_byte {
        per_byte::print(&figures);
    }
    Ok(())
}

/// Every size, on the calling thread, which must not be a runtime's: the
/// store's writes are awaited on a runtime of its own.
pub fn measure_all(plan: &SplitPlan) -> Result<Vec<SplitRow>, Failure> {
    warm_up(TokenizerKind::O200kBase);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|err| format!("building the split's runtime: {err}"))?;
    runtime.block_on(measure(plan))
}

/// One session of the split, with what its admissions recorded.
struct Subject {
    n: usize,
    store: Store,
    session: Session,
    /// Admissions so far, warm-up included.
    admitted: usize,
    stages: [Vec<Duration>; STAGES.len()],
    totals: Vec<Duration>,
    constraints: usize,
    fill_writes: usize,
    fill_seconds: f64,
    /// Removed (with the store's files) when the subject is dropped.
    _dir: tempfile::TempDir,
}

/// Builds every size's session, warms each up, then runs the recorded
/// admissions interleaved: every size in turn (in the order given) makes
/// `plan.chunk` of them, until each has made `plan.admissions`, so that
/// the machine's other load falls on every size alike.
async fn measure(plan: &SplitPlan) -> Result<Vec<SplitRow>, Failure> {
    let limits = Limits::default();
    let requests: Vec<Vec<u8>> = (0..MESSAGES.len()).map(request).collect();
    let mut subjects = Vec::with_capacity(plan.sizes.len());
    for &n in &plan.sizes {
        let mut subject = prepare(n, plan).await?;
        check_settled(&mut subject.session, &limits)?;
        subjects.push(subject);
    }
    for subject in &mut subjects {
        for _ in 0..plan.warmup {
            admit(subject, &requests, &limits, false).await?;
        }
    }
    let mut recorded = 0;
    while recorded < plan.admissions {
        let share = plan.chunk.min(plan.admissions - recorded);
        for subject in &mut subjects {
            for _ in 0..share {
                admit(subject, &requests, &limits, true).await?;
            }
        }
        recorded += share;
    }
    let mut rows = Vec::with_capacity(subjects.len());
    for subject in subjects {
        subject.store.close()?;
        rows.push(row(subject));
    }
    Ok(rows)
}

/// A size's session: filled through a store of its own, then loaded
/// from it.
async fn prepare(n: usize, plan: &SplitPlan) -> Result<Subject, Failure> {
    let dir = tempfile::tempdir().map_err(|err| format!("a temporary directory: {err}"))?;
    let store = Store::open(
        dir.path(),
        StoreOptions {
            durability: Durability::Relaxed,
            ..StoreOptions::default()
        },
    )?;
    let started = Instant::now();
    let counter = tokens::counter(TokenizerKind::O200kBase);
    let headroom = (plan.warmup + plan.admissions) as u64 * largest_message(counter);
    let (written, fill_writes) = fill(&store, n, headroom, counter).await?;
    let Some(record) = store.session(SESSION)? else {
        return Err(format!("{n} spans: the session is not in the store").into());
    };
    let session = Session::new(record, store.live_spans(SESSION)?);
    if session != written {
        return Err(format!("{n} spans: the session loaded differs from the one written").into());
    }
    drop(written);
    let fill_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "split, {n} spans: {} live tokens, window {}, filled by {fill_writes} writes and loaded in {fill_seconds:.1} s",
        session.record.live_tokens, session.record.config.window_tokens,
    );
    Ok(Subject {
        n,
        store,
        session,
        admitted: 0,
        stages: std::array::from_fn(|_| Vec::with_capacity(plan.admissions)),
        totals: Vec::with_capacity(plan.admissions),
        constraints: 0,
        fill_writes,
        fill_seconds,
        _dir: dir,
    })
}

/// A subject's figures.
fn row(subject: Subject) -> SplitRow {
    let mut totals = subject.totals;
    totals.sort_unstable();
    SplitRow {
        spans: subject.n,
        spans_after: subject.session.spans.len(),
        stages: subject.stages.map(|mut samples| {
            samples.sort_unstable();
            Quantiles::of(&samples).p50
        }),
        total: Quantiles::of(&totals),
        constraints: subject.constraints,
        fill_writes: subject.fill_writes,
        fill_seconds: subject.fill_seconds,
    }
}

/// The most tokens one of [`MESSAGES`] counts.
fn largest_message(counter: &dyn TokenCounter) -> u64 {
    MESSAGES
        .iter()
        .map(|m| u64::from(counter.count(m)))
        .max()
        .unwrap_or(0)
}

/// Creates the session in `store` with a window whose soft watermark
/// holds `n` generated spans and `headroom` tokens more, and admits the
/// spans turn by turn, each turn written before it is applied: the
/// session as written, and the writes.
async fn fill(
    store: &Store,
    n: usize,
    headroom: u64,
    counter: &'static dyn TokenCounter,
) -> Result<(Session, usize), Failure> {
    let history = crate::plan::history(n, counter);
    let live: u64 = history.iter().map(|s| u64::from(s.tokens)).sum();
    let wanted = (live + headroom) as f64 / (defaults::ALPHA * defaults::SOFT_WATERMARK);
    let window = u32::try_from(wanted.ceil() as u64 + 1_000)
        .map_err(|_| format!("{n} spans: a window for {live} live tokens exceeds u32"))?;
    let config = SessionConfig::with_window(window);
    if u64::from(config.soft_watermark_tokens()) < live + headroom {
        return Err(format!("{n} spans: window {window} leaves no room for the admissions").into());
    }
    let mut session = Session::create(SESSION, config, now_ms());
    store
        .write(WriteOp::CreateSession {
            record: session.record.clone(),
        })
        .await?;
    let mut writes = 1;
    for turn in history.chunk_by(|a, b| a.turn == b.turn) {
        let incoming = turn
            .iter()
            .map(|s| Incoming {
                role: s.role,
                text: s.text.clone(),
                tokens: s.tokens,
                classification: s.classification.clone(),
                predicate: s.predicate.clone(),
                relevance_hint: None,
                unclassified: false,
                attributes: None,
            })
            .collect();
        let change = session
            .admit(incoming, now_ms(), counter)
            .map_err(|r| format!("{n} spans: filling the session was refused: {r:?}"))?;
        if change.marker.is_some() {
            return Err(format!("{n} spans: filling the session compacted it").into());
        }
        store
            .write(WriteOp::Change {
                change: change.clone(),
                keys: Vec::new(),
            })
            .await?;
        session.apply(&change);
        writes += 1;
    }
    if session.spans.len() != n {
        return Err(format!("{n} spans: the session holds {}", session.spans.len()).into());
    }
    Ok((session, writes))
}

/// The request of message `k`, encoded as it arrives.
fn request(k: usize) -> Vec<u8> {
    pb::AdmitRequest {
        session_id: SESSION.to_owned(),
        spans: vec![pb::SpanInput {
            role: pb::Role::User as i32,
            text: MESSAGES[k % MESSAGES.len()].to_owned(),
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// Parse: the request decoded, checked and converted, as the service
/// and the broker check it.
fn parse(
    bytes: &[u8],
    limits: &Limits,
    tokenizer: TokenizerKind,
) -> Result<Vec<TurnSpan>, Failure> {
    let request = pb::AdmitRequest::decode(bytes)?;
    let mut bad = Vec::new();
    if let Err(b) = validate::session_id("session_id", &request.session_id, limits) {
        bad.push(b);
    }
    validate::turn_shape(&request.spans, limits, &mut bad);
    validate::finish(bad)?;
    let turn = convert::turn_from_pb(request.spans);
    validate::token_counts(&turn, tokenizer)?;
    Ok(turn)
}

/// Count: each span's tokens, as the broker counts them.
fn count(turn: &[TurnSpan], tokenizer: TokenizerKind, counter: &dyn TokenCounter) -> Vec<u32> {
    turn.iter()
        .map(|span| span.tokens(tokenizer, counter))
        .collect()
}

/// Classify: each span labelled as the broker labels it, then settled
/// under the session's mode as the session settles it, and handed on as
/// classified, so that the session does not classify it again inside the
/// plan stage.
fn classify_turn(turn: Vec<TurnSpan>, counts: Vec<u32>, config: &SessionConfig) -> Vec<Incoming> {
    turn.into_iter()
        .zip(counts)
        .map(|(input, tokens)| {
            let mut settled = input.labelled(tokens).settle(config);
            settled.unclassified = false;
            settled
        })
        .collect()
}

/// Checks, once per size and outside the clock, that a turn settled here
/// decides the same change as the same turn left to the session.
fn check_settled(session: &mut Session, limits: &Limits) -> Result<(), Failure> {
    let config = session.record.config.clone();
    let config = &config;
    if config.classifier == ClassifierMode::CallerOnly {
        return Err("the split needs a classifier mode other than CALLER_ONLY".into());
    }
    let tokenizer = config.tokenizer;
    let counter = tokens::counter(tokenizer);
    let now = now_ms();
    for k in 0..MESSAGES.len() {
        let turn = parse(&request(k), limits, tokenizer)?;
        let counts = count(&turn, tokenizer, counter);
        let settled = classify_turn(turn.clone(), counts.clone(), config);
        let unsettled: Vec<Incoming> = turn
            .into_iter()
            .zip(counts)
            .map(|(input, tokens)| input.labelled(tokens))
            .collect();
        let ours = session.admit(settled, now, counter);
        let theirs = session.admit(unsettled, now, counter);
        if ours != theirs {
            return Err(format!(
                "message {k}: the turn settled by the bench decides another change than the session's own"
            )
            .into());
        }
    }
    Ok(())
}

/// Admits the subject's next message, timing each stage, and records
/// the times when `record`.
async fn admit(
    subject: &mut Subject,
    requests: &[Vec<u8>],
    limits: &Limits,
    record: bool,
) -> Result<(), Failure> {
    let (n, k) = (subject.n, subject.admitted);
    let (store, session) = (&subject.store, &mut subject.session);
    let tokenizer = session.record.config.tokenizer;
    let bytes = &requests[k % requests.len()];

    let t0 = Instant::now();
    let turn = parse(bytes, limits, tokenizer);
    let t1 = Instant::now();
    let turn = turn?;
    let counter = tokens::counter(tokenizer);
    let counts = count(&turn, tokenizer, counter);
    let t2 = Instant::now();
    let incoming = classify_turn(turn, counts, &session.record.config);
    let t3 = Instant::now();
    let outcome = session.admit(incoming, now_ms(), counter);
    let t4 = Instant::now();
    let change: Change =
        outcome.map_err(|r| format!("{n} spans: the admission was refused: {r:?}"))?;
    let ack = store
        .write(WriteOp::Change {
            change: change.clone(),
            keys: Vec::new(),
        })
        .await;
    let t5 = Instant::now();
    let ack = ack?;
    session.apply(&change);
    let t6 = Instant::now();
    let after = session.record.clone();
    let marker = change.marker.map(|mut marker| {
        marker.seq = ack.marker_seq.unwrap_or(0);
        marker
    });
    let response = pb::AdmitResponse {
        spans: change
            .append
            .iter()
            .map(|s| span_to_pb(s, SpanState::Live, 0.0))
            .collect(),
        compaction: marker.as_ref().map(marker_to_pb),
        totals: Some(totals_to_pb(&after)),
        revision: after.revision,
        turn: after.turns,
        replayed: false,
    };
    let encoded = response.encode_to_vec();
    let t7 = Instant::now();

    std::hint::black_box(encoded);
    subject.admitted += 1;
    if response.compaction.is_some() || session.spans.len() != n + subject.admitted {
        return Err(format!(
            "{n} spans: admission {k} compacted the session; the window is too small"
        )
        .into());
    }
    if !record {
        return Ok(());
    }
    if response
        .spans
        .iter()
        .any(|s| s.span_class == pb::SpanClass::Constraint as i32)
    {
        subject.constraints += 1;
    }
    let bounds = [t0, t1, t2, t3, t4, t5, t6, t7];
    for (samples, pair) in subject.stages.iter_mut().zip(bounds.windows(2)) {
        samples.push(pair[1] - pair[0]);
    }
    subject.totals.push(t7 - t0);
    Ok(())
}

/// The table's header.
pub const HEADER: &str = "| live spans | live spans at the end | parse µs | count µs | classify µs | plan µs | write µs | apply µs | encode µs | total µs | total p99 µs |\n|---|---|---|---|---|---|---|---|---|---|---|";

/// Prints the section: the table, how it was measured, and the ratio of
/// the largest session's total to the smallest's.
pub fn print(rows: &[SplitRow], plan: &SplitPlan) {
    println!();
    println!("admission split, in process: one short user message per admission, µs per admission");
    println!("{HEADER}");
    for row in rows {
        let stages: Vec<String> = row.stages.iter().map(|us| format!("{us:.2}")).collect();
        println!(
            "| {} | {} | {} | {:.2} | {:.2} |",
            row.spans,
            row.spans_after,
            stages.join(" | "),
            row.total.p50,
            row.total.p99,
        );
    }
    println!();
    println!(
        "medians of {} admissions per size after {} unrecorded, interleaved {} at a time per size, on one thread: {} short user messages in turn, unlabelled (the classifier runs under the session's MODEL mode), admitted in process to a session loaded from a store with relaxed durability, window large enough that nothing compacts; total is the sum of the stages per admission.",
        plan.admissions,
        plan.warmup,
        plan.chunk,
        MESSAGES.len(),
    );
    println!(
        "wall-clock time only: the bench does not depend on libc, so the thread's CPU time is not measured, and write includes the waits for the store's writer and flusher threads."
    );
    for row in rows {
        println!(
            "- {} spans: generated, written by {} store writes and loaded in {:.1} s; {} of {} recorded messages classified as constraints",
            row.spans, row.fill_writes, row.fill_seconds, row.constraints, plan.admissions
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        println!(
            "flat: total p50 at {} live spans ÷ at {}: {:.2} µs / {:.2} µs = {:.2}",
            last.spans,
            first.spans,
            last.total.p50,
            first.total.p50,
            last.total.p50 / first.total.p50.max(f64::MIN_POSITIVE),
        );
    }
}
