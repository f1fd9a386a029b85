use std::collections::BTreeSet;

use clap::Parser;

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
    let (_dir, path) =
        file("data_dir = \"/srv/ctx\"\nmax_sessions = 7\nlisten = \"127.0.0.1:6000\"\n");
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
    let (_dir, path) = file("data_dri = \"/x\"\n");
    let err = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap_err();
    assert!(err.to_string().contains("data_dri"), "{err}");
}

#[test]
fn nonsense_limits_are_refused_by_name_and_limit() {
    for (args, expected) in [
        (
            &["--max-spans-per-turn", "0"][..],
            "invalid setting max_spans_per_turn: must be at least 1; got 0",
        ),
        (
            &["--metrics-top-sessions", "101"],
            "invalid setting metrics_top_sessions: must be at most 100; got 101",
        ),
        (
            &["--inspector"],
            "invalid setting inspector: needs metrics_addr: the inspector is served beside /metrics; got true",
        ),
        (
            &["--max-request-bytes", "1000"],
            "invalid setting max_request_bytes: must be at least 1024; got 1000",
        ),
        (
            &["--max-span-bytes", "2000", "--max-request-bytes", "1024"],
            "invalid setting max_span_bytes: must be between 1 and max_request_bytes; got 2000",
        ),
        (
            &["--request-timeout-ms", "0"],
            "invalid setting request_timeout_ms: must be at least 1; got 0",
        ),
    ] {
        let err = cli(args).resolve().unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    let (_dir, path) = file("listen_fd = -1\n");
    let err = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid setting listen_fd: must be a non-negative file descriptor; got -1"
    );
}

#[test]
fn a_memory_budget_out_of_range_is_refused_by_name_and_limit() {
    for (args, expected) in [
        (
            &["--memory-budget-bytes", "1000"][..],
            "invalid setting memory_budget_bytes: must be at least 67108864 (64 MiB); got 1000",
        ),
        (
            &["--memory-budget-bytes", "0"],
            "invalid setting memory_budget_bytes: must be at least 67108864 (64 MiB); got 0",
        ),
        (
            &[
                "--memory-budget-bytes",
                "100000000",
                "--session-cache-bytes",
                "100000001",
            ],
            "invalid setting session_cache_bytes: must be at most memory_budget_bytes (100000000); got 100000001",
        ),
    ] {
        let err = cli(args).resolve().unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    let (_dir, path) = file("memory_budget_bytes = 268435456\nsession_cache_bytes = 268435457\n");
    let err = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap_err();
    assert!(err.to_string().contains("session_cache_bytes"), "{err}");
}

#[test]
fn the_session_cache_is_a_quarter_of_the_memory_budget_unless_set() {
    let defaults = cli(&[]).resolve().unwrap().limits;
    assert_eq!(defaults.memory_budget_bytes, 256 << 20);
    assert_eq!(defaults.session_cache_bytes, 64 << 20);
    assert_eq!(defaults, Limits::default());

    let derived = cli(&["--memory-budget-bytes", "134217728"])
        .resolve()
        .unwrap()
        .limits;
    assert_eq!(derived.session_cache_bytes, 32 << 20);
    let (_dir, path) = file("memory_budget_bytes = 1073741824\n");
    let derived = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap()
        .limits;
    assert_eq!(derived.session_cache_bytes, 256 << 20);

    // Set in any layer, the session cache is as set, even 0.
    let set = cli(&[
        "--memory-budget-bytes",
        "134217728",
        "--session-cache-bytes",
        "0",
    ])
    .resolve()
    .unwrap()
    .limits;
    assert_eq!(set.session_cache_bytes, 0);
    let (_dir, path) = file("session_cache_bytes = 1000\n");
    let set = cli(&[
        "--config",
        path.to_str().unwrap(),
        "--memory-budget-bytes",
        "134217728",
    ])
    .resolve()
    .unwrap()
    .limits;
    assert_eq!(set.session_cache_bytes, 1000);

    let shares = MemoryShares::of(256 << 20);
    assert_eq!(
        shares,
        MemoryShares {
            sessions: 64 << 20,
            page_cache: 16 << 20,
            search: 16 << 20,
        }
    );
}

fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctxbroker.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// The rule that every flag has an environment twin named after it and a
/// file key named after it, and every file key a flag, checked on the
/// parser itself so that it cannot rot.
#[test]
fn every_flag_has_an_environment_twin_and_a_file_key() {
    use clap::CommandFactory;
    let keys: BTreeSet<String> = file_keys().into_iter().collect();
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
            flags.insert(key);
        }
    }
    // The `[quota]` table is the file's only: a table of tenants has no
    // flag form.
    let keys: BTreeSet<String> = keys.into_iter().filter(|k| k != "quota").collect();
    assert_eq!(keys, flags, "file keys and flags differ");
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
        inspector: true,
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
            memory_budget_bytes: 300 << 20,
        },
        tls: TlsSettings {
            tls_cert: Some(PathBuf::from("/etc/ctx/cert.pem")),
            tls_key: Some(PathBuf::from("/etc/ctx/key.pem")),
            tls_client_ca: Some(PathBuf::from("/etc/ctx/clients.pem")),
            metrics_tls: true,
            allow_insecure: true,
        },
        connections: ConnectionSettings {
            handshake_timeout: Duration::from_millis(111),
            keepalive_interval: Duration::from_millis(222),
            keepalive_timeout: Duration::from_millis(333),
            max_connections: 44,
            metrics_max_connections: 5,
            metrics_header_timeout: Duration::from_millis(666),
        },
        quota: QuotaSettings {
            max_sessions: 10,
            max_stored_bytes: 1 << 20,
            admits_per_second: 2.5,
            admit_burst: 5,
            max_streams: 3,
            tenants: [(
                "acme".to_owned(),
                QuotaOverride {
                    max_sessions: Some(100),
                    admits_per_second: Some(0.5),
                    ..QuotaOverride::default()
                },
            )]
            .into(),
        },
        auth_tokens_file: Some(PathBuf::from("/etc/ctx/tokens.toml")),
    }
}

#[test]
fn every_setting_round_trips_through_the_file() {
    let sample = sample();
    let defaults = Settings::default().values();
    for (key, value) in sample.values() {
        // The other ways of listening than the sample's.
        if !matches!(key.as_str(), "listen_fd" | "listen_unix") {
            assert_ne!(
                Some(&value),
                defaults.get(&key),
                "the sample must change {key}"
            );
        }
    }
    let (_dir, path) = file(&sample.to_toml());
    let read = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap();
    assert_eq!(read.log_line(), sample.log_line());

    let (_dir, path) = file("listen_fd = 3\n");
    let read = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap();
    assert_eq!(read.listen, Listen::Fd(3));
    let (_dir, path) = file(&read.to_toml());
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
    // A flag beats it as it beats `log`.
    let read = cli(&["--config", path.to_str().unwrap(), "--log", "warn"])
        .resolve()
        .unwrap();
    assert_eq!(read.log_filter, "warn");
    // Both names in one file: the old one is named.
    let (_dir, path) = file("log_filter = \"debug\"\nlog = \"info\"\n");
    let err = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap_err();
    assert!(err.to_string().contains("key `log_filter`"), "{err}");
}

#[test]
fn the_log_line_quotes_strings_and_names_unset_settings() {
    let line = Settings::default().log_line();
    for part in [
        "listen=\"127.0.0.1:50051\"",
        "listen_fd=unset",
        "metrics_addr=unset",
        "max_sessions=100000",
        "request_timeout_ms=30000",
        "log=\"info\"",
        "durability=\"flush\"",
    ] {
        assert!(line.split(' ').any(|p| p == part), "{part} not in {line}");
    }
    let toml = Settings::default().to_toml();
    assert!(toml.contains("# metrics_addr is not set\n"), "{toml}");
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

#[test]
fn tls_settings_come_in_pairs() {
    for (args, expected) in [
        (
            &["--tls-cert", "c.pem"][..],
            "invalid setting tls_key: must be set with tls_cert; got nothing",
        ),
        (
            &["--tls-key", "k.pem"],
            "invalid setting tls_cert: must be set with tls_key; got nothing",
        ),
        (
            &["--tls-client-ca", "ca.pem"],
            "invalid setting tls_client_ca: needs tls_cert and tls_key (client certificates are asked for over TLS); got no tls_cert",
        ),
        (
            &["--metrics-tls"],
            "invalid setting metrics_tls: needs tls_cert and tls_key; got true",
        ),
        (
            &["--handshake-timeout-ms", "0"],
            "invalid setting handshake_timeout_ms: must be at least 1; got 0",
        ),
        (
            &["--max-connections", "0"],
            "invalid setting max_connections: must be at least 1; got 0",
        ),
    ] {
        let err = cli(args).resolve().unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    let on = cli(&[
        "--tls-cert",
        "c.pem",
        "--tls-key",
        "k.pem",
        "--allow-insecure",
    ])
    .resolve()
    .unwrap();
    assert!(on.tls.enabled());
    assert!(on.tls.allow_insecure);
    let off = cli(&["--allow-insecure=false"]).resolve().unwrap();
    assert!(!off.tls.allow_insecure);
    assert!(!off.tls.enabled());
    assert_eq!(off.connections, ConnectionSettings::default());
}

#[test]
fn quotas_are_a_table_of_defaults_with_overrides_by_tenant() {
    let defaults = cli(&[]).resolve().unwrap().quota;
    assert_eq!(defaults.for_tenant("anyone"), TenantQuota::default());
    let (_dir, path) = file(
        "[quota]\nmax_sessions = 10\nadmits_per_second = 2.5\n\n[quota.tenants.acme]\nmax_sessions = 100\nmax_streams = 4\n\n[quota.tenants.\"beta.prod\"]\nadmits_per_second = 0.25\nadmit_burst = 2\n",
    );
    let quota = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap()
        .quota;
    assert_eq!(
        quota.for_tenant("acme"),
        TenantQuota {
            max_sessions: 100,
            max_stored_bytes: 0,
            admits_per_second: 2.5,
            admit_burst: 0,
            max_streams: 4,
        }
    );
    assert_eq!(
        quota.for_tenant("beta.prod"),
        TenantQuota {
            max_sessions: 10,
            admits_per_second: 0.25,
            admit_burst: 2,
            ..TenantQuota::default()
        }
    );
    assert_eq!(quota.for_tenant("other"), quota.defaults());
    // check-config prints them, and they read back.
    let (_dir, again) = file(&sample().to_toml());
    let read = cli(&["--config", again.to_str().unwrap()])
        .resolve()
        .unwrap();
    assert_eq!(read.quota, sample().quota);
}

#[test]
fn bad_quota_keys_names_and_rates_are_refused() {
    for (text, expected) in [
        ("[quota]\nmax_sesions = 3\n", "unknown field `max_sesions`"),
        (
            "[quota.tenants.acme]\nmax_bytes = 3\n",
            "unknown field `max_bytes`",
        ),
        ("[quota]\nmax_streams = -1\n", "key `quota`"),
        (
            "[quota]\nadmits_per_second = -1.0\n",
            "invalid setting quota.admits_per_second: must be a finite number of at least 0; got -1",
        ),
        (
            "[quota]\nadmits_per_second = nan\n",
            "invalid setting quota.admits_per_second",
        ),
        (
            "[quota.tenants.\"a b\"]\nmax_sessions = 1\n",
            "invalid setting quota.tenants: \"a b\": tenant may only contain",
        ),
        (
            "[quota.tenants.acme]\nadmits_per_second = inf\n",
            "tenant \"acme\": must be a finite number",
        ),
    ] {
        let (_dir, path) = file(text);
        let err = cli(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains(expected), "{text}: {err}");
    }
}

#[test]
fn token_commands_parse_their_role_and_refuse_an_unknown_one() {
    let parsed = cli(&[
        "token", "new", "--id", "ci-bot", "--role", "agent", "--tenant", "acme",
    ]);
    assert_eq!(
        parsed.command,
        Some(Command::Token(TokenCommand::New {
            id: "ci-bot".into(),
            role: crate::tenant::Role::Agent,
            tenant: Some("acme".into()),
        }))
    );
    assert_eq!(
        cli(&["token", "hash"]).command,
        Some(Command::Token(TokenCommand::Hash))
    );
    let err = Cli::try_parse_from(["ctxbrokerd", "token", "new", "--id", "x", "--role", "admin"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"admin\" is not a role"), "{err}");
}

#[test]
fn the_token_file_is_a_setting_shown_when_unset() {
    assert_eq!(cli(&[]).resolve().unwrap().auth_tokens_file, None);
    let toml = Settings::default().to_toml();
    assert!(toml.contains("# auth_tokens_file is not set\n"), "{toml}");
    let set = cli(&["--auth-tokens-file", "/etc/ctx/tokens.toml"])
        .resolve()
        .unwrap();
    assert_eq!(
        set.auth_tokens_file,
        Some(PathBuf::from("/etc/ctx/tokens.toml"))
    );
    assert!(
        set.log_line()
            .contains("auth_tokens_file=\"/etc/ctx/tokens.toml\"")
    );
}

#[test]
fn a_unix_socket_replaces_listen_and_an_inherited_socket_replaces_both() {
    let unix = cli(&["--listen-unix", "/run/ctx.sock"]).resolve().unwrap();
    assert_eq!(unix.listen, Listen::Unix(PathBuf::from("/run/ctx.sock")));
    let both = cli(&["--listen-unix", "/run/ctx.sock", "--listen-fd", "3"])
        .resolve()
        .unwrap();
    assert_eq!(both.listen, Listen::Fd(3));
    let long = format!("/{}", "s".repeat(120));
    let err = cli(&["--listen-unix", &long]).resolve().unwrap_err();
    assert!(err.to_string().contains("listen_unix"), "{err}");
    let (_dir, path) = file("listen_unix = \"/run/ctx.sock\"\n");
    let read = cli(&["--config", path.to_str().unwrap()])
        .resolve()
        .unwrap();
    assert_eq!(read.listen, Listen::Unix(PathBuf::from("/run/ctx.sock")));
}
