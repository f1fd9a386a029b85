//! The channel to the daemon and the metadata every call carries.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ctxbroker_proto::v1::context_broker_client::ContextBrokerClient;
use hyper_util::rt::TokioIo;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

use crate::cli::ConnectionArgs;
use crate::error::{CtlError, file_error};

/// The metadata key the session-affine routes (Envoy's ring hash) read.
pub const SESSION_HEADER: &str = "x-ctxbroker-session";

/// A connected daemon.
#[derive(Debug, Clone)]
pub struct Connection {
    channel: Channel,
    authorization: Option<AsciiMetadataValue>,
    timeout: Duration,
    addr: String,
}

impl Connection {
    /// Connects as `args` say.
    pub async fn open(args: &ConnectionArgs) -> Result<Connection, CtlError> {
        let authorization = match &args.token {
            Some(token) => Some(
                MetadataValue::try_from(format!("Bearer {}", token.trim()))
                    .map_err(|_| CtlError::Usage("--token: must be printable ASCII".to_owned()))?,
            ),
            None => None,
        };
        let channel = channel(args).await?;
        Ok(Connection {
            channel,
            authorization,
            timeout: args.timeout,
            addr: args.addr.clone(),
        })
    }

    /// The broker's client on this connection.
    pub fn broker(&self) -> ContextBrokerClient<Channel> {
        ContextBrokerClient::new(self.channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    /// The raw channel (the health service).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The address connected to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `message` with the token, the call's deadline and, for a call about
    /// one session, that session's routing header.
    pub fn request<T>(&self, message: T, session: Option<&str>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        self.decorate(&mut request, session);
        request
    }

    /// `message` with the token and routing header but no deadline: a
    /// followed stream lasts as long as the operator wants.
    pub fn streaming_request<T>(&self, message: T, session: Option<&str>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        self.decorate(&mut request, session);
        request
    }

    fn decorate<T>(&self, request: &mut tonic::Request<T>, session: Option<&str>) {
        let metadata = request.metadata_mut();
        if let Some(value) = &self.authorization {
            metadata.insert("authorization", value.clone());
        }
        // A session id is ASCII by the daemon's rules; an id that is not
        // goes without the header and the daemon names the bad field.
        if let Some(value) = session.and_then(|s| AsciiMetadataValue::try_from(s).ok()) {
            metadata.insert(SESSION_HEADER, value);
        }
    }
}

/// The channel for `args.addr`: TCP (plaintext or TLS) or a Unix socket.
async fn channel(args: &ConnectionArgs) -> Result<Channel, CtlError> {
    let connect_error = |e: tonic::transport::Error| CtlError::Connect {
        addr: args.addr.clone(),
        detail: source_chain(&e),
    };
    if let Some(path) = args.addr.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        return Endpoint::from_static("http://localhost")
            .connect_timeout(args.timeout)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .map_err(connect_error);
    }
    let tls = args.tls_ca.is_some() || args.addr.starts_with("https://");
    let uri = if args.addr.contains("://") {
        args.addr.clone()
    } else if tls {
        format!("https://{}", args.addr)
    } else {
        format!("http://{}", args.addr)
    };
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|e| CtlError::Usage(format!("--addr {}: {e}", args.addr)))?
        .connect_timeout(args.timeout);
    if tls {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &args.tls_ca {
            config = config.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &args.tls_domain {
            config = config.domain_name(domain.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| CtlError::Usage(format!("TLS: {}", source_chain(&e))))?;
    }
    endpoint.connect().await.map_err(connect_error)
}

fn read(path: &Path) -> Result<Vec<u8>, CtlError> {
    std::fs::read(path).map_err(|e| file_error(path, e))
}

/// An error and its sources, joined: the transport's own message is
/// often just "transport error".
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        out.push_str(": ");
        out.push_str(&source.to_string());
        next = source.source();
    }
    out
}
