//! The configuration surface operators rely on, pinned: every TOML key,
//! every `CTXBROKER_*` variable and every flag, with the precedence flag >
//! environment > file > default, resolved to the settings the daemon runs
//! with.
//!
//! One test in its own process: it sets environment variables.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ctxbroker_server::config::{
    ConnectionSettings, Durability, Limits, Listen, LogFormat, TlsSettings,
};
use ctxbroker_server::{Cli, Settings};

/// Every variable the flags read, and the value this test gives it.
const ENV: &[(&str, &str)] = &[
    ("CTXBROKER_LISTEN", "127.0.0.2:7001"),
    ("CTXBROKER_REQUEST_TIMEOUT_MS", "2001"),
    ("CTXBROKER_SHUTDOWN_GRACE_MS", "2002"),
    ("CTXBROKER_DATA_DIR", "/env/data"),
    ("CTXBROKER_DURABILITY", "flush"),
    ("CTXBROKER_MARKER_RETENTION", "2003"),
    ("CTXBROKER_SESSION_CACHE_BYTES", "2004"),
    ("CTXBROKER_MAX_REQUEST_BYTES", "2005000"),
    ("CTXBROKER_MAX_SPANS_PER_TURN", "2006"),
    ("CTXBROKER_MAX_SPAN_BYTES", "2007"),
    ("CTXBROKER_MAX_SESSIONS", "2008"),
    ("CTXBROKER_MAX_WINDOW_TOKENS", "2009"),
    ("CTXBROKER_MAX_CONCURRENT_STREAMS", "2010"),
    ("CTXBROKER_MEMORY_BUDGET_BYTES", "2108686336"),
    ("CTXBROKER_LOG_FORMAT", "text"),
    ("CTXBROKER_LOG", "env=debug"),
    ("CTXBROKER_METRICS_ADDR", "127.0.0.2:9002"),
    ("CTXBROKER_METRICS_TOP_SESSIONS", "2"),
    ("CTXBROKER_HANDSHAKE_TIMEOUT_MS", "2012"),
    ("CTXBROKER_HTTP2_KEEPALIVE_INTERVAL_MS", "2013"),
    ("CTXBROKER_HTTP2_KEEPALIVE_TIMEOUT_MS", "2014"),
    ("CTXBROKER_MAX_CONNECTIONS", "2015"),
    ("CTXBROKER_METRICS_MAX_CONNECTIONS", "2016"),
    ("CTXBROKER_METRICS_HEADER_TIMEOUT_MS", "2017"),
    ("CTXBROKER_TLS_CERT", "/env/cert.pem"),
    ("CTXBROKER_TLS_KEY", "/env/key.pem"),
    ("CTXBROKER_TLS_CLIENT_CA", "/env/ca.pem"),
    ("CTXBROKER_METRICS_TLS", "false"),
    ("CTXBROKER_ALLOW_INSECURE", "false"),
    ("CTXBROKER_AUTH_TOKENS_FILE", "/env/tokens.toml"),
];

/// A file with every key (`log` spelt as the flag; `listen_fd` and the
/// old `log_filter` are in [`FILE_FD`]).
const FILE: &str = r#"
listen = "127.0.0.1:6001"
request_timeout_ms = 1001
shutdown_grace_ms = 1002
data_dir = "/file/data"
durability = "relaxed"
marker_retention = 1003
session_cache_bytes = 1004
max_request_bytes = 1005000
max_spans_per_turn = 1006
max_span_bytes = 1007
max_sessions = 1008
max_window_tokens = 1009
max_concurrent_streams = 1010
memory_budget_bytes = 1060110336
log_format = "json"
log = "file=debug"
metrics_addr = "127.0.0.1:9001"
metrics_top_sessions = 1
handshake_timeout_ms = 1012
http2_keepalive_interval_ms = 1013
http2_keepalive_timeout_ms = 1014
max_connections = 1015
metrics_max_connections = 1016
metrics_header_timeout_ms = 1017
tls_cert = "/file/cert.pem"
tls_key = "/file/key.pem"
tls_client_ca = "/file/ca.pem"
metrics_tls = true
allow_insecure = true
auth_tokens_file = "/file/tokens.toml"
"#;

/// The keys [`FILE`] leaves out: an inherited socket wins over `listen`.
const FILE_FD: &str = "listen = \"127.0.0.1:6001\"\nlisten_fd = 5\nlog_filter = \"old=trace\"\n";

fn clear_env() {
    for (key, _) in std::env::vars() {
        if key.starts_with("CTXBROKER_") {
            // SAFETY: this test is the only thread of its process that
            // reads or writes the environment.
            unsafe { std::env::remove_var(key) };
        }
    }
}

fn set_env(key: &str, value: &str) {
    // SAFETY: as in `clear_env`.
    unsafe { std::env::set_var(key, value) };
}

fn resolve(args: &[&str]) -> Settings {
    let mut all = vec!["ctxbrokerd"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all)
        .unwrap()
        .resolve()
        .unwrap_or_else(|err| panic!("{args:?}: {err}"))
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The settings a source gives when it sets every setting to `base + n`
/// (`n` the setting's place in [`ENV`]), as [`FILE`] and [`ENV`] do.
fn expected(base: u64, listen: &str, data_dir: &str, log: &str, metrics: &str) -> Settings {
    let defaults = Limits::default();
    Settings {
        listen: Listen::Addr(addr(listen)),
        data_dir: PathBuf::from(data_dir),
        durability: Durability::Relaxed,
        log_format: LogFormat::Json,
        log_filter: log.to_owned(),
        shutdown_grace: Duration::from_millis(base + 2),
        request_timeout: Duration::from_millis(base + 1),
        metrics_addr: Some(addr(metrics)),
        metrics_top_sessions: usize::try_from(base / 1000).unwrap(),
        inspector: false,
        limits: Limits {
            max_request_bytes: usize::try_from(base * 1000 + 5000).unwrap(),
            max_spans_per_turn: usize::try_from(base + 6).unwrap(),
            max_span_bytes: usize::try_from(base + 7).unwrap(),
            max_sessions: base + 8,
            max_session_id_bytes: defaults.max_session_id_bytes,
            max_window_tokens: u32::try_from(base + 9).unwrap(),
            max_concurrent_streams: usize::try_from(base + 10).unwrap(),
            max_watch_sessions: defaults.max_watch_sessions,
            marker_retention: base + 3,
            session_cache_bytes: base + 4,
            // (base + 11) MiB: the budget has a floor of 64 MiB.
            memory_budget_bytes: (base + 11) << 20,
        },
        connections: ConnectionSettings {
            handshake_timeout: Duration::from_millis(base + 12),
            keepalive_interval: Duration::from_millis(base + 13),
            keepalive_timeout: Duration::from_millis(base + 14),
            max_connections: usize::try_from(base + 15).unwrap(),
            metrics_max_connections: usize::try_from(base + 16).unwrap(),
            metrics_header_timeout: Duration::from_millis(base + 17),
        },
        tls: {
            // The environment turns the switches off; the file and the
            // flags turn them on.
            let source = data_dir.trim_end_matches("/data");
            TlsSettings {
                tls_cert: Some(PathBuf::from(format!("{source}/cert.pem"))),
                tls_key: Some(PathBuf::from(format!("{source}/key.pem"))),
                tls_client_ca: Some(PathBuf::from(format!("{source}/ca.pem"))),
                metrics_tls: base != 2000,
                allow_insecure: base != 2000,
            }
        },
        quota: Default::default(),
        auth_tokens_file: Some(PathBuf::from(format!(
            "{}/tokens.toml",
            data_dir.trim_end_matches("/data")
        ))),
    }
}

/// `Settings` has no `PartialEq`: compare the fields one by one, named.
fn assert_settings(got: &Settings, want: &Settings, case: &str) {
    assert_eq!(got.listen, want.listen, "{case}: listen");
    assert_eq!(got.data_dir, want.data_dir, "{case}: data_dir");
    assert_eq!(got.durability, want.durability, "{case}: durability");
    assert_eq!(got.log_format, want.log_format, "{case}: log_format");
    assert_eq!(got.log_filter, want.log_filter, "{case}: log");
    assert_eq!(got.shutdown_grace, want.shutdown_grace, "{case}: grace");
    assert_eq!(got.request_timeout, want.request_timeout, "{case}: timeout");
    assert_eq!(got.metrics_addr, want.metrics_addr, "{case}: metrics_addr");
    assert_eq!(
        got.metrics_top_sessions, want.metrics_top_sessions,
        "{case}: metrics_top_sessions"
    );
    assert_eq!(got.limits, want.limits, "{case}: limits");
    assert_eq!(got.connections, want.connections, "{case}: connections");
    assert_eq!(got.tls, want.tls, "{case}: tls");
    assert_eq!(
        got.auth_tokens_file, want.auth_tokens_file,
        "{case}: auth_tokens_file"
    );
}

#[test]
fn every_key_variable_and_flag_resolves_with_flag_over_env_over_file_over_default() {
    clear_env();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("all.toml");
    std::fs::write(&file, FILE).unwrap();
    let file_fd = dir.path().join("fd.toml");
    std::fs::write(&file_fd, FILE_FD).unwrap();
    let file = file.to_str().unwrap();
    let file_fd = file_fd.to_str().unwrap();

    // Defaults.
    let defaults = Settings::default();
    assert_settings(&resolve(&[]), &defaults, "defaults");
    assert_eq!(defaults.listen, Listen::Addr(addr("127.0.0.1:50051")));
    assert_eq!(defaults.data_dir, PathBuf::from("./ctxbroker-data"));
    assert_eq!(defaults.durability, Durability::Flush);
    assert_eq!(defaults.log_format, LogFormat::Text);
    assert_eq!(defaults.log_filter, "info");
    assert_eq!(defaults.shutdown_grace, Duration::from_secs(10));
    assert_eq!(defaults.request_timeout, Duration::from_secs(30));
    assert_eq!(defaults.metrics_addr, None);
    assert_eq!(defaults.metrics_top_sessions, 10);
    assert_eq!(defaults.auth_tokens_file, None);
    assert_eq!(
        defaults.limits,
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
            session_cache_bytes: 64 << 20,
            memory_budget_bytes: 256 << 20,
        }
    );

    // The file, every key, over the defaults.
    let from_file = expected(
        1000,
        "127.0.0.1:6001",
        "/file/data",
        "file=debug",
        "127.0.0.1:9001",
    );
    assert_settings(&resolve(&["--config", file]), &from_file, "file");
    // `listen_fd` over `listen`; the old `log_filter` key.
    let fd = resolve(&["--config", file_fd]);
    assert_eq!(fd.listen, Listen::Fd(5));
    assert_eq!(fd.log_filter, "old=trace");
    assert_eq!(fd.data_dir, defaults.data_dir);

    // Every variable over the file, named by CTXBROKER_CONFIG.
    set_env("CTXBROKER_CONFIG", file);
    for (key, value) in ENV {
        set_env(key, value);
    }
    let mut from_env = expected(
        2000,
        "127.0.0.2:7001",
        "/env/data",
        "env=debug",
        "127.0.0.2:9002",
    );
    from_env.durability = Durability::Flush;
    from_env.log_format = LogFormat::Text;
    assert_settings(&resolve(&[]), &from_env, "environment");
    set_env("CTXBROKER_LISTEN_FD", "6");
    assert_eq!(resolve(&[]).listen, Listen::Fd(6));
    // The variables over the old key too.
    set_env("CTXBROKER_CONFIG", file_fd);
    assert_eq!(resolve(&[]).log_filter, "env=debug");
    set_env("CTXBROKER_CONFIG", file);

    // Every flag over the variables.
    let flags = [
        "--listen",
        "127.0.0.3:8001",
        "--request-timeout-ms",
        "3001",
        "--shutdown-grace-ms",
        "3002",
        "--data-dir",
        "/flag/data",
        "--durability",
        "relaxed",
        "--marker-retention",
        "3003",
        "--session-cache-bytes",
        "3004",
        "--max-request-bytes",
        "3005000",
        "--max-spans-per-turn",
        "3006",
        "--max-span-bytes",
        "3007",
        "--max-sessions",
        "3008",
        "--max-window-tokens",
        "3009",
        "--max-concurrent-streams",
        "3010",
        "--memory-budget-bytes",
        "3157262336",
        "--log-format",
        "json",
        "--log",
        "flag=debug",
        "--metrics-addr",
        "127.0.0.3:9003",
        "--metrics-top-sessions",
        "3",
        "--handshake-timeout-ms",
        "3012",
        "--http2-keepalive-interval-ms",
        "3013",
        "--http2-keepalive-timeout-ms",
        "3014",
        "--max-connections",
        "3015",
        "--metrics-max-connections",
        "3016",
        "--metrics-header-timeout-ms",
        "3017",
        "--tls-cert",
        "/flag/cert.pem",
        "--tls-key",
        "/flag/key.pem",
        "--tls-client-ca",
        "/flag/ca.pem",
        "--metrics-tls",
        "--allow-insecure=true",
        "--auth-tokens-file",
        "/flag/tokens.toml",
    ];
    let mut with_fd = flags.to_vec();
    with_fd.extend(["--listen-fd", "7"]);
    let from_flags = expected(
        3000,
        "127.0.0.3:8001",
        "/flag/data",
        "flag=debug",
        "127.0.0.3:9003",
    );
    let mut want = from_flags.clone();
    want.listen = Listen::Fd(7);
    assert_settings(&resolve(&with_fd), &want, "flags");
    // An inherited socket from the environment still beats --listen.
    assert_eq!(resolve(&flags).listen, Listen::Fd(6));
    // With none inherited, --listen is the address.
    clear_env();
    assert_settings(&resolve(&flags), &from_flags, "flags alone");

    // A flag over the file key by key, the file over the defaults.
    let some = resolve(&[
        "--config",
        file,
        "--max-sessions",
        "9",
        "--log-format",
        "text",
    ]);
    assert_eq!(some.limits.max_sessions, 9);
    assert_eq!(some.log_format, LogFormat::Text);
    assert_eq!(some.limits.max_spans_per_turn, 1006);
    assert_eq!(some.data_dir, PathBuf::from("/file/data"));
}
