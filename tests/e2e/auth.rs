//! Bearer tokens on the real binary (docs/security.md, section 3): the
//! token file made with `ctxbrokerd token new`, each call refused without
//! a known token (UNAUTHENTICATED) or when the token's role may not make
//! it (PERMISSION_DENIED), health and reflection open, the file reloaded
//! on SIGHUP, and the rule that an address off loopback needs a token file
//! or `allow_insecure`.

#![allow(unsafe_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::{
    Daemon, TokenClient, authorization_client, error_info, refused_start, span, token_client,
    window, write_token_file,
};

/// `ctxbrokerd token new ...`: the token (stdout) and its entry (stderr).
fn token_new(args: &[&str]) -> (String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"))
        .args(["token", "new"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ctxbrokerd runs");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "token new {args:?}: {stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let token = stdout
        .strip_suffix('\n')
        .expect("one line on stdout")
        .to_owned();
    assert!(!token.contains('\n'), "{stdout:?}");
    (token, stderr)
}

/// The tokens of one test, and the file listing them.
struct Tokens {
    agent: String,
    watcher: String,
    operator: String,
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
}

impl Tokens {
    /// An agent and a watcher of tenant `acme` and an operator, made by
    /// the CLI; the file is what it printed on stderr, appended.
    fn new() -> Tokens {
        let (agent, agent_entry) =
            token_new(&["--id", "ci-bot", "--role", "agent", "--tenant", "acme"]);
        let (watcher, watcher_entry) =
            token_new(&["--id", "dash", "--role", "watcher", "--tenant", "acme"]);
        let (operator, operator_entry) = token_new(&["--id", "ops", "--role", "operator"]);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.toml");
        std::fs::write(
            &file,
            format!("{agent_entry}{watcher_entry}{operator_entry}"),
        )
        .unwrap();
        for token in [&agent, &watcher, &operator] {
            assert_eq!(token.len(), 64);
            assert!(
                !std::fs::read_to_string(&file)
                    .unwrap()
                    .contains(token.as_str()),
                "the token file holds no token"
            );
        }
        Tokens {
            agent,
            watcher,
            operator,
            _dir: dir,
            file,
        }
    }

    fn arg(&self) -> String {
        format!("--auth-tokens-file={}", self.file.display())
    }
}

fn assert_refused(result: Result<impl std::fmt::Debug, tonic::Status>, code: Code, reason: &str) {
    let status = result.expect_err("the call is refused");
    assert_eq!(status.code(), code, "{status:?}");
    let (got, _) = error_info(&status);
    assert_eq!(got, reason, "{status:?}");
}

async fn server_info(client: &mut TokenClient) -> Result<pb::GetServerInfoResponse, tonic::Status> {
    client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .map(|r| r.into_inner())
}

async fn list(client: &mut TokenClient) -> Result<pb::ListSessionsResponse, tonic::Status> {
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .map(|r| r.into_inner())
}

async fn create(client: &mut TokenClient, id: &str) -> Result<pb::Session, tonic::Status> {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            config: Some(window(4000)),
        })
        .await
        .map(|r| r.into_inner().session.unwrap_or_default())
}

async fn admit(client: &mut TokenClient, id: &str) -> Result<pb::AdmitResponse, tonic::Status> {
    client
        .admit(pb::AdmitRequest {
            session_id: id.into(),
            spans: vec![span(pb::Role::User, "deploy the staging overlay")],
        })
        .await
        .map(|r| r.into_inner())
}

async fn export(
    client: &mut TokenClient,
    id: &str,
) -> Result<pb::ExportSessionResponse, tonic::Status> {
    client
        .export_session(pb::ExportSessionRequest {
            session_id: id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// A unary call to `/ctxbroker.v1.ContextBroker/{method}` with a
/// GetServerInfo request, whatever the method: for a method the service
/// does not have.
async fn raw_call(
    channel: tonic::transport::Channel,
    method: &str,
    token: &str,
) -> Result<pb::GetServerInfoResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(pb::GetServerInfoRequest {});
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let path = format!("/ctxbroker.v1.ContextBroker/{method}")
        .parse()
        .unwrap();
    let codec =
        tonic_prost::ProstCodec::<pb::GetServerInfoRequest, pb::GetServerInfoResponse>::default();
    grpc.unary(request, path, codec)
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_needs_a_known_token_whose_role_allows_it() {
    let tokens = Tokens::new();
    let daemon = Daemon::start_with(&[&tokens.arg()]).await;
    let channel = daemon.channel().await;

    // No token, an unknown one, another scheme: UNAUTHENTICATED, with the
    // reason in ErrorInfo.
    let mut anonymous = daemon.client().await;
    let status = anonymous
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .expect_err("no token, no answer");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, _) = error_info(&status);
    assert_eq!(reason, "UNAUTHENTICATED");
    assert!(status.message().contains("Bearer <token>"), "{status:?}");
    let status = anonymous
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect_err("no token, no sessions");
    assert_eq!(status.code(), Code::Unauthenticated);
    let mut stranger = token_client(channel.clone(), &"0".repeat(64));
    assert_refused(
        server_info(&mut stranger).await,
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );
    assert_refused(
        list(&mut stranger).await,
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );
    let mut basic = authorization_client(channel.clone(), &format!("Basic {}", tokens.operator));
    let status = server_info(&mut basic)
        .await
        .expect_err("not a bearer token");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(status.message().contains("not Bearer"), "{status:?}");
    assert!(
        !status.message().contains(&tokens.operator),
        "the error repeats the credentials"
    );
    // The scheme in any case.
    let mut lower = authorization_client(channel.clone(), &format!("bearer {}", tokens.watcher));
    server_info(&mut lower).await.expect("`bearer` is Bearer");

    // A watcher reads and watches its tenant's sessions, and changes
    // nothing.
    let mut watcher = token_client(channel.clone(), &tokens.watcher);
    let info = server_info(&mut watcher)
        .await
        .expect("a watcher reads the server info");
    assert!(!info.version.is_empty());
    list(&mut watcher).await.expect("a watcher lists sessions");
    watcher
        .watch_compactions(pb::WatchCompactionsRequest::default())
        .await
        .expect("a watcher watches");
    let status = admit(&mut watcher, "s1")
        .await
        .expect_err("a watcher may not admit");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let (reason, metadata) = error_info(&status);
    assert_eq!(reason, "PERMISSION_DENIED");
    assert_eq!(metadata.get("role").map(String::as_str), Some("watcher"));
    assert_eq!(metadata.get("rpc").map(String::as_str), Some("Admit"));
    assert_refused(
        create(&mut watcher, "w1").await,
        Code::PermissionDenied,
        "PERMISSION_DENIED",
    );

    // An agent works on sessions, and neither exports nor imports them.
    let mut agent = token_client(channel.clone(), &tokens.agent);
    create(&mut agent, "s1")
        .await
        .expect("an agent creates a session");
    admit(&mut agent, "s1").await.expect("an agent admits");
    let status = export(&mut agent, "s1")
        .await
        .expect_err("an agent may not export");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let (reason, metadata) = error_info(&status);
    assert_eq!(reason, "PERMISSION_DENIED");
    assert_eq!(metadata.get("role").map(String::as_str), Some("agent"));
    assert_eq!(
        metadata.get("rpc").map(String::as_str),
        Some("ExportSession")
    );
    assert_refused(
        agent
            .import_session(pb::ImportSessionRequest::default())
            .await,
        Code::PermissionDenied,
        "PERMISSION_DENIED",
    );
    // A method the service lacks: refused for the agent, UNIMPLEMENTED
    // for the operator.
    assert_refused(
        raw_call(channel.clone(), "NoSuchMethod", &tokens.agent).await,
        Code::PermissionDenied,
        "PERMISSION_DENIED",
    );
    let status = raw_call(channel.clone(), "NoSuchMethod", &tokens.operator)
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    raw_call(channel.clone(), "GetServerInfo", &tokens.watcher)
        .await
        .expect("the same call by its real name is served");

    // The operator calls everything it tries, export and import included.
    let mut operator = token_client(channel.clone(), &tokens.operator);
    server_info(&mut operator).await.unwrap();
    let sessions = list(&mut operator).await.unwrap();
    assert!(
        !sessions.sessions.is_empty(),
        "the agent's session is listed"
    );
    let id = sessions.sessions[0].session_id.clone();
    create(&mut operator, "op-1").await.unwrap();
    admit(&mut operator, "op-1").await.unwrap();
    operator
        .get_context(pb::GetContextRequest {
            session_id: "op-1".into(),
        })
        .await
        .unwrap();
    let snapshot = export(&mut operator, "op-1")
        .await
        .unwrap()
        .snapshot
        .expect("a snapshot");
    operator
        .delete_session(pb::DeleteSessionRequest {
            session_id: "op-1".into(),
        })
        .await
        .unwrap();
    operator
        .import_session(pb::ImportSessionRequest {
            snapshot: Some(snapshot),
        })
        .await
        .expect("an operator imports");
    export(&mut operator, &id)
        .await
        .expect("an operator exports the agent's session");
    operator
        .watch_compactions(pb::WatchCompactionsRequest::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_answer_without_a_token() {
    let tokens = Tokens::new();
    let daemon = Daemon::start_with(&[&tokens.arg()]).await;
    let channel = daemon.channel().await;
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "ctxbroker.v1.ContextBroker"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health answers without a token")
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
    use tokio_stream::StreamExt;
    use tonic_reflection::pb::v1 as r1;
    let mut reflection = r1::server_reflection_client::ServerReflectionClient::new(channel);
    let reply = reflection
        .server_reflection_info(tokio_stream::iter([r1::ServerReflectionRequest {
            message_request: Some(r1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
            ..Default::default()
        }]))
        .await
        .expect("reflection answers without a token")
        .into_inner()
        .next()
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        reply.message_response,
        Some(r1::server_reflection_response::MessageResponse::ListServicesResponse(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_token_file_and_a_bad_file_keeps_the_tokens_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let old = "old-operator-token-0123456789";
    let new = "new-operator-token-0123456789";
    write_token_file(&file, &[("old", "operator", None, old)]);
    let daemon = Daemon::start_with(&[&format!("--auth-tokens-file={}", file.display())]).await;
    let channel = daemon.channel().await;
    server_info(&mut token_client(channel.clone(), old))
        .await
        .expect("the old token works");
    assert_refused(
        server_info(&mut token_client(channel.clone(), new)).await,
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );

    // The file is replaced by renaming a complete new one over it.
    let next = dir.path().join("tokens.toml.new");
    write_token_file(&next, &[("new", "watcher", Some("acme"), new)]);
    std::fs::rename(&next, &file).unwrap();
    hangup(&daemon);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while server_info(&mut token_client(channel.clone(), new))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new token is not accepted after SIGHUP: {}",
            daemon.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_refused(
        server_info(&mut token_client(channel.clone(), old)).await,
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );
    // The new token has the new entry's role.
    assert_refused(
        create(&mut token_client(channel.clone(), new), "s").await,
        Code::PermissionDenied,
        "PERMISSION_DENIED",
    );

    // A bad file: the reload fails, logged; the tokens in force stay.
    std::fs::write(&file, "[[token]]\nid = \"broken\"\nrole = \"root\"\n").unwrap();
    hangup(&daemon);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !daemon.log_text().contains("token file reload failed") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload failure logged: {}",
            daemon.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = daemon.log_text();
    assert!(log.contains("token[0] (id \"broken\"): role"), "{log}");
    server_info(&mut token_client(channel.clone(), new))
        .await
        .expect("the tokens in force stay after a bad reload");
    assert_refused(
        server_info(&mut token_client(channel, old)).await,
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );
}

fn hangup(daemon: &Daemon) {
    // SAFETY: kill(2) on our own child.
    let sent = unsafe { libc::kill(daemon.pid() as i32, libc::SIGHUP) };
    assert_eq!(sent, 0, "SIGHUP sent");
}

/// `0.0.0.0` without a token file: refused (exit 1) naming both ways
/// out; with `allow_insecure` served, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_without_a_token_file_needs_allow_insecure() {
    let data = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .env_remove("CTXBROKER_AUTH_TOKENS_FILE")
        .env_remove("CTXBROKER_ALLOW_INSECURE")
        .env("CTXBROKER_LOG", "warn");
    ctxbroker_server::hand_over(&mut command, &listener);
    let (status, stderr) = refused_start(command, "served without a token file on 0.0.0.0");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("without authentication")
            && stderr.contains("not a loopback address")
            && stderr.contains("auth_tokens_file")
            && stderr.contains("allow_insecure"),
        "{stderr}"
    );

    let temp = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_on(
        listener,
        temp.path().join("data"),
        temp.path().join("ctxbrokerd.log"),
        None,
        &["--allow-insecure"],
    )
    .await;
    let log = daemon.log_text();
    assert!(
        log.contains("WITHOUT AUTHENTICATION"),
        "no warning in {log}"
    );
    assert!(log.contains("authentication off"), "{log}");
}

/// With TLS on `0.0.0.0`, only the token file is missing: the message
/// names it alone; with a token file the daemon serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_off_loopback_needs_a_token_file_too() {
    use crate::inproc::{Ca, InProcess, ServerFiles};
    let ca = Ca::new("ca");
    let files = ServerFiles::new(&ca);
    let tls = ["--tls-cert", &files.cert(), "--tls-key", &files.key()];
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = match InProcess::try_start_on(listener, &tls).await {
        Ok(_) => panic!("served TLS without a token file on 0.0.0.0"),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains("refusing to serve gRPC without authentication")
            && err.contains("auth_tokens_file")
            && err.contains("allow_insecure")
            && !err.contains("tls_cert"),
        "{err}"
    );
    let tokens = files.path("tokens.toml");
    write_token_file(
        &tokens,
        &[("ops", "operator", None, "ops-token-0123456789")],
    );
    let mut args = tls.to_vec();
    let arg = format!("--auth-tokens-file={}", tokens.display());
    args.push(&arg);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    InProcess::try_start_on(listener, &args)
        .await
        .expect("TLS with a token file serves on 0.0.0.0");
}

/// A bad token file stops the start, and check-config, naming the entry
/// and the field; a good one is counted by check-config.
#[test]
fn a_bad_token_file_is_named_by_the_start_and_by_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    write_token_file(
        &tokens,
        &[
            ("ci-bot", "agent", Some("acme"), "agent-token-0123456789"),
            ("ops", "operator", None, "ops-token-0123456789"),
        ],
    );
    let config = dir.path().join("ctxbroker.toml");
    std::fs::write(
        &config,
        format!("auth_tokens_file = {:?}\n", tokens.display().to_string()),
    )
    .unwrap();
    let check = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"))
            .arg("check-config")
            .arg(path)
            .env_remove("CTXBROKER_AUTH_TOKENS_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let good = check(&config);
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(
        good.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(
        stdout.contains(
            "# authentication on: auth_tokens_file has 2 tokens: 1 agent, 0 watcher, 1 operator"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "auth_tokens_file = {:?}",
            tokens.display().to_string()
        )),
        "{stdout}"
    );

    // The second entry: an operator with a tenant.
    let text = std::fs::read_to_string(&tokens).unwrap();
    let bad = text.replace(
        "role = \"operator\"\n",
        "role = \"operator\"\ntenant = \"acme\"\n",
    );
    std::fs::write(&tokens, bad).unwrap();
    let expected = "token[1] (id \"ops\"): tenant: must be absent for role operator";
    let refused = check(&config);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("invalid setting auth_tokens_file") && stderr.contains(expected),
        "{stderr}"
    );

    let mut start = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    start
        .arg("--listen=127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg(format!("--auth-tokens-file={}", tokens.display()))
        .env("CTXBROKER_LOG", "warn");
    let (status, stderr) = refused_start(start, "started with a bad token file");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(expected), "{stderr}");
}

/// `ctxbrokerd token hash` prints the digest the file wants for a token
/// brought from elsewhere, and refuses one too short to be safe.
#[test]
fn token_hash_prints_the_sha256_of_the_token_on_stdin() {
    use std::io::Write;
    let hash = |input: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"))
            .args(["token", "hash"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = hash("my-own-token-0123456789\n");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!(
            "{}\n",
            ctxbroker_server::auth::token_sha256_hex("my-own-token-0123456789")
        )
    );
    let out = hash("short\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("too easy to guess"));
}
