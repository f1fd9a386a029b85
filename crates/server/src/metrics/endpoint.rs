//! The HTTP endpoint: axum over HTTP/1.1, one request per connection.
//!
//! | request | answer |
//! |---|---|
//! | `GET`/`HEAD /metrics` (any query) | 200, the exposition as `text/plain; version=0.0.4; charset=utf-8`; 500 if the scrape failed |
//! | `GET`/`HEAD /` | 200, a pointer to `/metrics` (and `/inspect`) |
//! | `/inspect…` | the context inspector, when it is on (see `crate::inspector`) |
//! | another method on those paths | 405, `Allow: GET, HEAD` |
//! | another path | 404 |
//! | a request head over 8 KiB | 431 |
//! | not HTTP | 400 (from hyper) |
//!
//! Slow or silent clients cannot hold the endpoint: at most
//! `metrics_max_connections` connections are open at once, and when all
//! are taken a new one takes the place of the oldest that has not sent
//! its request yet (or is refused, when every open one has); a client
//! must finish its TLS handshake (with `metrics_tls`) and send its request
//! head within `metrics_header_timeout_ms`; and every connection is cut
//! [`CONNECTION_DEADLINE`] after it was accepted, whatever it was doing.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ctxbroker_store::Store;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Metrics;
use crate::incoming::{Gate, Throttled, is_connection_error};
use crate::tls::Tls;

/// How the endpoint serves: TLS or not, and its bounds.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// Serve HTTPS with these files.
    pub tls: Option<Arc<Tls>>,
    /// Most connections open at once.
    pub max_connections: usize,
    /// The time a client has to finish its handshake and send its request
    /// head.
    pub header_timeout: Duration,
}

/// The longest request head (request line and headers) answered.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// How long a connection may stay open, request and answer included.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// How long connections still open at shutdown may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

impl Default for EndpointOptions {
    fn default() -> Self {
        let connections = crate::config::ConnectionSettings::default();
        EndpointOptions {
            tls: None,
            max_connections: connections.metrics_max_connections,
            header_timeout: connections.metrics_header_timeout,
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    store: Store,
}

/// Serves `GET /metrics`, and the inspector's routes when given, on
/// `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    store: Store,
    shutdown: CancellationToken,
    options: EndpointOptions,
    inspector: Option<Router>,
) {
    let index = match inspector {
        Some(_) => "ctxbrokerd: metrics are at /metrics, the inspector at /inspect\n",
        None => "ctxbrokerd: metrics are at /metrics\n",
    };
    let router = Router::new()
        .route("/metrics", get(exposition))
        .route("/", get(move || async move { index }))
        .with_state(Endpoint { metrics, store })
        .merge(inspector.unwrap_or_default())
        .method_not_allowed_fallback(|| async {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::ALLOW, "GET, HEAD")],
                "only GET and HEAD\n",
            )
        })
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found; metrics are at /metrics\n",
            )
        })
        .layer(middleware::from_fn(one_request));
    let mut http = Builder::new(TokioExecutor::new()).http1_only();
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    let http = Arc::new(http);
    let open = GracefulShutdown::new();
    let gate = Gate::new(options.max_connections);
    let mut refusals = Throttled::new("metrics endpoint");
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                warn!(%err, "metrics endpoint: accept failed; pausing before the next accept");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        let Some(slot) = gate.admit() else {
            refusals.refused(options.max_connections);
            continue;
        };
        let slot = Arc::new(slot);
        // The request head arrived: the connection may no longer be
        // displaced.
        let service = {
            let router = router.clone();
            let slot = slot.clone();
            tower::ServiceExt::map_request(router, move |request: axum::http::Request<_>| {
                slot.spoke();
                request
            })
        };
        let service = TowerToHyperService::new(service);
        let tls = options.tls.clone();
        let header_timeout = options.header_timeout;
        let http = http.clone();
        let watcher = open.watcher();
        tokio::spawn(async move {
            let connection = async {
                match tls {
                    Some(tls) => {
                        let handshake = tls.metrics_acceptor().accept(stream);
                        let stream = match tokio::time::timeout(header_timeout, handshake).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(err)) => {
                                debug!(%err, "metrics endpoint: handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                        let served = http.serve_connection(TokioIo::new(stream), service);
                        let _ = watcher.watch(served).await;
                    }
                    None => {
                        let served = http.serve_connection(TokioIo::new(stream), service);
                        let _ = watcher.watch(served).await;
                    }
                }
            };
            // Cut at the deadline, or when a newer connection takes the
            // slot of this one, still silent.
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_DEADLINE, connection) => {}
                () = slot.displaced() => {}
            }
        });
    }
    drop(listener);
    // Open connections finish their answer, or are left after the grace.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, open.shutdown()).await;
}

/// `/metrics`: the exposition, rendered on the blocking pool, one scrape
/// at a time.
async fn exposition(State(endpoint): State<Endpoint>) -> Response {
    let Endpoint { metrics, store } = endpoint;
    let _turn = metrics.scrape.lock().await;
    let rendered = {
        let metrics = metrics.clone();
        tokio::task::spawn_blocking(move || Store::off_workers(|| metrics.render(&store))).await
    };
    let failed = match rendered {
        Ok(Ok(text)) => {
            return ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response();
        }
        Ok(Err(err)) => err.to_string(),
        Err(err) => format!("the scrape task failed: {err}"),
    };
    warn!(err = %failed, "metrics endpoint: scrape failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("scrape failed: {failed}\n"),
    )
        .into_response()
}

/// Refuses an oversized request head, and closes every connection after
/// its answer.
async fn one_request(request: Request, next: Next) -> Response {
    let head = request.uri().to_string().len()
        + request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    let mut response = if head > MAX_REQUEST_HEAD {
        (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request head too large\n",
        )
            .into_response()
    } else {
        next.run(request).await
    };
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
