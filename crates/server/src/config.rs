//! The daemon's settings: flags, their `CTXBROKER_*` environment twins, an
//! optional TOML file under them, and defaults that make the bare binary
//! useful (`127.0.0.1:50051`, data in `./ctxbroker-data`).
//!
//! Precedence, highest first: flag, environment variable, file, default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Deserialize;

/// How the daemon gets its listening socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// Bind this address.
    Addr(SocketAddr),
    /// Serve on an already bound, listening TCP socket inherited as this
    /// file descriptor (socket activation; tests bind first and pass it).
    Fd(i32),
}

/// Whether an acknowledgement waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Every acknowledged write has been flushed (concurrent writes share
    /// flushes). The default.
    Flush,
    /// Acknowledge before the flush; the store flushes in the background.
    /// Writes of the last few hundred milliseconds may be lost on a crash.
    Relaxed,
}

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The limits the daemon enforces on requests and capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest request message, in bytes.
    pub max_request_bytes: usize,
    /// Most spans in one turn.
    pub max_spans_per_turn: usize,
    /// Largest span text, in bytes.
    pub max_span_bytes: usize,
    /// Most sessions held.
    pub max_sessions: u64,
    /// Longest session id, in bytes (fixed by the contract's key format).
    pub max_session_id_bytes: usize,
    /// Largest window a session may declare.
    pub max_window_tokens: u32,
    /// Most concurrent streams (watches and admit streams), server-wide.
    pub max_concurrent_streams: usize,
    /// Most session ids in one watch filter.
    pub max_watch_sessions: usize,
    /// Markers retained in the log.
    pub marker_retention: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 16 << 20,
            max_spans_per_turn: 256,
            max_span_bytes: 4 << 20,
            max_sessions: 100_000,
            max_session_id_bytes: 128,
            max_window_tokens: 10_000_000,
            max_concurrent_streams: 10_000,
            max_watch_sessions: 1_000,
            marker_retention: 1_000_000,
        }
    }
}

/// The daemon's resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to serve gRPC.
    pub listen: Listen,
    /// The sled data directory.
    pub data_dir: PathBuf,
    /// Whether acknowledgements wait for a flush.
    pub durability: Durability,
    /// The log format.
    pub log_format: LogFormat,
    /// The log filter, in `tracing_subscriber::EnvFilter` syntax.
    pub log_filter: String,
    /// How long shutdown waits for in-flight requests and streams.
    pub shutdown_grace: Duration,
    /// Per-request timeout for unary calls.
    pub request_timeout: Duration,
    /// The limits.
    pub limits: Limits,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: Listen::Addr(SocketAddr::from(([127, 0, 0, 1], 50051))),
            data_dir: PathBuf::from("./ctxbroker-data"),
            durability: Durability::Flush,
            log_format: LogFormat::Text,
            log_filter: "info".to_owned(),
            shutdown_grace: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            limits: Limits::default(),
        }
    }
}

/// `ctxbrokerd`: the ctxbroker daemon.
///
/// Owns the context window of long-running LLM agents: agents admit every
/// turn before it enters their prompt; the broker compacts at admission by
/// token budget and class, verifies before committing, and streams durable
/// compaction markers.
#[derive(Debug, Parser)]
#[command(name = "ctxbrokerd", version, about, long_about)]
pub struct Cli {
    /// A TOML file with any of the settings below (keys as the flags, with
    /// underscores: `data_dir = "/var/lib/ctxbroker"`). Flags and
    /// environment variables override it.
    #[arg(long, env = "CTXBROKER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The address to serve gRPC on [default: 127.0.0.1:50051].
    #[arg(long, env = "CTXBROKER_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Serve on this inherited, already listening TCP socket instead of
    /// binding (socket activation). Overrides --listen.
    #[arg(long, env = "CTXBROKER_LISTEN_FD", value_name = "FD")]
    pub listen_fd: Option<i32>,
    /// The data directory [default: ./ctxbroker-data].
    #[arg(long, env = "CTXBROKER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// `flush`: every acknowledged write is on disk; `relaxed`: acknowledge
    /// before the flush [default: flush].
    #[arg(long, env = "CTXBROKER_DURABILITY", value_enum)]
    pub durability: Option<Durability>,
    /// The log format [default: text].
    #[arg(long, env = "CTXBROKER_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// The log filter, e.g. `info` or `ctxbroker_server=debug,info`
    /// [default: info].
    #[arg(long = "log", env = "CTXBROKER_LOG", value_name = "FILTER")]
    pub log_filter: Option<String>,
    /// Milliseconds shutdown waits for requests and streams to end
    /// [default: 10000].
    #[arg(long, env = "CTXBROKER_SHUTDOWN_GRACE_MS", value_name = "MS")]
    pub shutdown_grace_ms: Option<u64>,
    /// Milliseconds a unary request may take [default: 30000].
    #[arg(long, env = "CTXBROKER_REQUEST_TIMEOUT_MS", value_name = "MS")]
    pub request_timeout_ms: Option<u64>,
    /// Largest request message in bytes [default: 16777216].
    #[arg(long, env = "CTXBROKER_MAX_REQUEST_BYTES", value_name = "BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Most spans in one turn [default: 256].
    #[arg(long, env = "CTXBROKER_MAX_SPANS_PER_TURN", value_name = "N")]
    pub max_spans_per_turn: Option<usize>,
    /// Largest span text in bytes [default: 4194304].
    #[arg(long, env = "CTXBROKER_MAX_SPAN_BYTES", value_name = "BYTES")]
    pub max_span_bytes: Option<usize>,
    /// Most sessions held [default: 100000].
    #[arg(long, env = "CTXBROKER_MAX_SESSIONS", value_name = "N")]
    pub max_sessions: Option<u64>,
    /// Largest window_tokens a session may declare [default: 10000000].
    #[arg(long, env = "CTXBROKER_MAX_WINDOW_TOKENS", value_name = "TOKENS")]
    pub max_window_tokens: Option<u32>,
    /// Most concurrent streams, server-wide [default: 10000].
    #[arg(long, env = "CTXBROKER_MAX_CONCURRENT_STREAMS", value_name = "N")]
    pub max_concurrent_streams: Option<usize>,
    /// Markers retained in the log [default: 1000000].
    #[arg(long, env = "CTXBROKER_MARKER_RETENTION", value_name = "N")]
    pub marker_retention: Option<u64>,
}

/// The TOML file: the same settings as the flags, every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    durability: Option<Durability>,
    log_format: Option<LogFormat>,
    log_filter: Option<String>,
    shutdown_grace_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    max_request_bytes: Option<usize>,
    max_spans_per_turn: Option<usize>,
    max_span_bytes: Option<usize>,
    max_sessions: Option<u64>,
    max_window_tokens: Option<u32>,
    max_concurrent_streams: Option<usize>,
    marker_retention: Option<u64>,
}

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML file is malformed or has an unknown key.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
    /// A value is out of range.
    #[error("invalid setting {key}: {message}")]
    Invalid {
        /// The setting.
        key: &'static str,
        /// What is wrong and the limit.
        message: String,
    },
}

impl Cli {
    /// Resolves flags, environment and the optional file into settings.
    pub fn resolve(self) -> Result<Settings, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let defaults = Settings::default();
        let default_limits = defaults.limits.clone();

        let listen = match (self.listen_fd, self.listen.or(file.listen)) {
            (Some(fd), _) => Listen::Fd(fd),
            (None, Some(addr)) => Listen::Addr(addr),
            (None, None) => defaults.listen,
        };
        let limits = Limits {
            max_request_bytes: self
                .max_request_bytes
                .or(file.max_request_bytes)
                .unwrap_or(default_limits.max_request_bytes),
            max_spans_per_turn: self
                .max_spans_per_turn
                .or(file.max_spans_per_turn)
                .unwrap_or(default_limits.max_spans_per_turn),
            max_span_bytes: self
                .max_span_bytes
                .or(file.max_span_bytes)
                .unwrap_or(default_limits.max_span_bytes),
            max_sessions: self
                .max_sessions
                .or(file.max_sessions)
                .unwrap_or(default_limits.max_sessions),
            max_session_id_bytes: default_limits.max_session_id_bytes,
            max_window_tokens: self
                .max_window_tokens
                .or(file.max_window_tokens)
                .unwrap_or(default_limits.max_window_tokens),
            max_concurrent_streams: self
                .max_concurrent_streams
                .or(file.max_concurrent_streams)
                .unwrap_or(default_limits.max_concurrent_streams),
            max_watch_sessions: default_limits.max_watch_sessions,
            marker_retention: self
                .marker_retention
                .or(file.marker_retention)
                .unwrap_or(default_limits.marker_retention),
        };
        let settings = Settings {
            listen,
            data_dir: self.data_dir.or(file.data_dir).unwrap_or(defaults.data_dir),
            durability: self
                .durability
                .or(file.durability)
                .unwrap_or(defaults.durability),
            log_format: self
                .log_format
                .or(file.log_format)
                .unwrap_or(defaults.log_format),
            log_filter: self
                .log_filter
                .or(file.log_filter)
                .unwrap_or(defaults.log_filter),
            shutdown_grace: self
                .shutdown_grace_ms
                .or(file.shutdown_grace_ms)
                .map(Duration::from_millis)
                .unwrap_or(defaults.shutdown_grace),
            request_timeout: self
                .request_timeout_ms
                .or(file.request_timeout_ms)
                .map(Duration::from_millis)
                .unwrap_or(defaults.request_timeout),
            limits,
        };
        settings.check()?;
        Ok(settings)
    }
}

impl Settings {
    /// Refuses values that would make the daemon unusable.
    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.to_owned(),
            })
        };
        let l = &self.limits;
        if l.max_request_bytes < 1024 {
            return invalid("max_request_bytes", "must be at least 1024");
        }
        if l.max_span_bytes == 0 || l.max_span_bytes > l.max_request_bytes {
            return invalid("max_span_bytes", "must be between 1 and max_request_bytes");
        }
        if l.max_spans_per_turn == 0 {
            return invalid("max_spans_per_turn", "must be at least 1");
        }
        if l.max_sessions == 0 {
            return invalid("max_sessions", "must be at least 1");
        }
        if l.max_window_tokens == 0 {
            return invalid("max_window_tokens", "must be at least 1");
        }
        if l.max_concurrent_streams == 0 {
            return invalid("max_concurrent_streams", "must be at least 1");
        }
        if l.marker_retention == 0 {
            return invalid("marker_retention", "must be at least 1");
        }
        if self.request_timeout.is_zero() {
            return invalid("request_timeout_ms", "must be at least 1");
        }
        if let Listen::Fd(fd) = self.listen
            && fd < 0
        {
            return invalid("listen_fd", "must be a non-negative file descriptor");
        }
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<FileSettings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        message: err.message().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["ctxbrokerd"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap()
    }

    #[test]
    fn bare_binary_serves_on_the_documented_defaults() {
        let settings = cli(&[]).resolve().unwrap();
        assert_eq!(
            settings.listen,
            Listen::Addr("127.0.0.1:50051".parse().unwrap())
        );
        assert_eq!(settings.data_dir, PathBuf::from("./ctxbroker-data"));
        assert_eq!(settings.durability, Durability::Flush);
    }

    #[test]
    fn flags_override_the_file_and_the_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctxbroker.toml");
        std::fs::write(
            &path,
            "data_dir = \"/srv/ctx\"\nmax_sessions = 7\nlisten = \"127.0.0.1:6000\"\n",
        )
        .unwrap();
        let settings = cli(&["--config", path.to_str().unwrap(), "--max-sessions", "9"])
            .resolve()
            .unwrap();
        assert_eq!(settings.data_dir, PathBuf::from("/srv/ctx"));
        assert_eq!(settings.limits.max_sessions, 9);
        assert_eq!(
            settings.listen,
            Listen::Addr("127.0.0.1:6000".parse().unwrap())
        );
    }

    #[test]
    fn an_unknown_file_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "data_dri = \"/x\"\n").unwrap();
        let err = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("data_dri"), "{err}");
    }

    #[test]
    fn nonsense_limits_are_refused_by_name() {
        let err = cli(&["--max-spans-per-turn", "0"]).resolve().unwrap_err();
        assert!(err.to_string().contains("max_spans_per_turn"), "{err}");
    }
}
