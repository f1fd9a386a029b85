//! Assembling and running the daemon: the store, the services (broker,
//! health, reflection v1 and v1alpha), and an ordered, bounded shutdown.
//!
//! `main` and every test run exactly this code, on a listener the caller
//! bound.

use std::ffi::OsString;
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::tokens;
use ctxbroker_proto::v1::context_broker_server::ContextBrokerServer;
use ctxbroker_store::{Store, StoreOptions};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tracing::{error, info, warn};

use crate::BuildInfo;
use crate::audit::{self, AuditLog};
use crate::auth::{AuthLayer, TokenFileError, Tokens};
use crate::broker::Broker;
use crate::config::{
    Cli, Command, ConfigError, Durability, Listen, LogFormat, MemoryShares, Settings,
};
use crate::hub::Hub;
use crate::incoming::{Gate, Hardening};
use crate::metrics::{Metrics, Timed};
use crate::service::BrokerService;
use crate::socket::{Listener, Socket};
use crate::tls::{Tls, TlsError, TlsFiles};

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The settings are invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The store could not be opened or closed.
    #[error("storage: {0}")]
    Store(#[from] ctxbroker_store::StoreError),
    /// The listening socket could not be set up.
    #[error("cannot listen: {0}")]
    Listen(std::io::Error),
    /// The reflection service could not be built from the descriptors.
    #[error("reflection: {0}")]
    Reflection(String),
    /// The gRPC server failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A TLS file is missing, unreadable or does not fit the others.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The token file is missing, unreadable or has a bad entry.
    #[error(transparent)]
    Tokens(#[from] TokenFileError),
    /// gRPC without authentication (no `auth_tokens_file`) on an address
    /// that is not loopback, without `allow_insecure`.
    #[error(
        "refusing to serve gRPC {}without authentication on {addr}, which is not a loopback \
         address (anyone who could connect could call every RPC on every session): {}set \
         auth_tokens_file (--auth-tokens-file, CTXBROKER_AUTH_TOKENS_FILE) to require bearer \
         tokens, or set allow_insecure (--allow-insecure, CTXBROKER_ALLOW_INSECURE=true) to \
         serve there anyway",
        if *.plaintext { "as plaintext and " } else { "" },
        if *.plaintext { "configure tls_cert and tls_key (--tls-cert, --tls-key) and " } else { "" }
    )]
    Unauthenticated {
        /// The address.
        addr: std::net::SocketAddr,
        /// Whether TLS is missing too.
        plaintext: bool,
    },
    /// The inspector without authentication on an address that is not
    /// loopback, without `allow_insecure`.
    #[error(
        "refusing to serve the inspector without authentication on {addr}, which is not a \
         loopback address: its pages show every session's text; set auth_tokens_file \
         (--auth-tokens-file), serve metrics_addr on loopback, or set allow_insecure \
         (--allow-insecure, CTXBROKER_ALLOW_INSECURE=true) to serve it open there anyway"
    )]
    OpenInspector {
        /// The address.
        addr: std::net::SocketAddr,
    },
    /// Plaintext on an address that is not loopback, without
    /// `allow_insecure`.
    #[error(
        "refusing to serve {what} as plaintext on {addr}, which is not a loopback address: \
         {remedy}, or set allow_insecure (--allow-insecure, CTXBROKER_ALLOW_INSECURE=true) \
         to serve plaintext there anyway"
    )]
    Insecure {
        /// What would be served: gRPC or the metrics.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The setting that would secure it.
        remedy: &'static str,
    },
}

/// A handle on a running daemon, for what signals ask of it: reloading
/// the TLS files and the token file (SIGHUP), and where it serves once it
/// does.
#[derive(Debug, Clone)]
pub struct Control {
    tls: Arc<std::sync::Mutex<Option<Arc<Tls>>>>,
    tokens: Arc<std::sync::Mutex<Option<Arc<Tokens>>>>,
    serving: tokio::sync::watch::Sender<Option<Serving>>,
}

/// Where a running daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    /// The gRPC address, when it serves TCP.
    pub grpc: Option<std::net::SocketAddr>,
    /// The gRPC socket file, when it serves a Unix socket.
    pub unix: Option<std::path::PathBuf>,
    /// The metrics address, when metrics are served.
    pub metrics: Option<std::net::SocketAddr>,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            tls: Arc::default(),
            tokens: Arc::default(),
            serving: tokio::sync::watch::Sender::new(None),
        }
    }
}

impl Control {
    /// A handle for one daemon; pass it to [`run_with`].
    pub fn new() -> Control {
        Control::default()
    }

    /// Reads the TLS files again: new handshakes use them, open
    /// connections keep theirs. `Ok(false)` when the daemon serves no TLS
    /// (or has not started yet); on an error the files in force stay.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let tls = self
            .tls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match tls {
            Some(tls) => tls.reload().map(|()| true),
            None => Ok(false),
        }
    }

    /// Reads the token file again: calls from then on are checked against
    /// it. `Ok(None)` when authentication is off (or the daemon has not
    /// started yet); on an error the tokens in force stay.
    pub fn reload_tokens(&self) -> Result<Option<crate::auth::RoleCounts>, TokenFileError> {
        let tokens = self
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match tokens {
            Some(tokens) => tokens.reload().map(Some),
            None => Ok(None),
        }
    }

    /// Waits until the daemon serves, and says where.
    pub async fn serving(&self) -> Serving {
        let mut watch = self.serving.subscribe();
        loop {
            if let Some(serving) = watch.borrow_and_update().clone() {
                return serving;
            }
            if watch.changed().await.is_err() {
                // The sender lives in `self`: never reached.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Parses the command line, sets up logging and runs the daemon until
/// SIGINT or SIGTERM. A second signal exits at once.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>, build: BuildInfo) -> ExitCode {
    // Faults named in FAILPOINTS, for the reliability tests; only in builds
    // with the `failpoints` feature.
    #[cfg(feature = "failpoints")]
    let _faults = fail::FailScenario::setup();
    private_new_files();
    let mut cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // Prints help and version too, with their exit codes.
            let _ = err.print();
            return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
        }
    };
    match cli.command.take() {
        Some(Command::CheckConfig { file }) => return check_config(cli, file),
        Some(Command::Token(command)) => {
            return ExitCode::from(crate::auth::token_command(
                &command,
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            ));
        }
        None => {}
    }
    let settings = match cli.resolve() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("ctxbrokerd: {err}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&settings);
    raise_descriptor_limit(&settings);
    // Before the runtime opens descriptors of its own: an inherited one is
    // checked while nothing else can hold its number.
    let socket = match Socket::settle(&settings.listen) {
        Ok(socket) => socket,
        Err(err) => {
            error!(%err, "ctxbrokerd stopped");
            eprintln!("ctxbrokerd: {err}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ctxbroker")
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            error!(%err, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let control = Control::new();
        reload_on_hangup(control.clone());
        let listener = socket.listen().await?;
        run_with(settings, listener, build, shutdown_signal(), control).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!(%err, "ctxbrokerd stopped");
            eprintln!("ctxbrokerd: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open descriptors to the hard one: every
/// connection is a descriptor, and the usual soft limit (1024) is below
/// the default `max_connections`. Warns when even the hard limit leaves
/// less than the connection caps need.
#[cfg(unix)]
#[allow(unsafe_code, clippy::useless_conversion)]
fn raise_descriptor_limit(settings: &Settings) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct above
    // only.
    let raised = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                limit = wanted;
            }
        }
        limit.rlim_cur
    };
    // `rlim_t` is not 64 bits everywhere.
    let raised = u64::try_from(raised).unwrap_or(u64::MAX);
    let needed = (settings.connections.max_connections as u64)
        .saturating_add(settings.connections.metrics_max_connections as u64)
        .saturating_add(256);
    if raised < needed {
        warn!(
            descriptors = raised,
            needed,
            "the descriptor limit is below max_connections + metrics_max_connections + 256; \
             raise it (LimitNOFILE=) or lower max_connections"
        );
    }
}

#[cfg(not(unix))]
fn raise_descriptor_limit(_settings: &Settings) {}

/// Every file and directory the daemon creates from here on is its user's
/// alone (umask `077`): the data directory holds what agents were told and
/// what their tools printed. The store also creates the directory `0700`
/// and refuses one others may write to (`ctxbroker_store`'s open).
#[cfg(unix)]
#[allow(unsafe_code)]
fn private_new_files() {
    // SAFETY: umask only sets the process's file creation mask; it takes
    // no pointer and cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

#[cfg(not(unix))]
fn private_new_files() {}

/// `ctxbrokerd check-config FILE`: the settings the daemon would run with,
/// as TOML on stdout (exit 0), or every problem on stderr (exit 1). The TLS
/// files and the token file are read and checked as the start would.
fn check_config(mut cli: Cli, file: std::path::PathBuf) -> ExitCode {
    cli.config = Some(file.clone());
    match cli.resolve() {
        Ok(settings) => {
            if let Some(files) = TlsFiles::from_settings(&settings.tls)
                && let Err(err) = Tls::load(files)
            {
                eprintln!("ctxbrokerd: {}: {err}", file.display());
                return ExitCode::FAILURE;
            }
            let tokens = match &settings.auth_tokens_file {
                Some(path) => match Tokens::load(path) {
                    Ok(tokens) => Some(tokens.table().counts()),
                    Err(err) => {
                        eprintln!("ctxbrokerd: {}: {err}", file.display());
                        return ExitCode::FAILURE;
                    }
                },
                None => None,
            };
            // The address a start would bind; an inherited socket or a
            // Unix socket is judged when the daemon starts.
            let local = match &settings.listen {
                Listen::Addr(addr) => Some(*addr),
                Listen::Unix(_) | Listen::Fd(_) => None,
            };
            let tls = settings.tls.enabled();
            if let Err(err) = exposure_rules(&settings, local, tls, tokens.is_some()) {
                eprintln!(
                    "ctxbrokerd: {}: a start would refuse: {err}",
                    file.display()
                );
                return ExitCode::FAILURE;
            }
            let mut out = format!(
                "# {}: valid. The settings in force with it:\n",
                file.display()
            );
            match tokens {
                Some(counts) => out.push_str(&format!(
                    "# authentication on: auth_tokens_file has {counts}\n"
                )),
                None => out.push_str(
                    "# authentication off: no auth_tokens_file, every caller is an operator\n",
                ),
            }
            out.push_str(&settings.to_toml());
            // A reader that stops early (`| head`) is not an error.
            if let Err(err) =
                std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes())
                && err.kind() != std::io::ErrorKind::BrokenPipe
            {
                eprintln!("ctxbrokerd: cannot write the settings: {err}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(ConfigError::Keys { path, problems }) => {
            eprintln!("ctxbrokerd: invalid config file {}:", path.display());
            for problem in problems {
                eprintln!("  key `{}`: {}", problem.key, problem.message);
            }
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("ctxbrokerd: {err}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(settings: &Settings) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&settings.log_filter).unwrap_or_else(|err| {
        eprintln!(
            "ctxbrokerd: invalid log filter {:?} ({err}); using info",
            settings.log_filter
        );
        EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match settings.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Reloads the TLS files and the token file on every SIGHUP (which would
/// otherwise end the process).
fn reload_on_hangup(control: Control) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(err) => {
                warn!(
                    %err,
                    "cannot watch SIGHUP; the TLS files and the token file are read only at start"
                );
                return;
            }
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let reloading = control.clone();
                let reloaded = tokio::task::spawn_blocking(move || {
                    (reloading.reload(), reloading.reload_tokens())
                })
                .await;
                let (tls, tokens) = match reloaded {
                    Ok(both) => both,
                    Err(err) => {
                        error!(%err, "SIGHUP: the reload task failed");
                        continue;
                    }
                };
                match (&tls, &tokens) {
                    (Ok(true), _) => {
                        info!("SIGHUP: TLS files reloaded; new connections use them")
                    }
                    (Ok(false), Ok(None)) => {
                        info!(
                            "SIGHUP: no TLS files and no token file configured; nothing to reload"
                        )
                    }
                    (Ok(false), _) => {}
                    (Err(err), _) => {
                        error!(%err, "SIGHUP: TLS reload failed; the files in force stay")
                    }
                }
                match tokens {
                    Ok(Some(counts)) => info!(
                        tokens = counts.total(),
                        agent = counts.agent,
                        watcher = counts.watcher,
                        operator = counts.operator,
                        "SIGHUP: token file reloaded; calls from now on use it"
                    ),
                    Ok(None) => {}
                    Err(err) => error!(
                        %err,
                        "SIGHUP: token file reload failed; the tokens in force stay"
                    ),
                }
            }
        });
    }
    #[cfg(not(unix))]
    drop(control);
}

/// Shares `loaded` with the [`Control`] slot that reloads it on SIGHUP.
fn reloadable<T>(slot: &std::sync::Mutex<Option<Arc<T>>>, loaded: T) -> Arc<T> {
    let shared = Arc::new(loaded);
    *slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(shared.clone());
    shared
}

/// What may be served where: gRPC on `local` (a TCP address; `None` for
/// a Unix socket, which is owner-only and so may serve plaintext and,
/// without tokens, every call) and the metrics on theirs. Refuses
/// plaintext, or gRPC without authentication, off loopback unless
/// `allow_insecure`.
fn exposure_rules(
    settings: &Settings,
    local: Option<std::net::SocketAddr>,
    tls: bool,
    tokens: bool,
) -> Result<(), ServerError> {
    let allow_insecure = settings.tls.allow_insecure;
    if let Some(local) = local {
        if !tokens {
            open_rule(local, !tls, allow_insecure)?;
        }
        if !tls {
            plaintext_rule(
                "gRPC",
                local,
                "configure tls_cert and tls_key (--tls-cert, --tls-key)",
                allow_insecure,
            )?;
        }
    }
    if let Some(addr) = settings.metrics_addr
        && settings.inspector
        && !tokens
    {
        open_inspector_rule(addr, allow_insecure)?;
    }
    if let Some(addr) = settings.metrics_addr
        && !settings.tls.metrics_tls
    {
        plaintext_rule(
            "the metrics",
            addr,
            "set metrics_tls (--metrics-tls) with tls_cert and tls_key",
            allow_insecure,
        )?;
    }
    Ok(())
}

/// Refuses plaintext on an address that is not loopback unless
/// `allow_insecure`, and warns when it is allowed.
fn plaintext_rule(
    what: &'static str,
    addr: std::net::SocketAddr,
    remedy: &'static str,
    allow_insecure: bool,
) -> Result<(), ServerError> {
    if addr.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    if !allow_insecure {
        return Err(ServerError::Insecure { what, addr, remedy });
    }
    warn!(
        %addr,
        "serving {what} as PLAINTEXT on an address that is not loopback (allow_insecure): \
         anyone who can reach it can read and send traffic"
    );
    Ok(())
}

/// Refuses the inspector without authentication on an address that is not
/// loopback unless `allow_insecure`, and warns when it is allowed: its
/// pages show every session's text.
fn open_inspector_rule(
    addr: std::net::SocketAddr,
    allow_insecure: bool,
) -> Result<(), ServerError> {
    if addr.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    if !allow_insecure {
        return Err(ServerError::OpenInspector { addr });
    }
    warn!(
        %addr,
        "serving the inspector WITHOUT AUTHENTICATION on an address that is not loopback \
         (allow_insecure, no auth_tokens_file): anyone who can connect can read every session"
    );
    Ok(())
}

/// Refuses gRPC without authentication on an address that is not loopback
/// unless `allow_insecure`, and warns when it is allowed.
fn open_rule(
    addr: std::net::SocketAddr,
    plaintext: bool,
    allow_insecure: bool,
) -> Result<(), ServerError> {
    if addr.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    if !allow_insecure {
        return Err(ServerError::Unauthenticated { addr, plaintext });
    }
    warn!(
        %addr,
        "serving gRPC WITHOUT AUTHENTICATION on an address that is not loopback \
         (allow_insecure, no auth_tokens_file): anyone who can connect can call every RPC \
         on every session"
    );
    Ok(())
}

/// Says at start whether calls are authenticated, and with how many tokens.
fn log_authentication(tokens: Option<&Tokens>) {
    let Some(tokens) = tokens else {
        warn!(
            "authentication off (no auth_tokens_file): every caller is an operator over every \
             session; for development only"
        );
        return;
    };
    let counts = tokens.table().counts();
    info!(
        auth_tokens_file = %tokens.path().display(),
        tokens = counts.total(),
        agent = counts.agent,
        watcher = counts.watcher,
        operator = counts.operator,
        "authentication on: every call to the broker needs a bearer token from the token file"
    );
    if counts.total() == 0 {
        warn!(
            auth_tokens_file = %tokens.path().display(),
            "the token file has no token: every call to the broker is refused until one is added \
             and the daemon reloaded (SIGHUP)"
        );
    }
}

/// Resolves on the first SIGINT or SIGTERM; a second one exits the process
/// at once.
async fn shutdown_signal() {
    wait_for_signal().await;
    info!("shutdown requested; a second signal exits at once");
    tokio::spawn(async {
        wait_for_signal().await;
        warn!("second signal: exiting now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(err) => {
                warn!(%err, "cannot watch SIGTERM; only SIGINT stops the daemon");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs the daemon on `listener` until `shutdown` resolves, then shuts down
/// in order: health NOT_SERVING, every stream ended with a resumable
/// status, in-flight requests drained (at most `shutdown_grace`), the store
/// flushed and closed.
pub async fn run(
    settings: Settings,
    listener: impl Into<Listener>,
    build: BuildInfo,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    run_with(settings, listener, build, shutdown, Control::new()).await
}

/// [`run`], with a [`Control`] through which the caller reloads the TLS
/// files and learns where the daemon serves.
pub async fn run_with(
    settings: Settings,
    listener: impl Into<Listener>,
    build: BuildInfo,
    shutdown: impl Future<Output = ()> + Send + 'static,
    control: Control,
) -> Result<(), ServerError> {
    info!(
        settings = %settings.log_line(),
        "effective configuration"
    );
    // The files and the plaintext rule first: a bad setting stops the
    // start before anything is opened.
    let tls = match TlsFiles::from_settings(&settings.tls) {
        Some(files) => Some(reloadable(&control.tls, Tls::load(files)?)),
        None => None,
    };
    let tokens = match &settings.auth_tokens_file {
        Some(path) => Some(reloadable(&control.tokens, Tokens::load(path)?)),
        None => None,
    };
    let listener: Listener = listener.into();
    let local = listener.local_addr();
    exposure_rules(&settings, local, tls.is_some(), tokens.is_some())?;
    let unix = listener.unix_path().map(Path::to_path_buf);
    log_authentication(tokens.as_deref());
    let metrics = Arc::new(Metrics::new(build, settings.metrics_top_sessions));
    // Bound before the store opens: a taken port fails the start at once.
    let metrics_listener = match settings.metrics_addr {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|err| {
            ServerError::Listen(std::io::Error::new(
                err.kind(),
                format!("metrics address {addr}: {err}"),
            ))
        })?),
        None => None,
    };
    let hub = Hub::new();
    let publish = hub.clone();
    let counted = metrics.clone();
    let flushes = metrics.clone();
    // The store's caches take their shares of the memory budget; the
    // sessions' share is `session_cache_bytes`, which the broker bounds.
    let shares = MemoryShares::of(settings.limits.memory_budget_bytes);
    let options = StoreOptions {
        durability: match settings.durability {
            Durability::Flush => ctxbroker_store::Durability::Flush,
            Durability::Relaxed => ctxbroker_store::Durability::Relaxed,
        },
        marker_retention: settings.limits.marker_retention,
        on_commit: Some(Arc::new(move |markers| {
            counted.markers(markers);
            publish.publish(markers);
        })),
        on_flush: Some(Arc::new(move |took| flushes.flushed(took))),
        cache_capacity_bytes: shares.page_cache,
        search_cache_bytes: usize::try_from(shares.search).unwrap_or(usize::MAX),
        ..StoreOptions::default()
    };
    let data_dir = settings.data_dir.clone();
    let opening = std::time::Instant::now();
    let store = tokio::task::spawn_blocking(move || Store::open(&data_dir, options))
        .await
        .map_err(|err| ServerError::Store(ctxbroker_store::StoreError::Io(err.to_string())))??;
    let bounds = store.marker_bounds();
    info!(
        data_dir = %settings.data_dir.display(),
        sessions = store.session_count(),
        next_marker_seq = bounds.next,
        oldest_marker_seq = bounds.oldest,
        durability = ?settings.durability,
        open_ms = opening.elapsed().as_millis() as u64,
        "store open"
    );

    // Build the default encoding's tables off the request path; the first
    // admission waits only if it comes before they are ready. cl100k_base
    // loads on the first count of a session that uses it.
    tokio::task::spawn_blocking(|| tokens::warm_up(TokenizerKind::O200kBase));

    let quotas = Arc::new(crate::quota::Quotas::new(settings.quota.clone()));
    let broker = Arc::new(Broker::new(store.clone(), settings.limits.clone()).with_quotas(quotas));
    broker.sessions().observe(metrics.session_cache());
    let streams_end = CancellationToken::new();
    let background = tokio::spawn(broker.clone().run_background(streams_end.clone()));
    let audit = AuditLog::open(&settings.data_dir).map_err(|err| {
        ServerError::Store(ctxbroker_store::StoreError::Io(format!(
            "cannot open the audit log {}: {err}",
            settings.data_dir.join(audit::FILE_NAME).display()
        )))
    })?;
    let inspector = settings.inspector.then(|| {
        crate::inspector::Inspector::new(
            broker.clone(),
            hub.clone(),
            tokens.clone(),
            settings.tls.metrics_tls && tls.is_some(),
            // Half the endpoint's connections at most: scrapes keep room.
            (settings.connections.metrics_max_connections / 2).max(1),
            streams_end.clone(),
        )
    });
    let mut service =
        BrokerService::new(broker, hub, streams_end.clone(), build, settings.durability)
            .with_metrics(metrics.clone())
            .with_audit(Arc::new(audit));
    if tokens.is_some() {
        // A call that did not pass the layer is refused, never served as
        // an operator.
        service = service.require_caller();
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ContextBrokerServer<BrokerService>>()
        .await;
    // Both reflection versions describe everything served, each other
    // included, so any grpcurl lists the same services; the google.rpc
    // error details are described too, so grpcurl decodes them.
    let registered = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ctxbroker_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
    };
    let reflection_v1 = registered()
        .build_v1()
        .map_err(|err| ServerError::Reflection(err.to_string()))?;
    let reflection_v1alpha = registered()
        .build_v1alpha()
        .map_err(|err| ServerError::Reflection(err.to_string()))?;

    let broker_service = Timed::new(
        ContextBrokerServer::new(service)
            .max_decoding_message_size(settings.limits.max_request_bytes)
            .max_encoding_message_size(usize::MAX),
        metrics.clone(),
        settings.request_timeout,
    );

    // Metrics stay up through the drain and stop with the daemon.
    let metrics_end = CancellationToken::new();
    let mut metrics_bound = None;
    let metrics_task = match metrics_listener {
        Some(listener) => {
            let bound = listener.local_addr().map_err(ServerError::Listen)?;
            metrics_bound = Some(bound);
            let metrics_tls = tls.clone().filter(|_| settings.tls.metrics_tls);
            let scheme = if metrics_tls.is_some() {
                "https"
            } else {
                "http"
            };
            info!(metrics_addr = %bound, "metrics served at {scheme}://{bound}/metrics");
            if inspector.is_some() {
                info!(
                    metrics_addr = %bound,
                    authentication = tokens.is_some(),
                    "inspector served at {scheme}://{bound}/inspect"
                );
            }
            let options = crate::metrics::EndpointOptions {
                tls: metrics_tls,
                max_connections: settings.connections.metrics_max_connections,
                header_timeout: settings.connections.metrics_header_timeout,
            };
            Some(tokio::spawn(crate::metrics::serve(
                listener,
                metrics.clone(),
                store.clone(),
                metrics_end.clone(),
                options,
                inspector.map(crate::inspector::Inspector::router),
            )))
        }
        None => None,
    };

    // The serve loop stops accepting once `stop_serving` fires.
    let stop_serving = CancellationToken::new();
    let signalled = CancellationToken::new();
    {
        let health = health.clone();
        let streams_end = streams_end.clone();
        let stop_serving = stop_serving.clone();
        let signalled = signalled.clone();
        tokio::spawn(async move {
            shutdown.await;
            signalled.cancel();
            health
                .set_not_serving::<ContextBrokerServer<BrokerService>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            // Streams first: tonic's graceful shutdown waits for them.
            streams_end.cancel();
            stop_serving.cancel();
        });
    }

    let connections = &settings.connections;
    let incoming = crate::incoming::incoming(
        listener,
        tls.clone(),
        Hardening {
            handshake_timeout: connections.handshake_timeout,
            max_connections: connections.max_connections,
        },
        Gate::new(connections.max_connections),
        stop_serving.clone(),
    );

    info!(
        local = %local.map_or_else(
            || unix.as_deref().map_or_else(String::new, |p| format!("unix:{}", p.display())),
            |addr| addr.to_string(),
        ),
        tls = tls.is_some(),
        authentication = settings.auth_tokens_file.is_some(),
        client_certificates = settings.tls.tls_client_ca.is_some(),
        version = build.version,
        commit = build.git_commit,
        "serving"
    );
    control.serving.send_replace(Some(Serving {
        grpc: local,
        unix: unix.clone(),
        metrics: metrics_bound,
    }));
    let serve = Server::builder()
        .timeout(settings.request_timeout)
        .http2_keepalive_interval(Some(connections.keepalive_interval))
        .http2_keepalive_timeout(Some(connections.keepalive_timeout))
        // Every call passes here first: broker calls are authenticated,
        // health and reflection are not.
        .layer(AuthLayer::new(tokens).with_metrics(metrics.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(broker_service)
        .serve_with_incoming_shutdown(incoming, stop_serving.clone().cancelled_owned());
    tokio::pin!(serve);

    let grace = settings.shutdown_grace;
    let served = tokio::select! {
        result = &mut serve => result,
        () = async {
            signalled.cancelled().await;
            tokio::time::sleep(grace).await;
        } => {
            warn!(grace_ms = grace.as_millis() as u64, "drain deadline passed; closing open connections");
            Ok(())
        }
    };
    // The serve loop may end on its own (transport error): end the streams
    // and the background work in any case.
    streams_end.cancel();
    let _ = background.await;

    let closing = store.clone();
    let closed = tokio::task::spawn_blocking(move || closing.close())
        .await
        .map_err(|err| ServerError::Store(ctxbroker_store::StoreError::Io(err.to_string())))?;
    info!("store flushed and closed");
    metrics_end.cancel();
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    if let Some(path) = &unix
        && let Err(err) = std::fs::remove_file(path)
    {
        warn!(path = %path.display(), %err, "the socket file could not be removed");
    }
    served?;
    closed?;
    info!("stopped");
    Ok(())
}
