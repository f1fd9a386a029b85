//! The Prometheus endpoint of the real daemon: it binds `--metrics-addr
//! 127.0.0.1:0`, says in its log which port it got, and its numbers move by
//! exactly what was done. The exposition is checked against the text
//! format's rules, and the Grafana dashboard in `deploy/grafana` against
//! the families the daemon exports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use pb::Role;
use tonic::Code;

use crate::served::{Served, http};
use crate::support::{admit, create, prose, session, span, watch_replay, window};

fn scrape(addr: SocketAddr) -> Exposition {
    let (status, headers, body) = http(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: ctxbroker\r\nAccept: text/plain\r\n\r\n",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    Exposition::parse(&body).unwrap_or_else(|err| panic!("invalid exposition: {err}\n{body}"))
}

type Labels = BTreeMap<String, String>;
/// One histogram series: `(le, cumulative count)` buckets, sum, count.
type HistogramSeries = (Vec<(f64, f64)>, Option<f64>, Option<f64>);

/// A sample: its series name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed and validated exposition.
#[derive(Debug)]
struct Exposition {
    /// Family name → type.
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    /// Parses the text format, checking its rules: every sample belongs to
    /// a family declared before it with HELP and TYPE, once; a family's
    /// samples are contiguous; no series twice; counters end in `_total`
    /// and never go negative; histogram buckets are cumulative in `le`
    /// order, end with `+Inf`, and `+Inf` equals `_count`.
    fn parse(text: &str) -> Result<Exposition, String> {
        let mut helps = BTreeSet::new();
        let mut types = BTreeMap::new();
        let mut samples = Vec::new();
        let mut finished = BTreeSet::new();
        let mut current: Option<String> = None;
        let mut seen = BTreeSet::new();
        for (n, line) in text.lines().enumerate() {
            let at = format!("line {}: {line}", n + 1);
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').ok_or(format!("{at}: no help"))?;
                if help.trim().is_empty() || !helps.insert(name.to_owned()) {
                    return Err(format!("{at}: empty or repeated HELP"));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or(format!("{at}: no type"))?;
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(format!("{at}: unknown type"));
                }
                if types.insert(name.to_owned(), kind.to_owned()).is_some() {
                    return Err(format!("{at}: repeated TYPE"));
                }
                if !helps.contains(name) {
                    return Err(format!("{at}: TYPE before HELP"));
                }
                if let Some(previous) = current.replace(name.to_owned()) {
                    finished.insert(previous);
                }
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let sample = parse_sample(line).map_err(|err| format!("{at}: {err}"))?;
            let family =
                family_of(&sample.name, &types).ok_or(format!("{at}: no TYPE for this series"))?;
            if finished.contains(&family) || current.as_deref() != Some(family.as_str()) {
                return Err(format!("{at}: the family's samples are not together"));
            }
            if !sample.value.is_finite() && sample.value != f64::INFINITY {
                return Err(format!("{at}: value is not a number"));
            }
            if types[&family] == "counter"
                && (!sample.name.ends_with("_total") || sample.value < 0.0)
            {
                return Err(format!("{at}: a counter must end in _total and be >= 0"));
            }
            if !seen.insert((sample.name.clone(), sample.labels.clone())) {
                return Err(format!("{at}: repeated series"));
            }
            samples.push(sample);
        }
        let exposition = Exposition { types, samples };
        exposition.check_histograms()?;
        Ok(exposition)
    }

    fn check_histograms(&self) -> Result<(), String> {
        for (family, kind) in &self.types {
            if kind != "histogram" {
                continue;
            }
            // Label sets without `le` → buckets, sum, count.
            let mut series: BTreeMap<Labels, HistogramSeries> = BTreeMap::new();
            for s in self
                .samples
                .iter()
                .filter(|s| s.name.starts_with(family.as_str()))
            {
                let mut labels = s.labels.clone();
                let le = labels.remove("le");
                let entry = series.entry(labels).or_default();
                match s.name.strip_prefix(family.as_str()) {
                    Some("_bucket") => {
                        let le = le.ok_or(format!("{family}: a bucket without le"))?;
                        let bound = if le == "+Inf" {
                            f64::INFINITY
                        } else {
                            le.parse().map_err(|_| format!("{family}: le {le:?}"))?
                        };
                        entry.0.push((bound, s.value));
                    }
                    Some("_sum") => entry.1 = Some(s.value),
                    Some("_count") => entry.2 = Some(s.value),
                    _ => return Err(format!("{family}: stray series {}", s.name)),
                }
            }
            for (labels, (buckets, sum, count)) in series {
                let count = count.ok_or(format!("{family} {labels:?}: no _count"))?;
                sum.ok_or(format!("{family} {labels:?}: no _sum"))?;
                let last = buckets
                    .last()
                    .ok_or(format!("{family} {labels:?}: no buckets"))?;
                if last.0 != f64::INFINITY || last.1 != count {
                    return Err(format!(
                        "{family} {labels:?}: +Inf {last:?} vs count {count}"
                    ));
                }
                for pair in buckets.windows(2) {
                    if pair[0].0 >= pair[1].0 || pair[0].1 > pair[1].1 {
                        return Err(format!(
                            "{family} {labels:?}: buckets not cumulative: {pair:?}"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The value of the series with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// The value, which must be there.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no series {name} {labels:?}"))
    }

    /// Every series name, and the families.
    fn names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.types.keys().cloned().collect();
        names.extend(self.samples.iter().map(|s| s.name.clone()));
        for (family, kind) in &self.types {
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{family}{suffix}"));
                }
            }
        }
        names
    }
}

fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_owned());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let family = name.strip_suffix(suffix)?;
        (types.get(family).map(String::as_str) == Some("histogram")).then(|| family.to_owned())
    })
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let end = loop {
            // name="value" pairs, comma-separated, up to '}'.
            let Some(&(start, c)) = chars.peek() else {
                return Err("unterminated labels".into());
            };
            if c == '}' {
                break start + 1;
            }
            let eq = after[start..].find('=').ok_or("label without =")? + start;
            let key = &after[start..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("bad label name {key:?}"));
            }
            while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err("label value not quoted".into());
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        other => return Err(format!("bad escape {other:?}")),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value".into()),
                }
            }
            if labels.insert(key.to_owned(), value).is_some() {
                return Err(format!("label {key} twice"));
            }
            if chars.peek().map(|&(_, c)| c) == Some(',') {
                chars.next();
            }
        };
        rest = &after[end..];
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| format!("bad timestamp {timestamp:?}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Scrapes until `check` holds, at most 10 s; the last exposition.
fn scrape_until(addr: SocketAddr, what: &str, check: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exposition = scrape(addr);
        if check(&exposition) {
            return exposition;
        }
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn the_numbers_move_by_exactly_what_was_done() {
    let mut daemon = Served::start(&["--metrics-top-sessions", "1"]);
    let mut client = daemon.client().await;
    let before = scrape(daemon.metrics);
    assert_eq!(
        before.get("ctxbroker_admissions_total", &[("outcome", "admitted")]),
        0.0
    );
    assert_eq!(before.get("ctxbroker_sessions", &[]), 0.0);

    create(&mut client, "m", window(400)).await;
    create(&mut client, "small", window(4000)).await;

    // Tool output until the budget forces compactions at admission.
    let mut admitted = 0u64;
    let mut tokens = 0u64;
    let mut compactions = 0u64;
    for turn in 0..24u64 {
        let text = format!("tool run {turn}: {}", prose(turn, &["build", "cache"], 60));
        let reply = admit(&mut client, "m", vec![span(Role::Tool, &text)])
            .await
            .expect("a turn that fits after compaction is admitted");
        admitted += 1;
        tokens += reply.spans.iter().map(|s| u64::from(s.tokens)).sum::<u64>();
        if let Some(marker) = reply.compaction {
            assert_eq!(marker.trigger(), pb::CompactionTrigger::HardBudget);
            assert_eq!(marker.outcome(), pb::CompactionOutcome::Committed);
            compactions += 1;
        }
    }
    assert!(compactions >= 1, "the window forces compactions");
    let reply = admit(
        &mut client,
        "small",
        vec![span(Role::User, "one short note")],
    )
    .await
    .unwrap();
    admitted += 1;
    tokens += u64::from(reply.spans[0].tokens);

    // One turn too large for any compaction: an escalation.
    let huge = (0..40)
        .map(|i| prose(900 + i, &["dump"], 80))
        .collect::<Vec<_>>()
        .join(" ");
    let status = admit(&mut client, "m", vec![span(Role::Tool, &huge)])
        .await
        .expect_err("a turn beyond budget - pinned is refused");
    assert_eq!(status.code(), Code::FailedPrecondition);
    // And one refused for another reason.
    let status = admit(&mut client, "nobody", vec![span(Role::User, "hello")])
        .await
        .expect_err("no such session");
    assert_eq!(status.code(), Code::NotFound);

    // A watcher that has read everything.
    let (stream, replayed) = watch_replay(&mut client, 1).await;
    assert_eq!(replayed.len() as u64, compactions + 1);

    let m = session(&mut client, "m").await.totals.unwrap();
    let small = session(&mut client, "small").await.totals.unwrap();

    let metrics = daemon.metrics;
    let after = tokio::task::spawn_blocking(move || {
        scrape_until(metrics, "the watcher caught up", |e| {
            e.value("ctxbroker_watchers", &[]) == Some(1.0)
                && e.value("ctxbroker_watcher_max_lag_markers", &[]) == Some(0.0)
        })
    })
    .await
    .unwrap();

    let admissions = |outcome| after.get("ctxbroker_admissions_total", &[("outcome", outcome)]);
    assert_eq!(admissions("admitted"), admitted as f64);
    assert_eq!(admissions("escalated"), 1.0);
    assert_eq!(admissions("refused"), 1.0);
    assert_eq!(admissions("replayed"), 0.0);
    assert_eq!(
        after.get("ctxbroker_admitted_tokens_total", &[]),
        tokens as f64
    );
    assert_eq!(
        after.get("ctxbroker_admitted_spans_total", &[("class", "narrative")]),
        admitted as f64
    );
    let compactions_of = |trigger, outcome| {
        after.get(
            "ctxbroker_compactions_total",
            &[("trigger", trigger), ("outcome", outcome)],
        )
    };
    assert_eq!(
        compactions_of("HARD_BUDGET", "COMMITTED"),
        compactions as f64
    );
    assert_eq!(compactions_of("HARD_BUDGET", "ABORTED"), 1.0);
    assert_eq!(compactions_of("SOFT_WATERMARK", "COMMITTED"), 0.0);
    assert_eq!(
        after.get("ctxbroker_escalations_total", &[("trigger", "HARD_BUDGET")]),
        1.0
    );
    assert_eq!(
        after.get(
            "ctxbroker_verification_failures_total",
            &[("reason", "TURN_TOO_LARGE")]
        ),
        1.0
    );
    assert!(after.get("ctxbroker_compaction_evicted_spans_total", &[]) >= compactions as f64);
    assert_eq!(
        after.get("ctxbroker_marker_next_seq", &[]),
        (compactions + 2) as f64
    );

    // Sessions: two, and only the top one named.
    assert_eq!(after.get("ctxbroker_sessions", &[]), 2.0);
    assert_eq!(
        after.get("ctxbroker_live_tokens", &[]),
        f64::from(m.live_tokens + small.live_tokens)
    );
    assert_eq!(
        after.get("ctxbroker_session_live_tokens", &[("session_id", "m")]),
        f64::from(m.live_tokens)
    );
    assert_eq!(
        after.get("ctxbroker_session_budget_tokens", &[("session_id", "m")]),
        f64::from(m.budget_tokens)
    );
    assert_eq!(
        after.value("ctxbroker_session_live_tokens", &[("session_id", "small")]),
        None,
        "--metrics-top-sessions 1 names one session"
    );
    let banded: f64 = after
        .samples
        .iter()
        .filter(|s| s.name == "ctxbroker_sessions_by_fill")
        .map(|s| s.value)
        .sum();
    assert_eq!(banded, 2.0);

    // RPC latency by method and code.
    let calls = |method, code| {
        after
            .value(
                "ctxbroker_rpc_duration_seconds_count",
                &[("method", method), ("code", code)],
            )
            .unwrap_or(0.0)
    };
    assert_eq!(calls("Admit", "OK"), admitted as f64);
    assert_eq!(calls("Admit", "FAILED_PRECONDITION"), 1.0);
    assert_eq!(calls("Admit", "NOT_FOUND"), 1.0);
    assert_eq!(calls("CreateSession", "OK"), 2.0);
    assert_eq!(calls("GetSession", "OK"), 2.0);
    assert_eq!(calls("WatchCompactions", "OK"), 1.0);

    // Every write was flushed and timed.
    let flushes = after.get("ctxbroker_store_flush_duration_seconds_count", &[]);
    assert!(flushes >= 1.0);
    assert!(flushes <= after.get("ctxbroker_store_flushes_total", &[]));
    assert!(after.get("ctxbroker_store_writes_total", &[]) >= (admitted + 3) as f64);
    // Each admission wrote at least its span, the span's term row and the
    // session's record; the bytes include every span's text.
    let keys = after.get("ctxbroker_store_keys_written_total", &[]);
    assert!(
        keys >= (3 * admitted) as f64,
        "{keys} keys for {admitted} turns"
    );
    assert!(after.get("ctxbroker_store_bytes_written_total", &[]) > keys);

    // The watcher leaves.
    drop(stream);
    let gone = tokio::task::spawn_blocking(move || {
        scrape_until(metrics, "the watcher left", |e| {
            e.value("ctxbroker_watchers", &[]) == Some(0.0)
        })
    })
    .await
    .unwrap();
    assert_eq!(gone.get("ctxbroker_watcher_max_lag_markers", &[]), 0.0);

    check_dashboard(&after);

    // The endpoint stops with the daemon.
    assert!(daemon.terminate().success());
    assert!(
        TcpStream::connect(daemon.metrics).is_err(),
        "metrics still served after exit"
    );
}

/// The session cache's families: with room for about one session, three
/// sessions taking turns are let go and loaded again, and every load and
/// drop is counted; with the default room, none is let go.
#[tokio::test]
async fn the_session_cache_counts_its_loads_and_drops() {
    for (extra, tight) in [
        (&["--session-cache-bytes", "1"][..], true),
        (&[][..], false),
    ] {
        let daemon = Served::start(extra);
        let mut client = daemon.client().await;
        let ids = ["c0", "c1", "c2"];
        for id in ids {
            create(&mut client, id, window(4000)).await;
        }
        let before = scrape(daemon.metrics);
        let loads_before = before.get("ctxbroker_session_loads_total", &[]);
        let let_go_before = before.get("ctxbroker_sessions_let_go_total", &[]);
        for round in 0..4u64 {
            for id in ids {
                let text = format!("{id} round {round}: {}", prose(round, &["cache"], 20));
                admit(&mut client, id, vec![span(Role::Tool, &text)])
                    .await
                    .unwrap();
            }
        }
        let after = scrape(daemon.metrics);
        let loads = after.get("ctxbroker_session_loads_total", &[]) - loads_before;
        let let_go = after.get("ctxbroker_sessions_let_go_total", &[]) - let_go_before;
        let bytes = after.get("ctxbroker_session_cache_bytes", &[]);
        if tight {
            // Each turn finds its session let go by the turns of the
            // other two, so it is loaded again: 12 turns, 12 loads.
            assert_eq!(loads, 12.0, "tight cache");
            assert!(let_go >= 11.0, "tight cache let go {let_go}");
            assert!(bytes > 0.0, "the session of the last turn is held");
        } else {
            // Created in memory, they stay: nothing to load or let go.
            assert_eq!(loads, 0.0, "roomy cache");
            assert_eq!(let_go + let_go_before, 0.0, "roomy cache");
            assert!(bytes > 0.0);
        }
    }
}

#[tokio::test]
async fn the_endpoint_serves_metrics_only() {
    let daemon = Served::start(&[]);
    let (status, headers, body) = http(daemon.metrics, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 405, "{body}");
    assert_eq!(headers.get("allow").map(String::as_str), Some("GET, HEAD"));
    let (status, _, _) = http(daemon.metrics, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 404);
    let (status, headers, body) = http(daemon.metrics, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.is_empty());
    assert!(headers["content-length"].parse::<usize>().unwrap() > 1000);
    // A query string is no other path.
    let (status, _, body) = http(daemon.metrics, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
    assert_eq!(status, 200);
    Exposition::parse(&body).unwrap();
}

#[test]
fn a_metrics_address_in_use_stops_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            &addr.to_string(),
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env("CTXBROKER_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("metrics address {addr}")),
        "{stderr}"
    );
}

/// The dashboard parses as JSON, every query names only series the daemon
/// exports, and every family the daemon exports has a panel.
fn check_dashboard(exposition: &Exposition) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/ctxbroker.json");
    let text = std::fs::read_to_string(path).unwrap();
    let dashboard = json::parse(&text).unwrap_or_else(|err| panic!("{path}: {err}"));
    let mut exprs = Vec::new();
    dashboard.collect_strings("expr", &mut exprs);
    dashboard.collect_strings("definition", &mut exprs);
    assert!(
        exprs.len() >= 20,
        "the dashboard has {} queries",
        exprs.len()
    );
    let exported = exposition.names();
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr} names no ctxbroker metric");
        for name in names {
            assert!(exported.contains(&name), "{expr}: {name} is not exported");
            used.insert(family_of(&name, &exposition.types).unwrap_or(name));
        }
    }
    let unused: Vec<_> = exposition
        .types
        .keys()
        .filter(|f| !used.contains(*f))
        .collect();
    assert!(unused.is_empty(), "families without a panel: {unused:?}");
    let panels = dashboard
        .get("panels")
        .and_then(json::Value::as_array)
        .unwrap();
    for panel in panels {
        let title = panel
            .get("title")
            .and_then(json::Value::as_str)
            .unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title");
    }
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ctxbroker_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Just enough JSON to read a dashboard: strict RFC 8259 values.
mod json {
    use std::collections::BTreeMap;

    #[derive(Debug)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(f64),
        String(String),
        Array(Vec<Value>),
        Object(BTreeMap<String, Value>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Object(map) => map.get(key),
                _ => None,
            }
        }

        pub fn as_array(&self) -> Option<&Vec<Value>> {
            match self {
                Value::Array(items) => Some(items),
                _ => None,
            }
        }

        pub fn as_f64(&self) -> Option<f64> {
            match self {
                Value::Number(n) => Some(*n),
                _ => None,
            }
        }

        pub fn as_bool(&self) -> Option<bool> {
            match self {
                Value::Bool(b) => Some(*b),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::String(s) => Some(s),
                _ => None,
            }
        }

        /// Every string stored under `key`, anywhere.
        pub fn collect_strings(&self, key: &str, out: &mut Vec<String>) {
            match self {
                Value::Object(map) => {
                    for (k, v) in map {
                        match v {
                            Value::String(s) if k == key => out.push(s.clone()),
                            _ => v.collect_strings(key, out),
                        }
                    }
                }
                Value::Array(items) => items.iter().for_each(|v| v.collect_strings(key, out)),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
            }
        }
    }

    pub fn parse(text: &str) -> Result<Value, String> {
        let mut parser = Parser {
            bytes: text.as_bytes(),
            at: 0,
        };
        let value = parser.value(0)?;
        parser.space();
        if parser.at != parser.bytes.len() {
            return Err(format!("trailing text at byte {}", parser.at));
        }
        Ok(value)
    }

    struct Parser<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    impl Parser<'_> {
        fn space(&mut self) {
            while matches!(self.bytes.get(self.at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
                self.at += 1;
            }
        }

        fn error<T>(&self, what: &str) -> Result<T, String> {
            Err(format!("{what} at byte {}", self.at))
        }

        fn eat(&mut self, literal: &str, value: Value) -> Result<Value, String> {
            if self.bytes[self.at..].starts_with(literal.as_bytes()) {
                self.at += literal.len();
                Ok(value)
            } else {
                self.error("unexpected text")
            }
        }

        fn value(&mut self, depth: usize) -> Result<Value, String> {
            if depth > 64 {
                return self.error("nesting too deep");
            }
            self.space();
            match self.bytes.get(self.at) {
                Some(b'{') => self.object(depth),
                Some(b'[') => self.array(depth),
                Some(b'"') => self.string().map(Value::String),
                Some(b't') => self.eat("true", Value::Bool(true)),
                Some(b'f') => self.eat("false", Value::Bool(false)),
                Some(b'n') => self.eat("null", Value::Null),
                Some(b'-' | b'0'..=b'9') => self.number(),
                _ => self.error("expected a value"),
            }
        }

        fn object(&mut self, depth: usize) -> Result<Value, String> {
            self.at += 1;
            let mut map = BTreeMap::new();
            self.space();
            if self.bytes.get(self.at) == Some(&b'}') {
                self.at += 1;
                return Ok(Value::Object(map));
            }
            loop {
                self.space();
                if self.bytes.get(self.at) != Some(&b'"') {
                    return self.error("expected a key");
                }
                let key = self.string()?;
                self.space();
                if self.bytes.get(self.at) != Some(&b':') {
                    return self.error("expected ':'");
                }
                self.at += 1;
                let value = self.value(depth + 1)?;
                if map.insert(key, value).is_some() {
                    return self.error("duplicate key");
                }
                self.space();
                match self.bytes.get(self.at) {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        return Ok(Value::Object(map));
                    }
                    _ => return self.error("expected ',' or '}'"),
                }
            }
        }

        fn array(&mut self, depth: usize) -> Result<Value, String> {
            self.at += 1;
            let mut items = Vec::new();
            self.space();
            if self.bytes.get(self.at) == Some(&b']') {
                self.at += 1;
                return Ok(Value::Array(items));
            }
            loop {
                items.push(self.value(depth + 1)?);
                self.space();
                match self.bytes.get(self.at) {
                    Some(b',') => self.at += 1,
                    Some(b']') => {
                        self.at += 1;
                        return Ok(Value::Array(items));
                    }
                    _ => return self.error("expected ',' or ']'"),
                }
            }
        }

        fn string(&mut self) -> Result<String, String> {
            self.at += 1;
            let mut out = String::new();
            loop {
                let start = self.at;
                while !matches!(self.bytes.get(self.at), Some(b'"' | b'\\') | None) {
                    if self.bytes[self.at] < 0x20 {
                        return self.error("control character in a string");
                    }
                    self.at += 1;
                }
                out.push_str(
                    std::str::from_utf8(&self.bytes[start..self.at]).map_err(|e| e.to_string())?,
                );
                match self.bytes.get(self.at) {
                    Some(b'"') => {
                        self.at += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.at += 1;
                        let escaped = match self.bytes.get(self.at) {
                            Some(b'"') => '"',
                            Some(b'\\') => '\\',
                            Some(b'/') => '/',
                            Some(b'b') => '\u{8}',
                            Some(b'f') => '\u{c}',
                            Some(b'n') => '\n',
                            Some(b'r') => '\r',
                            Some(b't') => '\t',
                            Some(b'u') => {
                                let hex = self
                                    .bytes
                                    .get(self.at + 1..self.at + 5)
                                    .and_then(|h| std::str::from_utf8(h).ok())
                                    .and_then(|h| u32::from_str_radix(h, 16).ok());
                                let Some(code) = hex else {
                                    return self.error("bad \\u escape");
                                };
                                self.at += 4;
                                // Surrogate halves stand for themselves here:
                                // a dashboard has no use for them.
                                char::from_u32(code).unwrap_or('\u{fffd}')
                            }
                            _ => return self.error("bad escape"),
                        };
                        self.at += 1;
                        out.push(escaped);
                    }
                    _ => return self.error("unterminated string"),
                }
            }
        }

        fn number(&mut self) -> Result<Value, String> {
            let start = self.at;
            while matches!(
                self.bytes.get(self.at),
                Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
            ) {
                self.at += 1;
            }
            let text =
                std::str::from_utf8(&self.bytes[start..self.at]).map_err(|e| e.to_string())?;
            let leading_zero = text.trim_start_matches('-').starts_with('0')
                && text.trim_start_matches('-').len() > 1
                && !text.trim_start_matches('-')[1..].starts_with(['.', 'e', 'E']);
            match text.parse::<f64>() {
                Ok(n) if !leading_zero && !text.ends_with('.') && !text.starts_with('+') => {
                    Ok(Value::Number(n))
                }
                _ => self.error("bad number"),
            }
        }
    }

    #[test]
    fn the_parser_takes_json_and_refuses_what_is_not() {
        let value = parse(r#"{"a": [1, -2.5e3, true, null, "x\"\u0041\n"], "b": {}}"#).unwrap();
        let mut strings = Vec::new();
        value.collect_strings("b", &mut strings);
        assert!(strings.is_empty());
        let a = value.get("a").and_then(Value::as_array).unwrap();
        assert_eq!(a.len(), 5);
        assert_eq!(a[1].as_f64(), Some(-2500.0));
        assert_eq!(a[2].as_bool(), Some(true));
        assert_eq!(a[4].as_str(), Some("x\"A\n"));
        for bad in [
            "{\"a\": 1,}",
            "[1 2]",
            "{\"a\" 1}",
            "\"open",
            "01",
            "{\"a\":1}{",
            "{\"a\":1,\"a\":2}",
            "[+1]",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

#[test]
fn the_exposition_checker_refuses_broken_text() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n";
    Exposition::parse(ok).unwrap();
    for bad in [
        // No HELP/TYPE.
        "a_total 1\n",
        // A counter without _total.
        "# HELP a A.\n# TYPE a counter\na 1\n",
        // Samples of a family split by another.
        "# HELP a A.\n# TYPE a gauge\na 1\n# HELP b B.\n# TYPE b gauge\nb 1\na{x=\"2\"} 1\n",
        // Buckets not cumulative.
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        // +Inf differs from the count.
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
        // A repeated series.
        "# HELP g G.\n# TYPE g gauge\ng 1\ng 2\n",
        // An unterminated label value.
        "# HELP g G.\n# TYPE g gauge\ng{x=\"1} 2\n",
    ] {
        assert!(Exposition::parse(bad).is_err(), "{bad}");
    }
}
