//! `storage`: what a populated daemon costs at rest and at restart.
//!
//! The workload: `--sessions` sessions (default 10,000), each admitted
//! `--spans` spans (default 1,000) through the daemon's real admission path
//! (unary `Admit`, up to 256 spans per turn, a window of 10M tokens so that
//! nothing compacts), by `--clients` concurrent clients. The daemon is a
//! child process (by default this very binary serving `ctxbroker_server`
//! exactly as `ctxbrokerd` does, through `storage serve`; `--daemon PATH`
//! runs a `ctxbrokerd` instead), so the memory measured is the daemon's
//! alone.
//!
//! Span texts are generated deterministically from (session, span), so the
//! raw-text baseline and the read-back check need nothing kept in memory:
//! 60 % are 80–299 bytes, 30 % 300–799 bytes and 10 % 800–1,999 bytes
//! (mean about 420 bytes), words drawn from a vocabulary of tool output,
//! prose, paths, identifiers and numbers; roles are 50 % tool, 40 %
//! assistant, 10 % user, classes left to the daemon's classifier.
//!
//! Figures, each against its target in docs/benchmarks.md:
//!
//! - the daemon's resident memory (`VmRSS`, the peak `VmHWM`, and the
//!   anonymous part `RssAnon`, from `/proc/PID/status`) after populating,
//!   after a restart, and after reading sessions back;
//! - the data directory's size (the sum of file sizes, and the blocks
//!   allocated) against the raw UTF-8 bytes of the span texts admitted;
//! - restart to serving: from spawning the daemon on the populated
//!   directory to its first successful `GetServerInfo`, and to its first
//!   `GetContext` of a session (median of `--restarts` starts);
//! - integrity: after the last restart every session (or `--verify N` of
//!   them) is read back with `GetContext` and every span compared byte for
//!   byte with the text admitted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;

use crate::common::{Failure, Rng, client, median, next_marker};
use crate::daemon::{BUILD, status_kib, wait_for_exit};

/// The targets.
const TARGET_RSS_BYTES: u64 = 256 << 20;
/// Bytes on disk per raw text byte.
const TARGET_DISK_RATIO: f64 = 2.5;
/// Restart to serving.
const TARGET_RESTART: Duration = Duration::from_secs(5);
/// Every session's window: the contract's largest, so that nothing
/// compacts whatever `--spans` is.
const WINDOW_TOKENS: u32 = 10_000_000;
/// Longest a start or a stop may take before the run is abandoned.
const PROCESS_DEADLINE: Duration = Duration::from_secs(300);

/// Which program serves the daemon.
#[derive(Debug, Clone)]
pub enum DaemonProgram {
    /// A `ctxbrokerd` binary.
    Ctxbrokerd(PathBuf),
    /// A `ctxbroker-bench` binary, through its `storage serve` subcommand.
    Bench(PathBuf),
}

/// How a storage run goes.
#[derive(Debug, Clone)]
pub struct StorageOptions {
    /// Sessions to populate.
    pub sessions: usize,
    /// Spans admitted to each session.
    pub spans: usize,
    /// Spans in one admitted turn (the daemon's limit is 256).
    pub turn_spans: usize,
    /// Concurrent clients, each on its own connection.
    pub clients: usize,
    /// Starts on the populated directory whose times are measured.
    pub restarts: usize,
    /// Sessions read back and compared after the last restart (all when
    /// larger than `sessions`).
    pub verify: usize,
    /// Sessions read back first, for the memory figure after a sample.
    pub sample: usize,
    /// The daemon.
    pub program: DaemonProgram,
    /// Where the data lives; a temporary directory, removed afterwards,
    /// when `None`.
    pub dir: Option<PathBuf>,
    /// Measure an already populated `dir` (made by an earlier run with the
    /// same `sessions` and `spans`) instead of populating it.
    pub reuse: bool,
    /// The daemon's durability while populating (`flush` or `relaxed`);
    /// every restart runs with the default, `flush`.
    pub populate_durability: String,
    /// Further flags for every start of the daemon.
    pub daemon_args: Vec<String>,
    /// Print the daemon's largest memory mappings after the read-back, to
    /// see where its resident memory is.
    pub profile: bool,
}

impl StorageOptions {
    /// The defaults of the full run, served by `program`.
    pub fn new(program: DaemonProgram) -> Self {
        StorageArgs::defaults().into_options(program)
    }
}

/// The flags of `storage` (see [`StorageOptions`] for each one's meaning).
#[derive(Debug, clap::Parser)]
#[command(
    about = "`ctxbroker-bench storage`: sessions populated through Admit, then restarted and read back: bytes on disk, memory, restart time",
    long_about = None
)]
struct StorageArgs {
    /// Sessions to populate.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// Spans admitted to each session.
    #[arg(long, default_value_t = 1_000)]
    spans: usize,
    /// Spans in one admitted turn (the daemon's limit is 256).
    #[arg(long, default_value_t = 256)]
    turn_spans: usize,
    /// Concurrent clients, each on its own connection.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Starts on the populated directory whose times are measured.
    #[arg(long, default_value_t = 3)]
    restarts: usize,
    /// Sessions read back and compared after the last restart (all when
    /// not given).
    #[arg(long)]
    verify: Option<usize>,
    /// Sessions read back first, for the memory figure after a sample.
    #[arg(long, default_value_t = 1_000)]
    sample: usize,
    /// A built `ctxbrokerd` to measure instead of the daemon this binary
    /// serves.
    #[arg(long, value_name = "PATH")]
    daemon: Option<PathBuf>,
    /// Where the data lives (a temporary directory, removed afterwards,
    /// when not given).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Measure an already populated `--dir` instead of populating it.
    #[arg(long)]
    reuse: bool,
    /// The daemon's durability while populating; every restart runs with
    /// the default, flush.
    #[arg(long, default_value = "flush", value_parser = ["flush", "relaxed"])]
    populate_durability: String,
    /// A further flag for every start of the daemon (repeatable).
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    daemon_args: Vec<String>,
    /// Print the daemon's largest memory mappings after the read-back.
    #[arg(long)]
    profile: bool,
}

impl StorageArgs {
    fn defaults() -> StorageArgs {
        <StorageArgs as clap::Parser>::parse_from(["ctxbroker-bench storage"])
    }

    /// The options these flags ask for; `program` serves the daemon
    /// unless `--daemon` names one.
    fn into_options(self, program: DaemonProgram) -> StorageOptions {
        StorageOptions {
            sessions: self.sessions,
            spans: self.spans,
            turn_spans: self.turn_spans,
            clients: self.clients,
            restarts: self.restarts,
            verify: self.verify.unwrap_or(usize::MAX),
            sample: self.sample,
            program: self.daemon.map_or(program, DaemonProgram::Ctxbrokerd),
            dir: self.dir,
            reuse: self.reuse,
            populate_durability: self.populate_durability,
            daemon_args: self.daemon_args,
            profile: self.profile,
        }
    }
}

/// A process's memory, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident now (`VmRSS`), bytes.
    pub rss: u64,
    /// The peak resident size so far (`VmHWM`), bytes.
    pub hwm: u64,
    /// Of `rss`, anonymous memory (`RssAnon`): the heap, the engine's
    /// caches and page table, thread stacks. The rest is mapped files
    /// (the binary) and shared memory.
    pub anon: u64,
}

impl Memory {
    /// Reads `/proc/PID/status`; a field it lacks reads as 0.
    pub fn of(pid: u32) -> Result<Memory, Failure> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let bytes = |key: &str| status_kib(&status, key).map_or(0, |kib| kib * 1024);
        Ok(Memory {
            rss: bytes("VmRSS"),
            hwm: bytes("VmHWM"),
            anon: bytes("RssAnon"),
        })
    }
}

/// Bytes of a directory tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// The sum of the files' sizes.
    pub file_bytes: u64,
    /// The blocks allocated to them (what `du` counts).
    pub allocated_bytes: u64,
    /// Files counted.
    pub files: u64,
}

/// One start of the daemon on the populated directory.
#[derive(Debug, Clone, Copy)]
pub struct Restart {
    /// Spawn to the first successful `GetServerInfo`.
    pub serving: Duration,
    /// Spawn to the first successful `GetContext` of a session.
    pub first_context: Duration,
    /// Memory once serving, before any session is read.
    pub memory_serving: Memory,
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct StorageReport {
    /// Sessions populated.
    pub sessions: usize,
    /// Spans per session.
    pub spans_per_session: usize,
    /// Spans admitted in all.
    pub spans_admitted: u64,
    /// The raw UTF-8 bytes of every admitted span's text: the baseline.
    pub raw_text_bytes: u64,
    /// How long populating took (zero when a populated directory was
    /// reused).
    pub populate: Duration,
    /// The daemon's memory at the end of populating (zero when reused).
    pub memory_populated: Memory,
    /// The data directory after populating and a clean stop.
    pub disk_populated: DiskUsage,
    /// The data directory after the last restart's clean stop.
    pub disk_final: DiskUsage,
    /// Each measured start, in order.
    pub restarts: Vec<Restart>,
    /// Memory after reading back `sample` sessions.
    pub memory_sample: Memory,
    /// Sessions in that sample.
    pub sample: usize,
    /// Memory after reading back every verified session.
    pub memory_verified: Memory,
    /// Sessions read back and compared.
    pub sessions_verified: usize,
    /// Spans read back and found byte-identical to what was admitted.
    pub spans_read_back: u64,
    /// Their text bytes.
    pub text_bytes_read_back: u64,
    /// How long reading back took.
    pub verify: Duration,
    /// Markers in the log after populating: 0 when nothing compacted.
    pub markers: u64,
}

impl StorageReport {
    /// The median restart-to-serving time.
    pub fn serving_median(&self) -> Duration {
        median(self.restarts.iter().map(|r| r.serving).collect())
    }

    /// The median restart-to-first-context time.
    pub fn first_context_median(&self) -> Duration {
        median(self.restarts.iter().map(|r| r.first_context).collect())
    }

    /// The highest resident size measured after a restart.
    pub fn restart_rss_max(&self) -> u64 {
        let serving = self.restarts.iter().map(|r| r.memory_serving.rss);
        serving
            .chain([self.memory_sample.rss, self.memory_verified.rss])
            .max()
            .unwrap_or(0)
    }

    /// Bytes in files per raw text byte.
    pub fn disk_ratio(&self) -> f64 {
        ratio(self.disk_populated.file_bytes, self.raw_text_bytes)
    }

    /// Allocated bytes per raw text byte.
    pub fn allocated_ratio(&self) -> f64 {
        ratio(self.disk_populated.allocated_bytes, self.raw_text_bytes)
    }

    /// The report as markdown.
    pub fn render(&self) -> String {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let met = |ok: bool| if ok { "met" } else { "missed" };
        let mut out = String::new();
        out.push_str(&format!(
            "workload: {} sessions × {} spans = {} spans, raw text {:.1} MiB (mean {:.0} bytes/span); populate {:.1} s ({:.0} spans/s); markers written: {}\n\n",
            self.sessions,
            self.spans_per_session,
            self.spans_admitted,
            mib(self.raw_text_bytes),
            ratio(self.raw_text_bytes, self.spans_admitted),
            self.populate.as_secs_f64(),
            self.spans_admitted as f64 / self.populate.as_secs_f64().max(1e-9),
            self.markers,
        ));
        out.push_str("| figure | measured | target | verdict |\n|---|---|---|---|\n");
        let rss_max = self.restart_rss_max();
        if self.populate.is_zero() {
            out.push_str(
                "| daemon RSS, end of populate | not measured: a populated directory was reused | ≤ 256 MiB | — |\n",
            );
        } else {
            out.push_str(&format!(
                "| daemon RSS, end of populate (VmRSS / VmHWM; anonymous) | {:.1} / {:.1} MiB; {:.1} MiB | ≤ 256 MiB | {} |\n",
                mib(self.memory_populated.rss),
                mib(self.memory_populated.hwm),
                mib(self.memory_populated.anon),
                met(self.memory_populated.rss <= TARGET_RSS_BYTES)
            ));
        }
        if let Some(last) = self.restarts.last() {
            out.push_str(&format!(
                "| daemon RSS after restart, serving (anonymous) | {:.1} MiB ({:.1}) | ≤ 256 MiB | {} |\n",
                mib(last.memory_serving.rss),
                mib(last.memory_serving.anon),
                met(last.memory_serving.rss <= TARGET_RSS_BYTES)
            ));
        }
        out.push_str(&format!(
            "| daemon RSS after reading {} sessions (anonymous) | {:.1} MiB ({:.1}) | ≤ 256 MiB | {} |\n",
            self.sample,
            mib(self.memory_sample.rss),
            mib(self.memory_sample.anon),
            met(self.memory_sample.rss <= TARGET_RSS_BYTES)
        ));
        out.push_str(&format!(
            "| daemon RSS after reading {} sessions (VmRSS / VmHWM; anonymous) | {:.1} / {:.1} MiB; {:.1} MiB | ≤ 256 MiB | {} |\n",
            self.sessions_verified,
            mib(self.memory_verified.rss),
            mib(self.memory_verified.hwm),
            mib(self.memory_verified.anon),
            met(rss_max <= TARGET_RSS_BYTES)
        ));
        out.push_str(&format!(
            "| data dir, sum of file sizes | {:.1} MiB = {:.2}× raw | ≤ 2.5× raw | {} |\n",
            mib(self.disk_populated.file_bytes),
            self.disk_ratio(),
            met(self.disk_ratio() <= TARGET_DISK_RATIO)
        ));
        out.push_str(&format!(
            "| data dir, allocated (du) | {:.1} MiB = {:.2}× raw | ≤ 2.5× raw | {} |\n",
            mib(self.disk_populated.allocated_bytes),
            self.allocated_ratio(),
            met(self.allocated_ratio() <= TARGET_DISK_RATIO)
        ));
        out.push_str(&format!(
            "| data dir after the restarts (files / allocated) | {:.2}× / {:.2}× raw | ≤ 2.5× raw | {} |\n",
            ratio(self.disk_final.file_bytes, self.raw_text_bytes),
            ratio(self.disk_final.allocated_bytes, self.raw_text_bytes),
            met(ratio(self.disk_final.file_bytes, self.raw_text_bytes) <= TARGET_DISK_RATIO)
        ));
        let serving = self.serving_median();
        out.push_str(&format!(
            "| restart to serving (GetServerInfo), median of {} | {:.0} ms | ≤ 5,000 ms | {} |\n",
            self.restarts.len(),
            serving.as_secs_f64() * 1e3,
            met(serving <= TARGET_RESTART)
        ));
        let context = self.first_context_median();
        out.push_str(&format!(
            "| restart to first GetContext, median of {} | {:.0} ms | ≤ 5,000 ms | {} |\n",
            self.restarts.len(),
            context.as_secs_f64() * 1e3,
            met(context <= TARGET_RESTART)
        ));
        out.push_str(&format!(
            "\nrestarts (serving / first context, ms): {}\n",
            self.restarts
                .iter()
                .map(|r| format!(
                    "{:.0} / {:.0}",
                    r.serving.as_secs_f64() * 1e3,
                    r.first_context.as_secs_f64() * 1e3
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        out.push_str(&format!(
            "read back after the last restart: {} sessions, {} spans, {:.1} MiB of text, all byte-identical, in {:.1} s\n",
            self.sessions_verified,
            self.spans_read_back,
            mib(self.text_bytes_read_back),
            self.verify.as_secs_f64()
        ));
        out
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// `storage [flags]`, or `storage serve [ctxbrokerd flags]`.
pub async fn storage_main(args: &[String]) -> Result<(), Failure> {
    if args.first().map(String::as_str) == Some("serve") {
        return serve(args.get(1..).unwrap_or_default());
    }
    let flags: StorageArgs = crate::common::flags("storage", args);
    let options = flags.into_options(DaemonProgram::Bench(std::env::current_exe()?));
    let report = run(&options).await?;
    print!("{}", report.render());
    Ok(())
}

/// `storage serve`: the daemon itself, from the same code `ctxbrokerd`
/// runs, for machines where only this binary is built.
fn serve(args: &[String]) -> Result<(), Failure> {
    let mut argv = vec!["ctxbrokerd".to_owned()];
    argv.extend(args.iter().cloned());
    // The daemon runs its own runtime, which cannot start on a thread of
    // this one.
    let code = std::thread::Builder::new()
        .name("storage-serve".into())
        .spawn(move || ctxbroker_server::main_with_args(argv.into_iter().map(Into::into), BUILD))?
        .join()
        .map_err(|_| Failure::from("the daemon thread panicked"))?;
    if code == std::process::ExitCode::SUCCESS {
        Ok(())
    } else {
        Err("the daemon exited with an error".into())
    }
}

/// Runs the whole measurement.
pub async fn run(options: &StorageOptions) -> Result<StorageReport, Failure> {
    if options.sessions == 0 || options.spans == 0 || options.turn_spans == 0 {
        return Err("--sessions, --spans and --turn-spans must be at least 1".into());
    }
    let temp;
    let root = match &options.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_owned()
        }
    };
    std::fs::create_dir_all(&root)?;
    let data_dir = root.join("data");
    let log = root.join("daemon.log");

    let raw_text_bytes = raw_bytes(options.sessions, options.spans);
    let spans_admitted = (options.sessions * options.spans) as u64;
    let mut populate = Duration::ZERO;
    let mut memory_populated = Memory::default();
    let mut markers = 0;
    if options.reuse {
        if !data_dir.exists() {
            return Err(format!("--reuse: {} does not exist", data_dir.display()).into());
        }
    } else {
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        let mut args = vec![
            "--durability".to_owned(),
            options.populate_durability.clone(),
        ];
        args.extend(options.daemon_args.iter().cloned());
        let mut daemon = ChildDaemon::start(options, &data_dir, &log, &args).await?;
        let started = Instant::now();
        fill(options, daemon.addr).await?;
        populate = started.elapsed();
        memory_populated = daemon.memory()?;
        let mut client = client(daemon.addr).await?;
        markers = next_marker(&mut client).await?.saturating_sub(1);
        daemon.stop()?;
    }
    let disk_populated = disk_usage(&data_dir)?;

    let mut restarts = Vec::new();
    let mut last = None;
    for _ in 0..options.restarts.max(1) {
        if let Some(mut daemon) = last.take() {
            ChildDaemon::stop(&mut daemon)?;
        }
        let spawned = Instant::now();
        let daemon = ChildDaemon::start(options, &data_dir, &log, &options.daemon_args).await?;
        let serving = spawned.elapsed();
        let memory_serving = daemon.memory()?;
        let mut client = client(daemon.addr).await?;
        client
            .get_context(pb::GetContextRequest {
                session_id: session_id(0),
            })
            .await?;
        let first_context = spawned.elapsed();
        restarts.push(Restart {
            serving,
            first_context,
            memory_serving,
        });
        last = Some(daemon);
    }
    let Some(mut daemon) = last else {
        return Err("no restart ran".into());
    };

    // Read back: a sample first, then the rest.
    let verify = options.verify.min(options.sessions);
    let sample = options.sample.min(verify);
    let started = Instant::now();
    let first = read_back(options, daemon.addr, 0..sample).await?;
    let memory_sample = daemon.memory()?;
    let second = read_back(options, daemon.addr, sample..verify).await?;
    let verify_time = started.elapsed();
    let memory_verified = daemon.memory()?;
    if options.profile {
        eprint!("{}", daemon.mappings()?);
    }
    daemon.stop()?;
    let disk_final = disk_usage(&data_dir)?;

    Ok(StorageReport {
        sessions: options.sessions,
        spans_per_session: options.spans,
        spans_admitted,
        raw_text_bytes,
        populate,
        memory_populated,
        disk_populated,
        disk_final,
        restarts,
        memory_sample,
        sample,
        memory_verified,
        sessions_verified: verify,
        spans_read_back: first.0 + second.0,
        text_bytes_read_back: first.1 + second.1,
        verify: verify_time,
        markers,
    })
}

/// The id of session `n`.
fn session_id(n: usize) -> String {
    format!("s{n:06}")
}

const WORDS: [&str; 64] = [
    "the",
    "request",
    "returned",
    "error",
    "timeout",
    "while",
    "reading",
    "config",
    "from",
    "staging",
    "replica",
    "deploy",
    "rollout",
    "handler",
    "worker",
    "queue",
    "cache",
    "miss",
    "latency",
    "p99",
    "increased",
    "after",
    "merge",
    "of",
    "branch",
    "retry",
    "budget",
    "exceeded",
    "connection",
    "refused",
    "on",
    "port",
    "test",
    "failed",
    "with",
    "assertion",
    "expected",
    "found",
    "function",
    "returns",
    "value",
    "and",
    "then",
    "we",
    "should",
    "check",
    "the",
    "output",
    "file",
    "line",
    "column",
    "build",
    "succeeded",
    "in",
    "seconds",
    "warning",
    "unused",
    "variable",
    "module",
    "import",
    "path",
    "schema",
    "migration",
    "table",
];

/// The length in bytes of span `span` of session `session` (its text is
/// exactly this long), and the generator that drew it, which goes on to
/// draw the rest of the span.
fn span_len(session: usize, span: usize) -> (usize, Rng) {
    let mut rng =
        Rng::new((session as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((span as u64) << 20));
    let len = match rng.below(10) {
        0..=5 => 80 + rng.below(220),
        6..=8 => 300 + rng.below(500),
        _ => 800 + rng.below(1_200),
    };
    (len, rng)
}

/// Span `span` of session `session`: role and text.
pub(crate) fn span_input(session: usize, span: usize) -> (pb::Role, String) {
    let (len, mut rng) = span_len(session, span);
    let role = match rng.below(10) {
        0..=4 => pb::Role::Tool,
        5..=8 => pb::Role::Assistant,
        _ => pb::Role::User,
    };
    let mut text = String::with_capacity(len + 24);
    while text.len() < len {
        if !text.is_empty() {
            text.push(' ');
        }
        match rng.below(16) {
            0 => text.push_str(&format!(
                "src/{}/mod_{}.rs",
                rng.pick(&WORDS),
                rng.below(500)
            )),
            1 => text.push_str(&format!("{}ms", rng.below(100_000))),
            2 => text.push_str(&format!("id_{:x}", rng.next_u64() & 0xFF_FFFF)),
            _ => text.push_str(rng.pick(&WORDS)),
        }
    }
    text.truncate(len);
    // Never end on a space: the daemon keeps texts as given, but a
    // trailing space makes the check depend on nothing else.
    while text.ends_with(' ') {
        text.pop();
        text.push('.');
    }
    (role, text)
}

/// The raw text bytes of the whole workload.
fn raw_bytes(sessions: usize, spans: usize) -> u64 {
    (0..sessions)
        .flat_map(|s| (0..spans).map(move |k| span_len(s, k).0 as u64))
        .sum()
}

/// Creates and fills every session, `clients` at a time.
async fn fill(options: &StorageOptions, addr: SocketAddr) -> Result<(), Failure> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..options.clients.max(1) {
        let next = Arc::clone(&next);
        let (sessions, spans, turn_spans) = (options.sessions, options.spans, options.turn_spans);
        let mut client = client(addr).await?;
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= sessions {
                    return Ok::<(), Failure>(());
                }
                let id = session_id(n);
                client
                    .create_session(pb::CreateSessionRequest {
                        session_id: id.clone(),
                        config: Some(pb::SessionConfig {
                            window_tokens: Some(WINDOW_TOKENS),
                            ..Default::default()
                        }),
                    })
                    .await?;
                let mut k = 0;
                while k < spans {
                    let end = (k + turn_spans).min(spans);
                    let inputs = (k..end)
                        .map(|j| {
                            let (role, text) = span_input(n, j);
                            pb::SpanInput {
                                role: role as i32,
                                text,
                                ..Default::default()
                            }
                        })
                        .collect();
                    let reply = client
                        .admit(pb::AdmitRequest {
                            session_id: id.clone(),
                            spans: inputs,
                        })
                        .await?
                        .into_inner();
                    if reply.compaction.is_some() {
                        return Err(
                            format!("session {id} compacted: the window is too small").into()
                        );
                    }
                    k = end;
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Reads sessions `range` back and compares every span with what was
/// admitted; returns (spans, text bytes) read.
async fn read_back(
    options: &StorageOptions,
    addr: SocketAddr,
    range: std::ops::Range<usize>,
) -> Result<(u64, u64), Failure> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut tasks = Vec::new();
    for _ in 0..options.clients.max(1) {
        let next = Arc::clone(&next);
        let (end, spans) = (range.end, options.spans);
        let mut client = client(addr).await?;
        tasks.push(tokio::spawn(async move {
            let (mut count, mut bytes) = (0u64, 0u64);
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= end {
                    return Ok::<(u64, u64), Failure>((count, bytes));
                }
                let id = session_id(n);
                let context = client
                    .get_context(pb::GetContextRequest {
                        session_id: id.clone(),
                    })
                    .await?
                    .into_inner();
                if context.spans.len() != spans {
                    return Err(format!(
                        "session {id}: {} spans read back, {spans} admitted",
                        context.spans.len()
                    )
                    .into());
                }
                for (k, span) in context.spans.iter().enumerate() {
                    let (role, text) = span_input(n, k);
                    if span.text != text || span.role != role as i32 {
                        return Err(format!(
                            "session {id}: span {} differs from what was admitted",
                            span.span_id
                        )
                        .into());
                    }
                    bytes += text.len() as u64;
                }
                count += spans as u64;
            }
        }));
    }
    let (mut count, mut bytes) = (0, 0);
    for task in tasks {
        let (c, b) = task.await??;
        count += c;
        bytes += b;
    }
    Ok((count, bytes))
}

/// A daemon in a child process, serving on a loopback port.
#[derive(Debug)]
struct ChildDaemon {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    /// The socket bound here and handed to the child: held, so the port
    /// cannot be taken by anything else between binding and serving.
    _listener: std::net::TcpListener,
}

impl ChildDaemon {
    /// Spawns the daemon on `data_dir` and waits until it answers
    /// `GetServerInfo`.
    async fn start(
        options: &StorageOptions,
        data_dir: &Path,
        log: &Path,
        args: &[String],
    ) -> Result<ChildDaemon, Failure> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let mut command = match &options.program {
            DaemonProgram::Ctxbrokerd(path) => Command::new(path),
            DaemonProgram::Bench(path) => {
                let mut command = Command::new(path);
                command.args(["storage", "serve"]);
                command
            }
        };
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        ctxbroker_server::hand_over(&mut command, &listener);
        command
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--log")
            .arg("warn")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = command.spawn()?;
        let mut daemon = ChildDaemon {
            child,
            addr,
            log: log.to_owned(),
            _listener: listener,
        };
        daemon.ready().await?;
        Ok(daemon)
    }

    async fn ready(&mut self) -> Result<(), Failure> {
        let deadline = Instant::now() + PROCESS_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!(
                    "the daemon exited with {status} before serving; see {}",
                    self.log.display()
                )
                .into());
            }
            if Instant::now() > deadline {
                return Err("the daemon did not serve in time".into());
            }
            // The daemon binds before it opens the store, so a connection
            // succeeds early and the call waits for serving.
            if let Ok(mut client) = client(self.addr).await
                && client
                    .get_server_info(pb::GetServerInfoRequest {})
                    .await
                    .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn memory(&self) -> Result<Memory, Failure> {
        Memory::of(self.child.id())
    }

    /// The process's memory by kind (`smaps_rollup`) and its ten largest
    /// mappings by resident size.
    fn mappings(&self) -> Result<String, Failure> {
        let pid = self.child.id();
        let mut out = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        let mut maps: Vec<(u64, String)> = Vec::new();
        let mut current = String::new();
        for line in smaps.lines() {
            if let Some(kib) = line.strip_prefix("Rss:") {
                let kib = kib
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(0);
                maps.push((kib, current.clone()));
            } else if line
                .split_whitespace()
                .next()
                .is_some_and(|f| f.contains('-'))
            {
                current = line.to_owned();
            }
        }
        maps.sort_unstable_by_key(|map| std::cmp::Reverse(map.0));
        for (kib, map) in maps.iter().take(10) {
            out.push_str(&format!("{kib:>8} kB  {map}\n"));
        }
        Ok(out)
    }

    /// SIGTERM, then waits for the clean exit (the store's last flush).
    fn stop(&mut self) -> Result<(), Failure> {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()?;
        if !sent.success() {
            return Err("kill -TERM failed".into());
        }
        if !wait_for_exit(&mut self.child, PROCESS_DEADLINE) {
            let _ = self.child.kill();
            return Err("the daemon did not stop in time".into());
        }
        // It has exited: this returns its status at once.
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!(
                "the daemon exited with {status}; see {}",
                self.log.display()
            )
            .into());
        }
        Ok(())
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The bytes of every file under `dir`.
fn disk_usage(dir: &Path) -> Result<DiskUsage, Failure> {
    use std::os::unix::fs::MetadataExt;
    let mut usage = DiskUsage::default();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                usage.file_bytes += meta.len();
                usage.allocated_bytes += meta.blocks() * 512;
                usage.files += 1;
            }
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use clap::error::ErrorKind;

    use super::*;

    #[test]
    fn flags_default_to_the_full_run_and_pass_daemon_flags_through() {
        let bench = || DaemonProgram::Bench(PathBuf::from("bench"));
        let full = StorageOptions::new(bench());
        assert_eq!(
            (full.sessions, full.spans, full.turn_spans),
            (10_000, 1_000, 256)
        );
        assert_eq!(
            (full.clients, full.restarts, full.verify),
            (4, 3, usize::MAX)
        );
        assert_eq!(full.populate_durability, "flush");
        let args = StorageArgs::try_parse_from([
            "storage",
            "--sessions",
            "20",
            "--daemon-arg",
            "--session-cache-bytes",
            "--daemon-arg",
            "1000",
            "--verify",
            "5",
            "--daemon",
            "/bin/ctxbrokerd",
        ])
        .unwrap();
        let options = args.into_options(bench());
        assert_eq!((options.sessions, options.verify), (20, 5));
        assert_eq!(options.daemon_args, ["--session-cache-bytes", "1000"]);
        assert!(matches!(options.program, DaemonProgram::Ctxbrokerd(_)));
        let bad = StorageArgs::try_parse_from(["storage", "--populate-durability", "never"]);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("--populate-durability")
        );
        let help = StorageArgs::try_parse_from(["storage", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
    }

    #[test]
    fn texts_are_deterministic_and_sized_by_band() {
        let (role, text) = span_input(3, 7);
        assert_eq!(span_input(3, 7), (role, text.clone()));
        assert_ne!(span_input(3, 8).1, text);
        let lens: Vec<usize> = (0..2_000).map(|k| span_input(1, k).1.len()).collect();
        assert!(lens.iter().all(|&l| (80..2_000).contains(&l)));
        let mean = lens.iter().sum::<usize>() / lens.len();
        assert!((350..500).contains(&mean), "mean {mean}");
    }
}
