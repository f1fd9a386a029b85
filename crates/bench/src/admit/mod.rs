//! `admit`: admission throughput and latency of a daemon in a child
//! process under a realistic turn mix, against baselines measured in the
//! same run on the same machine.
//!
//! Rows:
//!
//! - the durable daemon (`--durability flush`, the default): its no-op
//!   floor (`GetServerInfo`), then `Admit` of the turn mix;
//! - the same with durability relaxed (`--durability relaxed`);
//! - Redis `RPUSH` with `appendfsync always`: the same texts in the same
//!   order, one list per session, the same number of clients;
//! - a latency probe on each daemon: one client alternating a no-op and
//!   a short user message that compacts nothing, so both meet the same
//!   idle server.
//!
//! The loaded rows run in `--rounds` interleaved rounds (durable no-op,
//! durable admit, Redis, relaxed no-op, relaxed admit; then again), each
//! segment `--warmup` seconds unrecorded and `--duration / --rounds`
//! seconds recorded, so that the machine's other load falls on every row
//! alike. Between segments the run waits for the servers to go idle (the
//! daemon's background pre-compactions finish), so no row pays for
//! another's work.
//!
//! Every loaded row runs `--clients` closed-loop clients (each sends its
//! next request when its reply arrives). Client `c` owns the sessions `s`
//! with `s % clients == c` and admits to them in turn. Before the rounds
//! every session is filled with large tool outputs to between 60 % and
//! 100 % of its pre-compaction target, so compactions start within the
//! run and do not all come at once.
//!
//! The servers' CPU time (utime + stime from `/proc/PID/stat`) and peak
//! resident set (`VmHWM`, reset at the start of each segment; the largest
//! segment's) cover the recorded windows only; so does the load
//! generator's own CPU, reported beside them. Compactions per second
//! count every marker the daemon wrote in the windows: inline ones (the
//! admission needed room) and background pre-compactions above the soft
//! watermark.
//!
//! After the tables, the split (`split.rs`, skipped with `--no-split`,
//! run alone with `--split-only`): one admission of a short user message
//! in process, its path cut into parse, count, classify, plan, write,
//! apply and encode, on sessions of 1k, 10k and 100k live spans, to show
//! that the cost of an admission that fits does not grow with the
//! session. Then the work that grows with a turn's size (`per_byte.rs`):
//! counting, the facts' seed, the term vector and the facts, per byte of
//! the mix's turns.

mod flat;
mod instructions;
mod load;
pub mod per_byte;
mod redis;
pub mod split;
pub(crate) mod workload;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use ctxbroker_proto::v1 as pb;
use ctxbroker_server::config::Durability;

pub use crate::common::Quantiles;
use crate::common::{Client, Failure, client, next_marker};
use crate::daemon::{DaemonProcess, PhaseMeter, PhaseUsage, Usage};
pub use load::{Op, Outcome, Samples, closed_loop, per_second};
pub use redis::{RedisProcess, RespConn, Unavailable};
pub use split::{SplitPlan, SplitRow};
pub use workload::{Mix, Turn, Workload};

/// Relaxed durability: Admit p50 (no compaction) at most this many times
/// the no-op p50 on the same server.
pub const TARGET_RELAXED_P50_RATIO: f64 = 1.5;
/// The relaxed ratio aimed at beyond the target.
pub const AIM_RELAXED_P50_RATIO: f64 = 1.3;
/// Durable: admits/s at least this many times Redis `RPUSH`/s.
pub const TARGET_DURABLE_VS_REDIS: f64 = 0.5;
/// The durable ratio aimed at beyond the target.
pub const AIM_DURABLE_VS_REDIS: f64 = 1.0;

/// `ctxbroker-bench admit`: admission throughput and latency against the
/// no-op floor, relaxed durability and Redis.
#[derive(Debug, Clone, Parser)]
#[command(name = "ctxbroker-bench admit")]
pub struct AdmitArgs {
    /// Seconds recorded per loaded row, over all rounds.
    #[arg(long, default_value_t = 12.0)]
    pub duration: f64,
    /// Interleaved rounds the recorded seconds are split into.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds of load before each segment's recording starts.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Concurrent closed-loop clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Sessions, spread over the clients.
    #[arg(long, default_value_t = 64)]
    pub sessions: usize,
    /// HTTP/2 connections the daemon clients share (Redis clients have
    /// one each: RESP does not multiplex).
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Every session's window, in tokens.
    #[arg(long, default_value_t = 200_000)]
    pub window: u32,
    /// The largest tool output, in tokens.
    #[arg(long, default_value_t = 120_000)]
    pub max_tool_tokens: u32,
    /// Every this many turns of a session, one is a constraint.
    #[arg(long, default_value_t = 25)]
    pub constraint_every: u64,
    /// Request pairs (no-op, admit) of each latency probe.
    #[arg(long, default_value_t = 2000)]
    pub probe: usize,
    /// Skip the Redis row.
    #[arg(long)]
    pub no_redis: bool,
    /// The daemons' `session_cache_bytes`, in MiB (their
    /// `memory_budget_bytes` raised to match when smaller); the daemon's
    /// default when not given. With the default workload the sessions
    /// hold more than the default cache, so some are reloaded (see
    /// `ctxbroker_session_loads_total`).
    #[arg(long, value_name = "MIB")]
    pub session_cache_mib: Option<u64>,
    /// Also write every recorded latency of every row (the probes too)
    /// to this file as CSV: row, server, compacted, latency_us.
    #[arg(long, value_name = "PATH", conflicts_with = "split_only")]
    pub csv: Option<PathBuf>,
    /// Only these daemons (comma-separated: durable, relaxed); both by
    /// default.
    #[arg(long, value_delimiter = ',', default_values_t = [DaemonKind::Durable, DaemonKind::Relaxed])]
    pub daemons: Vec<DaemonKind>,
    /// Skip the in-process split of an admission into its stages.
    #[arg(long, conflicts_with = "split_only")]
    pub no_split: bool,
    /// Run only the split: no daemon, no Redis.
    #[arg(long)]
    pub split_only: bool,
    /// The split's session sizes, in live spans (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 10_000, 100_000])]
    pub split_sizes: Vec<usize>,
    /// Admissions the split records per size.
    #[arg(long, default_value_t = 2000)]
    pub split_admissions: usize,
    /// Admissions per size before those, not recorded.
    #[arg(long, default_value_t = 200)]
    pub split_warmup: usize,
    /// Turns of the mix the split's per-byte table reads (0 skips it).
    #[arg(long, default_value_t = 4096)]
    pub split_mix_turns: usize,
    /// Skip the rows of the daemon's CPU per admission that fits, against
    /// the session's size.
    #[arg(long, conflicts_with = "split_only")]
    pub no_flat: bool,
    /// Those rows' session sizes, in live spans (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 10_000, 100_000])]
    pub flat_sizes: Vec<usize>,
    /// Requests those rows record per size (no-ops, then as many
    /// admissions).
    #[arg(long, default_value_t = 5000)]
    pub flat_requests: usize,
    /// Clients of the flat rows under load, at the first size: each has a
    /// session of its own, and they send `--flat-requests` requests in
    /// all (0: no such rows).
    #[arg(long, default_value_t = 16)]
    pub flat_clients: usize,
    /// The split's recorded admissions are interleaved: each size makes
    /// this many before the next size's turn.
    #[arg(long, default_value_t = 10)]
    pub split_chunk: usize,
    /// Run only the count of the daemon's instructions per request, at
    /// the flat rows' sizes (`--flat-sizes`), each daemon under valgrind's
    /// callgrind (valgrind must be installed): no loaded rows, no Redis,
    /// no split.
    #[arg(long, conflicts_with = "split_only")]
    pub instructions: bool,
    /// Requests each phase of that count sends (no-ops, admissions, keyed
    /// admissions); the daemon runs about fifty times slower under
    /// callgrind.
    #[arg(long, default_value_t = 500)]
    pub instructions_requests: usize,
    /// Count the daemon of this `ctxbroker-bench` binary instead of this
    /// one's (another build, to compare with).
    #[arg(long, value_name = "PATH", requires = "instructions")]
    pub instructions_daemon: Option<PathBuf>,
    /// Keep the count's callgrind dumps in this directory, one per row
    /// (the run names each), to read with `callgrind_annotate`; they are
    /// deleted otherwise.
    #[arg(long, value_name = "DIR", requires = "instructions")]
    pub instructions_keep: Option<PathBuf>,
}

/// A daemon configuration of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DaemonKind {
    /// `--durability flush`: every reply waits for its flush.
    Durable,
    /// `--durability relaxed`: replies before the flush.
    Relaxed,
}

impl DaemonKind {
    fn durability(self) -> Durability {
        match self {
            DaemonKind::Durable => Durability::Flush,
            DaemonKind::Relaxed => Durability::Relaxed,
        }
    }

    fn server(self) -> &'static str {
        match self {
            DaemonKind::Durable => "ctxbroker, durable",
            DaemonKind::Relaxed => "ctxbroker, relaxed",
        }
    }
}

impl std::fmt::Display for DaemonKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DaemonKind::Durable => "durable",
            DaemonKind::Relaxed => "relaxed",
        })
    }
}

impl AdmitArgs {
    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup.max(0.0))
    }

    /// The recorded seconds of one segment.
    fn segment(&self) -> Duration {
        Duration::from_secs_f64((self.duration / self.rounds.max(1) as f64).max(0.05))
    }

    /// The turn mix the flags ask for.
    fn mix(&self) -> Mix {
        Mix {
            max_tool_tokens: self.max_tool_tokens,
            constraint_every: self.constraint_every,
            ..Mix::default()
        }
    }

    /// What the split measures.
    fn split(&self) -> SplitPlan {
        SplitPlan {
            sizes: self.split_sizes.clone(),
            admissions: self.split_admissions,
            warmup: self.split_warmup,
            chunk: self.split_chunk,
            mix: self.mix(),
            mix_turns: self.split_mix_turns,
        }
    }
}

/// `admit [flags]`.
pub async fn admit_main(args: &[String]) -> Result<(), Failure> {
    let args: AdmitArgs = crate::common::flags("admit", args);
    run(&args).await
}

/// One line of the table, accumulated over the rounds.
#[derive(Debug, Default)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// The server.
    pub server: String,
    /// Concurrent clients.
    pub clients: usize,
    /// What the clients recorded.
    pub samples: Samples,
    /// Markers the daemon wrote in the windows (none for other rows).
    pub markers: Option<u64>,
    /// The server's CPU and peak memory in the windows.
    pub usage: Option<PhaseUsage>,
    /// The load generator's own CPU seconds in the windows.
    pub client_cpu: Option<f64>,
}

impl Row {
    fn new(name: &str, server: &str, clients: usize) -> Row {
        Row {
            name: name.to_owned(),
            server: server.to_owned(),
            clients,
            ..Row::default()
        }
    }

    fn add(&mut self, segment: Segment) {
        self.samples.merge(segment.samples);
        self.samples.sort();
        if let Some(m) = segment.markers {
            *self.markers.get_or_insert(0) += m;
        }
        let usage = self.usage.get_or_insert_with(PhaseUsage::default);
        usage.cpu_seconds += segment.usage.cpu_seconds;
        usage.wall_seconds += segment.usage.wall_seconds;
        usage.peak_rss_bytes = usage.peak_rss_bytes.max(segment.usage.peak_rss_bytes);
        for (sum, part) in usage
            .threads
            .seconds
            .iter_mut()
            .zip(segment.usage.threads.seconds)
        {
            *sum += part;
        }
        *self.client_cpu.get_or_insert(0.0) += segment.client_cpu;
    }

    /// Requests per second.
    pub fn rate(&self) -> f64 {
        self.samples.rate()
    }

    /// The median latency of replies without a compaction, µs.
    pub fn plain_p50(&self) -> f64 {
        Quantiles::of(&self.samples.plain).p50
    }

    /// The row's server CPU per request by thread group, for a daemon's
    /// row: `| row | server | runtime | engine I/O | writer | flusher | other |`.
    fn render_threads(&self) -> Option<String> {
        let n = self.samples.all().len();
        let usage = self.usage.filter(|_| n > 0)?;
        let [runtime, io, writer, flusher, other] =
            usage.threads.seconds.map(|s| s * 1e6 / n as f64);
        Some(format!(
            "| {} | {} | {runtime:.0} | {io:.0} | {writer:.0} | {flusher:.0} | {other:.0} |",
            self.name, self.server
        ))
    }

    fn render(&self) -> String {
        let all = self.samples.all();
        let q = Quantiles::of(&all);
        let n = all.len();
        let dash = || "–".to_owned();
        let per_req = |seconds: f64| {
            if n == 0 {
                dash()
            } else {
                format!("{:.0}", seconds * 1e6 / n as f64)
            }
        };
        let compactions = self.markers.map_or_else(dash, |m| {
            format!("{:.1}", per_second(m as f64, self.samples.window))
        });
        let (cores, cpu, rss) = match self.usage {
            Some(u) => (
                format!("{:.2}", u.cores()),
                per_req(u.cpu_seconds),
                format!("{:.0}", u.peak_rss_bytes as f64 / f64::from(1u32 << 20)),
            ),
            None => (dash(), dash(), dash()),
        };
        let client = self.client_cpu.map_or_else(dash, per_req);
        format!(
            "| {} | {} | {} | {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {compactions} | {cores} | {cpu} | {rss} | {client} | {} |",
            self.name,
            self.server,
            self.clients,
            self.samples.rate(),
            q.p50,
            q.p90,
            q.p99,
            q.max,
            self.plain_p50(),
            self.samples.errors,
        )
    }
}

/// The header of the table of the daemons' CPU by thread group.
pub const THREADS_HEADER: &str = "| row | server | runtime µs/req | engine I/O µs/req | writer µs/req | flusher µs/req | other µs/req |\n|---|---|---|---|---|---|---|";

/// The table's header.
pub const HEADER: &str = "| row | server | clients | requests | req/s | p50 µs | p90 µs | p99 µs | max µs | p50 µs, no compaction | compactions/s | server CPU cores | server CPU µs/req | server peak RSS MiB | load generator CPU µs/req | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// What one recorded segment of a row measured.
#[derive(Debug)]
struct Segment {
    samples: Samples,
    markers: Option<u64>,
    usage: PhaseUsage,
    client_cpu: f64,
}

/// A daemon of the run, with its clients.
struct Target {
    kind: DaemonKind,
    daemon: DaemonProcess,
    channels: Vec<Client>,
    noop: Row,
    admit: Row,
}

/// Runs every row and prints the table and the ratios, then the split
/// (or the split alone, with `--split-only`).
pub async fn run(args: &AdmitArgs) -> Result<(), Failure> {
    if args.split_only {
        return split::section(args.split()).await;
    }
    if args.clients == 0 || args.sessions == 0 || args.connections == 0 || args.rounds == 0 {
        return Err("--clients, --sessions, --connections and --rounds must be at least 1".into());
    }
    let started = Instant::now();
    let workload = Arc::new(Workload::generate(args.mix()));
    if args.instructions {
        return instructions::run(args, &workload).await;
    }
    let (tools, median, p99, largest) = workload.tool_sizes();
    println!(
        "workload: {} sessions, {} clients, {} HTTP/2 connections, window {} tokens; a turn is {:.0} tokens ({:.0} bytes) on average; \
         {tools} tool outputs among {} pooled turns: median {median}, p99 {p99}, largest {largest} tokens; a constraint every {} turns of a session",
        args.sessions,
        args.clients,
        args.connections,
        args.window,
        workload.mean_turn_tokens(),
        workload.mean_turn_bytes(),
        workload.pool.len(),
        workload.constraint_every,
    );
    println!(
        "rounds: {} × ({:.1} s warm-up + {:.1} s recorded) per row",
        args.rounds,
        args.warmup().as_secs_f64(),
        args.segment().as_secs_f64()
    );

    let mut targets = Vec::new();
    for kind in &args.daemons {
        let extra: Vec<String> = match args.session_cache_mib {
            Some(mib) => vec!["--session-cache-bytes".to_owned(), (mib << 20).to_string()],
            None => Vec::new(),
        };
        let daemon = DaemonProcess::spawn_with(kind.durability(), &extra)?;
        let channels = connect(daemon.addr, args.connections).await?;
        prefill(&channels, &workload, args, *kind).await?;
        targets.push(Target {
            kind: *kind,
            daemon,
            channels,
            noop: Row::new("no-op GetServerInfo", kind.server(), args.clients),
            admit: Row::new(&format!("Admit, {kind}"), kind.server(), args.clients),
        });
    }
    let mut redis = None;
    let mut skipped = None;
    if args.no_redis {
        skipped = Some("--no-redis was given".to_owned());
    } else {
        match RedisProcess::start().await {
            Ok(server) => redis = Some(server),
            Err(why) => skipped = Some(why.to_string()),
        }
    }
    let mut redis_row = Row::new(
        "Redis RPUSH, appendfsync always",
        "redis-server",
        args.clients,
    );

    for round in 0..args.rounds {
        for target in &mut targets {
            let pid = target.daemon.pid();
            settle(pid).await;
            let ops = (0..args.clients)
                .map(|c| NoOp {
                    client: target.channels[c % target.channels.len()].clone(),
                })
                .collect();
            target.noop.add(measured(pid, None, ops, args).await?);
            settle(pid).await;
            let ops = (0..args.clients)
                .map(|c| AdmitOp {
                    client: target.channels[c % target.channels.len()].clone(),
                    schedule: Schedule::new(workload.clone(), c, args, round),
                })
                .collect();
            let info = Some(target.channels[0].clone());
            target.admit.add(measured(pid, info, ops, args).await?);
            if target.kind == DaemonKind::Durable
                && let Some(server) = &redis
            {
                // Redis right after the durable daemon: the pair the
                // durable target compares.
                match redis_segment(server, &workload, args, round).await {
                    Ok(segment) => redis_row.add(segment),
                    Err(err) => {
                        skipped = Some(format!("the Redis run failed: {err}"));
                        redis = None;
                    }
                }
            }
        }
        if targets.is_empty()
            && let Some(server) = &redis
        {
            redis_row.add(redis_segment(server, &workload, args, round).await?);
        }
    }
    let mut probes = Vec::new();
    for target in &targets {
        settle(target.daemon.pid()).await;
        probes.push((
            target.kind,
            probe(&target.channels[0], &workload, args, target.kind.server()).await?,
        ));
    }
    drop(redis);
    let mut flat = Vec::new();
    if !args.no_flat {
        for target in &targets {
            settle(target.daemon.pid()).await;
            let mut rows = flat::rows(
                &target.channels[0],
                target.daemon.pid(),
                target.daemon.metrics,
                &workload,
                &args.flat_sizes,
                args.flat_requests,
            )
            .await?;
            if let Some(&size) = args.flat_sizes.first() {
                settle(target.daemon.pid()).await;
                rows.extend(
                    flat::loaded_rows(
                        &target.channels,
                        target.daemon.pid(),
                        target.daemon.metrics,
                        &workload,
                        size,
                        args.flat_clients,
                        args.flat_requests,
                    )
                    .await?,
                );
            }
            flat.push((target.kind, rows));
        }
    }

    println!();
    println!("{HEADER}");
    for target in &targets {
        println!("{}", target.noop.render());
        println!("{}", target.admit.render());
    }
    match &skipped {
        None => println!("{}", redis_row.render()),
        Some(_) => println!(
            "| Redis RPUSH, appendfsync always | skipped | {} | – | – | – | – | – | – | – | – | – | – | – | – | – |",
            args.clients
        ),
    }
    for (_, probe) in &probes {
        println!("{}", probe.noop.render());
        println!("{}", probe.admit.render());
    }
    println!();
    println!("the daemons' CPU µs per request by thread group, loaded rows:");
    println!();
    println!("{THREADS_HEADER}");
    for target in &targets {
        for row in [&target.noop, &target.admit] {
            if let Some(line) = row.render_threads() {
                println!("{line}");
            }
        }
    }
    if !flat.is_empty() {
        println!();
        println!(
            "daemon CPU per request that fits, one client, against the session's live spans, then {} clients at the first size ({} requests per row):",
            args.flat_clients, args.flat_requests
        );
        println!();
        for (kind, rows) in &flat {
            print!("{}", flat::render(&kind.to_string(), rows));
        }
    }
    println!();
    match &skipped {
        Some(why) => println!("Redis row skipped: {why}"),
        None => println!("Redis: {}", RedisProcess::version()),
    }

    println!();
    println!("ratios (same run, same machine):");
    let admit_of = |kind: DaemonKind| targets.iter().find(|t| t.kind == kind);
    match (admit_of(DaemonKind::Durable), skipped.is_none()) {
        (Some(durable), true) => {
            let ratio = durable.admit.rate() / redis_row.rate().max(f64::MIN_POSITIVE);
            println!(
                "- durable admits/s ÷ Redis RPUSH/s at {} clients: {:.0} / {:.0} = {ratio:.2} (target ≥ {TARGET_DURABLE_VS_REDIS:.1}: {}; aim ≥ {AIM_DURABLE_VS_REDIS:.1}: {})",
                args.clients,
                durable.admit.rate(),
                redis_row.rate(),
                verdict(ratio >= TARGET_DURABLE_VS_REDIS),
                verdict(ratio >= AIM_DURABLE_VS_REDIS)
            );
        }
        _ => println!("- durable admits/s ÷ Redis RPUSH/s: not measured"),
    }
    for (kind, p) in &probes {
        let ratio = p.admit.plain_p50() / p.noop.plain_p50().max(f64::MIN_POSITIVE);
        let judged = match kind {
            DaemonKind::Relaxed => format!(
                "target ≤ {TARGET_RELAXED_P50_RATIO}: {}; aim ≤ {AIM_RELAXED_P50_RATIO}: {}",
                verdict(ratio <= TARGET_RELAXED_P50_RATIO),
                verdict(ratio <= AIM_RELAXED_P50_RATIO)
            ),
            DaemonKind::Durable => "no target: each reply waits for its flush".to_owned(),
        };
        println!(
            "- {kind} Admit p50 (no compaction) ÷ no-op p50, one client: {:.0} µs / {:.0} µs = {ratio:.2} ({judged})",
            p.admit.plain_p50(),
            p.noop.plain_p50(),
        );
    }
    if let Some(relaxed) = admit_of(DaemonKind::Relaxed) {
        let (admit, noop) = (relaxed.admit.plain_p50(), relaxed.noop.plain_p50());
        println!(
            "- relaxed Admit p50 (no compaction) ÷ no-op p50 at {} clients: {admit:.0} µs / {noop:.0} µs = {:.2} (saturated: both latencies are mostly queueing, so this follows the work per request)",
            args.clients,
            admit / noop.max(f64::MIN_POSITIVE)
        );
    }
    if let (Some(d), Some(r)) = (admit_of(DaemonKind::Durable), admit_of(DaemonKind::Relaxed)) {
        println!(
            "- durable ÷ relaxed admits/s: {:.2}",
            d.admit.rate() / r.admit.rate().max(f64::MIN_POSITIVE)
        );
    }
    let rows = targets
        .iter()
        .flat_map(|t| [&t.noop, &t.admit])
        .chain(std::iter::once(&redis_row));
    let mut errors = 0;
    let mut first = None;
    for row in rows {
        errors += row.samples.errors;
        if first.is_none() {
            first.clone_from(&row.samples.first_error);
        }
    }
    if errors > 0 {
        println!("errors: {errors}; the first: {}", first.unwrap_or_default());
    }
    if let Some(path) = &args.csv {
        let rows = targets
            .iter()
            .flat_map(|t| [&t.noop, &t.admit])
            .chain(skipped.is_none().then_some(&redis_row))
            .chain(probes.iter().flat_map(|(_, p)| [&p.noop, &p.admit]));
        write_csv(path, rows)?;
    }
    if !args.no_split {
        // The daemons stop first, so that nothing of theirs runs beside
        // the split.
        drop(targets);
        split::section(args.split()).await?;
    }
    println!("total run time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Writes every latency of `rows` to `path`: one line per request, the
/// row's name and server as in the table, whether the reply carried a
/// compaction, and the latency in µs.
pub fn write_csv<'a>(path: &Path, rows: impl Iterator<Item = &'a Row>) -> Result<(), Failure> {
    let file =
        std::fs::File::create(path).map_err(|err| format!("--csv {}: {err}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "row,server,compacted,latency_us")?;
    for row in rows {
        for (compacted, latencies) in [(0, &row.samples.plain), (1, &row.samples.compacted)] {
            for d in latencies {
                writeln!(
                    out,
                    "\"{}\",\"{}\",{compacted},{:.3}",
                    row.name,
                    row.server,
                    d.as_secs_f64() * 1e6
                )?;
            }
        }
    }
    out.flush()?;
    eprintln!("latencies written to {}", path.display());
    Ok(())
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// Waits (at most 10 s) until the process has been idle for 300 ms: less
/// than 3 % of a core.
async fn settle(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = Usage::of(pid).map(|u| u.cpu_seconds).unwrap_or(0.0);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = Usage::of(pid).map(|u| u.cpu_seconds).unwrap_or(last);
        if now - last < 0.01 {
            return;
        }
        last = now;
    }
}

/// `n` HTTP/2 connections to the daemon.
async fn connect(addr: std::net::SocketAddr, n: usize) -> Result<Vec<Client>, Failure> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(client(addr).await?);
    }
    Ok(clients)
}

fn session_id(s: usize) -> String {
    format!("agent-{s:05}")
}

/// The sessions client `c` of `clients` admits to.
fn owned(c: usize, clients: usize, sessions: usize) -> Vec<usize> {
    let mine: Vec<usize> = (c..sessions).step_by(clients).collect();
    if mine.is_empty() {
        vec![c % sessions]
    } else {
        mine
    }
}

/// Creates every session and fills it with large tool outputs to between
/// 60 % and 100 % of what a pre-compaction leaves.
async fn prefill(
    channels: &[Client],
    workload: &Arc<Workload>,
    args: &AdmitArgs,
    kind: DaemonKind,
) -> Result<(), Failure> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients.min(args.sessions) {
        let mut client = channels[c % channels.len()].clone();
        let workload = workload.clone();
        let sessions = owned(c, args.clients, args.sessions);
        let (window, count) = (args.window, args.sessions);
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0usize;
            for s in sessions {
                let created = client
                    .create_session(pb::CreateSessionRequest {
                        session_id: session_id(s),
                        config: Some(pb::SessionConfig {
                            window_tokens: Some(window),
                            ..Default::default()
                        }),
                    })
                    .await?
                    .into_inner();
                let totals = created.session.and_then(|s| s.totals).unwrap_or_default();
                // What a pre-compaction leaves: as far below the soft
                // watermark as the watermark is below the budget.
                let (soft, budget) = (totals.soft_watermark_tokens, totals.budget_tokens);
                let target = soft.saturating_sub(budget.saturating_sub(soft));
                let fill = f64::from(target) * (0.6 + 0.4 * s as f64 / count as f64);
                let mut live = 0u32;
                let mut n = s;
                loop {
                    let turn = &workload.prefill[n % workload.prefill.len()];
                    n += 1;
                    if f64::from(live.saturating_add(turn.tokens)) > fill {
                        break;
                    }
                    let reply = client
                        .admit(pb::AdmitRequest {
                            session_id: session_id(s),
                            spans: vec![span(turn)],
                        })
                        .await?
                        .into_inner();
                    live = reply.totals.map_or(live, |t| t.live_tokens);
                    admitted += 1;
                }
            }
            Ok::<usize, Failure>(admitted)
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await??;
    }
    println!(
        "prefill ({kind}): {} sessions, {admitted} tool outputs of about 8,000 tokens, {:.1} s",
        args.sessions,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn span(turn: &Turn) -> pb::SpanInput {
    pb::SpanInput {
        role: turn.role as i32,
        text: turn.text.clone(),
        ..Default::default()
    }
}

/// Runs `ops` closed-loop for one segment while measuring the server's
/// CPU and peak memory, the load generator's CPU, and (given a daemon
/// client) the markers written, over the recorded window.
async fn measured<O: Op>(
    pid: u32,
    info: Option<Client>,
    ops: Vec<O>,
    args: &AdmitArgs,
) -> Result<Segment, Failure> {
    let (warmup, window) = (args.warmup(), args.segment());
    let meter = tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        let mut info = info;
        let first = match info.as_mut() {
            Some(client) => Some(next_marker(client).await?),
            None => None,
        };
        let server = PhaseMeter::start(pid)?;
        let client = PhaseMeter::start(std::process::id())?;
        tokio::time::sleep(window).await;
        let usage = server.finish()?;
        let client_cpu = client.finish()?.cpu_seconds;
        let markers = match (info.as_mut(), first) {
            (Some(client), Some(first)) => Some(next_marker(client).await?.saturating_sub(first)),
            _ => None,
        };
        Ok::<_, Failure>((markers, usage, client_cpu))
    });
    let samples = closed_loop(ops, warmup, window).await;
    let (markers, usage, client_cpu) = meter.await??;
    Ok(Segment {
        samples,
        markers,
        usage,
        client_cpu,
    })
}

struct NoOp {
    client: Client,
}

impl Op for NoOp {
    async fn call(&mut self) -> Result<Outcome, Failure> {
        self.client
            .get_server_info(pb::GetServerInfoRequest {})
            .await?;
        Ok(Outcome::default())
    }
}

/// Which session a client admits to next, and which turn: the same
/// sequence for the daemon and for Redis.
#[derive(Debug)]
struct Schedule {
    workload: Arc<Workload>,
    sessions: Vec<(String, u64)>,
    next: usize,
    draw: u64,
}

impl Schedule {
    /// Client `c`'s schedule in `round`: each round starts further into
    /// the pool, so rounds admit different turns.
    fn new(workload: Arc<Workload>, c: usize, args: &AdmitArgs, round: usize) -> Schedule {
        Schedule {
            workload,
            sessions: owned(c, args.clients, args.sessions)
                .into_iter()
                .map(|s| (session_id(s), (round as u64) * 1_000))
                .collect(),
            next: 0,
            draw: (c as u64).wrapping_mul(613) + (round as u64) * 1_511,
        }
    }

    /// The session and the turn of the next request.
    fn step(&mut self) -> (&str, &Turn) {
        let at = self.next % self.sessions.len();
        self.next += 1;
        let (id, turns) = &mut self.sessions[at];
        let turn = self.workload.next(*turns, self.draw);
        *turns += 1;
        self.draw += 1;
        (id.as_str(), turn)
    }
}

struct AdmitOp {
    client: Client,
    schedule: Schedule,
}

impl Op for AdmitOp {
    async fn call(&mut self) -> Result<Outcome, Failure> {
        let (session, turn) = self.schedule.step();
        let request = pb::AdmitRequest {
            session_id: session.to_owned(),
            spans: vec![span(turn)],
        };
        let reply = self.client.admit(request).await?.into_inner();
        Ok(Outcome {
            compacted: reply.compaction.is_some(),
        })
    }
}

struct RpushOp {
    conn: RespConn,
    schedule: Schedule,
}

impl Op for RpushOp {
    async fn call(&mut self) -> Result<Outcome, Failure> {
        let (session, turn) = self.schedule.step();
        self.conn.rpush(session, turn.text.as_bytes()).await?;
        Ok(Outcome::default())
    }
}

async fn redis_segment(
    server: &RedisProcess,
    workload: &Arc<Workload>,
    args: &AdmitArgs,
    round: usize,
) -> Result<Segment, Failure> {
    let mut ops = Vec::with_capacity(args.clients);
    for c in 0..args.clients {
        ops.push(RpushOp {
            conn: RespConn::connect(server.addr).await?,
            schedule: Schedule::new(workload.clone(), c, args, round),
        });
    }
    settle(server.pid()).await;
    measured(server.pid(), None, ops, args).await
}

/// The two rows of a latency probe.
#[derive(Debug)]
struct Probe {
    noop: Row,
    admit: Row,
}

/// One client alternating a no-op and a short user message on a fresh
/// session that never compacts within the probe.
async fn probe(
    client: &Client,
    workload: &Workload,
    args: &AdmitArgs,
    server: &str,
) -> Result<Probe, Failure> {
    let mut client = client.clone();
    let session = "probe".to_owned();
    client
        .create_session(pb::CreateSessionRequest {
            session_id: session.clone(),
            config: Some(pb::SessionConfig {
                window_tokens: Some(args.window),
                ..Default::default()
            }),
        })
        .await?;
    let shorts: Vec<&Turn> = workload
        .pool
        .iter()
        .filter(|t| t.role == pb::Role::User)
        .collect();
    let warm = args.probe / 10;
    let mut noop = Samples::default();
    let mut admit = Samples::default();
    for n in 0..warm + args.probe {
        let t0 = Instant::now();
        client.get_server_info(pb::GetServerInfoRequest {}).await?;
        let t1 = Instant::now();
        let turn = shorts[n % shorts.len().max(1)];
        let reply = client
            .admit(pb::AdmitRequest {
                session_id: session.clone(),
                spans: vec![span(turn)],
            })
            .await?
            .into_inner();
        let t2 = Instant::now();
        if n < warm {
            continue;
        }
        noop.plain.push(t1 - t0);
        if reply.compaction.is_some() {
            admit.compacted.push(t2 - t1);
        } else {
            admit.plain.push(t2 - t1);
        }
    }
    // Each row's rate is its own: requests over the time spent in them.
    noop.window = noop.plain.iter().sum();
    admit.window = admit.plain.iter().chain(&admit.compacted).sum();
    noop.sort();
    admit.sort();
    let row = |name: &str, samples: Samples| Row {
        samples,
        ..Row::new(name, server, 1)
    };
    Ok(Probe {
        noop: row("probe: no-op GetServerInfo", noop),
        admit: row("probe: Admit, short user message", admit),
    })
}
