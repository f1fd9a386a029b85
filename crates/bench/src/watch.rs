//! `watch`: marker delivery to many watchers while admissions run, and
//! admission latency with a stalled watcher against none.
//!
//! The daemon runs in a child process with durability `flush` (the
//! default). `--admitters` sessions with a 2,000-token window and the soft
//! watermark at the budget admit ~120-token tool results, so nearly every
//! admission compacts inline and its reply carries the marker it wrote.
//!
//! Phases:
//!
//! 1. **no watchers**: the admitters send `--rate` admissions per second
//!    in all (evenly paced) for `--duration` seconds;
//! 2. **watchers**: `--watchers` streams (`WatchCompactions` from now, no
//!    filter, so every watcher receives every marker) spread over
//!    `--connections` HTTP/2 connections, every one caught up before the
//!    phase starts; the same admissions again. Every (marker, watcher)
//!    delivery is timed, and every marker must reach every watcher;
//! 3. **stalled watcher**: `--stalled-rounds` alternating rounds of
//!    `--stalled-turns` back-to-back admissions by one client with no
//!    watcher, then as many with one watcher that opened a stream from the
//!    first marker on its own connection and never reads it (closed at
//!    the end of its round), so it is thousands of markers behind. The
//!    stalled watcher's replay from the log runs until the connection's
//!    flow-control window is full; each round starts 300 ms after the
//!    stream opened (the no-watcher rounds after the same pause), so what
//!    is measured is a watcher that is stalled, not one being opened. The
//!    no-watcher rounds, odd against even, give the noise floor.
//!
//! **Delivery latency** of marker S to watcher W: from the moment the
//! admitting client sent the `Admit` whose reply carries S, to the moment
//! W's stream yields S in this process. It includes the admission itself
//! (the marker exists only once it is durable) and the client side's
//! decoding; it is an upper bound on the daemon's fan-out time. The same
//! deliveries measured from the moment the admitting client received its
//! reply are reported beside it (the replies are sent before the markers
//! are handed to the watchers, though a watcher may still be first).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use ctxbroker_proto::v1 as pb;
use ctxbroker_server::config::Durability;

use crate::admit::per_second;
use crate::common::{
    Client, Failure, Quantiles, client, create_small, next_marker, percentile, tool_turn,
};
use crate::daemon::{DaemonProcess, PhaseMeter, PhaseUsage};

/// 1,000 watchers: delivery p99 at most this.
pub const TARGET_DELIVERY_P99: Duration = Duration::from_millis(10);
/// A stalled watcher changes admission p99 by less than this fraction.
pub const TARGET_STALLED_P99_CHANGE: f64 = 0.10;

/// How long a new stalled watcher is given to stall before its round.
const SETTLE: Duration = Duration::from_millis(300);

/// The sessions' window: small, so nearly every admission compacts.
const WINDOW_TOKENS: u32 = 2_000;

/// `ctxbroker-bench watch`: marker delivery to many watchers, and a
/// stalled watcher's effect on admissions.
#[derive(Debug, Clone, Parser)]
#[command(name = "ctxbroker-bench watch")]
pub struct WatchArgs {
    /// Concurrent watchers.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// HTTP/2 connections the watchers share.
    #[arg(long, default_value_t = 10)]
    pub connections: usize,
    /// Admitting clients, each on its own session and connection.
    #[arg(long, default_value_t = 4)]
    pub admitters: usize,
    /// Admissions per second, all admitters together (nearly one marker
    /// each).
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Seconds of paced admissions in each of the first two phases.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Back-to-back admissions per half-round of the stalled phase.
    #[arg(long, default_value_t = 2000)]
    pub stalled_turns: usize,
    /// Rounds of the stalled phase (0 skips it).
    #[arg(long, default_value_t = 6)]
    pub stalled_rounds: usize,
    /// Also write every delivery of the watchers phase to this file as
    /// CSV: watcher, seq, from_send_us, from_reply_us.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
}

/// `watch [flags]`.
pub async fn watch_main(args: &[String]) -> Result<(), Failure> {
    let args: WatchArgs = crate::common::flags("watch", args);
    run(&args).await
}

/// The arguments of `stalled-watcher`.
#[derive(Debug, Parser)]
#[command(
    about = "`ctxbroker-bench stalled-watcher`: admission latency with no watcher and with one that never reads, in alternating rounds",
    long_about = None
)]
struct StalledArgs {
    /// Admissions per round.
    #[arg(default_value_t = 1_000)]
    turns: usize,
    /// Rounds with no watcher and with the stalled one, in turn.
    #[arg(default_value_t = 4)]
    rounds: usize,
}

/// `stalled-watcher [TURNS] [ROUNDS]`: the stalled phase of `watch` alone.
pub async fn stalled_watcher_main(args: &[String]) -> Result<(), Failure> {
    let StalledArgs { turns, rounds } = crate::common::flags("stalled-watcher", args);
    if turns == 0 || rounds == 0 {
        return Err("TURNS and ROUNDS must be at least 1".into());
    }
    let daemon = DaemonProcess::spawn(Durability::Flush)?;
    let mut admitter = client(daemon.addr).await?;
    create_small(&mut admitter, "stalled", WINDOW_TOKENS).await?;
    warm_up(&mut admitter, "stalled").await?;
    let stalled = stalled_phase(&daemon, &mut admitter, "stalled", turns, rounds).await?;
    println!("{}", stalled.render());
    Ok(())
}

/// The tokenizer's tables and the first compactions, unrecorded.
async fn warm_up(client: &mut Client, session: &str) -> Result<(), Failure> {
    for n in 0..100 {
        client.admit(tool_turn(session, n)).await?;
    }
    Ok(())
}

/// One admission whose reply carried a marker.
#[derive(Debug, Clone, Copy)]
struct Sent {
    sent: Instant,
    replied: Instant,
}

/// What the paced admitters recorded.
#[derive(Debug, Default)]
struct Paced {
    latencies: Vec<Duration>,
    /// Marker seq → when its admission was sent and answered.
    markers: HashMap<u64, Sent>,
    errors: u64,
}

/// `admitters` clients sending `rate` admissions per second in all for
/// `duration`.
async fn paced(
    clients: &[Client],
    sessions: &[String],
    rate: f64,
    duration: Duration,
    from: usize,
) -> Result<Paced, Failure> {
    let period = Duration::from_secs_f64(clients.len() as f64 / rate.max(0.001));
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (i, (client, session)) in clients.iter().zip(sessions).enumerate() {
        let mut client = client.clone();
        let session = session.clone();
        // Spread the admitters evenly over one period.
        let offset = period.mul_f64(i as f64 / clients.len() as f64);
        tasks.push(tokio::spawn(async move {
            let mut mine = Paced::default();
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = from + i * 1_000_000;
            loop {
                tick.tick().await;
                if Instant::now() >= end {
                    break;
                }
                n += 1;
                let sent = Instant::now();
                match client.admit(tool_turn(&session, n)).await {
                    Ok(reply) => {
                        let replied = Instant::now();
                        mine.latencies.push(replied - sent);
                        if let Some(marker) = reply.into_inner().compaction {
                            mine.markers.insert(marker.seq, Sent { sent, replied });
                        }
                    }
                    Err(_) => mine.errors += 1,
                }
            }
            mine
        }));
    }
    let mut all = Paced::default();
    for task in tasks {
        let mine = task.await?;
        all.latencies.extend(mine.latencies);
        all.markers.extend(mine.markers);
        all.errors += mine.errors;
    }
    all.latencies.sort_unstable();
    Ok(all)
}

/// A watcher's record: every marker seq it received, and when.
type Received = Arc<Mutex<Vec<(u64, Instant)>>>;

/// Opens `n` watchers over `connections` connections, each caught up.
async fn open_watchers(
    addr: std::net::SocketAddr,
    n: usize,
    connections: usize,
) -> Result<(Vec<Client>, Vec<Received>, Vec<tokio::task::JoinHandle<()>>), Failure> {
    let mut channels = Vec::new();
    for _ in 0..connections.max(1) {
        channels.push(client(addr).await?);
    }
    let mut records = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<Result<(), String>>(n.max(1));
    for w in 0..n {
        let mut client = channels[w % channels.len()].clone();
        let record: Received = Arc::default();
        records.push(record.clone());
        let ready = ready_tx.clone();
        tasks.push(tokio::spawn(async move {
            let request = pb::WatchCompactionsRequest {
                start: pb::WatchStart::Now as i32,
                ..Default::default()
            };
            let mut stream = match client.watch_compactions(request).await {
                Ok(stream) => stream.into_inner(),
                Err(status) => {
                    let _ = ready.send(Err(status.to_string())).await;
                    return;
                }
            };
            let mut announced = false;
            loop {
                match stream.message().await {
                    Ok(Some(message)) => match message.event {
                        Some(pb::watch_compactions_response::Event::Marker(marker)) => {
                            let at = Instant::now();
                            if let Ok(mut seen) = record.lock() {
                                seen.push((marker.seq, at));
                            }
                        }
                        Some(pb::watch_compactions_response::Event::CaughtUp(_)) if !announced => {
                            announced = true;
                            let _ = ready.send(Ok(())).await;
                        }
                        Some(pb::watch_compactions_response::Event::CaughtUp(_)) | None => {}
                    },
                    Ok(None) => break,
                    Err(status) => {
                        if !announced {
                            let _ = ready.send(Err(status.to_string())).await;
                        }
                        break;
                    }
                }
            }
        }));
    }
    drop(ready_tx);
    let deadline = Duration::from_secs(60);
    for _ in 0..n {
        match tokio::time::timeout(deadline, ready_rx.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(why))) => return Err(format!("a watcher failed to start: {why}").into()),
            Ok(None) => return Err("a watcher ended before catching up".into()),
            Err(_) => return Err("the watchers did not catch up within a minute".into()),
        }
    }
    Ok((channels, records, tasks))
}

/// The delivery figures of the watchers phase.
#[derive(Debug)]
struct Delivery {
    from_send: Vec<Duration>,
    /// Signed: negative when the watcher had the marker before the
    /// admitting client had its reply.
    from_reply_us: Vec<f64>,
    expected: usize,
    delivered: usize,
}

fn deliveries(paced: &Paced, records: &[Received]) -> Delivery {
    let mut from_send = Vec::new();
    let mut from_reply_us = Vec::new();
    for record in records {
        let Ok(seen) = record.lock() else { continue };
        for (seq, at) in seen.iter() {
            if let Some(sent) = paced.markers.get(seq) {
                from_send.push(at.saturating_duration_since(sent.sent));
                let us = if *at >= sent.replied {
                    (*at - sent.replied).as_secs_f64() * 1e6
                } else {
                    -((sent.replied - *at).as_secs_f64() * 1e6)
                };
                from_reply_us.push(us);
            }
        }
    }
    from_send.sort_unstable();
    from_reply_us.sort_unstable_by(f64::total_cmp);
    let delivered = from_send.len();
    Delivery {
        from_send,
        from_reply_us,
        expected: paced.markers.len() * records.len(),
        delivered,
    }
}

/// Writes every timed delivery to `path`, one line per (watcher, marker):
/// the latency from the admitting client's send and from its reply, in
/// µs (the latter negative when the watcher was first).
fn write_csv(path: &Path, paced: &Paced, records: &[Received]) -> Result<(), Failure> {
    let file =
        std::fs::File::create(path).map_err(|err| format!("--csv {}: {err}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "watcher,seq,from_send_us,from_reply_us")?;
    for (w, record) in records.iter().enumerate() {
        let Ok(seen) = record.lock() else { continue };
        for (seq, at) in seen.iter() {
            let Some(sent) = paced.markers.get(seq) else {
                continue;
            };
            let since = |from: Instant| {
                if *at >= from {
                    us(*at - from)
                } else {
                    -us(from - *at)
                }
            };
            writeln!(
                out,
                "{w},{seq},{:.3},{:.3}",
                since(sent.sent),
                since(sent.replied)
            )?;
        }
    }
    out.flush()?;
    eprintln!("deliveries written to {}", path.display());
    Ok(())
}

/// Admission latency with no watcher and with a stalled one, by round.
#[derive(Debug)]
struct Stalled {
    none: Vec<Duration>,
    stalled: Vec<Duration>,
    /// The rounds without a watcher, each sorted: even against odd ones
    /// is the noise floor of the comparison.
    none_rounds: Vec<Vec<Duration>>,
    rounds: usize,
    markers: u64,
}

impl Stalled {
    /// How much p99 moves between rounds that differ in nothing: the
    /// no-watcher rounds, even against odd. `None` with fewer than two.
    fn noise(&self) -> Option<f64> {
        if self.none_rounds.len() < 2 {
            return None;
        }
        let half = |parity: usize| {
            let mut all: Vec<Duration> = self
                .none_rounds
                .iter()
                .skip(parity)
                .step_by(2)
                .flatten()
                .copied()
                .collect();
            all.sort_unstable();
            Quantiles::of(&all).p99
        };
        Some(half(1) / half(0).max(f64::MIN_POSITIVE) - 1.0)
    }

    fn change(&self) -> f64 {
        let none = Quantiles::of(&self.none).p99;
        Quantiles::of(&self.stalled).p99 / none.max(f64::MIN_POSITIVE) - 1.0
    }

    fn render(&self) -> String {
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
        let mut out = String::new();
        out.push_str("| admissions, back to back | n | p50 µs | p90 µs | p99 µs | max µs |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        out.push_str(&row("no watcher", &self.none));
        out.push_str(&row("one stalled watcher", &self.stalled));
        let median = percentile(&self.stalled, 0.5).as_secs_f64()
            / percentile(&self.none, 0.5)
                .as_secs_f64()
                .max(f64::MIN_POSITIVE);
        let change = self.change();
        out.push_str(&format!(
            "\nstalled ÷ none: p50 {median:.2}, p99 {:.2} (p99 changes by {:+.1} %; target < {:.0} %: {}); {} rounds, {} markers written, the stalled watcher never reads\n",
            1.0 + change,
            change * 100.0,
            TARGET_STALLED_P99_CHANGE * 100.0,
            if change.abs() < TARGET_STALLED_P99_CHANGE { "met" } else { "MISSED" },
            self.rounds,
            self.markers,
        ));
        if let Some(noise) = self.noise() {
            out.push_str(&format!(
                "noise floor: p99 of the odd no-watcher rounds ÷ the even ones changes by {:+.1} %\n",
                noise * 100.0
            ));
        }
        out
    }
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
    Ok(out)
}

async fn stalled_phase(
    daemon: &DaemonProcess,
    admitter: &mut Client,
    session: &str,
    turns: usize,
    rounds: usize,
) -> Result<Stalled, Failure> {
    let first = next_marker(admitter).await?;
    let mut none = Vec::new();
    let mut none_rounds = Vec::new();
    let mut stalled = Vec::new();
    let mut next = 10_000_000;
    for _ in 0..rounds {
        tokio::time::sleep(SETTLE).await;
        let mut round = back_to_back(admitter, session, next, turns).await?;
        none.extend_from_slice(&round);
        round.sort_unstable();
        none_rounds.push(round);
        next += turns;
        // A watcher on its own connection, from the first marker, that
        // reads nothing at all.
        let mut watcher = client(daemon.addr).await?;
        let stream = watcher
            .watch_compactions(pb::WatchCompactionsRequest {
                from_seq: 1,
                ..Default::default()
            })
            .await?
            .into_inner();
        // Its replay from the log fills the connection's flow-control
        // window and stops: from then on it is stalled. The pause before
        // the no-watcher rounds matches this one.
        tokio::time::sleep(SETTLE).await;
        stalled.extend(back_to_back(admitter, session, next, turns).await?);
        next += turns;
        drop(stream);
        drop(watcher);
    }
    let markers = next_marker(admitter).await? - first;
    none.sort_unstable();
    stalled.sort_unstable();
    Ok(Stalled {
        none,
        stalled,
        none_rounds,
        rounds,
        markers,
    })
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs the three phases and prints their tables.
pub async fn run(args: &WatchArgs) -> Result<(), Failure> {
    if args.admitters == 0 || args.rate <= 0.0 {
        return Err("--admitters must be at least 1 and --rate above 0".into());
    }
    let started = Instant::now();
    let daemon = DaemonProcess::spawn(Durability::Flush)?;
    let mut clients = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..args.admitters {
        let mut client = client(daemon.addr).await?;
        let session = format!("watched-{i}");
        create_small(&mut client, &session, WINDOW_TOKENS).await?;
        warm_up(&mut client, &session).await?;
        clients.push(client);
        sessions.push(session);
    }
    let duration = Duration::from_secs_f64(args.duration.max(0.05));
    println!(
        "watch: {} watchers over {} connections; {} admitters, {:.0} admissions/s in all ({} sessions, window {WINDOW_TOKENS} tokens: nearly every admission compacts); {:.1} s per phase; durability flush",
        args.watchers,
        args.connections,
        args.admitters,
        args.rate,
        args.admitters,
        duration.as_secs_f64(),
    );

    let meter = PhaseMeter::start(daemon.pid())?;
    let quiet = paced(&clients, &sessions, args.rate, duration, 0).await?;
    let quiet_usage = meter.finish()?;

    let opening = Instant::now();
    let (channels, records, tasks) =
        open_watchers(daemon.addr, args.watchers, args.connections).await?;
    let opened_in = opening.elapsed();
    let meter = PhaseMeter::start(daemon.pid())?;
    let watched = paced(&clients, &sessions, args.rate, duration, 100_000).await?;
    let watched_usage = meter.finish()?;
    // Stragglers: give the last markers time to arrive.
    let expected = watched.markers.len();
    let grace = Instant::now() + Duration::from_secs(5);
    loop {
        let complete = records
            .iter()
            .all(|r| r.lock().map_or(true, |seen| seen.len() >= expected));
        if complete || Instant::now() >= grace {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivery = deliveries(&watched, &records);
    if let Some(path) = &args.csv {
        write_csv(path, &watched, &records)?;
    }
    for task in &tasks {
        task.abort();
    }
    drop(channels);

    let phase_row = |name: &str, p: &Paced, usage: &PhaseUsage| {
        let q = Quantiles::of(&p.latencies);
        format!(
            "| {name} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.2} | {:.0} |",
            p.latencies.len(),
            per_second(p.markers.len() as f64, usage_window(usage)),
            q.p50,
            q.p90,
            q.p99,
            q.max,
            p.errors,
            usage.cores(),
            usage.peak_rss_bytes as f64 / f64::from(1u32 << 20),
        )
    };
    println!();
    println!(
        "| phase | admissions | markers/s | admit p50 µs | admit p90 µs | admit p99 µs | admit max µs | errors | daemon CPU cores | daemon peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!("{}", phase_row("no watchers", &quiet, &quiet_usage));
    println!(
        "{}",
        phase_row(
            &format!("{} watchers", args.watchers),
            &watched,
            &watched_usage
        )
    );
    println!();
    let send = Quantiles::of(&delivery.from_send);
    let reply = |p: f64| percentile(&delivery.from_reply_us, p);
    println!(
        "| marker delivery ({} watchers) | deliveries | p50 µs | p90 µs | p99 µs | max µs |",
        args.watchers
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| from the admitting client's send | {} of {} | {:.0} | {:.0} | {:.0} | {:.0} |",
        delivery.delivered, delivery.expected, send.p50, send.p90, send.p99, send.max
    );
    println!(
        "| from the admitting client's reply | {} of {} | {:.0} | {:.0} | {:.0} | {:.0} |",
        delivery.delivered,
        delivery.expected,
        reply(0.5),
        reply(0.9),
        reply(0.99),
        delivery.from_reply_us.last().copied().unwrap_or(0.0)
    );
    println!();
    let p99 = percentile(&delivery.from_send, 0.99);
    println!(
        "delivery p99 from send: {:.1} ms (target ≤ {} ms: {}); every marker reached every watcher: {}; {} watchers opened and caught up in {:.2} s",
        us(p99) / 1e3,
        TARGET_DELIVERY_P99.as_millis(),
        if p99 <= TARGET_DELIVERY_P99 && delivery.delivered > 0 {
            "met"
        } else {
            "MISSED"
        },
        if delivery.delivered == delivery.expected {
            "yes"
        } else {
            "NO"
        },
        args.watchers,
        opened_in.as_secs_f64(),
    );
    let extra_cpu = (watched_usage.cpu_seconds - quiet_usage.cpu_seconds).max(0.0);
    println!(
        "daemon CPU for the fan-out: {:.1} µs per delivery ({:.2} s more than without watchers, over {} deliveries)",
        extra_cpu * 1e6 / delivery.delivered.max(1) as f64,
        extra_cpu,
        delivery.delivered
    );
    let admit_ratio = Quantiles::of(&watched.latencies).p99
        / Quantiles::of(&quiet.latencies).p99.max(f64::MIN_POSITIVE);
    println!(
        "admission p99 with {} live watchers ÷ none: {admit_ratio:.2}",
        args.watchers
    );

    if args.stalled_rounds > 0 {
        let stalled = stalled_phase(
            &daemon,
            &mut clients[0],
            &sessions[0],
            args.stalled_turns,
            args.stalled_rounds,
        )
        .await?;
        println!();
        print!("{}", stalled.render());
    }
    println!("total run time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn usage_window(usage: &PhaseUsage) -> Duration {
    Duration::from_secs_f64(usage.wall_seconds)
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;

    use super::*;

    #[test]
    fn the_stalled_watcher_takes_turns_and_rounds() {
        let args = StalledArgs::try_parse_from(["stalled-watcher", "200"]).unwrap();
        assert_eq!((args.turns, args.rounds), (200, 4));
        let help = StalledArgs::try_parse_from(["stalled-watcher", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
    }
}
