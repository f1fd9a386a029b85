//! The configuration surface of the real binary: `--help`,
//! `check-config FILE` (exit 0 with the settings in force, or exit 1 naming
//! every bad key), environment twins, and the effective settings logged
//! at start as one line.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary with no `CTXBROKER_*` variable inherited from the test's
/// environment.
fn ctxbrokerd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    for (key, _) in std::env::vars() {
        if key.starts_with("CTXBROKER_") {
            command.env_remove(key);
        }
    }
    command.stdin(Stdio::null());
    command
}

fn run(command: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("ctxbrokerd runs");
    (
        status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn check(path: &Path) -> (i32, String, String) {
    run(ctxbrokerd().arg("check-config").arg(path))
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_valid_file_prints_the_settings_in_force_which_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "ok.toml",
        "data_dir = \"/var/lib/ctxbroker\"\nmax_sessions = 12\nmetrics_addr = \"127.0.0.1:9464\"\nlog = \"warn\"\n",
    );
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "data_dir = \"/var/lib/ctxbroker\"",
        "max_sessions = 12",
        "metrics_addr = \"127.0.0.1:9464\"",
        "log = \"warn\"",
        // Defaults for what the file does not say.
        "listen = \"127.0.0.1:50051\"",
        "durability = \"flush\"",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "{line} missing from\n{stdout}"
        );
    }
    // The output is itself a valid file with the same settings.
    let again = write(dir.path(), "again.toml", &stdout);
    let (code, stdout_again, stderr) = check(&again);
    assert_eq!(code, 0, "{stderr}");
    let body = |text: &str| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(body(&stdout_again), body(&stdout));
}

#[test]
fn each_bad_key_is_named_and_the_check_fails() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown.toml", "max_sesions = 3\n", "key `max_sesions`"),
        (
            "suggest.toml",
            "data_dri = \"/x\"\n",
            "did you mean `data_dir`",
        ),
        (
            "type.toml",
            "max_sessions = \"lots\"\n",
            "key `max_sessions`: invalid type",
        ),
        (
            "enum.toml",
            "durability = \"sometimes\"\n",
            "key `durability`",
        ),
        ("addr.toml", "listen = \"here\"\n", "key `listen`"),
        (
            "range.toml",
            "max_spans_per_turn = 0\n",
            "max_spans_per_turn",
        ),
        (
            "top.toml",
            "metrics_top_sessions = 1000\n",
            "metrics_top_sessions",
        ),
        ("syntax.toml", "max_sessions = = 1\n", "line 1"),
    ];
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, text);
        let (code, stdout, stderr) = check(&path);
        assert_eq!(code, 1, "{name}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{name}: nothing on stdout: {stdout}");
        assert!(
            stderr.contains(expected),
            "{name}: {expected:?} not in {stderr}"
        );
    }
    // Two bad keys: both named.
    let path = write(
        dir.path(),
        "two.toml",
        "max_sesions = 3\nmax_sessions = -1\n",
    );
    let (code, _, stderr) = check(&path);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("key `max_sesions`") && stderr.contains("key `max_sessions`"),
        "{stderr}"
    );
    // A file that is not there.
    let (code, _, stderr) = check(&dir.path().join("absent.toml"));
    assert_eq!(code, 1);
    assert!(stderr.contains("absent.toml"), "{stderr}");
}

#[test]
fn the_check_reads_the_tls_files_as_the_start_would() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let not_a_key = write(dir.path(), "key.pem", "not a key\n");
    let path = write(
        dir.path(),
        "tls.toml",
        &format!(
            "tls_cert = {:?}\ntls_key = {:?}\n",
            missing.display().to_string(),
            not_a_key.display().to_string()
        ),
    );
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 1, "{stdout}");
    assert!(stderr.contains("tls_cert"), "{stderr}");
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
    assert!(!stdout.contains("valid"), "{stdout}");
}

#[test]
fn the_check_applies_the_rules_of_exposure_as_the_start_would() {
    let dir = tempfile::tempdir().unwrap();
    let open = write(dir.path(), "open.toml", "listen = \"0.0.0.0:50051\"\n");
    let (code, stdout, stderr) = check(&open);
    assert_eq!(code, 1, "{stdout}");
    assert!(stderr.contains("a start would refuse"), "{stderr}");
    for named in ["tls_cert", "auth_tokens_file", "allow_insecure"] {
        assert!(stderr.contains(named), "{named}: {stderr}");
    }
    let metrics = write(
        dir.path(),
        "metrics.toml",
        "metrics_addr = \"0.0.0.0:9464\"\n",
    );
    let (code, _, stderr) = check(&metrics);
    assert_eq!(code, 1);
    assert!(stderr.contains("metrics_tls"), "{stderr}");
    let allowed = write(
        dir.path(),
        "allowed.toml",
        "listen = \"0.0.0.0:50051\"\nallow_insecure = true\n",
    );
    let (code, stdout, stderr) = check(&allowed);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid"), "{stdout}");
}

#[test]
fn the_environment_and_flags_apply_to_the_check_as_to_serving() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "base.toml",
        "max_sessions = 12\nmarker_retention = 50\n",
    );
    let (code, stdout, stderr) = run(ctxbrokerd()
        .env("CTXBROKER_MAX_SESSIONS", "7")
        .env("CTXBROKER_METRICS_ADDR", "127.0.0.1:9999")
        .args(["--marker-retention", "60", "check-config"])
        .arg(&path));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\nmax_sessions = 7\n"), "{stdout}");
    assert!(stdout.contains("\nmarker_retention = 60\n"), "{stdout}");
    assert!(
        stdout.contains("\nmetrics_addr = \"127.0.0.1:9999\"\n"),
        "{stdout}"
    );
    // A bad environment value is named too.
    let (code, _, stderr) = run(ctxbrokerd()
        .env("CTXBROKER_MAX_SESSIONS", "several")
        .arg("check-config")
        .arg(&path));
    assert_ne!(code, 0);
    assert!(stderr.contains("max-sessions"), "{stderr}");
}

#[test]
fn help_lists_every_option_with_its_environment_twin() {
    let (code, stdout, _) = run(ctxbrokerd().arg("--help"));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("Usage: ctxbrokerd [OPTIONS] [COMMAND]"),
        "{stdout}"
    );
    assert!(stdout.contains("check-config"), "{stdout}");
    // Each option, and the environment variable its block names.
    let mut twins: Vec<(String, Option<String>)> = Vec::new();
    for line in stdout.lines().map(str::trim) {
        if line.starts_with("--") {
            let flag = line.split([' ', '<', ',', '[']).next().unwrap().to_owned();
            twins.push((flag, None));
        } else if let Some(env) = line.strip_prefix("[env: ")
            && let Some((flag, twin)) = twins.last_mut()
            && twin.is_none()
            && flag != "--help"
            && flag != "--version"
        {
            *twin = Some(env.split('=').next().unwrap().to_owned());
        }
    }
    let twins: Vec<_> = twins
        .into_iter()
        .filter(|(flag, _)| flag != "--help" && flag != "--version")
        .collect();
    assert!(twins.len() >= 18, "{stdout}");
    for (flag, twin) in &twins {
        let expected = format!(
            "CTXBROKER_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase()
        );
        assert_eq!(twin.as_deref(), Some(expected.as_str()), "{flag}");
    }
    // A flag that does not exist is a usage error.
    let (code, _, stderr) = run(ctxbrokerd().arg("--no-such-flag"));
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn the_effective_settings_are_logged_at_start_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = ctxbrokerd()
        .args([
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--log",
            "info",
        ])
        .args(["--max-sessions", "33"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if line.contains("effective configuration") {
                let _ = tx.send(line);
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = rx
        .recv_timeout(deadline - Instant::now())
        .expect("the settings are logged within 60 s");
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
    for part in [
        "max_sessions=33",
        "listen=\\\"127.0.0.1:0\\\"",
        "metrics_addr=unset",
        "durability=\\\"flush\\\"",
        "log_format=\\\"json\\\"",
    ] {
        assert!(line.contains(part), "{part} not in {line}");
    }
}

/// The daemon's stderr lines from the start up to the `serving` line, in
/// JSON; the daemon is then stopped.
fn json_start_lines(command: &mut Command) -> Vec<String> {
    let mut child = command
        .args(["--listen", "127.0.0.1:0", "--log", "info"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let serving = line.contains("\"message\":\"serving\"");
        lines.push(line);
        if serving {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn json_logs_are_one_object_per_line_from_flag_environment_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "json.toml", "log_format = \"json\"\n");
    let data = |name: &str| dir.path().join(name);
    let starts = [
        (
            "flag",
            json_start_lines(
                ctxbrokerd()
                    .args(["--log-format", "json", "--data-dir"])
                    .arg(data("a")),
            ),
        ),
        (
            "environment",
            json_start_lines(
                ctxbrokerd()
                    .env("CTXBROKER_LOG_FORMAT", "json")
                    .arg("--data-dir")
                    .arg(data("b")),
            ),
        ),
        (
            "file",
            json_start_lines(
                ctxbrokerd()
                    .arg("--config")
                    .arg(&file)
                    .arg("--data-dir")
                    .arg(data("c")),
            ),
        ),
    ];
    for (source, lines) in starts {
        assert!(
            lines
                .last()
                .is_some_and(|l| l.contains("\"message\":\"serving\"")),
            "{source}: no serving line in {lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("effective configuration")),
            "{source}: {lines:#?}"
        );
        for line in &lines {
            assert!(
                line.starts_with('{')
                    && line.ends_with('}')
                    && line.contains("\"level\":\"")
                    && line.contains("\"timestamp\":"),
                "{source}: not a JSON log object: {line}"
            );
        }
    }
}
