//! The command line: one optional flag per setting, each with its
//! `CTXBROKER_*` environment twin (clap reads it, so a flag beats its
//! variable). Serialised, the flags given are a layer keyed as the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde::Serialize;

use super::{Durability, LogFormat};

/// ctxbrokerd: the ctxbroker daemon.
///
/// Owns the context window of long-running LLM agents: agents admit every
/// turn before it enters their prompt; the broker compacts at admission by
/// token budget and class, verifies before committing, and streams durable
/// compaction markers.
///
/// With no command it serves gRPC until SIGINT or SIGTERM.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "ctxbrokerd",
    version,
    disable_help_subcommand = true,
    after_help = "Every option also reads the CTXBROKER_* environment variable shown with it, \
                  and a key of the --config file: the option's name with underscores \
                  (--max-sessions is max_sessions). A flag beats the environment, the \
                  environment beats the file, the file beats the default."
)]
pub struct Cli {
    /// Something to do instead of serving.
    #[command(subcommand)]
    #[serde(skip)]
    pub command: Option<Command>,
    /// A TOML file with any of the settings below (keys as the flags, with
    /// underscores: `data_dir = "/var/lib/ctxbroker"`). Flags and
    /// environment variables override it.
    #[arg(long, env = "CTXBROKER_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The address to serve gRPC on [default: 127.0.0.1:50051].
    #[arg(long, env = "CTXBROKER_LISTEN", value_name = "ADDR")]
    #[arg(help_heading = "Serving")]
    pub listen: Option<SocketAddr>,
    /// Serve on this inherited, already listening TCP socket instead of
    /// binding (socket activation). Overrides --listen.
    #[arg(long, env = "CTXBROKER_LISTEN_FD", value_name = "FD", value_parser = clap::value_parser!(i32).range(0..))]
    #[arg(help_heading = "Serving")]
    pub listen_fd: Option<i32>,
    /// Milliseconds a unary request may take [default: 30000].
    #[arg(long, env = "CTXBROKER_REQUEST_TIMEOUT_MS", value_name = "MS")]
    #[arg(help_heading = "Serving")]
    pub request_timeout_ms: Option<u64>,
    /// Milliseconds shutdown waits for requests and streams to end
    /// [default: 10000].
    #[arg(long, env = "CTXBROKER_SHUTDOWN_GRACE_MS", value_name = "MS")]
    #[arg(help_heading = "Serving")]
    pub shutdown_grace_ms: Option<u64>,
    /// The data directory [default: ./ctxbroker-data].
    #[arg(long, env = "CTXBROKER_DATA_DIR", value_name = "DIR")]
    #[arg(help_heading = "Storage")]
    pub data_dir: Option<PathBuf>,
    /// `flush`: every acknowledged write is on disk; `relaxed`: acknowledge
    /// before the flush [default: flush].
    #[arg(long, env = "CTXBROKER_DURABILITY", value_enum)]
    #[arg(help_heading = "Storage")]
    pub durability: Option<Durability>,
    /// Markers retained in the log [default: 1000000].
    #[arg(long, env = "CTXBROKER_MARKER_RETENTION", value_name = "N")]
    #[arg(help_heading = "Storage")]
    pub marker_retention: Option<u64>,
    /// The memory the daemon is sized for: idle sessions get a quarter of
    /// it, the engine's page cache and search postings a sixteenth each;
    /// at least 67108864 [default: 268435456].
    #[arg(long, env = "CTXBROKER_MEMORY_BUDGET_BYTES", value_name = "BYTES")]
    #[arg(help_heading = "Storage")]
    pub memory_budget_bytes: Option<u64>,
    /// Bytes of idle sessions kept in memory; the least recently used
    /// beyond it are reloaded from the store when next used; at most
    /// --memory-budget-bytes [default: a quarter of it].
    #[arg(long, env = "CTXBROKER_SESSION_CACHE_BYTES", value_name = "BYTES")]
    #[arg(help_heading = "Storage")]
    pub session_cache_bytes: Option<u64>,
    /// Largest request message in bytes [default: 16777216].
    #[arg(long, env = "CTXBROKER_MAX_REQUEST_BYTES", value_name = "BYTES")]
    #[arg(help_heading = "Limits")]
    pub max_request_bytes: Option<usize>,
    /// Most spans in one turn [default: 256].
    #[arg(long, env = "CTXBROKER_MAX_SPANS_PER_TURN", value_name = "N")]
    #[arg(help_heading = "Limits")]
    pub max_spans_per_turn: Option<usize>,
    /// Largest span text in bytes [default: 4194304].
    #[arg(long, env = "CTXBROKER_MAX_SPAN_BYTES", value_name = "BYTES")]
    #[arg(help_heading = "Limits")]
    pub max_span_bytes: Option<usize>,
    /// Most sessions held [default: 100000].
    #[arg(long, env = "CTXBROKER_MAX_SESSIONS", value_name = "N")]
    #[arg(help_heading = "Limits")]
    pub max_sessions: Option<u64>,
    /// Largest window_tokens a session may declare [default: 10000000].
    #[arg(long, env = "CTXBROKER_MAX_WINDOW_TOKENS", value_name = "TOKENS")]
    #[arg(help_heading = "Limits")]
    pub max_window_tokens: Option<u32>,
    /// Most concurrent streams, server-wide [default: 10000].
    #[arg(long, env = "CTXBROKER_MAX_CONCURRENT_STREAMS", value_name = "N")]
    #[arg(help_heading = "Limits")]
    pub max_concurrent_streams: Option<usize>,
    /// The log format [default: text].
    #[arg(long, env = "CTXBROKER_LOG_FORMAT", value_enum)]
    #[arg(help_heading = "Logging")]
    pub log_format: Option<LogFormat>,
    /// The log filter, e.g. `info` or `ctxbroker_server=debug,info`
    /// [default: info].
    #[arg(long = "log", env = "CTXBROKER_LOG", value_name = "FILTER")]
    #[serde(rename = "log")]
    #[arg(help_heading = "Logging")]
    pub log_filter: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g.
    /// `127.0.0.1:9464` (port 0 picks one; the log says which)
    /// [default: off].
    #[arg(long, env = "CTXBROKER_METRICS_ADDR", value_name = "ADDR")]
    #[arg(help_heading = "Metrics")]
    pub metrics_addr: Option<SocketAddr>,
    /// How many sessions, those with the most live tokens, the metrics
    /// name; 0 names none, at most 100 [default: 10].
    #[arg(long, env = "CTXBROKER_METRICS_TOP_SESSIONS", value_name = "N")]
    #[arg(help_heading = "Metrics")]
    pub metrics_top_sessions: Option<usize>,
}

/// What `ctxbrokerd` can do instead of serving.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Check a TOML config file: print the settings the daemon would run
    /// with (as TOML) and exit 0, or name every bad key and exit 1.
    ///
    /// FILE takes the place of --config; options and CTXBROKER_*
    /// variables apply as when serving.
    CheckConfig {
        /// The TOML file to check.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}
