//! `ctxbrokerctl` against the real daemon: every command, its table and
//! JSON output, its exit codes, and a followed marker tail across a
//! restart.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::{Role, SpanClass};
use serde_json::Value;
use tonic::Code;

use crate::support::{
    Daemon, admit, classed, context, create, error_info, span, window, write_token_file,
};

/// Runs `ctxbrokerctl --addr <daemon> args...` with no terminal.
fn ctl(daemon: &Daemon, args: &[&str]) -> Output {
    ctl_env(daemon, args, None)
}

fn ctl_env(daemon: &Daemon, args: &[&str], token: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerctl"));
    command
        .arg("--addr")
        .arg(daemon.addr().to_string())
        .args(args)
        .env_remove("CTXBROKER_TOKEN")
        .env_remove("CTXBROKER_ADDR")
        .stdin(Stdio::null());
    if let Some(token) = token {
        command.env("CTXBROKER_TOKEN", token);
    }
    command.output().expect("ctxbrokerctl runs")
}

/// The command's stdout, after checking that it succeeded.
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ctxbrokerctl failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&ok(out)).expect("JSON output")
}

fn tool_text(i: u32) -> String {
    format!(
        "kubectl -n staging apply -f k8s/staging/deploy-{i}.yaml: deployment.apps/web-{i} configured. \
         error: timed out waiting for rollout of web-{i} after 300s; replicas 2/3 ready, image \
         registry.local/web:1.4.{i} pulled in 12s, probe /healthz failing on port 8080 with status 503."
    )
}

/// A session with a constraint and tool output past one compaction.
async fn compacted(daemon: &Daemon, id: &str) {
    let mut client = daemon.client().await;
    create(&mut client, id, window(400)).await;
    admit(
        &mut client,
        id,
        vec![span(
            Role::User,
            "Never write to the `prod` namespace; stage only.",
        )],
    )
    .await
    .unwrap();
    let mut i = 0;
    while client
        .get_session(pb::GetSessionRequest {
            session_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .compactions
        == 0
    {
        i += 1;
        admit(&mut client, id, vec![span(Role::Tool, &tool_text(i))])
            .await
            .unwrap();
    }
}

/// Admits tool output to `id` until an admission compacts.
async fn until_compaction(
    client: &mut ctxbroker_proto::v1::context_broker_client::ContextBrokerClient<
        tonic::transport::Channel,
    >,
    id: &str,
    i: &mut u32,
) {
    loop {
        *i += 1;
        let reply = admit(client, id, vec![span(Role::Tool, &tool_text(*i))])
            .await
            .unwrap();
        if reply.compaction.is_some() {
            return;
        }
    }
}

#[tokio::test]
async fn sessions_context_markers_info_and_health_in_tables_and_json() {
    let daemon = Daemon::start().await;
    compacted(&daemon, "demo").await;

    let listed = json(&ctl(&daemon, &["sessions", "list", "-o", "json"]));
    let demo = &listed.as_array().unwrap()[0];
    assert_eq!(demo["session_id"], "demo");
    assert!(demo["compactions"].as_u64().unwrap() >= 1);
    assert!(demo["live_tokens"].as_u64().unwrap() <= demo["budget_tokens"].as_u64().unwrap());
    let table = ok(&ctl(&daemon, &["sessions", "list"]));
    assert!(table.contains("SESSION") && table.contains("demo") && table.contains("1 session(s)"));
    let shown = json(&ctl(&daemon, &["sessions", "show", "demo", "-o", "json"]));
    assert_eq!(shown["session_id"], "demo");

    let ctx = json(&ctl(&daemon, &["context", "demo", "-o", "json"]));
    let spans = ctx["spans"].as_array().unwrap();
    let pinned: Vec<&Value> = spans.iter().filter(|s| s["pinned"] == true).collect();
    assert_eq!(pinned.len(), 1, "the constraint is live and pinned: {ctx}");
    assert!(pinned[0]["text"].as_str().unwrap().contains("`prod`"));
    assert!(spans.iter().any(|s| s["class"] == "summary"));
    let table = ok(&ctl(&daemon, &["context", "demo"]));
    assert!(table.contains("constraint") && table.contains("Never write to the `prod`"));

    let markers = ok(&ctl(&daemon, &["markers", "tail", "-o", "json"]));
    let first: Value = serde_json::from_str(markers.lines().next().unwrap()).unwrap();
    assert_eq!(first["seq"], 1);
    assert_eq!(first["session_id"], "demo");
    assert_eq!(first["outcome"], "committed");
    assert_eq!(first["pinned_retained"], first["pinned_total"]);
    let table = ok(&ctl(&daemon, &["markers", "tail"]));
    let mut lines = table.lines();
    assert!(lines.next().unwrap().contains("SEQ"));
    assert!(lines.next().unwrap().contains("committed"));

    let info = json(&ctl(&daemon, &["info", "-o", "json"]));
    assert_eq!(info["contract_digest"].as_str().unwrap().len(), 64);
    assert!(info["next_marker_seq"].as_u64().unwrap() >= 2);
    assert_eq!(
        json(&ctl(&daemon, &["health", "-o", "json"]))["status"],
        "serving"
    );
    assert!(ok(&ctl(&daemon, &["health"])).contains("serving"));
}

#[tokio::test]
async fn a_followed_tail_prints_new_markers_and_resumes_after_a_restart() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "live", window(400)).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxbrokerctl"))
        .args(["--addr", &daemon.addr().to_string(), "-o", "json"])
        .args(["markers", "tail", "--follow", "--from-seq", "1"])
        .env_remove("CTXBROKER_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let next_marker = |seen: &mpsc::Receiver<String>| -> Value {
        let line = seen
            .recv_timeout(Duration::from_secs(30))
            .expect("the tail prints the marker");
        serde_json::from_str(&line).unwrap()
    };

    let mut i = 0;
    until_compaction(&mut client, "live", &mut i).await;
    assert_eq!(next_marker(&seen)["seq"], 1);

    daemon.restart().await;
    let mut client = daemon.client().await;
    until_compaction(&mut client, "live", &mut i).await;
    let after = next_marker(&seen);
    assert_eq!(
        after["seq"], 2,
        "resumed after the restart, nothing skipped or repeated"
    );
    assert_eq!(after["session_id"], "live");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn pin_unpin_and_an_approved_escalation() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "pins", window(4000)).await;
    let reply = admit(
        &mut client,
        "pins",
        vec![classed(
            Role::User,
            SpanClass::Narrative,
            "Keep every deployment in the eu-west-1 region.",
        )],
    )
    .await
    .unwrap();
    let id = reply.spans[0].span_id.to_string();
    let pinned = json(&ctl(&daemon, &["pin", "pins", &id, "-o", "json"]));
    assert_eq!(pinned["class"], "constraint");
    let live = context(&mut client, "pins").await;
    assert_eq!(live.spans[0].span_class(), SpanClass::Constraint);

    let unpinned = ok(&ctl(
        &daemon,
        &[
            "unpin",
            "pins",
            &id,
            "--actor",
            "oncall",
            "--reason",
            "region moved",
        ],
    ));
    assert!(unpinned.contains("unpinned span"), "{unpinned}");
    let live = context(&mut client, "pins").await;
    assert_ne!(live.spans[0].span_class(), SpanClass::Constraint);

    // A session that compacts only when an operator approves.
    create(
        &mut client,
        "gated",
        pb::SessionConfig {
            mode: pb::SessionMode::Approval as i32,
            ..window(1200)
        },
    )
    .await;
    let mut i = 0;
    let (status, turn) = loop {
        i += 1;
        let turn = tool_text(i);
        if let Err(status) = admit(&mut client, "gated", vec![span(Role::Tool, &turn)]).await {
            break (status, turn);
        }
    };
    assert_eq!(status.code(), Code::FailedPrecondition);
    let (reason, meta) = error_info(&status);
    assert_eq!(reason, "APPROVAL_REQUIRED");
    let incoming = &meta["incoming_tokens"];

    // Without a terminal, approval needs --yes and changes nothing.
    let refused = ctl(
        &daemon,
        &[
            "escalation",
            "approve",
            "gated",
            "--incoming",
            incoming,
            "--actor",
            "ops",
        ],
    );
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));

    let shown = json(&ctl(
        &daemon,
        &[
            "escalation",
            "show",
            "gated",
            "--incoming",
            incoming,
            "-o",
            "json",
        ],
    ));
    assert_eq!(shown["verified"], true);
    assert!(!shown["evicted"].as_array().unwrap().is_empty());
    let approved = json(&ctl(
        &daemon,
        &[
            "escalation",
            "approve",
            "gated",
            "--incoming",
            incoming,
            "--actor",
            "ops",
            "--yes",
            "-o",
            "json",
        ],
    ));
    assert_eq!(approved["outcome"], "committed");
    assert_eq!(approved["actor"], "ops");
    admit(&mut client, "gated", vec![span(Role::Tool, &turn)])
        .await
        .expect("the waiting turn is admitted after the approval");
}

#[tokio::test]
async fn export_delete_and_import_restore_the_same_context() {
    let daemon = Daemon::start().await;
    compacted(&daemon, "moved").await;
    compacted(&daemon, "other").await;
    let mut client = daemon.client().await;
    let before = context(&mut client, "moved").await;
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap();

    let exported = json(&ctl(
        &daemon,
        &["export", "--all", "--dir", dir_arg, "-o", "json"],
    ));
    assert_eq!(exported.as_array().unwrap().len(), 2);
    let file = dir.path().join("moved.snapshot");
    assert!(file.is_file());
    // An existing file is never overwritten.
    let again = ctl(&daemon, &["export", "moved", "--dir", dir_arg]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));

    ok(&ctl(&daemon, &["sessions", "delete", "moved", "--yes"]));
    let gone = ctl(&daemon, &["context", "moved"]);
    assert_eq!(gone.status.code(), Some(5), "NOT_FOUND exits 5");

    let imported = json(&ctl(
        &daemon,
        &["import", file.to_str().unwrap(), "-o", "json"],
    ));
    assert_eq!(imported[0]["session_id"], "moved");
    let after = context(&mut client, "moved").await;
    let texts = |c: &pb::GetContextResponse| -> Vec<(u64, String)> {
        c.spans
            .iter()
            .map(|s| (s.span_id, s.text.clone()))
            .collect()
    };
    assert_eq!(texts(&after), texts(&before));

    // A file that is not a snapshot is named and refused.
    let junk = dir.path().join("junk.snapshot");
    std::fs::write(&junk, b"\xff\xff\xff not a snapshot").unwrap();
    let refused = ctl(&daemon, &["import", junk.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("junk.snapshot"));
}

#[tokio::test]
async fn tokens_bad_input_and_an_absent_daemon_have_their_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    write_token_file(&file, &[("ops", "operator", None, "operator-token-ctl-1")]);
    let daemon = Daemon::start_with(&[&format!("--auth-tokens-file={}", file.display())]).await;

    let anonymous = ctl(&daemon, &["sessions", "list"]);
    assert_eq!(anonymous.status.code(), Some(6), "UNAUTHENTICATED exits 6");
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("Unauthenticated"));

    let listed = ctl_env(
        &daemon,
        &["sessions", "list", "-o", "json"],
        Some("operator-token-ctl-1"),
    );
    assert_eq!(json(&listed), Value::Array(Vec::new()));

    let bad = ctl_env(&daemon, &["context", ""], Some("operator-token-ctl-1"));
    assert_eq!(bad.status.code(), Some(4), "INVALID_ARGUMENT exits 4");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("field session_id: must not be empty"),
        "{stderr}"
    );

    let usage = ctl(&daemon, &["sessions", "list", "--output", "yaml"]);
    assert_eq!(usage.status.code(), Some(2));

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let absent = Command::new(env!("CARGO_BIN_EXE_ctxbrokerctl"))
        .args(["--addr", &closed, "--timeout", "2s", "info"])
        .output()
        .unwrap();
    assert_eq!(absent.status.code(), Some(3), "an absent daemon exits 3");
    assert!(String::from_utf8_lossy(&absent.stderr).contains("cannot connect"));
}
