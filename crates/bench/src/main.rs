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

use ctxbroker_bench::common::Failure;
use ctxbroker_bench::watch;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("stalled-watcher") => watch::stalled_watcher_main(rest).await,
        _ => {
            eprintln!("usage: ctxbroker-bench stalled-watcher [TURNS] [ROUNDS]");
            std::process::exit(2);
        }
    }
}
