//! `ctxbroker-bench`: measurements against an in-process daemon on a
//! loopback socket, each compared with a baseline measured in the same run
//! (the machine is shared; only same-run ratios mean much).
//!
//! ```text
//! ctxbroker-bench stalled-watcher [TURNS] [ROUNDS]
//! ```
//!
//! `stalled-watcher`: admission latency with no watcher, and with a watcher
//! that opened a stream and never reads it, in alternating rounds of
//! `TURNS` admissions (default 1,000 × 4 rounds each). Every admission
//! compacts often enough to write a marker every few turns, so the stalled
//! stream falls far behind.

use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use ctxbroker_server::{BuildInfo, Settings};
use pb::context_broker_client::ContextBrokerClient;
use tonic::transport::{Channel, Endpoint};

type Client = ContextBrokerClient<Channel>;
type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("stalled-watcher") => {
            let turns = parse(args.get(1), 1_000)?;
            let rounds = parse(args.get(2), 4)?;
            stalled_watcher(turns, rounds).await
        }
        _ => {
            eprintln!("usage: ctxbroker-bench stalled-watcher [TURNS] [ROUNDS]");
            std::process::exit(2);
        }
    }
}

fn parse(arg: Option<&String>, default: usize) -> Result<usize, Failure> {
    Ok(match arg {
        Some(text) => text.parse()?,
        None => default,
    })
}

/// A daemon served in this process on a loopback port, with its data in
/// a temporary directory that goes with it.
struct Daemon {
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

async fn daemon() -> Result<Daemon, Failure> {
    let dir = tempfile::tempdir()?;
    let settings = Settings {
        data_dir: dir.path().join("data"),
        ..Settings::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let build = BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        git_commit: "bench",
        contract_digest: "bench",
    };
    tokio::spawn(async move {
        let never = std::future::pending::<()>();
        if let Err(err) = ctxbroker_server::run(settings, listener, build, never).await {
            eprintln!("the daemon stopped: {err}");
        }
    });
    Ok(Daemon { addr, _dir: dir })
}

async fn client(addr: std::net::SocketAddr) -> Result<Client, Failure> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(ContextBrokerClient::new(channel))
}

/// Tool output of about 120 tokens, different for every `n`.
fn text(n: usize) -> String {
    const WORDS: [&str; 12] = [
        "rollout", "staging", "probe", "replica", "timeout", "cache", "queue", "handler", "deploy",
        "latency", "retry", "worker",
    ];
    let mut out = format!("step {n} in src/mod_{n}.rs:");
    for k in 0..90 {
        out.push(' ');
        out.push_str(WORDS[(n * 7 + k * 5) % WORDS.len()]);
    }
    out
}

/// Admits `turns` turns and returns each one's latency.
async fn admissions(
    client: &mut Client,
    from: usize,
    turns: usize,
) -> Result<Vec<Duration>, Failure> {
    let mut out = Vec::with_capacity(turns);
    for n in from..from + turns {
        let started = Instant::now();
        client
            .admit(pb::AdmitRequest {
                session_id: "bench".into(),
                spans: vec![pb::SpanInput {
                    role: pb::Role::Tool as i32,
                    text: text(n),
                    ..Default::default()
                }],
            })
            .await?;
        out.push(started.elapsed());
    }
    Ok(out)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

async fn stalled_watcher(turns: usize, rounds: usize) -> Result<(), Failure> {
    let daemon = daemon().await?;
    let mut admitter = client(daemon.addr).await?;
    // The first call waits for the daemon to serve.
    admitter
        .create_session(pb::CreateSessionRequest {
            session_id: "bench".into(),
            config: Some(pb::SessionConfig {
                window_tokens: Some(2_000),
                soft_watermark: Some(1.0),
                ..Default::default()
            }),
        })
        .await?;
    // Warm up: the tokenizer tables, the first compactions.
    admissions(&mut admitter, 0, 200).await?;

    let mut baseline = Vec::new();
    let mut stalled = Vec::new();
    let mut next = 200;
    let mut watchers = Vec::new();
    for _ in 0..rounds {
        baseline.extend(admissions(&mut admitter, next, turns).await?);
        next += turns;
        // A watcher on its own connection that reads nothing at all.
        let mut watcher = client(daemon.addr).await?;
        let stream = watcher
            .watch_compactions(pb::WatchCompactionsRequest::default())
            .await?
            .into_inner();
        watchers.push((watcher, stream));
        stalled.extend(admissions(&mut admitter, next, turns).await?);
        next += turns;
    }
    let markers = admitter
        .get_server_info(pb::GetServerInfoRequest {})
        .await?
        .into_inner()
        .next_marker_seq
        - 1;
    baseline.sort_unstable();
    stalled.sort_unstable();
    let row = |name: &str, d: &[Duration]| {
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} |",
            d.len(),
            percentile(d, 0.5).as_secs_f64() * 1e6,
            percentile(d, 0.9).as_secs_f64() * 1e6,
            percentile(d, 0.99).as_secs_f64() * 1e6,
        );
    };
    println!("| admissions | n | median µs | p90 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    row("no watcher", &baseline);
    row(
        &format!("{rounds} stalled watcher(s), added one per round"),
        &stalled,
    );
    let ratio = percentile(&stalled, 0.5).as_secs_f64() / percentile(&baseline, 0.5).as_secs_f64();
    println!();
    println!(
        "median ratio stalled / none: {ratio:.2}; markers written: {markers}; watchers never read"
    );
    drop(watchers);
    Ok(())
}
