//! The HTTP endpoint: axum over HTTP/1.1, one request per connection.
//!
//! | request | answer |
//! |---|---|
//! | `GET`/`HEAD /metrics` (any query) | 200, the exposition as `text/plain; version=0.0.4; charset=utf-8`; 500 if the scrape failed |
//! | `GET`/`HEAD /` | 200, a pointer to `/metrics` |
//! | another method on those paths | 405, `Allow: GET, HEAD` |
//! | another path | 404 |
//! | a request head over 8 KiB | 431 |
//! | not HTTP | 400 (from hyper) |
//!
//! At most [`MAX_CONNECTIONS`] connections are served at once (more wait
//! to be accepted), and each one is cut [`CONNECTION_DEADLINE`] after it
//! was accepted, so slow or silent clients cannot hold the endpoint.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::Listener;
use ctxbroker_store::Store;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Metrics;

/// The longest request head (request line and headers) answered.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// Connections served at once.
const MAX_CONNECTIONS: usize = 16;
/// How long a connection may stay open, request and answer included.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// How long connections still open at shutdown may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What the handlers share.
#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    store: Store,
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(
    mut listener: TcpListener,
    metrics: Arc<Metrics>,
    store: Store,
    shutdown: CancellationToken,
) {
    let router = Router::new()
        .route("/metrics", get(exposition))
        .route(
            "/",
            get(|| async { "ctxbrokerd: metrics are at /metrics\n" }),
        )
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
        .layer(middleware::from_fn(one_request))
        .with_state(Endpoint { metrics, store });
    let service = TowerToHyperService::new(router);
    let http = Builder::new(TokioExecutor::new());
    let open = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A free slot first, so connections past the limit wait to be
        // accepted (the semaphore is never closed); axum's `accept` waits
        // out accept errors.
        let accepted = async {
            let slot = slots.clone().acquire_owned().await;
            (slot, Listener::accept(&mut listener).await)
        };
        let (slot, (stream, _)) = tokio::select! {
            accepted = accepted => accepted,
            () = shutdown.cancelled() => break,
        };
        let served = http.serve_connection_with_upgrades(TokioIo::new(stream), service.clone());
        let connection = open.watch(served.into_owned());
        tokio::spawn(async move {
            // Cut at the deadline, whatever the connection was doing.
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, connection).await;
            drop(slot);
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
