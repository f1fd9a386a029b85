//! TLS, mutual TLS, reloading the certificate, and the plaintext rule
//! (docs/security.md). Certificates are made here, at test time.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;

use crate::inproc::{Ca, InProcess, ServerFiles, handshake, tls_call, tls_channel};
use crate::support::{admit, span, watch_replay, window};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_with_the_right_ca_and_fails_with_a_wrong_one() {
    let ca = Ca::new("ctxbroker test CA");
    let stranger = Ca::new("another CA");
    let files = ServerFiles::new(&ca);
    let daemon = InProcess::start(&["--tls-cert", &files.cert(), "--tls-key", &files.key()]).await;

    tls_call(daemon.addr, &ca.pem, None)
        .await
        .expect("a client trusting the server's CA connects");
    let err = tls_call(daemon.addr, &stranger.pem, None)
        .await
        .expect_err("a client trusting another CA is refused");
    assert!(err.to_lowercase().contains("certificate"), "{err}");

    let (presented, alpn) = handshake(daemon.addr, &ca.pem).await.unwrap();
    assert_eq!(presented, files.der);
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "ALPN agrees on h2");

    // Plaintext to the TLS port gets nowhere.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", daemon.addr))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(channel) = plain {
        let answer = ContextBrokerClient::new(channel)
            .get_server_info(pb::GetServerInfoRequest {})
            .await;
        assert!(answer.is_err(), "plaintext was answered on the TLS port");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate_from_its_ca() {
    let ca = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let stranger = Ca::new("another client CA");
    let files = ServerFiles::new(&ca);
    let client_ca = files.path("clients.pem");
    std::fs::write(&client_ca, &clients.pem).unwrap();
    let daemon = InProcess::start(&[
        "--tls-cert",
        &files.cert(),
        "--tls-key",
        &files.key(),
        "--tls-client-ca",
        &client_ca.display().to_string(),
    ])
    .await;

    let err = tls_call(daemon.addr, &ca.pem, None)
        .await
        .expect_err("a client without a certificate is refused");
    assert!(!err.is_empty());
    let (cert, key, _) = clients.leaf("agent-1");
    tls_call(daemon.addr, &ca.pem, Some((&cert, &key)))
        .await
        .expect("a client with a certificate from the client CA is served");
    let (cert, key, _) = stranger.leaf("intruder");
    tls_call(daemon.addr, &ca.pem, Some((&cert, &key)))
        .await
        .expect_err("a client with a certificate from another CA is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_the_new_certificate_to_new_connections_and_keeps_open_ones() {
    let first = Ca::new("first CA");
    let second = Ca::new("second CA");
    let mut files = ServerFiles::new(&first);
    let mut daemon = InProcess::start(&[
        "--tls-cert",
        &files.cert(),
        "--tls-key",
        &files.key(),
        "--shutdown-grace-ms",
        "2000",
    ])
    .await;
    let old = files.der.clone();

    // A connection opened before the reload, with a watch on it.
    let channel = tls_channel(daemon.addr, &first.pem, None).await.unwrap();
    let mut before = ContextBrokerClient::new(channel);
    crate::support::create(&mut before, "s", window(400)).await;
    let (mut watch, replayed) = watch_replay(&mut before, 1).await;
    assert!(replayed.is_empty());

    files.replace(&second);
    assert!(matches!(daemon.control.reload(), Ok(true)));

    // New connections see the new certificate: the second CA works, the
    // first no longer does.
    let (presented, _) = handshake(daemon.addr, &second.pem).await.unwrap();
    assert_eq!(presented, files.der);
    assert_ne!(presented, old);
    handshake(daemon.addr, &first.pem)
        .await
        .expect_err("the old CA no longer verifies new connections");
    tls_call(daemon.addr, &second.pem, None).await.unwrap();

    // The open connection keeps working: a reconnect would fail, since it
    // trusts only the first CA. Its watch gets the marker of a compaction.
    let text = "kubectl -n staging apply -f k8s/staging/deploy.yaml: deployment.apps/web configured. error: timed out waiting for rollout of web after 300s; replicas 2/3 ready, image registry.local/web:1.4.2 pulled in 12s, probe /healthz failing on port 8080 with status 503 Service Unavailable.";
    let mut compacted = false;
    for _ in 0..12 {
        let reply = admit(&mut before, "s", vec![span(pb::Role::Tool, text)])
            .await
            .expect("the connection opened before the reload still serves");
        if reply.compaction.is_some() {
            compacted = true;
            break;
        }
    }
    assert!(compacted, "no compaction happened");
    let markers = crate::support::read_markers(&mut watch, 1).await;
    assert_eq!(markers[0].session_id, "s");

    // A bad new file keeps the certificate in force.
    std::fs::write(files.path("cert.pem"), "not a certificate").unwrap();
    let err = daemon.control.reload().expect_err("a bad file is refused");
    assert_eq!(err.key, "tls_cert");
    assert_eq!(err.path, files.path("cert.pem"));
    let (presented, _) = handshake(daemon.addr, &second.pem).await.unwrap();
    assert_eq!(presented, files.der);

    // Shutdown stays bounded with a TLS stream open.
    daemon.shutdown(Duration::from_secs(15)).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), watch.message()).await;
    assert!(
        matches!(ended, Ok(Err(_)) | Ok(Ok(None))),
        "the watch ended at shutdown: {ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_files_stop_the_start_naming_the_setting_and_the_path() {
    let ca = Ca::new("ca");
    let files = ServerFiles::new(&ca);
    let absent = files.path("absent.pem").display().to_string();
    let other_key = files.path("other-key.pem");
    std::fs::write(
        &other_key,
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    let other_key = other_key.display().to_string();
    for (args, key, path, why) in [
        (
            ["--tls-cert", &absent, "--tls-key", &files.key()],
            "tls_cert",
            &absent,
            "cannot read",
        ),
        (
            ["--tls-cert", &files.cert(), "--tls-key", &absent],
            "tls_key",
            &absent,
            "cannot read",
        ),
        (
            ["--tls-cert", &files.key(), "--tls-key", &files.key()],
            "tls_cert",
            &files.key(),
            "no PEM certificate",
        ),
        (
            ["--tls-cert", &files.cert(), "--tls-key", &other_key],
            "tls_key",
            &other_key,
            "does not match",
        ),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = match InProcess::try_start_on(listener, &args).await {
            Ok(_) => panic!("started with {args:?}"),
            Err(err) => err.to_string(),
        };
        assert!(
            err.starts_with(&format!("invalid setting {key} ({path})")) && err.contains(why),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_off_loopback_needs_allow_insecure() {
    for (listen, args) in [
        ("0.0.0.0:0", &[][..]),
        ("127.0.0.1:0", &["--metrics-addr", "0.0.0.0:0"][..]),
    ] {
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        let err = match InProcess::try_start_on(listener, args).await {
            Ok(_) => panic!("plaintext served on {listen} {args:?}"),
            Err(err) => err.to_string(),
        };
        assert!(
            err.contains("not a loopback address") && err.contains("--allow-insecure"),
            "{err}"
        );
    }
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let daemon = InProcess::try_start_on(listener, &["--allow-insecure"])
        .await
        .unwrap();
    assert_eq!(daemon.addr.port(), port);
    let mut client = ContextBrokerClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap();
    // TLS on any address needs no opt-in, with a token file (without
    // one, see auth::off_loopback_without_a_token_file_needs_allow_insecure).
    let ca = Ca::new("ca");
    let files = ServerFiles::new(&ca);
    let tokens = files.path("tokens.toml");
    crate::support::write_token_file(
        &tokens,
        &[("ops", "operator", None, "ops-token-0123456789")],
    );
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    InProcess::try_start_on(
        listener,
        &[
            "--tls-cert",
            &files.cert(),
            "--tls-key",
            &files.key(),
            "--auth-tokens-file",
            &tokens.display().to_string(),
        ],
    )
    .await
    .unwrap();
}

/// The real binary: refused on 0.0.0.0 without the opt-in (exit 1,
/// naming the setting), served with it and a warning in the log.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_plaintext_off_loopback_unless_allowed_and_warns() {
    let data = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .env("CTXBROKER_LOG", "warn");
    ctxbroker_server::hand_over(&mut command, &listener);
    let (status, stderr) = crate::support::refused_start(command, "served plaintext on 0.0.0.0");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not a loopback address") && stderr.contains("allow_insecure"),
        "{stderr}"
    );

    let temp = tempfile::tempdir().unwrap();
    let daemon = crate::support::Daemon::start_on(
        listener,
        temp.path().join("data"),
        temp.path().join("ctxbrokerd.log"),
        None,
        &["--allow-insecure"],
    )
    .await;
    let log = daemon.log_text();
    assert!(log.contains("PLAINTEXT"), "no warning in {log}");
}

/// The real binary reloads its certificate on `kill -HUP` and keeps
/// running.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(unsafe_code)]
async fn the_binary_reloads_its_certificate_on_sighup() {
    let first = Ca::new("first CA");
    let second = Ca::new("second CA");
    let mut files = ServerFiles::new(&first);
    let data = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let log = data.path().join("ctxbrokerd.log");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .args(["--tls-cert", &files.cert(), "--tls-key", &files.key()])
        .env("CTXBROKER_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    ctxbroker_server::hand_over(&mut command, &listener);
    let mut child = command.spawn().unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tls_call(addr, &first.pem, None).await.is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("ctxbrokerd exited ({status}): {}", log_text());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer: {}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut child = Kill(child);
    let channel = tls_channel(addr, &first.pem, None).await.unwrap();
    let mut before = ContextBrokerClient::new(channel);

    files.replace(&second);
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.0.id() as i32, libc::SIGHUP);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((presented, _)) = handshake(addr, &second.pem).await {
            assert_eq!(presented, files.der);
            break;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("ctxbrokerd exited on SIGHUP ({status}): {}", log_text());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reloaded: {}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    before
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .expect("the connection opened before SIGHUP still serves");
    assert!(log_text().contains("TLS files reloaded"), "{}", log_text());
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
}
