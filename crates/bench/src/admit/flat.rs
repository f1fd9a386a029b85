//! The daemon's CPU per admission that fits, against the session's size.
//!
//! For each size, one session is grown to that many live spans (turns of
//! short tool outputs, under a window far above them, so nothing compacts),
//! then one client sends no-ops, then short unlabelled user messages, then
//! the same messages each with an idempotency key, as the project's clients
//! send every turn (the key row shows what the daemon's check that a key
//! is new costs). The daemon's CPU time is read before and after each half of the
//! measurement (no-ops alone, then admissions alone), so each row's CPU per
//! request is the whole daemon's: gRPC, the session's turn, the store's
//! writer and flusher, the engine's I/O threads. The no-op row is the
//! floor every request pays.
//!
//! Then the same at the first size under load: `clients` clients, each
//! with a session of its own grown to that size, send no-ops, then short
//! messages, concurrently over the daemon's connections. One client pays
//! a whole HTTP/2 round trip and a wake-up of the daemon per request;
//! under load the daemon reads and answers many requests per wake-up, so
//! these rows show what an admission that fits costs when the daemon is
//! busy, as it is in production.

use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;

use crate::common::{Client, Failure, Quantiles};
use crate::daemon::{EngineWrites, PhaseMeter, PhaseUsage};

use super::{Turn, Workload};

/// Spans per turn while a session grows.
const GROW_SPANS_PER_TURN: usize = 250;

/// The window of the grown sessions: far above their live tokens.
const WINDOW_TOKENS: u32 = 10_000_000;

/// One row: requests at one session size.
#[derive(Debug, Clone)]
pub(super) struct FlatRow {
    /// The session's live spans when the measurement began.
    pub live_spans: usize,
    /// What was sent: "no-op", "admit" or "admit+key".
    pub request: &'static str,
    /// Clients sending at once.
    pub clients: usize,
    /// Requests recorded.
    pub requests: usize,
    /// Median latency, µs.
    pub p50_us: f64,
    /// The daemon's CPU per request, µs.
    pub cpu_us: f64,
    /// The same by thread group (`ThreadGroup::ALL`'s order), µs.
    pub threads_us: [f64; 5],
    /// Keys and bytes the store's writer handed the engine per request.
    pub written: EngineWrites,
}

/// Grows a session per size and measures `admissions` no-ops and
/// admissions on each, against the daemon `pid` (whose metrics are at
/// `metrics`).
pub(super) async fn rows(
    client: &Client,
    pid: u32,
    metrics: std::net::SocketAddr,
    workload: &Workload,
    sizes: &[usize],
    admissions: usize,
) -> Result<Vec<FlatRow>, Failure> {
    let mut client = client.clone();
    let shorts = short_messages(workload)?;
    let mut rows = Vec::new();
    for &size in sizes {
        let session = format!("flat-{size}");
        grow(&mut client, &session, size).await?;
        let warm = (admissions / 10).max(1);
        for n in 0..warm {
            admit(&mut client, &session, shorts[n % shorts.len()]).await?;
        }
        let mut latencies = Vec::with_capacity(admissions);
        let written = EngineWrites::read(metrics)?;
        let meter = PhaseMeter::start(pid)?;
        for _ in 0..admissions {
            let t0 = Instant::now();
            client.get_server_info(pb::GetServerInfoRequest {}).await?;
            latencies.push(t0.elapsed());
        }
        let used = meter.finish()?;
        let wrote = EngineWrites::read(metrics)?.per_request(written, admissions);
        rows.push(row(size, "no-op", 1, &mut latencies, &used, wrote));
        let mut latencies = Vec::with_capacity(admissions);
        let written = EngineWrites::read(metrics)?;
        let meter = PhaseMeter::start(pid)?;
        for n in 0..admissions {
            let t0 = Instant::now();
            let compacted = admit(&mut client, &session, shorts[n % shorts.len()]).await?;
            if compacted {
                return Err(format!("{session} compacted; the row needs turns that fit").into());
            }
            latencies.push(t0.elapsed());
        }
        let used = meter.finish()?;
        let wrote = EngineWrites::read(metrics)?.per_request(written, admissions);
        rows.push(row(size, "admit", 1, &mut latencies, &used, wrote));
        let mut latencies = Vec::with_capacity(admissions);
        let written = EngineWrites::read(metrics)?;
        let meter = PhaseMeter::start(pid)?;
        for n in 0..admissions {
            let key = format!("flat-{size}-{n}");
            let t0 = Instant::now();
            let compacted =
                admit_keyed(&mut client, &session, shorts[n % shorts.len()], Some(key)).await?;
            if compacted {
                return Err(format!("{session} compacted; the row needs turns that fit").into());
            }
            latencies.push(t0.elapsed());
        }
        let used = meter.finish()?;
        let wrote = EngineWrites::read(metrics)?.per_request(written, admissions);
        rows.push(row(size, "admit+key", 1, &mut latencies, &used, wrote));
    }
    Ok(rows)
}

/// The loaded rows: `clients` clients, each with its own session grown to
/// `size` live spans, send `requests` no-ops in all, then as many short
/// messages, each client over `channels[client % channels.len()]`.
pub(super) async fn loaded_rows(
    channels: &[Client],
    pid: u32,
    metrics: std::net::SocketAddr,
    workload: &Workload,
    size: usize,
    clients: usize,
    requests: usize,
) -> Result<Vec<FlatRow>, Failure> {
    if channels.is_empty() || clients == 0 {
        return Ok(Vec::new());
    }
    let shorts: Vec<Turn> = short_messages(workload)?.into_iter().cloned().collect();
    let shorts = std::sync::Arc::new(shorts);
    let mut sessions = Vec::with_capacity(clients);
    for c in 0..clients {
        let mut client = channels[c % channels.len()].clone();
        let session = format!("flat-loaded-{size}-{c}");
        grow(&mut client, &session, size).await?;
        for n in 0..(requests / clients / 10).max(1) {
            admit(&mut client, &session, &shorts[(c + n) % shorts.len()]).await?;
        }
        sessions.push((client, session));
    }
    let per_client = (requests / clients).max(1);
    let mut rows = Vec::with_capacity(2);
    for request in ["no-op", "admit"] {
        let written = EngineWrites::read(metrics)?;
        let meter = PhaseMeter::start(pid)?;
        let mut tasks = Vec::with_capacity(clients);
        for (c, (client, session)) in sessions.iter().enumerate() {
            let mut client = client.clone();
            let session = session.clone();
            let shorts = shorts.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for n in 0..per_client {
                    let t0 = Instant::now();
                    if request == "no-op" {
                        client.get_server_info(pb::GetServerInfoRequest {}).await?;
                    } else {
                        let turn = &shorts[(c + n) % shorts.len()];
                        if admit(&mut client, &session, turn).await? {
                            return Err(Failure::from(format!(
                                "{session} compacted; the row needs turns that fit"
                            )));
                        }
                    }
                    latencies.push(t0.elapsed());
                }
                Ok::<_, Failure>(latencies)
            }));
        }
        let mut latencies = Vec::with_capacity(per_client * clients);
        for task in tasks {
            let mine = task
                .await
                .map_err(|err| Failure::from(format!("a loaded client failed: {err}")))??;
            latencies.extend(mine);
        }
        let used = meter.finish()?;
        let sent = latencies.len();
        let wrote = EngineWrites::read(metrics)?.per_request(written, sent);
        rows.push(row(size, request, clients, &mut latencies, &used, wrote));
    }
    Ok(rows)
}

/// The workload's user messages: the short turns the rows admit.
pub(super) fn short_messages(workload: &Workload) -> Result<Vec<&Turn>, Failure> {
    let shorts: Vec<&Turn> = workload
        .pool
        .iter()
        .filter(|t| t.role == pb::Role::User)
        .collect();
    match shorts.is_empty() {
        true => Err("the workload has no user message".into()),
        false => Ok(shorts),
    }
}

fn row(
    size: usize,
    request: &'static str,
    clients: usize,
    latencies: &mut [Duration],
    used: &PhaseUsage,
    written: EngineWrites,
) -> FlatRow {
    latencies.sort();
    let requests = latencies.len();
    let per_request = |seconds: f64| seconds * 1e6 / requests.max(1) as f64;
    FlatRow {
        live_spans: size,
        request,
        clients,
        requests,
        p50_us: Quantiles::of(latencies).p50,
        cpu_us: per_request(used.cpu_seconds),
        threads_us: used.threads.seconds.map(per_request),
        written,
    }
}

/// Creates `session` and admits turns of short tool outputs until it holds
/// `size` live spans.
pub(super) async fn grow(client: &mut Client, session: &str, size: usize) -> Result<(), Failure> {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: session.to_owned(),
            config: Some(pb::SessionConfig {
                window_tokens: Some(WINDOW_TOKENS),
                ..Default::default()
            }),
        })
        .await?;
    let mut live = 0;
    while live < size {
        let n = GROW_SPANS_PER_TURN.min(size - live);
        let spans = (live..live + n)
            .map(|i| pb::SpanInput {
                role: pb::Role::Tool as i32,
                text: format!(
                    "step {i}: wrote build/out_{}.log, exit status {}",
                    i % 97,
                    i % 3
                ),
                ..Default::default()
            })
            .collect();
        let reply = client
            .admit(pb::AdmitRequest {
                session_id: session.to_owned(),
                spans,
            })
            .await?
            .into_inner();
        if reply.compaction.is_some() {
            return Err(format!("{session} compacted while growing").into());
        }
        live += n;
    }
    Ok(())
}

/// Admits one short user message; true when the admission compacted.
async fn admit(client: &mut Client, session: &str, turn: &Turn) -> Result<bool, Failure> {
    admit_keyed(client, session, turn, None).await
}

/// Admits one short user message with `key` as its idempotency key, if
/// any; true when the admission compacted.
pub(super) async fn admit_keyed(
    client: &mut Client,
    session: &str,
    turn: &Turn,
    key: Option<String>,
) -> Result<bool, Failure> {
    let mut span = super::span(turn);
    span.idempotency_key = key.unwrap_or_default();
    let reply = client
        .admit(pb::AdmitRequest {
            session_id: session.to_owned(),
            spans: vec![span],
        })
        .await?
        .into_inner();
    Ok(reply.compaction.is_some())
}

/// The rows as a markdown table, with each admission row's ratio to the
/// no-op row at the same size and to the same request at the first size.
pub(super) fn render(daemon: &str, rows: &[FlatRow]) -> String {
    let mut out = String::from(
        "| daemon | live spans | request | clients | requests | p50 µs | daemon CPU µs per request | of which runtime / engine I/O / writer / flusher / other | admit ÷ no-op CPU | ÷ at the smallest size | engine keys / bytes per request | engine keys read per request | blob files synced per request | writes applied by the request itself, per request |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        // The same request at the first size.
        let first_admit = rows
            .iter()
            .find(|f| f.request == r.request && f.clients == r.clients)
            .map_or(f64::NAN, |f| f.cpu_us);
        let (vs_noop, vs_first) = if r.request != "no-op" {
            let noop = rows
                .iter()
                .find(|n| {
                    n.live_spans == r.live_spans && n.request == "no-op" && n.clients == r.clients
                })
                .map_or(f64::NAN, |n| n.cpu_us);
            (
                format!("{:.2}", r.cpu_us / noop),
                format!("{:.2}", r.cpu_us / first_admit),
            )
        } else {
            ("–".to_owned(), "–".to_owned())
        };
        out.push_str(&format!(
            "| {daemon} | {} | {} | {} | {} | {:.0} | {:.1} | {:.0} / {:.0} / {:.0} / {:.0} / {:.0} | {vs_noop} | {vs_first} | {:.2} / {:.0} | {:.2} | {:.3} | {:.2} |\n",
            r.live_spans,
            r.request,
            r.clients,
            r.requests,
            r.p50_us,
            r.cpu_us,
            r.threads_us[0],
            r.threads_us[1],
            r.threads_us[2],
            r.threads_us[3],
            r.threads_us[4],
            r.written.keys,
            r.written.bytes,
            r.written.reads,
            r.written.blob_syncs,
            r.written.applied_by_caller
        ));
    }
    out
}
