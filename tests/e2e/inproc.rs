//! The daemon run in the test process (`ctxbroker_server::run_with`, the
//! code `ctxbrokerd` runs) on a listener the test bound, so a test can
//! reload its TLS files directly and hold thousands of connections to it;
//! the tokenizer is shared by every daemon of the process. Also: test
//! certificates made with rcgen at test time, and TLS clients.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ctxbroker_proto::v1 as pb;
use ctxbroker_server::{BuildInfo, Cli, Control, ServerError};
use pb::context_broker_client::ContextBrokerClient;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const BUILD: BuildInfo = BuildInfo {
    version: "test",
    git_commit: "test",
    contract_digest: "test",
};

/// A daemon running in this process.
pub struct InProcess {
    pub addr: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub control: Control,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
    _data: tempfile::TempDir,
}

impl InProcess {
    /// Serves on `127.0.0.1:0` with `args`; panics if it does not start.
    pub async fn start(args: &[&str]) -> InProcess {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        match InProcess::try_start_on(listener, args).await {
            Ok(daemon) => daemon,
            Err(err) => panic!("the daemon did not start: {err}"),
        }
    }

    /// Serves on `listener` with `args`, or the error it stopped with.
    pub async fn try_start_on(
        listener: tokio::net::TcpListener,
        args: &[&str],
    ) -> Result<InProcess, ServerError> {
        let data = tempfile::tempdir().unwrap();
        let data_dir = data.path().join("data");
        let mut all = vec![
            "ctxbrokerd".to_owned(),
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let settings = Cli::try_parse_from(all).unwrap().resolve()?;
        let control = Control::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut task = tokio::spawn(ctxbroker_server::run_with(
            settings,
            listener,
            BUILD,
            async move {
                let _ = stopped.await;
            },
            control.clone(),
        ));
        let serving = tokio::select! {
            serving = control.serving() => serving,
            ended = &mut task => {
                return Err(ended.expect("the daemon task does not panic").expect_err("it stopped before serving"));
            }
        };
        Ok(InProcess {
            addr: serving.grpc.expect("served on TCP"),
            metrics: serving.metrics,
            control,
            stop: Some(stop),
            task: Some(task),
            _data: data,
        })
    }

    /// Stops the daemon (as on SIGTERM) and waits for it, at most
    /// `within`.
    pub async fn shutdown(&mut self, within: Duration) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("running");
        tokio::time::timeout(within, task)
            .await
            .expect("the daemon stops in time")
            .expect("the daemon task does not panic")
    }

    /// A plaintext client.
    pub async fn client(&self) -> ContextBrokerClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        ContextBrokerClient::new(channel)
    }
}

/// A certificate authority.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `localhost` (a server) or a client called `name`:
    /// (certificate PEM, key PEM, certificate DER).
    pub fn leaf(&self, name: &str) -> (String, String, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }
}

/// Writes `text` to `path` whole: a temporary file renamed over it.
pub fn write_atomically(path: &Path, text: &str) {
    let temp = path.with_extension("new");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

/// A directory with the server's files: `cert.pem` and `key.pem` issued
/// by `ca`.
pub struct ServerFiles {
    pub dir: tempfile::TempDir,
    pub der: CertificateDer<'static>,
}

impl ServerFiles {
    pub fn new(ca: &Ca) -> ServerFiles {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, der) = ca.leaf("ctxbrokerd");
        std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        ServerFiles { dir, der }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn cert(&self) -> String {
        self.path("cert.pem").display().to_string()
    }

    pub fn key(&self) -> String {
        self.path("key.pem").display().to_string()
    }

    /// Replaces the certificate and key with a new pair issued by `ca`.
    pub fn replace(&mut self, ca: &Ca) {
        let (cert, key, der) = ca.leaf("ctxbrokerd-renewed");
        write_atomically(&self.path("key.pem"), &key);
        write_atomically(&self.path("cert.pem"), &cert);
        self.der = der;
    }
}

/// A TLS channel to `addr` trusting `ca_pem`, presenting `identity`
/// (certificate and key PEM) when given.
pub async fn tls_channel(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|err| format!("{err:?}"))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|err| format!("{err:?}"))
}

/// Connects over TLS and makes one call: what went wrong, if anything.
pub async fn tls_call(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<(), String> {
    let channel = tls_channel(addr, ca_pem, identity).await?;
    let mut client = ContextBrokerClient::new(channel);
    client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .map(|_| ())
        .map_err(|status| format!("{status:?}"))
}

/// One raw TLS handshake with ALPN `h2`, trusting `ca_pem`: the
/// certificate the server presented and the protocol agreed.
pub async fn handshake(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<(CertificateDer<'static>, Option<Vec<u8>>), String> {
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|err| err.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_owned())?
        .map_err(|err| err.to_string())?;
    let (_, session) = stream.get_ref();
    let presented = session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .cloned()
        .ok_or("no certificate")?;
    Ok((presented, session.alpn_protocol().map(<[u8]>::to_vec)))
}

/// Polls `condition` every 20 ms until it holds; fails after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Raises this process's descriptor limit to its hard limit, for tests
/// that hold many connections.
#[allow(unsafe_code)]
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
