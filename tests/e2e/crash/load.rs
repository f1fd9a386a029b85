//! The load: one admitter per session, driven by a seeded generator
//! (narrative turns, bursts, constraints, pins and unpins), and watchers
//! that follow the marker log and resume at `last seen + 1` whenever
//! their stream breaks. Each records what was acknowledged in the ledger.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use ctxbroker_proto::v1 as pb;
use pb::Role;
use tokio::sync::watch;
use tonic_types::StatusExt;

use super::harness::{Client, MAX_PINNED, RPC_TIMEOUT, Reply, Rng, Shared, call, is_lost};
use super::ledger::{AckedSpan, PinEvent, Segment, SessionLog, WatchLog};
use crate::support::*;

/// One session under load.
pub(crate) struct Load {
    pub(crate) id: String,
    pub(crate) budget: u32,
    pub(crate) shared: Arc<Shared>,
    pub(crate) log: Arc<Mutex<SessionLog>>,
}

const TOPICS: [&[&str]; 3] = [
    &["ingest", "pipeline", "src/ingest/reader.rs", "backpressure"],
    &["billing", "invoice", "ledger", "migrations/0042_ledger.sql"],
    &["deploy", "staging", "k8s/staging/app.yaml", "rollout"],
];
const VERBS: [&str; 5] = ["delete", "overwrite", "rename", "truncate", "expose"];
const THINGS: [&str; 5] = ["bucket", "namespace", "table", "secret", "branch"];

impl Load {
    pub(crate) async fn run(self, mut client: Client, seed: u64) {
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
pub(crate) async fn watcher(
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
