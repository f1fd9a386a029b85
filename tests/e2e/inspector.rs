//! The context inspector of the real daemon (`--inspector` beside
//! `--metrics-addr`): its numbers are GetContext's, its pages escape what
//! sessions hold, bad input gets a clear answer, big sessions come in
//! pages, tokens and tenants rule who sees what, and the live events
//! resume by sequence. The same pages in a real browser: tests/inspector.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use pb::Role;
use pb::context_broker_client::ContextBrokerClient;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint};

use crate::served::{Served, http};
use crate::support::{
    admit, classed, context, create, refused_start, span, token_client, window, write_token_file,
};

/// `GET path` with extra header lines: status, headers, body.
fn get(
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> (u16, std::collections::HashMap<String, String>, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: ctxbroker\r\n{headers}\r\n"),
    )
}

/// The ids of a sessions list's page.
fn session_ids(list: &Value) -> Vec<&str> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect()
}

/// Posts the login form with `token`.
fn log_in(
    addr: SocketAddr,
    token: &str,
) -> (u16, std::collections::HashMap<String, String>, String) {
    let form = format!("token={token}");
    http(
        addr,
        &format!(
            "POST /inspect/login HTTP/1.1\r\nHost: ctxbroker\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    )
}

/// `GET path` of a JSON twin, parsed.
fn json(addr: SocketAddr, path: &str, headers: &str) -> (u16, Value) {
    let (status, head, body) = get(addr, path, headers);
    assert_eq!(
        head.get("content-type").map(String::as_str),
        Some("application/json"),
        "{path}: {body}"
    );
    (status, serde_json::from_str(&body).expect("JSON"))
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("a number: {value}"))
}

/// A session with a pinned constraint holding markup, and turns enough
/// for compactions at admission.
async fn busy_session(client: &mut ContextBrokerClient<Channel>, id: &str) {
    create(client, id, window(1_200)).await;
    admit(
        client,
        id,
        vec![classed(
            Role::User,
            pb::SpanClass::Constraint,
            "Never write to the prod namespace. <script>alert('pwned')</script>",
        )],
    )
    .await
    .unwrap();
    for i in 0..12 {
        let text = format!(
            "turn {i}: the build of crate alpha{i} failed in src/lib{i}.rs with error E0{i:03}; {}",
            "the log goes on at length about the linker. ".repeat(12)
        );
        admit(client, id, vec![span(Role::Tool, &text)])
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_window_bar_says_what_get_context_says_and_markup_stays_text() {
    let daemon = Served::start(&["--inspector"]);
    let mut client = daemon.client().await;
    busy_session(&mut client, "demo").await;
    let ctx = context(&mut client, "demo").await;
    let totals = ctx.totals.unwrap();
    assert!(ctx.turn > 0);

    let (status, view) = json(daemon.metrics, "/inspect/api/session?id=demo", "");
    assert_eq!(status, 200, "{view}");
    let w = &view["window"];
    assert_eq!(u(&w["live_tokens"]), u64::from(totals.live_tokens));
    assert_eq!(u(&w["budget_tokens"]), u64::from(totals.budget_tokens));
    assert_eq!(u(&w["window_tokens"]), u64::from(totals.window_tokens));
    assert_eq!(
        u(&w["soft_watermark_tokens"]),
        u64::from(totals.soft_watermark_tokens)
    );
    let classes = w["classes"].as_array().unwrap();
    let sum: u64 = classes.iter().map(|c| u(&c["tokens"])).sum();
    assert_eq!(sum, u64::from(totals.live_tokens), "the classes add up");
    let pinned = classes.iter().find(|c| c["class"] == "constraint").unwrap();
    assert_eq!(u(&pinned["tokens"]), u64::from(totals.pinned_tokens));
    assert_eq!(u(&pinned["spans"]), u64::from(totals.pinned_spans));
    // The live spans, in GetContext's order, with its relevance.
    let items = view["spans"]["items"].as_array().unwrap();
    assert_eq!(items.len(), ctx.spans.len());
    for (item, span) in items.iter().zip(&ctx.spans) {
        assert_eq!(u(&item["id"]), span.span_id);
        assert_eq!(u(&item["tokens"]), u64::from(span.tokens));
    }
    // Every marker of the session, newest first, with its turn.
    let session = &view["session"];
    let markers = view["markers"]["items"].as_array().unwrap();
    assert!(!markers.is_empty(), "the turns compacted");
    assert_eq!(markers.len() as u64, u(&session["last_marker"]));
    assert!(
        markers
            .windows(2)
            .all(|m| u(&m[0]["seq"]) > u(&m[1]["seq"]))
    );
    assert!(
        markers
            .iter()
            .all(|m| u(&m["turn"]) > 0 && m["trigger"] == "hard_budget")
    );
    assert_eq!(view["markers"]["before"], Value::Null);

    // The page shows the same numbers, and the markup as text.
    let (status, head, page) = get(daemon.metrics, "/inspect/session?id=demo", "");
    assert_eq!(status, 200);
    assert_eq!(head["content-type"], "text/html; charset=utf-8");
    assert!(head["content-security-policy"].contains("script-src 'self'"));
    assert_eq!(head["x-content-type-options"], "nosniff");
    let live = format!("<dd id=\"live-tokens\">{}</dd>", totals.live_tokens);
    assert!(page.contains(&live), "{page}");
    let budget = format!("<dd id=\"budget-tokens\">{}</dd>", totals.budget_tokens);
    assert!(page.contains(&budget));
    assert!(!page.contains("<script>alert"), "span text is never markup");
    assert!(page.contains("&lt;script&gt;alert('pwned')&lt;/script&gt;"));
    let scripts = page.matches("<script").count();
    assert_eq!(scripts, 1, "the page's one script is the inspector's own");
    for m in markers {
        assert!(page.contains(&format!("id=\"marker-{}\"", u(&m["seq"]))));
    }

    // The list names it, with the same numbers.
    let (status, list) = json(daemon.metrics, "/inspect/api/sessions", "");
    assert_eq!(status, 200);
    let row = &list["sessions"][0];
    assert_eq!(row["id"], "demo");
    assert_eq!(u(&row["live_tokens"]), u64::from(totals.live_tokens));
    let (status, _, page) = get(daemon.metrics, "/inspect", "");
    assert_eq!(status, 200);
    assert!(page.contains("href=\"/inspect/session?id=demo\""));

    // An evicted span is reachable by its turn, and whole by its id.
    let evicted = u(&markers.last().unwrap()["evicted"][0]);
    let (_, span_view) = json(
        daemon.metrics,
        &format!("/inspect/api/span?id=demo&span={evicted}"),
        "",
    );
    assert_eq!(span_view["live"], false);
    let turn = u(&span_view["span"]["turn"]);
    let by_seq = u(&span_view["span"]["archived_by_seq"]);
    assert_eq!(by_seq, u(&markers.last().unwrap()["seq"]));
    let (status, archive) = json(
        daemon.metrics,
        &format!("/inspect/api/archive?id=demo&turn={turn}"),
        "",
    );
    assert_eq!(status, 200);
    let archived = archive["items"].as_array().unwrap();
    assert!(archived.iter().any(|s| u(&s["id"]) == evicted));
    assert!(archived.iter().all(|s| u(&s["turn"]) == turn));
    let (status, _, page) = get(
        daemon.metrics,
        &format!("/inspect/archive?id=demo&turn={turn}"),
        "",
    );
    assert_eq!(status, 200);
    assert!(page.contains(&format!("id=\"span-{evicted}\"")));
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_and_big_sessions_come_in_pages() {
    let daemon = Served::start(&["--inspector"]);
    let mut client = daemon.client().await;
    let addr = daemon.metrics;

    // An unknown session: a 404 page, and a 404 in JSON.
    let (status, _, page) = get(addr, "/inspect/session?id=nope", "");
    assert_eq!(status, 404, "{page}");
    assert!(page.contains("nope"), "{page}");
    let (status, body) = json(addr, "/inspect/api/session?id=nope", "");
    assert_eq!(status, 404);
    assert_eq!(u(&body["error"]["status"]), 404);
    let (status, _, _) = get(addr, "/inspect/nowhere", "");
    assert_eq!(status, 404);

    // Parameters are named with their limits.
    for (path, says) in [
        ("/inspect/api/session", "`id` is required"),
        (
            "/inspect/api/sessions?limit=0",
            "`limit` must be a whole number from 1 to 1000",
        ),
        (
            "/inspect/api/sessions?limit=abc",
            "`limit` must be a whole number from 1 to 1000",
        ),
        (
            "/inspect/api/session?id=a&from=-1",
            "`from` must be a whole number",
        ),
        ("/inspect/api/span?id=a", "`span` is required"),
        ("/inspect/api/session?id=a%20b", "`id`"),
        (
            "/inspect/api/events?id=a&from_seq=x",
            "`from_seq` must be a whole number",
        ),
    ] {
        let (status, body) = json(addr, path, "");
        assert_eq!(status, 400, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
    }
    let (status, _, page) = get(addr, "/inspect/session?id=%3Cb%3Ex", "");
    assert_eq!(status, 400);
    assert!(!page.contains("<b>x"), "{page}");

    // 250 live spans: 200 on the first page, the rest on the next.
    create(&mut client, "big", window(1_000_000)).await;
    for chunk in 0..5 {
        let spans = (0..50)
            .map(|i| span(Role::Assistant, &format!("note {chunk}-{i} about the plan")))
            .collect();
        admit(&mut client, "big", spans).await.unwrap();
    }
    let (_, first) = json(addr, "/inspect/api/session?id=big", "");
    assert_eq!(u(&first["spans"]["total"]), 250);
    assert_eq!(first["spans"]["items"].as_array().unwrap().len(), 200);
    assert_eq!(u(&first["spans"]["next_from"]), 200);
    let (_, second) = json(addr, "/inspect/api/session?id=big&from=200", "");
    let rest = second["spans"]["items"].as_array().unwrap();
    assert_eq!(rest.len(), 50);
    assert_eq!(
        u(&rest[0]["id"]),
        u(&first["spans"]["items"][199]["id"]) + 1
    );
    assert_eq!(second["spans"]["next_from"], Value::Null);
    let (_, past) = json(addr, "/inspect/api/session?id=big&from=9999", "");
    assert!(past["spans"]["items"].as_array().unwrap().is_empty());
    let (_, _, page) = get(addr, "/inspect/session?id=big", "");
    assert!(page.contains("id=\"next-spans\""));
    // A page of another size links to the next one of that size.
    let (_, _, page) = get(addr, "/inspect/session?id=big&from=50&limit=50", "");
    assert!(
        page.contains("/inspect/session?id=big&amp;from=100&amp;limit=50"),
        "{page}"
    );
    assert!(page.contains("/inspect/session?id=big&amp;from=0&amp;limit=50"));

    // Sessions come in pages too.
    for id in ["c1", "c2"] {
        create(&mut client, id, window(1_000)).await;
    }
    let (_, one) = json(addr, "/inspect/api/sessions?limit=2", "");
    let ids = session_ids(&one);
    assert_eq!(ids, ["big", "c1"]);
    assert_eq!(one["next_after"], "c1");
    let (_, two) = json(addr, "/inspect/api/sessions?limit=2&after=c1", "");
    assert_eq!(two["sessions"][0]["id"], "c2");
    assert_eq!(two["next_after"], Value::Null);
}

#[tokio::test]
async fn tokens_and_tenants_rule_the_inspector_as_they_rule_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let (acme, globex, ops) = (
        "acme-token-0123456789",
        "globex-token-0123456789",
        "ops-token-0123456789",
    );
    write_token_file(
        &file,
        &[
            ("acme-bot", "agent", Some("acme"), acme),
            ("globex-dash", "watcher", Some("globex"), globex),
            ("ops", "operator", None, ops),
        ],
    );
    let daemon = Served::start(&[
        &format!("--auth-tokens-file={}", file.display()),
        "--inspector",
    ]);
    let channel = Endpoint::from_shared(format!("http://{}", daemon.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut acme_client = token_client(channel.clone(), acme);
    acme_client
        .create_session(pb::CreateSessionRequest {
            session_id: "s1".into(),
            config: Some(window(2_000)),
        })
        .await
        .unwrap();
    let mut ops_client = token_client(channel, ops);
    ops_client
        .create_session(pb::CreateSessionRequest {
            session_id: "globex/g1".into(),
            config: Some(window(2_000)),
        })
        .await
        .unwrap();
    let addr = daemon.metrics;
    let bearer = |token: &str| format!("Authorization: Bearer {token}\r\n");

    // No token: a login form (401), a JSON refusal that says how.
    let (status, head, page) = get(addr, "/inspect", "");
    assert_eq!(status, 401);
    assert!(page.contains("action=\"/inspect/login\""), "{page}");
    assert!(!head.contains_key("set-cookie"));
    let (status, body) = json(addr, "/inspect/api/sessions", "");
    assert_eq!(status, 401);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Bearer")
    );
    let (status, _) = json(addr, "/inspect/api/sessions", &bearer("not-a-token"));
    assert_eq!(status, 401);
    let (status, _) = json(addr, "/inspect/api/events?id=s1", "");
    assert_eq!(status, 401);

    // A tenant's token sees its own sessions by their bare ids.
    let (status, list) = json(addr, "/inspect/api/sessions", &bearer(acme));
    assert_eq!(status, 200);
    let ids = session_ids(&list);
    assert_eq!(ids, ["s1"]);
    assert_eq!(list["sessions"][0]["tenant"], "acme");
    let (status, _) = json(addr, "/inspect/api/session?id=s1", &bearer(acme));
    assert_eq!(status, 200);
    // Another tenant's session does not exist for it, by any name.
    let (status, _) = json(addr, "/inspect/api/session?id=g1", &bearer(acme));
    assert_eq!(status, 404);
    let (status, _) = json(addr, "/inspect/api/session?id=globex%2Fg1", &bearer(acme));
    assert_eq!(status, 400, "a tenant names sessions by bare id");
    let (status, _) = json(addr, "/inspect/api/events?id=g1", &bearer(acme));
    assert_eq!(status, 404);
    // A watcher reads its tenant's; the operator reads everything by
    // full id.
    let (status, list) = json(addr, "/inspect/api/sessions", &bearer(globex));
    assert_eq!(status, 200);
    assert_eq!(list["sessions"][0]["id"], "g1");
    let (_, list) = json(addr, "/inspect/api/sessions", &bearer(ops));
    let ids = session_ids(&list);
    assert_eq!(ids, ["acme/s1", "globex/g1"]);

    // The login form sets the token as a cookie the pages accept.
    let (status, head, _) = log_in(addr, acme);
    assert_eq!(status, 303);
    assert_eq!(head["location"], "/inspect");
    let cookie = head["set-cookie"].clone();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/inspect"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    let pair = cookie.split(';').next().unwrap();
    let (status, _, page) = get(addr, "/inspect", &format!("Cookie: {pair}\r\n"));
    assert_eq!(status, 200);
    assert!(page.contains("href=\"/inspect/session?id=s1\""), "{page}");
    assert!(!page.contains("g1"));
    let (status, head, page) = log_in(addr, "wrong");
    assert_eq!(status, 401);
    assert!(!head.contains_key("set-cookie"));
    assert!(page.contains("unknown token"), "{page}");
}

/// Reads server-sent events from a stream until `until` says stop or
/// `within` passes; returns each event as (event, id, data).
fn read_events(
    reader: &mut BufReader<TcpStream>,
    within: Duration,
    until: impl Fn(&(String, String, String)) -> bool,
) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(err) if err.kind() == std::io::ErrorKind::TimedOut => continue,
            Err(err) => panic!("reading the events: {err}"),
        }
        let text = line.trim_end_matches(['\r', '\n']);
        if let Some(v) = text.strip_prefix("event: ") {
            event = v.to_owned();
        } else if let Some(v) = text.strip_prefix("id: ") {
            id = v.to_owned();
        } else if let Some(v) = text.strip_prefix("data: ") {
            data = v.to_owned();
        } else if text.is_empty() && !event.is_empty() {
            let done = (
                std::mem::take(&mut event),
                std::mem::take(&mut id),
                std::mem::take(&mut data),
            );
            let stop = until(&done);
            events.push(done);
            if stop {
                break;
            }
        }
    }
    events
}

/// Opens `/inspect/api/events` with extra headers; returns the reader
/// past the response head.
fn open_events(addr: SocketAddr, query: &str, headers: &str) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    write!(
        stream,
        "GET /inspect/api/events?{query} HTTP/1.1\r\nHost: ctxbroker\r\nAccept: text/event-stream\r\n{headers}\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status.is_empty() && Instant::now() < deadline {
        let _ = reader.read_line(&mut status);
    }
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    loop {
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        if line == "\r\n" {
            return reader;
        }
        assert!(Instant::now() < deadline, "no end of the response head");
    }
}

#[tokio::test]
async fn live_events_bring_new_markers_and_resume_by_sequence() {
    let mut daemon = Served::start(&["--inspector"]);
    let mut client = daemon.client().await;
    create(&mut client, "live", window(600)).await;
    create(&mut client, "other", window(600)).await;
    let (_, view) = json(daemon.metrics, "/inspect/api/session?id=live", "");
    let from = u(&view["next_seq"]);

    let mut events = open_events(daemon.metrics, &format!("id=live&from_seq={from}"), "");
    let caught_up = read_events(&mut events, Duration::from_secs(10), |e| e.0 == "caught-up");
    assert_eq!(caught_up.last().map(|e| e.0.as_str()), Some("caught-up"));
    // Another session's compaction is not this page's; this one's is.
    let filler = "the deployment log repeats the same warning line again ".repeat(20);
    for id in ["other", "live"] {
        for _ in 0..6 {
            admit(&mut client, id, vec![span(Role::Tool, &filler)])
                .await
                .unwrap();
        }
    }
    let got = read_events(&mut events, Duration::from_secs(20), |e| e.0 == "marker");
    let (_, id, data) = got.last().cloned().expect("an event");
    let marker: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(marker["session_id"], "live", "{data}");
    assert_eq!(id, marker["seq"].to_string());
    let seq = u(&marker["seq"]);
    drop(events);

    // A browser that reconnects says the last id it saw: the stream
    // resumes right after it, whatever the URL's from_seq.
    let mut again = open_events(
        daemon.metrics,
        &format!("id=live&from_seq={from}"),
        &format!("Last-Event-ID: {}\r\n", seq - 1),
    );
    let replayed = read_events(&mut again, Duration::from_secs(10), |e| e.0 == "marker");
    assert_eq!(replayed.last().map(|e| e.1.clone()), Some(seq.to_string()));
    let mut after = open_events(
        daemon.metrics,
        "id=live",
        &format!("Last-Event-ID: {seq}\r\n"),
    );
    let next = read_events(&mut after, Duration::from_secs(10), |e| e.0 == "caught-up");
    assert!(
        next.iter()
            .all(|e| e.0 != "marker" || e.1.parse::<u64>().unwrap() > seq),
        "{next:?}"
    );

    // Open event streams do not hold the daemon at SIGTERM: they end, and
    // the daemon stops well inside its drain. (The wait is on the blocking
    // pool, so this runtime keeps serving the gRPC client's connection,
    // which the daemon's drain waits for.)
    let started = Instant::now();
    let (status, daemon) = tokio::task::spawn_blocking(move || {
        let status = daemon.terminate();
        (status, daemon)
    })
    .await
    .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped after {:?} with a stream open",
        started.elapsed()
    );
    drop((client, daemon, after, again));
}

#[test]
fn the_inspector_needs_the_metrics_address_and_a_token_file_off_loopback() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command.args(["--inspector", "--listen", "127.0.0.1:0"]);
    let dir = tempfile::tempdir().unwrap();
    command.arg("--data-dir").arg(dir.path().join("data"));
    let (status, stderr) = refused_start(command, "started an inspector without metrics_addr");
    assert!(!status.success());
    assert!(stderr.contains("inspector"), "{stderr}");
    assert!(stderr.contains("metrics_addr"), "{stderr}");

    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command.args([
        "--inspector",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "0.0.0.0:0",
    ]);
    command.arg("--data-dir").arg(dir.path().join("data"));
    let (status, stderr) = refused_start(command, "served an open inspector off loopback");
    assert!(!status.success());
    assert!(
        stderr.contains("refusing to serve the inspector without authentication"),
        "{stderr}"
    );
}
