//! The daemon's settings: flags, their `CTXBROKER_*` environment twins, an
//! optional TOML file under them, and defaults that make the bare binary
//! useful (`127.0.0.1:50051`, data in `./ctxbroker-data`).
//!
//! Precedence, highest first: flag, environment variable, file, default.
//! [`Settings`] declares every setting once, keyed as in the file; its
//! serde form is the file's format, the layer the flags merge over (see
//! [`load`]) and what `check-config` prints and the start-up log records.

mod flags;
mod load;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use figment::value::{Dict, Value};
use serde::{Deserialize, Serialize};

pub use flags::{Cli, Command, TokenCommand};
pub use load::{ConfigError, KeyProblem, file_keys};

/// The longest Unix socket path the kernel takes (`sun_path` less its
/// terminating NUL).
pub const MAX_UNIX_PATH_BYTES: usize = 107;

/// How the daemon gets its listening socket: the file keys `listen`,
/// `listen_unix` and `listen_fd`, a later one winning when more are set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ListenKeys", into = "ListenKeys")]
pub enum Listen {
    /// Bind this address.
    Addr(SocketAddr),
    /// Bind a Unix domain socket at this path (plaintext; the socket
    /// file's permissions, owner-only, decide who may connect).
    Unix(PathBuf),
    /// Serve on an already bound, listening TCP socket inherited as this
    /// file descriptor (socket activation; tests bind first and pass it).
    Fd(i32),
}

/// [`Listen`] as the file spells it.
#[derive(Serialize, Deserialize)]
#[serde(default)]
struct ListenKeys {
    listen: Option<SocketAddr>,
    listen_unix: Option<PathBuf>,
    listen_fd: Option<i32>,
}

impl Default for ListenKeys {
    fn default() -> Self {
        ListenKeys {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 50051))),
            listen_unix: None,
            listen_fd: None,
        }
    }
}

impl From<ListenKeys> for Listen {
    fn from(keys: ListenKeys) -> Self {
        match (keys.listen_fd, keys.listen_unix, keys.listen) {
            (Some(fd), _, _) => Listen::Fd(fd),
            (None, Some(path), _) => Listen::Unix(path),
            (None, None, Some(addr)) => Listen::Addr(addr),
            (None, None, None) => Listen::default(),
        }
    }
}

impl From<Listen> for ListenKeys {
    fn from(listen: Listen) -> Self {
        let none = ListenKeys {
            listen: None,
            listen_unix: None,
            listen_fd: None,
        };
        match listen {
            Listen::Addr(addr) => ListenKeys {
                listen: Some(addr),
                ..none
            },
            Listen::Unix(path) => ListenKeys {
                listen_unix: Some(path),
                ..none
            },
            Listen::Fd(fd) => ListenKeys {
                listen_fd: Some(fd),
                ..none
            },
        }
    }
}

impl Default for Listen {
    fn default() -> Self {
        ListenKeys::default().into()
    }
}

/// Whether an acknowledgement waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The limits the daemon enforces on requests and capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    #[serde(skip)]
    pub max_session_id_bytes: usize,
    /// Largest window a session may declare.
    pub max_window_tokens: u32,
    /// Most concurrent streams (watches and admit streams), server-wide.
    pub max_concurrent_streams: usize,
    /// Most session ids in one watch filter (fixed).
    #[serde(skip)]
    pub max_watch_sessions: usize,
    /// Markers retained in the log.
    pub marker_retention: u64,
    /// Bytes of idle sessions kept in memory between requests (an
    /// estimate of their spans' heap); beyond it the least recently used
    /// are dropped from memory and reloaded from the store when next used.
    /// Unless set, a quarter of `memory_budget_bytes` (see
    /// [`MemoryShares`]); never more than it.
    pub session_cache_bytes: u64,
    /// The memory the daemon is sized for, in bytes: the caches it can
    /// bound (idle sessions, the engine's page cache, search postings)
    /// take their shares of it, and the rest is left for what grows with
    /// the data and the load (see [`MemoryShares`]).
    pub memory_budget_bytes: u64,
}

/// TLS: the certificate files and the plaintext rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TlsSettings {
    /// The server's certificate chain (PEM); with `tls_key`, gRPC is
    /// served over TLS.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) one of which must have issued a client's
    /// certificate; unset, clients are not asked for one.
    pub tls_client_ca: Option<PathBuf>,
    /// Serve the metrics endpoint over TLS with the same files.
    pub metrics_tls: bool,
    /// Serve plaintext on an address that is not loopback.
    pub allow_insecure: bool,
}

impl TlsSettings {
    /// Whether gRPC is served over TLS.
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }
}

/// How long connections may take to start and stay silent, and how many
/// may be open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectionSettings {
    /// The time a new gRPC connection has to finish its TLS handshake and
    /// send the HTTP/2 preface.
    #[serde(rename = "handshake_timeout_ms", with = "millis")]
    pub handshake_timeout: Duration,
    /// Silence on a connection before the server sends an HTTP/2 ping.
    #[serde(rename = "http2_keepalive_interval_ms", with = "millis")]
    pub keepalive_interval: Duration,
    /// How long that ping may wait for its answer.
    #[serde(rename = "http2_keepalive_timeout_ms", with = "millis")]
    pub keepalive_timeout: Duration,
    /// Most gRPC connections open at once.
    pub max_connections: usize,
    /// Most metrics connections open at once.
    pub metrics_max_connections: usize,
    /// The time a metrics client has to finish its handshake and send its
    /// request head.
    #[serde(rename = "metrics_header_timeout_ms", with = "millis")]
    pub metrics_header_timeout: Duration,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            handshake_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connections: 4096,
            metrics_max_connections: 16,
            metrics_header_timeout: Duration::from_secs(5),
        }
    }
}

/// One tenant's quotas, as they are in force: each 0 is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantQuota {
    /// Most sessions the tenant holds.
    pub max_sessions: u64,
    /// Most text bytes the tenant's spans hold, live and archived (see
    /// `ctxbroker_store::text_bytes`).
    pub max_stored_bytes: u64,
    /// Admissions a second, refilling the tenant's token bucket; may be
    /// fractional.
    pub admits_per_second: f64,
    /// The bucket's size: admissions the tenant may make at once after a
    /// quiet spell. 0 is one second's worth (at least 1).
    pub admit_burst: u64,
    /// Most streams (AdmitStream, WatchCompactions) the tenant holds open.
    pub max_streams: u64,
}

/// Per-tenant quotas: the file's `[quota]` table, defaults for every
/// tenant, and `[quota.tenants.NAME]` tables overriding them for one
/// tenant. Every quota is unlimited (0) unless set: quotas matter only
/// once sessions belong to tenants, and a daemon upgraded in place must
/// keep serving what it served. Sessions without a tenant (bare ids) have
/// no quota. File only: a table of tenants has no flag form.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaSettings {
    /// Most sessions a tenant holds; 0 is unlimited.
    pub max_sessions: u64,
    /// Most text bytes a tenant's spans hold; 0 is unlimited.
    pub max_stored_bytes: u64,
    /// A tenant's admissions a second (token bucket rate; may be
    /// fractional); 0 is unlimited.
    pub admits_per_second: f64,
    /// A tenant's token bucket size; 0 is one second's worth (at least 1).
    pub admit_burst: u64,
    /// Most streams a tenant holds open; 0 is unlimited.
    pub max_streams: u64,
    /// Overrides by tenant name.
    pub tenants: BTreeMap<String, QuotaOverride>,
}

/// One tenant's overrides of the `[quota]` defaults: the keys it sets win.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaOverride {
    /// See [`QuotaSettings::max_sessions`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u64>,
    /// See [`QuotaSettings::max_stored_bytes`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_stored_bytes: Option<u64>,
    /// See [`QuotaSettings::admits_per_second`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admits_per_second: Option<f64>,
    /// See [`QuotaSettings::admit_burst`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admit_burst: Option<u64>,
    /// See [`QuotaSettings::max_streams`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<u64>,
}

impl QuotaSettings {
    /// The quotas of a tenant with no override.
    pub fn defaults(&self) -> TenantQuota {
        TenantQuota {
            max_sessions: self.max_sessions,
            max_stored_bytes: self.max_stored_bytes,
            admits_per_second: self.admits_per_second,
            admit_burst: self.admit_burst,
            max_streams: self.max_streams,
        }
    }

    /// The quotas in force for `tenant`: its overrides over the defaults.
    pub fn for_tenant(&self, tenant: &str) -> TenantQuota {
        let base = self.defaults();
        let Some(o) = self.tenants.get(tenant) else {
            return base;
        };
        TenantQuota {
            max_sessions: o.max_sessions.unwrap_or(base.max_sessions),
            max_stored_bytes: o.max_stored_bytes.unwrap_or(base.max_stored_bytes),
            admits_per_second: o.admits_per_second.unwrap_or(base.admits_per_second),
            admit_burst: o.admit_burst.unwrap_or(base.admit_burst),
            max_streams: o.max_streams.unwrap_or(base.max_streams),
        }
    }

    /// Refuses a rate that is not a finite number ≥ 0 and a tenant name
    /// that is not one.
    fn check(&self) -> Result<(), ConfigError> {
        let rate = |key: &'static str, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(())
            } else {
                Err(ConfigError::Invalid {
                    key,
                    message: format!("must be a finite number of at least 0; got {value}"),
                })
            }
        };
        rate("quota.admits_per_second", self.admits_per_second)?;
        for (name, o) in &self.tenants {
            if let Err(bad) = crate::tenant::check_tenant("quota.tenants", name) {
                return Err(ConfigError::Invalid {
                    key: "quota.tenants",
                    message: format!("{name:?}: {}", bad.description),
                });
            }
            if let Some(value) = o.admits_per_second {
                rate("quota.tenants.*.admits_per_second", value).map_err(|err| match err {
                    ConfigError::Invalid { key, message } => ConfigError::Invalid {
                        key,
                        message: format!("tenant {name:?}: {message}"),
                    },
                    other => other,
                })?;
            }
        }
        Ok(())
    }
}

/// The smallest `memory_budget_bytes`: below it, what the daemon needs
/// whatever its settings (the runtime, the tokenizer's tables) leaves
/// its caches nothing.
pub const MIN_MEMORY_BUDGET_BYTES: u64 = 64 << 20;

/// The default of `memory_budget_bytes`: the resident-memory target (see
/// docs/benchmarks.md) for a daemon holding 10,000 sessions of 1,000
/// spans.
pub const DEFAULT_MEMORY_BUDGET_BYTES: u64 = 256 << 20;

/// How `memory_budget_bytes` is shared among the caches the daemon can
/// bound. Half of the budget is left for what no setting bounds: the
/// tokenizer's tables, the engine's page table (which grows with the pages
/// stored), sessions being served, buffers in flight and the allocator's
/// slack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryShares {
    /// Idle sessions kept in memory: a quarter.
    pub sessions: u64,
    /// The engine's page cache: a sixteenth. The engine takes up to about
    /// twice its setting (see `StoreOptions::cache_capacity_bytes`), so an
    /// eighth in all.
    pub page_cache: u64,
    /// The search postings of recently searched sessions: a sixteenth.
    pub search: u64,
}

impl MemoryShares {
    /// The shares of `budget`.
    pub const fn of(budget: u64) -> Self {
        MemoryShares {
            sessions: budget / 4,
            page_cache: budget / 16,
            search: budget / 16,
        }
    }
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
            session_cache_bytes: MemoryShares::of(DEFAULT_MEMORY_BUDGET_BYTES).sessions,
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET_BYTES,
        }
    }
}

/// The daemon's resolved settings, each field (or flattened field) a file
/// key; what a file does not say is the default.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Where to serve gRPC (`listen`, `listen_fd`).
    #[serde(flatten)]
    pub listen: Listen,
    /// The sled data directory.
    pub data_dir: PathBuf,
    /// Whether acknowledgements wait for a flush.
    pub durability: Durability,
    /// The log format.
    pub log_format: LogFormat,
    /// The log filter, in `tracing_subscriber::EnvFilter` syntax.
    #[serde(rename = "log")]
    pub log_filter: String,
    /// How long shutdown waits for in-flight requests and streams.
    #[serde(rename = "shutdown_grace_ms", with = "millis")]
    pub shutdown_grace: Duration,
    /// Per-request timeout for unary calls.
    #[serde(rename = "request_timeout_ms", with = "millis")]
    pub request_timeout: Duration,
    /// Where to serve Prometheus metrics (`GET /metrics`); `None` serves
    /// none.
    pub metrics_addr: Option<SocketAddr>,
    /// Sessions named in the per-session live-token metrics (the ones with
    /// the most live tokens); 0 names none.
    pub metrics_top_sessions: usize,
    /// Whether the metrics address also serves the context inspector
    /// (`/inspect`): read-only pages and their JSON twins, behind the
    /// token file's authentication and tenant rules.
    pub inspector: bool,
    /// The limits.
    #[serde(flatten)]
    pub limits: Limits,
    /// TLS and the plaintext rule.
    #[serde(flatten)]
    pub tls: TlsSettings,
    /// Connection timeouts and caps.
    #[serde(flatten)]
    pub connections: ConnectionSettings,
    /// Per-tenant quotas (the `[quota]` table).
    pub quota: QuotaSettings,
    /// The token file (see [`crate::auth`]): set, every call to the broker
    /// service needs a bearer token it lists, and the token's role decides
    /// what it may call; unset, authentication is off and every caller is
    /// an operator.
    pub auth_tokens_file: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: Listen::default(),
            data_dir: PathBuf::from("./ctxbroker-data"),
            durability: Durability::Flush,
            log_format: LogFormat::Text,
            log_filter: "info".to_owned(),
            shutdown_grace: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            metrics_addr: None,
            metrics_top_sessions: crate::metrics::DEFAULT_TOP_SESSIONS,
            inspector: false,
            limits: Limits::default(),
            tls: TlsSettings::default(),
            connections: ConnectionSettings::default(),
            quota: QuotaSettings::default(),
            auth_tokens_file: None,
        }
    }
}

/// A duration as a whole number of milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

impl Settings {
    /// Refuses values that would make the daemon unusable, naming the
    /// setting, the limit and the value.
    fn check(&self) -> Result<(), ConfigError> {
        let fail = |key: &'static str, limit: &str, got: &dyn std::fmt::Display| {
            let message = format!("{limit}; got {got}");
            Err(ConfigError::Invalid { key, message })
        };
        let l = &self.limits;
        if l.max_request_bytes < 1024 {
            return fail(
                "max_request_bytes",
                "must be at least 1024",
                &l.max_request_bytes,
            );
        }
        if l.max_span_bytes == 0 || l.max_span_bytes > l.max_request_bytes {
            let limit = "must be between 1 and max_request_bytes";
            return fail("max_span_bytes", limit, &l.max_span_bytes);
        }
        for (key, value) in [
            ("max_spans_per_turn", l.max_spans_per_turn as u64),
            ("max_sessions", l.max_sessions),
            ("max_window_tokens", u64::from(l.max_window_tokens)),
            ("max_concurrent_streams", l.max_concurrent_streams as u64),
            ("marker_retention", l.marker_retention),
            (
                "request_timeout_ms",
                self.request_timeout.as_millis() as u64,
            ),
            (
                "handshake_timeout_ms",
                self.connections.handshake_timeout.as_millis() as u64,
            ),
            (
                "http2_keepalive_interval_ms",
                self.connections.keepalive_interval.as_millis() as u64,
            ),
            (
                "http2_keepalive_timeout_ms",
                self.connections.keepalive_timeout.as_millis() as u64,
            ),
            (
                "metrics_header_timeout_ms",
                self.connections.metrics_header_timeout.as_millis() as u64,
            ),
            ("max_connections", self.connections.max_connections as u64),
            (
                "metrics_max_connections",
                self.connections.metrics_max_connections as u64,
            ),
        ] {
            if value == 0 {
                return fail(key, "must be at least 1", &0);
            }
        }
        if l.memory_budget_bytes < MIN_MEMORY_BUDGET_BYTES {
            let limit = format!("must be at least {MIN_MEMORY_BUDGET_BYTES} (64 MiB)");
            return fail("memory_budget_bytes", &limit, &l.memory_budget_bytes);
        }
        if l.session_cache_bytes > l.memory_budget_bytes {
            let limit = format!(
                "must be at most memory_budget_bytes ({})",
                l.memory_budget_bytes
            );
            return fail("session_cache_bytes", &limit, &l.session_cache_bytes);
        }
        let top = crate::metrics::MAX_TOP_SESSIONS;
        if self.metrics_top_sessions > top {
            let limit = format!("must be at most {top}");
            return fail("metrics_top_sessions", &limit, &self.metrics_top_sessions);
        }
        if self.inspector && self.metrics_addr.is_none() {
            let limit = "needs metrics_addr: the inspector is served beside /metrics";
            return fail("inspector", limit, &true);
        }
        let tls = &self.tls;
        let unset = |path: &Option<PathBuf>| path.is_none();
        if unset(&tls.tls_cert) && !unset(&tls.tls_key) {
            return fail("tls_cert", "must be set with tls_key", &"nothing");
        }
        if !unset(&tls.tls_cert) && unset(&tls.tls_key) {
            return fail("tls_key", "must be set with tls_cert", &"nothing");
        }
        if !tls.enabled() && !unset(&tls.tls_client_ca) {
            let limit = "needs tls_cert and tls_key (client certificates are asked for over TLS)";
            return fail("tls_client_ca", limit, &"no tls_cert");
        }
        if !tls.enabled() && tls.metrics_tls {
            return fail("metrics_tls", "needs tls_cert and tls_key", &true);
        }
        if let Listen::Fd(fd) = self.listen
            && fd < 0
        {
            return fail("listen_fd", "must be a non-negative file descriptor", &fd);
        }
        if let Listen::Unix(path) = &self.listen {
            let shown = path.display();
            if path.as_os_str().is_empty() {
                return fail("listen_unix", "must be a path", &shown);
            }
            if path.as_os_str().len() > MAX_UNIX_PATH_BYTES {
                let limit = format!("must be at most {MAX_UNIX_PATH_BYTES} bytes (sockaddr_un)");
                return fail("listen_unix", &limit, &shown);
            }
            if tls.enabled() {
                let limit = "serves plaintext: TLS (tls_cert, tls_key) is for TCP listeners; \
                             the socket file's permissions decide who may connect";
                return fail("listen_unix", limit, &shown);
            }
        }
        self.quota.check()
    }

    /// Every setting keyed as in the file, in key order; an unset one
    /// (no metrics address, or the `listen`/`listen_fd` not in force) is
    /// empty.
    fn values(&self) -> Dict {
        match Value::serialize(self) {
            Ok(Value::Dict(_, values)) => values,
            _ => Dict::new(),
        }
    }

    /// The settings as one log line: `key=value` pairs, strings quoted,
    /// unset values `unset`.
    pub fn log_line(&self) -> String {
        let shown = |value: &Value| match value {
            Value::String(_, text) => format!("{text:?}"),
            Value::Empty(..) => "unset".to_owned(),
            other => toml_value(other),
        };
        let pairs: Vec<String> = self
            .values()
            .iter()
            .map(|(key, value)| format!("{key}={}", shown(value)))
            .collect();
        pairs.join(" ")
    }

    /// The settings as a TOML file the daemon reads back to the same
    /// settings; unset ones are comments.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        for (key, value) in self.values() {
            let line = match value {
                Value::Empty(..) => format!("# {key} is not set\n"),
                value => format!("{key} = {}\n", toml_value(&value)),
            };
            out.push_str(&line);
        }
        out
    }
}

/// A value as TOML writes it.
fn toml_value(value: &Value) -> String {
    toml::Value::try_from(value).map_or_else(|err| format!("{err}"), |value| value.to_string())
}

#[cfg(test)]
mod tests;
