//! The daemon's settings: flags, their `CTXBROKER_*` environment twins, an
//! optional TOML file under them, and defaults that make the bare binary
//! useful (`127.0.0.1:50051`, data in `./ctxbroker-data`).
//!
//! Precedence, highest first: flag, environment variable, file, default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
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
    /// Bytes of idle sessions kept in memory between requests (an
    /// estimate of their spans' heap); beyond it the least recently used
    /// are dropped from memory and reloaded from the store when next used.
    pub session_cache_bytes: u64,
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
            session_cache_bytes: crate::sessions::DEFAULT_SESSION_CACHE_BYTES,
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
    /// Where to serve Prometheus metrics (`GET /metrics`); `None` serves
    /// none.
    pub metrics_addr: Option<SocketAddr>,
    /// Sessions named in the per-session live-token metrics (the ones with
    /// the most live tokens); 0 names none.
    pub metrics_top_sessions: usize,
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
            metrics_addr: None,
            metrics_top_sessions: crate::metrics::DEFAULT_TOP_SESSIONS,
            limits: Limits::default(),
        }
    }
}

/// ctxbrokerd: the ctxbroker daemon.
///
/// Owns the context window of long-running LLM agents: agents admit every
/// turn before it enters their prompt; the broker compacts at admission by
/// token budget and class, verifies before committing, and streams durable
/// compaction markers.
///
/// With no command it serves gRPC until SIGINT or SIGTERM.
#[derive(Debug, Parser)]
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
    pub command: Option<Command>,
    /// A TOML file with any of the settings below (keys as the flags, with
    /// underscores: `data_dir = "/var/lib/ctxbroker"`). Flags and
    /// environment variables override it.
    #[arg(long, env = "CTXBROKER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The address to serve gRPC on [default: 127.0.0.1:50051].
    #[arg(
        long,
        env = "CTXBROKER_LISTEN",
        value_name = "ADDR",
        help_heading = "Serving"
    )]
    pub listen: Option<SocketAddr>,
    /// Serve on this inherited, already listening TCP socket instead of
    /// binding (socket activation). Overrides --listen.
    #[arg(
        long,
        env = "CTXBROKER_LISTEN_FD",
        value_name = "FD",
        value_parser = clap::value_parser!(i32).range(0..),
        help_heading = "Serving"
    )]
    pub listen_fd: Option<i32>,
    /// Milliseconds a unary request may take [default: 30000].
    #[arg(
        long,
        env = "CTXBROKER_REQUEST_TIMEOUT_MS",
        value_name = "MS",
        help_heading = "Serving"
    )]
    pub request_timeout_ms: Option<u64>,
    /// Milliseconds shutdown waits for requests and streams to end
    /// [default: 10000].
    #[arg(
        long,
        env = "CTXBROKER_SHUTDOWN_GRACE_MS",
        value_name = "MS",
        help_heading = "Serving"
    )]
    pub shutdown_grace_ms: Option<u64>,
    /// The data directory [default: ./ctxbroker-data].
    #[arg(
        long,
        env = "CTXBROKER_DATA_DIR",
        value_name = "DIR",
        help_heading = "Storage"
    )]
    pub data_dir: Option<PathBuf>,
    /// `flush`: every acknowledged write is on disk; `relaxed`: acknowledge
    /// before the flush [default: flush].
    #[arg(
        long,
        env = "CTXBROKER_DURABILITY",
        value_enum,
        help_heading = "Storage"
    )]
    pub durability: Option<Durability>,
    /// Markers retained in the log [default: 1000000].
    #[arg(
        long,
        env = "CTXBROKER_MARKER_RETENTION",
        value_name = "N",
        help_heading = "Storage"
    )]
    pub marker_retention: Option<u64>,
    /// Bytes of idle sessions kept in memory; the least recently used
    /// beyond it are reloaded from the store when next used
    /// [default: 67108864].
    #[arg(
        long,
        env = "CTXBROKER_SESSION_CACHE_BYTES",
        value_name = "BYTES",
        help_heading = "Storage"
    )]
    pub session_cache_bytes: Option<u64>,
    /// Largest request message in bytes [default: 16777216].
    #[arg(
        long,
        env = "CTXBROKER_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        help_heading = "Limits"
    )]
    pub max_request_bytes: Option<usize>,
    /// Most spans in one turn [default: 256].
    #[arg(
        long,
        env = "CTXBROKER_MAX_SPANS_PER_TURN",
        value_name = "N",
        help_heading = "Limits"
    )]
    pub max_spans_per_turn: Option<usize>,
    /// Largest span text in bytes [default: 4194304].
    #[arg(
        long,
        env = "CTXBROKER_MAX_SPAN_BYTES",
        value_name = "BYTES",
        help_heading = "Limits"
    )]
    pub max_span_bytes: Option<usize>,
    /// Most sessions held [default: 100000].
    #[arg(
        long,
        env = "CTXBROKER_MAX_SESSIONS",
        value_name = "N",
        help_heading = "Limits"
    )]
    pub max_sessions: Option<u64>,
    /// Largest window_tokens a session may declare [default: 10000000].
    #[arg(
        long,
        env = "CTXBROKER_MAX_WINDOW_TOKENS",
        value_name = "TOKENS",
        help_heading = "Limits"
    )]
    pub max_window_tokens: Option<u32>,
    /// Most concurrent streams, server-wide [default: 10000].
    #[arg(
        long,
        env = "CTXBROKER_MAX_CONCURRENT_STREAMS",
        value_name = "N",
        help_heading = "Limits"
    )]
    pub max_concurrent_streams: Option<usize>,
    /// The log format [default: text].
    #[arg(
        long,
        env = "CTXBROKER_LOG_FORMAT",
        value_enum,
        help_heading = "Logging"
    )]
    pub log_format: Option<LogFormat>,
    /// The log filter, e.g. `info` or `ctxbroker_server=debug,info`
    /// [default: info].
    #[arg(
        long = "log",
        env = "CTXBROKER_LOG",
        value_name = "FILTER",
        help_heading = "Logging"
    )]
    pub log_filter: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g.
    /// `127.0.0.1:9464` (port 0 picks one; the log says which)
    /// [default: off].
    #[arg(
        long,
        env = "CTXBROKER_METRICS_ADDR",
        value_name = "ADDR",
        help_heading = "Metrics"
    )]
    pub metrics_addr: Option<SocketAddr>,
    /// How many sessions, those with the most live tokens, the metrics
    /// name; 0 names none, at most 100 [default: 10].
    #[arg(
        long,
        env = "CTXBROKER_METRICS_TOP_SESSIONS",
        value_name = "N",
        help_heading = "Metrics"
    )]
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

/// The TOML file: the same settings as the flags, every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    listen: Option<SocketAddr>,
    listen_fd: Option<i32>,
    data_dir: Option<PathBuf>,
    durability: Option<Durability>,
    log_format: Option<LogFormat>,
    /// `log`, as the flag; `log_filter` is read too.
    #[serde(rename = "log", alias = "log_filter")]
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
    session_cache_bytes: Option<u64>,
    metrics_addr: Option<SocketAddr>,
    metrics_top_sessions: Option<usize>,
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
    /// The TOML file is not TOML.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line and column.
        message: String,
    },
    /// Keys of the TOML file are unknown or hold values of the wrong type.
    #[error("invalid config file {path}: {}", KeyProblems(problems))]
    Keys {
        /// The file.
        path: PathBuf,
        /// Every bad key, in key order.
        problems: Vec<KeyProblem>,
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

        let listen = match (
            self.listen_fd.or(file.listen_fd),
            self.listen.or(file.listen),
        ) {
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
            session_cache_bytes: self
                .session_cache_bytes
                .or(file.session_cache_bytes)
                .unwrap_or(default_limits.session_cache_bytes),
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
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            metrics_top_sessions: self
                .metrics_top_sessions
                .or(file.metrics_top_sessions)
                .unwrap_or(defaults.metrics_top_sessions),
            limits,
        };
        settings.check()?;
        Ok(settings)
    }
}

impl Settings {
    /// Refuses values that would make the daemon unusable.
    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, message: &str| {
            let got = self
                .entries()
                .into_iter()
                .find(|setting| setting.key == key)
                .map(|setting| format!("; got {}", setting.shown()))
                .unwrap_or_default();
            Err(ConfigError::Invalid {
                key,
                message: format!("{message}{got}"),
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
        if self.metrics_top_sessions > crate::metrics::MAX_TOP_SESSIONS {
            return invalid(
                "metrics_top_sessions",
                &format!("must be at most {}", crate::metrics::MAX_TOP_SESSIONS),
            );
        }
        if let Listen::Fd(fd) = self.listen
            && fd < 0
        {
            return Err(ConfigError::Invalid {
                key: "listen_fd",
                message: format!("must be a non-negative file descriptor; got {fd}"),
            });
        }
        Ok(())
    }
}

/// One bad key of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    /// The key, as written in the file.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

struct KeyProblems<'a>(&'a [KeyProblem]);

impl std::fmt::Display for KeyProblems<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "key `{}`: {}", problem.key, problem.message)?;
        }
        Ok(())
    }
}

/// Reads the file, checking each key on its own so that every bad one is
/// named.
fn read_file(path: &Path) -> Result<FileSettings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        message: err.to_string().trim_end().to_owned(),
    })?;
    let known = file_keys();
    let problems: Vec<KeyProblem> = table
        .iter()
        .filter_map(|(key, value)| {
            let message = if known.contains(&key.as_str()) {
                let mut one = toml::Table::new();
                one.insert(key.clone(), value.clone());
                toml::Value::Table(one)
                    .try_into::<FileSettings>()
                    .err()?
                    .message()
                    .to_owned()
            } else {
                match nearest(key, known) {
                    Some(near) => format!("unknown key; did you mean `{near}`?"),
                    None => format!("unknown key; the keys are {}", known.join(", ")),
                }
            };
            Some(KeyProblem {
                key: key.clone(),
                message,
            })
        })
        .collect();
    if !problems.is_empty() {
        return Err(ConfigError::Keys {
            path: path.to_owned(),
            problems,
        });
    }
    toml::Value::Table(table)
        .try_into()
        .map_err(|err: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: err.message().to_owned(),
        })
}

/// The keys a config file may hold, as the file's deserializer knows them
/// (aliases included).
pub fn file_keys() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    /// A deserializer that only notes the field names it is asked for.
    struct Fields(&'static [&'static str]);

    impl<'de> de::Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only struct fields are noted"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(de::Error::custom("fields noted"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields = Fields(&[]);
    let _ = FileSettings::deserialize(&mut fields);
    fields.0
}

/// The known key closest to a misspelt one, within two edits.
fn nearest(key: &str, known: &[&'static str]) -> Option<&'static str> {
    known
        .iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row.first().copied().unwrap_or(0);
        if let Some(first) = row.first_mut() {
            *first = i + 1;
        }
        for (j, cb) in b.iter().enumerate() {
            let above = row.get(j + 1).copied().unwrap_or(usize::MAX);
            let left = row.get(j).copied().unwrap_or(usize::MAX);
            let next = (diagonal + usize::from(ca != *cb))
                .min(above.saturating_add(1))
                .min(left.saturating_add(1));
            diagonal = above;
            if let Some(cell) = row.get_mut(j + 1) {
                *cell = next;
            }
        }
    }
    row.last().copied().unwrap_or(0)
}

/// One effective setting, keyed as in the config file: what
/// `check-config` prints and the start-up log records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The file key (the flag's name with underscores).
    pub key: &'static str,
    /// The value in force.
    pub value: SettingValue,
    /// Never printed or logged: shown as `<redacted>`.
    pub secret: bool,
}

/// A setting's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingValue {
    /// A string (addresses, paths and names included).
    Text(String),
    /// A number.
    Number(u64),
    /// Not set: the feature is off or another key stands in for it.
    Unset,
}

impl Setting {
    fn text(key: &'static str, value: impl std::fmt::Display) -> Setting {
        Setting {
            key,
            value: SettingValue::Text(value.to_string()),
            secret: false,
        }
    }

    fn number(key: &'static str, value: impl TryInto<u64>) -> Setting {
        Setting {
            key,
            value: SettingValue::Number(value.try_into().unwrap_or(u64::MAX)),
            secret: false,
        }
    }

    fn unset(key: &'static str) -> Setting {
        Setting {
            key,
            value: SettingValue::Unset,
            secret: false,
        }
    }

    fn optional(key: &'static str, value: Option<impl std::fmt::Display>) -> Setting {
        value.map_or_else(|| Setting::unset(key), |value| Setting::text(key, value))
    }

    /// The same setting, never shown.
    pub fn secret(self) -> Setting {
        Setting {
            secret: true,
            ..self
        }
    }

    /// The value as logs and messages show it: strings quoted, `unset`,
    /// or `<redacted>` for a secret.
    pub fn shown(&self) -> String {
        match &self.value {
            _ if self.secret => "<redacted>".to_owned(),
            SettingValue::Text(text) => format!("{text:?}"),
            SettingValue::Number(n) => n.to_string(),
            SettingValue::Unset => "unset".to_owned(),
        }
    }
}

/// Settings as one log line: `key=value` pairs, strings quoted, unset
/// values `unset`, secrets `<redacted>`.
#[derive(Debug)]
pub struct LogLine<'a>(pub &'a [Setting]);

impl std::fmt::Display for LogLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, setting) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{}={}", setting.key, setting.shown())?;
        }
        Ok(())
    }
}

/// Settings as a TOML file the daemon reads back to the same settings;
/// unset values and secrets are comments.
pub fn to_toml(settings: &[Setting]) -> String {
    let mut out = String::new();
    for setting in settings {
        let key = setting.key;
        let line = match &setting.value {
            _ if setting.secret => format!("# {key} = <redacted>"),
            SettingValue::Text(text) => {
                format!("{key} = {}", toml::Value::String(text.clone()))
            }
            SettingValue::Number(n) => format!("{key} = {n}"),
            SettingValue::Unset => format!("# {key} is not set"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

impl Settings {
    /// Every setting in force, one per file key, in the order `--help`
    /// lists them.
    pub fn entries(&self) -> Vec<Setting> {
        let l = &self.limits;
        let (listen, listen_fd) = match &self.listen {
            Listen::Addr(addr) => (Setting::text("listen", addr), Setting::unset("listen_fd")),
            Listen::Fd(fd) => (Setting::unset("listen"), Setting::number("listen_fd", *fd)),
        };
        vec![
            listen,
            listen_fd,
            Setting::number("request_timeout_ms", self.request_timeout.as_millis()),
            Setting::number("shutdown_grace_ms", self.shutdown_grace.as_millis()),
            Setting::text("data_dir", self.data_dir.display()),
            Setting::text(
                "durability",
                match self.durability {
                    Durability::Flush => "flush",
                    Durability::Relaxed => "relaxed",
                },
            ),
            Setting::number("marker_retention", l.marker_retention),
            Setting::number("session_cache_bytes", l.session_cache_bytes),
            Setting::number("max_request_bytes", l.max_request_bytes),
            Setting::number("max_spans_per_turn", l.max_spans_per_turn),
            Setting::number("max_span_bytes", l.max_span_bytes),
            Setting::number("max_sessions", l.max_sessions),
            Setting::number("max_window_tokens", l.max_window_tokens),
            Setting::number("max_concurrent_streams", l.max_concurrent_streams),
            Setting::text(
                "log_format",
                match self.log_format {
                    LogFormat::Text => "text",
                    LogFormat::Json => "json",
                },
            ),
            Setting::text("log", &self.log_filter),
            Setting::optional("metrics_addr", self.metrics_addr),
            Setting::number("metrics_top_sessions", self.metrics_top_sessions),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

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
        let err = cli(&["--metrics-top-sessions", "101"])
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("metrics_top_sessions"), "{err}");
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctxbroker.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The rule that every flag has an environment twin named after it and
    /// a file key named after it, and every file key a flag, checked on
    /// the parser itself so that it cannot rot.
    #[test]
    fn every_flag_has_an_environment_twin_and_a_file_key() {
        use clap::CommandFactory;
        let keys: BTreeSet<&str> = file_keys().iter().copied().collect();
        let mut flags = BTreeSet::new();
        let command = Cli::command();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let long = arg
                .get_long()
                .unwrap_or_else(|| panic!("argument {id} has no --flag"));
            let key = long.replace('-', "_");
            let env = arg
                .get_env()
                .and_then(|env| env.to_str())
                .unwrap_or_else(|| panic!("--{long} has no environment twin"));
            assert_eq!(env, format!("CTXBROKER_{}", key.to_uppercase()), "--{long}");
            // The file cannot name another file.
            if key != "config" {
                assert!(
                    keys.contains(key.as_str()),
                    "--{long} has no file key {key}"
                );
                flags.insert(key);
            }
        }
        // Every file key is a flag (the one alias aside).
        let aliases = BTreeSet::from(["log_filter"]);
        let unflagged: Vec<_> = keys
            .iter()
            .filter(|key| !flags.contains(**key) && !aliases.contains(**key))
            .collect();
        assert!(
            unflagged.is_empty(),
            "file keys without a flag: {unflagged:?}"
        );
        // And every one is in the effective settings.
        let listed: BTreeSet<String> = Settings::default()
            .entries()
            .iter()
            .map(|s| s.key.to_owned())
            .collect();
        assert_eq!(listed, flags);
    }

    /// A sample that differs from the defaults in every setting.
    fn sample() -> Settings {
        let defaults = Limits::default();
        Settings {
            listen: Listen::Addr("10.1.2.3:7000".parse().unwrap()),
            data_dir: PathBuf::from("/srv/ctx \"quoted\" \\ dir"),
            durability: Durability::Relaxed,
            log_format: LogFormat::Json,
            log_filter: "ctxbroker_server=debug,warn".into(),
            shutdown_grace: Duration::from_millis(1234),
            request_timeout: Duration::from_millis(4321),
            metrics_addr: Some("127.0.0.1:9464".parse().unwrap()),
            metrics_top_sessions: 3,
            limits: Limits {
                max_request_bytes: 2 << 20,
                max_spans_per_turn: 17,
                max_span_bytes: 1 << 20,
                max_sessions: 99,
                max_session_id_bytes: defaults.max_session_id_bytes,
                max_window_tokens: 77_777,
                max_concurrent_streams: 55,
                max_watch_sessions: defaults.max_watch_sessions,
                marker_retention: 4444,
                session_cache_bytes: 5555,
            },
        }
    }

    #[test]
    fn every_setting_round_trips_through_the_file() {
        let sample = sample();
        let defaults = Settings::default().entries();
        for (got, default) in sample.entries().iter().zip(&defaults) {
            if got.key != "listen_fd" {
                assert_ne!(got, default, "the sample must change {}", got.key);
            }
        }
        let (_dir, path) = file(&to_toml(&sample.entries()));
        let read = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap();
        assert_eq!(read.entries(), sample.entries());

        let (_dir, path) = file("listen_fd = 3\n");
        let read = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap();
        assert_eq!(read.listen, Listen::Fd(3));
        let (_dir, path) = file(&to_toml(&read.entries()));
        let again = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap();
        assert_eq!(again.listen, Listen::Fd(3));
    }

    #[test]
    fn every_bad_key_is_named_with_what_is_wrong() {
        let (_dir, path) = file(
            "data_dri = \"/x\"\nmax_sessions = \"many\"\nlisten = \"not an address\"\nmax_spans_per_turn = 8\nzzzz = 1\n",
        );
        let err = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap_err();
        let ConfigError::Keys { problems, .. } = &err else {
            panic!("expected bad keys, got {err}");
        };
        let named: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            named,
            ["data_dri", "listen", "max_sessions", "zzzz"],
            "{err}"
        );
        assert!(
            problems[0].message.contains("did you mean `data_dir`"),
            "{err}"
        );
        assert!(problems[2].message.contains("invalid type"), "{err}");
        assert!(problems[3].message.contains("the keys are"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_toml_says_where() {
        let (_dir, path) = file("max_sessions = = 3\n");
        let err = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn the_old_log_filter_key_is_still_read() {
        let (_dir, path) = file("log_filter = \"debug\"\n");
        let read = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap();
        assert_eq!(read.log_filter, "debug");
    }

    #[test]
    fn secrets_are_redacted_in_the_log_line_and_the_file() {
        let settings = vec![
            Setting::text("listen", "127.0.0.1:1"),
            Setting::text("auth_token", "hunter2").secret(),
            Setting::number("max_sessions", 5u64).secret(),
            Setting::unset("metrics_addr"),
        ];
        let line = LogLine(&settings).to_string();
        assert_eq!(
            line,
            "listen=\"127.0.0.1:1\" auth_token=<redacted> max_sessions=<redacted> metrics_addr=unset"
        );
        let toml = to_toml(&settings);
        assert!(!toml.contains("hunter2") && !toml.contains('5'), "{toml}");
        assert!(toml.contains("# auth_token = <redacted>"), "{toml}");
        // Still a valid file.
        toml::from_str::<toml::Table>(&toml).unwrap();
    }

    #[test]
    fn check_config_is_a_command_beside_the_flags() {
        let parsed = cli(&["--max-sessions", "4", "check-config", "x.toml"]);
        assert_eq!(
            parsed.command,
            Some(Command::CheckConfig {
                file: PathBuf::from("x.toml")
            })
        );
        assert_eq!(parsed.max_sessions, Some(4));
        assert_eq!(cli(&[]).command, None);
    }
}
