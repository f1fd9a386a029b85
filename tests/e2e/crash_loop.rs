//! A crash loop under load: several sessions admit turns, bursts,
//! constraints, pins and unpins concurrently while watchers follow the
//! marker log; the daemon is killed with `kill -9` at a random moment of
//! each cycle and restarted on the same data directory. Afterwards every
//! acknowledged operation is checked against the restarted daemon: spans
//! live or archived by a committed marker, constraints still pinned, the
//! marker log contiguous and exactly what the watchers received, and no
//! session half-compacted.
//!
//! The run is driven by a seeded xorshift generator; set
//! `CTXBROKER_CRASH_SEED` to replay another schedule. The seed is printed
//! with the summary line.

// Messages are built with `..Default::default()` even where every field is
// given today, so that fields the contract gains keep this compiling.
#![allow(clippy::needless_update)]

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use pb::Role;
use pb::context_broker_client::ContextBrokerClient;
use tokio::sync::watch;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use crate::support::*;

type Client = ContextBrokerClient<Channel>;

/// The schedule's seed, unless `CTXBROKER_CRASH_SEED` says otherwise.
const SEED: u64 = 0x00c0_ffee_d00d_5eed;
/// Sessions under load.
const SESSIONS: usize = 6;
/// Kill-and-restart cycles.
const CYCLES: usize = 5;
/// Acknowledged constraints a session keeps pinned at most; beyond, the
/// admitter unpins.
const MAX_PINNED: usize = 4;
/// The longest any one request or wait may take.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest the checks after the run may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest the daemon may take to come back, as the load sees it.
const BACK_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// xorshift64*: small, seeded, good enough to pick a schedule.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Never zero: xorshift stays at zero forever.
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1);
        for _ in 0..4 {
            rng.next();
        }
        rng
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// The daemon's life as the load sees it: `kills` is raised before each
/// `kill -9`, `restarts` once the new process answers. The daemon is up
/// when they are equal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Phase {
    kills: u64,
    restarts: u64,
}

/// Counts over the whole run, and every violation found along the way.
#[derive(Debug, Default)]
struct Tally {
    /// Requests answered with a success.
    acked: u64,
    /// Requests answered with a refusal from the daemon (typed error).
    refused: BTreeMap<String, u64>,
    /// Requests that got no answer (the daemon died under them).
    unacked: u64,
    /// Of those, requests sent and failed while the daemon was up (a
    /// connection the client finds broken only after the restart).
    unacked_while_up: u64,
    /// Markers with compressed constraints seen in replies.
    compressions: u64,
    violations: Vec<String>,
}

/// What the run shares between the controller and its tasks.
struct Shared {
    phase: watch::Sender<Phase>,
    /// Acknowledged operations so far; the controller kills behind them.
    acks: watch::Sender<u64>,
    stop_load: watch::Sender<bool>,
    stop_watch: watch::Sender<bool>,
    tally: Mutex<Tally>,
}

impl Shared {
    fn violation(&self, what: String) {
        self.tally.lock().unwrap().violations.push(what);
    }

    /// Waits, bounded, until the daemon is up again after a kill.
    async fn back_up(&self) -> bool {
        let mut rx = self.phase.subscribe();
        let up = tokio::time::timeout(BACK_UP_TIMEOUT, rx.wait_for(|p| p.restarts >= p.kills));
        matches!(up.await, Ok(Ok(_)))
    }
}

/// What became of one request.
enum Reply<T> {
    /// Acknowledged with a success.
    Done(T),
    /// Acknowledged with a refusal: nothing changed.
    Refused(tonic::Status),
    /// No answer: it may or may not have taken effect.
    Lost,
}

/// An error that is not the daemon's answer but the connection's end: no
/// `ErrorInfo` (every daemon error carries one) and a transport code.
fn is_lost(status: &tonic::Status) -> bool {
    status.get_error_details().error_info().is_none()
        && matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
        )
}

fn reason_of(status: &tonic::Status) -> String {
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

/// Runs one request with a bound, and sorts its outcome.
async fn call<T>(
    shared: &Shared,
    what: &str,
    request: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Reply<T> {
    let before = *shared.phase.borrow();
    let outcome = tokio::time::timeout(RPC_TIMEOUT, request).await;
    let after = *shared.phase.borrow();
    match outcome {
        Ok(Ok(reply)) => {
            shared.tally.lock().unwrap().acked += 1;
            shared.acks.send_modify(|n| *n += 1);
            Reply::Done(reply.into_inner())
        }
        Ok(Err(status)) if is_lost(&status) => {
            {
                let mut tally = shared.tally.lock().unwrap();
                tally.unacked += 1;
                if before == after && before.kills == before.restarts {
                    tally.unacked_while_up += 1;
                }
            }
            if !shared.back_up().await {
                shared.violation(format!(
                    "{what}: the daemon was not back within {BACK_UP_TIMEOUT:?}"
                ));
            }
            Reply::Lost
        }
        Ok(Err(status)) => {
            let key = format!("{what}: {:?} {}", status.code(), reason_of(&status));
            *shared.tally.lock().unwrap().refused.entry(key).or_default() += 1;
            Reply::Refused(status)
        }
        Err(_) => {
            shared.tally.lock().unwrap().unacked += 1;
            shared.violation(format!("{what}: no answer within {RPC_TIMEOUT:?}"));
            Reply::Lost
        }
    }
}

/// What happened to a span's pin, in the order the admitter did it.
#[derive(Debug, Clone)]
enum PinEvent {
    /// Pin acknowledged.
    Pinned,
    /// Pin sent, no answer.
    PinUnknown,
    /// Unpin acknowledged, with this reason.
    Unpinned(String),
    /// Unpin sent with this reason, no answer: the log tells (an unpin and
    /// its UNPIN marker are one write).
    UnpinUnknown(String),
}

/// One acknowledged span.
#[derive(Debug, Clone)]
struct AckedSpan {
    /// The text as admitted.
    text: String,
    /// The class the reply gave.
    class: pb::SpanClass,
    /// The predicate's required terms, from the reply (or the pin reply).
    terms: Vec<String>,
    history: Vec<PinEvent>,
}

/// Where a span should stand, as far as acknowledged operations tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Constraint,
    Narrative,
    EitherClass,
}

impl AckedSpan {
    /// Replays the pin history; `unpinned` says whether an unpin with that
    /// reason is in the marker log.
    fn expect(&self, unpinned: impl Fn(&str) -> bool) -> Expect {
        let mut state = if self.class == pb::SpanClass::Constraint {
            Expect::Constraint
        } else {
            Expect::Narrative
        };
        for event in &self.history {
            state = match (event, state) {
                (PinEvent::Pinned, _) => Expect::Constraint,
                (PinEvent::PinUnknown, Expect::Constraint) => Expect::Constraint,
                (PinEvent::PinUnknown, _) => Expect::EitherClass,
                (PinEvent::Unpinned(_), _) => Expect::Narrative,
                (PinEvent::UnpinUnknown(reason), _) => {
                    if unpinned(reason) {
                        Expect::Narrative
                    } else {
                        Expect::Constraint
                    }
                }
            };
        }
        state
    }
}

/// Everything acknowledged for one session.
#[derive(Debug, Default)]
struct SessionLog {
    spans: BTreeMap<u64, AckedSpan>,
    /// Markers carried in replies (admissions and unpins).
    markers: Vec<pb::CompactionMarker>,
    /// Sequences of the ABORTED markers that refusals named.
    aborted: Vec<u64>,
    /// The texts of turns that got no answer: each may have landed, whole
    /// or not at all.
    unacked_turns: Vec<Vec<String>>,
}

/// One connection of a watcher: where it started and what it received.
#[derive(Debug, Clone, Default)]
struct Segment {
    from: u64,
    markers: Vec<pb::CompactionMarker>,
}

/// A watcher's whole record.
#[derive(Debug, Default)]
struct WatchLog {
    segments: Vec<Segment>,
    /// How each connection ended.
    breaks: Vec<String>,
}

/// One session under load.
struct Load {
    id: String,
    budget: u32,
    shared: Arc<Shared>,
    log: Arc<Mutex<SessionLog>>,
}

const TOPICS: [&[&str]; 3] = [
    &["ingest", "pipeline", "src/ingest/reader.rs", "backpressure"],
    &["billing", "invoice", "ledger", "migrations/0042_ledger.sql"],
    &["deploy", "staging", "k8s/staging/app.yaml", "rollout"],
];
const VERBS: [&str; 5] = ["delete", "overwrite", "rename", "truncate", "expose"];
const THINGS: [&str; 5] = ["bucket", "namespace", "table", "secret", "branch"];

impl Load {
    async fn run(self, mut client: Client, seed: u64) {
        let Load {
            id,
            budget,
            shared,
            log,
        } = self;
        let mut rng = Rng::new(seed);
        let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize];
        // Acknowledged constraints, oldest first.
        let mut pinned: VecDeque<u64> = VecDeque::new();
        // Recent small acknowledged narrative, with a term of its text.
        let mut pinnable: VecDeque<(u64, String)> = VecDeque::new();
        let stop = shared.stop_load.subscribe();
        let mut turn = 0u64;
        while !*stop.borrow() {
            turn += 1;
            let roll = rng.below(100);
            if (pinned.len() >= MAX_PINNED && roll < 35) || (roll < 4 && !pinned.is_empty()) {
                let at = if pinned.len() >= MAX_PINNED {
                    0
                } else {
                    rng.below(pinned.len() as u64) as usize
                };
                let span_id = pinned.remove(at).unwrap();
                unpin(&shared, &log, &mut client, &id, span_id, turn).await;
            } else if roll < 12 && !pinnable.is_empty() && pinned.len() < MAX_PINNED {
                let at = rng.below(pinnable.len() as u64) as usize;
                let (span_id, term) = pinnable.remove(at).unwrap();
                if pin(&shared, &log, &mut client, &id, span_id, &term).await {
                    pinned.push_back(span_id);
                }
            } else {
                let (inputs, small) = if roll < 22 {
                    (vec![constraint(&id, turn, &mut rng)], false)
                } else if roll < 30 {
                    // A burst: a tool result of some 30 to 80 % of the
                    // budget (prose runs at about 1.3 tokens a word).
                    let words = u64::from(budget) * rng.between(30, 80) / 130;
                    let text = format!(
                        "{id} turn {turn} tool output:\n{}",
                        prose(seed ^ turn, topic, words as usize)
                    );
                    (vec![span(Role::Tool, &text)], false)
                } else {
                    let mut inputs = Vec::new();
                    for part in 0..rng.between(1, 2) {
                        let role = *rng.pick(&[Role::Assistant, Role::Tool, Role::Assistant]);
                        let words = rng.between(15, 60) as usize;
                        let text = format!(
                            "{id} turn {turn}.{part} ref {id}-t{turn}p{part}: {}",
                            prose(seed.wrapping_add(turn * 3 + part), topic, words)
                        );
                        inputs.push(span(role, &text));
                    }
                    (inputs, true)
                };
                let admitted = admit_turn(&shared, &log, &mut client, &id, budget, inputs).await;
                for (span_id, class, text) in admitted {
                    if class == pb::SpanClass::Constraint {
                        pinned.push_back(span_id);
                    } else if small {
                        let term = text
                            .split(' ')
                            .find(|w| w.starts_with(&format!("{id}-t")))
                            .map(|w| w.trim_end_matches(':').to_owned());
                        if let Some(term) = term {
                            pinnable.push_back((span_id, term));
                            if pinnable.len() > 4 {
                                pinnable.pop_front();
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A constraint as a user would type it; some wordy, some terse.
fn constraint(id: &str, turn: u64, rng: &mut Rng) -> pb::SpanInput {
    let verb = rng.pick(&VERBS);
    let thing = rng.pick(&THINGS);
    let text = if rng.below(2) == 0 {
        format!("Never {verb} the `{id}-c{turn}` {thing}; stage only.")
    } else {
        format!(
            "Never, whatever the task turns out to be and however urgent it may look at the time, {verb} anything at all in the `{id}-c{turn}` {thing}; ask the on-call lead first."
        )
    };
    span(Role::User, &text)
}

/// Admits one turn; returns the acknowledged spans (id, class, text).
async fn admit_turn(
    shared: &Shared,
    log: &Mutex<SessionLog>,
    client: &mut Client,
    id: &str,
    budget: u32,
    inputs: Vec<pb::SpanInput>,
) -> Vec<(u64, pb::SpanClass, String)> {
    let texts: Vec<String> = inputs.iter().map(|s| s.text.clone()).collect();
    let request = pb::AdmitRequest {
        session_id: id.into(),
        spans: inputs,
        ..Default::default()
    };
    let reply = match call(shared, "Admit", client.admit(request)).await {
        Reply::Done(reply) => reply,
        Reply::Refused(status) => {
            if let Some(seq) = status
                .get_error_details()
                .error_info()
                .and_then(|i| i.metadata.get("marker_seq").cloned())
                .and_then(|s| s.parse::<u64>().ok())
            {
                log.lock().unwrap().aborted.push(seq);
            }
            return Vec::new();
        }
        Reply::Lost => {
            log.lock().unwrap().unacked_turns.push(texts);
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    if reply.spans.len() != texts.len() {
        shared.violation(format!(
            "{id}: admitted {} spans, the reply has {}",
            texts.len(),
            reply.spans.len()
        ));
        return out;
    }
    let totals = reply.totals.unwrap_or_default();
    if totals.live_tokens > budget {
        shared.violation(format!(
            "{id}: live {} over the budget {budget} after turn {}",
            totals.live_tokens, reply.turn
        ));
    }
    let first = reply.spans[0].span_id;
    if reply
        .spans
        .iter()
        .enumerate()
        .any(|(i, s)| s.span_id != first + i as u64)
    {
        shared.violation(format!(
            "{id}: one turn's span ids are not consecutive: {:?}",
            reply.spans.iter().map(|s| s.span_id).collect::<Vec<_>>()
        ));
    }
    let mut log = log.lock().unwrap();
    for (text, span) in texts.into_iter().zip(reply.spans) {
        let class = span.span_class();
        if text.starts_with("Never") && class != pb::SpanClass::Constraint {
            shared.violation(format!(
                "{id}: span {} {text:?} admitted as {class:?}",
                span.span_id
            ));
        }
        let terms = span
            .predicate
            .as_ref()
            .map(|p| p.required_terms.clone())
            .unwrap_or_default();
        out.push((span.span_id, class, text.clone()));
        let previous = log.spans.insert(
            span.span_id,
            AckedSpan {
                text,
                class,
                terms,
                history: Vec::new(),
            },
        );
        if previous.is_some() {
            shared.violation(format!("{id}: span id {} acknowledged twice", span.span_id));
        }
    }
    if let Some(marker) = reply.compaction {
        if !marker.compressed_span_ids.is_empty() {
            shared.tally.lock().unwrap().compressions += 1;
        }
        log.markers.push(marker);
    }
    out
}

/// Pins a narrative span by a term of its text; true when acknowledged.
async fn pin(
    shared: &Shared,
    log: &Mutex<SessionLog>,
    client: &mut Client,
    id: &str,
    span_id: u64,
    term: &str,
) -> bool {
    let request = pb::PinRequest {
        session_id: id.into(),
        span_id,
        predicate: Some(pb::Predicate {
            modality: pb::Modality::Requirement as i32,
            required_terms: vec![term.to_owned()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let outcome = call(shared, "Pin", client.pin(request)).await;
    let mut log = log.lock().unwrap();
    let Some(acked) = log.spans.get_mut(&span_id) else {
        shared.violation(format!("{id}: pinned span {span_id} was never admitted"));
        return false;
    };
    match outcome {
        Reply::Done(reply) => {
            let span = reply.span.unwrap_or_default();
            if span.span_class() != pb::SpanClass::Constraint || span.span_id != span_id {
                shared.violation(format!(
                    "{id}: Pin({span_id}) answered span {} as {:?}",
                    span.span_id,
                    span.span_class()
                ));
            }
            acked.terms = span.predicate.map(|p| p.required_terms).unwrap_or_default();
            acked.history.push(PinEvent::Pinned);
            true
        }
        // Refused (the span was evicted meanwhile): nothing changed.
        Reply::Refused(_) => false,
        Reply::Lost => {
            acked.history.push(PinEvent::PinUnknown);
            false
        }
    }
}

/// Releases a constraint the admitter knows to be pinned.
async fn unpin(
    shared: &Shared,
    log: &Mutex<SessionLog>,
    client: &mut Client,
    id: &str,
    span_id: u64,
    turn: u64,
) {
    let reason = format!("crash loop releases {id} span {span_id} at turn {turn}.");
    let request = pb::UnpinRequest {
        session_id: id.into(),
        span_id,
        actor: "crash-loop".into(),
        reason: reason.clone(),
        ..Default::default()
    };
    let outcome = call(shared, "Unpin", client.unpin(request)).await;
    let mut log = log.lock().unwrap();
    let event = match outcome {
        Reply::Done(reply) => {
            let span = reply.span.unwrap_or_default();
            if span.span_class() != pb::SpanClass::Narrative {
                shared.violation(format!(
                    "{id}: Unpin({span_id}) answered {:?}",
                    span.span_class()
                ));
            }
            match reply.marker {
                Some(marker) => {
                    if marker.trigger() != pb::CompactionTrigger::Unpin
                        || !marker.detail.contains(&reason)
                    {
                        shared.violation(format!("{id}: Unpin({span_id}) marker {marker:?}"));
                    }
                    log.markers.push(marker);
                }
                None => shared.violation(format!("{id}: Unpin({span_id}) without a marker")),
            }
            PinEvent::Unpinned(reason)
        }
        Reply::Refused(status) => {
            // The admitter unpins only what it knows is pinned: a
            // constraint is never evicted, so a refusal means it lost one.
            shared.violation(format!(
                "{id}: Unpin of acknowledged constraint {span_id} refused: {:?} {}",
                status.code(),
                status.message()
            ));
            return;
        }
        Reply::Lost => PinEvent::UnpinUnknown(reason),
    };
    match log.spans.get_mut(&span_id) {
        Some(acked) => acked.history.push(event),
        None => shared.violation(format!("{id}: unpinned span {span_id} was never admitted")),
    }
}

/// Follows the marker log from 1, resuming at last seen + 1 whenever the
/// stream breaks, until told to stop.
async fn watcher(
    name: String,
    mut client: Client,
    filter: Vec<String>,
    shared: Arc<Shared>,
    log: Arc<Mutex<WatchLog>>,
    last_seen: watch::Sender<u64>,
) {
    let mut stop = shared.stop_watch.subscribe();
    let mut from = 1u64;
    loop {
        let mut attempts = 0;
        // Read before the request: a break with no kill since is the
        // daemon's doing.
        let opened = *shared.phase.borrow();
        let mut stream = loop {
            if *stop.borrow() {
                return;
            }
            attempts += 1;
            let request = pb::WatchCompactionsRequest {
                from_seq: from,
                session_ids: filter.clone(),
                ..Default::default()
            };
            match tokio::time::timeout(RPC_TIMEOUT, client.watch_compactions(request)).await {
                Ok(Ok(stream)) => break stream.into_inner(),
                Ok(Err(status)) if is_lost(&status) && attempts < 20 => {
                    if !shared.back_up().await {
                        shared.violation(format!("{name}: the daemon did not come back"));
                        return;
                    }
                }
                Ok(Err(status)) => {
                    shared.violation(format!(
                        "{name}: WatchCompactions(from {from}) refused: {status:?}"
                    ));
                    return;
                }
                Err(_) => {
                    shared.violation(format!(
                        "{name}: WatchCompactions(from {from}) did not start within {RPC_TIMEOUT:?}"
                    ));
                    return;
                }
            }
        };
        log.lock().unwrap().segments.push(Segment {
            from,
            markers: Vec::new(),
        });
        loop {
            let next = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                next = stream.message() => next,
            };
            match next {
                Ok(Some(event)) => {
                    if let Some(pb::watch_compactions_response::Event::Marker(marker)) = event.event
                    {
                        let seq = marker.seq;
                        log.lock()
                            .unwrap()
                            .segments
                            .last_mut()
                            .unwrap()
                            .markers
                            .push(marker);
                        from = seq + 1;
                        last_seen.send_replace(seq);
                    }
                }
                Ok(None) => {
                    log.lock().unwrap().breaks.push("ended".into());
                    break;
                }
                Err(status) => {
                    log.lock()
                        .unwrap()
                        .breaks
                        .push(format!("{:?}", status.code()));
                    break;
                }
            }
        }
        if *shared.phase.borrow() == opened {
            shared.violation(format!(
                "{name}: the stream from {} ended with no kill: {:?}",
                log.lock().unwrap().segments.last().map_or(0, |s| s.from),
                log.lock().unwrap().breaks.last()
            ));
        }
        if !shared.back_up().await {
            shared.violation(format!("{name}: the daemon did not come back"));
            return;
        }
    }
}

async fn get_span(client: &mut Client, id: &str, span_id: u64) -> Result<pb::Span, tonic::Status> {
    let request = pb::GetSpanRequest {
        session_id: id.into(),
        span_id,
        ..Default::default()
    };
    let reply = tokio::time::timeout(RPC_TIMEOUT, client.get_span(request))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("GetSpan timed out"))??;
    reply
        .into_inner()
        .span
        .ok_or_else(|| tonic::Status::internal("GetSpan without a span"))
}

/// Spans read back by id, each read once.
struct SpanReader {
    client: Client,
    read: HashMap<(String, u64), Result<pb::Span, String>>,
    /// Set when the daemon stopped answering: later reads fail at once
    /// rather than each waiting out its timeout.
    gone: Option<String>,
}

impl SpanReader {
    fn new(client: Client) -> SpanReader {
        SpanReader {
            client,
            read: HashMap::new(),
            gone: None,
        }
    }

    async fn get(&mut self, id: &str, span_id: u64) -> Result<pb::Span, String> {
        if let Some(gone) = &self.gone {
            return Err(gone.clone());
        }
        let key = (id.to_owned(), span_id);
        if let Some(read) = self.read.get(&key) {
            return read.clone();
        }
        let read = get_span(&mut self.client, id, span_id).await;
        let read = read.map_err(|s| {
            let e = format!("{:?}: {}", s.code(), s.message());
            if is_lost(&s) || s.code() == Code::DeadlineExceeded {
                self.gone = Some(format!("the daemon stopped answering ({e})"));
            }
            e
        });
        self.read.insert(key, read.clone());
        read
    }
}

/// The whole log, read by a replay from 0.
async fn full_log(client: &mut Client) -> Vec<pb::CompactionMarker> {
    tokio::time::timeout(RPC_TIMEOUT, watch_replay(client, 0))
        .await
        .expect("the log replays within the bound")
        .1
}

/// The live contexts and the log, read so that no marker was committed
/// between them (background compactions may still be finishing).
async fn settled(
    client: &mut Client,
    ids: &[String],
) -> (Vec<pb::CompactionMarker>, Vec<pb::GetContextResponse>) {
    let mut log = full_log(client).await;
    for _ in 0..20 {
        let mut contexts = Vec::new();
        for id in ids {
            contexts.push(
                tokio::time::timeout(RPC_TIMEOUT, context(client, id))
                    .await
                    .unwrap(),
            );
        }
        let again = full_log(client).await;
        if again.len() == log.len() {
            return (again, contexts);
        }
        log = again;
    }
    panic!("the marker log kept growing with the load stopped");
}

/// The checks run against the restarted daemon once the load has stopped.
/// Every failure is collected, none stops the others.
struct Checker {
    /// The whole marker log.
    markers: Vec<pb::CompactionMarker>,
    /// Which committed marker evicted each (session, span).
    evicted_by: HashMap<(String, u64), u64>,
    spans: SpanReader,
    client: Client,
    violations: Vec<String>,
    /// Failures not listed because the daemon had stopped answering.
    suppressed: usize,
    /// Spans of turns that got no answer and landed all the same.
    landed: usize,
}

impl Checker {
    fn fail(&mut self, what: String) {
        if self.spans.gone.is_none() {
            self.violations.push(what);
        } else if self.suppressed == 0 {
            self.violations.push(what);
            self.suppressed = 1;
        } else {
            self.suppressed += 1;
        }
    }

    fn logged(&self, seq: u64) -> Option<&pb::CompactionMarker> {
        let at = usize::try_from(seq.checked_sub(1)?).ok()?;
        self.markers.get(at).filter(|m| m.seq == seq)
    }

    /// Check 3, the log: contiguous from 1, each sequence once, each
    /// session's own count contiguous too; no span evicted twice.
    fn log(&mut self) {
        let mut failures = Vec::new();
        if let Some((i, m)) = self
            .markers
            .iter()
            .enumerate()
            .find(|(i, m)| m.seq != *i as u64 + 1)
        {
            failures.push(format!("log: position {i} holds seq {}", m.seq));
        }
        let mut per_session: HashMap<&str, u64> = HashMap::new();
        for m in &self.markers {
            let n = per_session.entry(m.session_id.as_str()).or_default();
            *n += 1;
            if m.session_seq != *n {
                failures.push(format!(
                    "log: marker {} of {} has session_seq {}, want {n}",
                    m.seq, m.session_id, m.session_seq
                ));
            }
        }
        for m in &self.markers {
            if m.outcome() != pb::CompactionOutcome::Committed {
                continue;
            }
            for id in &m.evicted_span_ids {
                let key = (m.session_id.clone(), *id);
                if let Some(first) = self.evicted_by.insert(key, m.seq) {
                    failures.push(format!(
                        "log: {} span {id} evicted by both {first} and {}",
                        m.session_id, m.seq
                    ));
                }
            }
        }
        self.violations.extend(failures);
    }

    /// Check 3, a watcher: every marker it received equals the log's, and
    /// every connection received exactly the log's markers (matching its
    /// filter) from its resume point on, in order, once.
    fn watcher(&mut self, name: &str, filter: &[String], log: &WatchLog) {
        let matching: Vec<&pb::CompactionMarker> = self
            .markers
            .iter()
            .filter(|m| filter.is_empty() || filter.contains(&m.session_id))
            .collect();
        let mut failures = Vec::new();
        let mut resume_at = 1;
        let mut received = Vec::new();
        for (k, segment) in log.segments.iter().enumerate() {
            if segment.from != resume_at {
                failures.push(format!(
                    "{name}: connection {k} resumed from {}, want {resume_at}",
                    segment.from
                ));
            }
            let from_log = matching.iter().filter(|m| m.seq >= segment.from);
            for (j, (got, want)) in segment.markers.iter().zip(from_log).enumerate() {
                if got != *want {
                    let what = if got.seq == want.seq {
                        format!("differs: got {got:?}, logged {want:?}")
                    } else {
                        format!("the log has seq {} next", want.seq)
                    };
                    failures.push(format!(
                        "{name}: connection {k} item {j} is seq {}: {what}",
                        got.seq
                    ));
                    break;
                }
            }
            if let Some(last) = segment.markers.last() {
                resume_at = last.seq + 1;
            }
            received.extend(segment.markers.iter().map(|m| m.seq));
        }
        let want: Vec<u64> = matching
            .iter()
            .map(|m| m.seq)
            .take_while(|&s| s < resume_at)
            .collect();
        if received != want {
            failures.push(format!(
                "{name}: received {} markers in all, want the log's {} below {resume_at}",
                received.len(),
                want.len()
            ));
        }
        self.violations.extend(failures);
    }

    /// Markers carried in acknowledged replies, and the ABORTED markers
    /// that refusals named, are in the log as acknowledged.
    fn replies(&mut self, id: &str, log: &SessionLog) {
        let mut failures = Vec::new();
        for m in &log.markers {
            match self.logged(m.seq) {
                Some(logged) if logged == m => {}
                Some(logged) => failures.push(format!(
                    "{id}: acknowledged marker {} differs from the log's: {m:?} vs {logged:?}",
                    m.seq
                )),
                None => failures.push(format!(
                    "{id}: acknowledged marker {} is not in the log",
                    m.seq
                )),
            }
        }
        for &seq in &log.aborted {
            match self.logged(seq) {
                Some(m) if m.session_id == id && m.outcome() == pb::CompactionOutcome::Aborted => {}
                other => failures.push(format!(
                    "{id}: a refusal named ABORTED marker {seq}; the log has {other:?}"
                )),
            }
        }
        self.violations.extend(failures);
    }

    /// Check 4, not half-compacted: the spans add up to the totals, under
    /// the budget; nothing a committed marker evicted is live; every
    /// summary a committed marker wrote is live or archived by a marker.
    async fn totals(&mut self, id: &str, ctx: &pb::GetContextResponse, budget: u32) {
        let totals = ctx.totals.unwrap_or_default();
        let live: BTreeSet<u64> = ctx.spans.iter().map(|s| s.span_id).collect();
        if live.len() != ctx.spans.len() {
            self.fail(format!("{id}: a span id appears twice in the context"));
        }
        let sum: u32 = ctx.spans.iter().map(|s| s.tokens).sum();
        let pinned: u32 = ctx
            .spans
            .iter()
            .filter(|s| s.span_class() == pb::SpanClass::Constraint)
            .map(|s| s.tokens)
            .sum();
        if (sum, pinned, ctx.spans.len())
            != (
                totals.live_tokens,
                totals.pinned_tokens,
                totals.live_spans as usize,
            )
        {
            self.fail(format!(
                "{id}: spans sum to {sum} tokens ({pinned} pinned) in {} spans; totals {totals:?}",
                ctx.spans.len()
            ));
        }
        if sum > totals.budget_tokens || totals.budget_tokens != budget {
            self.fail(format!(
                "{id}: live {sum}, budget {} (created with {budget})",
                totals.budget_tokens
            ));
        }
        if self.spans.gone.is_none() {
            match tokio::time::timeout(RPC_TIMEOUT, session(&mut self.client, id)).await {
                Ok(record) if record.totals == ctx.totals && record.revision == ctx.revision => {}
                Ok(record) => self.fail(format!(
                    "{id}: GetSession {:?} at revision {} vs GetContext {:?} at {}",
                    record.totals, record.revision, ctx.totals, ctx.revision
                )),
                Err(_) => {
                    self.spans.gone = Some("the daemon stopped answering (GetSession)".into());
                    self.fail(format!("{id}: GetSession timed out"));
                }
            }
        }
        let committed: Vec<(u64, Vec<u64>, Option<u64>)> = self
            .markers
            .iter()
            .filter(|m| m.session_id == id && m.outcome() == pb::CompactionOutcome::Committed)
            .map(|m| (m.seq, m.evicted_span_ids.clone(), m.summary_span_id))
            .collect();
        for (seq, evicted, summary) in committed {
            for span_id in evicted.iter().filter(|s| live.contains(s)) {
                self.fail(format!(
                    "{id}: span {span_id} evicted by marker {seq} is live"
                ));
            }
            let Some(summary) = summary.filter(|s| !live.contains(s)) else {
                continue;
            };
            let by = self.evicted_by.get(&(id.to_owned(), summary)).copied();
            match self.spans.get(id, summary).await {
                Ok(s) if s.state() == pb::SpanState::Archived && by == Some(s.archived_by_seq) => {}
                other => self.fail(format!(
                    "{id}: summary {summary} of marker {seq} is not live, evicted by {by:?}, reads {other:?}"
                )),
            }
        }
    }

    /// Nothing that nobody admitted, live or archived. Span ids are given
    /// in order; each one not acknowledged is a summary written by
    /// compaction or a span of a turn that got no answer (in flight at a
    /// kill) and landed — and such a turn landed whole or not at all.
    async fn unacknowledged(&mut self, id: &str, ctx: &pb::GetContextResponse, log: &SessionLog) {
        let live: BTreeMap<u64, &pb::Span> = ctx.spans.iter().map(|s| (s.span_id, s)).collect();
        let unanswered: BTreeSet<&String> = log.unacked_turns.iter().flatten().collect();
        let mut landed = BTreeSet::new();
        let newest = log
            .spans
            .keys()
            .chain(live.keys())
            .copied()
            .max()
            .unwrap_or(0);
        for span_id in (1..=newest).filter(|s| !log.spans.contains_key(s)) {
            let found = match live.get(&span_id) {
                Some(s) => Ok((*s).clone()),
                None => self.spans.get(id, span_id).await,
            };
            match found {
                Ok(s) if s.span_class() == pb::SpanClass::Summary => {}
                Ok(s) if unanswered.contains(&s.text) || unanswered.contains(&s.original_text) => {
                    self.landed += 1;
                    landed.insert(s.text);
                    landed.insert(s.original_text);
                }
                Ok(s) => self.fail(format!(
                    "{id}: span {span_id} ({:?}, {:?}) {:?} was never admitted",
                    s.span_class(),
                    s.state(),
                    s.text
                )),
                Err(e) => self.fail(format!(
                    "{id}: span id {span_id}, below the newest {newest}, reads back {e}"
                )),
            }
        }
        for turn in &log.unacked_turns {
            let n = turn.iter().filter(|t| landed.contains(*t)).count();
            if n != 0 && n != turn.len() {
                self.fail(format!(
                    "{id}: an unanswered turn landed in part ({n} of {}): {turn:?}",
                    turn.len()
                ));
            }
        }
    }

    /// Every UNPIN marker is an unpin the admitter sent; each one
    /// acknowledged is in the log once, each unanswered one at most once.
    fn unpins(&mut self, id: &str, log: &SessionLog) {
        let mut sent: Vec<(&str, bool)> = Vec::new();
        for event in log.spans.values().flat_map(|s| &s.history) {
            match event {
                PinEvent::Unpinned(reason) => sent.push((reason, true)),
                PinEvent::UnpinUnknown(reason) => sent.push((reason, false)),
                PinEvent::Pinned | PinEvent::PinUnknown => {}
            }
        }
        let unpin_markers: Vec<&pb::CompactionMarker> = self
            .markers
            .iter()
            .filter(|m| m.session_id == id && m.trigger() == pb::CompactionTrigger::Unpin)
            .collect();
        let mut failures = Vec::new();
        for m in &unpin_markers {
            let asked = sent.iter().filter(|(r, _)| m.detail.contains(r)).count();
            if asked != 1 {
                failures.push(format!(
                    "{id}: UNPIN marker {} matches {asked} unpins sent: {:?}",
                    m.seq, m.detail
                ));
            }
        }
        for (reason, acked) in &sent {
            let n = unpin_markers
                .iter()
                .filter(|m| m.detail.contains(reason))
                .count();
            if n > 1 || (*acked && n != 1) {
                let which = if *acked { "acknowledged" } else { "unanswered" };
                failures.push(format!(
                    "{id}: {which} unpin {reason:?} is in {n} UNPIN markers"
                ));
            }
        }
        self.violations.extend(failures);
    }

    /// Whether the log holds the UNPIN marker of an unpin with `reason`.
    fn unpinned(&self, id: &str, reason: &str) -> bool {
        self.markers.iter().any(|m| {
            m.session_id == id
                && m.trigger() == pb::CompactionTrigger::Unpin
                && m.detail.contains(reason)
        })
    }

    /// Checks 1 and 2: every acknowledged span is live, or archived by the
    /// committed marker that lists it; every acknowledged constraint not
    /// acknowledged-unpinned is live and a constraint, verbatim or
    /// compressed from what was admitted.
    async fn acknowledged(&mut self, id: &str, ctx: &pb::GetContextResponse, log: &SessionLog) {
        let live: BTreeMap<u64, &pb::Span> = ctx.spans.iter().map(|s| (s.span_id, s)).collect();
        for (span_id, acked) in &log.spans {
            let expect = acked.expect(|reason| self.unpinned(id, reason));
            let fetched = match self.spans.get(id, *span_id).await {
                Ok(fetched) => fetched,
                Err(e) => {
                    self.fail(format!("{id}: acknowledged span {span_id} lost: {e}"));
                    continue;
                }
            };
            match live.get(span_id) {
                Some(s) => self.live_span(id, s, &fetched, acked, expect),
                None => self.archived_span(id, &fetched, acked, expect),
            }
        }
    }

    fn live_span(
        &mut self,
        id: &str,
        s: &pb::Span,
        fetched: &pb::Span,
        acked: &AckedSpan,
        expect: Expect,
    ) {
        let span_id = s.span_id;
        if fetched.state() != pb::SpanState::Live {
            self.fail(format!(
                "{id}: span {span_id} is live but GetSpan says {:?}",
                fetched.state()
            ));
        }
        let class = s.span_class();
        let verbatim = s.text == acked.text;
        let compressed = class == pb::SpanClass::Constraint
            && s.original_text == acked.text
            && s.text != acked.text;
        if !verbatim && !compressed {
            self.fail(format!(
                "{id}: live span {span_id} reads {:?} (original {:?}), admitted {:?}",
                s.text, s.original_text, acked.text
            ));
        }
        if compressed {
            let lower = s.text.to_lowercase();
            for term in &acked.terms {
                if !lower.contains(&term.to_lowercase()) {
                    self.fail(format!(
                        "{id}: compressed constraint {span_id} {:?} lost {term:?}",
                        s.text
                    ));
                }
            }
        }
        let fits = match expect {
            Expect::Constraint => class == pb::SpanClass::Constraint,
            Expect::Narrative => class == pb::SpanClass::Narrative,
            Expect::EitherClass => class != pb::SpanClass::Summary,
        };
        if !fits {
            self.fail(format!(
                "{id}: live span {span_id} is {class:?}, want {expect:?} (pins {:?})",
                acked.history
            ));
        }
    }

    fn archived_span(&mut self, id: &str, fetched: &pb::Span, acked: &AckedSpan, expect: Expect) {
        let span_id = fetched.span_id;
        // Check 2: a constraint never leaves the context.
        if expect == Expect::Constraint {
            self.fail(format!(
                "{id}: constraint {span_id} {:?} is not live: {:?} by {} (pins {:?})",
                acked.text,
                fetched.state(),
                fetched.archived_by_seq,
                acked.history
            ));
        }
        // Check 1: archived by the committed marker that lists it.
        let by = self.evicted_by.get(&(id.to_owned(), span_id)).copied();
        if fetched.state() != pb::SpanState::Archived || by != Some(fetched.archived_by_seq) {
            self.fail(format!(
                "{id}: acknowledged span {span_id} is not live; GetSpan says {:?} by {}, the log {by:?}",
                fetched.state(),
                fetched.archived_by_seq
            ));
        }
        if fetched.text != acked.text && fetched.original_text != acked.text {
            self.fail(format!(
                "{id}: archived span {span_id} reads {:?}, admitted {:?}",
                fetched.text, acked.text
            ));
        }
    }

    /// Check 5, the search index: acknowledged spans, live or archived,
    /// are found by the reference their text carries (`ref <id>-t3p0` in
    /// turns, `` `<id>-c3` `` in constraints), which no other span of the
    /// session holds (summaries aside, which carry references as
    /// anchors). The index is written in the transaction that stores
    /// the span, so no kill can leave one without the other. At most the
    /// last 40 of a session are searched, to bound the check's time.
    async fn searchable(&mut self, id: &str, log: &SessionLog) {
        let reference = |text: &str| -> Option<String> {
            let from_ref = text
                .split(' ')
                .find(|w| w.starts_with(&format!("{id}-t")))
                .map(|w| w.trim_end_matches(':').to_owned());
            from_ref.or_else(|| {
                let start = text.find(&format!("`{id}-c"))? + 1;
                let len = text[start..].find('`')?;
                Some(text[start..start + len].to_owned())
            })
        };
        let wanted: Vec<(u64, String)> = log
            .spans
            .iter()
            .rev()
            .filter_map(|(span_id, acked)| reference(&acked.text).map(|r| (*span_id, r)))
            .take(40)
            .collect();
        for (span_id, reference) in wanted {
            // Summaries carry references as anchors, and may rank above
            // the span itself: leave them out.
            let request = pb::SearchSpansRequest {
                session_id: id.into(),
                query: reference.clone(),
                filter: Some(pb::SpanFilter {
                    span_classes: vec![
                        pb::SpanClass::Narrative as i32,
                        pb::SpanClass::Constraint as i32,
                        pb::SpanClass::Protected as i32,
                    ],
                    ..Default::default()
                }),
                page_size: 5,
                ..Default::default()
            };
            let reply = tokio::time::timeout(RPC_TIMEOUT, self.client.search_spans(request)).await;
            match reply {
                Ok(Ok(reply)) => {
                    let hits = reply.into_inner().hits;
                    if hits.first().map(|h| h.span_id) != Some(span_id) {
                        self.fail(format!(
                            "{id}: searching {reference:?} finds {:?}, not span {span_id} first",
                            hits.iter().map(|h| h.span_id).collect::<Vec<_>>()
                        ));
                    }
                }
                Ok(Err(status)) => {
                    self.fail(format!(
                        "{id}: SearchSpans {reference:?} refused: {status:?}"
                    ));
                }
                Err(_) => self.fail(format!("{id}: SearchSpans {reference:?} timed out")),
            }
        }
    }

    /// Every span the log's markers evicted reads back as archived by its
    /// marker.
    async fn archive(&mut self) {
        let evicted: Vec<((String, u64), u64)> = self
            .evicted_by
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for ((id, span_id), seq) in evicted {
            match self.spans.get(&id, span_id).await {
                Ok(s) if s.state() == pb::SpanState::Archived && s.archived_by_seq == seq => {}
                other => self.fail(format!(
                    "{id}: span {span_id} evicted by marker {seq} reads back {other:?}"
                )),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_work_survives_a_crash_loop_under_load() {
    let started = Instant::now();
    let seed = std::env::var("CTXBROKER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    let mut rng = Rng::new(seed);

    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;

    // Three sessions compact only at admission, two also in the
    // background above the soft watermark, one is tight enough that
    // bursts squeeze its constraints.
    let ids: Vec<String> = (0..SESSIONS).map(|i| format!("cl-{i}")).collect();
    let mut budgets = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        let config = match i {
            0..=2 => window(1600),
            3 | 4 => defaults(1600),
            _ => window(700),
        };
        let session = create(&mut client, id, config).await;
        budgets.insert(id.clone(), session.totals.unwrap().budget_tokens);
    }

    let shared = Arc::new(Shared {
        phase: watch::Sender::new(Phase::default()),
        acks: watch::Sender::new(0),
        stop_load: watch::Sender::new(false),
        stop_watch: watch::Sender::new(false),
        tally: Mutex::default(),
    });

    // Watchers: one of everything, one of half the sessions.
    let filters = [
        Vec::new(),
        vec![ids[1].clone(), ids[3].clone(), ids[5].clone()],
    ];
    let mut watchers = Vec::new();
    for (w, filter) in filters.iter().enumerate() {
        let log = Arc::new(Mutex::new(WatchLog::default()));
        let (seen_tx, seen_rx) = watch::channel(0u64);
        let task = tokio::spawn(watcher(
            format!("watcher-{w}"),
            daemon.client().await,
            filter.clone(),
            shared.clone(),
            log.clone(),
            seen_tx,
        ));
        watchers.push((filter.clone(), log, seen_rx, task));
    }

    // Admitters.
    let mut logs = BTreeMap::new();
    let mut admitters = Vec::new();
    for id in &ids {
        let log = Arc::new(Mutex::new(SessionLog::default()));
        logs.insert(id.clone(), log.clone());
        let load = Load {
            id: id.clone(),
            budget: budgets[id],
            shared: shared.clone(),
            log,
        };
        admitters.push(tokio::spawn(load.run(daemon.client().await, rng.next())));
    }

    // The crash loop: let some acknowledgements land, wait a random
    // moment more, kill -9, restart on the same directory.
    let mut acks = shared.acks.subscribe();
    for cycle in 0..CYCLES {
        let target = *acks.borrow() + rng.between(120, 300);
        if tokio::time::timeout(Duration::from_secs(15), acks.wait_for(|&n| n >= target))
            .await
            .is_err()
        {
            shared.violation(format!(
                "cycle {cycle}: the load stalled below {target} acks"
            ));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(250))).await;
        if let Some(status) = daemon.exited() {
            shared.violation(format!(
                "cycle {cycle}: the daemon exited on its own before the kill: {status}"
            ));
        }
        shared.phase.send_modify(|p| p.kills += 1);
        daemon.kill9();
        daemon.restart().await;
        shared.phase.send_modify(|p| p.restarts += 1);
    }
    // The load carries on against the last incarnation, then stops.
    let target = *acks.borrow() + 60;
    if tokio::time::timeout(Duration::from_secs(15), acks.wait_for(|&n| n >= target))
        .await
        .is_err()
    {
        shared.violation("after the last restart the load did not resume".into());
    }
    shared.stop_load.send_replace(true);
    for (id, task) in ids.iter().zip(admitters) {
        match tokio::time::timeout(Duration::from_secs(30), task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => shared.violation(format!("{id}: the admitter failed: {e}")),
            Err(_) => shared.violation(format!("{id}: the admitter did not stop")),
        }
    }
    let load_done = started.elapsed();
    if let Some(status) = daemon.exited() {
        shared.violation(format!(
            "the last daemon exited on its own under load: {status}"
        ));
    }
    // The records, now that nothing writes them.
    let logs: BTreeMap<String, SessionLog> = logs
        .into_iter()
        .map(|(id, log)| (id, std::mem::take(&mut *log.lock().unwrap())))
        .collect();

    let mut client = daemon.client().await;
    let mut violations: Vec<String> = Vec::new();

    // The watchers catch up with the log as it stands with the load
    // stopped, then stop.
    let head = full_log(&mut client).await;
    for (w, (filter, _, seen, _)) in watchers.iter_mut().enumerate() {
        let want = head
            .iter()
            .filter(|m| filter.is_empty() || filter.contains(&m.session_id))
            .map(|m| m.seq)
            .max()
            .unwrap_or(0);
        let reached = tokio::time::timeout(Duration::from_secs(15), seen.wait_for(|&s| s >= want));
        if !matches!(reached.await, Ok(Ok(_))) {
            violations.push(format!(
                "watcher-{w}: stuck at {} below the head {want}",
                *seen.borrow()
            ));
        }
    }
    shared.stop_watch.send_replace(true);
    for (w, (_, _, _, task)) in watchers.iter_mut().enumerate() {
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => violations.push(format!("watcher-{w}: failed: {e}")),
            Err(_) => violations.push(format!("watcher-{w}: did not stop")),
        }
    }

    let mut resumes = 0;
    let mut breaks = Vec::new();
    let watch_logs: Vec<(String, Vec<String>, WatchLog)> = watchers
        .iter()
        .enumerate()
        .map(|(w, (filter, log, _, _))| {
            let log = std::mem::take(&mut *log.lock().unwrap());
            resumes += log.segments.len().saturating_sub(1);
            breaks.extend(log.breaks.iter().cloned());
            (format!("watcher-{w}"), filter.clone(), log)
        })
        .collect();
    let checks = async {
        let (markers, contexts) = settled(&mut client, &ids).await;
        let mut check = Checker {
            markers,
            evicted_by: HashMap::new(),
            spans: SpanReader::new(daemon.client().await),
            client,
            violations,
            suppressed: 0,
            landed: 0,
        };
        check.log();
        for (name, filter, log) in &watch_logs {
            check.watcher(name, filter, log);
        }
        for (id, ctx) in ids.iter().zip(&contexts) {
            let log = &logs[id];
            check.replies(id, log);
            check.totals(id, ctx, budgets[id]).await;
            check.unacknowledged(id, ctx, log).await;
            check.unpins(id, log);
            check.acknowledged(id, ctx, log).await;
            check.searchable(id, log).await;
        }
        check.archive().await;
        check
    };
    let check = tokio::time::timeout(CHECK_TIMEOUT, checks).await;
    let exited = daemon.exited();
    let Ok(mut check) = check else {
        panic!("the checks did not finish within {CHECK_TIMEOUT:?}; the daemon's exit: {exited:?}");
    };
    if let Some(gone) = &check.spans.gone {
        let note = format!(
            "{gone} during the checks (exit status {exited:?}); {} failures after it not listed",
            check.suppressed.saturating_sub(1)
        );
        check.violations.insert(0, note);
    } else if let Some(status) = exited {
        check.fail(format!(
            "the last daemon exited on its own during the checks: {status}"
        ));
    }
    let Checker {
        markers,
        mut violations,
        landed,
        ..
    } = check;
    let acked_spans: usize = logs.values().map(|l| l.spans.len()).sum();

    let tally = std::mem::take(&mut *shared.tally.lock().unwrap());
    violations.extend(tally.violations);
    let committed = markers
        .iter()
        .filter(|m| m.outcome() == pb::CompactionOutcome::Committed)
        .count();
    let soft = markers
        .iter()
        .filter(|m| m.trigger() == pb::CompactionTrigger::SoftWatermark)
        .count();
    let unpins = markers
        .iter()
        .filter(|m| m.trigger() == pb::CompactionTrigger::Unpin)
        .count();
    let refused: u64 = tally.refused.values().sum();
    println!(
        "crash loop: seed {seed}; operations acknowledged {} (refused {refused}), unacknowledged {} ({} failed with the daemon up; {landed} spans of unanswered turns landed), spans acknowledged {acked_spans}; kills {CYCLES}; markers {} ({committed} committed, {} aborted, {soft} soft-watermark, {unpins} unpin, {} compressing); watcher resumes {resumes}; violations = {}; load {:.1} s, total {:.1} s",
        tally.acked,
        tally.unacked,
        tally.unacked_while_up,
        markers.len(),
        markers.len() - committed,
        tally.compressions,
        violations.len(),
        load_done.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    println!("crash loop: refusals {:?}", tally.refused);
    println!("crash loop: watcher stream ends {breaks:?}");
    assert!(
        violations.is_empty(),
        "{} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
    assert!(
        committed > 0 && resumes > 0,
        "the run should compact and resume watchers"
    );
}
