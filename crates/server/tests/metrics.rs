//! The metrics in process: the admission hook behind the real service,
//! the store's commit and flush hooks, watcher lag against a feed that is
//! not read, bounded per-session series, RPC timing by method and code,
//! and the HTTP endpoint's edges.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use ctxbroker_core::SessionConfig;
use ctxbroker_proto::v1 as pb;
use ctxbroker_proto::v1::context_broker_server::ContextBroker;
use ctxbroker_server::BuildInfo;
use ctxbroker_server::broker::Broker;
use ctxbroker_server::config::{Durability, Limits};
use ctxbroker_server::convert;
use ctxbroker_server::hub::{FeedEvent, FeedStart, Hub, MarkerFeed};
use ctxbroker_server::metrics::{Metrics, Timed};
use ctxbroker_server::service::BrokerService;
use ctxbroker_store::{Store, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tonic::Request;
use tonic::codegen::{Service, http};

const BUILD: BuildInfo = BuildInfo {
    version: "test",
    git_commit: "test",
    contract_digest: "test",
};

/// A store whose hooks feed `metrics` and `hub`, as the daemon wires them.
fn store(dir: &std::path::Path, metrics: &Arc<Metrics>, hub: &Hub) -> Store {
    let counted = metrics.clone();
    let flushes = metrics.clone();
    let publish = hub.clone();
    Store::open(
        dir,
        StoreOptions {
            on_commit: Some(Arc::new(move |markers| {
                counted.markers(markers);
                publish.publish(markers);
            })),
            on_flush: Some(Arc::new(move |took| flushes.flushed(took))),
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// The value of one series, written exactly as the exposition writes it.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// The exposition, rendered off the runtime as the endpoint renders it
/// (a scrape reads the store).
fn render(metrics: &Metrics, store: &Store) -> String {
    std::thread::scope(|scope| scope.spawn(|| metrics.render(store)).join())
        .unwrap()
        .unwrap()
}

fn tool(text: String) -> pb::SpanInput {
    pb::SpanInput {
        role: pb::Role::Tool as i32,
        text,
        ..Default::default()
    }
}

async fn admit(
    service: &BrokerService,
    id: &str,
    text: String,
) -> Result<pb::AdmitResponse, tonic::Status> {
    service
        .admit(Request::new(pb::AdmitRequest {
            session_id: id.into(),
            spans: vec![tool(text)],
        }))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn the_service_and_the_store_count_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 10));
    let hub = Hub::new();
    let store = store(dir.path(), &metrics, &hub);
    let broker = Arc::new(Broker::new(store.clone(), Limits::default()));
    let service = BrokerService::new(
        broker.clone(),
        hub,
        CancellationToken::new(),
        BUILD,
        Durability::Flush,
    )
    .with_metrics(metrics.clone());
    let mut config = SessionConfig::with_window(400);
    // No background pre-compaction: every marker comes from an admission.
    config.soft_watermark = 1.0;
    broker.create_session("s", config).await.unwrap();

    let mut compactions = 0.0;
    let mut tokens = 0.0;
    for turn in 0..20 {
        let reply = admit(
            &service,
            "s",
            format!("tool run {turn}: {}", "compiler output line ".repeat(10)),
        )
        .await
        .unwrap();
        tokens += f64::from(reply.spans[0].tokens);
        if reply.compaction.is_some() {
            compactions += 1.0;
        }
    }
    assert!(compactions >= 1.0);
    let escalated = admit(&service, "s", "word ".repeat(2000))
        .await
        .unwrap_err();
    assert_eq!(escalated.code(), tonic::Code::FailedPrecondition);
    let refused = admit(&service, "", "x".into()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // Markers reach the metrics after the replies are sent: wait (bounded)
    // until the last one, the escalation's, is counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut text = render(&metrics, &store);
    while value(
        &text,
        "ctxbroker_escalations_total{trigger=\"HARD_BUDGET\"}",
    ) != Some(1.0)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        text = render(&metrics, &store);
    }
    let get = |series: &str| value(&text, series).unwrap_or_else(|| panic!("{series}\n{text}"));
    assert_eq!(
        get("ctxbroker_admissions_total{outcome=\"admitted\"}"),
        20.0
    );
    assert_eq!(
        get("ctxbroker_admissions_total{outcome=\"escalated\"}"),
        1.0
    );
    assert_eq!(get("ctxbroker_admissions_total{outcome=\"refused\"}"), 1.0);
    assert_eq!(get("ctxbroker_admitted_tokens_total"), tokens);
    assert_eq!(
        get("ctxbroker_compactions_total{trigger=\"HARD_BUDGET\",outcome=\"COMMITTED\"}"),
        compactions
    );
    assert_eq!(
        get("ctxbroker_compactions_total{trigger=\"HARD_BUDGET\",outcome=\"ABORTED\"}"),
        1.0
    );
    assert_eq!(
        get("ctxbroker_escalations_total{trigger=\"HARD_BUDGET\"}"),
        1.0
    );
    assert_eq!(
        get("ctxbroker_verification_failures_total{reason=\"TURN_TOO_LARGE\"}"),
        1.0
    );
    let live = broker.session("s").await.unwrap().live_tokens as f64;
    assert_eq!(get("ctxbroker_session_live_tokens{session_id=\"s\"}"), live);
    assert_eq!(get("ctxbroker_live_tokens"), live);
    // Every acknowledged write was flushed first, and each flush timed.
    let flushed = get("ctxbroker_store_flush_duration_seconds_count");
    assert!(flushed >= 1.0);
    assert_eq!(flushed, get("ctxbroker_store_flushes_total"));
    store.close().unwrap();
}

#[tokio::test]
async fn a_watch_that_is_not_read_shows_its_lag_and_its_fall_back_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 10));
    // A ring of two: a watcher three markers behind must go to the log.
    let hub = Hub::with_ring(2);
    let store = store(dir.path(), &metrics, &hub);
    let broker = Broker::new(store.clone(), Limits::default());
    broker
        .create_session("w", SessionConfig::with_window(400))
        .await
        .unwrap();
    let mut feed = MarkerFeed::open(&hub, store.clone(), FeedStart::Now, None).unwrap();
    feed.track(metrics.watcher(feed.next_seq()));
    let text = render(&metrics, &store);
    assert_eq!(value(&text, "ctxbroker_watchers"), Some(1.0));
    assert_eq!(value(&text, "ctxbroker_watcher_max_lag_markers"), Some(0.0));

    let mut turn = 0;
    while store.marker_bounds().next < 6 {
        turn += 1;
        broker
            .admit(
                "w",
                convert::turn_from_pb(vec![tool(format!(
                    "run {turn}: {}",
                    "linker output ".repeat(12)
                ))]),
            )
            .await
            .unwrap();
    }
    let head = store.marker_bounds().next;
    let text = render(&metrics, &store);
    assert_eq!(
        value(&text, "ctxbroker_watcher_max_lag_markers"),
        Some((head - 1) as f64),
        "the feed has taken nothing since marker 1 was next"
    );
    assert_eq!(value(&text, "ctxbroker_watchers_lagging"), Some(1.0));

    // Reading catches up, through the log.
    let mut taken = 0;
    while taken < head - 1 {
        if let FeedEvent::Marker(_) = feed.next_event().await.unwrap() {
            taken += 1;
        }
    }
    // The position moves when the feed is next asked: read until it waits.
    loop {
        match tokio::time::timeout(Duration::from_millis(50), feed.next_event()).await {
            Err(_) => break,
            Ok(Ok(FeedEvent::CaughtUp(_))) => continue,
            Ok(other) => panic!("nothing more to read: {other:?}"),
        }
    }
    let text = render(&metrics, &store);
    assert_eq!(value(&text, "ctxbroker_watcher_max_lag_markers"), Some(0.0));
    assert_eq!(value(&text, "ctxbroker_watchers_lagging"), Some(0.0));
    assert!(value(&text, "ctxbroker_watcher_log_fallbacks_total").unwrap() >= 1.0);

    drop(feed);
    let text = render(&metrics, &store);
    assert_eq!(value(&text, "ctxbroker_watchers"), Some(0.0));
    store.close().unwrap();
}

#[tokio::test]
async fn only_the_top_sessions_are_named_most_live_first() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 2));
    let hub = Hub::new();
    let store = store(dir.path(), &metrics, &hub);
    let broker = Broker::new(store.clone(), Limits::default());
    // Live tokens grow with the number of turns: e gets the most, then d.
    for (i, id) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        broker
            .create_session(id, SessionConfig::with_window(100_000))
            .await
            .unwrap();
        for turn in 0..=i {
            broker
                .admit(
                    id,
                    convert::turn_from_pb(vec![tool(format!("{id} {turn}: some text"))]),
                )
                .await
                .unwrap();
        }
    }
    let text = render(&metrics, &store);
    let named: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ctxbroker_session_live_tokens{"))
        .collect();
    assert_eq!(named.len(), 2, "{text}");
    assert!(named[0].starts_with("ctxbroker_session_live_tokens{session_id=\"e\"}"));
    assert!(named[1].starts_with("ctxbroker_session_live_tokens{session_id=\"d\"}"));
    assert_eq!(value(&text, "ctxbroker_sessions"), Some(5.0));
    assert_eq!(
        value(&text, "ctxbroker_sessions_by_fill{fill=\"0.0-0.5\"}"),
        Some(5.0)
    );

    let none = Metrics::new(BUILD, 0);
    let text = render(&none, &store);
    assert!(!text.contains("ctxbroker_session_live_tokens{"), "{text}");
    store.close().unwrap();
}

/// A service that answers at once with a fixed `grpc-status` header (none
/// for OK), or never.
#[derive(Clone)]
enum Fixed {
    Status(Option<&'static str>),
    Never,
}

impl Service<http::Request<()>> for Fixed {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<()>, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: http::Request<()>) -> Self::Future {
        match self {
            Fixed::Status(code) => {
                let mut response = http::Response::new(());
                if let Some(code) = code {
                    response
                        .headers_mut()
                        .insert("grpc-status", http::HeaderValue::from_static(code));
                }
                Box::pin(std::future::ready(Ok(response)))
            }
            Fixed::Never => Box::pin(std::future::pending()),
        }
    }
}

fn request(method: &str, timeout: Option<&'static str>) -> http::Request<()> {
    let mut request = http::Request::builder()
        .uri(format!("/ctxbroker.v1.ContextBroker/{method}"))
        .body(())
        .unwrap();
    if let Some(timeout) = timeout {
        request
            .headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static(timeout));
    }
    request
}

#[tokio::test]
async fn calls_are_timed_by_method_and_code() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 10));
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let timeout = Duration::from_secs(30);
    let mut ok = Timed::new(Fixed::Status(None), metrics.clone(), timeout);
    let mut refused = Timed::new(Fixed::Status(Some("9")), metrics.clone(), timeout);
    let mut never = Timed::new(Fixed::Never, metrics.clone(), timeout);
    for _ in 0..3 {
        ok.call(request("Admit", None)).await.unwrap();
    }
    refused.call(request("Admit", None)).await.unwrap();
    ok.call(request("NoSuchMethod", None)).await.unwrap();
    // Dropped before answering: the client went away, or its deadline
    // (1 ns) passed.
    let pending = never.call(request("GetContext", None));
    assert!(
        tokio::time::timeout(Duration::from_millis(10), pending)
            .await
            .is_err()
    );
    let late = never.call(request("GetContext", Some("1n")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(late);

    let text = render(&metrics, &store);
    let count = |method: &str, code: &str| {
        value(
            &text,
            &format!("ctxbroker_rpc_duration_seconds_count{{method=\"{method}\",code=\"{code}\"}}"),
        )
    };
    assert_eq!(count("Admit", "OK"), Some(3.0));
    assert_eq!(count("Admit", "FAILED_PRECONDITION"), Some(1.0));
    assert_eq!(count("other", "OK"), Some(1.0));
    assert_eq!(count("GetContext", "CANCELLED"), Some(1.0));
    assert_eq!(count("GetContext", "DEADLINE_EXCEEDED"), Some(1.0));
    // Pairs that never happened are not written.
    assert_eq!(count("Admit", "NOT_FOUND"), None);
    store.close().unwrap();
}

#[tokio::test]
async fn calls_refused_at_the_door_are_counted_by_method_and_code() {
    use ctxbroker_server::auth::{AuthLayer, Tokens};
    use tower::Layer;
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 10));
    let store = Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let digest = ctxbroker_server::auth::token_sha256_hex("watcher-token-0123456789");
    std::fs::write(
        &tokens,
        format!("[[token]]\nid = \"dash\"\nrole = \"watcher\"\ntenant = \"acme\"\nsha256 = \"{digest}\"\n"),
    )
    .unwrap();
    let layer = AuthLayer::new(Some(Arc::new(Tokens::load(&tokens).unwrap())))
        .with_metrics(metrics.clone());
    let mut service = layer.layer(Timed::new(
        Fixed::Status(None),
        metrics.clone(),
        Duration::from_secs(30),
    ));
    let with_token = |method: &str| {
        let mut request = request(method, None);
        request.headers_mut().insert(
            "authorization",
            http::HeaderValue::from_static("Bearer watcher-token-0123456789"),
        );
        request
    };
    service.call(request("GetSession", None)).await.unwrap();
    service.call(with_token("Admit")).await.unwrap();
    service.call(with_token("Admit")).await.unwrap();
    service.call(with_token("GetSession")).await.unwrap();

    let text = render(&metrics, &store);
    let count = |method: &str, code: &str| {
        value(
            &text,
            &format!("ctxbroker_rpc_duration_seconds_count{{method=\"{method}\",code=\"{code}\"}}"),
        )
    };
    assert_eq!(count("GetSession", "UNAUTHENTICATED"), Some(1.0));
    assert_eq!(count("Admit", "PERMISSION_DENIED"), Some(2.0));
    assert_eq!(
        count("GetSession", "OK"),
        Some(1.0),
        "the call let through is timed once"
    );
    store.close().unwrap();
}

#[test]
fn the_store_reports_every_flush() {
    let dir = tempfile::tempdir().unwrap();
    let flushes = Arc::new(AtomicU64::new(0));
    let seen = flushes.clone();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            on_flush: Some(Arc::new(move |took: Duration| {
                assert!(took < Duration::from_secs(60));
                seen.fetch_add(1, Ordering::Relaxed);
            })),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::new(store.clone(), Limits::default());
    runtime.block_on(async {
        for id in ["x", "y", "z"] {
            broker
                .create_session(id, SessionConfig::with_window(1000))
                .await
                .unwrap();
        }
    });
    // Each acknowledged write waited for a flush that was reported first.
    let reported = flushes.load(Ordering::Relaxed);
    assert!(reported >= 1);
    assert!(reported <= store.stats().flushes);
    store.close().unwrap();
}

async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before all of a large request is
    // written; what it answered is what counts.
    let _ = stream.write_all(request).await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn the_endpoint_answers_its_edges_and_stops_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 10));
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(ctxbroker_server::metrics::serve(
        listener,
        metrics.clone(),
        store.clone(),
        shutdown.clone(),
        ctxbroker_server::metrics::EndpointOptions::default(),
        None,
    ));

    let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("# TYPE ctxbroker_admissions_total counter\n"));

    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let refused = exchange(addr, huge.as_bytes()).await;
    assert!(refused.starts_with("HTTP/1.1 431 "), "{refused}");

    let garbage = exchange(addr, b"BREW\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400 "), "{garbage}");

    let put = exchange(addr, b"PUT /metrics HTTP/1.1\r\n\r\n").await;
    assert!(put.starts_with("HTTP/1.1 405 "), "{put}");
    // Header names are case-insensitive (hyper writes them in lower case).
    let allow = put.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("allow").then(|| value.trim())
    });
    assert_eq!(allow, Some("GET, HEAD"), "{put}");

    let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{head}"
    );
    assert!(
        head.ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {head}"
    );
    let root = exchange(addr, b"GET /?x HTTP/1.1\r\n\r\n").await;
    assert!(root.starts_with("HTTP/1.1 200 OK\r\n"), "{root}");
    let missing = exchange(addr, b"GET /metrics/x HTTP/1.1\r\n\r\n").await;
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");

    // A client that never sends its request does not hold the shutdown.
    let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("the endpoint stops on shutdown")
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    store.close().unwrap();
}

/// Every family the exposition exports, with its type: a family dropped,
/// renamed or retyped fails here. The list was taken from the exposition
/// before the registry moved to prometheus-client.
const FAMILIES: &[(&str, &str)] = &[
    ("ctxbroker_admissions_total", "counter"),
    ("ctxbroker_admitted_spans_total", "counter"),
    ("ctxbroker_admitted_tokens_total", "counter"),
    ("ctxbroker_anchors_dropped_total", "counter"),
    ("ctxbroker_build_info", "gauge"),
    ("ctxbroker_compaction_evicted_spans_total", "counter"),
    ("ctxbroker_compaction_reclaimed_tokens_total", "counter"),
    ("ctxbroker_compactions_total", "counter"),
    ("ctxbroker_escalations_total", "counter"),
    ("ctxbroker_live_tokens", "gauge"),
    ("ctxbroker_marker_next_seq", "gauge"),
    ("ctxbroker_pinned_tokens", "gauge"),
    ("ctxbroker_rpc_duration_seconds", "histogram"),
    ("ctxbroker_scrape_duration_seconds", "gauge"),
    ("ctxbroker_session_budget_tokens", "gauge"),
    ("ctxbroker_session_cache_bytes", "gauge"),
    ("ctxbroker_session_live_tokens", "gauge"),
    ("ctxbroker_session_loads_total", "counter"),
    ("ctxbroker_sessions", "gauge"),
    ("ctxbroker_sessions_by_fill", "gauge"),
    ("ctxbroker_sessions_let_go_total", "counter"),
    ("ctxbroker_start_time_seconds", "gauge"),
    ("ctxbroker_store_batches_total", "counter"),
    ("ctxbroker_store_blob_syncs_total", "counter"),
    ("ctxbroker_store_writes_applied_by_caller_total", "counter"),
    ("ctxbroker_store_bytes_written_total", "counter"),
    ("ctxbroker_store_flush_duration_seconds", "histogram"),
    ("ctxbroker_store_flushes_total", "counter"),
    ("ctxbroker_store_keys_read_total", "counter"),
    ("ctxbroker_store_keys_removed_total", "counter"),
    ("ctxbroker_store_keys_written_total", "counter"),
    ("ctxbroker_store_queued_writes", "gauge"),
    ("ctxbroker_store_rejected_writes_total", "counter"),
    ("ctxbroker_store_writes_total", "counter"),
    ("ctxbroker_verification_failures_total", "counter"),
    ("ctxbroker_watcher_log_fallbacks_total", "counter"),
    ("ctxbroker_watcher_max_lag_markers", "gauge"),
    ("ctxbroker_watchers", "gauge"),
    ("ctxbroker_watchers_lagging", "gauge"),
];

#[tokio::test]
async fn the_exposition_exports_exactly_the_known_families() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new(BUILD, 10));
    let hub = Hub::new();
    let store = store(dir.path(), &metrics, &hub);
    let broker = Broker::new(store.clone(), Limits::default());
    broker
        .create_session("g", SessionConfig::with_window(1000))
        .await
        .unwrap();
    broker
        .admit(
            "g",
            convert::turn_from_pb(vec![tool("a short tool output".into())]),
        )
        .await
        .unwrap();
    let feed = MarkerFeed::open(&hub, store.clone(), FeedStart::Now, None).unwrap();
    let _probe = metrics.watcher(feed.next_seq());
    let mut timed = Timed::new(
        Fixed::Status(None),
        metrics.clone(),
        Duration::from_secs(30),
    );
    timed.call(request("Admit", None)).await.unwrap();

    let text = render(&metrics, &store);
    let mut types = std::collections::BTreeMap::new();
    let mut helps = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(types.insert(name, kind).is_none(), "{name} twice\n{text}");
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            assert!(!help.trim().is_empty(), "{name} has no help");
            helps.insert(name);
        }
    }
    let want: std::collections::BTreeMap<&str, &str> = FAMILIES.iter().copied().collect();
    assert_eq!(types, want, "\n{text}");
    assert_eq!(
        helps,
        want.keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
    );
    // Every family has samples: a family without any would say nothing.
    for (family, _) in FAMILIES {
        assert!(
            text.lines()
                .any(|l| !l.starts_with('#') && l.starts_with(family)),
            "{family} has no sample\n{text}"
        );
    }
    if let Ok(path) = std::env::var("CTXBROKER_DUMP_EXPOSITION") {
        std::fs::write(path, &text).unwrap();
    }
    store.close().unwrap();
}
