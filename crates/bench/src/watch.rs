//! `watch`: watchers and admission latency.

use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;

use crate::common::{Client, Failure, client, daemon, parse, percentile};

/// `stalled-watcher [TURNS] [ROUNDS]`.
pub async fn stalled_watcher_main(args: &[String]) -> Result<(), Failure> {
    let turns = parse(args, 0, 1_000)?;
    let rounds = parse(args, 1, 4)?;
    stalled_watcher(turns, rounds).await
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
