//! Connection hardening (docs/security.md): silent connections are closed
//! at the handshake deadline, the connection cap refuses past it while
//! serving the others, and slow clients cannot keep a scrape out of the
//! metrics endpoint.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::inproc::{Ca, InProcess, ServerFiles, eventually, raise_fd_limit};

/// Waits until the server closes `stream` (end of file or reset), at most
/// `within`; how long that took.
async fn closed_within(mut stream: TcpStream, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return Err(format!("still open after {within:?}")),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(started.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

async fn connect_many(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(TcpStream::connect(addr).await.unwrap());
    }
    streams
}

async fn answers(addr: SocketAddr) -> bool {
    let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await
    else {
        return false;
    };
    ContextBrokerClient::new(channel)
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .is_ok()
}

/// Silent clients count against `n` closes: each must be closed, none
/// less than `at_least` after `since` (taken before the first of them
/// connected, so every server-side deadline started after it), all
/// within `within`.
async fn all_closed(streams: Vec<TcpStream>, since: Instant, at_least: Duration, within: Duration) {
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            tokio::spawn(
                async move { closed_within(stream, within).await.map(|_| since.elapsed()) },
            )
        })
        .collect();
    let mut earliest = Duration::MAX;
    for task in tasks {
        let took = task.await.unwrap().expect("closed by the server");
        earliest = earliest.min(took);
    }
    assert!(
        earliest >= at_least,
        "closed after {earliest:?}, before the deadline: refused rather than timed out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_that_never_speak_are_closed_at_the_handshake_deadline() {
    raise_fd_limit();
    let daemon = InProcess::start(&["--handshake-timeout-ms", "1500"]).await;
    let since = Instant::now();
    let silent = connect_many(daemon.addr, 1000).await;
    // Served meanwhile.
    assert!(answers(daemon.addr).await);
    all_closed(
        silent,
        since,
        Duration::from_millis(1000),
        Duration::from_secs(20),
    )
    .await;
    assert!(answers(daemon.addr).await);

    // TLS: a handshake never started, and one left half-done, are closed too.
    let ca = Ca::new("ca");
    let files = ServerFiles::new(&ca);
    let daemon = InProcess::start(&[
        "--tls-cert",
        &files.cert(),
        "--tls-key",
        &files.key(),
        "--handshake-timeout-ms",
        "1500",
    ])
    .await;
    let since = Instant::now();
    let mut silent = connect_many(daemon.addr, 100).await;
    // A ClientHello's record header and nothing more.
    silent[0]
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    all_closed(
        silent,
        since,
        Duration::from_millis(1000),
        Duration::from_secs(20),
    )
    .await;
    crate::inproc::tls_call(daemon.addr, &ca.pem, None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_refuses_past_it_while_serving_the_others() {
    let daemon =
        InProcess::start(&["--max-connections", "4", "--handshake-timeout-ms", "60000"]).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut client = daemon.client().await;
        client
            .get_server_info(pb::GetServerInfoRequest {})
            .await
            .unwrap();
        clients.push(client);
    }
    // Every slot is held by a connection that spoke: the fifth is closed
    // at once (long before the handshake deadline).
    let fifth = TcpStream::connect(daemon.addr).await.unwrap();
    closed_within(fifth, Duration::from_secs(10))
        .await
        .expect("refused past the cap");
    assert!(!answers(daemon.addr).await, "a fifth connection was served");
    for client in &mut clients {
        client
            .get_server_info(pb::GetServerInfoRequest {})
            .await
            .expect("the four keep being served");
    }
    // A slot freed is taken again.
    clients.pop();
    eventually(Duration::from_secs(10), "a freed slot serves", || {
        answers(daemon.addr)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_give_way_to_a_client_that_speaks() {
    let daemon =
        InProcess::start(&["--max-connections", "4", "--handshake-timeout-ms", "60000"]).await;
    let mut silent = connect_many(daemon.addr, 4).await;
    let oldest = silent.remove(0);
    assert!(answers(daemon.addr).await, "a client was kept out");
    closed_within(oldest, Duration::from_secs(10))
        .await
        .expect("the oldest silent connection gave way");
}

/// An HTTP GET of `path` on `addr`: the status line and the body.
async fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|err| err.to_string())?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .map_err(|err| err.to_string())?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .await
        .map_err(|err| err.to_string())?;
    Ok(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_succeeds_while_500_slow_clients_hold_metrics_connections() {
    raise_fd_limit();
    // The header deadline is long: the scrape must not wait for it.
    let daemon = InProcess::start(&[
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-header-timeout-ms",
        "60000",
    ])
    .await;
    let metrics = daemon.metrics.unwrap();
    let mut slow = connect_many(metrics, 500).await;
    for stream in &mut slow {
        // Half a request head, never finished.
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Ag")
            .await
            .unwrap();
    }
    let started = Instant::now();
    let scraped = tokio::time::timeout(Duration::from_secs(10), get(metrics, "/metrics"))
        .await
        .expect("the scrape answered within 10 s")
        .unwrap();
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    assert!(scraped.contains("ctxbroker_build"), "{scraped}");
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_client_that_never_finishes_its_request_head_is_closed() {
    let ca = Ca::new("ca");
    let files = ServerFiles::new(&ca);
    let daemon = InProcess::start(&[
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-header-timeout-ms",
        "800",
    ])
    .await;
    let metrics = daemon.metrics.unwrap();
    let mut slow = TcpStream::connect(metrics).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost")
        .await
        .unwrap();
    let silent = TcpStream::connect(metrics).await.unwrap();
    let (slow, silent) = tokio::join!(
        closed_within(slow, Duration::from_secs(10)),
        closed_within(silent, Duration::from_secs(10))
    );
    for took in [slow, silent] {
        let took = took.expect("closed at the header deadline");
        assert!(took >= Duration::from_millis(500), "{took:?}");
    }

    // Over TLS, with the gRPC files.
    let daemon = InProcess::start(&[
        "--tls-cert",
        &files.cert(),
        "--tls-key",
        &files.key(),
        "--metrics-tls",
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-header-timeout-ms",
        "800",
    ])
    .await;
    let metrics = daemon.metrics.unwrap();
    let plain = get(metrics, "/metrics").await.unwrap_or_default();
    assert!(
        !plain.contains("ctxbroker_build"),
        "plaintext scrape answered"
    );
    let silent = TcpStream::connect(metrics).await.unwrap();
    closed_within(silent, Duration::from_secs(10))
        .await
        .expect("a silent TLS client is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_answering_pings_is_closed() {
    let daemon = InProcess::start(&[
        "--http2-keepalive-interval-ms",
        "300",
        "--http2-keepalive-timeout-ms",
        "300",
    ])
    .await;
    // An HTTP/2 client that says hello (the preface and an empty SETTINGS
    // frame) and then never answers anything, pings included.
    let mut mute = TcpStream::connect(daemon.addr).await.unwrap();
    mute.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    mute.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let took = closed_within(mute, Duration::from_secs(10))
        .await
        .expect("closed once a ping went unanswered");
    assert!(took >= Duration::from_millis(300), "{took:?}");
}
