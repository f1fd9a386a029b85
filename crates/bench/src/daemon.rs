//! A daemon in a child process, so that the CPU time and the peak memory
//! measured are the daemon's alone, and the tools to read them.
//!
//! The child is this very binary, re-executed with the hidden `daemon`
//! subcommand: it binds `127.0.0.1:0`, prints `listening ADDR` on stdout
//! and serves `ctxbroker_server::run` — the code `ctxbrokerd` runs — until
//! its stdin closes (the parent dropping its handle, or dying). No second
//! binary is needed, and no daemon outlives its run.
//!
//! `CTXBROKER_BENCH_DAEMON_WRAPPER`, when set, is a command line the
//! daemon runs under (a profiler: `valgrind --tool=callgrind`, `perf
//! record -g --`).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use ctxbroker_server::config::{Durability, QuotaSettings};
use ctxbroker_server::{BuildInfo, Settings};

use crate::common::Failure;

/// How long a child may take to print its address, or to stop once asked.
const PROCESS_DEADLINE: Duration = Duration::from_secs(60);

/// What every daemon this crate serves reports about its build.
pub const BUILD: BuildInfo = BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    git_commit: "bench",
    contract_digest: "bench",
};

/// `daemon --durability flush|relaxed --data-dir DIR [--quota-json JSON]
/// [--session-cache-bytes N]`: serves until stdin closes. `--quota-json` is
/// the `[quota]` table as JSON; `--session-cache-bytes` raises
/// `memory_budget_bytes` to match when it is smaller. Hidden: the
/// measurements start it themselves.
pub async fn daemon_main(args: &[String]) -> Result<(), Failure> {
    let mut durability = Durability::Flush;
    let mut data_dir: Option<PathBuf> = None;
    let mut quota = QuotaSettings::default();
    let mut session_cache: Option<u64> = None;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("daemon: {flag} needs a value"))?;
        match flag.as_str() {
            "--durability" => durability = parse_durability(value)?,
            "--data-dir" => data_dir = Some(PathBuf::from(value)),
            "--quota-json" => quota = serde_json::from_str(value)?,
            "--session-cache-bytes" => {
                session_cache =
                    Some(value.parse().map_err(|err| {
                        format!("daemon: --session-cache-bytes {value:?}: {err}")
                    })?);
            }
            other => return Err(format!("daemon: unknown flag {other}").into()),
        }
    }
    let data_dir = data_dir.ok_or("daemon: --data-dir is required")?;
    let mut settings = Settings {
        data_dir,
        durability,
        quota,
        // The store's counters (keys and bytes written) are read from it.
        metrics_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        ..Settings::default()
    };
    if let Some(bytes) = session_cache {
        let limits = &mut settings.limits;
        limits.session_cache_bytes = bytes;
        limits.memory_budget_bytes = limits.memory_budget_bytes.max(bytes);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("listening {addr}");
    // Stops when the parent closes our stdin or goes away.
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("stdin-watch".into())
        .spawn(move || {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            let _ = closed_tx.send(());
        })?;
    let shutdown = async move {
        let _ = closed_rx.await;
    };
    let control = ctxbroker_server::Control::new();
    let announce = control.clone();
    tokio::spawn(async move {
        if let Some(metrics) = announce.serving().await.metrics {
            println!("metrics {metrics}");
        }
    });
    ctxbroker_server::run_with(settings, listener, BUILD, shutdown, control).await?;
    Ok(())
}

fn parse_durability(text: &str) -> Result<Durability, Failure> {
    match text {
        "flush" => Ok(Durability::Flush),
        "relaxed" => Ok(Durability::Relaxed),
        other => Err(format!("durability must be flush or relaxed; got {other:?}").into()),
    }
}

/// The name `durability` has on the daemon's command line.
fn durability_flag(durability: Durability) -> &'static str {
    match durability {
        Durability::Flush => "flush",
        Durability::Relaxed => "relaxed",
    }
}

/// A daemon serving in a child process, with its data in a temporary
/// directory. Dropping it stops the daemon (an orderly shutdown; killed
/// if it takes longer than a minute) and removes the data.
#[derive(Debug)]
pub struct DaemonProcess {
    /// Where it serves.
    pub addr: SocketAddr,
    /// Where it serves its metrics.
    pub metrics: SocketAddr,
    child: Child,
    stdin: Option<ChildStdin>,
    _dir: tempfile::TempDir,
}

impl DaemonProcess {
    /// Starts this binary's `daemon` subcommand and waits for its address.
    pub fn spawn(durability: Durability) -> Result<DaemonProcess, Failure> {
        let exe = std::env::current_exe()?;
        DaemonProcess::spawn_program(&exe, durability)
    }

    /// Starts `program`'s `daemon` subcommand (a `ctxbroker-bench` binary).
    pub fn spawn_program(program: &Path, durability: Durability) -> Result<DaemonProcess, Failure> {
        DaemonProcess::spawn_program_with(program, durability, &[])
    }

    /// [`DaemonProcess::spawn`] with extra flags for the `daemon`
    /// subcommand (`--quota-json JSON`).
    pub fn spawn_with(durability: Durability, extra: &[String]) -> Result<DaemonProcess, Failure> {
        let exe = std::env::current_exe()?;
        DaemonProcess::spawn_program_with(&exe, durability, extra)
    }

    /// [`DaemonProcess::spawn_program`] under `wrapper`, a command line
    /// the daemon runs under (`valgrind --tool=callgrind ...`) in place of
    /// `CTXBROKER_BENCH_DAEMON_WRAPPER`'s.
    pub fn spawn_wrapped(
        wrapper: &[String],
        program: &Path,
        durability: Durability,
    ) -> Result<DaemonProcess, Failure> {
        DaemonProcess::spawn_under(wrapper, program, durability, &[])
    }

    fn spawn_program_with(
        program: &Path,
        durability: Durability,
        extra: &[String],
    ) -> Result<DaemonProcess, Failure> {
        // A profiler may wrap the daemon: CTXBROKER_BENCH_DAEMON_WRAPPER="valgrind
        // --tool=callgrind" runs `valgrind --tool=callgrind PROGRAM daemon ...`.
        let wrapper: Vec<String> = std::env::var("CTXBROKER_BENCH_DAEMON_WRAPPER")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        DaemonProcess::spawn_under(&wrapper, program, durability, extra)
    }

    fn spawn_under(
        wrapper: &[String],
        program: &Path,
        durability: Durability,
        extra: &[String],
    ) -> Result<DaemonProcess, Failure> {
        let dir = tempfile::tempdir()?;
        let mut command = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        };
        let mut child = command
            .arg("daemon")
            .arg("--durability")
            .arg(durability_flag(durability))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let (addr, metrics) = match read_addresses(&mut child) {
            Ok(addresses) => addresses,
            Err(err) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err);
            }
        };
        Ok(DaemonProcess {
            addr,
            metrics,
            child,
            stdin,
            _dir: dir,
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        // Closing stdin asks for the orderly shutdown.
        drop(self.stdin.take());
        if !wait_for_exit(&mut self.child, PROCESS_DEADLINE) {
            eprintln!(
                "the daemon (pid {}) did not stop within {PROCESS_DEADLINE:?}; killing it",
                self.child.id()
            );
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads the child's `listening ADDR` and `metrics ADDR` lines, within the
/// deadline.
fn read_addresses(child: &mut Child) -> Result<(SocketAddr, SocketAddr), Failure> {
    let stdout = child.stdout.take().ok_or("the daemon has no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("daemon-stdout".into())
        .spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for _ in 0..2 {
                let _ = tx.send(lines.next());
            }
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        })?;
    let deadline = std::time::Instant::now() + PROCESS_DEADLINE;
    let next = |prefix: &str| -> Result<SocketAddr, Failure> {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(err))) => {
                return Err(format!("reading the daemon's addresses: {err}").into());
            }
            Ok(None) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err("the daemon exited before printing its addresses".into());
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err("the daemon did not print its addresses within a minute".into());
            }
        };
        let addr = line
            .strip_prefix(prefix)
            .ok_or_else(|| format!("expected {prefix:?} from the daemon; got {line:?}"))?;
        Ok(addr.parse()?)
    };
    Ok((next("listening ")?, next("metrics ")?))
}

/// The store's counters of what the writer handed the engine, as the
/// daemon's metrics say.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineWrites {
    /// Keys inserted or replaced.
    pub keys: f64,
    /// Bytes of those keys and values.
    pub bytes: f64,
    /// The engine's blob files synced before flushes (values and tree
    /// nodes too large for its log).
    pub blob_syncs: f64,
    /// Writes the request that made them applied itself, without waking
    /// the store's writer thread (relaxed durability).
    pub applied_by_caller: f64,
    /// Keys the writer read from the engine to check writes.
    pub reads: f64,
}

impl EngineWrites {
    /// Reads the counters from the metrics endpoint at `addr`.
    pub fn read(addr: SocketAddr) -> Result<EngineWrites, Failure> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(PROCESS_DEADLINE))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        let value = |name: &str| -> Result<f64, Failure> {
            text.lines()
                .find_map(|line| {
                    line.strip_prefix(name)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
                .ok_or_else(|| format!("the daemon's metrics have no {name}").into())
        };
        Ok(EngineWrites {
            keys: value("ctxbroker_store_keys_written_total")?,
            bytes: value("ctxbroker_store_bytes_written_total")?,
            blob_syncs: value("ctxbroker_store_blob_syncs_total")?,
            applied_by_caller: value("ctxbroker_store_writes_applied_by_caller_total")?,
            reads: value("ctxbroker_store_keys_read_total")?,
        })
    }

    /// What was written since `before`, per request of `requests`.
    pub fn per_request(self, before: EngineWrites, requests: usize) -> EngineWrites {
        let n = requests.max(1) as f64;
        EngineWrites {
            keys: (self.keys - before.keys) / n,
            bytes: (self.bytes - before.bytes) / n,
            blob_syncs: (self.blob_syncs - before.blob_syncs) / n,
            applied_by_caller: (self.applied_by_caller - before.applied_by_caller) / n,
            reads: (self.reads - before.reads) / n,
        }
    }
}

/// Waits for the child to exit; false if it is still running at `deadline`.
pub fn wait_for_exit(child: &mut Child, deadline: Duration) -> bool {
    let until = Instant::now() + deadline;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= until => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A process's CPU time and peak memory, from `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User plus system CPU seconds since the process started.
    pub cpu_seconds: f64,
    /// The peak resident set (`VmHWM`) in bytes, since the start or the
    /// last [`reset_peak`].
    pub peak_rss_bytes: u64,
}

impl Usage {
    /// Reads `/proc/PID/stat` and `/proc/PID/status`.
    pub fn of(pid: u32) -> Result<Usage, Failure> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let cpu_ticks = stat_cpu_ticks(&stat)
            .ok_or_else(|| format!("/proc/{pid}/stat has no utime and stime"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let peak_kib = status_kib(&status, "VmHWM")
            .ok_or_else(|| format!("/proc/{pid}/status has no VmHWM"))?;
        Ok(Usage {
            cpu_seconds: cpu_ticks as f64 / clock_ticks_per_second(),
            peak_rss_bytes: peak_kib * 1024,
        })
    }
}

/// User plus system CPU ticks in the text of a `/proc/PID/stat` (or of
/// one thread's `/proc/PID/task/TID/stat`); `None` when it has no such
/// fields.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: the fields start
    // after the last ')'. utime and stime are fields 14 and 15 (1-based),
    // the 12th and 13th after the name.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// The daemon's threads, grouped by the names they are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadGroup {
    /// The async runtime's workers and its blocking pool: gRPC, the
    /// sessions' turns, and the appends a request applies itself.
    Runtime,
    /// The engine's I/O threads, which write its log out.
    EngineIo,
    /// The store's writer thread, which applies the batches.
    Writer,
    /// The store's flusher thread, which flushes and syncs them.
    Flusher,
    /// Everything else: the main thread, the log's writer, and threads
    /// that have exited.
    Other,
}

impl ThreadGroup {
    /// Every group, in the order [`ThreadCpu::seconds`] holds them.
    pub const ALL: [ThreadGroup; 5] = [
        ThreadGroup::Runtime,
        ThreadGroup::EngineIo,
        ThreadGroup::Writer,
        ThreadGroup::Flusher,
        ThreadGroup::Other,
    ];

    /// The group of a thread named `comm` (the kernel keeps the first 15
    /// bytes of a thread's name).
    pub fn of(comm: &str) -> ThreadGroup {
        if comm == "store-writer" {
            ThreadGroup::Writer
        } else if comm == "store-flusher" {
            ThreadGroup::Flusher
        } else if comm.starts_with("sled-io") {
            ThreadGroup::EngineIo
        } else if comm.starts_with("tokio-rt-worker") || comm == "ctxbroker" {
            ThreadGroup::Runtime
        } else {
            ThreadGroup::Other
        }
    }
}

/// A process's CPU seconds by [`ThreadGroup`]: each live thread's own
/// time, by its name; what the process's total holds beyond the named
/// groups (its other threads, and those that have exited) is `Other`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThreadCpu {
    /// Seconds per group, in the order of [`ThreadGroup::ALL`].
    pub seconds: [f64; 5],
}

impl ThreadCpu {
    /// Reads `/proc/PID/task/*/stat` and `comm`; `total` is the process's
    /// CPU seconds ([`Usage::cpu_seconds`]) read just before.
    pub fn of(pid: u32, total: f64) -> Result<ThreadCpu, Failure> {
        let mut seconds = [0.0; 5];
        for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let dir = entry?.path();
            // A thread may exit between the listing and the reads: its
            // time is then in the total, and so in `Other`.
            let (Ok(stat), Ok(comm)) = (
                std::fs::read_to_string(dir.join("stat")),
                std::fs::read_to_string(dir.join("comm")),
            ) else {
                continue;
            };
            let group = ThreadGroup::of(comm.trim_end());
            if let Some(ticks) = stat_cpu_ticks(&stat)
                && group != ThreadGroup::Other
            {
                seconds[group as usize] += ticks as f64 / clock_ticks_per_second();
            }
        }
        let named: f64 = seconds.iter().sum();
        seconds[ThreadGroup::Other as usize] = (total - named).max(0.0);
        Ok(ThreadCpu { seconds })
    }

    /// The seconds of `self` beyond those of `before`, per group.
    pub fn since(&self, before: &ThreadCpu) -> ThreadCpu {
        let mut seconds = [0.0; 5];
        for (i, s) in seconds.iter_mut().enumerate() {
            *s = (self.seconds[i] - before.seconds[i]).max(0.0);
        }
        ThreadCpu { seconds }
    }
}

/// The field `key` (`VmRSS`, `VmHWM`: a number of kB) of `status`, the
/// text of a `/proc/PID/status`; `None` when it has no such field.
pub fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Resets the process's peak resident set to its current one (writing 5
/// to `/proc/PID/clear_refs`), so a phase's peak is its own. False when
/// the kernel refuses; the peak then covers the process's whole life.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The kernel's `USER_HZ`, in which `/proc/PID/stat` counts CPU time: asks
/// `getconf CLK_TCK` once; 100, the value on every common architecture,
/// if that fails.
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|ticks| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

/// The resource use between two readings of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseUsage {
    /// CPU seconds used in the phase.
    pub cpu_seconds: f64,
    /// Wall-clock seconds of the phase.
    pub wall_seconds: f64,
    /// The peak resident set at the end of the phase, bytes.
    pub peak_rss_bytes: u64,
    /// The CPU seconds of the phase by thread group.
    pub threads: ThreadCpu,
}

impl PhaseUsage {
    /// Average cores busy: CPU seconds per wall second.
    pub fn cores(&self) -> f64 {
        if self.wall_seconds > 0.0 {
            self.cpu_seconds / self.wall_seconds
        } else {
            0.0
        }
    }
}

/// Measures one phase of a process: call [`PhaseMeter::start`] before,
/// [`PhaseMeter::finish`] after.
#[derive(Debug)]
pub struct PhaseMeter {
    pid: u32,
    cpu_at_start: f64,
    threads_at_start: ThreadCpu,
    started: Instant,
}

impl PhaseMeter {
    /// Resets the peak memory and reads the CPU time.
    pub fn start(pid: u32) -> Result<PhaseMeter, Failure> {
        reset_peak(pid);
        let usage = Usage::of(pid)?;
        let threads_at_start = ThreadCpu::of(pid, usage.cpu_seconds)?;
        Ok(PhaseMeter {
            pid,
            cpu_at_start: usage.cpu_seconds,
            threads_at_start,
            started: Instant::now(),
        })
    }

    /// The CPU time and peak memory since `start`.
    pub fn finish(&self) -> Result<PhaseUsage, Failure> {
        let wall_seconds = self.started.elapsed().as_secs_f64();
        let usage = Usage::of(self.pid)?;
        let threads = ThreadCpu::of(self.pid, usage.cpu_seconds)?.since(&self.threads_at_start);
        Ok(PhaseUsage {
            cpu_seconds: (usage.cpu_seconds - self.cpu_at_start).max(0.0),
            wall_seconds,
            peak_rss_bytes: usage.peak_rss_bytes,
            threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_a_peak() {
        let busy = Instant::now();
        let mut x = 0u64;
        while busy.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        assert!(x != 1);
        let usage = Usage::of(std::process::id()).unwrap();
        assert!(usage.cpu_seconds > 0.0, "{usage:?}");
        assert!(usage.peak_rss_bytes > 1 << 20, "{usage:?}");
    }

    /// Keeps this thread busy until `done`; the work's result, for the
    /// caller to use so that it is not optimised away.
    fn spin_until(done: impl Fn() -> bool) -> u64 {
        let mut x = 0u64;
        while !done() {
            for _ in 0..10_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        x
    }

    #[test]
    fn a_named_threads_cpu_lands_in_its_group() {
        let pid = std::process::id();
        let cpu = || Usage::of(pid).unwrap().cpu_seconds;
        let before = ThreadCpu::of(pid, cpu()).unwrap();
        let (spun, read) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let (spun_tx, spun_rx) = spun;
        let (read_tx, read_rx) = read;
        let spin = std::thread::Builder::new()
            .name("sled-io-bench".into())
            .spawn(move || {
                // Spin until the kernel has counted 5 ticks of this thread,
                // however busy the machine, then stay alive until read.
                let own = || {
                    std::fs::read_to_string("/proc/thread-self/stat")
                        .ok()
                        .and_then(|stat| stat_cpu_ticks(&stat))
                        .unwrap_or(0)
                };
                let start = own();
                let x = spin_until(|| own() >= start + 5);
                spun_tx.send(()).unwrap();
                read_rx.recv().unwrap();
                x
            })
            .unwrap();
        spun_rx.recv().unwrap();
        let during = ThreadCpu::of(pid, cpu()).unwrap().since(&before);
        read_tx.send(()).unwrap();
        assert!(spin.join().unwrap() != 1);
        let io = during.seconds[ThreadGroup::EngineIo as usize];
        assert!(io >= 0.04, "the spinning thread's time: {during:?}");
        assert_eq!(
            during.seconds[ThreadGroup::Writer as usize],
            0.0,
            "{during:?}"
        );
    }

    #[test]
    fn the_groups_add_up_to_the_process() {
        let pid = std::process::id();
        let busy = Instant::now();
        assert!(spin_until(|| busy.elapsed() >= Duration::from_millis(50)) != 1);
        let total = Usage::of(pid).unwrap().cpu_seconds;
        let threads = ThreadCpu::of(pid, total).unwrap();
        let sum: f64 = threads.seconds.iter().sum();
        // Read one after the other: the process may run a few ticks more
        // between the readings.
        let tick = 1.0 / clock_ticks_per_second();
        assert!(
            sum > 0.0 && sum <= total + 2.0 * tick,
            "{threads:?} vs {total}"
        );
        assert!(sum >= total - 3.0 * tick, "{threads:?} vs {total}");
    }

    #[test]
    fn thread_names_fall_in_their_groups() {
        assert_eq!(ThreadGroup::of("store-writer"), ThreadGroup::Writer);
        assert_eq!(ThreadGroup::of("store-flusher"), ThreadGroup::Flusher);
        assert_eq!(ThreadGroup::of("sled-io-3"), ThreadGroup::EngineIo);
        assert_eq!(ThreadGroup::of("tokio-rt-worker"), ThreadGroup::Runtime);
        assert_eq!(ThreadGroup::of("ctxbroker"), ThreadGroup::Runtime);
        assert_eq!(ThreadGroup::of("ctxbrokerd"), ThreadGroup::Other);
        assert_eq!(ThreadGroup::of("ctxbroker-bench"), ThreadGroup::Other);
    }

    #[test]
    fn cpu_ticks_are_read_past_a_name_with_parentheses() {
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 17 0 0";
        assert_eq!(stat_cpu_ticks(stat), Some(267));
        assert_eq!(stat_cpu_ticks("42 (short) S 1 2"), None);
    }
}
