//! The command line: one optional flag per setting, each with its
//! `CTXBROKER_*` environment twin (clap reads it, so a flag beats its
//! variable). Serialised, the flags given are a layer keyed as the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde::Serialize;

use super::{Durability, LogFormat};
use crate::tenant::Role;

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
    /// Serve plaintext on a Unix domain socket at this path instead of
    /// TCP; only this user may connect (the socket is owner-only).
    /// Overrides --listen.
    #[arg(long, env = "CTXBROKER_LISTEN_UNIX", value_name = "PATH")]
    #[arg(help_heading = "Serving")]
    pub listen_unix: Option<PathBuf>,
    /// Serve on this inherited, already listening TCP socket instead of
    /// binding (socket activation). Overrides --listen and --listen-unix.
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
    /// Close a connection that has not finished its TLS handshake and sent
    /// the HTTP/2 preface within this many milliseconds [default: 10000].
    #[arg(long, env = "CTXBROKER_HANDSHAKE_TIMEOUT_MS", value_name = "MS")]
    #[arg(help_heading = "Connections")]
    pub handshake_timeout_ms: Option<u64>,
    /// Milliseconds of silence on a connection before the server pings it
    /// [default: 30000].
    #[arg(long, env = "CTXBROKER_HTTP2_KEEPALIVE_INTERVAL_MS", value_name = "MS")]
    #[arg(help_heading = "Connections")]
    pub http2_keepalive_interval_ms: Option<u64>,
    /// Milliseconds a keepalive ping may wait for its answer before the
    /// connection is closed [default: 10000].
    #[arg(long, env = "CTXBROKER_HTTP2_KEEPALIVE_TIMEOUT_MS", value_name = "MS")]
    #[arg(help_heading = "Connections")]
    pub http2_keepalive_timeout_ms: Option<u64>,
    /// Most gRPC connections open at once; past it, a new connection
    /// takes the place of the oldest one still in its handshake, or is
    /// closed [default: 4096].
    #[arg(long, env = "CTXBROKER_MAX_CONNECTIONS", value_name = "N")]
    #[arg(help_heading = "Connections")]
    pub max_connections: Option<usize>,
    /// The server's certificate chain, PEM; with --tls-key, serves TLS
    /// (re-read on SIGHUP) [default: none].
    #[arg(long, env = "CTXBROKER_TLS_CERT", value_name = "FILE")]
    #[arg(help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM (PKCS#8, PKCS#1 or SEC1)
    /// [default: none].
    #[arg(long, env = "CTXBROKER_TLS_KEY", value_name = "FILE")]
    #[arg(help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,
    /// Require clients to present a certificate issued by one of these CA
    /// certificates, PEM (mutual TLS) [default: none].
    #[arg(long, env = "CTXBROKER_TLS_CLIENT_CA", value_name = "FILE")]
    #[arg(help_heading = "TLS")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve plaintext on an address that is not loopback (a warning is
    /// logged); without it the daemon refuses to start there
    /// [default: false].
    #[arg(long, env = "CTXBROKER_ALLOW_INSECURE", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(help_heading = "TLS")]
    pub allow_insecure: Option<bool>,
    /// A TOML file of bearer tokens (the SHA-256 of each, with its id,
    /// role and tenant; re-read on SIGHUP). Set, every call to the broker
    /// needs `authorization: Bearer <token>` and the token's role decides
    /// what it may call; make entries with `ctxbrokerd token new`
    /// [default: none: authentication off, every caller is an operator].
    #[arg(long, env = "CTXBROKER_AUTH_TOKENS_FILE", value_name = "FILE")]
    #[arg(help_heading = "Authentication")]
    pub auth_tokens_file: Option<PathBuf>,
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
    /// Serve the metrics over TLS with the --tls-* files [default: false].
    #[arg(long, env = "CTXBROKER_METRICS_TLS", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(help_heading = "Metrics")]
    pub metrics_tls: Option<bool>,
    /// Most metrics connections open at once; past it, a new connection
    /// takes the place of the oldest one that has not sent its request
    /// [default: 16].
    #[arg(long, env = "CTXBROKER_METRICS_MAX_CONNECTIONS", value_name = "N")]
    #[arg(help_heading = "Metrics")]
    pub metrics_max_connections: Option<usize>,
    /// Milliseconds a metrics client has to finish its TLS handshake and
    /// send its request head [default: 5000].
    #[arg(long, env = "CTXBROKER_METRICS_HEADER_TIMEOUT_MS", value_name = "MS")]
    #[arg(help_heading = "Metrics")]
    pub metrics_header_timeout_ms: Option<u64>,
    /// How many sessions, those with the most live tokens, the metrics
    /// name; 0 names none, at most 100 [default: 10].
    #[arg(long, env = "CTXBROKER_METRICS_TOP_SESSIONS", value_name = "N")]
    #[arg(help_heading = "Metrics")]
    pub metrics_top_sessions: Option<usize>,
    /// Serve the context inspector at http://METRICS_ADDR/inspect:
    /// read-only pages of the sessions, their windows and markers, live,
    /// with JSON twins; needs --metrics-addr [default: false].
    #[arg(long, env = "CTXBROKER_INSPECTOR", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(help_heading = "Metrics")]
    pub inspector: Option<bool>,
}

/// What `ctxbrokerd` can do instead of serving.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Make bearer tokens and their token file entries.
    #[command(subcommand)]
    Token(TokenCommand),
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

/// `ctxbrokerd token ...`: tokens for `auth_tokens_file`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum TokenCommand {
    /// Make a fresh token (32 random bytes, as 64 hexadecimal digits):
    /// the token alone on stdout, its `[[token]]` entry for the token file
    /// on stderr (TOML, comments included, ready to append).
    #[command(
        after_help = "Example: TOKEN=$(ctxbrokerd token new --id ci-bot --role agent --tenant acme \
                      2>>/etc/ctxbroker/tokens.toml), then SIGHUP the daemon."
    )]
    New {
        /// The token's id: named in logs, never secret; 1 to 64 bytes of
        /// A-Z, a-z, 0-9, '.', '_', '-'.
        #[arg(long)]
        id: String,
        /// What the token may do: `agent` (its tenant's sessions, all but
        /// export and import), `watcher` (read and watch its tenant's
        /// sessions) or `operator` (everything, every tenant).
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// The tenant whose sessions an agent or watcher token reaches;
        /// not for an operator.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print the SHA-256 of a token read from stdin (one trailing newline
    /// ignored), as the token file's `sha256` wants it: for tokens made
    /// elsewhere.
    Hash,
}

fn parse_role(name: &str) -> Result<Role, String> {
    crate::auth::parse_role(name)
        .ok_or_else(|| format!("{name:?} is not a role: agent, watcher or operator"))
}
