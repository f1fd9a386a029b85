//! Instructions per request, counted rather than timed (`admit
//! --instructions`).
//!
//! Each daemon runs under valgrind's callgrind, which counts every
//! instruction the daemon's threads execute. For each size, one session is
//! grown as for the flat rows ([`super::flat`]), then one client sends
//! no-ops, short unlabelled user messages, and the same messages each with
//! an idempotency key; the counters are zeroed before each phase and
//! dumped after it (`callgrind_control`), so each row's count is the whole
//! daemon's for that phase: gRPC, the session's turn, the store's writer,
//! the engine's threads. A count does not depend on what else the machine
//! runs, or on caches and clock speeds, so a change's effect shows in one
//! run where CPU time needs many; it says nothing of the time an
//! instruction takes. Under callgrind the daemon runs about fifty times
//! slower, so the phases are short.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;

use crate::common::{Client, Failure};
use crate::daemon::DaemonProcess;

use super::{AdmitArgs, Workload, flat};

/// How long a dump may take to appear once asked for.
const DUMP_DEADLINE: Duration = Duration::from_secs(60);

/// One row: a phase at one session size.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct CountRow {
    /// The session's live spans.
    pub live_spans: usize,
    /// What was sent: "no-op", "admit" or "admit+key".
    pub request: &'static str,
    /// Requests in the phase.
    pub requests: usize,
    /// The daemon's instructions over the phase.
    pub instructions: u64,
}

impl CountRow {
    /// Instructions per request.
    fn per_request(&self) -> f64 {
        self.instructions as f64 / self.requests.max(1) as f64
    }
}

/// Counts each daemon of `args` and prints the table.
pub(super) async fn run(args: &AdmitArgs, workload: &Workload) -> Result<(), Failure> {
    let requests = args.instructions_requests.max(1);
    let program = match &args.instructions_daemon {
        Some(path) => path.clone(),
        None => std::env::current_exe()?,
    };
    for kind in &args.daemons {
        // The dumps go to a scratch directory unless they are to be kept.
        let scratch;
        let dir: &Path = match &args.instructions_keep {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                dir
            }
            None => {
                scratch = tempfile::tempdir()?;
                scratch.path()
            }
        };
        let file = dir.join(format!("callgrind.{kind}.out"));
        let wrapper = [
            "valgrind".to_owned(),
            "--tool=callgrind".to_owned(),
            // valgrind runs one thread at a time; without a fair lock on
            // that, a thread spinning on a lock with sched_yield (the
            // engine's thread pool starting) can keep the holder from
            // running for minutes.
            "--fair-sched=yes".to_owned(),
            "--quiet".to_owned(),
            format!("--callgrind-out-file={}", file.display()),
        ];
        let daemon =
            DaemonProcess::spawn_wrapped(&wrapper, &program, kind.durability()).map_err(|err| {
                format!("starting the daemon under valgrind failed ({err}); is valgrind installed?")
            })?;
        let mut client = crate::common::client(daemon.addr).await?;
        let mut dumps = Dumps {
            pid: daemon.pid(),
            file,
            taken: 0,
        };
        let rows = count_rows(
            &mut client,
            &mut dumps,
            workload,
            &args.flat_sizes,
            requests,
        )
        .await?;
        drop(daemon);
        println!();
        println!(
            "daemon instructions per request, {kind}, one client, counted under callgrind ({requests} requests per row; daemon {}):",
            program.display()
        );
        println!();
        print!("{}", render(&kind.to_string(), &rows));
        if args.instructions_keep.is_some() {
            println!();
            for (n, row) in (1..).zip(&rows) {
                println!(
                    "kept: {} spans, {}: {}",
                    row.live_spans,
                    row.request,
                    dump_path(&dumps.file, n).display()
                );
            }
        }
    }
    Ok(())
}

/// The rows of one daemon: for each size, its phases.
async fn count_rows(
    client: &mut Client,
    dumps: &mut Dumps,
    workload: &Workload,
    sizes: &[usize],
    requests: usize,
) -> Result<Vec<CountRow>, Failure> {
    let shorts = flat::short_messages(workload)?;
    let mut rows = Vec::new();
    for &size in sizes {
        let session = format!("count-{size}");
        flat::grow(client, &session, size).await?;
        for n in 0..(requests / 10).max(1) {
            flat::admit_keyed(client, &session, shorts[n % shorts.len()], None).await?;
        }
        for request in ["no-op", "admit", "admit+key"] {
            dumps.zero()?;
            for n in 0..requests {
                let turn = shorts[n % shorts.len()];
                let compacted = match request {
                    "no-op" => {
                        client.get_server_info(pb::GetServerInfoRequest {}).await?;
                        false
                    }
                    "admit" => flat::admit_keyed(client, &session, turn, None).await?,
                    _ => {
                        let key = Some(format!("count-{size}-{n}"));
                        flat::admit_keyed(client, &session, turn, key).await?
                    }
                };
                if compacted {
                    return Err(format!("{session} compacted; the row needs turns that fit").into());
                }
            }
            rows.push(CountRow {
                live_spans: size,
                request,
                requests,
                instructions: dumps.dump()?,
            });
        }
    }
    Ok(rows)
}

/// The dumps callgrind writes for one daemon: `FILE.1`, `FILE.2`, … in
/// the order they are asked for.
struct Dumps {
    pid: u32,
    file: PathBuf,
    taken: u32,
}

impl Dumps {
    /// Zeroes the daemon's counters.
    fn zero(&self) -> Result<(), Failure> {
        self.control("-z")
    }

    /// Dumps the counters and returns the instructions since they were
    /// last zeroed or dumped.
    fn dump(&mut self) -> Result<u64, Failure> {
        self.control("-d")?;
        self.taken += 1;
        let path = dump_path(&self.file, self.taken);
        let deadline = Instant::now() + DUMP_DEADLINE;
        loop {
            // callgrind writes the header, which holds the summary, first.
            if let Ok(text) = std::fs::read_to_string(&path)
                && let Some(total) = summary(&text)
            {
                return Ok(total);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no callgrind dump at {} within {DUMP_DEADLINE:?}",
                    path.display()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn control(&self, what: &str) -> Result<(), Failure> {
        let status = Command::new("callgrind_control")
            .arg(what)
            .arg(self.pid.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|err| {
                format!("running callgrind_control failed ({err}); is valgrind installed?")
            })?;
        match status.success() {
            true => Ok(()),
            false => Err(format!("callgrind_control {what} {} failed: {status}", self.pid).into()),
        }
    }
}

/// The instructions a callgrind dump counted: its header's `summary:`
/// line (one event, `Ir`).
fn summary(dump: &str) -> Option<u64> {
    dump.lines()
        .find_map(|line| line.strip_prefix("summary:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The rows as a markdown table, each admission row with its ratio to the
/// no-op row at the same size.
pub(super) fn render(daemon: &str, rows: &[CountRow]) -> String {
    let mut out = String::from(
        "| daemon | live spans | request | requests | instructions per request | ÷ no-op |\n|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let noop = rows
            .iter()
            .find(|r| r.live_spans == row.live_spans && r.request == "no-op")
            .map(CountRow::per_request);
        let ratio = match (row.request, noop) {
            ("no-op", _) | (_, None) => "–".to_owned(),
            (_, Some(noop)) => format!("{:.2}", row.per_request() / noop.max(1.0)),
        };
        out.push_str(&format!(
            "| {daemon} | {} | {} | {} | {:.0} | {ratio} |\n",
            row.live_spans,
            row.request,
            row.requests,
            row.per_request()
        ));
    }
    out
}

/// Where callgrind writes the `n`th dump of `--callgrind-out-file=FILE`.
fn dump_path(file: &Path, n: u32) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_read_from_a_dumps_header() {
        let dump = "# callgrind format\nversion: 1\npart: 3\n\nevents: Ir\nsummary: 62296584\n\nob=(4) x\n31 657\ntotals: 62296584\n";
        assert_eq!(summary(dump), Some(62_296_584));
        assert_eq!(summary("# callgrind format\nevents: Ir\n"), None);
        assert_eq!(summary("summary: many\n"), None);
    }

    #[test]
    fn rows_are_rendered_per_request_against_the_no_op() {
        let row = |request, instructions| CountRow {
            live_spans: 1000,
            request,
            requests: 200,
            instructions,
        };
        let table = render(
            "relaxed",
            &[row("no-op", 11_200_000), row("admit", 61_600_000)],
        );
        assert!(
            table.contains("| relaxed | 1000 | no-op | 200 | 56000 | – |"),
            "{table}"
        );
        assert!(
            table.contains("| relaxed | 1000 | admit | 200 | 308000 | 5.50 |"),
            "{table}"
        );
    }

    #[test]
    fn the_count_is_asked_for_with_its_own_flags() {
        use clap::Parser;
        let args = AdmitArgs::try_parse_from([
            "admit",
            "--instructions",
            "--instructions-requests",
            "50",
            "--instructions-daemon",
            "/tmp/before/ctxbroker-bench",
        ])
        .unwrap();
        assert!(args.instructions);
        assert_eq!(args.instructions_requests, 50);
        assert_eq!(
            args.instructions_daemon.as_deref(),
            Some(Path::new("/tmp/before/ctxbroker-bench"))
        );
        assert_eq!(
            AdmitArgs::try_parse_from(["admit"])
                .unwrap()
                .instructions_requests,
            500
        );
        // Another build's daemon only means something to the count.
        assert!(AdmitArgs::try_parse_from(["admit", "--instructions-daemon", "x"]).is_err());
        assert!(AdmitArgs::try_parse_from(["admit", "--instructions", "--split-only"]).is_err());
        // So does keeping its dumps.
        assert!(AdmitArgs::try_parse_from(["admit", "--instructions-keep", "d"]).is_err());
        let keep =
            AdmitArgs::try_parse_from(["admit", "--instructions", "--instructions-keep", "d"])
                .unwrap()
                .instructions_keep;
        assert_eq!(keep.as_deref(), Some(Path::new("d")));
    }

    #[test]
    fn a_dump_is_named_after_the_file_and_its_number() {
        let file = Path::new("/tmp/run/callgrind.out");
        assert_eq!(dump_path(file, 3), Path::new("/tmp/run/callgrind.out.3"));
    }
}
