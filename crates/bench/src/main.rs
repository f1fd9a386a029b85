//! `ctxbroker-bench`: measurements against an in-process daemon on a
//! loopback socket, each compared with a baseline measured in the same run
//! (the machine is shared; only same-run ratios mean much).
//!
//! ```text
//! ctxbroker-bench admit [--duration S] [--clients N] [--sessions N] [--csv PATH] ... (--help)
//! ctxbroker-bench watch [--watchers N] [--duration S] [--csv PATH] ... (--help)
//! ctxbroker-bench stalled-watcher [TURNS] [ROUNDS]
//! ctxbroker-bench plan [SIZES] [REPEATS] [--csv PATH]
//! ctxbroker-bench classify [--data DIR] [--repeats N] [--explain]
//! ctxbroker-bench classify train [--data DIR] [--write PATH] [--check]
//! ctxbroker-bench tokens [REPEATS] [MAX_ADVERSARIAL_BYTES] [TIKTOKEN_CAP_SECONDS]
//! ctxbroker-bench replay [--seed N] [--sessions N] [--turns N] [--window W] [--csv PATH] [--per-session] [--unlabelled]
//! ctxbroker-bench storage [--sessions N] [--spans N] [--daemon PATH] [--dir DIR] [--reuse] ...
//! ctxbroker-bench search [--spans N,N,...] [--queries N] [--batch N]
//! ctxbroker-bench quota [--turns N] [--rounds N] [--flood-quota R] [--flood-rate R] [--flooders N]
//! ```
//!
//! `admit`: admission throughput and latency under a realistic turn mix,
//! against the no-op floor, relaxed durability and Redis, then one
//! admission's cost split into its stages, in process, at 1k, 10k and
//! 100k live spans (`admit/`; `--no-split`, `--split-only`).
//! `watch`: marker delivery to many watchers while admissions run, and a
//! stalled watcher's effect on admissions (`watch.rs`).
//! `stalled-watcher`: that last part of `watch` alone: admission latency
//! with no watcher, and with one that opened a stream and never reads it,
//! in alternating rounds of `TURNS` admissions (default 1,000 × 4 rounds).
//!
//! `plan`: the admission that must compact a session of N live spans
//! (default 1k, 10k, 100k, 1M; `SIZES` comma-separated), in process:
//! planning, applying and verifying, with the growth against n·log n.
//!
//! `admit`, `watch` and `plan` take `--csv PATH` to write their raw
//! samples (every request's latency, every delivery, every run) for
//! `plot_bench.py`, as `replay --csv` does for `plot_replay.py`.
//!
//! `classify`: the standing-instruction classifier on the labelled spans,
//! per category, training and held-out splits; `classify train` fits it on
//! the training split and writes the weights core compiles in.
//!
//! `quota`: a tenant's admission latency alone and while another tenant
//! floods past its `admits_per_second` quota (`quota.rs`).
//!
//! `tokens`: the token counter against tiktoken-rs on a fixed corpus and
//! on adversarial input, for o200k_base and cl100k_base.

use ctxbroker_bench::common::Failure;
use ctxbroker_bench::watch;

/// The allocator and options `ctxbrokerd` ships with (src/main.rs), so
/// that the daemon this binary serves, in process or as a child, is
/// measured as it runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, as in `ctxbrokerd`: two arenas, freed pages
/// returned after one second; `_RJEM_MALLOC_CONF` overrides them.
#[allow(unsafe_code)]
// SAFETY: jemalloc reads this symbol as a `const char *` to a
// NUL-terminated string and never writes through it; a `&[u8; N]` is
// such a pointer, and the bytes end in NUL.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; 30] = b"narenas:2,dirty_decay_ms:1000\0";

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("admit") => ctxbroker_bench::admit::admit_main(rest).await,
        Some("classify") => ctxbroker_bench::classify::classify_main(rest),
        Some("daemon") => ctxbroker_bench::daemon::daemon_main(rest).await,
        Some("stalled-watcher") => watch::stalled_watcher_main(rest).await,
        Some("watch") => watch::watch_main(rest).await,
        Some("plan") => ctxbroker_bench::plan::plan_main(rest),
        Some("quota") => ctxbroker_bench::quota::quota_main(rest).await,
        Some("tokens") => ctxbroker_bench::tokens::tokens_main(rest),
        Some("replay") => ctxbroker_bench::replay::replay_main(rest),
        Some("storage") => ctxbroker_bench::storage::storage_main(rest).await,
        Some("search") => ctxbroker_bench::search::search_main(rest).await,
        _ => {
            eprintln!(
                "usage: ctxbroker-bench admit [--duration S] [--clients N] [--sessions N] ... (--help)"
            );
            eprintln!(
                "       ctxbroker-bench watch [--watchers N] [--rate R] [--duration S] ... (--help)"
            );
            eprintln!("       ctxbroker-bench stalled-watcher [TURNS] [ROUNDS]");
            eprintln!("       ctxbroker-bench classify [--data DIR] [--repeats N] [--explain]");
            eprintln!(
                "       ctxbroker-bench classify train [--data DIR] [--write PATH] [--check]"
            );
            eprintln!("       ctxbroker-bench plan [SIZES] [REPEATS] [--csv PATH]");
            eprintln!(
                "       ctxbroker-bench quota [--turns N] [--rounds N] [--flood-quota R] [--flood-rate R] [--flooders N]"
            );
            eprintln!(
                "       ctxbroker-bench tokens [REPEATS] [MAX_ADVERSARIAL_BYTES] [TIKTOKEN_CAP_SECONDS]"
            );
            eprintln!(
                "       ctxbroker-bench replay [--seed N] [--sessions N] [--turns N] [--window W] [--csv PATH] [--per-session] [--unlabelled]"
            );
            eprintln!(
                "       ctxbroker-bench storage [--sessions N] [--spans N] [--clients N] [--restarts N] [--verify N] [--sample N] [--daemon PATH] [--dir DIR] [--reuse] [--populate-durability flush|relaxed] [--daemon-arg ARG]..."
            );
            eprintln!("       ctxbroker-bench search [--spans N,N,...] [--queries N] [--batch N]");
            eprintln!("each subcommand takes --help");
            std::process::exit(2);
        }
    }
}
