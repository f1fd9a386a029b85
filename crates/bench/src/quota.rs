//! `quota`: a tenant within its quota while another floods past its own.
//!
//! The daemon runs in a child process (durability `flush`) with
//! per-tenant quotas: tenant `flood` may admit `--flood-quota` turns a
//! second (its burst the same), tenant `calm` a rate it never reaches (so
//! its admissions go through the same bucket check). One `calm` client
//! admits back to back into `calm/s` (window 2,000 tokens, soft watermark
//! at the budget: nearly every admission compacts inline, as in `watch`).
//! `--flooders` clients of `flood`, each on its own connection and
//! session, send `--flood-rate` admissions a second in all, evenly paced:
//! many times the quota, so most are refused with RESOURCE_EXHAUSTED. The
//! flood runs on a thread and runtime of its own, so that the calm
//! client's requests do not queue behind its in this process.
//!
//! `--rounds` paired rounds of `--turns` calm admissions: first alone,
//! then with the flood running (started 300 ms before the round, so its
//! burst is spent and it is being refused). The p99 of each is reported,
//! with the ratio flood ÷ alone of the pooled p99s and the median of the
//! per-round ratios; alone odd against even rounds gives the noise floor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ctxbroker_server::config::Durability;

use crate::common::{
    Client, Failure, Quantiles, client, create_small, flags, percentile, tool_turn,
};
use crate::daemon::DaemonProcess;

/// The calm tenant's admission p99 with a flood beside it, against alone:
/// at most this ratio.
pub const TARGET_P99_RATIO: f64 = 1.10;

/// How long the flood runs before a round, and the pause before a round
/// alone.
const SETTLE: Duration = Duration::from_millis(300);
/// The calm session's window: small, so nearly every admission compacts.
const WINDOW_TOKENS: u32 = 2_000;

/// `ctxbroker-bench quota`: a tenant's admissions while another floods
/// past its rate quota.
#[derive(Debug, Clone, Parser)]
#[command(name = "ctxbroker-bench quota")]
pub struct QuotaArgs {
    /// Back-to-back calm admissions per half-round.
    #[arg(long, default_value_t = 2000)]
    pub turns: usize,
    /// Paired rounds (alone, then flooded).
    #[arg(long, default_value_t = 8)]
    pub rounds: usize,
    /// The flooding tenant's admits_per_second (and admit_burst).
    #[arg(long, default_value_t = 20.0)]
    pub flood_quota: f64,
    /// Admissions a second the flooding tenant sends, all its clients
    /// together.
    #[arg(long, default_value_t = 1000.0)]
    pub flood_rate: f64,
    /// Flooding clients, each on its own connection and session.
    #[arg(long, default_value_t = 4)]
    pub flooders: usize,
}

/// `quota [flags]`.
pub async fn quota_main(args: &[String]) -> Result<(), Failure> {
    let args: QuotaArgs = flags("quota", args);
    let report = run(&args).await?;
    println!("{}", report.render(&args));
    Ok(())
}

/// What the flood did in one round.
#[derive(Debug, Default, Clone, Copy)]
struct Flooded {
    admitted: u64,
    refused: u64,
    other_errors: u64,
    seconds: f64,
}

/// The measurement's samples.
#[derive(Debug, Default)]
pub struct Report {
    alone: Vec<Duration>,
    flooded: Vec<Duration>,
    /// Per round: (alone p99, flooded p99).
    pairs: Vec<(Duration, Duration)>,
    /// Alone rounds' latencies, each sorted.
    alone_rounds: Vec<Vec<Duration>>,
    flood: Flooded,
}

impl Report {
    /// Pooled flooded p99 ÷ pooled alone p99.
    pub fn p99_ratio(&self) -> f64 {
        ratio(
            percentile(&self.flooded, 0.99),
            percentile(&self.alone, 0.99),
        )
    }

    fn render(&self, args: &QuotaArgs) -> String {
        let row = |name: &str, d: &[Duration]| {
            let q = Quantiles::of(d);
            format!(
                "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
                d.len(),
                q.p50,
                q.p90,
                q.p99,
                q.max
            )
        };
        let mut out = format!(
            "quota: calm/s admits back to back, {} turns × {} paired rounds; flood: {} clients sending {:.0}/s against admits_per_second = {} (burst the same); durability flush\n\n",
            args.turns, args.rounds, args.flooders, args.flood_rate, args.flood_quota
        );
        out.push_str("| calm tenant's admissions | n | p50 µs | p90 µs | p99 µs | max µs |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        out.push_str(&row("alone", &self.alone));
        out.push_str(&row("while flood floods", &self.flooded));
        let mut per_round: Vec<f64> = self.pairs.iter().map(|(a, f)| ratio(*f, *a)).collect();
        per_round.sort_by(f64::total_cmp);
        let median_round = per_round.get(per_round.len() / 2).copied().unwrap_or(0.0);
        let p99 = self.p99_ratio();
        let verdict = if p99 <= TARGET_P99_RATIO {
            "met"
        } else {
            "missed"
        };
        out.push_str(&format!(
            "\nflooded ÷ alone: p50 {:.2}, p99 {p99:.2} (target ≤ {TARGET_P99_RATIO:.2}: {verdict}); median of the per-round p99 ratios {median_round:.2}\n",
            ratio(
                percentile(&self.flooded, 0.5),
                percentile(&self.alone, 0.5)
            ),
        ));
        let (odd, even): (Vec<_>, Vec<_>) = self
            .alone_rounds
            .iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 1);
        let pool = |rounds: Vec<(usize, &Vec<Duration>)>| {
            let mut all: Vec<Duration> = rounds.into_iter().flat_map(|(_, r)| r.clone()).collect();
            all.sort_unstable();
            percentile(&all, 0.99)
        };
        if !odd.is_empty() {
            out.push_str(&format!(
                "noise floor: alone, odd ÷ even rounds, p99 {:.2}\n",
                ratio(pool(odd), pool(even))
            ));
        }
        let f = self.flood;
        let seconds = f.seconds.max(f64::MIN_POSITIVE);
        out.push_str(&format!(
            "flood: {:.0} sent/s, {:.1} admitted/s (quota {}/s, and a full burst at the start of each round), {:.0} refused/s with QUOTA_EXCEEDED, {} other errors\n",
            (f.admitted + f.refused + f.other_errors) as f64 / seconds,
            f.admitted as f64 / seconds,
            args.flood_quota,
            f.refused as f64 / seconds,
            f.other_errors,
        ));
        out
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(f64::MIN_POSITIVE)
}

async fn back_to_back(
    client: &mut Client,
    session: &str,
    from: usize,
    turns: usize,
) -> Result<Vec<Duration>, Failure> {
    let mut out = Vec::with_capacity(turns);
    for n in from..from + turns {
        let started = Instant::now();
        client.admit(tool_turn(session, n)).await?;
        out.push(started.elapsed());
    }
    out.sort_unstable();
    Ok(out)
}

/// The flooding tenant's clients, on a thread and runtime of their own so
/// that the calm client's requests never queue behind theirs in this
/// process (in a deployment they are other processes): connected and
/// their sessions created once, flooding while `on` is set.
struct Flood {
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    admitted: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    other_errors: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// Connects `flooders` clients of tenant `flood`, each pacing its share
    /// of `rate` admissions a second into its own session while on.
    fn start(addr: std::net::SocketAddr, flooders: usize, rate: f64) -> Result<Flood, Failure> {
        let on = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let counters = [
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        ];
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let period = Duration::from_secs_f64(flooders as f64 / rate.max(0.001));
        let (on2, stop2, c2) = (on.clone(), stop.clone(), counters.clone());
        let thread = std::thread::Builder::new()
            .name("flood".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = ready_tx.send(Err(err.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut clients = Vec::new();
                    for i in 0..flooders {
                        let connected = async {
                            let mut c = client(addr).await?;
                            create_small(&mut c, &format!("flood/s{i}"), WINDOW_TOKENS).await?;
                            Ok::<_, Failure>(c)
                        };
                        match connected.await {
                            Ok(c) => clients.push(c),
                            Err(err) => {
                                let _ = ready_tx.send(Err(err.to_string()));
                                return;
                            }
                        }
                    }
                    let _ = ready_tx.send(Ok(()));
                    let mut tasks = Vec::new();
                    for (i, mut client) in clients.into_iter().enumerate() {
                        let (on, stop, c) = (on2.clone(), stop2.clone(), c2.clone());
                        let offset = period.mul_f64(i as f64 / flooders as f64);
                        tasks.push(tokio::spawn(async move {
                            let session = format!("flood/s{i}");
                            let mut tick = tokio::time::interval(period);
                            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                            let mut n = i * 10_000_000;
                            let mut was_on = false;
                            while !stop.load(Ordering::Relaxed) {
                                if !on.load(Ordering::Relaxed) {
                                    was_on = false;
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                    continue;
                                }
                                if !was_on {
                                    was_on = true;
                                    tick.reset_at(tokio::time::Instant::now() + offset);
                                }
                                tick.tick().await;
                                n += 1;
                                let counter = match client.admit(tool_turn(&session, n)).await {
                                    Ok(_) => &c[0],
                                    Err(status)
                                        if status.code() == tonic::Code::ResourceExhausted =>
                                    {
                                        &c[1]
                                    }
                                    Err(_) => &c[2],
                                };
                                counter.fetch_add(1, Ordering::Relaxed);
                            }
                        }));
                    }
                    for task in tasks {
                        let _ = task.await;
                    }
                });
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(format!("the flood could not start: {err}").into()),
            Err(_) => return Err("the flood's thread ended before it started".into()),
        }
        let [admitted, refused, other_errors] = counters;
        Ok(Flood {
            on,
            stop,
            admitted,
            refused,
            other_errors,
            thread: Some(thread),
        })
    }

    fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs the paired rounds.
pub async fn run(args: &QuotaArgs) -> Result<Report, Failure> {
    if args.flooders == 0 || args.flood_rate <= 0.0 || args.flood_quota <= 0.0 {
        return Err("--flooders, --flood-rate and --flood-quota must be above 0".into());
    }
    let quota = format!(
        "{{\"tenants\":{{\"flood\":{{\"admits_per_second\":{q},\"admit_burst\":{b}}},\"calm\":{{\"admits_per_second\":1000000.0,\"admit_burst\":1000000}}}}}}",
        q = args.flood_quota,
        b = args.flood_quota.ceil().max(1.0) as u64,
    );
    let daemon = DaemonProcess::spawn_with(Durability::Flush, &["--quota-json".to_owned(), quota])?;
    let mut calm = client(daemon.addr).await?;
    create_small(&mut calm, "calm/s", WINDOW_TOKENS).await?;
    let flood = Flood::start(daemon.addr, args.flooders, args.flood_rate)?;
    // The tokenizer's tables and the first compactions, unrecorded.
    back_to_back(&mut calm, "calm/s", 0, 200).await?;

    let mut report = Report::default();
    let mut next = 1_000_000;
    for _ in 0..args.rounds {
        tokio::time::sleep(SETTLE).await;
        let alone = back_to_back(&mut calm, "calm/s", next, args.turns).await?;
        next += args.turns;

        let started = Instant::now();
        flood.set(true);
        tokio::time::sleep(SETTLE).await;
        let flooded = back_to_back(&mut calm, "calm/s", next, args.turns).await?;
        next += args.turns;
        flood.set(false);
        report.flood.seconds += started.elapsed().as_secs_f64();

        report
            .pairs
            .push((percentile(&alone, 0.99), percentile(&flooded, 0.99)));
        report.alone.extend_from_slice(&alone);
        report.flooded.extend_from_slice(&flooded);
        report.alone_rounds.push(alone);
    }
    report.flood.admitted = flood.admitted.load(Ordering::Relaxed);
    report.flood.refused = flood.refused.load(Ordering::Relaxed);
    report.flood.other_errors = flood.other_errors.load(Ordering::Relaxed);
    drop(flood);
    report.alone.sort_unstable();
    report.flooded.sort_unstable();
    Ok(report)
}
