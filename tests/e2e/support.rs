//! Starts the real `ctxbrokerd` on a socket the test bound itself
//! (`127.0.0.1:0`, handed over as fd 3), with a temporary data directory.
//! Restarting hands the same socket to the new process, so clients keep
//! the address and nothing waits on a port. The daemon's stderr goes to a
//! log file beside its data; a daemon that exits before answering fails
//! the test at once with its exit status and that log.

#![allow(unsafe_code, dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// A running daemon and what it needs to be restarted.
pub struct Daemon {
    child: Option<Child>,
    listener: TcpListener,
    addr: SocketAddr,
    data_dir: PathBuf,
    /// Where every start of this daemon writes its stderr, appended.
    log: PathBuf,
    _temp: Option<tempfile::TempDir>,
    extra_args: Vec<String>,
    /// Faults to inject from the next start on (`FAILPOINTS`).
    faults: Option<String>,
    /// Started with a token file: a call without a token is refused.
    auth: bool,
}

impl Daemon {
    /// A daemon on a fresh data directory.
    pub async fn start() -> Daemon {
        Daemon::start_with(&[]).await
    }

    /// A daemon on a fresh data directory with extra flags.
    pub async fn start_with(args: &[&str]) -> Daemon {
        let temp = tempfile::tempdir().unwrap();
        let data_dir = temp.path().join("data");
        let log = temp.path().join("ctxbrokerd.log");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Daemon::start_on(listener, data_dir, log, Some(temp), args).await
    }

    /// A daemon serving `listener` (whatever descriptor number the test
    /// process gave it) on `data_dir`, its stderr appended to `log`.
    pub async fn start_on(
        listener: TcpListener,
        data_dir: PathBuf,
        log: PathBuf,
        temp: Option<tempfile::TempDir>,
        args: &[&str],
    ) -> Daemon {
        let addr = listener.local_addr().unwrap();
        let mut daemon = Daemon {
            child: None,
            listener,
            addr,
            data_dir,
            log,
            _temp: temp,
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            faults: None,
            auth: args.iter().any(|a| a.starts_with("--auth-tokens-file")),
        };
        daemon.spawn();
        daemon.ready().await;
        daemon
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the daemon's log file opens");
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
        command
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--shutdown-grace-ms")
            .arg("3000")
            .args(&self.extra_args)
            .env(
                "CTXBROKER_LOG",
                std::env::var("CTXBROKER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stderr(log);
        match &self.faults {
            Some(spec) => command.env("FAILPOINTS", spec),
            None => command.env_remove("FAILPOINTS"),
        };
        ctxbroker_server::hand_over(&mut command, &self.listener);
        self.child = Some(command.spawn().expect("ctxbrokerd starts"));
    }

    /// Waits until the daemon answers: the kernel queues connections on the
    /// socket from the start, so the first RPC simply waits for `serve`.
    /// A daemon that exits first fails the test at once, with its status
    /// and log.
    async fn ready(&mut self) {
        let mut client = self.client().await;
        let answer = client.get_server_info(pb::GetServerInfoRequest {});
        tokio::pin!(answer);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            tokio::select! {
                reply = &mut answer => {
                    match reply {
                        Ok(_) => return,
                        // With a token file, a call without a token is
                        // refused: the daemon answers.
                        Err(status)
                            if self.auth && status.code() == tonic::Code::Unauthenticated =>
                        {
                            return;
                        }
                        Err(status) => panic!("GetServerInfo succeeds: {status:?}"),
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(25)) => {
                    if let Some(status) = self.exited() {
                        panic!(
                            "ctxbrokerd exited before answering ({status}); its log:\n{}",
                            self.log_text()
                        );
                    }
                    if tokio::time::Instant::now() > deadline {
                        panic!(
                            "ctxbrokerd did not answer within 60 s; its log:\n{}",
                            self.log_text()
                        );
                    }
                }
            }
        }
    }

    /// What the daemon wrote to stderr, over all its starts.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|err| format!("(no log: {err})"))
    }

    /// Faults the daemon injects from its next start on (in builds with
    /// the `failpoints` feature), as `FAILPOINTS` spells them.
    pub fn set_faults(&mut self, spec: Option<&str>) {
        self.faults = spec.map(str::to_owned);
    }

    /// The daemon's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A channel to the daemon.
    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connects to the daemon's socket")
    }

    /// A broker client.
    pub async fn client(&self) -> ContextBrokerClient<Channel> {
        ContextBrokerClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    /// A broker client that sends `authorization: Bearer <token>` with
    /// every call.
    pub async fn client_with_token(&self, token: &str) -> TokenClient {
        token_client(self.channel().await, token)
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The exit status, when the daemon has exited on its own (not by
    /// [`Daemon::kill9`] or [`Daemon::terminate`]); `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// `kill -9`: no flush, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits for the exit, at most `within`.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("the daemon is running");
        unsafe {
            // SAFETY: plain kill(2) on our own child's pid.
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("ctxbrokerd did not exit within {within:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the daemon again on the same socket and data directory.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.ready().await;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        // A failing test shows what the daemon said.
        if std::thread::panicking() {
            eprintln!("--- ctxbrokerd log ({})\n{}", self.addr, self.log_text());
        }
    }
}

/// Runs a daemon that is expected to refuse to start: returns its exit
/// status and what it wrote to stderr. Still running after 30 s, it is
/// killed and the test fails, saying `what` it did instead.
pub fn refused_start(mut command: Command, what: &str) -> (ExitStatus, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ctxbrokerd starts");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("{what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().unwrap();
    (status, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A session config with a window and defaults for the rest.
///
/// The soft watermark is the budget itself, so no background
/// pre-compaction runs: every compaction happens at admission, in the
/// reply that needed it, where these tests look for it. Tests of the
/// background path use [`defaults`].
pub fn window(tokens: u32) -> pb::SessionConfig {
    pb::SessionConfig {
        window_tokens: Some(tokens),
        soft_watermark: Some(1.0),
        ..Default::default()
    }
}

/// A configuration of `tokens` with every other field at the daemon's
/// default, background pre-compaction included.
pub fn defaults(tokens: u32) -> pb::SessionConfig {
    pb::SessionConfig {
        window_tokens: Some(tokens),
        ..Default::default()
    }
}

/// A session as GetSession returns it.
pub async fn session(client: &mut ContextBrokerClient<Channel>, id: &str) -> pb::Session {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.into(),
        })
        .await
        .expect("GetSession succeeds")
        .into_inner()
        .session
        .expect("a session")
}

/// Creates a session.
pub async fn create(
    client: &mut ContextBrokerClient<Channel>,
    id: &str,
    config: pb::SessionConfig,
) -> pb::Session {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            config: Some(config),
        })
        .await
        .expect("CreateSession succeeds")
        .into_inner()
        .session
        .expect("a session")
}

/// One span without a class.
pub fn span(role: pb::Role, text: &str) -> pb::SpanInput {
    pb::SpanInput {
        role: role as i32,
        text: text.into(),
        ..Default::default()
    }
}

/// One span with a class.
pub fn classed(role: pb::Role, class: pb::SpanClass, text: &str) -> pb::SpanInput {
    pb::SpanInput {
        role: role as i32,
        text: text.into(),
        span_class: class as i32,
        ..Default::default()
    }
}

/// Admits a turn.
pub async fn admit(
    client: &mut ContextBrokerClient<Channel>,
    id: &str,
    spans: Vec<pb::SpanInput>,
) -> Result<pb::AdmitResponse, tonic::Status> {
    client
        .admit(pb::AdmitRequest {
            session_id: id.into(),
            spans,
        })
        .await
        .map(|r| r.into_inner())
}

/// The live context.
pub async fn context(
    client: &mut ContextBrokerClient<Channel>,
    id: &str,
) -> pb::GetContextResponse {
    client
        .get_context(pb::GetContextRequest {
            session_id: id.into(),
        })
        .await
        .expect("GetContext succeeds")
        .into_inner()
}

/// Reads markers from a watch until `n` have arrived (skipping CaughtUp).
pub async fn read_markers(
    stream: &mut tonic::Streaming<pb::WatchCompactionsResponse>,
    n: usize,
) -> Vec<pb::CompactionMarker> {
    let mut got = Vec::new();
    while got.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("a marker within 30 s")
            .expect("the watch stays up")
            .expect("the watch does not end");
        if let Some(pb::watch_compactions_response::Event::Marker(m)) = next.event {
            got.push(m);
        }
    }
    got
}

/// Opens a watch from `from_seq` and reads until its replay is done,
/// returning the replayed markers.
pub async fn watch_replay(
    client: &mut ContextBrokerClient<Channel>,
    from_seq: u64,
) -> (
    tonic::Streaming<pb::WatchCompactionsResponse>,
    Vec<pb::CompactionMarker>,
) {
    let mut stream = client
        .watch_compactions(pb::WatchCompactionsRequest {
            from_seq,
            ..Default::default()
        })
        .await
        .expect("WatchCompactions starts")
        .into_inner();
    let mut got = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the replay ends within 30 s")
            .expect("the watch stays up")
            .expect("the watch does not end");
        match next.event {
            Some(pb::watch_compactions_response::Event::Marker(m)) => got.push(m),
            Some(pb::watch_compactions_response::Event::CaughtUp(_)) => return (stream, got),
            None => panic!("an empty watch event"),
        }
    }
}

/// Deterministic prose about one topic, about `words` words long.
pub fn prose(seed: u64, topic: &[&str], words: usize) -> String {
    let filler = [
        "the", "manifest", "overlay", "patch", "rollout", "replica", "label", "selector",
        "service", "config", "map", "value", "update", "review", "check", "apply", "diff",
        "template", "chart", "resource", "limit", "request", "probe", "port", "image", "tag",
    ];
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = Vec::with_capacity(words);
    for i in 0..words {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pick = (state >> 33) as usize;
        let word = if i % 5 == 0 && !topic.is_empty() {
            topic[pick % topic.len()]
        } else {
            filler[pick % filler.len()]
        };
        out.push(word);
    }
    let mut text = out.join(" ");
    text.push('.');
    text
}

/// Seconds since the Unix epoch, to compare with marker timestamps.
pub fn now_unix_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A span carrying an idempotency key.
pub fn keyed(role: pb::Role, text: &str, key: &str) -> pb::SpanInput {
    pb::SpanInput {
        idempotency_key: key.into(),
        ..span(role, text)
    }
}

/// The reason and metadata of a status's ErrorInfo details.
pub fn error_info(status: &tonic::Status) -> (String, std::collections::HashMap<String, String>) {
    use tonic_types::StatusExt;
    let details = status.get_error_details();
    let info = details.error_info().expect("ErrorInfo details");
    (info.reason.clone(), info.metadata.clone())
}

/// Adds `authorization: <value>` to every call.
#[derive(Debug, Clone)]
pub struct Authorization(MetadataValue<Ascii>);

impl Interceptor for Authorization {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A broker client that sends a token with every call.
pub type TokenClient = ContextBrokerClient<InterceptedService<Channel, Authorization>>;

/// A broker client on `channel` sending `authorization: Bearer <token>`.
pub fn token_client(channel: Channel, token: &str) -> TokenClient {
    authorization_client(channel, &format!("Bearer {token}"))
}

/// A broker client on `channel` sending `authorization: <value>` as is.
pub fn authorization_client(channel: Channel, value: &str) -> TokenClient {
    let value = value.parse().expect("an ASCII header value");
    ContextBrokerClient::with_interceptor(channel, Authorization(value))
        .max_decoding_message_size(64 << 20)
}

/// Writes a token file at `path` with one entry per `(id, role, tenant,
/// token)`.
pub fn write_token_file(path: &Path, entries: &[(&str, &str, Option<&str>, &str)]) {
    use ctxbroker_server::auth::{entry_toml, parse_role, token_sha256_hex};
    let text: Vec<String> = entries
        .iter()
        .map(|(id, role, tenant, token)| {
            let role = parse_role(role).expect("a role");
            entry_toml(id, role, *tenant, &token_sha256_hex(token))
        })
        .collect();
    std::fs::write(path, text.join("\n")).expect("the token file is written");
}
