//! The crash loop itself: the daemon under load from admitters and
//! watchers (see [`super::load`]), killed with `kill -9` at a random
//! moment of each cycle and restarted on the same data directory; the
//! request wrapper that sorts every outcome into acknowledged, refused or
//! unanswered; and the readers the checks share.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;
use tokio::sync::watch;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use super::ledger::{SessionLog, WatchLog};
use super::load::{Load, watcher};
use crate::support::*;

pub(crate) type Client = ContextBrokerClient<Channel>;

/// The schedule's seed, unless `CTXBROKER_CRASH_SEED` says otherwise.
const SEED: u64 = 0x00c0_ffee_d00d_5eed;
/// Sessions under load.
const SESSIONS: usize = 6;
/// Kill-and-restart cycles.
pub(crate) const CYCLES: usize = 5;
/// Acknowledged constraints a session keeps pinned at most; beyond, the
/// admitter unpins.
pub(crate) const MAX_PINNED: usize = 4;
/// The longest any one request or wait may take.
pub(crate) const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest the checks after the run may take.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest the daemon may take to come back, as the load sees it.
const BACK_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// xorshift64*: small, seeded, good enough to pick a schedule.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        // Never zero: xorshift stays at zero forever.
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1);
        for _ in 0..4 {
            rng.next();
        }
        rng
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// The daemon's life as the load sees it: `kills` is raised before each
/// `kill -9`, `restarts` once the new process answers. The daemon is up
/// when they are equal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Phase {
    pub(crate) kills: u64,
    pub(crate) restarts: u64,
}

/// Counts over the whole run, and every violation found along the way.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Requests answered with a success.
    pub(crate) acked: u64,
    /// Requests answered with a refusal from the daemon (typed error).
    pub(crate) refused: BTreeMap<String, u64>,
    /// Requests that got no answer (the daemon died under them).
    pub(crate) unacked: u64,
    /// Of those, requests sent and failed while the daemon was up (a
    /// connection the client finds broken only after the restart).
    pub(crate) unacked_while_up: u64,
    /// Markers with compressed constraints seen in replies.
    pub(crate) compressions: u64,
    pub(crate) violations: Vec<String>,
}

/// What the run shares between the controller and its tasks.
pub(crate) struct Shared {
    pub(crate) phase: watch::Sender<Phase>,
    /// Acknowledged operations so far; the controller kills behind them.
    pub(crate) acks: watch::Sender<u64>,
    pub(crate) stop_load: watch::Sender<bool>,
    pub(crate) stop_watch: watch::Sender<bool>,
    pub(crate) tally: Mutex<Tally>,
}

impl Shared {
    pub(crate) fn violation(&self, what: String) {
        self.tally.lock().unwrap().violations.push(what);
    }

    /// Waits, bounded, until the daemon is up again after a kill.
    pub(crate) async fn back_up(&self) -> bool {
        let mut rx = self.phase.subscribe();
        let up = tokio::time::timeout(BACK_UP_TIMEOUT, rx.wait_for(|p| p.restarts >= p.kills));
        matches!(up.await, Ok(Ok(_)))
    }
}

/// What became of one request.
pub(crate) enum Reply<T> {
    /// Acknowledged with a success.
    Done(T),
    /// Acknowledged with a refusal: nothing changed.
    Refused(tonic::Status),
    /// No answer: it may or may not have taken effect.
    Lost,
}

/// An error that is not the daemon's answer but the connection's end: no
/// `ErrorInfo` (every daemon error carries one) and a transport code.
pub(crate) fn is_lost(status: &tonic::Status) -> bool {
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
pub(crate) async fn call<T>(
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
pub(crate) struct SpanReader {
    client: Client,
    read: HashMap<(String, u64), Result<pb::Span, String>>,
    /// Set when the daemon stopped answering: later reads fail at once
    /// rather than each waiting out its timeout.
    pub(crate) gone: Option<String>,
}

impl SpanReader {
    pub(crate) fn new(client: Client) -> SpanReader {
        SpanReader {
            client,
            read: HashMap::new(),
            gone: None,
        }
    }

    pub(crate) async fn get(&mut self, id: &str, span_id: u64) -> Result<pb::Span, String> {
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
pub(crate) async fn settled(
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

/// The schedule's seed: `CTXBROKER_CRASH_SEED`, or [`SEED`].
pub(crate) fn seed() -> u64 {
    std::env::var("CTXBROKER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED)
}

/// One watcher's record, once it has stopped.
pub(crate) struct Watched {
    pub(crate) name: String,
    /// The sessions it followed; empty for all of them.
    pub(crate) filter: Vec<String>,
    pub(crate) log: WatchLog,
}

/// What a crash loop leaves for the checks: the last daemon, still
/// serving, and every record of what was acknowledged.
pub(crate) struct CrashRun {
    pub(crate) seed: u64,
    pub(crate) started: Instant,
    /// When the load had stopped, from `started`.
    pub(crate) load_done: Duration,
    pub(crate) daemon: Daemon,
    pub(crate) ids: Vec<String>,
    pub(crate) budgets: HashMap<String, u32>,
    /// What each session's admitter had acknowledged.
    pub(crate) logs: BTreeMap<String, SessionLog>,
    pub(crate) watchers: Vec<Watched>,
    /// Counts, and what went wrong while the loop ran.
    pub(crate) tally: Tally,
}

/// Runs the loop: six sessions under load, two watchers, [`CYCLES`]
/// kills; then stops the load and lets the watchers catch up with the log
/// before stopping them too.
pub(crate) async fn run(seed: u64) -> CrashRun {
    let started = Instant::now();
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
            shared.violation(format!(
                "watcher-{w}: stuck at {} below the head {want}",
                *seen.borrow()
            ));
        }
    }
    shared.stop_watch.send_replace(true);
    for (w, (_, _, _, task)) in watchers.iter_mut().enumerate() {
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => shared.violation(format!("watcher-{w}: failed: {e}")),
            Err(_) => shared.violation(format!("watcher-{w}: did not stop")),
        }
    }
    let watchers = watchers
        .into_iter()
        .enumerate()
        .map(|(w, (filter, log, _, _))| Watched {
            name: format!("watcher-{w}"),
            filter,
            log: std::mem::take(&mut *log.lock().unwrap()),
        })
        .collect();
    let tally = std::mem::take(&mut *shared.tally.lock().unwrap());

    CrashRun {
        seed,
        started,
        load_done,
        daemon,
        ids,
        budgets,
        logs,
        watchers,
        tally,
    }
}
